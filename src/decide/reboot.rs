//! Coordinated reboots, pure. Two halves, one per role:
//!
//! - [`decide`] (cluster role, the single writer of admissions): for one
//!   RebootPolicy, look at every selected node and move each along
//!   Pending/Waiting → Draining → Rebooting → Verifying → Settling → Done,
//!   admitting new nodes in name order within the windows, gates and
//!   budget. The admission record is the policy's status, written guarded by
//!   its resourceVersion **before** the node is taken, so two decisions can
//!   never both take the last slot; the NodeMaintenance (owned by the policy)
//!   does the taking and the draining.
//! - [`node`] (node role): mark the own node as needing a reboot from the
//!   host's signals, and issue the reboot once the node is drained.
//!
//! **No double reboot:** a reboot is issued only when the node still runs
//! the boot recorded at admission (`nodekeeper.io/boot-id-before` on the
//! NodeMaintenance) and no reboot was issued in that boot yet (the node's
//! `nodekeeper.io/reboot-issued`, written before the command runs).
//! Completion is verified, never assumed: a new boot ID and Ready.

mod admit;
pub mod facts;
pub mod node;
mod stages;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::node::Node;
use crate::api::pod::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::disrupt;
use super::maintenance::annotation;
pub use super::once_per_boot::{Ask, failure_in, issued_in};
use super::selector::{check_selector, selector_matches};
use super::{Effect, Plan, marking, rollout, window};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::*;
pub use facts::*;
use stages::Decision;

/// Everything one policy's decision reads.
pub struct Snapshot<'a> {
    pub policy: &'a RebootPolicy,
    /// Every node the cluster role sees.
    pub nodes: &'a [Arc<Node>],
    /// Every NodeMaintenance.
    pub maintenances: &'a [Arc<NodeMaintenance>],
    /// Every RebootPolicy (this one included): of those selecting a node,
    /// the oldest governs it ([`node::governing`]).
    pub policies: &'a [Arc<RebootPolicy>],
    /// The pods bound to a node (for blocking-pod gates).
    pub pods_on: &'a dyn Fn(&str) -> Vec<Arc<Pod>>,
    /// Every pod bound to a node, if this process has read them (`None`:
    /// not yet; the service reads the nodes a decision asked about and
    /// decides again): Karpenter's do-not-disrupt, the last check before a
    /// node is taken ([`super::rollout::pods_hold`]).
    pub node_pods: &'a dyn Fn(&str) -> Option<Vec<Arc<Pod>>>,
    /// Is a node the one this cluster role runs on, and may it take it
    /// ([`super::rollout::own_node_hold`]); asked last, like `node_pods`.
    pub own_node: &'a dyn Fn(&str) -> super::rollout::OwnNode,
    pub now: Timestamp,
    /// This cluster role reboots nodes itself (no node agents), with
    /// `reboot.remoteCommand`.
    pub remote: bool,
    /// Why the policy's last pass failed, if it did (see
    /// [`super::set_failing`]).
    pub failing: Option<&'a str>,
    /// Prometheus's last answer for the URL of the gate, if it has one.
    pub alerts: Option<&'a disrupt::Alerts>,
    /// The health gate's workloads as last listed, if it has one and a
    /// node waits for it.
    pub health: Option<&'a super::health::Health>,
    /// A blocking-pod gate of this object whose pods are not listed yet
    /// (named): admissions wait, nodes already held go on.
    pub gates_unlisted: Option<&'a str>,
    /// How this object's notifications fared (the notifier's count), for
    /// its status; `None`: it has none, the status keeps what it says.
    pub notified: Option<&'a crate::api::common::NotificationStatus>,
}

pub use super::rollout::{
    WAIT_AGENT_CHECK, WAIT_COMMAND, WAIT_IN_MAINTENANCE, WAIT_INVALID, WAIT_PAUSED,
};
/// Machine-readable reasons of Waiting and NotReturned entries.
pub use disrupt::{
    WAIT_ALERT, WAIT_BLOCKING_POD, WAIT_BUDGET, WAIT_GATE, WAIT_NOT_READY, WAIT_WINDOW,
};
/// An older RebootPolicy selects the node too and governs it.
pub const WAIT_OTHER_POLICY: &str = "OtherPolicy";
pub const NOT_RETURNED: &str = "NotReturned";
/// The node's agent cannot read the host's reboot signal.
pub const SENTINEL_FAILED: &str = "SentinelFailed";

