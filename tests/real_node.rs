//! nodekeeper on a real node: a real kubelet v1.37.1 with containerd, runc
//! and kube-proxy (`tests/realnode/node.sh`), where kwok cannot show the
//! truth — whether the static pod starts before any CNI, and the DaemonSet's
//! pod on the pod network through the `kubernetes` Service, each under the
//! manifests' security context, with the credentials the README's recipes
//! give them; and whether a drain really stops containers, honouring their
//! grace period.
//!
//! Every claim is checked on the host (processes, /proc) or in the API by
//! the test itself, never from nodekeeper's status.

use crate::realnode;
use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use realnode::{RealNode, exclusive, processes_with, readme_recipe, real_node, wait_host};
use support::{TestEnv, block_on, install_agent_identity, install_crds, wait_for};

/// Swap what is this test machine's own in a recipe line: the node's name,
/// containerd's socket, the kubelet's folder, where the binary, the archive
/// and the repository are. Nothing else changes.
fn localise(line: &str, node: &RealNode, archive: &Path) -> String {
    let repo = env!("CARGO_MANIFEST_DIR");
    let bin = std::env::var("NODEKEEPER_IMAGE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nodekeeper").into());
    let ctr = node.ctr.join(" ").replace(" --namespace k8s.io", "");
    let mut words: Vec<String> = Vec::new();
    for (i, w) in line.split_whitespace().enumerate() {
        let w = match w {
            "ctr" if i == 0 => ctr.clone(),
            "nodekeeper" if i == 0 => bin.clone(),
            "kubectl" if i == 0 => support::bin_dir().join("kubectl").display().to_string(),
            "k3s-manifests/" => format!("{repo}/k3s-manifests/"),
            "worker-1" => node.name.clone(),
            "/etc/kubernetes/manifests/" => format!("{}/", node.manifests.display()),
            "image/static-pod.yaml" => format!("{repo}/image/static-pod.yaml"),
            w if w.ends_with(".oci.tar") => archive.display().to_string(),
            w => w.to_string(),
        };
        words.push(w);
    }
    words.join(" ")
}

fn sh(line: &str) {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", line])
        .env("KUBECONFIG", support::cluster())
        // The test node's containerd unpacks with the native snapshotter
        // (node.sh); ctr's default is overlayfs. Environment, not recipe.
        .env("CONTAINERD_SNAPSHOTTER", "native")
        .output()
        .expect("running a recipe line");
    assert!(
        out.status.success(),
        "recipe line failed: {line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn node_condition(env: &TestEnv, node: &str, kind: &str) -> Option<(String, String)> {
    let n = Api::<Node>::all(env.client.clone()).get(node).await.ok()?;
    n.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status, c.message.unwrap_or_default()))
}

async fn unschedulable(env: &TestEnv, node: &str) -> Option<bool> {
    let n = Api::<Node>::all(env.client.clone()).get(node).await.ok()?;
    Some(n.spec.and_then(|s| s.unschedulable).unwrap_or(false))
}

/// Wait (30 s at most) until the API shows `node` cordoned, or uncordoned.
fn wait_cordon(env: &TestEnv, node: &str, cordoned: bool) {
    let what = if cordoned { "cordoned" } else { "uncordoned" };
    block_on(wait_for(
        &format!("{node} {what}"),
        Duration::from_secs(30),
        || async { unschedulable(env, node).await.filter(|u| *u == cordoned) },
    ));
}

/// Takes the node's CNI config away until dropped (`node.sh cni off|on`):
/// the runtime's network is then not ready, as on a node whose CNI has not
/// started yet.
struct NoCni<'a>(&'a RealNode);

impl<'a> NoCni<'a> {
    fn new(node: &'a RealNode) -> NoCni<'a> {
        node.script(&["cni", "off"]);
        NoCni(node)
    }
}

impl Drop for NoCni<'_> {
    fn drop(&mut self) {
        self.0.script(&["cni", "on"]);
    }
}

