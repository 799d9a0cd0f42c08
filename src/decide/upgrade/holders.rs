//! Which UpgradePlan holds a node: the one that governs it when several
//! select it, another exclusive plan at work, and what a plan that is gone
//! left behind (NodeMaintenances, marks).

use super::*;

/// NodeMaintenances an UpgradePlan took nodes with whose plan is gone.
pub fn orphans(maintenances: &[Arc<NodeMaintenance>], plans: &[Arc<UpgradePlan>]) -> Vec<Effect> {
    let live: Vec<(String, Option<String>)> = plans
        .iter()
        .map(|p| (p.name_any(), p.metadata.uid.clone()))
        .collect();
    disrupt::orphans(maintenances, OWNER_KIND, &live)
}

/// Marks UpgradePlans left on nodes they no longer govern (the plan was
/// deleted, or the node relabelled out of its selector): removed,
/// level-triggered ([`crate::decide::marking::orphaned`]).
pub fn orphaned_marks(nodes: &[Arc<Node>], plans: &[Arc<UpgradePlan>]) -> Vec<Effect> {
    nodes
        .iter()
        .filter_map(|n| {
            let owner = governing(n, plans).map(|p| format!("{OWNER_KIND}/{}", p.name_any()));
            marking::orphaned(n, OWNER_KIND, owner.as_deref())
        })
        .collect()
}

/// Another exclusive plan that still has a node, when `plan` is exclusive:
/// its name. It has one while an entry is admitted or a NodeMaintenance it
/// owns is there (a `Done` node is given back only once that is gone).
/// Plans are decided one after the other by one writer, each on the
/// others' latest status, so two never both admit.
pub fn exclusive_with(
    plan: &UpgradePlan,
    plans: &[Arc<UpgradePlan>],
    maintenances: &[Arc<NodeMaintenance>],
) -> Option<String> {
    if !plan.spec.exclusive {
        return None;
    }
    plans
        .iter()
        .filter(|o| o.spec.exclusive && o.name_any() != plan.name_any())
        .find(|o| {
            let name = o.name_any();
            o.status
                .as_ref()
                .is_some_and(|s| s.nodes.iter().any(|e| e.phase.admitted()))
                || maintenances.iter().any(|m| owned_by(m, OWNER_KIND, &name))
        })
        .map(|o| o.name_any())
}

/// The plan that upgrades `node` when several select it: the oldest (then
/// by name), as for RebootPolicies.
pub fn governing<'a>(node: &Node, plans: &'a [Arc<UpgradePlan>]) -> Option<&'a Arc<UpgradePlan>> {
    plans.iter().filter(|p| selects(p, node)).min_by(|a, b| {
        let key = |p: &UpgradePlan| {
            (
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                p.name_any(),
            )
        };
        key(a).cmp(&key(b))
    })
}

/// Does `plan` select `node` (its selector, and a group when it has
/// groups)? A selector the plan cannot use selects nothing, so a broken
/// plan never holds a node from a working one.
fn selects(plan: &UpgradePlan, node: &Node) -> bool {
    let labels = node.labels();
    let usable = |sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector| {
        check_selector(sel).is_ok() && selector_matches(sel, labels)
    };
    plan.spec.node_selector.as_ref().is_none_or(usable)
        && (plan.spec.groups.is_empty()
            || plan.spec.groups.iter().any(|g| usable(&g.node_selector)))
}
