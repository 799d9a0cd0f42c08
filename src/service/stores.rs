//! What the loop decides from: one reflector store per watched kind, each
//! fed by our own watcher so that we see its first full list (readiness)
//! and its deletions (pruning the mutation cache), plus the mutation cache
//! itself ([`Fresh`]). RebootPolicies and UpgradePlans are watched in both
//! roles: few objects, and the node role needs its policy's sentinel and
//! command and its plan's upgrade command. Hook Jobs (by their plan label)
//! only in the cluster role.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use super::fresh::FreshCache;
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::pod::Pod;
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

/// Our writes that the watches may not have delivered yet.
#[derive(Default)]
pub struct Fresh {
    pub nodes: FreshCache<Node>,
    pub maintenances: FreshCache<NodeMaintenance>,
    pub policies: FreshCache<RebootPolicy>,
    pub plans: FreshCache<UpgradePlan>,
}

/// The reflector stores the loop decides from.
pub struct Stores {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub maintenances: Store<NodeMaintenance>,
    pub policies: Store<RebootPolicy>,
    pub plans: Store<UpgradePlan>,
    pub jobs: Store<kube::api::DynamicObject>,
    pub mutex: Option<MutexStores>,
    pub replace: Option<super::replace::Replace>,
    pub synced: Synced,
    pub fresh: Arc<Fresh>,
}

/// The stores of the mutex flow. Every kind is watched untyped (one
/// watcher instantiation for all five: each typed watcher costs the binary
/// ~25 KiB) and read typed when a pass runs.
pub struct MutexStores {
    pub rules: Store<kube::api::DynamicObject>,
    pub targets: Store<kube::api::DynamicObject>,
    pub runs: Store<kube::api::DynamicObject>,
    pub pools: Option<Store<kube::api::DynamicObject>>,
    pub versions: Option<Store<kube::api::DynamicObject>>,
}

/// Retry delays of a failed watch: 0.5 s doubling to 5 s, with ±50 %
/// jitter, back to 0.5 s after any successful event. kube's default grows
/// to 30 s, and a kube-apiserver restart costs a watch several failures in a
/// row (connection refused while it is down, 429 "storage is
/// (re)initializing" while its caches fill, 410 Expired for the
/// resourceVersion it had).
pub struct WatchBackoff {
    next: std::time::Duration,
    seed: u64,
}

impl WatchBackoff {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(500);
    const MAX: std::time::Duration = std::time::Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id()).rotate_left(32);
        WatchBackoff {
            next: Self::FIRST,
            seed: seed | 1,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        // xorshift64: jitter needs spread, not cryptography.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let factor = 0.5 + (self.seed % 1000) as f64 / 1000.0;
        let d = self.next.mul_f64(factor);
        self.next = (self.next * 2).min(Self::MAX);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Watch an event stream on its way to the controller: open `latch` at the
/// first full list, and tell `forget` the name of every deleted object.
pub fn observe<K: kube::Resource>(
    ev: &Result<watcher::Event<K>, watcher::Error>,
    latch: &Latch,
    forget: impl Fn(&str),
) {
    match ev {
        Ok(watcher::Event::InitDone) => latch.open(),
        Ok(watcher::Event::Delete(obj)) => {
            if let Some(name) = obj.meta().name.as_deref() {
                forget(name)
            }
        }
        _ => {}
    }
}

/// Drop what no decision reads from a Node before it enters the store: its
/// managed fields (every status writer — kubelet, node controller, us —
/// leaves an entry) and the lists a real kubelet reports at length (images
/// on the node, volumes). Nodes are only ever written by merge patch, never
/// replaced from this copy, so nothing dropped here can be lost.
pub fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

/// A Job as the features read it: its labels and conditions. The
/// template is the feature's own and stays out of memory; Jobs stay
/// untyped (a typed Job would link a second pod-template deserializer).
pub fn slim_job(job: &mut kube::api::DynamicObject) {
    job.metadata.managed_fields = None;
    job.metadata.annotations = None;
    let conditions = job.data["status"]["conditions"].take();
    job.data = serde_json::json!({"status": {"conditions": conditions}});
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn watch_retries_back_off_to_five_seconds_with_jitter_and_reset() {
        let mut b = WatchBackoff::default();
        let delays: Vec<_> = (&mut b).take(8).collect();
        assert!(delays[0] >= std::time::Duration::from_millis(250));
        assert!(delays[0] <= std::time::Duration::from_millis(750));
        assert!(
            delays
                .iter()
                .all(|d| *d <= std::time::Duration::from_millis(7500))
        );
        assert!(delays[7] >= std::time::Duration::from_millis(2500));
        b.reset();
        assert!(
            b.next()
                .is_some_and(|d| d <= std::time::Duration::from_millis(750))
        );
    }
}
