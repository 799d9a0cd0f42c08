//! Who looks after a NodeMaintenance that no agent owns: one whose node does
//! not exist (or has no agent). Such an object either never started (fail
//! it as NMO's webhook would have refused it) or is being deleted with our
//! finalizer after its Node went (finish it). The cluster role sees every
//! node and acts at once; in node mode every agent may act, after a grace
//! for the real owner and with per-object backoff, so one bad object never
//! makes N agents poll.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::nodemaintenance::NodeMaintenance;

/// How long an object for a node we do not own may wait for that node's own
/// agent before a node-mode agent checks whether the node exists at all.
pub const GRACE: Duration = Duration::from_secs(5);

/// Could this object be waiting for an agent that does not exist? Only one
/// that never started, or one being deleted that still has our finalizer:
/// a started maintenance has an owner, and if its Node goes, the garbage
/// collector deletes the object (owner reference), which is the second case.
pub fn needs_attention(nm: &NodeMaintenance) -> bool {
    if nm.is_deleting() {
        nm.has_finalizer()
    } else {
        nm.phase().is_none()
    }
}

/// How long node mode waits before it looks again for the node of a foreign
/// object. After a look that worked (the node exists; its own agent should
/// act) once a minute; after `failures` failed looks in a row 5 s doubling
/// to 5 min. `seed` spreads it by ±20 % so many agents do not ask in step.
pub fn recheck_after(failures: u32, seed: u64) -> Duration {
    let base_ms: u64 = match failures {
        0 => 60_000,
        n => (5_000u64 << (n - 1).min(6)).min(300_000),
    };
    // 80 % .. 120 % of the base, in 1 % steps.
    let percent = 80 + seed % 41;
    Duration::from_millis(base_ms * percent / 100)
}

/// The last look at a foreign object's node, for [`due`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LastCheck {
    pub at: Timestamp,
    /// Failed looks in a row (0 after one that worked).
    pub failures: u32,
}

/// When a node-mode agent should next look at `nm`'s node: after the grace
/// that starts at its creation (or deletion), and after the backoff since
/// the last look. `seed` is this agent's jitter for this object.
pub fn due(nm: &NodeMaintenance, last: Option<LastCheck>, seed: u64) -> Option<Timestamp> {
    let since = nm
        .metadata
        .deletion_timestamp
        .as_ref()
        .or(nm.metadata.creation_timestamp.as_ref())?
        .0;
    let mut due = since
        .checked_add(SignedDuration::try_from(GRACE).ok()?)
        .ok()?;
    if let Some(last) = last {
        let again = recheck_after(last.failures, seed);
        due = due.max(
            last.at
                .checked_add(SignedDuration::try_from(again).ok()?)
                .ok()?,
        );
    }
    Some(due)
}

/// A per-agent, per-object jitter seed (a hash: pure, and different for
/// every agent and object, so N agents do not GET in lockstep).
pub fn jitter_seed(agent: &str, object: &str, failures: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    agent.hash(&mut h);
    object.hash(&mut h);
    failures.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::nodemaintenance::NodeMaintenanceSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn rechecks_back_off_with_jitter_and_stay_bounded() {
        let secs = |failures, seed| recheck_after(failures, seed).as_secs_f64();
        // A node that exists (its own agent should act): once a minute, ±20 %.
        assert!((48.0..=72.0).contains(&secs(0, 7)));
        // Failing looks: 5 s doubling, capped at 5 min, each ±20 %.
        assert!((4.0..=6.0).contains(&secs(1, 3)));
        assert!((8.0..=12.0).contains(&secs(2, 3)));
        assert!((240.0..=360.0).contains(&secs(30, 3)));
        // Different agents spread out; the same seed is stable.
        let spread: std::collections::HashSet<u128> = (0..40)
            .map(|agent| recheck_after(1, jitter_seed(&format!("n{agent}"), "m", 1)).as_millis())
            .collect();
        assert!(spread.len() > 20, "{spread:?}");
        assert_eq!(recheck_after(3, 11), recheck_after(3, 11));
    }

    #[test]
    fn a_foreign_object_is_looked_at_after_the_grace_then_after_the_backoff() {
        let t0 = Timestamp::UNIX_EPOCH;
        let mut nm = NodeMaintenance::new(
            "m",
            NodeMaintenanceSpec {
                node_name: "gone".into(),
                ..Default::default()
            },
        );
        nm.metadata.creation_timestamp = Some(Time(t0));
        let at = |s| t0.checked_add(SignedDuration::from_secs(s)).ok();
        assert_eq!(due(&nm, None, 0), at(5));
        let failed = LastCheck {
            at: at(5).unwrap_or(t0),
            failures: 2,
        };
        // 10 s base, 80 % with seed 0.
        assert_eq!(due(&nm, Some(failed), 0), at(13));
    }
}
