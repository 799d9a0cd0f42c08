//! The decision function: a snapshot of one node's world in, the one next
//! step out. All of nodekeeper's NodeMaintenance behaviour lives here; the
//! reconciler (`reconcile.rs`) only gathers the snapshot and performs steps.
//!
//! **Architecture invariant:** this module performs no I/O and reads no
//! clock; time comes in through [`Snapshot::now`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::drain::{self, Fate};
use crate::nodemaintenance::*;

/// What we remember about a pod we tried to drain (lost on restart, which
/// costs at most one repeated eviction request).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attempt {
    /// Not before this instant.
    pub retry_at: Option<Timestamp>,
    /// Why the last attempt did not remove the pod (one line, API's cause).
    pub error: Option<String>,
    /// How many attempts were refused, for backoff.
    pub refusals: u32,
}

/// Everything the decision needs about one node.
pub struct Snapshot<'a> {
    pub node_name: &'a str,
    pub node: Option<&'a Node>,
    /// Every NodeMaintenance whose `spec.nodeName` is this node.
    pub maintenances: Vec<&'a NodeMaintenance>,
    /// Pods bound to this node.
    pub pods: &'a [Arc<Pod>],
    /// Per pod UID.
    pub attempts: &'a HashMap<String, Attempt>,
    /// When we next have to renew the medik8s lease; `None` if we do not hold it.
    pub lease_renew_at: Option<Timestamp>,
    pub now: Timestamp,
    pub drain_timeout: Duration,
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
    /// Add the medik8s finalizer and the owner reference to the Node.
    AddFinalizer { nm: String },
    /// First status: Running with the pod counts; announces BeginMaintenance.
    Begin {
        nm: String,
        status: Box<NodeMaintenanceStatus>,
    },
    /// Take or renew the medik8s lease.
    AcquireLease { nm: String },
    /// Label, taint and (if it was schedulable) cordon the node, in one patch.
    ApplyToNode { nm: String, cordon: bool },
    /// Evict or delete these pods, concurrently.
    Drain {
        nm: String,
        pods: Vec<(Arc<Pod>, Fate)>,
    },
    /// Write progress (and announce a transition).
    WriteStatus {
        nm: String,
        status: Box<NodeMaintenanceStatus>,
        announce: Option<Announce>,
    },
    /// Undo ApplyToNode; uncordon only if we cordoned.
    RemoveFromNode { nm: String, uncordon: bool },
    /// Release the lease (if `release_lease`), drop the finalizer, announce RemovedMaintenance.
    Finish { nm: String, release_lease: bool },
    /// Nothing to do until something changes, or until the given time passes.
    Wait(Option<Duration>),
}

pub const REASON_INVALID_NODE: &str = "InvalidNodeName";
pub const REASON_DUPLICATE: &str = "Duplicate";
pub const REASON_NODE_GONE: &str = "NodeDeleted";

pub fn missing_node_message(node: &str) -> String {
    format!("invalid nodeName, no node with name {node} found")
}

pub fn duplicate_message(node: &str) -> String {
    format!("invalid nodeName, a NodeMaintenance for node {node} already exists")
}

/// How long node mode waits before it looks again for the node of a foreign
/// object. After a look that worked (the node exists; its own agent should
/// act) once a minute; after `failures` failed looks in a row 5 s doubling
/// to 5 min. `seed` spreads it by ±20 % so many agents do not ask in step.
pub fn foreign_recheck(failures: u32, seed: u64) -> Duration {
    let base_ms: u64 = match failures {
        0 => 60_000,
        n => (5_000u64 << (n - 1).min(6)).min(300_000),
    };
    // 80 % .. 120 % of the base, in 1 % steps.
    let percent = 80 + seed % 41;
    Duration::from_millis(base_ms * percent / 100)
}

