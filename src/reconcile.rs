//! The reconciler: for one node, gather a snapshot from the reflector stores,
//! ask `decide` for the next step, perform it, and repeat until the decision
//! is to wait. Each step is one small, idempotent API write; everything
//! needed to resume lives in the API server (status, node annotations, the
//! lease), so a crash between any two steps converges after restart.
//!
//! Our own writes are folded back through a mutation cache (as client-go's
//! `MutationCache`): the watch that reflects them may lag behind, and acting
//! on a stale store would repeat a step or trip over a 409.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::cli::is_node_name;
use crate::decide::{self, Announce, Attempt, Snapshot, Step};
use crate::error::{Error, Result};
use crate::evict::{self, Outcome};
use crate::fresh::FreshCache;
use crate::lease::{self, Acquired};
use crate::nodemaintenance::*;
use crate::runtime::Latch;

/// Which nodes this process reconciles.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// Node mode: exactly this node.
    Node(String),
    /// Cluster mode: every node (one leader-elected replica), or only those
    /// matching a label selector.
    AllNodes { selector: Option<String> },
}

impl Scope {
    /// Does our node store hold every node of the cluster, so that absence
    /// from it proves a node does not exist?
    fn sees_all_nodes(&self) -> bool {
        matches!(self, Scope::AllNodes { selector: None })
    }
}

/// What we remember per node between reconciles (lost on restart: harmless).
#[derive(Debug, Default, Clone)]
pub struct NodeMemory {
    pub attempts: HashMap<String, Attempt>,
    pub lease_renew_at: Option<Timestamp>,
}

/// Each watched kind's first full list, as latches any number of tasks may
/// wait on (see [`Latch`] for why not `Store::wait_until_ready`).
#[derive(Clone, Default)]
pub struct Synced {
    pub nodes: Latch,
    pub pods: Latch,
    pub maintenances: Latch,
}

impl Synced {
    pub async fn wait(&self) {
        self.nodes.wait().await;
        self.pods.wait().await;
        self.maintenances.wait().await;
    }
}

/// Our writes that the watches may not have delivered yet.
#[derive(Default)]
pub struct Fresh {
    pub nodes: FreshCache<Node>,
    pub maintenances: FreshCache<NodeMaintenance>,
}

/// The reflector stores the loop decides from.
pub struct Stores {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub maintenances: Store<NodeMaintenance>,
    pub synced: Synced,
    pub fresh: Arc<Fresh>,
}

/// When node mode last looked for a foreign object's node, and how many
/// looks in a row failed (for backoff).
#[derive(Debug, Clone, Copy)]
struct ForeignCheck {
    at: Timestamp,
    failures: u32,
}

/// Shared state of the one loop.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub scope: Scope,
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub maintenances: Store<NodeMaintenance>,
    pub drain_timeout: Duration,
    synced: Synced,
    fresh: Arc<Fresh>,
    memory: Mutex<HashMap<String, NodeMemory>>,
    /// The last summary logged per node, so the log shows changes only.
    seen: Mutex<HashMap<String, String>>,
    /// Per foreign NodeMaintenance (node mode): when we last checked whether
    /// its node exists, so a node that exists but runs no agent costs one
    /// GET a minute, and a failing check backs off instead of spinning.
    foreign_checked: Mutex<HashMap<String, ForeignCheck>>,
}

