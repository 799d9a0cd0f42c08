//! Simulated machines for reboot tests, and the independent watcher that
//! checks budgets.
//!
//! A [`Fleet`] gives each kwok node a host root (a temp dir, for sentinel
//! files) and, in node-agent mode, a nodekeeper agent process. The reboot
//! command the policy runs is a tiny script that appends a line to the
//! node's marker file; [`Fleet::serve`] notices each new line and performs
//! a simulated reboot: SIGKILL the node's agent (the power goes), take the
//! node away from kwok and mark it NotReady with a new boot ID, keep it down
//! for a moment, give it back to kwok (Ready, new boot ID kept), clear the
//! host's tmpfs sentinel, and restart the agent.
//!
//! [`Watcher`] watches the test's nodes and every NodeMaintenance on its
//! own and records, at every change in the order the writes happened, how
//! many nodes are unavailable (NotReady, cordoned or in a NodeMaintenance):
//! safety is asserted from what the API server showed, never from
//! nodekeeper's own status.
//!
//! The helpers at the end (policies, phases, events, "settled") are shared
//! by tests/reboot.rs and tests/reboot_chaos.rs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, Node};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::reboot::{RebootPhase, RebootPolicy, RebootPolicySpec};
use nodekeeper::runtime::Latch;
use serde_json::json;
use smol::stream::StreamExt;

use super::write_order::{Arrived, in_write_order, rv_of};
use super::{Agent, GROUP_LABEL, TestEnv, block_on, wait_for};

/// kwok manages nodes with this annotation; without it, a node is "off".
const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// Set a node's boot ID (status subresource), as a kubelet would report it.
pub async fn set_boot(client: &Client, node: &str, boot: &str) {
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": boot}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("setting the boot ID of {node}: {e}"));
}

/// The node's boot ID now.
pub async fn boot_of(client: &Client, node: &str) -> String {
    Api::<Node>::all(client.clone())
        .get(node)
        .await
        .ok()
        .and_then(|n| n.status?.node_info.map(|i| i.boot_id))
        .unwrap_or_default()
}

/// Simulated machines behind kwok nodes.
pub struct Fleet {
    pub client: Client,
    /// Per node: its host root (sentinel files) and marker file.
    dir: PathBuf,
    /// `run` arguments for a node's agent; `None`: no node agents.
    agent_args: Option<Vec<String>>,
    agents: Mutex<HashMap<String, Agent>>,
    /// How long a rebooting machine stays down.
    pub down: Mutex<Duration>,
    /// Reboots simulated per node, and the boot IDs given.
    pub reboots: Mutex<BTreeMap<String, u32>>,
    /// A node whose next reboot never comes back (it stays NotReady).
    pub lost: Mutex<BTreeSet<String>>,
    /// Binary, kubeconfig and log filter agents run with (the benchmark
    /// sets them); `None`: the test defaults.
    pub agent_env: Option<(PathBuf, PathBuf, String)>,
    /// Node agents authenticate as `nodekeeper-agent` with a token bound to
    /// their Node (`host-kubeconfig`), as host modes do in production: what
    /// they may do is then exactly the generated RBAC and the own-node
    /// admission policy.
    pub node_identity: std::sync::atomic::AtomicBool,
    /// The test makes the API server refuse the agents on purpose (see
    /// [`Agent::expect_refusals`]).
    pub refusals_expected: std::sync::atomic::AtomicBool,
    kubeconfigs: Mutex<HashMap<String, PathBuf>>,
    /// Logs of agents killed so far, per node.
    past_logs: Mutex<BTreeMap<String, String>>,
    /// Reboot commands already served, per node, across calls of
    /// [`Fleet::serve`].
    served: Mutex<HashMap<String, u32>>,
}

impl Fleet {
    /// `agent_args`: extra `run` arguments for node agents (`--node` and
    /// `--host-root` are added), or `None` for a cluster role alone.
    pub fn new(client: Client, agent_args: Option<&[&str]>) -> Arc<Fleet> {
        Fleet::new_with(client, agent_args, Duration::from_millis(700), None)
    }

    /// [`Fleet::new`] whose agents run as the shipped node identity (each
    /// token bound to its Node, so the own-node policies apply as in a
    /// cluster), with no metrics port.
    pub fn confined(client: Client) -> Arc<Fleet> {
        let fleet = Fleet::new(client, Some(&["--metrics-address", "off"]));
        fleet
            .node_identity
            .store(true, std::sync::atomic::Ordering::SeqCst);
        fleet
    }

