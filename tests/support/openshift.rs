//! Just enough OpenShift for the mutex operator's flow: the
//! MachineConfigPool (`machineconfiguration.openshift.io/v1`) and
//! ClusterVersion (`config.openshift.io/v1`) CRDs with minimal schemas of
//! our own, and a simulated machine-config operator: a node selected by an
//! unpaused pool whose version label is not the desired version gets it
//! after a short delay, as the MCO would after updating and rebooting it.
//! Every upgrade it performs is recorded, in order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::mutex::{VERSION_LABEL, cluster_version_resource, pool_resource};
use nodekeeper::decide::selector::selector_matches;
use nodekeeper::runtime::Latch;
use serde_json::json;

use super::{GROUP_LABEL, block_on, kubectl};

const CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: machineconfigpools.machineconfiguration.openshift.io}
spec:
  group: machineconfiguration.openshift.io
  scope: Cluster
  names: {kind: MachineConfigPool, plural: machineconfigpools, singular: machineconfigpool, shortNames: [mcp]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              paused: {type: boolean}
              nodeSelector: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: clusterversions.config.openshift.io}
spec:
  group: config.openshift.io
  scope: Cluster
  names: {kind: ClusterVersion, plural: clusterversions, singular: clusterversion}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// Install the two OpenShift CRDs and the mutex operator's three
/// (`nodekeeper crds --mutex`), and wait until served.
pub fn install() {
    let out = kubectl(&["apply", "--server-side", "-f", "-"], Some(CRDS));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, yaml, err) = super::run_cli(&["crds", "--mutex"], &[]);
    assert!(status.success(), "nodekeeper crds --mutex: {err}");
    let out = kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&yaml),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/machineconfigpools.machineconfiguration.openshift.io",
            "crd/clusterversions.config.openshift.io",
            "crd/mutexrules.openshift-optional.skrzypek.io",
            "crd/mutextargets.openshift-optional.skrzypek.io",
            "crd/mutexrunconfigs.openshift-optional.skrzypek.io",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn pools(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &pool_resource())
}

/// Create a MachineConfigPool with this selector.
pub async fn create_pool(client: &Client, name: &str, selector: serde_json::Value) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigPool",
        "metadata": {"name": name},
        "spec": {"paused": false, "nodeSelector": selector},
    }))
    .expect("a pool");
    pools(client)
        .create(&Default::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating pool {name}: {e}"));
}

/// The ClusterVersion `version`, asking for `desired`, its update
/// `Completed` (created or replaced).
pub async fn set_cluster_version(client: &Client, desired: &str) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &cluster_version_resource());
    let obj = json!({
        "apiVersion": "config.openshift.io/v1",
        "kind": "ClusterVersion",
        "metadata": {"name": "version"},
        "spec": {"desiredUpdate": {"version": desired}},
    });
    api.patch(
        "version",
        &PatchParams::apply("nodekeeper-test").force(),
        &Patch::Apply(&obj),
    )
    .await
    .expect("applying the ClusterVersion");
    let status = json!({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion",
        "metadata": {"name": "version"},
        "status": {"history": [{"state": "Completed", "version": desired}]}});
    api.patch_status(
        "version",
        &PatchParams::apply("nodekeeper-test").force(),
        &Patch::Apply(&status),
    )
    .await
    .expect("writing the ClusterVersion status");
}

/// A pool's `spec` as the test sees it.
pub async fn pool_spec(client: &Client, name: &str) -> serde_json::Value {
    pools(client)
        .get(name)
        .await
        .map(|p| p.data["spec"].clone())
        .unwrap_or_default()
}

/// The simulated machine-config operator for one test group.
pub struct Mco {
    stop: Latch,
    /// Upgrades performed, in order: (node, version).
    pub upgraded: Arc<Mutex<Vec<(String, String)>>>,
    /// Every change of a pool's `spec.paused`, in order: (pool, paused),
    /// from a watch (a poll could miss a state that lasted less than its
    /// period).
    pub pools_seen: Arc<Mutex<Vec<(String, bool)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    watch: Option<std::thread::JoinHandle<()>>,
}

