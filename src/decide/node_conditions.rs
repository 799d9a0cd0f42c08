//! Node lifecycle conditions (KEP-5683, sig-node "Node Lifecycle
//! Conditions"): the well-known Node conditions `MaintenanceInProgress`,
//! `DrainInProgress` and `Drained` that DaemonSet and Job controllers,
//! autoscalers, node-problem-detector and storage operators read as one
//! signal that a node is being taken out of service. Pure: what a node's
//! conditions should say, and the strategic-merge patch of `nodes/status`
//! that makes them say it.
//!
//! Every disruption nodekeeper makes goes through a NodeMaintenance
//! (reboots, upgrades, replacement donors, an administrator's), so the
//! NodeMaintenance life publishes them for all of them: while one holds
//! the node, `MaintenanceInProgress=True` names it and its owner; through
//! the drain `DrainInProgress=True`/`Drained=False`, once drained
//! `False`/`True`, as `kubectl drain` does in the KEP; when the node is given
//! back, each condition nodekeeper set `True` is set `False`. While a
//! NodeMaintenance holds the node these three types are nodekeeper's (the
//! node is in its maintenance); outside one, a condition is nodekeeper's
//! to set `False` only if its message starts with `NodeMaintenance ` and
//! its reason is one of [`OUR_REASONS`]: `kubectl drain`'s, an
//! administrator's or another controller's are left alone then.
//!
//! `MaintenancePlanned` (a node a feature needs and has not begun on) is
//! decided apart, in [`planned`], by the cluster role, which alone sees
//! every feature's plan.
//!
//! The patch names only these condition types: Node conditions merge by
//! `type`, so the kubelet's (Ready, pressure conditions) stay untouched.

use crate::api::node::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

pub use crate::api::nodemaintenance::{DRAIN_IN_PROGRESS, DRAINED, MAINTENANCE_IN_PROGRESS};
use crate::api::nodemaintenance::{NodeMaintenance, Phase};

/// The types a NodeMaintenance's life writes, in the order they are
/// patched (MaintenancePlanned, the KEP's fourth, is the cluster role's:
/// [`planned`]).
pub const TYPES: [&str; 3] = [MAINTENANCE_IN_PROGRESS, DRAIN_IN_PROGRESS, DRAINED];

pub const REASON_ADMIN: &str = "AdminRequested";
pub const REASON_REBOOT: &str = "RebootRequested";
pub const REASON_UPGRADE: &str = "UpgradeRequested";
pub const REASON_REPLACEMENT: &str = "NodeReplacement";
pub const REASON_FEATURE: &str = "MaintenanceRequested";
pub const REASON_DRAIN_STARTED: &str = "DrainStarted";
pub const REASON_DRAIN_COMPLETED: &str = "DrainCompleted";
pub const REASON_ENDED: &str = "MaintenanceEnded";
/// Every reason written here and in [`planned`]: a condition with one of
/// them (and our message prefix) was set by nodekeeper.
pub const OUR_REASONS: [&str; 9] = [
    REASON_ADMIN,
    REASON_REBOOT,
    REASON_UPGRADE,
    REASON_REPLACEMENT,
    REASON_FEATURE,
    REASON_DRAIN_STARTED,
    REASON_DRAIN_COMPLETED,
    REASON_ENDED,
    planned::REASON_NOT_PLANNED,
];
const MESSAGE_PREFIX: &str = "NodeMaintenance ";

/// One condition as it should be.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The cause category of a maintenance, from the kind that owns it
/// (the NodeMaintenance's owner label), as the KEP's CamelCase reasons.
fn cause(owner_kind: Option<&str>) -> &'static str {
    match owner_kind {
        None => REASON_ADMIN,
        Some("RebootPolicy") => REASON_REBOOT,
        Some("UpgradePlan") => REASON_UPGRADE,
        Some("NodeVersion") => REASON_REPLACEMENT,
        Some(_) => REASON_FEATURE,
    }
}