    /// [`Fleet::new`] with the reboot's length and the agents' binary,
    /// kubeconfig and log filter.
    pub fn new_with(
        client: Client,
        agent_args: Option<&[&str]>,
        down: Duration,
        agent_env: Option<(PathBuf, PathBuf, String)>,
    ) -> Arc<Fleet> {
        let dir = super::scratch().join(format!("nk-fleet-{:x}", super::rand_u64()));
        std::fs::create_dir_all(&dir).expect("creating the fleet dir");
        Arc::new(Fleet {
            client,
            dir,
            agent_args: agent_args.map(|a| a.iter().map(|s| s.to_string()).collect()),
            agents: Mutex::default(),
            down: Mutex::new(down),
            reboots: Mutex::default(),
            lost: Mutex::default(),
            agent_env,
            node_identity: std::sync::atomic::AtomicBool::new(false),
            refusals_expected: std::sync::atomic::AtomicBool::new(false),
            kubeconfigs: Mutex::default(),
            past_logs: Mutex::default(),
            served: Mutex::default(),
        })
    }

    /// The reboot command for the policy: appends a line to the node's
    /// marker file (the node name only ever travels as an argument).
    pub fn reboot_command(&self) -> Vec<String> {
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo reboot >> \"$0\"".into(),
            self.dir.join("{node}.reboots").display().to_string(),
        ]
    }

    /// A file of the fleet's own, e.g. a node's marker file.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Where a node's agent finds Talos's machine API (`run
    /// --talos-socket`): a stand-in machined serves it in the Talos tests
    /// (tests/talos/machined.py); nothing listens there otherwise.
    pub fn talos_socket(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.machined.sock"))
    }

    /// The OS image a machine's disk holds, reported as its node's
    /// `status.nodeInfo.osImage` from its next boot on (absent: kwok's
    /// default). An installer (the stand-in machined's upgrade) writes it.
    pub fn os_image_file(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.os-image"))
    }

    /// The host root a node's agent reads sentinels under.
    pub fn host_root(&self, node: &str) -> PathBuf {
        let root = self.dir.join(format!("{node}.root"));
        let _ = std::fs::create_dir_all(root.join("var/run"));
        root
    }

    /// Create the node's sentinel file, as a package manager would.
    pub fn require_reboot(&self, node: &str) {
        std::fs::write(self.host_root(node).join("var/run/reboot-required"), "")
            .expect("writing a sentinel");
    }

    /// Times the reboot command ran for `node`.
    pub fn commands(&self, node: &str) -> u32 {
        std::fs::read_to_string(self.dir.join(format!("{node}.reboots")))
            .map(|s| s.lines().count() as u32)
            .unwrap_or(0)
    }

    pub fn start_agent(&self, node: &str) {
        let Some(extra) = &self.agent_args else {
            return;
        };
        let root = self.host_root(node).display().to_string();
        let talos = self.talos_socket(node).display().to_string();
        // The host's command records outlive its agent, as /run does on a
        // host: an agent restarted mid-command attaches to the run its
        // predecessor started instead of starting another (per start, a
        // restart that won the race against the result ran it again).
        let records = self.file(&format!("{node}.records")).display().to_string();
        let mut args = vec![
            "run",
            "--node",
            node,
            "--host-root",
            &root,
            "--talos-socket",
            &talos,
            "--command-records",
            &records,
        ];
        let kubeconfig = if self.node_identity.load(std::sync::atomic::Ordering::SeqCst) {
            let mut cached = self.kubeconfigs.lock().unwrap();
            let path = cached
                .entry(node.to_string())
                .or_insert_with(|| super::host_kubeconfig(node))
                .display()
                .to_string();
            Some(path)
        } else {
            None
        };
        if let Some(kc) = &kubeconfig {
            args.extend(["--kubeconfig", kc.as_str()]);
        }
        args.extend(extra.iter().map(String::as_str));
        let mut agent = match &self.agent_env {
            Some((bin, kc, log)) => Agent::start_with(bin, kc, log, &args),
            None => Agent::start(&args),
        };
        agent.refusals_expected = self
            .refusals_expected
            .load(std::sync::atomic::Ordering::SeqCst);
        self.agents.lock().unwrap().insert(node.to_string(), agent);
    }

    /// SIGKILL a node's agent (the power goes, or a crash).
    pub fn kill_agent(&self, node: &str) {
        if let Some(mut a) = self.agents.lock().unwrap().remove(node) {
            let _ = a.child.kill();
            let _ = a.child.wait();
            self.keep_log(node, &a);
        }
    }

    /// Keep a stopped agent's log with the node's earlier ones.
    fn keep_log(&self, node: &str, a: &Agent) {
        self.past_logs
            .lock()
            .unwrap()
            .entry(node.to_string())
            .or_default()
            .push_str(&a.log_text());
    }

    /// SIGTERM a node's agent (it is stopped, as systemd or the kubelet
    /// stops it) and wait for it to exit; its exit status.
    pub fn stop_agent(&self, node: &str) -> Option<std::process::ExitStatus> {
        let mut a = self.agents.lock().unwrap().remove(node)?;
        a.signal("TERM");
        let status = a.wait_exit(Duration::from_secs(30));
        self.keep_log(node, &a);
        Some(status)
    }

    /// The process ID of a node's agent.
    pub fn agent_pid(&self, node: &str) -> Option<u32> {
        self.agents.lock().unwrap().get(node).map(|a| a.child.id())
    }

    /// The log of the node's running agent only.
    pub fn current_log(&self, node: &str) -> String {
        self.agents
            .lock()
            .unwrap()
            .get(node)
            .map(|a| a.log_text())
            .unwrap_or_default()
    }

    /// Every node's agent logs (past and running), headed by the node's
    /// name: what a timed-out test prints beside the cluster role's.
    pub fn logs(&self) -> String {
        let mut nodes: BTreeSet<String> = self.past_logs.lock().unwrap().keys().cloned().collect();
        nodes.extend(self.agents.lock().unwrap().keys().cloned());
        nodes
            .iter()
            .map(|n| format!("--- agent of {n}:\n{}", self.agent_log(n)))
            .collect()
    }

    /// The logs of every agent this node had, oldest first.
    pub fn agent_log(&self, node: &str) -> String {
        let past = self
            .past_logs
            .lock()
            .unwrap()
            .get(node)
            .cloned()
            .unwrap_or_default();
        let now = self
            .agents
            .lock()
            .unwrap()
            .get(node)
            .map(|a| a.log_text())
            .unwrap_or_default();
        past + &now
    }

    /// Power a machine off: kwok lets go of its node, which reports
    /// NotReady (with `boot` as its next boot ID, if given).
    pub async fn power_off_with(&self, node: &str, boot: Option<&str>) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {KWOK_ANNOTATION: null}}})),
            )
            .await
            .unwrap_or_else(|e| panic!("taking {node} from kwok: {e}"));
        let mut status = json!({"conditions": [{
            "type": "Ready", "status": "False", "reason": "PoweredOff",
            "message": "simulated machine is off", "lastHeartbeatTime": now(),
            "lastTransitionTime": now()}]});
        if let Some(b) = boot {
            status["nodeInfo"] = json!({"bootID": b});
            if let Ok(os) = std::fs::read_to_string(self.os_image_file(node)) {
                status["nodeInfo"]["osImage"] = json!(os.trim());
            }
        }
        nodes
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("marking {node} NotReady: {e}"));
    }

    pub async fn power_off(&self, node: &str) {
        self.power_off_with(node, None).await
    }

    /// Power a machine on: kwok takes its node back and reports it Ready.
    pub async fn power_on(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {KWOK_ANNOTATION: "fake"}}})),
            )
            .await
            .unwrap_or_else(|e| panic!("giving {node} back to kwok: {e}"));
        wait_for(
            &format!("{node} Ready again"),
            Duration::from_secs(30),
            || async {
                let n = nodes.get(node).await.ok()?;
                let ready = n
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            },
        )
        .await;
    }

    /// One simulated reboot of `node`: the agent dies with the power, the
    /// machine is down for [`Fleet::down`] and comes back with a new boot
    /// ID, the tmpfs sentinel gone, and its agent started again.
    pub async fn reboot(&self, node: &str) {
        self.kill_agent(node);
        let _ = std::fs::remove_file(self.host_root(node).join("var/run/reboot-required"));
        let n = {
            let mut r = self.reboots.lock().unwrap();
            let c = r.entry(node.to_string()).or_default();
            *c += 1;
            *c
        };
        self.power_off_with(node, Some(&format!("boot-{n}-{node}")))
            .await;
        if self.lost.lock().unwrap().contains(node) {
            return;
        }
        let down = *self.down.lock().unwrap();
        nodekeeper::runtime::sleep(down).await;
        self.power_on(node).await;
        self.start_agent(node);
    }

    /// Serve reboot commands until `done` says so (checked between polls),
    /// or panic after `limit`. Each reboot runs on its own thread, so
    /// several machines reboot at once as they would.
    pub fn serve(self: &Arc<Self>, nodes: &[String], limit: Duration, done: impl Fn() -> bool) {
        self.serve_or_explain(nodes, limit, done, String::new)
    }

    /// [`Fleet::serve`], and past `limit` the panic says what `explain`
    /// tells of the world then (what the test's policy and objects show).
    pub fn serve_or_explain(
        self: &Arc<Self>,
        nodes: &[String],
        limit: Duration,
        done: impl Fn() -> bool,
        explain: impl Fn() -> String,
    ) {
        let start = Instant::now();
        let mut threads = Vec::new();
        loop {
            for n in nodes {
                let ran = self.commands(n);
                let mut served = self.served.lock().unwrap();
                let seen = served.entry(n.clone()).or_default();
                while *seen < ran {
                    *seen += 1;
                    let (fleet, node) = (self.clone(), n.clone());
                    threads.push(std::thread::spawn(move || block_on(fleet.reboot(&node))));
                }
            }
            if done() {
                break;
            }
            assert!(
                start.elapsed() < limit,
                "the reboots did not finish within {limit:?}\n{}",
                explain()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for t in threads {
            t.join().expect("a simulated reboot panicked");
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Records the number of unavailable nodes of a test group at every change,
/// in the order the writes happened (see [`super::write_order`]).
pub struct Watcher {
    stop: Latch,
    thread: Option<std::thread::JoinHandle<Arrived<Change>>>,
}

/// Each node's own state (`None`: available; else why not), and which node
/// each NodeMaintenance holds.
#[derive(Default)]
struct Seen {
    nodes: BTreeMap<String, Option<String>>,
    maintenances: BTreeMap<String, String>,
}

impl Seen {
    fn apply(&mut self, change: &Change) {
        match change {
            Change::Node(n, Some(state)) => {
                self.nodes.insert(n.clone(), state.clone());
            }
            Change::Node(n, None) => {
                self.nodes.remove(n);
            }
            Change::Maintenance(m, Some(node)) => {
                self.maintenances.insert(m.clone(), node.clone());
            }
            Change::Maintenance(m, None) => {
                self.maintenances.remove(m);
            }
        }
    }

    /// The unavailable nodes, each with why.
    fn down(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .filter_map(|(n, state)| {
                let mut why: Vec<String> = state.iter().cloned().collect();
                why.extend(
                    self.maintenances
                        .iter()
                        .filter(|(_, node)| *node == n)
                        .map(|(m, _)| format!("NodeMaintenance {m}")),
                );
                (!why.is_empty()).then(|| (n.clone(), why.join(" + ")))
            })
            .collect()
    }
}

/// NotReady or cordoned, as the budget counts it (a NodeMaintenance on the
/// node also counts; the watchers track those separately).
pub fn unavailable(n: &Node) -> bool {
    why_unavailable(n).is_some()
}

/// Why `n` is unavailable by its own state, or `None`.
fn why_unavailable(n: &Node) -> Option<String> {
    let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let ready = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let mut why = Vec::new();
    if cordoned {
        why.push("cordoned".to_string());
    }
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => why.push(format!(
            "Ready={} ({})",
            c.status,
            c.reason.as_deref().unwrap_or("no reason")
        )),
        None => why.push("no Ready condition".to_string()),
    }
    (!why.is_empty()).then(|| why.join(" + "))
}

/// What changed: a node's state (`None`: deleted), or which node a
/// NodeMaintenance holds (`None`: deleted).
enum Change {
    Node(String, Option<Option<String>>),
    Maintenance(String, Option<String>),
}

fn change<K: kube::Resource>(
    ev: watcher::Event<K>,
    f: impl Fn(&K) -> Change,
    gone: impl Fn(String) -> Change,
) -> Option<(Option<u64>, Change)> {
    let (o, c) = match ev {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let c = f(&o);
            (o, c)
        }
        watcher::Event::Delete(o) => {
            let c = gone(o.name_any());
            (o, c)
        }
        _ => return None,
    };
    Some((rv_of(&o), c))
}

impl Watcher {
    /// Watch the nodes labelled with `group` and every NodeMaintenance.
    pub fn start(client: Client, group: &str) -> Watcher {
        let stop = Latch::default();
        let (stop2, group) = (stop.clone(), group.to_string());
        let thread = std::thread::spawn(move || {
            block_on(async move {
                let mut recorded = Vec::new();
                let nodes = watcher(
                    Api::<Node>::all(client.clone()),
                    watcher::Config::default()
                        .list_semantic(watcher::ListSemantic::MostRecent)
                        .labels(&format!("{GROUP_LABEL}={group}")),
                )
                .filter_map(|e| {
                    change(
                        e.ok()?,
                        |n: &Node| Change::Node(n.name_any(), Some(why_unavailable(n))),
                        |n| Change::Node(n, None),
                    )
                });
                let nms = watcher(
                    Api::<NodeMaintenance>::all(client),
                    watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent),
                )
                .filter_map(|e| {
                    change(
                        e.ok()?,
                        |m: &NodeMaintenance| {
                            Change::Maintenance(m.name_any(), Some(m.spec.node_name.clone()))
                        },
                        |m| Change::Maintenance(m, None),
                    )
                });
                let mut changes = std::pin::pin!(smol::stream::or(nodes, nms));
                let run = async {
                    while let Some(r) = changes.next().await {
                        recorded.push(r);
                    }
                };
                smol::future::or(run, stop2.wait()).await;
                recorded
            })
        });
        Watcher {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop; every distinct unavailable set, in the order the writes
    /// happened, with its size. The whole timeline, each node with why it
    /// was unavailable, goes to the test's output (shown when it fails).
    pub fn finish(mut self) -> Vec<(usize, String)> {
        self.stop.open();
        let arrived = self
            .thread
            .take()
            .map(|t| t.join().expect("the watcher panicked"))
            .unwrap_or_default();
        let arrival: Vec<(Option<u64>, &Change)> = arrived.iter().map(|(rv, c)| (*rv, c)).collect();
        let (in_arrival_order, _) = history(&arrival);
        let recorded: Vec<(Option<u64>, &Change)> = in_write_order(arrival)
            .into_iter()
            .map(|(rv, c)| (Some(rv), c))
            .collect();
        let (history, timeline) = history(&recorded);
        eprintln!("watcher: unavailable nodes in resourceVersion order:\n{timeline}");
        let peak = |h: &[(usize, String)]| h.iter().map(|h| h.0).max().unwrap_or(0);
        if peak(&in_arrival_order) != peak(&history) {
            eprintln!(
                "watcher: the watches ran apart: peak {} in arrival order, {} in write order",
                peak(&in_arrival_order),
                peak(&history)
            );
        }
        history
    }
}

/// Every distinct unavailable set after each of `recorded` in turn, and a
/// timeline that says why each node was unavailable.
fn history(recorded: &[(Option<u64>, &Change)]) -> (Vec<(usize, String)>, String) {
    let mut seen = Seen::default();
    let mut history: Vec<(usize, String)> = Vec::new();
    let mut timeline = String::new();
    for (rv, change) in recorded {
        seen.apply(change);
        let down = seen.down();
        let names: Vec<&str> = down.iter().map(|(n, _)| n.as_str()).collect();
        let names = names.join(",");
        if history.last().map(|h| &h.1) != Some(&names) {
            history.push((down.len(), names));
            let why: Vec<String> = down.iter().map(|(n, w)| format!("{n}: {w}")).collect();
            timeline.push_str(&format!(
                "  rv {}: {} down [{}]\n",
                rv.map_or("?".into(), |v| v.to_string()),
                down.len(),
                why.join("; ")
            ));
        }
    }
    (history, timeline)
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.open();
    }
}

// ---- reboot-test helpers ------------------------------------------------

pub const LONG: Duration = Duration::from_secs(60);

pub async fn annotate(client: &Client, node: &str, key: &str, value: Option<&str>) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating {node}: {e}"));
}

/// Wait until the policy reports `node` in `phase` (progress, not safety:
/// safety is the watcher's), returning its message.
pub async fn wait_phase(client: &Client, policy: &str, node: &str, phase: RebootPhase) -> String {
    let api: Api<RebootPolicy> = Api::all(client.clone());
    wait_for(&format!("{node} {phase:?} in {policy}"), LONG, || async {
        let p = api.get(policy).await.ok()?;
        let e = p.entry(node)?;
        (e.phase == phase).then(|| e.message.clone().unwrap_or_default())
    })
    .await
}

pub async fn maintenances_on(client: &Client, node: &str) -> usize {
    Api::<NodeMaintenance>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().filter(|m| m.spec.node_name == node).count())
        .unwrap_or(0)
}

