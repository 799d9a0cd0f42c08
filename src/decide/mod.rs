//! Pure decisions: a snapshot of the world and the time in, a [`Plan`] out.
//! One module per feature ([`maintenance`]: the NodeMaintenance life;
//! [`reboot`]: coordinated reboots; [`upgrade`]: in-place upgrades;
//! [`mutex`]: the mutex operator's kinds; [`replace`]: rolling replacement;
//! [`admission`]: the webhook's refusals), plus the policies features share
//! ([`drain`]: which pods go and how, retry schedules; [`foreign`]: who
//! looks after objects no agent owns; [`disrupt`]: taking and giving back a
//! node; [`jobs`]; [`budget`] and [`window`]). The effects themselves are
//! performed by `crate::effects`; the outcomes come back through
//! [`NodeMemory::record`] and the next snapshot.
//!
//! **Architecture invariant:** nothing under `decide/` performs I/O or
//! reads a clock: time comes in with the snapshot, so every rule here is a
//! unit test away. It imports nothing from `effects` or `service`.

pub mod admission;
pub mod budget;
pub mod claim;
pub mod command_check;
pub mod disrupt;
pub mod do_not_disrupt;
pub mod drain;
pub mod drain_plan;
pub mod drain_rules;
pub mod elsewhere;
pub mod foreign;
pub mod health;
pub mod jobs;
pub mod maintenance;
pub mod marking;
pub mod mutex;
pub mod node_conditions;
pub mod notify;
pub mod once_per_boot;
pub mod reboot;
pub mod replace;
pub mod rollout;
pub mod selector;
pub mod upgrade;
pub mod version;
pub mod volumes;
pub mod window;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::api::pod::Pod;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceStatus};
use drain::{Attempt, Fate};

