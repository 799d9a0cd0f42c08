//! What the cluster role keeps about objects whose decisions failed:
//! generic, below `context.rs` (which reports through it), with nothing
//! feature-specific. The scheduler's passes and the replacement task each
//! keep one, pruned with their objects.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::ObjectMeta;

/// First retry of a failed object, doubling to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// A conflict (409) is a stale snapshot, not a failure: decide again soon,
/// 200 ms doubling to 5 s while conflicts follow each other.
pub const RETRY_CONFLICT: Duration = Duration::from_millis(200);
const RETRY_CONFLICT_MAX: Duration = Duration::from_secs(5);
/// Conflicts in a row after which an object counts as failing: another
/// writer fights over the same status (NMO left installed beside us, a
/// field an older schema prunes). It is reported on the object and backed
/// off like any failure, not retried at 5 Hz for ever in silence.
pub const CONFLICTS_BEFORE_FAILURE: u32 = 8;

/// What one object's last failure was, so the next pass waits for its
/// backoff (or a change of the object) and says why in its status.
struct Failure {
    /// The object's [`Subject::change`] when it failed.
    change: Option<String>,
    count: u32,
    retry_at: Instant,
    message: String,
}

/// Per object (`Kind/name`): its last failure, and the conflicts it met
/// in a row. Pruned with the objects.
#[derive(Default)]
pub struct Failing(Mutex<HashMap<String, Failure>>, Mutex<HashMap<String, u32>>);