/// A NodeMaintenance of the test, deleted when dropped (also when the test
/// fails), so the next real-node test finds the node free.
struct Maintenance {
    api: Api<NodeMaintenance>,
    name: String,
}

impl Maintenance {
    fn create(env: &TestEnv, node: &str, suffix: &str) -> Maintenance {
        let api: Api<NodeMaintenance> = Api::all(env.client.clone());
        let name = format!("{}-{suffix}", env.id);
        let nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: node.to_string(),
                reason: Some(format!("real node test {suffix}")),
            },
        );
        block_on(api.create(&PostParams::default(), &nm)).expect("creating the NodeMaintenance");
        Maintenance { api, name }
    }

    fn wait_phase(&self, phase: Phase, limit: Duration) {
        block_on(wait_for(
            &format!("NodeMaintenance {} {phase:?}", self.name),
            limit,
            || async {
                let nm = self.api.get(&self.name).await.ok()?;
                (nm.status?.phase? == phase).then_some(())
            },
        ));
    }

    /// Delete it and wait until it is gone (its finalizer finished).
    fn end(&self) {
        block_on(self.api.delete(&self.name, &DeleteParams::default()))
            .expect("deleting the NodeMaintenance");
        block_on(wait_for(
            "the NodeMaintenance gone",
            Duration::from_secs(30),
            || async {
                self.api
                    .get_opt(&self.name)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            },
        ));
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        let _ = block_on(self.api.delete(&self.name, &DeleteParams::default()));
    }
}

/// Wait until no pod but static pods' mirrors is bound to the node: a
/// previous test's pods must not be in the next one's drain.
fn wait_node_empty(env: &TestEnv, node: &str) {
    let pods: Api<Pod> = Api::all(env.client.clone());
    let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    block_on(wait_for(
        "the real node free of other tests' pods",
        Duration::from_secs(90),
        || async {
            let list = pods.list(&lp).await.ok()?;
            list.items
                .iter()
                .all(|p| p.annotations().contains_key("kubernetes.io/config.mirror"))
                .then_some(())
        },
    ));
}

/// A real-node test's start: the node to itself, the CRDs and the agent's
/// RBAC and admission policy installed, the node up and free of earlier
/// tests' pods, a namespace of its own.
fn on_real_node(
    name: &str,
) -> (
    std::sync::MutexGuard<'static, ()>,
    &'static RealNode,
    TestEnv,
) {
    let one = exclusive();
    install_crds();
    install_agent_identity();
    let node = real_node();
    let env = block_on(TestEnv::new(name));
    wait_node_empty(&env, &node.name);
    (one, node, env)
}

/// Removes the static pod manifest and the host kubeconfig when dropped, so
/// a failing test leaves no agent behind.
struct StaticPodCleanup<'a>(&'a RealNode);

impl Drop for StaticPodCleanup<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.manifests.join("static-pod.yaml"));
        let _ = std::fs::remove_file("/etc/nodekeeper/kubeconfig");
        let _ = std::fs::remove_dir("/etc/nodekeeper");
    }
}

/// Run the README's static-pod recipe on the real node and return the
/// agent's host PID once its process runs.
fn run_static_pod_recipe(node: &RealNode) -> u32 {
    let archive = realnode::image_archive();
    let recipe = readme_recipe("Static pod");
    assert_eq!(recipe.len(), 3, "the recipe changed shape: {recipe:?}");
    for line in &recipe {
        sh(&localise(line, node, archive));
    }
    agent_pid(None)
}

/// The static pod agent's host PID, waiting for one other than `not`.
fn agent_pid(not: Option<u32>) -> u32 {
    let mut found = None;
    wait_host(
        "the static pod's agent process",
        Duration::from_secs(90),
        || {
            found = processes_with(&["/nodekeeper", "run", "127.0.0.1:9477"])
                .into_iter()
                .map(|(pid, _)| pid)
                .find(|pid| Some(*pid) != not);
            found.is_some()
        },
    );
    found.unwrap_or_default()
}