/// One thing to do to the world: the closed set every feature plans with.
/// Each write carries its guard (resourceVersion or UID), so a decision made
/// on a stale snapshot fails with a conflict instead of doing harm.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Merge-patch a Node, guarded by the resourceVersion decided on.
    PatchNode {
        node: String,
        resource_version: Option<String>,
        patch: Value,
    },
    /// Strategic-merge patch a Node's status (`nodes/status`): the
    /// lifecycle conditions of [`node_conditions`], merged by type so the
    /// kubelet's stay. Unguarded: the patch names only our condition types,
    /// and a stale decision is corrected by the next one.
    PatchNodeStatus { node: String, patch: Value },
    /// Replace a NodeMaintenance's whole status (server-side apply, one
    /// field manager), guarded by the resourceVersion decided on. `clear`
    /// names the keys the stored status has and this one drops: they are
    /// sent as null, because apply removes only fields its own manager
    /// owns, and a key another writer set (an older nodekeeper's merge
    /// patch, a user's `kubectl patch`) would otherwise never go — and the
    /// decision would ask for the same write forever.
    WriteStatus {
        nm: String,
        resource_version: Option<String>,
        status: Box<NodeMaintenanceStatus>,
        clear: Vec<String>,
    },
    /// Set a NodeMaintenance's finalizers (and, if given, its whole list
    /// of owner references).
    SetFinalizers {
        nm: String,
        resource_version: Option<String>,
        finalizers: Vec<String>,
        owners: Option<Vec<OwnerReference>>,
    },
    /// Take or renew the medik8s lease of a node (owned by the Node).
    TakeLease {
        node: String,
        node_uid: Option<String>,
    },
    /// Release the medik8s lease of a node if NodeMaintenance holds it.
    ReleaseLease { node: String },
    /// Evict or delete these pods, concurrently, each guarded by its UID,
    /// with this grace period (`None`: each pod's own).
    Drain {
        pods: Vec<(Arc<Pod>, Fate)>,
        grace_period: Option<i64>,
    },
    /// Take a node for a feature: create a NodeMaintenance it owns.
    CreateMaintenance { nm: Box<NodeMaintenance> },
    /// Give a node back: delete the NodeMaintenance with this UID.
    DeleteMaintenance { nm: String, uid: String },
    /// Replace a RebootPolicy's status (server-side apply), guarded by the
    /// resourceVersion decided on: the admission record, so a decision on
    /// a stale policy fails instead of over-admitting.
    WritePolicyStatus {
        policy: String,
        resource_version: Option<String>,
        status: Box<crate::api::reboot::RebootPolicyStatus>,
    },
    /// Run a host action (argv, no shell): a reboot or upgrade command, on
    /// this host (node role) or remotely (cluster role). Its result is
    /// recorded on the node as `record` says.
    RunHost {
        node: String,
        /// The command's id: the host keeps one record per id
        /// (`effects::host_run`), so running it again attaches to the
        /// first run (an agent restarted mid-upgrade publishes its
        /// result) instead of starting a second.
        id: String,
        /// What runs: a command, or a call of Talos's machine API.
        action: HostAction,
        record: HostRecord,
        /// How long the command may run before it is killed.
        timeout: Duration,
    },
    /// Replace an UpgradePlan's status (server-side apply), guarded by the
    /// resourceVersion decided on: admissions and hook Jobs are recorded
    /// there before they happen.
    WriteUpgradeStatus {
        plan: String,
        resource_version: Option<String>,
        status: Box<crate::api::upgrade::UpgradePlanStatus>,
    },
    /// Replace the status of one of the mutex operator's objects
    /// (server-side apply), guarded by the resourceVersion decided on.
    WriteMutexStatus {
        kind: mutex::Kind,
        namespace: String,
        name: String,
        resource_version: Option<String>,
        status: Value,
    },
    /// Merge-patch a MachineConfigPool (the patch carries the
    /// resourceVersion it was decided on).
    PatchPool { name: String, patch: Value },
    /// Create a hook Job (a 409 means it was created before: done).
    CreateJob { job: Box<kube::api::DynamicObject> },
    /// Ask the provider plugin `verb` with `request`; `key` names the
    /// write for its failure record (backoff, status message).
    Provider {
        key: String,
        verb: &'static str,
        request: Value,
    },
    /// Create one of Constellation's objects (or a Deployment); a 409 means
    /// it was created before: done.
    CreateObject {
        kind: crate::api::constellation::Kind,
        object: Value,
    },
    /// Patch one (merge patch, or a strategic merge patch if `strategic`:
    /// built-in kinds only; of the status subresource if `status`). A merge patch carries its guard (the
    /// resourceVersion) in its metadata.
    PatchObject {
        kind: crate::api::constellation::Kind,
        namespace: Option<String>,
        name: String,
        patch: Value,
        status: bool,
        strategic: bool,
    },
    /// Replace a cluster-scoped object's whole status (server-side apply),
    /// guarded by the resourceVersion decided on, if given.
    WriteObjectStatus {
        kind: crate::api::constellation::Kind,
        name: String,
        resource_version: Option<String>,
        status: Value,
    },
    /// Delete one (only the object with this UID, if given; gone is done).
    DeleteObject {
        kind: crate::api::constellation::Kind,
        name: String,
        uid: Option<String>,
    },
    /// Delete a Node object (only the one with this UID; gone is done).
    DeleteNode { name: String, uid: Option<String> },
    /// Publish an event (Warning if `warning`) about an object.
    Event {
        object: ObjectReference,
        warning: bool,
        reason: &'static str,
        note: String,
    },
}

/// Where a host action's result goes: the node annotation `annotation`
/// is set to `failed` followed by the command's output when it fails, and
/// to `succeeded` (if given) when it succeeds.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRecord {
    pub annotation: &'static str,
    pub failed: String,
    pub succeeded: Option<String>,
}

/// A host action of [`Effect::RunHost`].
#[derive(Debug, Clone, PartialEq)]
pub enum HostAction {
    /// argv run as the host's own process (`effects::host_run`).
    Command(Vec<String>),
    /// The cluster role's `reboot.remoteCommand`: run as its own child (it
    /// reaches out to the machine), not as a host process.
    Remote(Vec<String>),
    /// `MachineService/Reboot` of Talos's machine API (`effects::talos`).
    TalosReboot,
    /// Upgrade to this installer image through Talos's machine API;
    /// `legacy` (Talos before 1.13): the old call, which reboots by itself.
    TalosUpgrade { image: String, legacy: bool },
}