/// Before a node is taken: the agent that would reboot it must have said
/// it can run the policy's reboot command there (an agent installed
/// without `--reboot` has no `systemctl`). Not asked when this cluster
/// role reboots the node itself (`reboot.remoteCommand`).
fn agent_check(d: &mut Decision, node: &Node) -> Option<(&'static str, String)> {
    let p = d.s.policy;
    if d.s.remote && !p.spec.reboot.remote_command.is_empty() {
        return None;
    }
    let w = rollout::agent_wait(
        node::check_of(node, p),
        d.prev(&node.name_any()).and_then(|e| e.reason.as_deref()),
        "waiting for the node's agent to say it can run the reboot command",
        |why| {
            format!(
                "the node's agent cannot run the reboot command: {why} (an agent installed without --reboot cannot reboot its host)"
            )
        },
    )?;
    if w.news {
        d.event(node, true, "RebootCommandNotRunnable", &w.message);
    }
    Some((w.reason, w.message))
}

/// NodeMaintenances a RebootPolicy took nodes with whose policy is gone:
/// give those nodes back (see [`crate::decide::disrupt::orphans`]).
pub fn orphans(
    maintenances: &[Arc<NodeMaintenance>],
    policies: &[Arc<RebootPolicy>],
) -> Vec<Effect> {
    let live: Vec<(String, Option<String>)> = policies
        .iter()
        .map(|p| (p.name_any(), p.metadata.uid.clone()))
        .collect();
    super::disrupt::orphans(maintenances, OWNER_KIND, &live)
}

/// Marks RebootPolicies left on nodes they no longer govern (the policy
/// was deleted, or the node relabelled out of its selector): removed,
/// level-triggered ([`crate::decide::marking::orphaned`]).
pub fn orphaned_marks(nodes: &[Arc<Node>], policies: &[Arc<RebootPolicy>]) -> Vec<Effect> {
    nodes
        .iter()
        .filter_map(|n| {
            let governing =
                node::governing(n, policies).map(|p| format!("{OWNER_KIND}/{}", p.name_any()));
            super::marking::orphaned(n, OWNER_KIND, governing.as_deref())
        })
        .collect()
}

/// One policy's next plan: the new status (written first, guarded), then
/// the NodeMaintenances to create or delete, node patches, reboots
/// (remote mode) and events; then when to look again. The pass in order:
/// what the schema could not check, the selected nodes, the nodes it
/// holds, admissions, nodes whose signal is unreadable, history, marks,
/// the end.
pub fn decide<'a>(s: &'a Snapshot<'a>) -> Plan {
    let p = s.policy;
    let name = p.name_any();
    let empty = RebootPolicyStatus::default();
    let old = p.status.as_ref().unwrap_or(&empty);
    let (problems, windows) = checked(p);
    let valid = problems.is_empty();
    let selected = select(s, valid);
    let mut d = Decision {
        s,
        name: name.clone(),
        previous: old.nodes.iter().map(|e| (e.name.as_str(), e)).collect(),
        entries: BTreeMap::new(),
        effects: Vec::new(),
        wake: None,
        not_returned: Vec::new(),
    };
    // Our NodeMaintenances on nodes that are gone: the slot is reclaimed.
    d.effects
        .extend(rollout::reclaim_gone(s.maintenances, s.nodes, |m| {
            owned_by(m, &name)
        }));
    for node in &selected {
        follow_held(&mut d, node);
    }
    // A node it holds that left its selector (a person relabelled it):
    // its reboot is finished, then it is given back. Dropped from the
    // status, it stayed cordoned by a NodeMaintenance nothing followed.
    for node in held_unselected(&d, &selected) {
        follow_held(&mut d, node);
    }
    let admitted = admit::admit(&mut d, &selected, &windows, &problems);
    signals_unreadable(&mut d, &selected);
    // History: verified and failed nodes stay listed while selected.
    for e in &old.nodes {
        if !d.entries.contains_key(&e.name)
            && matches!(e.phase, RebootPhase::Done | RebootPhase::Failed)
            && selected.iter().any(|n| n.name_any() == e.name)
        {
            d.entries.insert(e.name.clone(), e.clone());
        }
    }
    finish(d, &selected, &problems, &admitted)
}

/// What the schema could not check, and the windows parsed.
fn checked(p: &RebootPolicy) -> (Vec<String>, Vec<window::Parsed>) {
    let mut problems = Vec::new();
    let windows: Vec<window::Parsed> = p
        .spec
        .windows
        .iter()
        .filter_map(|w| window::parse(w).map_err(|e| problems.push(e)).ok())
        .collect();
    if let Some(sel) = &p.spec.node_selector
        && let Err(e) = check_selector(sel)
    {
        problems.push(e);
    }
    problems.extend(disrupt::check_pod_selectors(&p.spec.gates, &p.spec.drain));
    problems.extend(super::marking::check(&p.spec.node_labels, ""));
    (problems, windows)
}