/// How long an object for a node we do not own may wait for that node's own
/// agent before we check whether the node exists at all (node mode only).
const FOREIGN_GRACE: Duration = Duration::from_secs(5);
/// Upper bound on steps per reconcile; the loop normally ends far sooner.
const MAX_STEPS: usize = 32;
/// Retry after a lease conflict, as NMO's requeue.
const LEASE_RETRY: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        scope: Scope,
        stores: Stores,
        drain_timeout: Duration,
    ) -> Context {
        Context {
            client,
            recorder,
            scope,
            nodes: stores.nodes,
            pods: stores.pods,
            maintenances: stores.maintenances,
            drain_timeout,
            synced: stores.synced,
            fresh: stores.fresh,
            memory: Mutex::default(),
            seen: Mutex::default(),
            foreign_checked: Mutex::default(),
        }
    }

    fn owns(&self, node: &str) -> bool {
        match &self.scope {
            Scope::Node(n) => n == node,
            Scope::AllNodes { .. } => self.node(node).is_some(),
        }
    }

    /// The node from the store, or our newer write of it.
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.fresh
            .nodes
            .fresher(name, self.nodes.get(&ObjectRef::new(name)))
    }

    fn remember_node(&self, node: Node) {
        self.fresh.nodes.remember(node);
    }

    /// Every NodeMaintenance for `node`, each in its newest known version.
    fn maintenances_for(&self, node: &str) -> Vec<Arc<NodeMaintenance>> {
        self.maintenances
            .state()
            .into_iter()
            .filter(|m| m.spec.node_name == node)
            .filter_map(|m| self.fresh.maintenances.fresher(&m.name_any(), Some(m)))
            .filter(|m| !(m.is_deleting() && m.finalizers().is_empty()))
            .collect()
    }

    fn remember_nm(&self, nm: NodeMaintenance) {
        self.fresh.maintenances.remember(nm);
    }

    fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .collect()
    }

    fn memory(&self, node: &str) -> NodeMemory {
        let mut mem = lock(&self.memory);
        let m = mem.entry(node.to_string()).or_default();
        // Forget pods that are gone so the map does not grow without bound.
        let live: std::collections::HashSet<String> = self
            .pods_on(node)
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        m.attempts.retain(|uid, _| live.contains(uid));
        m.clone()
    }

    fn update_memory(&self, node: &str, f: impl FnOnce(&mut NodeMemory)) {
        f(lock(&self.memory).entry(node.to_string()).or_default());
    }

    /// Forget what we keep per node and per object for nodes and objects
    /// that are gone, so a cluster that replaces nodes does not grow our
    /// memory (run on the anchor's reconciles, at least every heartbeat).
    fn prune(&self) {
        let node_exists = |n: &str| self.nodes.get(&ObjectRef::new(n)).is_some();
        let nm_exists = |n: &str| self.maintenances.get(&ObjectRef::new(n)).is_some();
        // Memory for a missing node is kept while an object still names it
        // (its finalizer is being finished); then it goes.
        let named: std::collections::HashSet<String> = self
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
    }

    async fn publish(
        &self,
        obj: &impl Resource<DynamicType = ()>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            log::warn!(
                "publishing event {reason}: {}",
                crate::error::kube_cause(&e)
            );
        }
    }
}

/// The controller's reconcile: the node itself, and, on the anchor node,
/// NodeMaintenances whose node has no agent (it does not exist).
pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    // Decisions on a half-filled store would count pods wrong: wait for the
    // first full list of every watched kind.
    ctx.synced.wait().await;
    crate::metrics::inc(&crate::metrics::COUNTERS.reconciles);
    let name = node.name_any();
    let summary = summarize(&node);
    if lock(&ctx.seen)
        .insert(name.clone(), summary.clone())
        .as_ref()
        != Some(&summary)
    {
        log::info!("node {name}: {summary}");
    }
    let mut wake = reconcile_node(&ctx, &name, true).await?;
    if is_anchor(&ctx, &name) {
        ctx.prune();
        wake = earliest(wake, reconcile_foreign(&ctx).await);
    }
    Ok(match wake {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    })
}

/// What an operator wants to see in the log about a node, in one line.
fn summarize(node: &Node) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
        .unwrap_or("Unknown");
    let spec = node.spec.as_ref();
    let schedulable = !spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let taints = spec
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    format!("ready={ready} schedulable={schedulable} taints=[{taints}]")
}

fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The node whose reconcile also looks after NodeMaintenances for nodes that
/// do not exist: our own node in node mode, the first node by name in
/// cluster mode.
pub fn is_anchor(ctx: &Context, node: &str) -> bool {
    anchor(&ctx.scope, &ctx.nodes).as_deref() == Some(node)
}

/// The anchor node's name, if there is one yet.
pub fn anchor(scope: &Scope, nodes: &Store<Node>) -> Option<String> {
    match scope {
        Scope::Node(n) => Some(n.clone()),
        Scope::AllNodes { .. } => nodes.state().iter().map(|n| n.name_any()).min(),
    }
}

