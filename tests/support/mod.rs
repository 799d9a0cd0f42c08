//! The one way tests reach the real control plane.
//!
//! [`cluster`] starts it once per test binary through
//! `tests/controlplane/cluster.sh up` (which reuses a cluster that is already
//! answering), and panics with the components' log tails if it cannot: a test
//! that needs the cluster fails loudly, never skips. Each test takes a
//! [`TestEnv`]: a unique id, its own namespace and its own kwok nodes, all
//! deleted when it drops, so tests run in parallel without seeing each other.
//! `just test` stops the cluster after the run; plain `cargo test` leaves it
//! up for the next run (`just cluster-down` stops it).
//!
//! Beside it: [`identities`] (the shipped identities and audited users),
//! [`audit`] (reading the audit log), [`probes`] (a process seen from
//! outside), and one module per kind of machine or feature.
#![allow(dead_code)] // each test binary uses a different part of this helper

pub mod audit;
pub mod identities;
pub mod machines;
pub mod openshift;
pub mod probes;
pub mod replace;
pub mod upgrades;
pub mod write_order;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub use audit::*;
pub use identities::*;
pub use nodekeeper::runtime::block_on;
pub use probes::*;

/// The label that ties a test's nodes and workloads together.
pub const GROUP_LABEL: &str = "nodekeeper.test/group";

/// Start (or reuse) the cluster; returns the kubeconfig path.
pub fn cluster() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/cluster.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("up")
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "the test control plane did not start ({}); its log tails are above",
            out.status
        );
        let path = String::from_utf8_lossy(&out.stdout)
            .trim()
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        let path = PathBuf::from(path);
        assert!(path.is_file(), "cluster.sh up printed no kubeconfig path");
        path
    })
}

/// A kube client for the test cluster.
pub async fn client() -> Client {
    client_from(cluster()).await
}

/// A kube client for the test cluster that authenticates with `token` (a
/// service account's) instead of the admin's.
pub async fn client_with_token(token: &str) -> Client {
    let path = kubeconfig_with_token(token);
    let client = client_from(&path).await;
    let _ = std::fs::remove_file(&path);
    client
}