/// The message for an object whose nodeName no node can have (the CRD
/// refuses these now; objects stored before that end Failed with it).
pub fn invalid_name_message(node: &str) -> String {
    format!(
        "invalid nodeName, {node:?} is not a node name (a lowercase RFC 1123 subdomain: a-z, 0-9, '-' and '.', at most 253 characters)"
    )
}

/// How long to back off after the `n`th refusal: 1, 2, 4 then 5 s (kubectl
/// retries a 429 every 5 s; we start faster so a relaxed PDB is noticed soon).
pub fn backoff(refusals: u32) -> Duration {
    Duration::from_secs(match refusals {
        0 | 1 => 1,
        2 => 2,
        3 => 4,
        _ => 5,
    })
}

/// Oldest first, then by name: the order in which NMO's webhook would have
/// admitted them.
fn ordered<'a>(nms: &[&'a NodeMaintenance]) -> Vec<&'a NodeMaintenance> {
    let mut v = nms.to_vec();
    v.sort_by(|a, b| {
        let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
        ta.cmp(&tb).then_with(|| a.name_any().cmp(&b.name_any()))
    });
    v
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
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

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
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
        let name = nm.name_any();
        if applied == Some(name.as_str()) {
            return Step::RemoveFromNode {
                nm: name,
                uncordon: annotation(node, CORDONED_ANNOTATION).is_some(),
            };
        }
        return Step::Finish {
            nm: name,
            release_lease: owned_lease(nm),
        };
    }

    // Among live, non-failed objects one is in charge; newcomers are duplicates.
    let live: Vec<&NodeMaintenance> = nms
        .iter()
        .copied()
        .filter(|m| !m.is_deleting() && m.phase() != Some(Phase::Failed))
        .collect();
    let primary = live
        .iter()
        .find(|m| applied == Some(m.name_any().as_str()))
        .or_else(|| live.iter().find(|m| m.phase().is_some()))
        .or_else(|| live.first())
        .copied();
    let primary_name = primary.map(|p| p.name_any());
    for nm in &live {
        if Some(nm.name_any()) != primary_name && nm.phase().is_none() {
            return Step::Fail {
                nm: nm.name_any(),
                reason: REASON_DUPLICATE,
                message: duplicate_message(s.node_name),
            };
        }
    }

    let Some(p) = primary else {
        // Our changes are on the node but nothing asks for them any more
        // (the object failed, or was removed without its finalizer).
        if let Some(name) = applied {
            return Step::RemoveFromNode {
                nm: name.to_string(),
                uncordon: annotation(node, CORDONED_ANNOTATION).is_some(),
            };
        }
        return Step::Wait(None);
    };
    let name = p.name_any();
    if !p.has_finalizer() {
        return Step::AddFinalizer { nm: name };
    }
    let fates: Vec<(Arc<Pod>, Fate)> = s
        .pods
        .iter()
        .map(|pod| (pod.clone(), drain::fate(pod)))
        .collect();
    if p.phase().is_none() {
        return Step::Begin {
            nm: name,
            status: Box::new(initial_status(s, &fates)),
        };
    }
    let lease_due = s.lease_renew_at.is_none_or(|at| at <= s.now);
    if lease_due {
        return Step::AcquireLease { nm: name };
    }
    if applied != Some(name.as_str()) || !node_conforms(node, &name) {
        let cordon = !is_unschedulable(node) || annotation(node, CORDONED_ANNOTATION).is_some();
        return Step::ApplyToNode { nm: name, cordon };
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
        };
    }

    let (status, announce) = progress_status(s, p, &fates);
    if !same_status(p.status.as_ref(), &status) {
        return Step::WriteStatus {
            nm: name,
            status: Box::new(status),
            announce,
        };
    }

    // Wake for the next retry or lease renewal; pod events wake us earlier.
    let mut wake: Vec<Timestamp> = fates
        .iter()
        .filter(|(_, f)| f.is_pending())
        .filter_map(|(pod, _)| attempt(s, pod).and_then(|a| a.retry_at))
        .collect();
    wake.extend(s.lease_renew_at);
    // A drain timeout has to be noticed even if no pod event arrives.
    if let Some(deadline) = drain_deadline(p, s.drain_timeout)
        && deadline > s.now
        && fates.iter().any(|(_, f)| f.is_pending())
    {
        wake.push(deadline);
    }
    Step::Wait(wake.into_iter().min().map(|t| duration_until(s.now, t)))
}

