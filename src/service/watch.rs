//! Watch machinery every feature shares, and nothing feature-specific:
//! how a watch lists and backs off, what it drops before an object enters a
//! store, untyped watches of kinds that may not be served (with their
//! "something changed" triggers), reading them typed, and latches that open
//! when several watches have listed.

use std::sync::Arc;

use crate::api::node::Node;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use smol::stream::{Stream, StreamExt};

use crate::error::{Error, Result};
use crate::runtime::Latch;

/// Every watch lists with `MostRecent` (a consistent read) rather than
/// kube's default `Any` (resourceVersion=0, whatever the API server's watch
/// cache holds). Right after a kube-apiserver restart the cache can answer
/// a list at a resourceVersion it can no longer watch from; each watch then
/// fails with 410 Expired, relists at the same stale version and fails
/// again, and the loop sees no events for as long as that lasts (client-go
/// falls back to a consistent list on that error; kube-runtime does not).
/// Since Kubernetes 1.31 a consistent list is served from the cache too.
///
/// Pages of [`LIST_PAGE`] objects rather than kube's 500: a page is held
/// twice while it is read (its JSON and the objects), and 500 Nodes were
/// most of the cluster role's peak at start (`just bench-scale` at 5 000
/// nodes).
pub fn watch_config() -> watcher::Config {
    watcher::Config::default()
        .list_semantic(watcher::ListSemantic::MostRecent)
        .page_size(LIST_PAGE)
}

/// Objects per page of a watch's list.
pub const LIST_PAGE: u32 = 100;

/// Log a watch error and keep it from the controller (see where the
/// controller is built); pass everything else.
pub fn watch_ok<K>(r: &std::result::Result<K, watcher::Error>, kind: &str) -> bool {
    if let Err(e) = r {
        log::debug!("watch of {kind}: {e} (retrying)");
    }
    r.is_ok()
}

/// Whether the API server serves `ar` ([`not_served`]).
pub async fn served(client: &Client, ar: &ApiResource) -> Result<bool> {
    Ok(not_served(client, std::slice::from_ref(ar))
        .await?
        .is_empty())
}

/// Fail with [`Error::CrdsMissing`] naming each of `resources` the API
/// server does not serve.
pub async fn check_served(client: &Client, resources: &[ApiResource]) -> Result<()> {
    missing_or_fail(not_served(client, resources).await?)
}

/// [`Error::CrdsMissing`] naming `missing`, if any is.
pub fn missing_or_fail(missing: Vec<String>) -> Result<()> {
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::CrdsMissing(missing))
    }
}

/// Which of `resources` the API server does not serve (`plural.group`),
/// asked as discovery does: one read of each group version's resource
/// list (every authenticated user may read it), patiently
/// (`connect::patiently`); a 404 says none of that group version is. Our
/// three kinds in `nodekeeper.io/v1alpha1` are one request, not a list of
/// each. The start-up learns less than a list would have (whether we may
/// list them): the watches say that, each in its own log line, and a
/// drain waiting on a refused watch says why.
pub async fn not_served(client: &Client, resources: &[ApiResource]) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    let versions: std::collections::BTreeSet<&str> =
        resources.iter().map(|ar| ar.api_version.as_str()).collect();
    for version in versions {
        let of_version = resources.iter().filter(|ar| ar.api_version == version);
        let kinds: Vec<&str> = of_version.clone().map(|ar| ar.kind.as_str()).collect();
        let what = checking_crd(&kinds.join(", "));
        let asked =
            super::connect::patiently(&what, || client.list_api_group_resources(version)).await;
        let plurals: Vec<String> = match asked {
            Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(Error::kube(what)(e)),
        };
        missing.extend(
            of_version
                .filter(|ar| !plurals.contains(&ar.plural))
                .map(crd_name),
        );
    }
    Ok(missing)
}

/// A CRD's name as `kubectl get crd` shows it.
pub fn crd_name(ar: &ApiResource) -> String {
    format!("{}.{}", ar.plural, ar.group)
}

/// What a CRD check does, for its log lines and its error (`kinds`: one
/// kind, or several joined by commas).
pub fn checking_crd(kinds: &str) -> String {
    if kinds.contains(", ") {
        format!("checking that the {kinds} CRDs are installed")
    } else {
        format!("checking that the {kinds} CRD is installed")
    }
}

/// Objects that do not parse as their kind, with why.
pub type Unreadable = Vec<(Arc<DynamicObject>, String)>;

