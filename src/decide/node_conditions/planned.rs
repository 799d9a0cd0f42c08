//! `MaintenancePlanned`, the KEP's fourth lifecycle condition: a node a
//! feature needs to disrupt and has not begun on yet — a reboot needed
//! and waiting for its turn (RebootPolicy `Pending`/`Waiting`), an
//! outdated node waiting (UpgradePlan `Pending`/`Waiting`, or admitted and
//! running its before hooks, which come before the cordon), a node a
//! NodeVersion will replace (`outdated`, not yet a donor). Pure: which
//! nodes are planned, from the features' own records, and the patches
//! that make each node say so.
//!
//! Only the cluster role writes it (it alone sees every feature's plan),
//! in its scheduler's pass; the node agent's NodeMaintenance life writes
//! the other three, so the two never write the same condition. A node may
//! say both `MaintenancePlanned=True` and `MaintenanceInProgress=True`: an
//! administrator's maintenance holds it while a reboot waits behind it.
//!
//! The message names the features and why each waits by its
//! machine-readable reason (`Budget`, `Window`, …), never by the status
//! message: that one may count or tell times, and each change would be
//! one more write to the Node.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::node::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{MESSAGE_PREFIX, REASON_REBOOT, REASON_REPLACEMENT, REASON_UPGRADE, Wanted};
use super::{current, is_ours, patch};
use crate::api::constellation::NodeVersion;
pub use crate::api::nodemaintenance::MAINTENANCE_PLANNED;
use crate::api::reboot::{RebootPhase, RebootPolicy};
use crate::api::upgrade::{UpgradePhase, UpgradePlan};
use crate::decide::Effect;

/// The reason a planned condition of ours goes `False` with: no feature
/// waits for the node any more (it began, finished, or was called off).
pub const REASON_NOT_PLANNED: &str = "NotPlanned";

/// What the features have planned, per node: the condition to publish.
pub type Planned = BTreeMap<String, Wanted>;

/// The nodes the features plan to disrupt and have not begun on, from
/// their records: each policy's and plan's per-node status and each
/// NodeVersion's outdated nodes that are not donors yet. A node several
/// features wait for names all of them; the reason is the first's
/// (reboots, then upgrades, then replacement, each by object name).
pub fn planned(
    policies: &[Arc<RebootPolicy>],
    plans: &[Arc<UpgradePlan>],
    versions: &[Arc<NodeVersion>],
) -> Planned {
    // node -> (reason, parts of the message)
    let mut by_node: BTreeMap<String, (&'static str, Vec<String>)> = BTreeMap::new();
    let mut add = |node: &str, reason: &'static str, part: String| {
        by_node
            .entry(node.to_string())
            .or_insert_with(|| (reason, Vec::new()))
            .1
            .push(part);
    };
    let mut policies: Vec<&Arc<RebootPolicy>> = policies.iter().collect();
    policies.sort_by_key(|p| p.name_any());
    for p in policies {
        for e in p.status.iter().flat_map(|s| &s.nodes) {
            if matches!(e.phase, RebootPhase::Pending | RebootPhase::Waiting) {
                let why = waiting(e.phase.as_str(), e.reason.as_deref());
                add(
                    &e.name,
                    REASON_REBOOT,
                    format!("RebootPolicy {} needs a reboot ({why})", p.name_any()),
                );
            }
        }
    }
    let mut plans: Vec<&Arc<UpgradePlan>> = plans.iter().collect();
    plans.sort_by_key(|p| p.name_any());
    for p in plans {
        for e in p.status.iter().flat_map(|s| &s.nodes) {
            let to = e
                .version
                .as_deref()
                .map(|v| format!(" to {v}"))
                .unwrap_or_default();
            let why = match e.phase {
                UpgradePhase::Pending | UpgradePhase::Waiting => {
                    waiting(e.phase.as_str(), e.reason.as_deref())
                }
                UpgradePhase::PreHooks => "admitted, running its before hooks".to_string(),
                _ => continue,
            };
            add(
                &e.name,
                REASON_UPGRADE,
                format!("UpgradePlan {} upgrades it{to} ({why})", p.name_any()),
            );
        }
    }
    let mut versions: Vec<&Arc<NodeVersion>> = versions.iter().collect();
    versions.sort_by_key(|v| v.name_any());
    for v in versions {
        let Some(status) = v.status.as_ref() else {
            continue;
        };
        let donor = |n: &str| status.donors.iter().any(|d| d.name.as_deref() == Some(n));
        for o in &status.outdated {
            let Some(name) = o.name.as_deref() else {
                continue;
            };
            if !donor(name) {
                add(
                    name,
                    REASON_REPLACEMENT,
                    format!("NodeVersion {} replaces it (outdated)", v.name_any()),
                );
            }
        }
    }
    by_node
        .into_iter()
        .map(|(node, (reason, parts))| {
            let wanted = Wanted {
                type_: MAINTENANCE_PLANNED,
                status: true,
                reason,
                message: format!("{MESSAGE_PREFIX}planned: {}", parts.join("; ")),
            };
            (node, wanted)
        })
        .collect()
}

/// `Waiting (Budget)`, `Pending`: the phase and its machine-readable reason.
fn waiting(phase: &str, reason: Option<&str>) -> String {
    match reason.filter(|r| !r.is_empty()) {
        Some(r) => format!("{phase}: {r}"),
        None => phase.to_string(),
    }
}

/// The patches that make every node's `MaintenancePlanned` say what
/// `planned` says: `True` naming the features on a planned node, `False`
/// on a node whose condition of ours is still `True` and is planned no
/// more. A `True` set by someone else (an administrator, another
/// controller) is left as it is, planned or not: it already says what
/// ours would, and it is theirs to withdraw. Nodes in `skip` (their last
/// write was refused, see the caller) are not written now.
pub fn effects(
    nodes: &[Arc<Node>],
    planned: &Planned,
    skip: &dyn Fn(&str) -> bool,
    now: Timestamp,
) -> Vec<Effect> {
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.name_any();
            if skip(&name) {
                return None;
            }
            let now_says = current(n, MAINTENANCE_PLANNED);
            let foreign_true = now_says.is_some_and(|c| c.status == "True" && !is_ours(c));
            let wanted = match planned.get(&name) {
                _ if foreign_true => return None,
                Some(w) => w.clone(),
                None if now_says.is_some_and(|c| c.status == "True") => Wanted {
                    type_: MAINTENANCE_PLANNED,
                    status: false,
                    reason: REASON_NOT_PLANNED,
                    message: format!("{MESSAGE_PREFIX}planned no more: begun, done or called off"),
                },
                None => return None,
            };
            patch(n, std::slice::from_ref(&wanted), now)
                .map(|patch| Effect::PatchNodeStatus { node: name, patch })
        })
        .collect()
}

#[cfg(test)]
mod tests;
