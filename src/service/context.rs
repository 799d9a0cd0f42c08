//! The shared state of the one loop: the stores it reads, the interpreter
//! it acts through, and what it remembers between reconciles — per node
//! ([`NodeMemory`]), per foreign object, and our writes the watches have not
//! delivered yet. Everything here may be lost on restart at the cost of a
//! repeated request; it is pruned when nodes and objects go.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::node::Node;
use crate::api::pod::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::failing::Failing;
use super::passes::Kick;
use super::roles::Scope;
use super::stores::{Fresh, Stores, Synced};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::api::upgrade::UpgradePlan;
use crate::decide::foreign::LastCheck;
use crate::decide::{NodeMemory, Outcome};
use crate::effects::Interpreter;

/// The node role's last look at its host's reboot signals.
#[derive(Debug, Clone)]
pub struct HostSignal {
    pub at: k8s_openapi::jiff::Timestamp,
    /// `None`: the look failed (the error was logged).
    pub needed: Option<bool>,
    /// Why the look failed, in one line (recorded on the node).
    pub error: Option<String>,
}

/// Shared state of the one loop.
pub struct Context {
    pub effects: Interpreter,
    pub scope: Scope,
    pub nodes: Store<Node>,
    /// The pods this process acts on (`pod_watches.rs`).
    pub pods: Arc<super::pod_watches::PodWatches>,
    pub maintenances: Store<NodeMaintenance>,
    pub policies: Store<RebootPolicy>,
    pub plans: Store<UpgradePlan>,
    /// DrainRules as served (parsed by [`super::drain_rules`]).
    pub drain_rules: Store<kube::api::DynamicObject>,
    /// Namespace labels read for DrainRules' namespace selectors.
    pub namespace_labels: super::drain_rules::NamespaceLabels,
    /// Cluster role: hook Jobs (empty in the node role).
    pub jobs: Store<kube::api::DynamicObject>,
    /// Cluster role: Jobs the API server refused to create, by
    /// `namespace/name`: the object that planned it (`Kind/name`, kept
    /// while it exists) and why (its decision reports them as failures).
    job_errors: Mutex<HashMap<String, (String, String)>>,
    /// Node role: the upgrade command running in the background, if any
    /// (its token), so a reconcile never starts a second one.
    pub upgrade_running: Mutex<Option<String>>,
    pub synced: Synced,
    /// The agent's default drain deadline (`--drain-timeout`).
    pub drain_timeout: Duration,
    /// Cluster role only: node agents run on the nodes, so this process
    /// admits but neither drains nor reboots (`--node-agents`).
    pub node_agents: bool,
    /// Node role: where the host's file system is (`--host-root`).
    pub host_root: crate::effects::host::HostRoot,
    /// Node role: the host's reboot signal at its last look.
    pub host_signal: Mutex<Option<HostSignal>>,
    /// A look at the host's reboot signals is running (in the background:
    /// a sentinel command that hangs must not hold the node's reconcile).
    pub host_look_running: std::sync::atomic::AtomicBool,
    /// Cluster role: objects whose last decision failed (see `cluster.rs`).
    pub failing: Failing,
    /// Asks for a reconcile of the anchor node (NodeMaintenances no agent
    /// owns), so work found outside the controller stays inside its
    /// one-reconcile-per-node rule.
    pub anchor: Kick,
    fresh: Arc<Fresh>,
    arrivals: Arc<super::stores::Arrivals>,
    memory: Mutex<HashMap<String, NodeMemory>>,
    /// The last summary logged per node, so the log shows changes only.
    seen: Mutex<HashMap<String, String>>,
    /// Per foreign NodeMaintenance (node role): the last look at its node.
    foreign_checked: Mutex<HashMap<String, LastCheck>>,
    /// Node role: this process's claim on its node (`decide::claim`): who
    /// it is, and what it knows of the claim.
    pub agent: Mutex<(String, crate::decide::claim::Claim)>,
    /// Cluster role: Prometheus's answers for the features' alert gates.
    pub alerts: super::alerts::AlertCache,
    /// Cluster role: the health gates' workloads, listed while a node
    /// waits on one.
    pub health: super::health::HealthCache,
    /// Cluster role: the objects' notifications, delivered in the
    /// background.
    pub notify: super::notifier::Notifier,
    /// Cluster role: the UpgradePlans' channels, asked in the background.
    pub channels: super::channels::Channels,
    /// Cluster role: nodes whose `MaintenancePlanned` write was refused,
    /// and until when none is tried again (see `planned.rs`).
    pub planned_refused: Mutex<HashMap<String, Instant>>,
    /// Which pods of a drained node another node could run
    /// (`service::elsewhere`).
    pub homes: HomesCache,
    /// Where this process runs (`service::own_node`): a cluster role
    /// never takes its own node without a replica elsewhere.
    pub whereabouts: Whereabouts,
}