pub async fn events_for(client: &Client, name: &str, reason: &str) -> usize {
    let api: Api<CoreEvent> = Api::all(client.clone());
    api.list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .count()
        })
        .unwrap_or(0)
}

/// A policy over the test's nodes: `spec` is merged over the selector and
/// the fleet's reboot command.
pub async fn create_policy(env: &TestEnv, fleet: &Fleet, spec: serde_json::Value) -> String {
    let mut full = json!({
        "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
        "reboot": {"command": fleet.reboot_command(), "remoteCommand": fleet.reboot_command()},
        "detect": {"periodSeconds": 5},
    });
    merge(&mut full, spec);
    let spec: RebootPolicySpec = serde_json::from_value(full).expect("a policy spec");
    let p = RebootPolicy::new(&env.id, spec);
    Api::<RebootPolicy>::all(env.client.clone())
        .create(&PostParams::default(), &p)
        .await
        .expect("creating the RebootPolicy");
    env.id.clone()
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// `count` Ready nodes with boot IDs `boot-0-<node>`. Each is power-cycled
/// once to get its first boot ID: kwok renders a node's status from the
/// node as it is when it takes it back, so the boot ID sticks, where a
/// write racing kwok's first report could be overwritten with its empty
/// default. (kwok only takes up nodes that carry its annotation when
/// created, so nodes are created managed.) A status report kwok had in
/// flight when its annotation went can still land after ours (seen once in
/// a benchmark's set-up: the boot ID back to ""), so the cycle is repeated,
/// a few times at most, until the boot ID stays.
pub async fn nodes(env: &mut TestEnv, count: usize) -> Vec<String> {
    const TRIES: usize = 5;
    let mut names = Vec::new();
    for i in 0..count {
        names.push(env.add_node(&format!("n{i:02}")).await);
    }
    let fleet = Fleet::new(env.client.clone(), None);
    for n in &names {
        env.wait_node_ready(n).await;
        let boot = format!("boot-0-{n}");
        let mut seen = Vec::new();
        for _ in 0..TRIES {
            fleet.power_off_with(n, Some(&boot)).await;
            fleet.power_on(n).await;
            let now = boot_of(&env.client, n).await;
            if now == boot {
                break;
            }
            seen.push(now);
        }
        assert!(
            seen.len() < TRIES,
            "kwok did not keep {n}'s boot ID {boot:?} in {TRIES} power cycles (it read {seen:?})"
        );
    }
    names
}

/// Every node of the group rebooted, schedulable, free of maintenance.
pub async fn settled(client: &Client, names: &[String]) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    for n in names {
        let Ok(node) = nodes.get(n).await else {
            return false;
        };
        // Rebooted: a boot ID the fleet gave (boot-1-…), not the first one,
        // and not an empty one from a failed read.
        let boot = boot_of(client, n).await;
        if node.spec.and_then(|s| s.unschedulable) == Some(true)
            || !boot.starts_with("boot-")
            || boot.starts_with("boot-0-")
        {
            return false;
        }
    }
    let nms = Api::<NodeMaintenance>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    !nms.iter().any(|m| names.contains(&m.spec.node_name))
}

/// `run` arguments of a cluster role for the test's nodes (pool = the
/// test's group label, leader Lease in its namespace), plus `extra`.
pub fn cluster_role_args(env: &TestEnv, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--all-nodes", "--node-selector"]
        .map(String::from)
        .to_vec();
    args.push(format!("{GROUP_LABEL}={}", env.id));
    args.extend(["--leader-namespace".to_string(), env.ns.clone()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

pub fn cluster_role(env: &TestEnv, extra: &[&str]) -> Agent {
    let args = cluster_role_args(env, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Agent::start(&args)
}

/// An agent's log (or journal) shows no request the API server refused it.
pub fn assert_refused_nothing(who: &str, log: &str) {
    assert!(
        !log.contains("forbidden") && !log.contains("denied"),
        "{who} was refused something:\n{log}"
    );
}