/// A kubeconfig for the test cluster that authenticates with `token`.
pub fn kubeconfig_with_token(token: &str) -> PathBuf {
    let admin = std::fs::read_to_string(cluster()).expect("kubeconfig");
    let text: String = admin
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                format!("    token: {token}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = scratch().join(format!("nk-token-kubeconfig-{:x}", rand_u64()));
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// A kube client for the test cluster from any kubeconfig (another identity's).
pub async fn client_from(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("reading a kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("loading a kubeconfig");
    // Tests assert on 429s (PDB refusals); kube would retry them for minutes.
    config.default_retry = false;
    Client::try_from(config).expect("building a client")
}

/// A per-test slice of the cluster: unique id, namespace and kwok nodes.
pub struct TestEnv {
    pub id: String,
    pub client: Client,
    pub ns: String,
    nodes: Vec<String>,
    extra_namespaces: Vec<String>,
}

/// Create a namespace (panics on failure: this is test set-up).
pub async fn create_namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("creating a test namespace");
}

impl TestEnv {
    /// `name` is short and DNS-safe; a counter and the process id make the id unique.
    pub async fn new(name: &str) -> TestEnv {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{name}-{}-{}",
            std::process::id() % 100_000,
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let client = client().await;
        let ns = id.clone();
        create_namespace(&client, &ns).await;
        TestEnv {
            id,
            client,
            ns,
            nodes: Vec::new(),
            extra_namespaces: Vec::new(),
        }
    }

    /// Another namespace `<id>-<suffix>`, deleted with the rest.
    pub async fn add_namespace(&mut self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.id);
        create_namespace(&self.client, &name).await;
        self.extra_namespaces.push(name.clone());
        name
    }

    /// Create a kwok-managed node named `<id>-<suffix>`; returns its name.
    pub async fn add_node(&mut self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.id);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations: Some([("kwok.x-k8s.io/node".to_string(), "fake".to_string())].into()),
                labels: Some(
                    [
                        ("type".to_string(), "kwok".to_string()),
                        ("kubernetes.io/hostname".to_string(), name.clone()),
                        (GROUP_LABEL.to_string(), self.id.clone()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("creating a kwok node");
        self.nodes.push(name.clone());
        name
    }

    /// Wait until kwok reports the node Ready.
    pub async fn wait_node_ready(&self, name: &str) {
        self.wait_node_ready_within(name, Duration::from_secs(30))
            .await
    }

    /// [`TestEnv::wait_node_ready`] with another bound (the node may not
    /// exist yet).
    pub async fn wait_node_ready_within(&self, name: &str, limit: Duration) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        // Ready, and without the taints the node lifecycle controller puts
        // on a node that is not (removed a moment after Ready): until then
        // the scheduler passes the node over, and a test's pods all land
        // on its other nodes.
        wait_for(&format!("node {name} Ready"), limit, || async {
            let n = nodes.get_opt(name).await.ok().flatten()?;
            let lifecycle_taint = n.spec.as_ref()?.taints.iter().flatten().any(|t| {
                t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
            });
            let ready = n
                .status?
                .conditions?
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (ready && !lifecycle_taint).then_some(())
        })
        .await;
    }

    /// A Deployment of `replicas` pods confined to this test's nodes.
    pub fn deployment(&self, name: &str, replicas: i32) -> Deployment {
        let (selector, template) = self.template(name);
        Deployment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.ns.clone()),
                ..Default::default()
            },
            spec: DeploymentSpec {
                replicas: Some(replicas),
                selector,
                template,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The selector and pod template of a workload labelled `app=<app>`.
    pub fn template(&self, app: &str) -> (LabelSelector, PodTemplateSpec) {
        let labels: std::collections::BTreeMap<String, String> =
            [("app".to_string(), app.to_string())].into();
        (
            LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(self.pod_spec()),
            },
        )
    }

    /// A pod spec that only schedules onto this test's nodes.
    pub fn pod_spec(&self) -> PodSpec {
        PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.invalid/app:1".into()),
                ..Default::default()
            }],
            node_selector: Some([(GROUP_LABEL.to_string(), self.id.clone())].into()),
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }
    }

    /// A pod `app=<name>` created straight onto `node` (no scheduler, as a
    /// static or pre-bound pod is), changed by `f` first; returns it once
    /// it runs.
    pub async fn bound_pod(&self, name: &str, node: &str, f: impl FnOnce(&mut Pod)) -> Pod {
        let mut spec = self.pod_spec();
        spec.node_name = Some(node.into());
        spec.node_selector = None;
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("app".to_string(), name.to_string())].into()),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        };
        f(&mut pod);
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        self.wait_running(&format!("app={name}"), 1).await.remove(0)
    }

    /// A NodeMaintenance `<id>-<suffix>` for `node`.
    pub async fn maintain(&self, suffix: &str, node: &str, reason: &str) -> String {
        let name = format!("{}-{suffix}", self.id);
        let nm = nodekeeper::api::nodemaintenance::NodeMaintenance::new(
            &name,
            nodekeeper::api::nodemaintenance::NodeMaintenanceSpec {
                node_name: node.into(),
                reason: Some(reason.into()),
            },
        );
        Api::<nodekeeper::api::nodemaintenance::NodeMaintenance>::all(self.client.clone())
            .create(&PostParams::default(), &nm)
            .await
            .expect("create NodeMaintenance");
        name
    }

    /// A PodDisruptionBudget over the pods labelled `app=<app>`.
    pub fn pdb(&self, name: &str, app: &str, min_available: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.ns.clone()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(min_available)),
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), app.to_string())].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Pods in this test's namespace, optionally with a label selector.
    pub async fn pods(&self, selector: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default().labels(selector))
            .await
            .expect("listing pods")
            .items
    }

    /// Wait until exactly `n` pods matching `selector` run (and are not
    /// being deleted); returns them.
    pub async fn wait_running(&self, selector: &str, n: usize) -> Vec<Pod> {
        wait_for(
            &format!("{n} running pods {selector}"),
            Duration::from_secs(60),
            || async {
                let pods: Vec<Pod> = self
                    .pods(selector)
                    .await
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .collect();
                (pods.len() == n).then_some(pods)
            },
        )
        .await
    }

    /// One pod of Deployment `name` pinned to `node`, with a
    /// PodDisruptionBudget that lets none go: a drain of that node stalls
    /// until the budget is removed. Returns once the pod runs.
    pub async fn blocking_pod_on(&self, name: &str, node: &str) {
        self.blocking_pod_selecting(name, "kubernetes.io/hostname", node)
            .await;
    }

    /// [`TestEnv::blocking_pod_on`] whose pod another node could run too:
    /// it starts on `node`, the only node labelled for it, and `elsewhere`
    /// is labelled as well once it runs. A reboot's or upgrade's drain
    /// leaves a pod that no other node could run to the shutdown
    /// (`decide::elsewhere`): only such a pod stalls it.
    pub async fn movable_blocking_pod_on(&self, name: &str, node: &str, elsewhere: &str) {
        let key = format!("nodekeeper.test/{name}");
        let label = |n: &str| {
            let patch = serde_json::json!({"metadata": {"labels": {key.as_str(): "yes"}}});
            let nodes: Api<Node> = Api::all(self.client.clone());
            let n = n.to_string();
            async move {
                nodes
                    .patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap_or_else(|e| panic!("labelling node {n}: {e}"));
            }
        };
        label(node).await;
        self.blocking_pod_selecting(name, &key, "yes").await;
        let on: Vec<String> = self
            .pods(&format!("app={name}"))
            .await
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        assert_eq!(on, [node], "where the pod of {name} runs");
        label(elsewhere).await;
    }

    /// One pod of Deployment `name` on the nodes labelled `key=value`,
    /// with a PodDisruptionBudget that lets none go; returns once it runs.
    async fn blocking_pod_selecting(&self, name: &str, key: &str, value: &str) {
        let mut d = self.deployment(name, 1);
        if let Some(spec) = d.spec.template.spec.as_mut() {
            spec.node_selector = Some([(key.to_string(), value.to_string())].into());
        }
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &d)
            .await
            .expect("creating the pinned deployment");
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &self.pdb(name, name, 1))
            .await
            .expect("creating the PDB");
        self.wait_running(&format!("app={name}"), 1).await;
    }
}