use crate::runtime::lock;

/// How this process names itself in its node claim: its pod (or host),
/// PID and start, so the other agent's warning says which one to stop.
fn agent_name() -> String {
    let who = std::env::var("POD_NAME")
        .ok()
        .filter(|p| !p.is_empty())
        .map(|p| format!("pod {p}"))
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("host {}", host.trim())
        });
    format!(
        "{who}, pid {}, started {}",
        std::process::id(),
        jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_else(|_| jiff::Timestamp::now())
    )
}

impl Context {
    pub fn new(
        effects: Interpreter,
        scope: Scope,
        stores: Stores,
        drain_timeout: Duration,
        node_agents: bool,
        host_root: crate::effects::host::HostRoot,
        anchor: Kick,
    ) -> Context {
        Context {
            effects,
            scope,
            nodes: stores.nodes,
            pods: stores.pods,
            maintenances: stores.maintenances,
            policies: stores.policies,
            plans: stores.plans,
            drain_rules: stores.drain_rules,
            namespace_labels: Default::default(),
            jobs: stores.jobs,
            job_errors: Mutex::default(),
            upgrade_running: Mutex::default(),
            synced: stores.synced,
            drain_timeout,
            node_agents,
            host_root,
            host_signal: Mutex::default(),
            host_look_running: std::sync::atomic::AtomicBool::new(false),
            failing: Failing::default(),
            anchor,
            alerts: Default::default(),
            health: Default::default(),
            notify: Default::default(),
            channels: Default::default(),
            planned_refused: Default::default(),
            homes: Default::default(),
            whereabouts: Whereabouts::from_env(),
            fresh: stores.fresh,
            arrivals: stores.arrivals,
            memory: Mutex::default(),
            seen: Mutex::default(),
            foreign_checked: Mutex::default(),
            agent: Mutex::new((agent_name(), Default::default())),
        }
    }

    pub fn owns(&self, node: &str) -> bool {
        match &self.scope {
            Scope::Node(n) => n == node,
            Scope::AllNodes { .. } => self.node(node).is_some(),
        }
    }

