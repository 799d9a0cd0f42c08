//! The node role's half of coordinated reboots, pure: mark the own node as
//! needing a reboot when the host says so, and issue the reboot once the
//! policy's NodeMaintenance has drained the node — only in the boot the
//! admission recorded, and only once per boot.

use std::sync::Arc;

use crate::api::node::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;

use super::facts::{boot_id, needs_reboot, paused, reboot_action};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::*;
use crate::decide::command_check::{self, Check};
use crate::decide::once_per_boot::{Ask, failure_in, issue, issued_in};
use crate::decide::selector::{check_selector, selector_matches};
use crate::decide::{Effect, HostAction};

/// What the node role knows about its node's reboot.
pub struct Snapshot<'a> {
    pub node: &'a Node,
    /// NodeMaintenances on this node.
    pub maintenances: Vec<&'a NodeMaintenance>,
    pub policies: &'a [Arc<RebootPolicy>],
    /// The host's answer at its last look (sentinel file or command);
    /// `None` when nothing was looked at.
    pub host_needs: Option<bool>,
    pub now: Timestamp,
}

/// The policy that governs a node: of those selecting it, the oldest (then
/// by name), so overlapping policies never both act on one node. A selector
/// the policy cannot use selects nothing (the policy reports it), so a
/// broken policy never holds a node from a working one.
pub fn governing<'a>(
    node: &Node,
    policies: &'a [Arc<RebootPolicy>],
) -> Option<&'a Arc<RebootPolicy>> {
    policies
        .iter()
        .filter(|p| {
            p.spec.node_selector.as_ref().is_none_or(|sel| {
                check_selector(sel).is_ok() && selector_matches(sel, node.labels())
            })
        })
        .min_by(|a, b| {
            (
                a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                a.name_any(),
            )
                .cmp(&(
                    b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    b.name_any(),
                ))
        })
}

/// The agent's check of `policy`'s reboot command as recorded on `node`.
pub fn check_of(node: &Node, policy: &RebootPolicy) -> Check {
    command_check::recorded(node, CHECK_ANNOTATION, &command_check::key(policy))
}

/// The reboot command the agent must check before its node can be
/// admitted, with the key to record the answer under: the governing
/// policy's, expanded for this node. `None` when no policy governs the
/// node or the agent found it runnable for the policy's current spec. A
/// failed check is looked at again each time (the program may have been
/// installed since); [`record_check`] writes only a changed answer.
pub fn to_check(node: &Node, policies: &[Arc<RebootPolicy>]) -> Option<(String, HostAction)> {
    let p = governing(node, policies)?;
    if check_of(node, p) == Check::Runnable {
        return None;
    }
    Some((
        command_check::key(p.as_ref()),
        reboot_action(&p.spec.reboot, node),
    ))
}

/// Record the agent's answer on its node, unless it says so already.
pub fn record_check(node: &Node, key: &str, answer: &Result<(), String>) -> Option<Effect> {
    command_check::record(node, CHECK_ANNOTATION, key, answer)
}

/// The node role's effects for its own node's reboot, in order.
pub fn decide(s: &Snapshot) -> Vec<Effect> {
    let node = s.node;
    let n = node.name_any();
    let Some(boot) = boot_id(node) else {
        return Vec::new();
    };
    let ask = Ask::need(node, boot);
    if let Some(back) = given_back_after_reboot(s, boot) {
        return back;
    }
    // Drained for a reboot in this boot, and none issued yet: issue it.
    for m in crate::decide::rollout::drained_by(&s.maintenances, OWNER_KIND) {
        // Paused, or no longer needed: a person stopped it before its
        // command (the policy gives the node back).
        if m.annotations().get(BOOT_ID_ANNOTATION).map(String::as_str) != Some(boot)
            || issued_in(node, &ask)
            || failure_in(node, &ask).is_some()
            || paused(node)
            || !needs_reboot(node)
        {
            continue;
        }
        let policy = m
            .owner_references()
            .iter()
            .find(|o| o.kind == OWNER_KIND)
            .and_then(|o| s.policies.iter().find(|p| p.name_any() == o.name));
        if let Some(p) = policy {
            return issue(node, &ask, reboot_action(&p.spec.reboot, node));
        }
    }
    // The host says a reboot is needed and nothing says so yet.
    if s.host_needs == Some(true) && !needs_reboot(node) && !issued_in(node, &ask) {
        return vec![Effect::PatchNode {
            node: n,
            resource_version: node.resource_version(),
            patch: json!({"metadata": {"annotations": {
                NEEDED_ANNOTATION: s.now.to_string(),
                NEEDED_BOOT_ANNOTATION: boot,
            }}}),
        }];
    }
    Vec::new()
}

/// Back in a new boot after the reboot issued for the policy's
/// maintenance, and Ready: the agent gives its node back itself (the
/// cluster role's test of a verified reboot, `stages::drained`), so a node
/// is not held for ever when no cluster role runs elsewhere: on a
/// single-node cluster the cluster role's pod may wait Pending on this
/// very cordoned node. The cluster role, where it runs, records the
/// reboot as verified on seeing the node given back.
fn given_back_after_reboot(s: &Snapshot, boot: &str) -> Option<Vec<Effect>> {
    let node = s.node;
    if !crate::decide::node_ready(node) {
        return None;
    }
    crate::decide::rollout::drained_by(&s.maintenances, OWNER_KIND).find_map(|m| {
        let before = m.annotations().get(BOOT_ID_ANNOTATION)?;
        (before != boot && issued_in(node, &Ask::need(node, before)))
            .then(|| crate::decide::rollout::give_back(m).into_iter().collect())
    })
}

/// Record the last look's failure on the node (`None`: the look worked, or
/// no policy reads this node's signals), unless the node says so already.
pub fn sentinel_record(node: &Node, error: Option<&str>) -> Option<Effect> {
    let current = node
        .annotations()
        .get(SENTINEL_FAILED_ANNOTATION)
        .map(String::as_str);
    (current != error).then(|| Effect::PatchNode {
        node: node.name_any(),
        // One key of our own; nothing to lose in a concurrent change.
        resource_version: None,
        patch: json!({"metadata": {"annotations": {SENTINEL_FAILED_ANNOTATION: error}}}),
    })
}
