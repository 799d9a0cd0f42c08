//! What the loop decides from: one reflector store per watched kind, each
//! fed by our own watcher so that we see its first full list (readiness)
//! and its deletions (pruning the mutation cache), plus the mutation cache
//! itself ([`Fresh`]). RebootPolicies and UpgradePlans are watched in both
//! roles: few objects, and the node role needs its policy's sentinel and
//! command and its plan's upgrade command. Jobs (by the managed-by label
//! every Job nodekeeper creates carries) only in the cluster role.

use std::sync::Arc;

use crate::api::node::Node;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use super::fresh::FreshCache;
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::api::upgrade::UpgradePlan;
use crate::runtime::Latch;

/// Each watched kind's first full list, as latches any number of tasks may
/// wait on (see [`Latch`] for why not `Store::wait_until_ready`).
#[derive(Clone, Default)]
pub struct Synced {
    pub nodes: Latch,
    pub pods: Latch,
    pub maintenances: Latch,
    pub policies: Latch,
    pub plans: Latch,
    /// Not waited for here: watched from the first drain that needs it.
    pub drain_rules: OnDemand,
    /// Opened at once where Jobs are not watched (the node role).
    pub jobs: Latch,
    /// The mutex operator's kinds (opened at once where not watched).
    pub mutex: Latch,
    /// Constellation's kinds (opened at once where not watched).
    pub replace: Latch,
}

impl Synced {
    pub async fn wait(&self) {
        self.nodes.wait().await;
        self.pods.wait().await;
        self.maintenances.wait().await;
        self.policies.wait().await;
        self.plans.wait().await;
        self.jobs.wait().await;
        self.mutex.wait().await;
        self.replace.wait().await;
    }
}

/// A watch started by its first reader instead of at start-up: a kind a
/// process may never need costs it no list and no watch (the node role's
/// DrainRules: read only by a drain with a pod a rule could place, which
/// an agent restarted by its node's reboot has not until the next drain).
#[derive(Clone, Default)]
pub struct OnDemand {
    /// Opened by the first reader: the watch starts.
    pub wanted: Latch,
    /// Opened at the watch's first full list.
    pub listed: Latch,
    /// The watch's latest failure, for a reader left waiting.
    failure: Arc<std::sync::Mutex<Option<String>>>,
}

impl OnDemand {
    /// Start the watch if it is not running, and wait up to `within` for
    /// its first list: whether it has listed.
    pub async fn listed_within(&self, within: std::time::Duration) -> bool {
        self.wanted.open();
        crate::runtime::timeout(within, self.listed.wait())
            .await
            .is_ok()
    }

    /// Remember why the watch failed (it retries by itself).
    pub fn failed(&self, why: &watcher::Error) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
    }

    /// Why the watch last failed, if it has.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Our writes that the watches may not have delivered yet.
#[derive(Default)]
pub struct Fresh {
    pub nodes: FreshCache<Node>,
    pub maintenances: FreshCache<NodeMaintenance>,
    pub policies: FreshCache<RebootPolicy>,
    pub plans: FreshCache<UpgradePlan>,
}

/// The order in which the NodeMaintenance watch first delivered each
/// object (by UID): the order the API server stored them, finer than
/// `creationTimestamp`'s whole seconds. Two maintenances for one node
/// created in the same second are told apart by it: the first stored wins.
/// A list (at start, or a relist) delivers objects in name order, so new
/// ones in a list are numbered by resourceVersion instead: an object not
/// written since its creation still has its creation's revision, and one
/// that was written has normally recorded its claim (finalizer, status),
/// which outranks arrival anyway.
#[derive(Default)]
pub struct Arrivals {
    seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    next: std::sync::atomic::AtomicU64,
    /// New objects of the list in progress: (resourceVersion, UID).
    listing: std::sync::Mutex<Vec<(u64, String)>>,
}