    /// The node from the store, or our newer write of it.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.fresh
            .nodes
            .fresher(name, self.nodes.get(&ObjectRef::new(name)))
    }

    /// Every NodeMaintenance for `node`, each in its newest known version,
    /// in the order the API server stored them: by creation time, and
    /// within one second by the order the watch delivered them.
    pub fn maintenances_for(&self, node: &str) -> Vec<Arc<NodeMaintenance>> {
        let mut nms: Vec<Arc<NodeMaintenance>> = self
            .maintenances
            .state()
            .into_iter()
            .filter(|m| m.spec.node_name == node)
            .filter_map(|m| self.fresh.maintenances.fresher(&m.name_any(), Some(m)))
            .filter(|m| !(m.is_deleting() && m.finalizers().is_empty()))
            .collect();
        nms.sort_by_cached_key(|m| {
            (
                m.metadata.creation_timestamp.as_ref().map(|t| t.0),
                self.arrivals.of(m.metadata.uid.as_deref()),
                m.name_any(),
            )
        });
        nms
    }

    /// Every RebootPolicy, each in its newest known version.
    pub fn policies(&self) -> Vec<Arc<RebootPolicy>> {
        self.policies
            .state()
            .into_iter()
            .filter_map(|p| self.fresh.policies.fresher(&p.name_any(), Some(p)))
            .collect()
    }

    /// Every UpgradePlan, each in its newest known version.
    pub fn plans(&self) -> Vec<Arc<UpgradePlan>> {
        self.plans
            .state()
            .into_iter()
            .filter_map(|p| self.fresh.plans.fresher(&p.name_any(), Some(p)))
            .collect()
    }

    /// Our Jobs' states by `namespace/name`.
    pub fn jobs_by_key(&self) -> HashMap<String, crate::decide::jobs::JobState> {
        self.jobs
            .state()
            .into_iter()
            .map(|j| {
                (
                    crate::decide::jobs::key(&j),
                    crate::decide::jobs::state(&j.data),
                )
            })
            .collect()
    }

    /// Jobs the API server refused to create, by `namespace/name`: why.
    pub fn job_errors(&self) -> HashMap<String, String> {
        lock(&self.job_errors)
            .iter()
            .map(|(k, (_, why))| (k.clone(), why.clone()))
            .collect()
    }

    /// Remember that the Job `key` that `owner` (`Kind/name`) planned was
    /// refused, for as long as `owner` exists.
    pub fn set_job_error(&self, key: String, owner: String, why: String) {
        lock(&self.job_errors).insert(key, (owner, why));
    }

    /// Node role: claim the background upgrade slot for `token`; false if
    /// a command is already running.
    pub fn claim_upgrade(&self, token: &str) -> bool {
        let mut running = lock(&self.upgrade_running);
        if running.is_some() {
            return false;
        }
        *running = Some(token.to_string());
        true
    }

    pub fn release_upgrade(&self) {
        *lock(&self.upgrade_running) = None;
    }

    /// Every NodeMaintenance, each in its newest known version.
    pub fn all_maintenances(&self) -> Vec<Arc<NodeMaintenance>> {
        let stored = self.maintenances.state();
        let names: std::collections::HashSet<String> =
            stored.iter().map(|m| m.name_any()).collect();
        let mut all: Vec<Arc<NodeMaintenance>> = stored
            .into_iter()
            .filter_map(|m| self.fresh.maintenances.fresher(&m.name_any(), Some(m)))
            .collect();
        // Created by an earlier decision of this pass, not in the store yet:
        // the next policy or plan must count it (budgets, one owner).
        all.extend(self.fresh.maintenances.unseen(|n| names.contains(n)));
        all
    }

    /// Every node, each in its newest known version.
    pub fn all_nodes(&self) -> Vec<Arc<Node>> {
        self.nodes
            .state()
            .into_iter()
            .filter_map(|n| self.fresh.nodes.fresher(&n.name_any(), Some(n)))
            .collect()
    }

    /// The pods on `node` a blocking-pod gate reads (see
    /// `PodWatches::gate_pods_on`).
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.pods.gate_pods_on(node)
    }

    /// What we remember of `node`, without attempts for pods that are gone.
    pub fn memory(&self, node: &str, pods: &[Arc<Pod>]) -> NodeMemory {
        let live: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let mut mem = lock(&self.memory);
        let m = mem.entry(node.to_string()).or_default();
        m.forget_pods_except(&live);
        m.clone()
    }

    /// Remember that we may hold `node`'s medik8s lease (found at start):
    /// its renewal is due, so the next pass renews or releases it.
    pub fn remember_lease(&self, node: &str, now: k8s_openapi::jiff::Timestamp) {
        lock(&self.memory)
            .entry(node.to_string())
            .or_default()
            .lease_renew_at
            .get_or_insert(now);
    }

    /// What we remember of `node`, pruned of nothing (its pods are not
    /// known yet).
    pub fn memory_as_is(&self, node: &str) -> NodeMemory {
        lock(&self.memory).get(node).cloned().unwrap_or_default()
    }

    /// Fold an effect's outcome into what we remember: the node's memory
    /// (policy in `decide`), and our writes into the mutation cache.
    pub fn record(
        &self,
        node: &str,
        effect: &crate::decide::Effect,
        outcome: &Outcome,
        now: k8s_openapi::jiff::Timestamp,
    ) {
        self.remember(outcome);
        if let (crate::decide::Effect::Drain { pods, .. }, Outcome::Drained(removals)) =
            (effect, outcome)
        {
            super::metrics::count_removals(pods, removals)
        }
        lock(&self.memory)
            .entry(node.to_string())
            .or_default()
            .record(effect, outcome, now);
    }

    /// Keep the server's answer to one of our writes until the watch
    /// delivers it.
    /// [`Context::remember`], and an object we created is read as
    /// existing until the store shows it (the executor calls this).
    pub fn remember_effect(&self, effect: &crate::decide::Effect, outcome: &Outcome) {
        if let (crate::decide::Effect::CreateMaintenance { .. }, Outcome::MaintenanceWritten(m)) =
            (effect, outcome)
        {
            self.fresh.maintenances.remember_created((**m).clone());
        }
        self.remember(outcome);
    }

    /// A write whose answer was lost but that may have happened: a
    /// NodeMaintenance's create is read as existing until the store shows
    /// it or [`super::fresh`]'s while passes; a lease taken so is held as
    /// far as the node's memory knows ([`crate::decide::NodeMemory::unanswered`]).
    pub fn remember_unanswered(&self, effect: &crate::decide::Effect) {
        match effect {
            crate::decide::Effect::CreateMaintenance { nm } => {
                self.fresh.maintenances.remember_created((**nm).clone())
            }
            crate::decide::Effect::TakeLease { node, .. } => lock(&self.memory)
                .entry(node.clone())
                .or_default()
                .unanswered(effect, k8s_openapi::jiff::Timestamp::now()),
            _ => {}
        }
    }

    pub fn remember(&self, outcome: &Outcome) {
        match outcome {
            Outcome::NodeWritten(n) => self.fresh.nodes.remember((**n).clone()),
            Outcome::MaintenanceWritten(m) => self.fresh.maintenances.remember((**m).clone()),
            Outcome::MaintenanceGone {
                name,
                resource_version,
            } => self
                .fresh
                .maintenances
                .bury(name, resource_version.as_deref()),
            Outcome::PolicyWritten(p) => self.fresh.policies.remember((**p).clone()),
            Outcome::UpgradePlanWritten(p) => self.fresh.plans.remember((**p).clone()),
            _ => {}
        }
    }

    /// Log a one-line summary of the node when it changed.
    pub fn log_if_changed(&self, node: &str, summary: String) -> bool {
        lock(&self.seen).insert(node.to_string(), summary.clone()) != Some(summary)
    }

    pub fn last_check(&self, nm: &str) -> Option<LastCheck> {
        lock(&self.foreign_checked).get(nm).copied()
    }

    pub fn set_last_check(&self, nm: String, check: LastCheck) {
        lock(&self.foreign_checked).insert(nm, check);
    }

    /// Forget what we keep per node and per object for nodes and objects
    /// that are gone, so a cluster that replaces nodes does not grow our
    /// memory (run on the anchor's reconciles, at least every heartbeat).
    pub fn prune(&self) {
        let node_exists = |n: &str| self.nodes.get(&ObjectRef::new(n)).is_some();
        let nm_exists = |n: &str| self.maintenances.get(&ObjectRef::new(n)).is_some();
        // Memory for a missing node is kept while an object still names it
        // (its finalizer is being finished); then it goes.
        let named: HashSet<String> = self
            .maintenances
            .state()
            .iter()
            .map(|m| m.spec.node_name.clone())
            .collect();
        lock(&self.memory).retain(|n, _| node_exists(n) || named.contains(n));
        lock(&self.seen).retain(|n, _| node_exists(n));
        lock(&self.foreign_checked).retain(|n, _| nm_exists(n));
        self.fresh.nodes.retain(node_exists);
        self.fresh.maintenances.retain(nm_exists);
        let uids: HashSet<String> = self
            .maintenances
            .state()
            .iter()
            .filter_map(|m| m.metadata.uid.clone())
            .collect();
        self.arrivals.retain(|uid| uids.contains(uid));
        let policy_exists = |n: &str| self.policies.get(&ObjectRef::new(n)).is_some();
        self.fresh.policies.retain(policy_exists);
        let plan_exists = |n: &str| self.plans.get(&ObjectRef::new(n)).is_some();
        self.fresh.plans.retain(plan_exists);
    }

    /// Forget the cluster role's per-object memory (failures, refused Jobs)
    /// of objects that are gone; `live` holds the `Kind/name` keys of every
    /// object the passes decide for. Run at the start of every pass.
    pub fn prune_cluster(&self, live: &HashSet<String>) {
        self.failing.retain(|k| live.contains(k));
        lock(&self.job_errors).retain(|_, (owner, _)| live.contains(owner));
        // The notifier's memory is by object UID: policies and plans only.
        let uids: Vec<String> = self
            .policies
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .chain(
                self.plans
                    .state()
                    .iter()
                    .filter_map(|p| p.metadata.uid.clone()),
            )
            .collect();
        self.notify.retain(&uids);
    }
}