/// No Node object: new objects fail as NMO's webhook would have refused
/// them; objects whose node went away keep their finalizer until deleted.
fn decide_without_node(s: &Snapshot, nms: &[&NodeMaintenance]) -> Step {
    for nm in nms {
        let name = nm.name_any();
        if nm.is_deleting() {
            if nm.has_finalizer() {
                return Step::Finish {
                    nm: name,
                    release_lease: owned_lease(nm),
                };
            }
            continue;
        }
        match nm.phase() {
            None => {
                let message = if crate::cli::is_node_name(s.node_name) {
                    missing_node_message(s.node_name)
                } else {
                    invalid_name_message(s.node_name)
                };
                return Step::Fail {
                    nm: name,
                    reason: REASON_INVALID_NODE,
                    message,
                };
            }
            Some(Phase::Running | Phase::Succeeded) => {
                return Step::Fail {
                    nm: name,
                    reason: REASON_NODE_GONE,
                    message: format!("node {} was deleted during maintenance", s.node_name),
                };
            }
            Some(Phase::Failed) => {}
        }
    }
    Step::Wait(None)
}

/// A maintenance that got past its first status held the node's lease.
fn owned_lease(nm: &NodeMaintenance) -> bool {
    matches!(nm.phase(), Some(Phase::Running | Phase::Succeeded))
}

fn attempt<'a>(s: &'a Snapshot, pod: &Pod) -> Option<&'a Attempt> {
    pod.metadata.uid.as_ref().and_then(|u| s.attempts.get(u))
}

fn duration_until(now: Timestamp, t: Timestamp) -> Duration {
    let ms = t
        .as_millisecond()
        .saturating_sub(now.as_millisecond())
        .max(0);
    Duration::from_millis(ms as u64)
}

fn pending_refs(fates: &[(Arc<Pod>, Fate)]) -> Vec<PodReference> {
    let mut refs: Vec<PodReference> = fates
        .iter()
        .filter(|(_, f)| f.is_pending())
        .map(|(p, _)| PodReference {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
        })
        .collect();
    refs.sort();
    refs
}

fn initial_status(s: &Snapshot, fates: &[(Arc<Pod>, Fate)]) -> NodeMaintenanceStatus {
    let refs = pending_refs(fates);
    let mut st = NodeMaintenanceStatus {
        phase: Some(Phase::Running),
        drain_progress: Some(0),
        total_pods: Some(s.pods.len() as i32),
        eviction_pods: Some(refs.len() as i32),
        pending_pods: Some(refs.iter().map(|r| r.name.clone()).collect()),
        pending_pods_refs: Some(refs),
        error_on_lease_count: Some(0),
        ..Default::default()
    };
    set_condition(
        &mut st,
        s.now,
        "Accepted",
        "True",
        "Valid",
        "the node exists and has no other NodeMaintenance",
    );
    set_condition(
        &mut st,
        s.now,
        "Cordoned",
        "False",
        "Cordoning",
        "cordoning and tainting the node",
    );
    set_condition(
        &mut st,
        s.now,
        "Drained",
        "False",
        "Draining",
        "waiting for the cordon",
    );
    st
}

/// When the drain of `nm` runs out of time: the drain starts when the node
/// is cordoned, which the Cordoned condition records.
fn drain_deadline(nm: &NodeMaintenance, timeout: Duration) -> Option<Timestamp> {
    let c = nm.condition("Cordoned").filter(|c| c.status == "True")?;
    let span = k8s_openapi::jiff::SignedDuration::try_from(timeout).ok()?;
    c.last_transition_time.0.checked_add(span).ok()
}

