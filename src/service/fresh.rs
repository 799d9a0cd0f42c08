//! The mutation cache: our own writes, kept until the watch catches up.
//!
//! After we patch an object the API server answers with the new version at
//! once, but the watch that updates the reflector store may deliver it
//! later. Deciding on the stale store copy would repeat a step or trip over
//! a 409, so reads prefer our newer copy (compared by resourceVersion, as
//! client-go's `MutationCache`). The store stays the authority on
//! existence: an object the store no longer has is gone, whatever we wrote
//! to it before — a cached copy must never resurrect a deleted Node or
//! NodeMaintenance. The one exception is an object we just created: until
//! the store shows it (at most [`UNSEEN_FOR`]) it is read as existing, so
//! the next decision in the same pass (another RebootPolicy, an
//! UpgradePlan) counts it against its budget and its one owner per node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::{Resource, ResourceExt};

/// Newer-than-the-store copies of objects we wrote, by name, and the
/// objects our writes deleted.
pub struct FreshCache<K> {
    written: Mutex<HashMap<String, Arc<K>>>,
    /// Objects we deleted (by removing their last finalizer), with the
    /// resourceVersion they had: a stored copy no newer than that is gone.
    buried: Mutex<HashMap<String, u64>>,
    /// Objects we created that the store may not show yet, and when.
    created: Mutex<HashMap<String, (Arc<K>, std::time::Instant)>>,
}

/// How long an object we created is read as existing without the store
/// showing it (a watch delivers it in milliseconds; a longer absence means
/// it was deleted meanwhile).
pub const UNSEEN_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl<K> Default for FreshCache<K> {
    fn default() -> Self {
        FreshCache {
            written: Mutex::default(),
            buried: Mutex::default(),
            created: Mutex::default(),
        }
    }
}

