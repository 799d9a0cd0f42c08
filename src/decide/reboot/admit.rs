//! One RebootPolicy pass's admissions: nodes that need a reboot and are
//! not held are admitted in name order while the window, the gates and the
//! budget allow, each taken by a NodeMaintenance of its own; the others
//! wait and say why. A need a reboot since has served is cleared instead.

use super::*;

/// Admit what the limits allow; returns the nodes admitted (with their
/// boot), for the pass's log line.
pub(super) fn admit(
    d: &mut Decision,
    selected: &[&Arc<Node>],
    windows: &[window::Parsed],
    problems: &[String],
) -> Vec<String> {
    let s = d.s;
    let p = s.policy;
    if let Some(t) = window::next_change(windows, s.now) {
        d.wake_at(t);
    }
    clear_served_needs(d, selected);
    let candidates: Vec<&Arc<Node>> = selected
        .iter()
        .copied()
        .filter(|n| needs_reboot(n) && !need_outlived(n))
        .filter(|n| !d.entries.contains_key(n.name_any().as_str()))
        // A need stamped before the reboot that was verified for it is
        // served (its clear is re-asserted): one reboot per need.
        .filter(|n| !d.prev(&n.name_any()).is_some_and(|e| stale_need(n, e)))
        .collect();
    let names: Vec<String> = candidates.iter().map(|n| n.name_any()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let holds_slot = |n: &str| d.entries.get(n).is_some_and(|e| e.phase.holds_slot());
    let nodes = || selected.iter().map(|n| n.as_ref());
    let mut limits = rollout::Admitting {
        what: "reboot",
        gates: &p.spec.gates,
        budget: &p.spec.budget,
        alerts: s.alerts,
        unlisted: s.gates_unlisted,
        window_open: window::open(windows, s.now),
        window_opens: window::next_opening(windows, s.now),
        // Any NodeMaintenance counts, a Failed one too until it is
        // deleted: budgets stay conservative.
        members: rollout::members(nodes(), |n| !nms_on(s, n).is_empty() || holds_slot(n)),
        others_not_ready: rollout::others_not_ready(nodes(), &names, holds_slot),
    };
    let mut admitted = Vec::new();
    for node in candidates {
        let n = node.name_any();
        if let Some(prev) = failed_this_boot(d, node) {
            // Not again until the node reboots or someone asks again
            // (`reboot-required` stamps a newer need).
            d.entries.insert(n, prev.clone());
            continue;
        }
        match wait(d, node, &limits, problems) {
            Some((reason, msg)) => {
                if reason == rollout::WAIT_PODS_UNREAD {
                    limits.take(&n);
                }
                d.set(&n, RebootPhase::Waiting, None, Some(reason), msg)
            }
            None => {
                limits.take(&n);
                admitted.push(take(d, node));
            }
        }
    }
    admitted
}

/// A need stamped in an earlier boot was served by the reboot since (one
/// nobody asked for included): cleared, never admitted.
fn clear_served_needs(d: &mut Decision, selected: &[&Arc<Node>]) {
    for n in selected.iter().filter(|n| {
        need_outlived(n)
            && !d
                .entries
                .get(n.name_any().as_str())
                .is_some_and(|e| e.phase.holds_slot())
    }) {
        d.effects.push(Effect::PatchNode {
            node: n.name_any(),
            resource_version: n.resource_version(),
            patch: clear_need_patch(n),
        });
    }
}

/// The node's entry if its reboot failed in this boot and nobody asked
/// again since.
fn failed_this_boot<'a>(d: &Decision<'a>, node: &Node) -> Option<&'a NodeReboot> {
    let boot = boot_id(node);
    d.prev(&node.name_any()).filter(|e| {
        e.phase == RebootPhase::Failed
            && e.boot_id_before.as_deref() == boot
            && needed_since(node).is_none_or(|t| t <= e.since.0)
    })
}

/// Why `node` waits, if it does: another policy governs it, a person
/// paused it, another maintenance holds it, the policy is invalid, its
/// boot cannot be told apart, its agent cannot reboot it, or the limits.
fn wait(
    d: &mut Decision,
    node: &Node,
    limits: &rollout::Admitting,
    problems: &[String],
) -> Option<(&'static str, String)> {
    let s = d.s;
    let n = node.name_any();
    // One owner per node: overlapping policies each admitted the node in
    // turn, so a reboot that failed under one was drained and tried again
    // under the next in the same boot.
    if let Some(g) = node::governing(node, s.policies).filter(|g| g.name_any() != d.name) {
        let msg = format!(
            "also selected by the older RebootPolicy {}, which reboots it",
            g.name_any()
        );
        return Some((WAIT_OTHER_POLICY, msg));
    }
    if paused(node) {
        return Some((WAIT_PAUSED, "paused by a reboot-paused annotation".into()));
    }
    let other_nm = nms_on(s, &n)
        .into_iter()
        .find(|m| !owned_by(m, &d.name) && disrupt::holds_node(m));
    if let Some(m) = other_nm {
        let msg = format!("in maintenance (NodeMaintenance {})", m.name_any());
        return Some((WAIT_IN_MAINTENANCE, msg));
    }
    if let Some(held) = disrupt::foreign_holder(node) {
        return Some(held);
    }
    if !problems.is_empty() {
        let msg = format!("the policy cannot be used: {}", problems.join("; "));
        return Some((WAIT_INVALID, msg));
    }
    if boot_id(node).is_none() {
        let msg = "the node reports no boot ID, so a reboot could not be verified";
        return Some((WAIT_NOT_READY, msg.into()));
    }
    if let Some(wait) = agent_check(d, node) {
        return Some(wait);
    }
    if let Some(w) = limits.wait(node, &(s.pods_on)(&n)) {
        return Some(w);
    }
    if let Some(w) = rollout::own_node_hold((s.own_node)(&n), true, |t| d.wake_in(t)) {
        return Some(w);
    }
    rollout::pods_hold((s.node_pods)(&n), s.now, |t| d.wake_in(t))
}

/// Take `node`: its NodeMaintenance created, its entry Draining, an event;
/// returns how the log line names it.
fn take(d: &mut Decision, node: &Node) -> String {
    let n = node.name_any();
    let boot = boot_id(node).unwrap_or_default().to_string();
    let nm = maintenance_for(d.s.policy, node, &boot);
    let what = format!(
        "admitted; draining through NodeMaintenance {}",
        nm.name_any()
    );
    d.effects.extend(stamp_need_boot(node, &boot));
    d.effects
        .push(Effect::CreateMaintenance { nm: Box::new(nm) });
    d.event(node, false, "RebootAdmitted", &what);
    d.set(
        &n,
        RebootPhase::Draining,
        Some(&boot),
        None,
        what.replacen("admitted; ", "", 1),
    );
    format!("{n} (boot {boot})")
}