/// The nodes the policy selects (none while it is invalid), in admission
/// order: by name, stable across decisions and restarts.
fn select<'a>(s: &Snapshot<'a>, valid: bool) -> Vec<&'a Arc<Node>> {
    let p = s.policy;
    let mut selected: Vec<&Arc<Node>> = s
        .nodes
        .iter()
        .filter(|n| match &p.spec.node_selector {
            None => true,
            Some(sel) => valid && selector_matches(sel, n.labels()),
        })
        .collect();
    selected.sort_by_key(|n| n.metadata.name.clone());
    selected
}

/// The NodeMaintenances on `node`.
fn nms_on<'a>(s: &Snapshot<'a>, node: &str) -> Vec<&'a Arc<NodeMaintenance>> {
    s.maintenances
        .iter()
        .filter(|m| m.spec.node_name == node)
        .collect()
}

/// A node the policy holds, or that settles in its slot: followed to its
/// next step; one given back has its give-back asserted again.
fn follow_held(d: &mut Decision, node: &Arc<Node>) {
    let n = node.name_any();
    let on = nms_on(d.s, &n);
    let name = d.name.clone();
    let ours = on.iter().find(|m| owned_by(m, &name)).map(|m| m.as_ref());
    let others: Vec<&Arc<NodeMaintenance>> = on
        .iter()
        .copied()
        .filter(|m| !owned_by(m, &name) && disrupt::holds_node(m))
        .collect();
    let prev = d.prev(&n);
    if let Some(prev) = prev.filter(|e| e.phase == RebootPhase::Settling) {
        // Level-triggered give-back: the status said Settling before the
        // give-back's writes ran, and any of them may have failed (a 409
        // on the node's need, a refused delete). Every pass asks again
        // until the world agrees.
        d.reassert_give_back(node, ours, prev);
        d.settling(node, ours.is_none(), prev);
        return;
    }
    if let Some(prev) = prev.filter(|e| matches!(e.phase, RebootPhase::Done | RebootPhase::Failed))
        && ours.is_none_or(|m| m.is_deleting())
    {
        // Given back: the need it was rebooted for goes too, should that
        // write have failed (a 409 right after boot).
        d.reassert_give_back(node, ours, prev);
    }
    let held = prev.is_some_and(|e| e.phase.admitted()) || ours.is_some_and(|m| !m.is_deleting());
    if held {
        d.follow(node, ours, &others);
    }
}

/// Nodes the policy holds (its NodeMaintenance live on them) that it no
/// longer selects. An admission whose NodeMaintenance was never created
/// took nothing: it is dropped, not carried out on a node the policy no
/// longer selects.
fn held_unselected<'a>(d: &Decision<'a>, selected: &[&Arc<Node>]) -> Vec<&'a Arc<Node>> {
    let s = d.s;
    // Only nodes with a NodeMaintenance of ours can be held: few, so the
    // cluster's nodes are not compared with the selected ones at scale.
    let ours: std::collections::BTreeSet<&str> = s
        .maintenances
        .iter()
        .filter(|m| owned_by(m, &d.name) && !m.is_deleting())
        .map(|m| m.spec.node_name.as_str())
        .collect();
    s.nodes
        .iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|x| ours.contains(x)))
        .filter(|n| !selected.iter().any(|x| x.metadata.name == n.metadata.name))
        .collect()
}

/// Nodes whose agent cannot read the host's reboot signal (this policy's
/// sentinel): whether they need a reboot is not known, and the status
/// says so (it was only logged on the node, every period).
fn signals_unreadable(d: &mut Decision, selected: &[&Arc<Node>]) {
    for node in selected {
        let n = node.name_any();
        let Some(why) = annotation(node, SENTINEL_FAILED_ANNOTATION) else {
            continue;
        };
        if d.entries.contains_key(&n)
            || node::governing(node, d.s.policies).is_some_and(|g| g.name_any() != d.name)
        {
            continue;
        }
        let msg = format!("its agent cannot read the host's reboot signal: {why}");
        if d.prev(&n).map(|e| (e.phase, e.message.as_deref()))
            != Some((RebootPhase::Unknown, Some(msg.as_str())))
        {
            d.event(node, true, "RebootSignalUnreadable", &msg);
        }
        d.set(&n, RebootPhase::Unknown, None, Some(SENTINEL_FAILED), msg);
    }
}

