//! UpgradePlan channels (`spec.channel`), asked in the background for the
//! cluster role's passes: a pass reads the last answer per URL and never
//! waits for one. A URL is asked when first seen and then every
//! `--channel-interval` (system-upgrade-controller's 15 minutes), each
//! question bounded by [`DEADLINE`]; an answer kicks the scheduler, so a
//! new version starts its rollout at once. A failed question keeps the
//! last version and says why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::passes::Kick;
use crate::api::upgrade::ChannelStatus;
use crate::decide::upgrade::channel::{record, version_of};

/// How long one question may take.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// SUC's default interval between questions.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);
/// How soon a pass looks again while a question is out.
const SOON: Duration = Duration::from_secs(1);

use crate::runtime::lock;

struct Entry {
    answer: ChannelStatus,
    asked: Option<Instant>,
    asking: bool,
}

/// The last answer per channel URL.
#[derive(Default)]
pub struct Channels {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    config: OnceLock<(Duration, Kick)>,
}

impl Channels {
    /// The cluster role's interval and its scheduler's kick.
    pub fn configure(&self, interval: Duration, kick: Kick) {
        let _ = self.config.set((interval, kick));
    }

    /// The last answer for `url` (None: none yet), and when the pass
    /// should look again; asks anew in the background when due.
    pub fn get(&self, url: &str) -> (Option<ChannelStatus>, Duration) {
        let Some((interval, kick)) = self.config.get() else {
            return (None, DEFAULT_INTERVAL);
        };
        let interval = *interval;
        let mut map = lock(&self.entries);
        let entry = map.entry(url.to_string()).or_insert_with(|| Entry {
            answer: ChannelStatus {
                url: url.to_string(),
                ..Default::default()
            },
            asked: None,
            asking: false,
        });
        let due = entry.asked.is_none_or(|t| t.elapsed() >= interval);
        if due && !entry.asking {
            entry.asking = true;
            let (entries, url, kick) = (self.entries.clone(), url.to_string(), kick.clone());
            crate::runtime::spawn(async move {
                let answer = crate::effects::http::head_of(&url, DEADLINE)
                    .await
                    .map_err(|f| f.why)
                    .and_then(|(code, location)| version_of(&url, code, location.as_deref()));
                if let Err(why) = &answer {
                    log::warn!(
                        "UpgradePlan channel {}: {why}",
                        crate::effects::http::shown(&url)
                    );
                }
                if let Some(e) = lock(&entries).get_mut(&url) {
                    record(&mut e.answer, answer, Timestamp::now());
                    e.asked = Some(Instant::now());
                    e.asking = false;
                }
                kick.kick();
            })
            .detach();
        }
        let again = if entry.asking {
            SOON
        } else {
            entry
                .asked
                .map_or(SOON, |t| interval.saturating_sub(t.elapsed()).max(SOON))
        };
        let answered = entry.asked.is_some().then(|| entry.answer.clone());
        (answered, again)
    }

    /// Forget channels no plan names any more.
    pub fn retain(&self, urls: &[&str]) {
        lock(&self.entries).retain(|u, _| urls.contains(&u.as_str()));
    }
}
