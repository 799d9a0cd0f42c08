//! Prometheus's answers for the cluster role's `gates.prometheus`, asked in
//! the background: a pass reads the last answer per URL and never waits for
//! Prometheus (a Prometheus that hangs must not hold up every other
//! feature's admissions). A question is asked when the last answer is
//! older than [`EVERY`], bounded by [`DEADLINE`] ([`super::background`]
//! keeps and asks); an answer older than both counts as not known (it
//! admits nothing).

use std::time::Duration;

use super::background::{Answers, Ask};
use crate::decide::disrupt::Alerts;

/// How old an answer may get before it is asked again (kured's default
/// period is an hour of sentinel checks; alerts move faster).
pub const EVERY: Duration = Duration::from_secs(15);
/// How long one question may take.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// The last answer per Prometheus URL.
#[derive(Default)]
pub struct AlertCache(Answers<Alerts>);

impl AlertCache {
    /// The last answer for `url`, and when the pass should look again;
    /// asks anew in the background if the answer is missing or stale.
    pub fn get(&self, url: &str) -> (Alerts, Duration) {
        let question = url.to_string();
        let kept = self.0.get(
            url,
            || Alerts::Unknown("Prometheus not asked yet".into()),
            Ask {
                every: EVERY,
                ask: move || async move {
                    match crate::effects::prometheus::active_alerts(&question, DEADLINE).await {
                        Ok(active) => Alerts::Active(active),
                        Err(why) => {
                            log::warn!("asking Prometheus at {question} for its alerts: {why}");
                            Alerts::Unknown(why)
                        }
                    }
                },
                keep: |kept: &mut Alerts, new| *kept = new,
                kick: None,
            },
        );
        // An old answer admits nothing: a quiet cluster's first pass in
        // minutes would otherwise admit on what Prometheus said then.
        let answer = match kept.age {
            Some(age) if age > EVERY + DEADLINE => Alerts::Unknown(format!(
                "asking Prometheus again (its last answer is {} s old)",
                age.as_secs()
            )),
            _ => kept.answer,
        };
        (answer, kept.again)
    }

    /// Forget URLs no gate names any more.
    pub fn retain(&self, urls: &[&str]) {
        self.0.retain(|u| urls.contains(&u));
    }
}