/// The typed objects of an untyped store, and those that do not parse
/// (with why): the API server's schema makes that rare, and a pass reports
/// each on its object instead of acting on a default in its place.
pub fn read<K: serde::de::DeserializeOwned>(
    store: &Store<DynamicObject>,
) -> (Vec<Arc<K>>, Unreadable) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for o in store.state() {
        let parsed = serde_json::to_value(&*o)
            .map_err(|e| e.to_string())
            .and_then(|v| serde_json::from_value::<K>(v).map_err(|e| e.to_string()));
        match parsed {
            Ok(k) => ok.push(Arc::new(k)),
            Err(e) => bad.push((o, crate::error::first_line(&e).to_string())),
        }
    }
    (ok, bad)
}

/// [`read`] without the failures (a pass that reports them reads them
/// through [`read`]).
pub fn typed<K: serde::de::DeserializeOwned>(store: &Store<DynamicObject>) -> Vec<Arc<K>> {
    let (ok, bad) = read(store);
    for (o, e) in bad {
        log::debug!("{}: cannot be read: {e}", o.name_any());
    }
    ok
}

pub type Trigger = std::pin::Pin<Box<dyn Stream<Item = ()> + Send>>;

pub fn watch_dynamic(
    client: &Client,
    ar: &ApiResource,
    latch: Latch,
) -> (Store<DynamicObject>, Trigger) {
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let events = watcher(api, watch_config())
        .backoff(WatchBackoff::default())
        .reflect(writer)
        .inspect(move |ev| observe(ev, &latch, |_| {}))
        .touched_objects()
        .filter_map(|r| r.ok().map(|_| ()));
    (store, Box::pin(events))
}

/// One stream of "something changed" from several.
pub fn merge(triggers: Vec<Trigger>) -> Trigger {
    triggers
        .into_iter()
        .reduce(|a, b| Box::pin(smol::stream::or(a, b)))
        .unwrap_or_else(|| Box::pin(smol::stream::pending()))
}

/// Open `all` once every latch of `each` is open.
pub fn open_when_all(each: Vec<Latch>, all: Latch) {
    crate::runtime::spawn(async move {
        for l in &each {
            l.wait().await;
        }
        all.open();
    })
    .detach();
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

/// Drop what the cluster role need not hold of a Node before it enters the
/// store. The type itself reads only what decisions read
/// ([`crate::api::node`]); of that, the managed fields go (every status
/// writer — kubelet, node controller, us — leaves an entry) and every
/// address but the `InternalIP`, which a control plane's retirement sends
/// to the provider's `remove-etcd-member` (`decide::replace`; dropped once
/// with the rest, it went out empty). `volumesAttached` stays: the wait for
/// volumes before power counts each entry no VolumeAttachment accounts for
/// (`decide::volumes::still_attached`, as Cluster API does); dropped here
/// once too, that half of the wait never saw one. Nodes are only ever
/// written by merge patch, never replaced from this copy, so nothing
/// dropped here can be lost.
pub fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut()
        && let Some(all) = status.addresses.as_mut()
    {
        all.retain(|a| a.type_ == "InternalIP");
        if all.is_empty() {
            status.addresses = None;
        }
    }
}

/// Which node events change something a decision reads. A kubelet (or
/// kwok) rewrites each node's conditions every few seconds only to move
/// their `lastHeartbeatTime`: at 5 000 nodes that is hundreds of events a
/// second, each of which reconciled its node and started a cluster pass
/// over every node. The store still takes every event (writes carry its
/// resourceVersion); this says whether one also triggers anything: a new
/// node, a deletion, or a node that differs in more than its
/// resourceVersion and heartbeat times.
#[derive(Default)]
pub struct NodeChanges {
    seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// The names a relist has delivered so far: at its end, nodes it did
    /// not deliver are forgotten (deleted while the watch was down; only
    /// Delete events forgot them, a slow leak in autoscaled clusters).
    relisted: std::sync::Mutex<Option<std::collections::HashSet<String>>>,
}

impl NodeChanges {
    pub fn matters(&self, ev: &Result<watcher::Event<Node>, watcher::Error>) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut relisted = self.relisted.lock().unwrap_or_else(|p| p.into_inner());
        match ev {
            Ok(watcher::Event::Init) => {
                *relisted = Some(Default::default());
                true
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(names) = relisted.take() {
                    seen.retain(|n, _| names.contains(n));
                }
                true
            }
            Ok(watcher::Event::Apply(node)) | Ok(watcher::Event::InitApply(node)) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                if let Some(names) = relisted.as_mut() {
                    names.insert(name.clone());
                }
                let print = fingerprint(node);
                seen.insert(name, print) != Some(print)
            }
            Ok(watcher::Event::Delete(node)) => {
                seen.remove(node.metadata.name.as_deref().unwrap_or_default());
                true
            }
            _ => true,
        }
    }
}

