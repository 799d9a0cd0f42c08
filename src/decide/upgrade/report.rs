//! What an UpgradePlan's decision reports: its status from the entries
//! (counts, the current group, conditions) and the condition of a channel
//! asked over plain http.

use super::*;

/// Condition and Event of a plan whose channel is asked over plain http.
pub(super) const INSECURE_CHANNEL: &str = "InsecureChannel";

pub(super) const PLAIN_HTTP: &str = "the channel is asked over plain http: whoever is on the path names the version nodes are upgraded to; use https";

/// `InsecureChannel=True` while the channel's URL is plain http (allowed,
/// as SUC allows it, but said), gone otherwise.
fn insecure_channel(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    p: &UpgradePlan,
    now: Timestamp,
) {
    let plain = p.spec.channel.as_deref().is_some_and(|u| {
        u.get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
    });
    if plain {
        crate::decide::set_condition(
            conds,
            now,
            INSECURE_CHANNEL,
            "True",
            "PlainHTTP",
            PLAIN_HTTP,
        );
    } else {
        conds.retain(|c| c.type_ != INSECURE_CHANNEL);
    }
}

/// The status from the entries: counts, the current group, conditions.
pub(super) fn status(
    s: &Snapshot,
    old: &UpgradePlanStatus,
    entries: BTreeMap<String, NodeUpgrade>,
    problems: &[String],
    failure_pause: Option<String>,
    current: Option<usize>,
) -> UpgradePlanStatus {
    let (p, now) = (s.plan, s.now);
    let nodes: Vec<NodeUpgrade> = entries.into_values().collect();
    let count =
        |f: &dyn Fn(UpgradePhase) -> bool| nodes.iter().filter(|e| f(e.phase)).count() as i32;
    let mut conds = old.conditions.clone().unwrap_or_default();
    let set = |conds: &mut Vec<_>, t: &str, st: &str, r: &str, m: &str| {
        crate::decide::set_condition(conds, now, t, st, r, m)
    };
    if problems.is_empty() {
        set(&mut conds, "Valid", "True", "Valid", "the plan can be used");
    } else {
        set(
            &mut conds,
            "Valid",
            "False",
            WAIT_INVALID,
            &problems.join("; "),
        );
    }
    if p.spec.paused {
        set(
            &mut conds,
            "Paused",
            "True",
            WAIT_PAUSED,
            "spec.paused is true",
        );
    } else if let Some(f) = &failure_pause {
        let why = nodes
            .iter()
            .find(|e| &e.name == f)
            .and_then(|e| e.message.clone())
            .unwrap_or_default();
        let msg =
            format!("node {f} failed: {why}; no further node is admitted until the spec changes");
        set(&mut conds, "Paused", "True", WAIT_FAILURE, &msg);
    } else {
        set(&mut conds, "Paused", "False", "Running", "admitting nodes");
    }
    // A selector that matches nothing is not invalid, but a person who
    // wrote it wants to know ("0 of 0 nodes" said nothing).
    if nodes.is_empty() && problems.is_empty() {
        let msg = "the plan's selectors select no node";
        set(&mut conds, "NodesSelected", "False", "NoNodes", msg);
    } else {
        let msg = "the plan's selectors select nodes";
        set(&mut conds, "NodesSelected", "True", "NodesSelected", msg);
    }
    let done = count(&|ph| ph == UpgradePhase::Done);
    if !nodes.is_empty() && done as usize == nodes.len() {
        let msg = format!("every selected node is at version {}", s.target());
        set(&mut conds, "Complete", "True", "Complete", &msg);
    } else {
        let msg = format!(
            "{done} of {} selected nodes at version {}",
            nodes.len(),
            s.target()
        );
        set(&mut conds, "Complete", "False", "InProgress", &msg);
    }
    crate::decide::set_failing(&mut conds, now, s.failing);
    insecure_channel(&mut conds, p, now);
    UpgradePlanStatus {
        pending: count(&|ph| matches!(ph, UpgradePhase::Pending | UpgradePhase::Waiting)),
        upgrading: count(&|ph| ph.admitted()),
        done,
        failed: count(&|ph| ph == UpgradePhase::Failed),
        group: current
            .and_then(|g| p.spec.groups.get(g))
            .map(|g| g.name.clone()),
        nodes,
        observed_generation: p.metadata.generation,
        conditions: Some(conds),
        notifications: s.notified.cloned().or_else(|| old.notifications.clone()),
        channel: p
            .spec
            .channel
            .as_ref()
            .and_then(|_| s.channel.cloned().or_else(|| old.channel.clone())),
    }
}
