//! The NodeMaintenance life, pure: a snapshot of one node's world in, the
//! one next [`Step`] out ([`decide`]), and the effects that step takes
//! ([`plan`]), including the follow-up to an outcome ([`after`]). The
//! service gathers the snapshot; `effects` performs the plan.
//!
//! NodeMaintenance is the drain primitive of every feature: a feature takes
//! a node by creating a NodeMaintenance it owns (owner reference and the
//! [`OWNER_LABEL`]), with its drain options in annotations
//! ([`drain_options`]); an administrator's NodeMaintenance preempts it.
//!
//! **Architecture invariant:** this module performs no I/O and reads no
//! clock; time comes in through [`Snapshot::now`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use crate::api::pod::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::drain::{Attempt, Fate};
use super::drain_plan::{self, RuleBook};
use super::duration_until;
use super::node_conditions;
use crate::api::common::{DrainOptions, Escalation, is_node_name};
use crate::api::nodemaintenance::*;

mod detach;
mod lease_and_gone_node;
mod plan;
mod pods;
mod status;

use lease_and_gone_node::{decide_without_node, releases_lease};
pub use plan::{LEASE_RETRY, after, plan};
use pods::{fates, report_and_wait};
pub use status::set_condition;
use status::{initial_status, progress_hold, progress_status, same_status};

#[cfg(test)]
use super::drain::backoff;
#[cfg(test)]
use super::{Effect, Outcome, Then};
#[cfg(test)]
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Everything the decision needs about one node.
pub struct Snapshot<'a> {
    pub node_name: &'a str,
    pub node: Option<&'a Node>,
    /// Every NodeMaintenance whose `spec.nodeName` is this node, in the
    /// order the API server stored them (the service knows it from the
    /// watch; `creationTimestamp` has whole seconds only).
    pub maintenances: Vec<&'a NodeMaintenance>,
    /// Pods bound to this node.
    pub pods: &'a [Arc<Pod>],
    /// The DrainRules, and the labels of the namespaces they need.
    pub drain_rules: &'a RuleBook,
    /// Per pod UID.
    pub attempts: &'a HashMap<String, Attempt>,
    /// When we next have to renew the medik8s lease; `None` if we do not hold it.
    pub lease_renew_at: Option<Timestamp>,
    pub now: Timestamp,
    pub drain_timeout: Duration,
    /// The node's VolumeAttachments, once read: the service reads them
    /// when the decision asks ([`Step::ReadVolumes`]), only for a feature's
    /// drained maintenance (`decide::volumes`).
    pub volumes: Option<&'a crate::decide::volumes::Volumes>,
    /// The UIDs of the node's pods no other node can run, once read: the
    /// service reads the other nodes when the decision asks
    /// ([`Step::ReadHomes`]), only for a reboot's or upgrade's drain
    /// (`decide::elsewhere`).
    pub homes: Option<&'a crate::decide::elsewhere::Homes>,
    /// The node's lifecycle conditions cannot be written now
    /// ([`super::NodeMemory::conditions_refused_until`]): the maintenance
    /// goes on without them. A drain or an uncordon never waits on them.
    pub conditions_paused: bool,
}

/// An event a step announces once its write succeeded.
#[derive(Debug, Clone, PartialEq)]
pub enum Announce {
    Succeeded,
    DrainTimeout(String),
}