/// The manifests' security context, as the real runtime applied it to the
/// process `pid`: user and group 65532, no capabilities (none in effect, an
/// empty bounding set), no privilege escalation, the RuntimeDefault seccomp
/// filter, a read-only root file system.
fn assert_confined(pid: u32, what: &str) {
    let proc = |field| realnode::proc_status(pid, field).unwrap_or_default();
    let first = |v: String| v.split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(first(proc("Uid")), "65532", "{what}: user");
    assert_eq!(first(proc("Gid")), "65532", "{what}: group");
    assert_eq!(proc("CapEff"), "0000000000000000", "{what}: capabilities");
    assert_eq!(proc("CapBnd"), "0000000000000000", "{what}: bounding set");
    assert_eq!(proc("NoNewPrivs"), "1", "{what}: no privilege escalation");
    assert_eq!(proc("Seccomp"), "2", "{what}: a seccomp filter");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap_or_default();
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|o| o.split(',').any(|x| x == "ro")),
        "{what}: the root file system is read-only: {root}"
    );
}

fn healthy() -> bool {
    support::http_get(9477, "/healthz").is_some_and(|(status, _)| status.contains(" 200"))
}

/// The README's static-pod recipe, run as written on a real kubelet whose
/// network has no CNI config yet: the image imports from `just image`'s
/// archive, the kubeconfig is readable by the image's user, the pod runs as
/// 65532 with no capabilities on a read-only root, answers /healthz on
/// loopback, and its agent cordons and uncordons its node for a
/// NodeMaintenance. Removing the manifest stops it.
#[test]
fn the_readme_static_pod_recipe_runs_before_any_cni_and_reconciles_its_node() {
    let (_one, node, env) = on_real_node("realsp");

    let cni = NoCni::new(node);
    block_on(wait_for(
        "the real node's runtime network to be not ready (no CNI config)",
        Duration::from_secs(30),
        || async {
            let (status, message) = node_condition(&env, &node.name, "Ready").await?;
            (status == "False" && message.contains("network")).then_some(())
        },
    ));

    let _cleanup = StaticPodCleanup(node);
    let pid = run_static_pod_recipe(node);
    assert_confined(pid, "the static pod's agent");

    // Health on the host's loopback (host network, before any CNI).
    wait_host(
        "/healthz on 127.0.0.1:9477",
        Duration::from_secs(30),
        || support::http_get(9477, "/healthz").is_some_and(|(status, _)| status.contains(" 200")),
    );
    let (ready, _) = block_on(node_condition(&env, &node.name, "Ready")).unwrap_or_default();
    assert_eq!(
        ready, "False",
        "the CNI must still be missing while the agent works"
    );

    // The agent reconciles its node.
    let nm = Maintenance::create(&env, &node.name, "static");
    wait_cordon(&env, &node.name, true);
    nm.wait_phase(Phase::Succeeded, Duration::from_secs(30));
    nm.end();
    wait_cordon(&env, &node.name, false);

    // Removing the manifest stops the container: the process goes.
    std::fs::remove_file(node.manifests.join("static-pod.yaml")).expect("removing the manifest");
    wait_host("the agent process to stop", Duration::from_secs(60), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    drop(cni);
    block_on(wait_for(
        "the real node Ready again with its CNI config back",
        Duration::from_secs(60),
        || async {
            let (status, _) = node_condition(&env, &node.name, "Ready").await?;
            (status == "True").then_some(())
        },
    ));
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "kube-system");
    block_on(wait_for(
        "the mirror pod gone",
        Duration::from_secs(30),
        || async {
            pods.get_opt(&format!("nodekeeper-{}", node.name))
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    ));
}

/// A workload for the real node: tolerates its taint, selects it, runs the
/// local pause image (`/pause ARGS…`), with `extra` merged into the pod spec.
fn real_pod_template(app: &str, args: &[&str], extra: serde_json::Value) -> serde_json::Value {
    let mut spec = serde_json::json!({
        "nodeSelector": {realnode::REAL_NODE_KEY: "true"},
        "tolerations": [{"key": realnode::REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": "main",
            "image": "localhost/pause:nodekeeper",
            "imagePullPolicy": "Never",
            "command": ["/pause"],
            "args": args,
        }],
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

fn apply<K>(env: &TestEnv, value: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(value).expect("a valid object");
    let api: Api<K> = Api::namespaced(env.client.clone(), &env.ns);
    block_on(api.create(&PostParams::default(), &object)).expect("creating a workload")
}

/// Running pods of `app` on the real node: (uid, name).
async fn running(env: &TestEnv, node: &str, app: &str) -> Vec<(String, String)> {
    env.pods(&format!("app={app}"))
        .await
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.metadata.deletion_timestamp.is_none()
        })
        .map(|p| {
            (
                p.metadata.uid.unwrap_or_default(),
                p.metadata.name.unwrap_or_default(),
            )
        })
        .collect()
}

/// `term MS` and `exit MS` lines the lingering container wrote.
fn linger_marks(file: &Path) -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mark = |word: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix(word))
            .filter_map(|v| v.trim().parse().ok())
            .next_back()
    };
    (mark("term "), mark("exit "))
}