/// Could this object be waiting for an agent that does not exist? Only one
/// that never started, or one being deleted that still has our finalizer:
/// a started maintenance has an owner, and if its Node goes, the garbage
/// collector deletes the object (owner reference), which is the second case.
pub fn needs_foreign_attention(nm: &NodeMaintenance) -> bool {
    if nm.is_deleting() {
        nm.has_finalizer()
    } else {
        nm.phase().is_none()
    }
}

/// NodeMaintenances for nodes we do not own. In node mode any agent may
/// fail or finish them once the node proves missing; writes carry the
/// resourceVersion, so of many agents exactly one succeeds. A failing check
/// backs off per object, with jitter, and never fails the own node's
/// reconcile: one bad object must not make every agent poll.
async fn reconcile_foreign(ctx: &Context) -> Option<Duration> {
    let now = Timestamp::now();
    let mut wake = None;
    let mut targets: Vec<String> = ctx
        .maintenances
        .state()
        .iter()
        .filter(|m| !ctx.owns(&m.spec.node_name) || ctx.node(&m.spec.node_name).is_none())
        .filter(|m| needs_foreign_attention(m))
        .filter_map(|m| {
            // A name no node can have needs no look-up: it fails at once.
            if ctx.scope.sees_all_nodes() || !is_node_name(&m.spec.node_name) {
                return Some(m.spec.node_name.clone());
            }
            // Give the node's own agent time to act before checking existence.
            let since = m
                .metadata
                .deletion_timestamp
                .as_ref()
                .or(m.metadata.creation_timestamp.as_ref())?
                .0;
            let mut due = since
                .checked_add(SignedDuration::try_from(FOREIGN_GRACE).ok()?)
                .ok()?;
            if let Some(last) = lock(&ctx.foreign_checked).get(&m.name_any()) {
                let seed = jitter_seed(&ctx.scope, &m.name_any(), last.failures);
                let again = decide::foreign_recheck(last.failures, seed);
                due = due.max(
                    last.at
                        .checked_add(SignedDuration::try_from(again).ok()?)
                        .ok()?,
                );
            }
            if due <= now {
                Some(m.spec.node_name.clone())
            } else {
                wake = earliest(wake, Some(duration_until(now, due)));
                None
            }
        })
        .collect();
    targets.sort();
    targets.dedup();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for target in targets {
        let exists = if ctx.scope.sees_all_nodes() {
            Ok(ctx.node(&target).is_some())
        } else if !is_node_name(&target) {
            Ok(false)
        } else {
            let found = nodes
                .get_opt(&target)
                .await
                .map(|n| n.is_some())
                .map_err(Error::kube(format!(
                    "checking whether node {target} exists"
                )));
            let mut checked = lock(&ctx.foreign_checked);
            for m in ctx.maintenances.state().iter() {
                if m.spec.node_name == target {
                    let failures = match (&found, checked.get(&m.name_any())) {
                        (Ok(_), _) => 0,
                        (Err(_), Some(c)) => c.failures.saturating_add(1),
                        (Err(_), None) => 1,
                    };
                    checked.insert(m.name_any(), ForeignCheck { at: now, failures });
                }
            }
            found
        };
        let result = match exists {
            Ok(false) => reconcile_node(ctx, &target, false).await,
            Ok(true) => Ok(None),
            Err(e) => Err(e),
        };
        match result {
            Ok(w) => wake = earliest(wake, w),
            Err(e) => {
                log::warn!("NodeMaintenance for node {target:?}: {e} (backing off)");
                wake = earliest(wake, Some(decide::foreign_recheck(1, 0)));
            }
        }
    }
    wake
}

/// Spreads the rechecks of many agents over time: each agent (by its node)
/// and object gets its own offset, so N agents do not GET in lockstep.
fn jitter_seed(scope: &Scope, object: &str, failures: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Scope::Node(n) = scope {
        n.hash(&mut h);
    }
    object.hash(&mut h);
    failures.hash(&mut h);
    h.finish()
}

fn duration_until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::from_millis(
        t.as_millisecond()
            .saturating_sub(now.as_millisecond())
            .max(0) as u64,
    )
}