/// The one next thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Terminal failure that touches nothing but the object's status.
    Fail {
        nm: String,
        reason: &'static str,
        message: String,
    },
    /// Add the medik8s finalizer and the owner reference to the Node; with
    /// `lease`, take the medik8s lease at the same time (two independent
    /// writes, one round trip: a burst of maintenances waits on each).
    AddFinalizer { nm: String, lease: bool },
    /// First status: Running with the pod counts; announces BeginMaintenance.
    /// The lifecycle conditions and the drain follow, each a step of its
    /// own: performed together with the first status (one round trip
    /// instead of three), 100 maintenances at once put their writes and
    /// evictions in front of each other's cordons (`just bench-scale`: the
    /// last of 100 cordoned after 3.8-5.8 s instead of 2.1-2.7 s).
    Begin {
        nm: String,
        status: Box<NodeMaintenanceStatus>,
    },
    /// Take or renew the medik8s lease.
    AcquireLease { nm: String },
    /// Label, taint and (if it was schedulable) cordon the node, in one patch.
    ApplyToNode { nm: String, cordon: bool },
    /// Evict or delete these pods, concurrently, with this grace period
    /// (`None`: each pod's own).
    Drain {
        nm: String,
        pods: Vec<(Arc<Pod>, Fate)>,
        grace_period: Option<i64>,
    },
    /// Read the node's VolumeAttachments and decide again: a feature's
    /// maintenance is drained and says Succeeded only once the evicted
    /// pods' volumes are detached (`decide::volumes`).
    ReadVolumes { nm: String },
    /// Read which of the refused pods another node could run, and decide
    /// again: a reboot or upgrade leaves those no other node can run to
    /// the shutdown instead of waiting for their PDB (`decide::elsewhere`).
    ReadHomes { nm: String, pods: Vec<String> },
    /// Write progress (and announce a transition).
    WriteStatus {
        nm: String,
        status: Box<NodeMaintenanceStatus>,
        announce: Option<Announce>,
    },
    /// Set the node's lifecycle conditions ([`node_conditions`]): this
    /// strategic-merge patch of its status.
    SetConditions { patch: serde_json::Value },
    /// Undo ApplyToNode; uncordon only if we cordoned.
    RemoveFromNode { nm: String, uncordon: bool },
    /// Release the lease (if `release_lease`), drop the finalizer, announce RemovedMaintenance.
    Finish { nm: String, release_lease: bool },
    /// Release the lease this process holds for a node no maintenance
    /// names any more (one deleted before it began, or one that failed).
    ReleaseLease,
    /// Nothing to do until something changes, or until the given time passes.
    Wait(Option<Duration>),
}

impl Step {
    /// Steps decided and planned without the node's pods: a process that
    /// has not listed them yet may take these (and only these), so the
    /// cordon does not wait for the list.
    pub fn reads_no_pods(&self) -> bool {
        matches!(
            self,
            Step::AddFinalizer { .. } | Step::AcquireLease { .. } | Step::ApplyToNode { .. }
        )
    }
}

pub const REASON_INVALID_NODE: &str = "InvalidNodeName";
pub const REASON_DUPLICATE: &str = "Duplicate";
pub const REASON_NODE_GONE: &str = "NodeDeleted";
pub const REASON_PREEMPTED: &str = "Preempted";
pub const REASON_INVALID_OPTIONS: &str = "InvalidDrainOptions";
pub const REASON_DRAIN_TIMEOUT: &str = "DrainTimeout";

/// The feature that owns a NodeMaintenance (the [`OWNER_LABEL`]'s value),
/// or `None` for an administrator's.
pub fn owner_of(nm: &NodeMaintenance) -> Option<&str> {
    nm.labels().get(OWNER_LABEL).map(String::as_str)
}

/// The drain options of one NodeMaintenance: its owner's, from the
/// [`DRAIN_TIMEOUT_ANNOTATION`] and [`DRAIN_ON_TIMEOUT_ANNOTATION`], else the
/// agent's `--drain-timeout` and `Wait`. `Err` is the message for status.
pub fn drain_options(
    nm: &NodeMaintenance,
    default_timeout: Duration,
) -> Result<DrainOptions, String> {
    let ann = nm.annotations();
    let timeout = match ann.get(DRAIN_TIMEOUT_ANNOTATION) {
        None => default_timeout,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(secs) if (1..=86_400).contains(&secs) => Duration::from_secs(secs),
            _ => {
                return Err(format!(
                    "invalid annotation {DRAIN_TIMEOUT_ANNOTATION}: {v:?} (whole seconds from 1 to 86400)"
                ));
            }
        },
    };
    let on_timeout = match ann.get(DRAIN_ON_TIMEOUT_ANNOTATION) {
        None => Escalation::Wait,
        Some(v) => Escalation::parse(v).ok_or_else(|| {
            format!("invalid annotation {DRAIN_ON_TIMEOUT_ANNOTATION}: {v:?} (Wait, Force or Skip)")
        })?,
    };
    let grace_period = match ann.get(DRAIN_GRACE_ANNOTATION) {
        None => None,
        Some(v) => match v.trim().parse::<i64>() {
            Ok(secs) if (0..=86_400).contains(&secs) => Some(secs),
            _ => {
                return Err(format!(
                    "invalid annotation {DRAIN_GRACE_ANNOTATION}: {v:?} (whole seconds from 0 to 86400)"
                ));
            }
        },
    };
    let pod_selector = match ann.get(DRAIN_POD_SELECTOR_ANNOTATION) {
        None => None,
        Some(v) => Some(
            serde_json::from_str::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(v)
                .map_err(|e| {
                    format!(
                        "invalid annotation {DRAIN_POD_SELECTOR_ANNOTATION}: {v:?} (a label selector as JSON, e.g. {{\"matchLabels\":{{\"app\":\"web\"}}}}: {e})"
                    )
                })?,
        ),
    };
    Ok(DrainOptions {
        timeout,
        on_timeout,
        grace_period,
        pod_selector,
    })
}