impl Drop for TestEnv {
    /// Delete the test's RebootPolicy and UpgradePlan (named after it), its
    /// namespace and nodes in the background of the test thread;
    /// failures are ignored because the cluster is thrown away anyway.
    fn drop(&mut self) {
        let mut namespaces = std::mem::take(&mut self.extra_namespaces);
        namespaces.push(self.ns.clone());
        let nodes = std::mem::take(&mut self.nodes);
        let id = self.id.clone();
        let _ = std::thread::spawn(move || {
            block_on(async move {
                // A client of its own: the test's may be tied to a
                // connection whose driver is gone by now.
                let client = client().await;
                // Feature objects are cluster-scoped: named after the test
                // (`ID`, or `ID-…` where a test has several; an exclusive
                // plan left behind would hold every later test's).
                let ours = |name: &str| name == id || name.starts_with(&format!("{id}-"));
                delete_named(
                    &Api::<nodekeeper::api::reboot::RebootPolicy>::all(client.clone()),
                    &ours,
                )
                .await;
                delete_named(
                    &Api::<nodekeeper::api::upgrade::UpgradePlan>::all(client.clone()),
                    &ours,
                )
                .await;
                for ns in namespaces {
                    let _ = Api::<Namespace>::all(client.clone())
                        .delete(&ns, &DeleteParams::background())
                        .await;
                }
                for n in nodes {
                    let _ = Api::<Node>::all(client.clone())
                        .delete(&n, &DeleteParams::background())
                        .await;
                }
            })
        })
        .join();
    }
}

/// Delete every object of `api` whose name `ours` accepts (errors ignored:
/// the cluster is thrown away anyway).
async fn delete_named<K>(api: &Api<K>, ours: &dyn Fn(&str) -> bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let items = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for o in items {
        let name = o.meta().name.clone().unwrap_or_default();
        if ours(&name) {
            let _ = api.delete(&name, &DeleteParams::background()).await;
        }
    }
}

/// Poll `check` every 100 ms until it yields `Some`, or panic after `limit`
/// naming what we waited for. Tests may poll; the product may not.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_every(what, limit, Duration::from_millis(100), check).await
}

/// [`wait_for`], looking every `every`: for checks that cost the API
/// server a lot (bench-scale's over 150 000 pods).
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        nodekeeper::runtime::sleep(every).await;
    }
}

/// A running `nodekeeper` process, killed on drop.
pub struct Agent {
    pub child: Child,
    pub log: PathBuf,
    /// The test makes the API server refuse this process on purpose (an
    /// admission policy, a narrowed identity): its log may say forbidden.
    pub refusals_expected: bool,
}

