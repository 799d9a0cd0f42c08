//! One UpgradePlan pass's admissions: the candidates (selected, not held,
//! not finished) are admitted in group and name order while the plan is
//! usable and unpaused, its group is the one being upgraded and the
//! window, the gates and the budget allow; the others wait and say why.

use super::*;

/// What the pass found before its admissions.
pub(super) struct Admission<'a> {
    pub selected: &'a [(usize, &'a Arc<Node>)],
    pub windows: &'a [window::Parsed],
    pub problems: &'a [String],
    /// The failed node the plan pauses after (`onFailure: Pause`).
    pub failure_pause: Option<&'a str>,
    /// The group being upgraded.
    pub current: Option<usize>,
}

/// Admit what the limits allow; returns the nodes admitted, for the
/// pass's log line.
pub(super) fn admit(
    d: &mut Decision,
    a: &Admission,
    candidates: Vec<(usize, &Arc<Node>)>,
) -> Vec<String> {
    let s = d.s;
    let p = s.plan;
    if let Some(t) = window::next_change(a.windows, s.now) {
        d.wake_at(t);
    }
    let names: Vec<String> = candidates.iter().map(|(_, n)| n.name_any()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let admitted_entry = |n: &str| d.entries.get(n).is_some_and(|e| e.phase.admitted());
    let nodes = || a.selected.iter().map(|(_, n)| n.as_ref());
    let in_maintenance = |n: &str| s.maintenances.iter().any(|m| m.spec.node_name == n);
    let mut limits = rollout::Admitting {
        what: "upgrade",
        gates: &p.spec.gates,
        budget: &p.spec.budget,
        alerts: s.alerts,
        unlisted: s.gates_unlisted,
        window_open: window::open(a.windows, s.now),
        window_opens: window::next_opening(a.windows, s.now),
        members: rollout::members(nodes(), |n| in_maintenance(n) || admitted_entry(n)),
        others_not_ready: rollout::others_not_ready(nodes(), &names, admitted_entry),
    };
    let mut admitted = Vec::new();
    for (g, node) in candidates {
        let n = node.name_any();
        match wait(d, a, g, node, &limits) {
            Some((reason, msg)) => {
                if reason == rollout::WAIT_PODS_UNREAD {
                    limits.take(&n);
                }
                d.set(
                    &n,
                    UpgradePhase::Waiting,
                    group_name(p, g),
                    Some(reason),
                    msg,
                )
            }
            None => {
                limits.take(&n);
                d.admit(node, group_name(p, g));
                admitted.push(n);
            }
        }
    }
    admitted
}

/// Why `node` (of group `g`) waits, if it does: the plan is invalid,
/// paused or paused after a failure, another exclusive plan is at work,
/// its group's turn has not come, another maintenance holds it, its boot
/// cannot be told apart, this version already ran on it in this boot, its
/// agent cannot run the command, or the limits.
fn wait(
    d: &mut Decision,
    a: &Admission,
    g: usize,
    node: &Node,
    limits: &rollout::Admitting,
) -> Option<(&'static str, String)> {
    let s = d.s;
    let p = s.plan;
    let n = node.name_any();
    if !a.problems.is_empty() {
        let msg = format!("the plan cannot be used: {}", a.problems.join("; "));
        return Some((WAIT_INVALID, msg));
    }
    if p.spec.paused {
        return Some((WAIT_PAUSED, "the plan is paused".into()));
    }
    if let Some(f) = a.failure_pause {
        let msg = format!(
            "paused after node {f} failed (onFailure: Pause); change the spec to retry, e.g. pause and unpause the plan"
        );
        return Some((WAIT_FAILURE, msg));
    }
    if let Some(other) = exclusive_with(p, s.plans, s.maintenances) {
        let msg = format!("the exclusive UpgradePlan {other} is upgrading a node");
        return Some((WAIT_EXCLUSIVE, msg));
    }
    if Some(g) != a.current {
        let waits_for = a.current.and_then(|c| group_name(p, c)).unwrap_or_default();
        return Some((WAIT_GROUP, format!("waits for group {waits_for} to finish")));
    }
    let other_nm = s.maintenances.iter().find(|m| {
        m.spec.node_name == n && !owned_by(m, OWNER_KIND, &d.name) && disrupt::holds_node(m)
    });
    if let Some(m) = other_nm {
        let msg = format!("in maintenance (NodeMaintenance {})", m.name_any());
        return Some((WAIT_IN_MAINTENANCE, msg));
    }
    if let Some(held) = disrupt::foreign_holder(node) {
        return Some(held);
    }
    let Some(boot) = boot_id(node) else {
        let msg = "the node reports no boot ID, so its upgrade could not be tracked";
        return Some((WAIT_NOT_READY, msg.into()));
    };
    // Another plan's attempt in this boot is not repeated: a plan deleted
    // after its upgrade failed gave the node back, and the next plan
    // drained it and ran the command again.
    if let Some(other) = node::issued_for(node, s.target(), boot).filter(|o| *o != d.name) {
        let msg = format!(
            "the upgrade to {} already ran on it in this boot (UpgradePlan {other}) and it does not report that version; not run again until the node reboots",
            s.target()
        );
        return Some((WAIT_ISSUED, msg));
    }
    if let Some(w) = agent_check(d, node, p) {
        return Some(w);
    }
    if let Some(w) = limits.wait(node, &(s.pods_on)(&n)) {
        return Some(w);
    }
    let gives_back = node::agent_gives_back(p);
    if let Some(w) = rollout::own_node_hold((s.own_node)(&n), gives_back, |t| d.wake_in(t)) {
        return Some(w);
    }
    rollout::pods_hold((s.node_pods)(&n), s.now, |t| d.wake_in(t))
}