pub fn missing_node_message(node: &str) -> String {
    format!("invalid nodeName, no node with name {node} found")
}

pub fn duplicate_message(node: &str) -> String {
    format!("invalid nodeName, a NodeMaintenance for node {node} already exists")
}

/// The message for an object whose nodeName no node can have (the CRD
/// refuses these now; objects stored before that end Failed with it).
pub fn invalid_name_message(node: &str) -> String {
    format!(
        "invalid nodeName, {node:?} is not a node name (a lowercase RFC 1123 subdomain: a-z, 0-9, '-' and '.', at most 253 characters)"
    )
}

/// Oldest first; within one second, in the order given (the order the API
/// server stored them), never by name: the order in which NMO's webhook
/// would have admitted them.
fn ordered<'a>(nms: &[&'a NodeMaintenance]) -> Vec<&'a NodeMaintenance> {
    let mut v = nms.to_vec();
    // A stable sort: ties keep their given order.
    v.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
    v
}

/// A node's annotation, if set.
pub(crate) fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Does the node carry this maintenance taint in NMO's exact shape? One
/// with a `timeAdded` (ours, from versions before the shape was exact) is
/// recognised as ours but does not conform: the next patch rewrites it.
fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == key && t.effect == "NoSchedule" && t.time_added.is_none())
        })
}

/// Does the node carry everything maintenance `nm` puts on it?
pub fn node_conforms(node: &Node, nm: &str) -> bool {
    annotation(node, APPLIED_ANNOTATION) == Some(nm)
        && is_unschedulable(node)
        && has_taint(node, UNSCHEDULABLE_TAINT)
        && has_taint(node, DRAIN_TAINT)
        && node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(EXCLUDE_REMEDIATION_LABEL))
            .map(String::as_str)
            == Some("true")
}

/// The decision.
pub fn decide(s: &Snapshot) -> Step {
    let nms = ordered(&s.maintenances);
    let Some(node) = s.node else {
        return decide_without_node(s, &nms);
    };
    let applied = annotation(node, APPLIED_ANNOTATION);
    // Deletions first: undo what the object put on the node, then let it go.
    if let Some(nm) = nms.iter().find(|m| m.is_deleting() && m.has_finalizer()) {
        return let_go(s, node, nm, &nms, applied);
    }
    let primary = match in_charge(s, &nms, applied) {
        Ok(primary) => primary,
        Err(step) => return step,
    };
    let Some(p) = primary else {
        return nothing_asks(s, node, &nms, applied);
    };
    hold(s, node, p, applied)
}

/// `nm` is being deleted: the node is given back (conditions withdrawn,
/// then what it put on the node removed) unless a successor takes it over,
/// then the finalizer goes.
fn let_go(
    s: &Snapshot,
    node: &Node,
    nm: &NodeMaintenance,
    nms: &[&NodeMaintenance],
    applied: Option<&str>,
) -> Step {
    let name = nm.name_any();
    // Another live maintenance takes the node over (an administrator's
    // that preempted this feature's): the node is not uncordoned in
    // between — pods landed on it only to be evicted again. This one just
    // goes; the next step applies the successor, keeping the cordon and
    // our record of it.
    let successor = nms
        .iter()
        .any(|m| !m.is_deleting() && m.phase() != Some(Phase::Failed));
    if applied == Some(name.as_str()) && !successor {
        if let Some(step) = withdraw_conditions(s, node) {
            return step;
        }
        return Step::RemoveFromNode {
            nm: name,
            uncordon: annotation(node, CORDONED_ANNOTATION).is_some(),
        };
    }
    Step::Finish {
        nm: name,
        release_lease: releases_lease(nm, nms),
    }
}