impl Agent {
    /// Start `nodekeeper <args>` against the test cluster, logging to a
    /// file, as users run it: with the identity the shipped manifests give
    /// it ([`shipped_identity`]).
    pub fn start(args: &[&str]) -> Agent {
        let identity = shipped_identity(args);
        Agent::start_with(
            Path::new(env!("CARGO_BIN_EXE_nodekeeper")),
            identity.as_deref().unwrap_or(cluster()),
            "nodekeeper=debug,warn",
            args,
        )
    }

    /// [`Agent::start`] with variables added to its environment (a proxy),
    /// never set in the test process: tests share it.
    pub fn start_with_env(args: &[&str], vars: &[(&str, &str)]) -> Agent {
        let identity = shipped_identity(args);
        Agent::spawn(
            Path::new(env!("CARGO_BIN_EXE_nodekeeper")),
            identity.as_deref().unwrap_or(cluster()),
            "nodekeeper=debug,warn",
            args,
            vars,
        )
    }

    /// [`Agent::start`] with the administrator's kubeconfig, for a test
    /// whose subject is not the shipped identity (it says why).
    pub fn start_as_admin(args: &[&str]) -> Agent {
        Agent::start_with(
            Path::new(env!("CARGO_BIN_EXE_nodekeeper")),
            cluster(),
            "nodekeeper=debug,warn",
            args,
        )
    }

    /// [`Agent::start`] with another binary, kubeconfig and log filter (the
    /// benchmarks run the static binary as the audited bench identity).
    pub fn start_with(bin: &Path, kubeconfig: &Path, filter: &str, args: &[&str]) -> Agent {
        Agent::spawn(bin, kubeconfig, filter, args, &[])
    }

    fn spawn(
        bin: &Path,
        kubeconfig: &Path,
        filter: &str,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> Agent {
        let log = scratch().join(format!(
            "nodekeeper-agent-{}-{:x}.log",
            std::process::id(),
            rand_u64()
        ));
        let file = std::fs::File::create(&log).expect("creating the agent log");
        // Agents share this machine: each gets a free metrics port unless
        // the test picks one.
        let mut args: Vec<&str> = args.to_vec();
        if args.first() == Some(&"run") && !args.contains(&"--metrics-address") {
            args.extend(["--metrics-address", "127.0.0.1:0"]);
        }
        // Host command records (`run --command-records`): the default is
        // /run on a host, which a test user cannot write; each agent gets
        // its own unless the test shares one (an agent restarted mid-
        // command finds its predecessor's).
        let records = log.with_extension("records").display().to_string();
        if args.first() == Some(&"run") && !args.contains(&"--command-records") {
            args.extend(["--command-records", records.as_str()]);
        }
        let child = Command::new(bin)
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", filter)
            .envs(vars.iter().copied())
            .stdout(file.try_clone().expect("cloning the log handle"))
            .stderr(file)
            .spawn()
            .expect("starting nodekeeper");
        Agent {
            child,
            log,
            refusals_expected: false,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Send a signal (by name, e.g. "TERM") to the agent.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status();
        assert!(
            status.map(|s| s.success()).unwrap_or(false),
            "kill -{sig} failed"
        );
    }

    /// SIGKILL it (a crash, or the power going) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Wait for the process to exit; panics after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("waiting for nodekeeper") {
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "nodekeeper did not exit within {limit:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Agent {
    /// Say the test refuses this process some request on purpose.
    pub fn expect_refusals(mut self) -> Agent {
        self.refusals_expected = true;
        self
    }

    /// Panics (failing the test) if the log says the API server refused
    /// something: under the shipped identities a "forbidden" is a verb
    /// missing from the RBAC we ship or a write the admission policy we
    /// ship refuses, found by CI rather than by a user. Every agent is
    /// checked as it is dropped, unless [`Agent::expect_refusals`].
    fn check_refusals(&self) {
        if self.refusals_expected || std::thread::panicking() {
            return;
        }
        let log = self.log_text();
        // A namespace being deleted answers 403 to every create in it
        // (another test's, ending while an unscoped cluster role still
        // reports on its objects): the NamespaceLifecycle plugin, not RBAC
        // or our admission policy.
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("forbidden"))
            .filter(|l| !l.contains("because it is being terminated"))
            .collect();
        assert!(
            refused.is_empty(),
            "nodekeeper was refused under its shipped identity ({} lines; log {}):\n{}",
            refused.len(),
            self.log.display(),
            refused
                .iter()
                .take(5)
                .copied()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.check_refusals();
    }
}

/// This test process's scratch folder, `$TMPDIR/nk-test-<pid>`: every file
/// a test or benchmark writes goes there. The first call removes the
/// folders of test processes that have ended and written nothing for an
/// hour: kept for a look after a failure, not forever (agent logs alone
/// were thousands of files a day).
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("nk-test-"))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let ended = !Path::new(&format!("/proc/{pid}")).exists();
            let idle = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(3600));
            if ended && idle {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = tmp.join(format!("nk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the test scratch folder");
        dir
    })
}