/// Decide and act for one node until the decision is to wait.
async fn reconcile_node(
    ctx: &Context,
    node_name: &str,
    node_known: bool,
) -> Result<Option<Duration>> {
    for _ in 0..MAX_STEPS {
        let node = if node_known {
            ctx.node(node_name)
        } else {
            None
        };
        let nms = ctx.maintenances_for(node_name);
        let pods = if node_known {
            ctx.pods_on(node_name)
        } else {
            Vec::new()
        };
        let mem = ctx.memory(node_name);
        let step = decide::decide(&Snapshot {
            node_name,
            node: node.as_deref(),
            maintenances: nms.iter().map(|m| m.as_ref()).collect(),
            pods: &pods,
            attempts: &mem.attempts,
            lease_renew_at: mem.lease_renew_at,
            now: Timestamp::now(),
            drain_timeout: ctx.drain_timeout,
        });
        log::debug!("node {node_name}: {}", describe(&step));
        let nm = |name: &str| nms.iter().find(|m| m.name_any() == name).cloned();
        match perform(ctx, node_name, node.as_deref(), step, nm).await? {
            Flow::Continue => {}
            Flow::Wait(d) => return Ok(d),
        }
    }
    log::warn!(
        "node {node_name}: still busy after {MAX_STEPS} steps; continuing on the next reconcile"
    );
    Ok(Some(Duration::from_millis(100)))
}

fn describe(step: &Step) -> String {
    match step {
        Step::Drain { nm, pods } => format!("Drain {{ nm: {nm:?}, pods: {} }}", pods.len()),
        Step::Begin { nm, .. } => format!("Begin {{ nm: {nm:?} }}"),
        Step::WriteStatus { nm, announce, .. } => {
            format!("WriteStatus {{ nm: {nm:?}, announce: {announce:?} }}")
        }
        other => format!("{other:?}"),
    }
}

enum Flow {
    Continue,
    Wait(Option<Duration>),
}