impl HostAction {
    /// The command's argv, for the actions that are commands.
    pub fn argv(&self) -> Option<&[String]> {
        match self {
            HostAction::Command(argv) | HostAction::Remote(argv) => Some(argv),
            HostAction::TalosReboot | HostAction::TalosUpgrade { .. } => None,
        }
    }
}

impl std::fmt::Display for HostAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostAction::Command(argv) | HostAction::Remote(argv) => {
                write!(f, "{:?}", argv.join(" "))
            }
            HostAction::TalosReboot => f.write_str("Talos's MachineService/Reboot"),
            HostAction::TalosUpgrade {
                image,
                legacy: false,
            } => {
                write!(
                    f,
                    "Talos's ImageService/Pull and LifecycleService/Upgrade of {image}"
                )
            }
            HostAction::TalosUpgrade {
                image,
                legacy: true,
            } => {
                write!(f, "Talos's MachineService/Upgrade to {image}")
            }
        }
    }
}

/// What one decision asks for: effects in order, then when to decide again.
#[derive(Debug, Clone)]
pub struct Plan {
    pub effects: Vec<Effect>,
    /// The effects are independent writes: perform them at once, not in
    /// order (each outcome is still recorded; the first error is returned).
    pub together: bool,
    pub then: Then,
    /// What the log says once the effects are done (a plan says what it
    /// does; the interpreter does not).
    pub note: Option<(log::Level, String)>,
}

/// When to decide again after the effects are done.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Then {
    /// At once, on a snapshot that includes these effects' results.
    Again,
    /// When something changes, or after this long if given.
    Wait(Option<Duration>),
}

impl Plan {
    /// Perform these, then decide again.
    pub fn steps(effects: Vec<Effect>) -> Plan {
        Plan {
            effects,
            together: false,
            then: Then::Again,
            note: None,
        }
    }

    /// Perform these independent writes at once, then decide again.
    pub fn together(effects: Vec<Effect>) -> Plan {
        Plan {
            together: true,
            ..Plan::steps(effects)
        }
    }

    /// Nothing to do until something changes, or until `after` passes.
    pub fn wait(after: Option<Duration>) -> Plan {
        Plan {
            effects: Vec::new(),
            together: false,
            then: Then::Wait(after),
            note: None,
        }
    }

    /// Log `line` at info level once done.
    pub fn info(mut self, line: String) -> Plan {
        self.note = Some((log::Level::Info, line));
        self
    }

    /// Log `line` as a warning once done.
    pub fn warn(mut self, line: String) -> Plan {
        self.note = Some((log::Level::Warn, line));
        self
    }
}

/// What the API server said to an effect, as the next decision needs it.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Done as asked (or already so).
    Done,
    /// The Node as the server stored our write.
    NodeWritten(Box<crate::api::node::Node>),
    /// A node status write (lifecycle conditions) failed; the maintenance
    /// goes on without them for a while ([`NodeMemory`]).
    StatusRefused,
    /// The NodeMaintenance as the server stored our write.
    MaintenanceWritten(Box<NodeMaintenance>),
    /// Our finalizer was the last: the NodeMaintenance is deleted. Every
    /// version up to this resourceVersion is gone, whatever the watch still
    /// shows (the server answers such a write with the version it deleted,
    /// finalizer included).
    MaintenanceGone {
        name: String,
        resource_version: Option<String>,
    },
    /// The lease is ours until then.
    LeaseHeld { until: Timestamp },
    /// Someone else holds the lease.
    LeaseHeldBy(String),
    /// Per pod of a [`Effect::Drain`], in order.
    Drained(Vec<drain::Removal>),
    /// The RebootPolicy as the server stored our status write.
    PolicyWritten(Box<crate::api::reboot::RebootPolicy>),
    /// The UpgradePlan as the server stored our status write.
    UpgradePlanWritten(Box<crate::api::upgrade::UpgradePlan>),
    /// The API server refused to create a Job (a bad template, a missing
    /// namespace): why, in one line. Retrying would not help.
    JobRefused(String),
    /// The provider's answer.
    ProviderAnswered(Value),
    /// The provider failed: why, in one line.
    ProviderFailed(String),
    /// An object as the server stored our write (kind, name,
    /// resourceVersion), so the next round can wait for the watch to show it.
    ObjectWritten {
        kind: crate::api::constellation::Kind,
        name: String,
        resource_version: Option<String>,
    },
    /// A host action ran: whether it succeeded, and its (truncated)
    /// output or error.
    HostRan { ok: bool, output: String },
}

