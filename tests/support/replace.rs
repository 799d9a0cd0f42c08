//! Node-replacement helpers: a simulated cloud (tests/kwok-provider, one
//! state directory per test, reached through a wrapper script nodekeeper
//! runs as its `--provider-command`), and an independent watcher that
//! records the node count, cordoned and available nodes, Node deletions,
//! NodeMaintenances and the autoscaler Deployment's replicas at every
//! change, so safety claims never come from nodekeeper's own status.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::runtime::Latch;
use serde_json::{Value, json};
use smol::stream::StreamExt;

use super::machines::unavailable;
use super::write_order::{Arrived, in_write_order, rv_of};
use super::{GROUP_LABEL, TestEnv, bin_dir, block_on, cluster, kubectl, run_cli, wait_for};

/// Install Constellation's CRDs the way the README says, once per binary.
pub fn install_constellation_crds() {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let (status, yaml, err) = run_cli(&["crds", "--constellation"], &[]);
        assert!(
            status.success(),
            "nodekeeper crds --constellation failed: {err}"
        );
        let out = kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&yaml),
        );
        assert!(
            out.status.success(),
            "applying Constellation's CRDs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/nodeversions.update.edgeless.systems",
                "crd/pendingnodes.update.edgeless.systems",
                "crd/scalinggroups.update.edgeless.systems",
                "crd/autoscalingstrategies.update.edgeless.systems",
                "crd/joiningnodes.update.edgeless.systems",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "CRDs not established: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// One simulated cloud.
pub struct Cloud {
    pub dir: PathBuf,
    /// The executable nodekeeper is given (`--provider-command`).
    pub command: PathBuf,
    pub config: Value,
}

impl Cloud {
    /// A cloud whose nodes carry the test's group label; `groups` as in
    /// the provider's config (`groupId`, `name`, `role`, `image`).
    pub fn new(env: &TestEnv, groups: Value, join_delay: f64) -> Cloud {
        let dir = super::scratch().join(format!("nk-cloud-{}", env.id));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the cloud's state dir");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kwok-provider");
        let command = dir.join("provider");
        // The interpreter itself, not a version manager's shim, and
        // without site (-S: the script needs the standard library only): a
        // shim's start-up, or a site-packages .pth file importing a
        // package, was most of every call's time (160 ms through pyenv's
        // shim, 76 ms with site, 14 ms without, on this 2-core machine).
        // A real cloud's calls wait on the network and run side by side;
        // these burn CPU, which made a round asking three instances' states
        // three times as slow as one.
        let python = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".into());
        std::fs::write(
            &command,
            format!(
                "#!/bin/sh\nKWOK_PROVIDER_STATE='{}' KUBECTL='{}' KUBECONFIG='{}' exec '{}' -S '{}' \"$@\"\n",
                dir.display(),
                bin_dir().join("kubectl").display(),
                cluster().display(),
                python,
                script.display()
            ),
        )
        .expect("writing the provider wrapper");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let cloud = Cloud {
            dir,
            command,
            config: json!({
                "groups": groups,
                "joinDelay": join_delay,
                "nodeLabels": { GROUP_LABEL: env.id },
            }),
        };
        cloud.write_config();
        cloud
    }

    /// Written aside and renamed: a call reading it meanwhile (a hanging
    /// one reads it ten times a second) sees the old or the new, never half.
    pub fn write_config(&self) {
        let tmp = self.dir.join("config.json.tmp");
        std::fs::write(&tmp, self.config.to_string()).expect("writing the cloud's config");
        std::fs::rename(&tmp, self.dir.join("config.json")).expect("renaming the cloud's config");
    }

    /// Change one config key.
    pub fn set(&mut self, key: &str, value: Value) {
        self.config[key] = value;
        self.write_config();
    }

    /// Ask the provider directly (as a test, not as nodekeeper).
    pub fn call(&self, verb: &str, request: Value) -> Value {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.command)
            .arg(verb)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running the provider");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(request.to_string().as_bytes())
            .expect("request");
        let out = child.wait_with_output().expect("provider output");
        assert!(
            out.status.success(),
            "provider {verb}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("provider answer")
    }

    /// Every call nodekeeper (and the test) made: (verb, request).
    pub fn calls(&self) -> Vec<(String, Value)> {
        std::fs::read_to_string(self.dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| {
                (
                    v["verb"].as_str().unwrap_or_default().to_string(),
                    v["request"].clone(),
                )
            })
            .collect()
    }

    pub fn calls_of(&self, verb: &str) -> Vec<Value> {
        self.calls()
            .into_iter()
            .filter(|(v, _)| v == verb)
            .map(|(_, r)| r)
            .collect()
    }

    /// The cloud's state file.
    pub fn state(&self) -> Value {
        std::fs::read_to_string(self.dir.join("state.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null)
    }

    /// Create `n` instances in `group` (as the cluster's installer would)
    /// and wait until their nodes are Ready; returns their names.
    pub async fn boot(&self, env: &TestEnv, group: &str, n: usize) -> Vec<String> {
        let mut names = Vec::new();
        let batch = super::rand_u64();
        for i in 0..n {
            let a = self.call(
                "create-node",
                json!({ "groupId": group, "requestId": format!("init-{group}-{batch:x}-{i}") }),
            );
            names.push(a["nodeName"].as_str().expect("nodeName").to_string());
        }
        for name in &names {
            env.wait_node_ready_within(name, Duration::from_secs(60))
                .await;
        }
        names
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Delete every node of the test's group (replacement nodes are not in
/// the TestEnv's list) and its cluster-scoped replacement objects.
pub async fn clean_up(client: &Client, env: &TestEnv) {
    let dp = DeleteParams::background();
    let nodes: Api<Node> = Api::all(client.clone());
    if let Ok(list) = nodes
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", env.id)))
        .await
    {
        for n in list {
            let _ = nodes.delete(&n.name_any(), &dp).await;
        }
    }
    for kind in [
        "nodeversions",
        "scalinggroups",
        "pendingnodes",
        "autoscalingstrategies",
        "joiningnodes",
    ] {
        let _ = kubectl(
            &[
                "delete",
                kind,
                "-l",
                &format!("{GROUP_LABEL}={}", env.id),
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// What the watcher saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub max_nodes: usize,
    /// Cordoned or held by a NodeMaintenance, at most at once.
    pub max_cordoned: usize,
    /// Ready and not cordoned, at least (from the first full list on).
    pub min_available: usize,
    /// Node name → how many times it was deleted.
    pub deleted: BTreeMap<String, usize>,
    /// Node name → reasons of the NodeMaintenances seen for it.
    pub maintenances: BTreeMap<String, BTreeSet<String>>,
    /// The autoscaler Deployment's replicas, each change.
    pub replicas: Vec<i32>,
}

pub struct ReplaceWatcher {
    stop: Latch,
    thread: Option<std::thread::JoinHandle<Arrived<Ev>>>,
}

#[allow(clippy::large_enum_variant)] // one at a time, in a test
enum Ev {
    Node(watcher::Event<Node>),
    Nm(watcher::Event<NodeMaintenance>),
    Dep(watcher::Event<Deployment>),
}

impl ReplaceWatcher {
    /// Watch the test group's nodes, every NodeMaintenance, and the
    /// Deployment `autoscaler` in the test namespace.
    pub fn start(client: Client, env: &TestEnv, autoscaler: &str) -> ReplaceWatcher {
        let stop = Latch::default();
        let (stop2, group, ns, dep) = (
            stop.clone(),
            env.id.clone(),
            env.ns.clone(),
            autoscaler.to_string(),
        );
        let thread = std::thread::spawn(move || {
            block_on(async move {
                let mut arrived = Vec::new();
                let cfg =
                    || watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
                let nodes = watcher(
                    Api::<Node>::all(client.clone()),
                    cfg().labels(&format!("{GROUP_LABEL}={group}")),
                )
                .filter_map(|e| e.ok().map(Ev::Node));
                let nms = watcher(Api::<NodeMaintenance>::all(client.clone()), cfg())
                    .filter_map(|e| e.ok().map(Ev::Nm));
                let deps = watcher(
                    Api::<Deployment>::namespaced(client.clone(), &ns),
                    cfg().fields(&format!("metadata.name={dep}")),
                )
                .filter_map(|e| e.ok().map(Ev::Dep));
                let mut events =
                    std::pin::pin!(smol::stream::or(nodes, smol::stream::or(nms, deps)));
                let run = async {
                    while let Some(ev) = events.next().await {
                        let rv = match &ev {
                            Ev::Node(e) => event_rv(e),
                            Ev::Nm(e) => event_rv(e),
                            Ev::Dep(e) => event_rv(e),
                        };
                        arrived.push((rv, ev));
                    }
                };
                smol::future::or(run, stop2.wait()).await;
                arrived
            })
        });
        ReplaceWatcher {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop; what was seen, folded in the order the writes happened (see
    /// [`super::write_order`]): a node watch behind the NodeMaintenance
    /// watch would otherwise count a node given back as still held.
    pub fn finish(mut self) -> Seen {
        self.stop.open();
        let arrived = self
            .thread
            .take()
            .map(|t| t.join().expect("the watcher panicked"))
            .unwrap_or_default();
        fold(in_write_order(arrived).into_iter().map(|(_, ev)| ev))
    }
}

/// The resourceVersion of the object an event carries (`None`: no object).
fn event_rv<K: kube::Resource>(e: &watcher::Event<K>) -> Option<u64> {
    match e {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o) => {
            rv_of(o)
        }
        _ => None,
    }
}

/// What the events say, one after another.
fn fold(events: impl Iterator<Item = Ev>) -> Seen {
    let mut seen = Seen {
        min_available: usize::MAX,
        ..Default::default()
    };
    let mut live: BTreeMap<String, Node> = BTreeMap::new();
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    let mut listed = false;
    for ev in events {
        match ev {
            Ev::Node(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                live.insert(n.name_any(), n);
            }
            Ev::Node(watcher::Event::Delete(n)) => {
                live.remove(&n.name_any());
                *seen.deleted.entry(n.name_any()).or_default() += 1;
            }
            Ev::Node(watcher::Event::InitDone) => listed = true,
            Ev::Nm(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                seen.maintenances
                    .entry(m.spec.node_name.clone())
                    .or_default()
                    .insert(m.spec.reason.clone().unwrap_or_default());
                held.insert(m.name_any(), m.spec.node_name.clone());
            }
            Ev::Nm(watcher::Event::Delete(m)) => {
                held.remove(&m.name_any());
            }
            Ev::Dep(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                let r = d.spec.replicas.unwrap_or(1);
                if seen.replicas.last() != Some(&r) {
                    seen.replicas.push(r);
                }
            }
            _ => {}
        }
        if !listed {
            continue;
        }
        seen.max_nodes = seen.max_nodes.max(live.len());
        let cordoned = live
            .values()
            .filter(|n| {
                n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
                    || held.values().any(|h| *h == n.name_any())
            })
            .count();
        seen.max_cordoned = seen.max_cordoned.max(cordoned);
        let available = live
            .values()
            .filter(|n| !unavailable(n) && !held.values().any(|h| *h == n.name_any()))
            .count();
        seen.min_available = seen.min_available.min(available);
    }
    seen
}

impl Drop for ReplaceWatcher {
    fn drop(&mut self) {
        self.stop.open();
    }
}

/// Wait until `f` holds for the NodeVersion `name` (as JSON).
pub async fn wait_nv(
    client: &Client,
    name: &str,
    what: &str,
    limit: Duration,
    f: impl Fn(&Value) -> bool,
) -> Value {
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &nodekeeper::api::constellation::Kind::NodeVersion.resource(),
    );
    wait_for(what, limit, || async {
        let o = api.get_opt(name).await.ok().flatten()?;
        let v = serde_json::to_value(o).ok()?;
        f(&v).then_some(v)
    })
    .await
}

/// The group's nodes now.
pub async fn group_nodes(client: &Client, env: &TestEnv) -> Vec<Node> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", env.id)))
        .await
        .expect("listing nodes")
        .items
}