/// A cheap random number for unique file names (no rand crate in tests).
pub fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

/// How long one CLI invocation in a test may take before it counts as hung.
pub const CLI_LIMIT: Duration = Duration::from_secs(120);

/// Run the nodekeeper binary to completion and return (exit status, stdout,
/// stderr). A run that outlives [`CLI_LIMIT`] is killed and fails this test
/// with what it printed, rather than hanging the whole suite.
pub fn run_cli(args: &[&str], envs: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running nodekeeper");
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let hung = finished.recv_timeout(CLI_LIMIT).is_err();
        if hung {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        hung
    });
    let out = child.wait_with_output().expect("waiting for nodekeeper");
    let _ = done.send(());
    let hung = watchdog.join().unwrap_or(false);
    let (stdout, stderr): (String, String) = (
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    );
    assert!(
        !hung,
        "nodekeeper {args:?} did not finish within {CLI_LIMIT:?}; stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (out.status, stdout, stderr)
}

/// The folder of control-plane binaries (kubectl among them).
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/cluster.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("build")
            .stderr(Stdio::inherit())
            .output()
            .expect("cluster.sh build");
        assert!(out.status.success(), "cluster.sh build failed");
        PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .lines()
                .last()
                .unwrap_or_default(),
        )
    })
}

/// Run kubectl against the test cluster, with `stdin` piped in.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(bin_dir().join("kubectl"))
        .args(args)
        .env("KUBECONFIG", cluster())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kubectl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("kubectl stdin")
            .write_all(input.as_bytes())
            .expect("writing to kubectl");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("waiting for kubectl")
}

/// `kubectl apply` of one object; the test fails if it is refused.
pub fn apply(obj: &serde_json::Value) {
    let out = kubectl(&["apply", "-f", "-"], Some(&obj.to_string()));
    assert!(
        out.status.success(),
        "kubectl apply {}: {}",
        obj["metadata"]["name"],
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deletes what a test created beyond its TestEnv (cluster-scoped objects,
/// admission policies) when it ends, passed or not.
pub struct Cleanup(pub Vec<(&'static str, String)>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (kind, name) in &self.0 {
            let _ = kubectl(
                &["delete", kind, name, "--ignore-not-found", "--wait=false"],
                None,
            );
        }
    }
}

/// A write the API server refuses for as long as this lives (or until
/// [`Refusal::lift`]): a ValidatingAdmissionPolicy named `name` over
/// `rules` (its `resourceRules`) that denies where `expression` is false,
/// with `message`. A failure only a real API server gives, at the moment
/// the test chooses.
pub struct Refusal(Cleanup);

impl Refusal {
    pub fn install(name: &str, rules: serde_json::Value, expression: &str, message: &str) -> Self {
        let refusal = Refusal(Cleanup(vec![
            ("validatingadmissionpolicybinding", name.to_string()),
            ("validatingadmissionpolicy", name.to_string()),
        ]));
        apply(&serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": expression, "message": message}],
            }
        }));
        apply(&serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }));
        refusal
    }

    /// Allow the writes again.
    pub fn lift(self) {}
}

/// The effects' interpreter as a node agent has it, on the test's client,
/// with `talos` as its machined client.
pub fn interpreter(
    client: kube::Client,
    talos: nodekeeper::effects::talos::Machined,
) -> nodekeeper::effects::Interpreter {
    nodekeeper::effects::Interpreter {
        client: client.clone(),
        events: nodekeeper::effects::events::Events::new(client, "nodekeeper-test", None),
        evictions: nodekeeper::effects::evict::Permits::new(
            nodekeeper::effects::evict::HTTP2_IN_FLIGHT,
        ),
        exec: nodekeeper::effects::host::Exec::Direct,
        records: scratch().join("effects-records"),
        talos,
        provider: None,
        gate: nodekeeper::effects::gate::LeaderGate::always(),
    }
}