/// What we remember per node between decisions. Lost on restart, which
/// costs at most one repeated request: everything needed to resume is in
/// the API server.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NodeMemory {
    /// Per pod UID: the last removal attempt.
    pub attempts: HashMap<String, Attempt>,
    /// When the medik8s lease must be renewed; `None` if we do not hold it.
    pub lease_renew_at: Option<Timestamp>,
    /// The node's lifecycle conditions could not be written (RBAC not yet
    /// updated, a policy refusing status writes): until then the
    /// maintenance goes on without them, and tries again after.
    pub conditions_refused_until: Option<Timestamp>,
}

impl NodeMemory {
    /// Fold an effect's outcome in: the policy of what to remember (lease
    /// renewal at half its life, eviction retry schedules) lives here.
    pub fn record(&mut self, effect: &Effect, outcome: &Outcome, now: Timestamp) {
        match (effect, outcome) {
            (Effect::TakeLease { .. }, Outcome::LeaseHeld { until }) => {
                let half = SignedDuration::from_millis(
                    (until.as_millisecond() - now.as_millisecond()) / 2,
                );
                self.lease_renew_at = now.checked_add(half).ok();
            }
            (Effect::ReleaseLease { .. }, _) => self.lease_renew_at = None,
            (Effect::PatchNodeStatus { .. }, Outcome::StatusRefused) => {
                self.conditions_refused_until = now.checked_add(SignedDuration::from_secs(60)).ok();
            }
            (Effect::Drain { pods, .. }, Outcome::Drained(removals)) => {
                drain::record(&mut self.attempts, pods, removals, now)
            }
            _ => {}
        }
    }

    /// A write whose answer was lost (a timeout, a 5xx) may have happened.
    /// A lease taken so is held as far as we know: due for renewal now, and
    /// released once no maintenance is left. Forgotten, a maintenance
    /// deleted before its finalizer was written left the lease ours for its
    /// hour (the maintenance worlds found it).
    pub fn unanswered(&mut self, effect: &Effect, now: Timestamp) {
        if let Effect::TakeLease { .. } = effect
            && self.lease_renew_at.is_none()
        {
            self.lease_renew_at = Some(now);
        }
    }

    /// Forget attempts for pods that are gone, so the map stays bounded.
    pub fn forget_pods_except(&mut self, live_uids: &std::collections::HashSet<String>) {
        self.attempts.retain(|uid, _| live_uids.contains(uid));
    }
}

/// The kubelet says the node is Ready.
pub fn node_ready(node: &crate::api::node::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Time from `now` until `t`, zero if past.
pub fn duration_until(now: Timestamp, t: Timestamp) -> Duration {
    let ms = t
        .as_millisecond()
        .saturating_sub(now.as_millisecond())
        .max(0);
    Duration::from_millis(ms as u64)
}

/// The earlier of two optional wake-ups.
pub fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Set a condition in a list, keeping its transition time unless its
/// status changed (what `kubectl describe` readers rely on).
pub fn set_condition(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    now: Timestamp,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    if let Some(c) = conds.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = Time(now);
        }
        c.status = status.into();
        c.reason = reason.into();
        c.message = message.into();
    } else {
        conds.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(now),
            observed_generation: None,
        });
    }
}

/// The condition an object carries while the cluster role could not carry
/// out its last decision (an API error: a refused write, a failed read).
pub const RECONCILED: &str = "Reconciled";

/// Set [`RECONCILED`] to False with why while `failing`, and drop it once
/// the object's decisions go through again.
pub fn set_failing(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    now: Timestamp,
    failing: Option<&str>,
) {
    match failing {
        Some(why) => set_condition(conds, now, RECONCILED, "False", "ReconcileFailed", why),
        None => conds.retain(|c| c.type_ != RECONCILED),
    }
}