/// A NodeMaintenance drains real containers: a container that traps
/// SIGTERM and needs 4 s gets them (the kubelet does not kill it sooner)
/// and is gone from the host before the maintenance reports Succeeded; an
/// emptyDir pod is evicted; the DaemonSet pod stays, the same pod and
/// process; the node is uncordoned afterwards and the workload returns.
#[test]
fn a_maintenance_drains_real_containers_with_their_grace_period() {
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    const LINGER_SECS: u64 = 4;
    let (_one, node, env) = on_real_node("realdrain");
    let out = support::scratch().join(format!("nk-linger-{}", env.id));
    std::fs::create_dir_all(&out).expect("the linger folder");
    // The pause image's user (65535) writes its marks here.
    let _ = Command::new("chmod").arg("0777").arg(&out).status();
    let marks = out.join("marks");
    let out_volume = serde_json::json!({
        "volumes": [{"name": "out", "hostPath": {"path": out.display().to_string(), "type": "Directory"}}]
    });
    let mut linger = real_pod_template(
        "linger",
        &["linger", &LINGER_SECS.to_string(), "/out/marks"],
        out_volume,
    );
    linger["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "out", "mountPath": "/out"}]);
    let mut scratch = real_pod_template(
        "scratch",
        &[],
        serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {}}]}),
    );
    scratch["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "scratch", "mountPath": "/scratch"}]);
    let keeper = real_pod_template("keeper", &[], serde_json::json!({}));
    let deployment = |name: &str, template: serde_json::Value| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template}
        })
    };
    apply::<Deployment>(&env, deployment("linger", linger));
    apply::<Deployment>(&env, deployment("scratch", scratch));
    apply::<DaemonSet>(
        &env,
        serde_json::json!({
            "metadata": {"name": "keeper"},
            "spec": {"selector": {"matchLabels": {"app": "keeper"}}, "template": keeper}
        }),
    );
    let _agent = support::Agent::start(&["run", "--node", &node.name]);

    let mut before = std::collections::HashMap::new();
    for app in ["linger", "scratch", "keeper"] {
        let pods = block_on(wait_for(
            &format!("{app} running on the real node"),
            Duration::from_secs(60),
            || async {
                let pods = running(&env, &node.name, app).await;
                (pods.len() == 1).then_some(pods)
            },
        ));
        before.insert(app, pods[0].clone());
    }
    let linger_args = ["/pause", "linger", "/out/marks"];
    wait_host(
        "the lingering container's process",
        Duration::from_secs(30),
        || !processes_with(&linger_args).is_empty(),
    );
    let keeper_procs = processes_with(&["/pause"]).len();
    assert!(keeper_procs >= 3, "the pods' processes on the host");

    let nm = Maintenance::create(&env, &node.name, "drain");
    wait_cordon(&env, &node.name, true);
    wait_host(
        "SIGTERM reaching the lingering container",
        Duration::from_secs(30),
        || linger_marks(&marks).0.is_some(),
    );
    nm.wait_phase(Phase::Succeeded, Duration::from_secs(60));
    // Checked at once: Succeeded must mean the containers are gone.
    assert!(
        processes_with(&linger_args).is_empty(),
        "the lingering container still runs on the host after Succeeded"
    );
    let (term, exit) = linger_marks(&marks);
    let (term, exit) = (
        term.unwrap_or_default(),
        exit.expect("the container finished its grace work and wrote its exit mark"),
    );
    assert!(
        exit >= term + LINGER_SECS * 1000,
        "the container was stopped {} ms after SIGTERM, before its {LINGER_SECS} s",
        exit.saturating_sub(term)
    );
    let scratch_now = block_on(running(&env, &node.name, "scratch"));
    assert!(
        !scratch_now
            .iter()
            .any(|(uid, _)| *uid == before["scratch"].0),
        "the emptyDir pod was not evicted"
    );
    let keeper_now = block_on(running(&env, &node.name, "keeper"));
    assert_eq!(
        keeper_now,
        vec![before["keeper"].clone()],
        "the DaemonSet pod must stay"
    );

    nm.end();
    wait_cordon(&env, &node.name, false);
    for app in ["linger", "scratch"] {
        block_on(wait_for(
            &format!("{app} back on the real node"),
            Duration::from_secs(60),
            || async {
                let pods = running(&env, &node.name, app).await;
                (pods.len() == 1 && pods[0].0 != before[app].0).then_some(())
            },
        ));
    }
    wait_host(
        "the lingering container running again",
        Duration::from_secs(30),
        || !processes_with(&linger_args).is_empty(),
    );
    // Leave the node as found: the workloads gone from it, lingering
    // included (another test takes the node's network away).
    for (kind, name) in [
        ("deployment", "linger"),
        ("deployment", "scratch"),
        ("daemonset", "keeper"),
    ] {
        let out = support::kubectl(&["-n", &env.ns, "delete", kind, name, "--wait=false"], None);
        assert!(out.status.success(), "deleting {kind} {name}");
    }
    wait_node_empty(&env, &node.name);
    let _ = std::fs::remove_dir_all(&out);
}