impl Arrivals {
    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u64>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note an event on its way to the store (before it, so that no
    /// reconcile sees an object whose arrival is unknown).
    pub fn note<K: kube::Resource>(&self, ev: &Result<watcher::Event<K>, watcher::Error>) {
        let rv = |o: &K| -> u64 {
            o.meta()
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX)
        };
        match ev {
            Ok(watcher::Event::Apply(o)) => {
                if let Some(uid) = o.meta().uid.as_deref() {
                    let mut seen = self.seen();
                    if !seen.contains_key(uid) {
                        seen.insert(uid.to_string(), self.take());
                    }
                }
            }
            Ok(watcher::Event::Init) => self.listing().clear(),
            Ok(watcher::Event::InitApply(o)) => {
                if let Some(uid) = o.meta().uid.as_deref()
                    && !self.seen().contains_key(uid)
                {
                    self.listing().push((rv(o), uid.to_string()));
                }
            }
            Ok(watcher::Event::InitDone) => {
                let mut listed = std::mem::take(&mut *self.listing());
                listed.sort();
                let mut seen = self.seen();
                for (_, uid) in listed {
                    let n = self.take();
                    seen.entry(uid).or_insert(n);
                }
            }
            Ok(watcher::Event::Delete(o)) => {
                if let Some(uid) = o.meta().uid.as_deref() {
                    self.seen().remove(uid);
                }
            }
            _ => {}
        }
    }

    fn take(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn listing(&self) -> std::sync::MutexGuard<'_, Vec<(u64, String)>> {
        self.listing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When `uid` arrived; unknown ones sort last.
    pub fn of(&self, uid: Option<&str>) -> u64 {
        uid.and_then(|u| self.seen().get(u).copied())
            .unwrap_or(u64::MAX)
    }

    /// Forget objects that are gone (deletions missed while relisting).
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.seen().retain(|uid, _| exists(uid));
    }
}

/// The reflector stores the loop decides from.
pub struct Stores {
    pub nodes: Store<Node>,
    pub pods: Arc<super::pod_watches::PodWatches>,
    pub maintenances: Store<NodeMaintenance>,
    pub policies: Store<RebootPolicy>,
    pub plans: Store<UpgradePlan>,
    pub drain_rules: Store<kube::api::DynamicObject>,
    pub jobs: Store<kube::api::DynamicObject>,
    pub synced: Synced,
    pub fresh: Arc<Fresh>,
    pub arrivals: Arc<Arrivals>,
}

#[cfg(test)]
mod arrival_tests {
    use super::*;
    use crate::api::nodemaintenance::NodeMaintenanceSpec;
    use watcher::Event;

    fn nm(uid: &str, rv: &str) -> Result<NodeMaintenance, watcher::Error> {
        let mut m = NodeMaintenance::new(
            uid,
            NodeMaintenanceSpec {
                node_name: "n".into(),
                reason: None,
            },
        );
        m.metadata.uid = Some(uid.into());
        m.metadata.resource_version = Some(rv.into());
        Ok(m)
    }

    fn feed(a: &Arrivals, ev: Event<NodeMaintenance>) {
        a.note(&Ok(ev));
    }

    #[test]
    fn watch_events_are_numbered_as_delivered_and_lists_by_resource_version() {
        let a = Arrivals::default();
        // Delivered "z" then "b": z first, whatever the names.
        for uid in ["z", "b"] {
            if let Ok(m) = nm(uid, "1") {
                feed(&a, Event::Apply(m));
            }
        }
        assert!(a.of(Some("z")) < a.of(Some("b")));
        // A later update does not renumber.
        if let Ok(m) = nm("z", "50") {
            feed(&a, Event::Apply(m));
        }
        assert!(a.of(Some("z")) < a.of(Some("b")));
        // A relist delivers by name; new objects go by resourceVersion.
        feed(&a, Event::Init);
        for (uid, rv) in [("c", "9"), ("d", "7"), ("z", "50")] {
            if let Ok(m) = nm(uid, rv) {
                feed(&a, Event::InitApply(m));
            }
        }
        assert_eq!(a.of(Some("d")), u64::MAX, "unknown until the list is done");
        feed(&a, Event::InitDone);
        assert!(a.of(Some("b")) < a.of(Some("d")));
        assert!(a.of(Some("d")) < a.of(Some("c")));
        if let Ok(m) = nm("b", "60") {
            feed(&a, Event::Delete(m));
        }
        assert_eq!(a.of(Some("b")), u64::MAX);
        a.retain(|uid| uid != "c");
        assert_eq!(a.of(Some("c")), u64::MAX);
    }
}