/// Who asked, for a message: `of an administrator` or `of RebootPolicy p`.
fn requested_by(nm: &NodeMaintenance, owner_kind: Option<&str>) -> String {
    match owner_kind {
        None => "of an administrator".into(),
        Some(kind) => {
            let name = nm
                .owner_references()
                .iter()
                .find(|o| o.kind == kind)
                .map(|o| o.name.as_str());
            match name {
                Some(name) => format!("of {kind} {name}"),
                None => format!("of a {kind}"),
            }
        }
    }
}

/// The conditions while `nm` holds the node (it began and its changes are
/// on the node): in maintenance; draining until it Succeeded, then drained.
pub fn while_held(nm: &NodeMaintenance, owner_kind: Option<&str>) -> [Wanted; 3] {
    let name = nm.name_any();
    let by = requested_by(nm, owner_kind);
    let why = nm
        .spec
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    let drained = nm.phase() == Some(Phase::Succeeded);
    let (drain_reason, drain_message) = if drained {
        (
            REASON_DRAIN_COMPLETED,
            format!("{MESSAGE_PREFIX}{name} {by} drained the node"),
        )
    } else {
        (
            REASON_DRAIN_STARTED,
            format!("{MESSAGE_PREFIX}{name} {by} is draining the node"),
        )
    };
    [
        Wanted {
            type_: MAINTENANCE_IN_PROGRESS,
            status: true,
            reason: cause(owner_kind),
            message: format!("{MESSAGE_PREFIX}{name} {by} holds the node{why}"),
        },
        Wanted {
            type_: DRAIN_IN_PROGRESS,
            status: !drained,
            reason: drain_reason,
            message: drain_message.clone(),
        },
        Wanted {
            type_: DRAINED,
            status: drained,
            reason: drain_reason,
            message: drain_message,
        },
    ]
}

/// The conditions when the maintenance ends (before the node is
/// uncordoned) or once no NodeMaintenance holds it: each of ours still
/// `True` goes `False`. Nothing else is touched, so a node that was
/// never in maintenance costs no write.
pub fn after_release(node: &Node) -> Vec<Wanted> {
    TYPES
        .iter()
        .filter(|t| current(node, t).is_some_and(|c| c.status == "True" && is_ours(c)))
        .map(|t| Wanted {
            type_: t,
            status: false,
            reason: REASON_ENDED,
            message: format!("{MESSAGE_PREFIX}ended; the node is given back"),
        })
        .collect()
}

fn current<'a>(
    node: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Did nodekeeper write this condition (its message prefix and one of its
/// reasons)?
pub fn is_ours(c: &k8s_openapi::api::core::v1::NodeCondition) -> bool {
    c.message
        .as_deref()
        .is_some_and(|m| m.starts_with(MESSAGE_PREFIX))
        && c.reason
            .as_deref()
            .is_some_and(|r| OUR_REASONS.contains(&r))
}

/// The strategic-merge patch of `nodes/status` that makes the node's
/// conditions say `wanted`, or `None` if they already do. A condition whose
/// status stays keeps its lastTransitionTime.
pub fn patch(node: &Node, wanted: &[Wanted], now: Timestamp) -> Option<Value> {
    let stamp = now.to_string();
    let changed: Vec<Value> = wanted
        .iter()
        .filter_map(|w| {
            let status = if w.status { "True" } else { "False" };
            let old = current(node, w.type_);
            let same = old.is_some_and(|c| {
                c.status == status
                    && c.reason.as_deref() == Some(w.reason)
                    && c.message.as_deref() == Some(w.message.as_str())
            });
            if same {
                return None;
            }
            let transition = old
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_else(|| stamp.clone());
            Some(json!({
                "type": w.type_,
                "status": status,
                "reason": w.reason,
                "message": w.message,
                "lastTransitionTime": transition,
                "lastHeartbeatTime": stamp,
            }))
        })
        .collect();
    (!changed.is_empty()).then(|| json!({ "status": { "conditions": changed } }))
}

pub mod planned;
#[cfg(test)]
mod tests;