/// Transitions of a Node's `spec.unschedulable`, seen by a watch of the
/// test's own: (to cordoned, to uncordoned).
struct CordonWatch {
    /// (to cordoned, to uncordoned, the initial state seen)
    counts: std::sync::Arc<Mutex<(usize, usize, bool)>>,
    task: Option<smol::Task<()>>,
}

use std::sync::Mutex;

impl CordonWatch {
    fn start(env: &TestEnv, node: &str) -> CordonWatch {
        use kube::runtime::watcher::{self, Event};
        use smol::stream::StreamExt;
        let counts = std::sync::Arc::new(Mutex::new((0, 0, false)));
        let api: Api<Node> = Api::all(env.client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let seen = counts.clone();
        let task = smol::spawn(async_compat::Compat::new(async move {
            let mut last: Option<bool> = None;
            let mut stream = std::pin::pin!(watcher::watcher(api, config));
            while let Some(ev) = stream.next().await {
                let node = match ev {
                    Ok(Event::Apply(n)) | Ok(Event::InitApply(n)) => n,
                    _ => continue,
                };
                let now = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
                let mut c = seen.lock().unwrap_or_else(|p| p.into_inner());
                match (last, now) {
                    (Some(false), true) => c.0 += 1,
                    (Some(true), false) => c.1 += 1,
                    _ => {}
                }
                last = Some(now);
                c.2 = true;
            }
        }));
        let watch = CordonWatch {
            counts,
            task: Some(task),
        };
        // Changes before the watch's first list would go unseen.
        wait_host(
            "the cordon watch's first look",
            Duration::from_secs(30),
            || watch.counts.lock().map(|c| c.2).unwrap_or(false),
        );
        watch
    }

    fn counts(&self) -> (usize, usize) {
        let c = *self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.0, c.1)
    }

    /// Wait (bounded) until the watch's counts satisfy `enough`.
    fn wait_for_counts(&self, what: &str, enough: impl Fn((usize, usize)) -> bool) {
        block_on(wait_for(what, Duration::from_secs(30), || async {
            enough(self.counts()).then_some(())
        }));
    }
}