async fn perform(
    ctx: &Context,
    node_name: &str,
    node: Option<&Node>,
    step: Step,
    nm: impl Fn(&str) -> Option<Arc<NodeMaintenance>>,
) -> Result<Flow> {
    let get = |name: &str| {
        nm(name)
            .ok_or_else(|| Error::Invalid(format!("NodeMaintenance {name} vanished mid-reconcile")))
    };
    match step {
        Step::Wait(d) => return Ok(Flow::Wait(d)),
        Step::Fail {
            nm,
            reason,
            message,
        } => {
            let m = get(&nm)?;
            let mut st = m.status.clone().unwrap_or_default();
            st.phase = Some(Phase::Failed);
            st.last_error = Some(message.clone());
            decide::set_condition(
                &mut st,
                Timestamp::now(),
                "Accepted",
                "False",
                reason,
                &message,
            );
            write_status(ctx, &m, st).await?;
            log::warn!("NodeMaintenance {nm}: {message}");
            ctx.publish(m.as_ref(), EventType::Warning, "FailedMaintenance", message)
                .await;
        }
        Step::AddFinalizer { nm } => {
            let m = get(&nm)?;
            let mut finalizers = m.finalizers().to_vec();
            finalizers.push(FINALIZER.into());
            let mut meta =
                json!({ "resourceVersion": m.resource_version(), "finalizers": finalizers });
            if let Some(n) = node {
                meta["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Node", "name": n.name_any(), "uid": n.uid(),
                }]);
            }
            patch_nm(ctx, &nm, json!({ "metadata": meta })).await?;
        }
        Step::Begin { nm, status } => {
            let m = get(&nm)?;
            write_status(ctx, &m, *status).await?;
            log::info!("NodeMaintenance {nm}: maintenance of node {node_name} begins");
            ctx.publish(
                m.as_ref(),
                EventType::Normal,
                "BeginMaintenance",
                format!("Begin a node maintenance of {node_name}"),
            )
            .await;
        }
        Step::AcquireLease { nm } => {
            let uid = node.and_then(|n| n.metadata.uid.clone());
            match lease::acquire_node_lease(&ctx.client, node_name, uid).await? {
                Acquired::Held { until } => {
                    let now = Timestamp::now();
                    let half = SignedDuration::from_millis(
                        (until.as_millisecond() - now.as_millisecond()) / 2,
                    );
                    ctx.update_memory(node_name, |m| m.lease_renew_at = now.checked_add(half).ok());
                }
                Acquired::HeldBy(holder) => {
                    let m = get(&nm)?;
                    let mut st = m.status.clone().unwrap_or_default();
                    let count = st.error_on_lease_count.unwrap_or(0) + 1;
                    st.error_on_lease_count = Some(count);
                    if count > MAX_LEASE_ERRORS {
                        let msg = format!(
                            "maintenance failed: lease could not be extended after {count} attempts"
                        );
                        st.phase = Some(Phase::Failed);
                        st.last_error = Some(msg.clone());
                        decide::set_condition(
                            &mut st,
                            Timestamp::now(),
                            "Accepted",
                            "False",
                            "LeaseUnavailable",
                            &msg,
                        );
                        write_status(ctx, &m, st).await?;
                        ctx.publish(m.as_ref(), EventType::Warning, "FailedMaintenance", msg)
                            .await;
                    } else {
                        st.last_error = Some(format!(
                            "lease {LEASE_NAMESPACE}/{} is held by {holder:?} (attempt {count})",
                            lease_name(node_name)
                        ));
                        write_status(ctx, &m, st).await?;
                    }
                    return Ok(Flow::Wait(Some(LEASE_RETRY)));
                }
            }
        }
        Step::ApplyToNode { nm, cordon } => {
            let n = node.ok_or_else(|| Error::NodeNotFound(node_name.into()))?;
            let mut taints = taints_of(n);
            for key in [UNSCHEDULABLE_TAINT, DRAIN_TAINT] {
                if !taints
                    .iter()
                    .any(|t| t.key == key && t.effect == "NoSchedule")
                {
                    taints.push(Taint {
                        key: key.into(),
                        effect: "NoSchedule".into(),
                        time_added: Some(Time(Timestamp::now())),
                        value: None,
                    });
                }
            }
            let mut annotations = json!({ APPLIED_ANNOTATION: nm });
            if cordon {
                annotations[CORDONED_ANNOTATION] = json!(nm);
            }
            patch_node(
                ctx,
                n,
                json!({
                    "metadata": {
                        "labels": { EXCLUDE_REMEDIATION_LABEL: "true" },
                        "annotations": annotations,
                    },
                    "spec": { "unschedulable": true, "taints": taints },
                }),
            )
            .await?;
            log::info!(
                "node {node_name}: {} and tainted for NodeMaintenance {nm}",
                if cordon {
                    "cordoned"
                } else {
                    "already cordoned by someone else; left cordoned"
                }
            );
        }
        Step::Drain { nm, pods } => {
            let outcomes = evict::drain_pods(&ctx.client, &pods).await;
            let now = Timestamp::now();
            ctx.update_memory(node_name, |mem| {
                for ((pod, _), outcome) in pods.iter().zip(outcomes) {
                    let Some(uid) = pod.metadata.uid.clone() else {
                        continue;
                    };
                    match outcome {
                        Outcome::Accepted | Outcome::Gone => {
                            // Wait for the pod to go; ask again only if it
                            // outlives its grace period by a wide margin.
                            let grace = pod
                                .spec
                                .as_ref()
                                .and_then(|s| s.termination_grace_period_seconds)
                                .unwrap_or(30);
                            let retry = now
                                .checked_add(SignedDuration::from_secs(grace.max(0) + 30))
                                .ok();
                            mem.attempts.insert(
                                uid,
                                Attempt {
                                    retry_at: retry,
                                    error: None,
                                    refusals: 0,
                                },
                            );
                        }
                        Outcome::Refused(msg) => {
                            let a = mem.attempts.entry(uid).or_default();
                            a.refusals += 1;
                            let wait = SignedDuration::try_from(decide::backoff(a.refusals))
                                .unwrap_or_default();
                            a.retry_at = now.checked_add(wait).ok();
                            a.error = Some(msg);
                        }
                    }
                }
            });
            log::debug!("NodeMaintenance {nm}: asked {} pods to leave", pods.len());
        }
        Step::WriteStatus {
            nm,
            status,
            announce,
        } => {
            let m = get(&nm)?;
            write_status(ctx, &m, *status).await?;
            match announce {
                Some(Announce::Succeeded) => {
                    log::info!("NodeMaintenance {nm}: node {node_name} is drained");
                    ctx.publish(
                        m.as_ref(),
                        EventType::Normal,
                        "SucceedMaintenance",
                        "Node maintenance was succeeded".into(),
                    )
                    .await;
                }
                Some(Announce::DrainTimeout(msg)) => {
                    log::warn!("NodeMaintenance {nm}: {msg}");
                    ctx.publish(m.as_ref(), EventType::Warning, "DrainTimeout", msg)
                        .await;
                }
                None => {}
            }
        }
        Step::RemoveFromNode { nm, uncordon } => {
            let n = node.ok_or_else(|| Error::NodeNotFound(node_name.into()))?;
            let mut taints = taints_of(n);
            taints.retain(|t| t.key != DRAIN_TAINT && !(uncordon && t.key == UNSCHEDULABLE_TAINT));
            let mut spec = json!({ "taints": taints });
            if uncordon {
                spec["unschedulable"] = Value::Null;
            }
            patch_node(
                ctx,
                n,
                json!({
                    "metadata": {
                        "labels": { EXCLUDE_REMEDIATION_LABEL: null },
                        "annotations": { APPLIED_ANNOTATION: null, CORDONED_ANNOTATION: null },
                    },
                    "spec": spec,
                }),
            )
            .await?;
            log::info!(
                "node {node_name}: maintenance {nm} removed{}",
                if uncordon {
                    ", uncordoned"
                } else {
                    ", left cordoned (not ours)"
                }
            );
            if uncordon {
                ctx.publish(
                    n,
                    EventType::Normal,
                    "UncordonNode",
                    format!("Uncordon node {node_name}"),
                )
                .await;
            }
        }
        Step::Finish { nm, release_lease } => {
            let m = get(&nm)?;
            if release_lease {
                lease::release_node_lease(&ctx.client, node_name).await?;
                ctx.update_memory(node_name, |mem| mem.lease_renew_at = None);
            }
            let finalizers: Vec<String> = m
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            patch_nm(ctx, &nm, json!({ "metadata": { "resourceVersion": m.resource_version(), "finalizers": finalizers } })).await?;
            if release_lease {
                log::info!("NodeMaintenance {nm}: removed");
                ctx.publish(
                    m.as_ref(),
                    EventType::Normal,
                    "RemovedMaintenance",
                    "Removed a node maintenance".into(),
                )
                .await;
            }
        }
    }
    Ok(Flow::Continue)
}

fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// Merge-patch a node, guarded by its resourceVersion (taints are a list a
/// merge patch replaces whole, so a concurrent change must not be lost).
async fn patch_node(ctx: &Context, node: &Node, mut body: Value) -> Result<()> {
    body["metadata"]["resourceVersion"] = json!(node.resource_version());
    let api: Api<Node> = Api::all(ctx.client.clone());
    let name = node.name_any();
    let updated = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(Error::kube(format!("updating node {name}")))?;
    ctx.remember_node(updated);
    Ok(())
}

async fn patch_nm(ctx: &Context, name: &str, body: Value) -> Result<()> {
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(updated) => {
            ctx.remember_nm(updated);
            Ok(())
        }
        // Finalizer already gone and the object with it: nothing left to do.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("updating NodeMaintenance {name}"))(e)),
    }
}

/// Status keys, so a merge patch clears what the new status leaves out.
const STATUS_KEYS: [&str; 10] = [
    "phase",
    "drainProgress",
    "lastUpdate",
    "lastError",
    "pendingPods",
    "pendingPodsRefs",
    "totalpods",
    "evictionPods",
    "errorOnLeaseCount",
    "conditions",
];

/// Write the whole status, guarded by the resourceVersion we decided on.
async fn write_status(
    ctx: &Context,
    nm: &NodeMaintenance,
    mut status: NodeMaintenanceStatus,
) -> Result<()> {
    status.last_update = Some(Time(Timestamp::now()));
    let mut body = serde_json::to_value(&status)
        .map_err(|e| Error::Invalid(format!("encoding status: {e}")))?;
    if let Value::Object(map) = &mut body {
        for key in STATUS_KEYS {
            map.entry(key).or_insert(Value::Null);
        }
    }
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    let name = nm.name_any();
    let patch = json!({ "metadata": { "resourceVersion": nm.resource_version() }, "status": body });
    let updated = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!(
            "writing status of NodeMaintenance {name}"
        )))?;
    ctx.remember_nm(updated);
    Ok(())
}
