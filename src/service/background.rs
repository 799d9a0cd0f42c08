//! Answers from outside that the cluster role's passes read but never wait
//! for (Prometheus's alerts, the health gate's workloads, UpgradePlan
//! channels): one cache of the last answer per key, asked anew in the
//! background once it is old enough, one question per key at a time. A
//! pass takes what is there and when to look again; a hanging server holds
//! up nothing but its own answer.
//!
//! What each answer means, how old it may be before it counts as unknown
//! and what a question costs are its user's ([`super::alerts`],
//! [`super::health`], [`super::channels`]); how it is kept and asked is
//! here, once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::passes::Kick;
use crate::runtime::lock;

/// How soon a pass looks again while a question is out, so the first
/// answer is used within about a second.
pub const SOON: Duration = Duration::from_secs(1);

struct Entry<A> {
    answer: A,
    asked: Option<Instant>,
    asking: bool,
}

/// What a pass reads of one key.
pub struct Kept<A> {
    pub answer: A,
    /// How old the answer is (`None`: nothing answered yet).
    pub age: Option<Duration>,
    /// When the pass should look again.
    pub again: Duration,
}

/// The last answer per key.
pub struct Answers<A>(Arc<Mutex<HashMap<String, Entry<A>>>>);

impl<A> Default for Answers<A> {
    fn default() -> Self {
        Answers(Arc::default())
    }
}

/// How a question is asked and its answer kept.
pub struct Ask<F, K> {
    /// How old an answer may get before it is asked again.
    pub every: Duration,
    /// The question, started in the background when one is due.
    pub ask: F,
    /// Folds what it answered into the kept answer.
    pub keep: K,
    /// Kicked once an answer is kept (so a pass uses it at once).
    pub kick: Option<Kick>,
}

impl<A: Clone + Send + 'static> Answers<A> {
    /// The answer kept for `key` (`first` while there is none), its age and
    /// when to look again; asks anew in the background when it is due.
    pub fn get<R, Fut, F, K>(&self, key: &str, first: impl FnOnce() -> A, q: Ask<F, K>) -> Kept<A>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = R> + Send + 'static,
        K: FnOnce(&mut A, R) + Send + 'static,
        R: Send + 'static,
    {
        let mut map = lock(&self.0);
        let entry = map.entry(key.to_string()).or_insert_with(|| Entry {
            answer: first(),
            asked: None,
            asking: false,
        });
        let due = entry.asked.is_none_or(|t| t.elapsed() >= q.every);
        if due && !entry.asking {
            entry.asking = true;
            let (cache, key, question, keep, kick) =
                (self.0.clone(), key.to_string(), (q.ask)(), q.keep, q.kick);
            crate::runtime::spawn(async move {
                let answer = question.await;
                if let Some(e) = lock(&cache).get_mut(&key) {
                    keep(&mut e.answer, answer);
                    e.asked = Some(Instant::now());
                    e.asking = false;
                }
                if let Some(kick) = kick {
                    kick.kick();
                }
            })
            .detach();
        }
        let again = if entry.asking {
            SOON
        } else {
            entry
                .asked
                .map_or(SOON, |t| q.every.saturating_sub(t.elapsed()).max(SOON))
        };
        Kept {
            answer: entry.answer.clone(),
            age: entry.asked.map(|t| t.elapsed()),
            again,
        }
    }

    /// Forget the keys `wanted` no longer names.
    pub fn retain(&self, wanted: impl Fn(&str) -> bool) {
        lock(&self.0).retain(|k, _| wanted(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_question_at_a_time_its_answer_kept_and_a_pass_told_when_to_look_again() {
        crate::runtime::block_on(async {
            let answers: Answers<String> = Answers::default();
            let (tx, rx) = smol::channel::bounded::<String>(1);
            let (kick, kicked) = Kick::new();
            let ask = |rx: smol::channel::Receiver<String>, kick: Option<Kick>| Ask {
                every: Duration::from_secs(60),
                ask: move || async move { rx.recv().await.unwrap_or_default() },
                keep: |kept: &mut String, new: String| *kept = new,
                kick,
            };
            let first = answers.get("u", || "none yet".into(), ask(rx.clone(), Some(kick)));
            assert_eq!(
                (first.answer.as_str(), first.age, first.again),
                ("none yet", None, SOON)
            );
            // Out already: not asked twice.
            let again = answers.get("u", || unreachable!(), ask(rx.clone(), None));
            assert_eq!(again.again, SOON);
            let _ = tx.send("v2".into()).await;
            let _ = kicked.recv().await;
            let kept = answers.get("u", || unreachable!(), ask(rx.clone(), None));
            assert_eq!(kept.answer, "v2");
            assert!(kept.age.is_some() && kept.again > SOON, "{:?}", kept.again);
            answers.retain(|k| k != "u");
            let gone = answers.get("u", || "forgotten".into(), ask(rx, None));
            assert_eq!(gone.answer, "forgotten");
        });
    }
}