impl Drop for CordonWatch {
    fn drop(&mut self) {
        drop(self.task.take());
    }
}

/// Events about a NodeMaintenance with this reason, series counted.
async fn events_about(env: &TestEnv, name: &str, reason: &str) -> usize {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    let api: Api<CoreEvent> = Api::all(env.client.clone());
    let lp = kube::api::ListParams::default().fields(&format!("involvedObject.name={name}"));
    api.list(&lp)
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .map(support::event_count)
                .sum()
        })
        .unwrap_or_default()
}

/// The static pod agent in a maintenance survives a containerd restart and
/// a kubelet restart (its process runs on), and when its container is
/// killed the real runtime restarts it and the new agent converges without
/// repeating a step: the node stays cordoned throughout (an independent
/// watch sees one cordon, no uncordon), one BeginMaintenance and one
/// SucceedMaintenance; then the maintenance ends with one uncordon.
#[test]
fn the_static_pod_agent_survives_runtime_and_kubelet_restarts_without_repeating_a_step() {
    let (_one, node, env) = on_real_node("realrestart");
    let _cleanup = StaticPodCleanup(node);
    let pid = run_static_pod_recipe(node);
    wait_host(
        "/healthz on 127.0.0.1:9477",
        Duration::from_secs(30),
        healthy,
    );
    let watch = block_on(async { CordonWatch::start(&env, &node.name) });

    let nm = Maintenance::create(&env, &node.name, "restart");
    let name = nm.name.clone();
    let succeeded = || nm.wait_phase(Phase::Succeeded, Duration::from_secs(60));
    succeeded();

    node.script(&["restart", "containerd"]);
    wait_host(
        "/healthz after the containerd restart",
        Duration::from_secs(60),
        healthy,
    );
    assert_eq!(
        agent_pid(None),
        pid,
        "a containerd restart must not restart the agent"
    );
    node.script(&["restart", "kubelet"]);
    block_on(wait_for(
        "the real node Ready after the kubelet restart",
        Duration::from_secs(60),
        || async {
            let (status, _) = node_condition(&env, &node.name, "Ready").await?;
            (status == "True").then_some(())
        },
    ));
    wait_host(
        "/healthz after the kubelet restart",
        Duration::from_secs(60),
        healthy,
    );

    // The container dies; the kubelet starts it again.
    let before = agent_pid(None);
    let _ = Command::new("kill")
        .args(["-KILL", &before.to_string()])
        .status();
    let after = agent_pid(Some(before));
    assert_ne!(after, before);
    // Two finished reconciles of the new agent: its first pass over the
    // maintenance it found has run, so a step it would repeat has been.
    wait_host(
        "two reconciles by the restarted agent",
        Duration::from_secs(60),
        || {
            support::http_get(9477, "/metrics").is_some_and(|(_, body)| {
                body.lines()
                    .find_map(|l| l.strip_prefix("nodekeeper_reconciles_total "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .is_some_and(|n| n >= 2.0)
            })
        },
    );
    succeeded();
    watch.wait_for_counts("the watch to see the cordon", |(cordons, _)| cordons >= 1);
    assert_eq!(
        watch.counts(),
        (1, 0),
        "(cordons, uncordons) during the maintenance"
    );
    assert_eq!(block_on(events_about(&env, &name, "BeginMaintenance")), 1);
    assert_eq!(block_on(events_about(&env, &name, "SucceedMaintenance")), 1);

    nm.end();
    wait_cordon(&env, &node.name, false);
    // The GET above can see the uncordon before the independent watch is
    // delivered it (stop 63's gate failed on exactly that): wait for the
    // watch itself, then count.
    watch.wait_for_counts("the watch to see the uncordon", |(_, uncordons)| {
        uncordons >= 1
    });
    assert_eq!(
        watch.counts(),
        (1, 1),
        "(cordons, uncordons) over the whole maintenance"
    );
    assert_eq!(block_on(events_about(&env, &name, "RemovedMaintenance")), 1);
}

/// The namespace of the k3s manifests' objects.
const K3S_NAMESPACE: &str = "nodekeeper";

/// Deletes what the README's DaemonSet recipe started, when dropped: the
/// DaemonSet and the cluster role's Deployment, waiting (foreground) until
/// their pods are gone, then until the agent's process is. The cluster-wide
/// objects stay: other tests install the same ones.
struct DaemonSetCleanup;

impl Drop for DaemonSetCleanup {
    fn drop(&mut self) {
        let _ = support::kubectl(
            &[
                "delete",
                "-n",
                K3S_NAMESPACE,
                "daemonset/nodekeeper",
                "deployment/nodekeeper-cluster",
                "--ignore-not-found",
                "--cascade=foreground",
                "--wait=true",
                "--timeout=90s",
            ],
            None,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !daemonset_agents().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Host PIDs of DaemonSet agents (`run --metrics-address :9477`; the static
/// pod's listens on 127.0.0.1:9477).
fn daemonset_agents() -> Vec<u32> {
    processes_with(&["/nodekeeper", "run", "--metrics-address :9477"])
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The README's DaemonSet recipe (preload the image, `kubectl apply -R -f
/// k3s-manifests/`), run as written: the DaemonSet's pod on the real node
/// runs on the pod network, under the manifest's security context; it
/// reaches the API server through the `kubernetes` Service (kube-proxy) with
/// the token the kubelet mounted; the kubelet's probe of /readyz on the pod's
/// address makes it Ready; it cordons and uncordons its own node for a
/// NodeMaintenance, which the own-node admission policy allows, while the
/// policy refuses its token on any other node.
#[test]
fn the_readme_daemonset_recipe_runs_an_agent_on_the_pod_network_confined_to_its_node() {
    let (_one, node, mut env) = on_real_node("realds");
    let other = block_on(env.add_node("other"));
    let archive = realnode::image_archive();
    let _cleanup = DaemonSetCleanup;
    let recipe = readme_recipe("DaemonSet with kubectl");
    assert_eq!(recipe.len(), 2, "the recipe changed shape: {recipe:?}");
    for line in &recipe {
        sh(&localise(line, node, archive));
    }

    // The agent's pod on the real node, Ready by the kubelet's probe.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), K3S_NAMESPACE);
    let on_node = kube::api::ListParams::default()
        .labels("app.kubernetes.io/name=nodekeeper")
        .fields(&format!("spec.nodeName={}", node.name));
    let pod = block_on(wait_for(
        "the DaemonSet's agent pod Ready on the real node",
        Duration::from_secs(90),
        || async {
            let list = pods.list(&on_node).await.ok()?;
            list.items.into_iter().find(|p| {
                pod_ready(p)
                    && p.owner_references()
                        .iter()
                        .any(|o| o.kind == "DaemonSet" && o.name == "nodekeeper")
            })
        },
    ));
    let spec = pod.spec.clone().unwrap_or_default();
    assert_ne!(spec.host_network, Some(true), "the agent pod's network");
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    assert!(
        ip.starts_with("10.88."),
        "the agent pod has an address on the node's pod network, not {ip:?}"
    );

    let mut pid = 0;
    wait_host(
        "the DaemonSet agent's process",
        Duration::from_secs(30),
        || {
            let agents = daemonset_agents();
            pid = agents.first().copied().unwrap_or_default();
            agents.len() == 1
        },
    );
    assert_confined(pid, "the DaemonSet's agent");
    let netns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).ok();
    assert_ne!(
        netns(&pid.to_string()),
        netns("self"),
        "the agent runs in a network namespace of its own"
    );
    // It talks to the API server at the Service's ClusterIP (kube-proxy's
    // rules), the address the kubelet gave it.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ
            .split('\0')
            .any(|v| v == "KUBERNETES_SERVICE_HOST=10.96.0.1"),
        "the agent's environment names the kubernetes Service: {environ:?}"
    );

    // It reconciles its own node: cordon, drain (its own pod stays), uncordon.
    let nm = Maintenance::create(&env, &node.name, "ds");
    wait_cordon(&env, &node.name, true);
    nm.wait_phase(Phase::Succeeded, Duration::from_secs(30));
    let still = block_on(pods.get(&pod.name_any())).expect("the agent pod after the drain");
    assert!(
        still.metadata.deletion_timestamp.is_none() && pod_ready(&still),
        "the agent's own pod stays through its node's drain"
    );
    nm.end();
    wait_cordon(&env, &node.name, false);

    // The token the kubelet mounted is bound to this node: the admission
    // policy refuses it on another.
    let token = std::fs::read_to_string(format!(
        "/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token"
    ))
    .expect("the agent's service account token, read through its root");
    let as_agent = block_on(support::client_with_token(token.trim()));
    let nodes: Api<Node> = Api::all(as_agent);
    let refused = block_on(nodes.patch(
        &other,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
    ));
    match refused {
        Err(kube::Error::Api(e)) => assert!(
            e.code == 403
                && e.message.contains(&format!(
                    "agent of node {} may not modify node {other}",
                    node.name
                )),
            "refused for the wrong reason: {e:?}"
        ),
        result => panic!("the agent's token cordoned another node: {result:?}"),
    }
    assert_eq!(
        block_on(unschedulable(&env, &other)),
        Some(false),
        "the other node is untouched"
    );

    // A RebootPolicy on this default, maintenance-only install: the agent
    // has no `systemctl` in its container and says so on its node, and the
    // cluster role, asked to reboot the node, never drains it and says why.
    let policy: nodekeeper::api::reboot::RebootPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodekeeper.io/v1alpha1", "kind": "RebootPolicy",
        "metadata": {"name": env.id},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}}},
    }))
    .expect("a RebootPolicy");
    let policies: Api<nodekeeper::api::reboot::RebootPolicy> = Api::all(env.client.clone());
    block_on(policies.create(&PostParams::default(), &policy)).expect("creating the policy");
    let _need = NeedCleanup(env.client.clone(), node.name.clone());
    block_on(support::machines::annotate(
        &env.client,
        &node.name,
        "nodekeeper.io/reboot-needed",
        Some("now"),
    ));
    let selector = format!("kubernetes.io/hostname={}", node.name);
    let _cluster = support::Agent::start(&[
        "run",
        "--all-nodes",
        "--node-agents",
        "--node-selector",
        &selector,
        "--leader-namespace",
        &env.ns,
    ]);
    let entry = block_on(wait_for(
        "the policy saying why the node is not taken",
        Duration::from_secs(60),
        || async {
            let p = policies.get(&env.id).await.ok()?;
            let e = p.entry(&node.name)?.clone();
            (e.reason.as_deref() == Some("CommandNotRunnable")).then_some(e)
        },
    ));
    let msg = entry.message.unwrap_or_default();
    assert!(msg.contains("systemctl: not found"), "{msg}");
    let n = block_on(Api::<Node>::all(env.client.clone()).get(&node.name)).expect("the node");
    let check = n
        .annotations()
        .get("nodekeeper.io/reboot-command-check")
        .cloned()
        .unwrap_or_default();
    assert!(
        check.contains("cannot run: systemctl: not found"),
        "{check}"
    );
    assert_eq!(
        block_on(unschedulable(&env, &node.name)),
        Some(false),
        "not drained"
    );
    let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
    let taken = block_on(nms.list(&Default::default()))
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.spec.node_name == node.name)
        .count();
    assert_eq!(taken, 0, "no NodeMaintenance for a node nobody can reboot");
}

/// Takes the reboot need and the agent's check off the real node, however
/// the test ends: the node outlives it.
struct NeedCleanup(kube::Client, String);

impl Drop for NeedCleanup {
    fn drop(&mut self) {
        for key in [
            "nodekeeper.io/reboot-needed",
            "nodekeeper.io/reboot-command-check",
        ] {
            block_on(support::machines::annotate(&self.0, &self.1, key, None));
        }
    }
}