/// A node's content but for its resourceVersion and heartbeat times.
fn fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut meta = node.metadata.clone();
    meta.resource_version = None;
    let spec = node
        .spec
        .as_ref()
        .map(|s| (&s.provider_id, &s.taints, s.unschedulable));
    let status = node.status.as_ref().map(|s| {
        let mut conditions = s.conditions.clone();
        for c in conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        (conditions, &s.node_info, &s.addresses, &s.volumes_attached)
    });
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(&(meta, spec, status))
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
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
    fn a_slim_node_keeps_what_decisions_read_and_nothing_else() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"a": "b"}, "annotations": {"nodekeeper.io/x": "y"},
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"unschedulable": true, "providerID": "kwok://n1", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"bootID": "b1", "kubeletVersion": "v1.37.1", "machineID": "", "systemUUID": "",
                    "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64"},
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}],
                "capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"},
                "images": [{"names": ["i"]}], "volumesInUse": ["v"], "phase": "Running",
                "volumesAttached": [{"name": "kubernetes.io/csi/d^v", "devicePath": ""}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }))
        .unwrap_or_default();
        let before = node.clone();
        slim_node(&mut node);
        assert_eq!(node.metadata.labels, before.metadata.labels);
        assert_eq!(node.metadata.annotations, before.metadata.annotations);
        assert_eq!(node.metadata.managed_fields, None);
        assert_eq!(node.spec, before.spec);
        let (status, was) = (
            node.status.unwrap_or_default(),
            before.status.unwrap_or_default(),
        );
        assert!(was.volumes_attached.is_some(), "the example parsed");
        assert_eq!(status.conditions, was.conditions);
        assert_eq!(status.node_info, was.node_info);
        let internal = vec![k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        }];
        let dropped = crate::api::node::NodeStatus {
            conditions: was.conditions.clone(),
            node_info: was.node_info.clone(),
            addresses: Some(internal),
            volumes_attached: was.volumes_attached.clone(),
        };
        assert_eq!(status, dropped);
        // What the wait for volumes before power counts (no VolumeAttachment
        // accounts for this one).
        let kept = Node {
            metadata: node.metadata.clone(),
            spec: node.spec.clone(),
            status: Some(status.clone()),
        };
        assert_eq!(
            crate::decide::volumes::still_attached(&kept, &[], &[]),
            vec!["kubernetes.io/csi/d^v".to_string()]
        );
        // What a control plane's retirement tells the provider's etcd.
        let slimmed = Node {
            status: Some(status),
            ..node
        };
        assert_eq!(crate::decide::replace::internal_ip(&slimmed), "10.0.0.1");
    }

    #[test]
    fn a_heartbeat_alone_triggers_nothing_every_other_node_change_does() {
        let node = |rv: &str, beat: &str, ready: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n1", "resourceVersion": rv},
                "status": {"conditions": [{
                    "type": "Ready", "status": ready, "reason": "KubeletReady",
                    "lastHeartbeatTime": beat,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }]},
            }))
            .expect("a node")
        };
        let changes = NodeChanges::default();
        let apply = |n: Node| changes.matters(&Ok(watcher::Event::Apply(n)));
        assert!(
            apply(node("1", "2026-01-01T00:00:10Z", "True")),
            "a new node"
        );
        assert!(
            !apply(node("2", "2026-01-01T00:00:20Z", "True")),
            "a heartbeat"
        );
        assert!(
            apply(node("3", "2026-01-01T00:00:30Z", "False")),
            "NotReady"
        );
        let mut cordoned = node("4", "2026-01-01T00:00:40Z", "False");
        cordoned.spec = Some(crate::api::node::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        assert!(apply(cordoned.clone()), "cordoned");
        assert!(changes.matters(&Ok(watcher::Event::Delete(cordoned.clone()))));
        assert!(apply(cordoned), "back after its deletion");
        assert!(changes.matters(&Ok(watcher::Event::<Node>::InitDone)));
    }

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

    #[test]
    fn a_relist_forgets_nodes_deleted_while_the_watch_was_down() {
        let node = |name: &str| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
                .unwrap_or_default()
        };
        let c = NodeChanges::default();
        c.matters(&Ok(watcher::Event::Apply(node("a"))));
        c.matters(&Ok(watcher::Event::Apply(node("b"))));
        // b is deleted while the watch is down; the relist shows only a.
        c.matters(&Ok(watcher::Event::Init));
        c.matters(&Ok(watcher::Event::InitApply(node("a"))));
        c.matters(&Ok(watcher::Event::InitDone));
        let seen = c.seen.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["a"]);
    }
}
