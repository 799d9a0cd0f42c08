//! Prometheus's answers for the cluster role's `gates.prometheus`, asked in
//! the background: a pass reads the last answer per URL and never waits for
//! Prometheus (a Prometheus that hangs must not hold up every other
//! feature's admissions). A question is asked when the last answer is
//! older than [`EVERY`], bounded by [`DEADLINE`]; while one is out the pass
//! looks again soon, so the first answer is used within about a second, and
//! an answer older than both counts as not known (it admits nothing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::decide::disrupt::Alerts;

/// The cache's lock; a panic while it was held leaves a usable map.
use crate::runtime::lock;

/// How old an answer may get before it is asked again (kured's default
/// period is an hour of sentinel checks; alerts move faster).
pub const EVERY: Duration = Duration::from_secs(15);
/// How long one question may take.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// How soon a pass looks again while a question is out.
const SOON: Duration = Duration::from_secs(1);

struct Entry {
    answer: Alerts,
    asked: Option<Instant>,
    asking: bool,
}

/// The last answer per Prometheus URL.
#[derive(Default)]
pub struct AlertCache(Arc<Mutex<HashMap<String, Entry>>>);

impl AlertCache {
    /// The last answer for `url`, and when the pass should look again;
    /// asks anew in the background if the answer is missing or stale.
    pub fn get(&self, url: &str) -> (Alerts, Duration) {
        let mut map = lock(&self.0);
        let entry = map.entry(url.to_string()).or_insert_with(|| Entry {
            answer: Alerts::Unknown("Prometheus not asked yet".into()),
            asked: None,
            asking: false,
        });
        let stale = entry.asked.is_none_or(|t| t.elapsed() >= EVERY);
        if stale && !entry.asking {
            entry.asking = true;
            let (cache, url) = (self.0.clone(), url.to_string());
            crate::runtime::spawn(async move {
                let answer = match crate::effects::prometheus::active_alerts(&url, DEADLINE).await {
                    Ok(active) => Alerts::Active(active),
                    Err(why) => {
                        log::warn!("asking Prometheus at {url} for its alerts: {why}");
                        Alerts::Unknown(why)
                    }
                };
                if let Some(e) = lock(&cache).get_mut(&url) {
                    e.answer = answer;
                    e.asked = Some(Instant::now());
                    e.asking = false;
                }
            })
            .detach();
        }
        let again = if entry.asking {
            SOON
        } else {
            entry
                .asked
                .map_or(SOON, |t| EVERY.saturating_sub(t.elapsed()).max(SOON))
        };
        // An old answer admits nothing: a quiet cluster's first pass in
        // minutes would otherwise admit on what Prometheus said then.
        let answer = match entry.asked.map(|t| t.elapsed()) {
            Some(age) if age > EVERY + DEADLINE => Alerts::Unknown(format!(
                "asking Prometheus again (its last answer is {} s old)",
                age.as_secs()
            )),
            _ => entry.answer.clone(),
        };
        (answer, again)
    }

    /// Forget URLs no gate names any more.
    pub fn retain(&self, urls: &[&str]) {
        lock(&self.0).retain(|u, _| urls.contains(&u.as_str()));
    }
}