/// How long an answer of `service::elsewhere` is used: a node that becomes
/// Ready or is uncordoned meanwhile is seen this much later.
const HOMES_KEPT: Duration = Duration::from_secs(30);

/// The answers of `service::elsewhere` kept, per node: which pods of a
/// drained node another node could run.
#[derive(Default)]
pub struct HomesCache(Mutex<HashMap<String, (Instant, crate::decide::elsewhere::Homes)>>);

impl HomesCache {
    /// The answer for `node`, if one is fresh.
    pub fn get(&self, node: &str) -> Option<crate::decide::elsewhere::Homes> {
        let cache = lock(&self.0);
        cache
            .get(node)
            .filter(|(at, _)| at.elapsed() < HOMES_KEPT)
            .map(|(_, h)| h.clone())
    }

    /// Forget `node` (it has no maintenance any more).
    pub fn forget(&self, node: &str) {
        lock(&self.0).remove(node);
    }

    pub fn add(
        &self,
        node: &str,
        new: crate::decide::elsewhere::Homes,
    ) -> crate::decide::elsewhere::Homes {
        let mut cache = lock(&self.0);
        let merged = match cache
            .remove(node)
            .filter(|(at, _)| at.elapsed() < HOMES_KEPT)
        {
            Some((at, mut old)) => {
                old.asked.extend(new.asked);
                old.homeless.extend(new.homeless);
                (at, old)
            }
            None => (Instant::now(), new),
        };
        let homes = merged.1.clone();
        cache.insert(node.to_string(), merged);
        homes
    }
}

/// Where this process runs, from the downward API: its node, and its pod
/// (name and namespace) when it is one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Whereabouts {
    pub node: Option<String>,
    pub pod: Option<(String, String)>,
}

impl Whereabouts {
    /// From `$NODE_NAME`, `$POD_NAMESPACE` and `$POD_NAME`.
    pub fn from_env() -> Whereabouts {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Whereabouts {
            node: var("NODE_NAME"),
            pod: var("POD_NAMESPACE").zip(var("POD_NAME")),
        }
    }
}