impl Mco {
    /// Upgrade the group's nodes as pools allow, each `delay` after it is
    /// first seen eligible.
    pub fn start(client: Client, group: &str, delay: Duration) -> Mco {
        let stop = Latch::default();
        let upgraded: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let pools_seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
        let watch = {
            let (stop, seen, client) = (stop.clone(), pools_seen.clone(), client.clone());
            std::thread::spawn(move || {
                block_on(async move {
                    let cfg = kube::runtime::watcher::Config::default()
                        .list_semantic(kube::runtime::watcher::ListSemantic::MostRecent);
                    let mut events = std::pin::pin!(kube::runtime::watcher(pools(&client), cfg));
                    let mut last: BTreeMap<String, bool> = BTreeMap::new();
                    let record = async {
                        use smol::stream::StreamExt;
                        while let Some(ev) = events.next().await {
                            use kube::runtime::watcher::Event;
                            if let Ok(Event::Apply(p) | Event::InitApply(p)) = ev {
                                let paused = p.data["spec"]["paused"].as_bool().unwrap_or(false);
                                if last.insert(p.name_any(), paused) != Some(paused) {
                                    seen.lock().unwrap().push((p.name_any(), paused));
                                }
                            }
                        }
                    };
                    smol::future::or(record, stop.wait()).await;
                })
            })
        };
        let (s2, up2, group) = (stop.clone(), upgraded.clone(), group.to_string());
        let thread = std::thread::spawn(move || {
            let mut eligible_since: BTreeMap<String, Instant> = BTreeMap::new();
            while !s2.is_open() {
                block_on(async {
                    let cv: Api<DynamicObject> =
                        Api::all_with(client.clone(), &cluster_version_resource());
                    let desired = cv.get_opt("version").await.ok().flatten().and_then(|o| {
                        o.data["spec"]["desiredUpdate"]["version"]
                            .as_str()
                            .map(str::to_string)
                    });
                    let Some(desired) = desired else { return };
                    let all_pools = pools(&client)
                        .list(&ListParams::default())
                        .await
                        .map(|l| l.items)
                        .unwrap_or_default();
                    let nodes: Api<Node> = Api::all(client.clone());
                    let group_nodes = nodes
                        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={group}")))
                        .await
                        .map(|l| l.items)
                        .unwrap_or_default();
                    for n in &group_nodes {
                        let name = n.name_any();
                        let version = n.labels().get(VERSION_LABEL).cloned().unwrap_or_default();
                        let in_unpaused = all_pools.iter().any(|p| {
                            let paused = p.data["spec"]["paused"].as_bool().unwrap_or(false);
                            let sel: LabelSelector =
                                serde_json::from_value(p.data["spec"]["nodeSelector"].clone())
                                    .unwrap_or_default();
                            let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                                && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty());
                            !paused && !empty && selector_matches(&sel, n.labels())
                        });
                        if version == desired || !in_unpaused {
                            eligible_since.remove(&name);
                            continue;
                        }
                        let since = *eligible_since
                            .entry(name.clone())
                            .or_insert_with(Instant::now);
                        if since.elapsed() >= delay {
                            let patch = json!({"metadata": {"labels": {VERSION_LABEL: desired}}});
                            if nodes
                                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                                .await
                                .is_ok()
                            {
                                up2.lock().unwrap().push((name.clone(), desired.clone()));
                                eligible_since.remove(&name);
                            }
                        }
                    }
                });
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Mco {
            stop,
            upgraded,
            pools_seen,
            thread: Some(thread),
            watch: Some(watch),
        }
    }

    pub fn stop(&mut self) {
        self.stop.open();
        for t in [self.thread.take(), self.watch.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

impl Drop for Mco {
    fn drop(&mut self) {
        self.stop();
    }
}