impl Failing {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failure>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conflicts(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record a conflict: `Ok(wait)` to decide again after `wait`, or
    /// `Err(count)` once [`CONFLICTS_BEFORE_FAILURE`] came in a row (the
    /// caller records a failure; the count starts again).
    pub fn conflicted(&self, key: &str) -> Result<Duration, u32> {
        let mut map = self.conflicts();
        let count = map.entry(key.to_string()).or_default();
        *count += 1;
        if *count >= CONFLICTS_BEFORE_FAILURE {
            let n = *count;
            map.remove(key);
            return Err(n);
        }
        Ok(RETRY_CONFLICT
            .saturating_mul(1 << (*count - 1).min(5))
            .min(RETRY_CONFLICT_MAX))
    }

    /// `Ok` if the object may be decided now: it has not failed, its
    /// backoff is over, or someone changed it since (a fix is tried at
    /// once; `change` is [`Subject::change`]). Otherwise how long until it
    /// may.
    pub fn due(&self, key: &str, change: Option<&str>) -> Result<(), Duration> {
        match self.map().get(key) {
            Some(f) if f.change.as_deref() == change && f.retry_at > Instant::now() => {
                Err(f.retry_at - Instant::now())
            }
            _ => Ok(()),
        }
    }

    /// Why the object's last pass failed, if it did.
    pub fn message(&self, key: &str) -> Option<String> {
        self.map().get(key).map(|f| f.message.clone())
    }

    /// Record a failure; returns how long to back off.
    pub fn failed(&self, key: &str, change: Option<String>, message: String) -> Duration {
        let mut map = self.map();
        let count = map.get(key).map_or(0, |f| f.count).saturating_add(1);
        let delay = RETRY_FIRST
            .saturating_mul(1 << (count - 1).min(6))
            .min(RETRY_MAX);
        map.insert(
            key.to_string(),
            Failure {
                change,
                count,
                retry_at: Instant::now() + delay,
                message,
            },
        );
        delay
    }

    pub fn succeeded(&self, key: &str) {
        self.map().remove(key);
        self.conflicts().remove(key);
    }

    /// Keep only the failures of objects `exists` still knows.
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.map().retain(|k, _| exists(k));
        self.conflicts().retain(|k, _| exists(k));
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The object a pass decided for, as its failure is reported.
pub struct Subject {
    /// `Kind/name` (namespaced kinds: `Kind/namespace/name`).
    pub key: String,
    pub reference: ObjectReference,
    /// What says someone else changed the object: its generation (a spec
    /// edit), which the object's own status writes never bump — a failed
    /// pass writes its status (`Reconciled=False`), and counted as a
    /// change that retried at once and doubled the backoff each time (10,
    /// 20, 40 s in one second: a give-back refused for a few seconds was
    /// done 40 s later). Its resourceVersion where it has no generation.
    pub change: Option<String>,
}

impl Subject {
    pub fn of(api_version: &str, kind: &str, meta: &ObjectMeta) -> Subject {
        let name = meta.name.clone().unwrap_or_default();
        let key = match &meta.namespace {
            Some(ns) => format!("{kind}/{ns}/{name}"),
            None => format!("{kind}/{name}"),
        };
        Subject {
            key,
            reference: ObjectReference {
                api_version: Some(api_version.to_string()),
                kind: Some(kind.to_string()),
                name: Some(name),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                ..Default::default()
            },
            change: meta
                .generation
                .map(|g| g.to_string())
                .or_else(|| meta.resource_version.clone()),
        }
    }

    pub fn typed<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Subject {
        Subject::of(&K::api_version(&()), &K::kind(&()), obj.meta())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// where-features-meet.md, C4: the failed pass's own status write
    /// (a new resourceVersion) is not a change of the world; a spec edit
    /// (a new generation) is.
    #[test]
    fn an_objects_own_status_write_does_not_make_it_due() {
        let mut meta = ObjectMeta {
            name: Some("p".into()),
            generation: Some(3),
            resource_version: Some("100".into()),
            ..Default::default()
        };
        let f = Failing::default();
        let s = Subject::of("nodekeeper.io/v1alpha1", "RebootPolicy", &meta);
        f.failed(&s.key, s.change.clone(), "refused".into());
        meta.resource_version = Some("101".into());
        let own_write = Subject::of("nodekeeper.io/v1alpha1", "RebootPolicy", &meta);
        assert!(f.due(&own_write.key, own_write.change.as_deref()).is_err());
        meta.generation = Some(4);
        let edited = Subject::of("nodekeeper.io/v1alpha1", "RebootPolicy", &meta);
        assert!(f.due(&edited.key, edited.change.as_deref()).is_ok());
    }

    #[test]
    fn a_failed_object_backs_off_doubling_and_is_due_again_once_it_changes() {
        let f = Failing::default();
        assert!(f.due("RebootPolicy/a", Some("1")).is_ok());
        let first = f.failed("RebootPolicy/a", Some("1".into()), "refused".into());
        assert_eq!(first, RETRY_FIRST);
        assert!(f.due("RebootPolicy/a", Some("1")).is_err());
        assert!(
            f.due("RebootPolicy/a", Some("2")).is_ok(),
            "a change is tried at once"
        );
        assert!(
            f.due("RebootPolicy/b", Some("1")).is_ok(),
            "others are not held"
        );
        let second = f.failed("RebootPolicy/a", Some("1".into()), "refused".into());
        assert_eq!(second, RETRY_FIRST * 2);
        for _ in 0..20 {
            f.failed("RebootPolicy/a", Some("1".into()), "refused".into());
        }
        assert!(f.due("RebootPolicy/a", Some("1")).err() <= Some(RETRY_MAX));
        assert_eq!(f.message("RebootPolicy/a").as_deref(), Some("refused"));
        f.succeeded("RebootPolicy/a");
        assert_eq!(f.message("RebootPolicy/a"), None);
        f.failed("RebootPolicy/c", None, "x".into());
        f.retain(|k| k != "RebootPolicy/c");
        assert!(f.is_empty());
    }

    #[test]
    fn conflicts_back_off_and_a_run_of_them_becomes_a_failure() {
        let f = Failing::default();
        let waits: Vec<Duration> = (0..CONFLICTS_BEFORE_FAILURE - 1)
            .map(|_| f.conflicted("RebootPolicy/p").unwrap_or_default())
            .collect();
        assert_eq!(waits[0], RETRY_CONFLICT);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
        assert_eq!(waits.last(), Some(&RETRY_CONFLICT_MAX));
        assert_eq!(
            f.conflicted("RebootPolicy/p"),
            Err(CONFLICTS_BEFORE_FAILURE)
        );
        // A success in between starts the count again.
        assert!(f.conflicted("RebootPolicy/q").is_ok());
        f.succeeded("RebootPolicy/q");
        assert_eq!(f.conflicted("RebootPolicy/q"), Ok(RETRY_CONFLICT));
    }
}
