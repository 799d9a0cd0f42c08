//! Changes seen on several watches, put back in the order the writes
//! happened.
//!
//! Each watch delivers its own events in order, but two watches run apart:
//! a NodeMaintenance's delete can arrive after the cordon of the node that
//! was admitted once it was gone, and a watcher that folds events as they
//! arrive sees an overlap that never was (CI saw one: a reboot test's
//! "two nodes unavailable" was a node watch behind the NodeMaintenance
//! watch). The independent watchers record each change with the
//! resourceVersion of its object and fold them in that order. On this
//! control plane (one kube-apiserver, one etcd, built-in types and CRDs
//! alike) a resourceVersion is the etcd revision of the write, and a
//! watched delete carries the revision of the delete: one total order of
//! every write. Clients must treat resourceVersions as opaque; the test's
//! watchers may rely on what this control plane is.

use kube::Resource;
use kube::ResourceExt;

/// Items in the order they arrived, each with its resourceVersion.
pub type Arrived<T> = Vec<(Option<u64>, T)>;

/// The resourceVersion of `o` as a number, if it is one.
pub fn rv_of<K: Resource>(o: &K) -> Option<u64> {
    o.resource_version().and_then(|v| v.parse().ok())
}

/// `arrived` (in arrival order, each with its resourceVersion) in the order
/// of the writes. An item without one (a watch's "initial list done") goes
/// after every item that arrived before it.
pub fn in_write_order<T>(arrived: Arrived<T>) -> Vec<(u64, T)> {
    let mut latest = 0;
    let mut keyed: Vec<(u64, T)> = arrived
        .into_iter()
        .map(|(rv, t)| {
            let key = rv.unwrap_or(latest);
            latest = latest.max(key);
            (key, t)
        })
        .collect();
    // Stable: items of one write (the same object seen again on a relist)
    // keep their arrival order.
    keyed.sort_by_key(|(rv, _)| *rv);
    keyed
}
