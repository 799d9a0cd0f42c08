//! UpgradePlan channels (`spec.channel`), asked in the background for the
//! cluster role's passes: a pass reads the last answer per URL and never
//! waits for one. A URL is asked when first seen and then every
//! `--channel-interval` (system-upgrade-controller's 15 minutes), each
//! question bounded by [`DEADLINE`]; an answer kicks the scheduler, so a
//! new version starts its rollout at once. A failed question keeps the
//! last version and says why.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::background::{Answers, Ask};
use super::passes::Kick;
use crate::api::upgrade::ChannelStatus;
use crate::decide::upgrade::channel::{record, version_of};

/// How long one question may take.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// SUC's default interval between questions.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// The last answer per channel URL.
#[derive(Default)]
pub struct Channels {
    answers: Answers<ChannelStatus>,
    config: OnceLock<(Duration, Kick)>,
}

impl Channels {
    /// The cluster role's interval and its scheduler's kick.
    pub fn configure(&self, interval: Duration, kick: Kick) {
        let _ = self.config.set((interval, kick));
    }

    /// The last answer for `url` (None: none yet), and when the pass
    /// should look again; asks anew in the background when due. An answer
    /// kicks the scheduler, so a new version starts its rollout at once.
    pub fn get(&self, url: &str) -> (Option<ChannelStatus>, Duration) {
        let Some((interval, kick)) = self.config.get() else {
            return (None, DEFAULT_INTERVAL);
        };
        let question = url.to_string();
        let kept = self.answers.get(
            url,
            || ChannelStatus {
                url: url.to_string(),
                ..Default::default()
            },
            Ask {
                every: *interval,
                ask: move || async move {
                    let answer = crate::effects::http::head_of(&question, DEADLINE)
                        .await
                        .map_err(|f| f.why)
                        .and_then(|(code, location)| {
                            version_of(&question, code, location.as_deref())
                        });
                    if let Err(why) = &answer {
                        log::warn!(
                            "UpgradePlan channel {}: {why}",
                            crate::effects::http::shown(&question)
                        );
                    }
                    answer
                },
                keep: |kept: &mut ChannelStatus, answer| record(kept, answer, Timestamp::now()),
                kick: Some(kick.clone()),
            },
        );
        let answered = kept.age.is_some().then_some(kept.answer);
        (answered, kept.again)
    }

    /// Forget channels no plan names any more.
    pub fn retain(&self, urls: &[&str]) {
        self.answers.retain(|u| urls.contains(&u));
    }
}