/// At most this many blockers are spelled out in lastError.
const MAX_BLOCKERS_SHOWN: usize = 5;

fn progress_status(
    s: &Snapshot,
    nm: &NodeMaintenance,
    fates: &[(Arc<Pod>, Fate)],
) -> (NodeMaintenanceStatus, Option<Announce>) {
    let old = nm.status.clone().unwrap_or_default();
    let mut st = old.clone();
    let refs = pending_refs(fates);
    let eviction = old.eviction_pods.unwrap_or(0).max(0);
    let gone = (eviction - refs.len() as i32).max(0);
    st.drain_progress = Some(match (eviction, refs.is_empty()) {
        (_, true) => 100,
        (0, false) => 0,
        _ => gone * 100 / eviction,
    });
    st.pending_pods = Some(refs.iter().map(|r| r.name.clone()).collect());
    st.pending_pods_refs = Some(refs.clone());

    let blockers: Vec<String> = fates
        .iter()
        .filter(|(_, f)| f.is_pending())
        .filter_map(|(pod, _)| {
            attempt(s, pod)
                .and_then(|a| a.error.as_ref())
                .map(|e| format!("pod {}: {e}", drain::pod_key(pod)))
        })
        .collect();
    st.last_error = summarize(&blockers);

    set_condition(
        &mut st,
        s.now,
        "Cordoned",
        "True",
        "Cordoned",
        "the node is cordoned and tainted",
    );
    let mut announce = None;
    if refs.is_empty() {
        set_condition(
            &mut st,
            s.now,
            "Drained",
            "True",
            "Drained",
            "no pods left to drain",
        );
        if old.phase != Some(Phase::Succeeded) {
            announce = Some(Announce::Succeeded);
        }
        st.phase = Some(Phase::Succeeded);
    } else {
        let timed_out = drain_deadline(nm, s.drain_timeout).is_some_and(|d| d <= s.now);
        let (reason, message) = match (&st.last_error, timed_out) {
            (Some(err), true) => (
                "DrainTimeout",
                format!(
                    "drain did not finish within {} s; blocked by {err}",
                    s.drain_timeout.as_secs()
                ),
            ),
            (Some(err), false) => ("DrainBlocked", format!("blocked by {err}")),
            (None, _) => ("Draining", format!("{} pods left to drain", refs.len())),
        };
        let was = nm.condition("Drained").map(|c| c.reason.as_str());
        if reason == "DrainTimeout" && was != Some("DrainTimeout") {
            announce = Some(Announce::DrainTimeout(message.clone()));
        }
        set_condition(&mut st, s.now, "Drained", "False", reason, &message);
        // Pods that appear after Succeeded (e.g. tolerating the taints) are
        // drained too, but a finished maintenance does not go back to Running.
        if st.phase != Some(Phase::Succeeded) {
            st.phase = Some(Phase::Running);
        }
    }
    (st, announce)
}

fn summarize(blockers: &[String]) -> Option<String> {
    match blockers.len() {
        0 => None,
        n if n <= MAX_BLOCKERS_SHOWN => Some(blockers.join("; ")),
        n => Some(format!(
            "{}; and {} more",
            blockers[..MAX_BLOCKERS_SHOWN].join("; "),
            n - MAX_BLOCKERS_SHOWN
        )),
    }
}

/// Set a condition, keeping its transition time unless its status changed.
pub fn set_condition(
    st: &mut NodeMaintenanceStatus,
    now: Timestamp,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    let conds = st.conditions.get_or_insert_with(Vec::new);
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

/// Equal but for `lastUpdate`, which we stamp on every write.
fn same_status(old: Option<&NodeMaintenanceStatus>, new: &NodeMaintenanceStatus) -> bool {
    let Some(old) = old else { return false };
    let mut a = old.clone();
    a.last_update = None;
    let mut b = new.clone();
    b.last_update = None;
    a == b
}

#[cfg(test)]
mod tests;