/// resourceVersions are etcd revisions; comparing them is how client-go's
/// mutation cache tells which copy is newer.
fn rv(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl<K: Resource> FreshCache<K> {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<K>>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn buried(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.buried.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Our write deleted object `name`, last seen at `resource_version`
    /// (unknown: any version the store may still hold).
    pub fn bury(&self, name: &str, resource_version: Option<&str>) {
        let at = resource_version
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        self.map().remove(name);
        self.buried().insert(name.to_string(), at);
    }

    fn created(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<K>, std::time::Instant)>> {
        self.created.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// We created `obj`: read it as existing until the store shows it.
    pub fn remember_created(&self, obj: K) {
        let name = obj.name_any();
        self.created()
            .insert(name, (Arc::new(obj), std::time::Instant::now()));
    }

    /// The objects we created that the store (`stored` says which names it
    /// has) does not show yet; entries it shows, or older than
    /// [`UNSEEN_FOR`], are dropped.
    pub fn unseen(&self, stored: impl Fn(&str) -> bool) -> Vec<Arc<K>> {
        let buried = self.buried();
        let mut created = self.created();
        created.retain(|name, (_, at)| {
            !stored(name) && !buried.contains_key(name) && at.elapsed() < UNSEEN_FOR
        });
        created.values().map(|(o, _)| o.clone()).collect()
    }

    /// Keep the server's answer to one of our writes.
    pub fn remember(&self, obj: K) {
        let name = obj.name_any();
        self.map().insert(name, Arc::new(obj));
    }

    /// The newest copy of `stored` (the store's view of object `name`).
    /// Absent from the store means deleted: the cached copy is dropped, not
    /// returned. A cached copy the store has caught up with is dropped too.
    pub fn fresher(&self, name: &str, stored: Option<Arc<K>>) -> Option<Arc<K>> {
        let Some(stored) = stored else {
            self.map().remove(name);
            self.buried().remove(name);
            return None;
        };
        {
            let mut buried = self.buried();
            match buried.get(name) {
                Some(&at) if rv(stored.meta()) <= at => return None,
                // A newer object of the same name: not the one we deleted.
                Some(_) => {
                    buried.remove(name);
                }
                None => {}
            }
        }
        let mut map = self.map();
        match map.get(name) {
            Some(ours) if rv(ours.meta()) > rv(stored.meta()) => Some(ours.clone()),
            Some(_) => {
                map.remove(name);
                Some(stored)
            }
            None => Some(stored),
        }
    }

    /// The object was deleted (the watch said so).
    pub fn forget(&self, name: &str) {
        self.map().remove(name);
        self.buried().remove(name);
    }

    /// Drop every entry whose object `exists` no longer reports (deletions
    /// the watch missed while it relisted).
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.map().retain(|name, _| exists(name));
        self.buried().retain(|name, _| exists(name));
        self.created()
            .retain(|_, (_, at)| at.elapsed() < UNSEEN_FOR);
    }

    /// Entries held: written copies and buried names.
    pub fn len(&self) -> usize {
        self.map().len() + self.buried().len() + self.created().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::node::Node;
    use kube::api::ObjectMeta;

    fn node(rv: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn version(n: Option<Arc<Node>>) -> Option<String> {
        n.and_then(|n| n.metadata.resource_version.clone())
    }

    #[test]
    fn our_newer_write_wins_until_the_store_catches_up() {
        let cache = FreshCache::default();
        cache.remember(node("7"));
        assert_eq!(
            version(cache.fresher("n", Some(Arc::new(node("5"))))),
            Some("7".into())
        );
        assert_eq!(
            version(cache.fresher("n", Some(Arc::new(node("9"))))),
            Some("9".into())
        );
        assert!(cache.is_empty(), "a caught-up entry is dropped");
    }

    #[test]
    fn a_deleted_object_is_not_resurrected_by_our_last_write() {
        let cache = FreshCache::default();
        cache.remember(node("7"));
        assert_eq!(version(cache.fresher("n", None)), None);
        assert!(cache.is_empty());
    }

    /// Removing the last finalizer deletes the object; the server's answer
    /// (and the stalled watch) still show the deleted version, which must
    /// read as gone. A newer object of the same name is someone else's.
    #[test]
    fn an_object_our_write_deleted_stays_gone_until_a_newer_one_appears() {
        let cache: FreshCache<Node> = FreshCache::default();
        cache.remember(node("6"));
        cache.bury("n", Some("7"));
        assert_eq!(version(cache.fresher("n", Some(Arc::new(node("5"))))), None);
        assert_eq!(version(cache.fresher("n", Some(Arc::new(node("7"))))), None);
        assert_eq!(
            version(cache.fresher("n", Some(Arc::new(node("12"))))),
            Some("12".into())
        );
        assert!(cache.is_empty(), "the newer object ends the burial");
        cache.bury("n", None);
        assert_eq!(
            version(cache.fresher("n", Some(Arc::new(node("99"))))),
            None
        );
        assert_eq!(version(cache.fresher("n", None)), None);
        assert!(cache.is_empty(), "the store's deletion ends it too");
    }

    #[test]
    fn deletions_and_relists_prune_the_cache() {
        let cache: FreshCache<Node> = FreshCache::default();
        cache.remember(node("7"));
        cache.forget("n");
        assert!(cache.is_empty());
        cache.remember(node("8"));
        cache.retain(|_| false);
        assert!(cache.is_empty());
    }

    #[test]
    fn a_created_object_is_read_as_existing_until_the_store_shows_it() {
        let cache: FreshCache<Node> = FreshCache::default();
        cache.remember_created(node("5"));
        // Not in the store yet: the next decision sees it.
        assert_eq!(cache.unseen(|_| false).len(), 1);
        // The store has it: from there the store is the authority.
        assert!(cache.unseen(|n| n == "n").is_empty());
        assert!(cache.unseen(|_| false).is_empty(), "dropped once seen");
        // Deleted by us before the store showed it: not resurrected.
        cache.remember_created(node("6"));
        cache.bury("n", Some("6"));
        assert!(cache.unseen(|_| false).is_empty());
    }
}