/// Among live, non-failed objects the one in charge (`Ok(None)`: none);
/// `Err` is the step that comes first: a feature's object preempted by an
/// administrator's, or a newcomer failed as a duplicate.
fn in_charge<'a>(
    s: &Snapshot,
    nms: &[&'a NodeMaintenance],
    applied: Option<&str>,
) -> Result<Option<&'a NodeMaintenance>, Step> {
    let live: Vec<&NodeMaintenance> = nms
        .iter()
        .copied()
        .filter(|m| !m.is_deleting() && m.phase() != Some(Phase::Failed))
        .collect();
    // The claim recorded first outranks arrival: the one on the node, then
    // one that began, then one that got our finalizer (the first write of
    // a claim), then the first stored. A begun maintenance never loses to a
    // later object, whatever their names or timestamps.
    let primary = live
        .iter()
        .find(|m| applied == Some(m.name_any().as_str()))
        .or_else(|| live.iter().find(|m| m.phase().is_some()))
        .or_else(|| live.iter().find(|m| m.has_finalizer()))
        .or_else(|| live.first())
        .copied();
    // An administrator's maintenance preempts one a feature holds the node
    // with: the feature's object fails (its owner sees why and gives up the
    // node), and the administrator's takes over what is on the node.
    if let Some(p) = primary
        && owner_of(p).is_some()
        && let Some(admin) = live
            .iter()
            .find(|m| owner_of(m).is_none() && m.phase().is_none())
    {
        return Err(Step::Fail {
            nm: p.name_any(),
            reason: REASON_PREEMPTED,
            message: format!(
                "preempted by NodeMaintenance {} of an administrator",
                admin.name_any()
            ),
        });
    }
    let primary_name = primary.map(|p| p.name_any());
    if let Some(nm) = live
        .iter()
        .find(|nm| Some(nm.name_any()) != primary_name && nm.phase().is_none())
    {
        return Err(Step::Fail {
            nm: nm.name_any(),
            reason: REASON_DUPLICATE,
            message: duplicate_message(s.node_name),
        });
    }
    Ok(primary)
}

/// Our changes are on the node but nothing asks for them any more (the
/// object failed, or was removed without its finalizer): what we published
/// goes False first, so no reader sees a node in maintenance that is
/// schedulable again; then the changes go, then a lease left over.
fn nothing_asks(
    s: &Snapshot,
    node: &Node,
    nms: &[&NodeMaintenance],
    applied: Option<&str>,
) -> Step {
    if let Some(step) = withdraw_conditions(s, node) {
        return step;
    }
    if let Some(name) = applied {
        return Step::RemoveFromNode {
            nm: name.to_string(),
            uncordon: annotation(node, CORDONED_ANNOTATION).is_some(),
        };
    }
    // A lease this process took for maintenances that are all gone goes
    // too: one deleted before it began (while its finalizer and the lease
    // were being written), or one that failed after taking it (Finish
    // releases only a Running or Succeeded one's). Left, it would hold the
    // node from medik8s remediators for an hour.
    if nms.is_empty() && s.lease_renew_at.is_some() {
        return Step::ReleaseLease;
    }
    Step::Wait(None)
}