/// The end of the pass: the policy's marks on its nodes from each entry's
/// phase, the status, what it tells, the steps' effects.
fn finish(d: Decision, selected: &[&Arc<Node>], problems: &[String], admitted: &[String]) -> Plan {
    let (s, name) = (d.s, d.name.as_str());
    let p = s.policy;
    let owner = format!("{OWNER_KIND}/{name}");
    let wanted = marking::Marks {
        labels: &p.spec.node_labels,
        soft_taint: p.spec.prefer_no_schedule_while_waiting,
        feature: "reboot",
        version: "",
        owner: &owner,
    };
    let mut effects = d.effects;
    let stage_of = |node: &Node| {
        // A node another policy governs carries that policy's marks.
        if node::governing(node, s.policies).is_some_and(|g| g.name_any() != name) {
            return None;
        }
        Some(
            match d.entries.get(node.name_any().as_str()).map(|e| e.phase) {
                None => marking::Stage::Untouched,
                Some(RebootPhase::Pending | RebootPhase::Waiting) => marking::Stage::Waiting,
                Some(RebootPhase::Settling | RebootPhase::Done) => marking::Stage::Done,
                Some(RebootPhase::Failed) => marking::Stage::Failed,
                Some(_) => marking::Stage::Held,
            },
        )
    };
    let valid = problems.is_empty();
    let nodes = selected.iter().map(|n| n.as_ref());
    let withheld = rollout::mark(&mut effects, nodes, &wanted, valid, stage_of);
    let empty = RebootPolicyStatus::default();
    let old = p.status.as_ref().unwrap_or(&empty);
    let mut status = status(
        s,
        old,
        d.entries,
        valid,
        problems,
        &d.not_returned,
        selected.len(),
    );
    marking::report(&mut status.conditions, s.now, &withheld);
    // After the status write: a failed write is decided again, event too.
    let told = rollout::notification_failed(
        kube::Resource::object_ref(p, &()),
        old.notifications.as_ref(),
        status.notifications.as_ref(),
    );
    let write = (p.status.as_ref() != Some(&status)).then(|| Effect::WritePolicyStatus {
        policy: name.to_string(),
        resource_version: p.resource_version(),
        status: Box::new(status),
    });
    let who = format!("RebootPolicy {name}");
    rollout::end(write, told, effects, &who, admitted, d.wake)
}

/// The status from the entries: counts and the two conditions.
fn status(
    s: &Snapshot,
    old: &RebootPolicyStatus,
    entries: BTreeMap<String, NodeReboot>,
    valid: bool,
    problems: &[String],
    not_returned: &[String],
    selected: usize,
) -> RebootPolicyStatus {
    let (p, now) = (s.policy, s.now);
    let nodes: Vec<NodeReboot> = entries.into_values().collect();
    let count =
        |f: &dyn Fn(RebootPhase) -> bool| nodes.iter().filter(|e| f(e.phase)).count() as i32;
    let mut conds = old.conditions.clone().unwrap_or_default();
    if valid {
        super::set_condition(
            &mut conds,
            now,
            "Valid",
            "True",
            "Valid",
            "the policy can be used",
        );
    } else {
        super::set_condition(
            &mut conds,
            now,
            "Valid",
            "False",
            WAIT_INVALID,
            &problems.join("; "),
        );
    }
    // A selector that matches nothing is not invalid, but a person who
    // wrote it wants to know (it was reported nowhere).
    let (is, reason, msg) = match selected {
        0 if valid => ("False", "NoNodes", "the nodeSelector selects no node"),
        0 => ("False", WAIT_INVALID, "the policy cannot be used"),
        _ => ("True", "NodesSelected", "the nodeSelector selects nodes"),
    };
    super::set_condition(&mut conds, now, "NodesSelected", is, reason, msg);
    if not_returned.is_empty() {
        super::set_condition(
            &mut conds,
            now,
            "NodeNotReturned",
            "False",
            "AllReturned",
            // Present tense: a node that came back late is history,
            // kept in the NodeNotReturned event and the metric.
            "no rebooted node is past its return deadline",
        );
    } else {
        let msg = format!(
            "did not come back within {} s: {}",
            p.spec.reboot.return_timeout_seconds,
            not_returned.join(", ")
        );
        super::set_condition(
            &mut conds,
            now,
            "NodeNotReturned",
            "True",
            NOT_RETURNED,
            &msg,
        );
    }
    super::set_failing(&mut conds, now, s.failing);
    RebootPolicyStatus {
        // A node another policy governs is that policy's to count.
        needing: nodes
            .iter()
            .filter(|e| matches!(e.phase, RebootPhase::Pending | RebootPhase::Waiting))
            .filter(|e| e.reason.as_deref() != Some(WAIT_OTHER_POLICY))
            .count() as i32,
        rebooting: count(&|ph| ph.holds_slot()),
        done: count(&|ph| ph == RebootPhase::Done),
        nodes,
        observed_generation: p.metadata.generation,
        conditions: Some(conds),
        notifications: s.notified.cloned().or_else(|| old.notifications.clone()),
    }
}

#[cfg(test)]
pub(crate) mod tests;