/// The maintenance in charge, `p`: take the node, then drain it, then
/// report and wait for what is left.
fn hold(s: &Snapshot, node: &Node, p: &NodeMaintenance, applied: Option<&str>) -> Step {
    let name = p.name_any();
    let opts = match drain_options(p, s.drain_timeout) {
        Ok(o) => o,
        Err(message) => {
            return Step::Fail {
                nm: name,
                reason: REASON_INVALID_OPTIONS,
                message,
            };
        }
    };
    // The lease, then the node, then the first status: what a watcher of
    // the node waits for comes first (NMO writes its first status before
    // the lease; with 100 maintenances at once those two writes per node
    // stood before every cordon). The finalizer and the lease are written
    // together; the cordon waits for both, so a deletion in between still
    // gives the node back and no node is cordoned under someone else's
    // lease.
    let lease_due = s.lease_renew_at.is_none_or(|at| at <= s.now);
    if !p.has_finalizer() {
        return Step::AddFinalizer {
            nm: name,
            lease: lease_due,
        };
    }
    let timed_out = drain_deadline(p, opts.timeout).is_some_and(|d| d <= s.now);
    let fates = fates(s, p, &opts, timed_out);
    if lease_due {
        return Step::AcquireLease { nm: name };
    }
    if applied != Some(name.as_str()) || !node_conforms(node, &name) {
        let cordon = !is_unschedulable(node) || annotation(node, CORDONED_ANNOTATION).is_some();
        return Step::ApplyToNode { nm: name, cordon };
    }
    // A refused pod with nowhere else to go is left for the shutdown
    // (`decide::elsewhere`): asked about before it is evicted again.
    if crate::decide::elsewhere::applies_to(owner_of(p)) {
        let unknown: Vec<String> = fates
            .iter()
            .filter(|(pod, f)| *f == Fate::Evict && refused(s, pod))
            .filter(|(pod, _)| !s.homes.is_some_and(|h| h.knows(pod)))
            .filter_map(|(pod, _)| pod.metadata.uid.clone())
            .collect();
        if !unknown.is_empty() {
            return Step::ReadHomes {
                nm: name,
                pods: unknown,
            };
        }
    }
    if p.phase().is_none() {
        return Step::Begin {
            nm: name,
            status: Box::new(initial_status(s, &fates)),
        };
    }
    // Published once the node carries the maintenance, before the drain
    // starts, so readers see DrainInProgress while pods go.
    if !s.conditions_paused
        && let Some(patch) =
            node_conditions::patch(node, &node_conditions::while_held(p, owner_of(p)), s.now)
    {
        return Step::SetConditions { patch };
    }
    let due: Vec<(Arc<Pod>, Fate)> = fates
        .iter()
        .filter(|(_, f)| matches!(f, Fate::Evict | Fate::Delete(_)))
        .filter(|(pod, _)| {
            attempt(s, pod)
                .and_then(|a| a.retry_at)
                .is_none_or(|at| at <= s.now)
        })
        .cloned()
        .collect();
    if !due.is_empty() {
        return Step::Drain {
            nm: name,
            pods: due,
            grace_period: opts.grace_period,
        };
    }
    report_and_wait(s, p, &fates, &opts, timed_out)
}

/// Set the lifecycle conditions we published `False` (the maintenance
/// ends), if any is still `True`.
fn withdraw_conditions(s: &Snapshot, node: &Node) -> Option<Step> {
    if s.conditions_paused {
        return None;
    }
    node_conditions::patch(node, &node_conditions::after_release(node), s.now)
        .map(|patch| Step::SetConditions { patch })
}

/// Has an eviction of `pod` been refused (its PDB)?
fn refused(s: &Snapshot, pod: &Pod) -> bool {
    attempt(s, pod).is_some_and(|a| a.refusals > 0)
}

fn attempt<'a>(s: &'a Snapshot, pod: &Pod) -> Option<&'a Attempt> {
    pod.metadata.uid.as_ref().and_then(|u| s.attempts.get(u))
}

/// When the drain of `nm` runs out of time: the drain starts when the node
/// is cordoned, which the Cordoned condition records.
fn drain_deadline(nm: &NodeMaintenance, timeout: Duration) -> Option<Timestamp> {
    let c = nm.condition("Cordoned").filter(|c| c.status == "True")?;
    let span = k8s_openapi::jiff::SignedDuration::try_from(timeout).ok()?;
    c.last_transition_time.0.checked_add(span).ok()
}

#[cfg(test)]
mod tests;
/// What other modules' tests borrow from these.
#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) use super::tests::{apply_conditions, pod};
}
