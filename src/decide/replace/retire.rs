//! Pairing and retiring: a joined surge node pairs with an outdated node
//! of its group (heir and donor), inherits its labels, and the donor is
//! drained through a NodeMaintenance and deleted through a Leave
//! PendingNode.

use super::*;
use crate::decide::rollout;

/// Labels a heir takes from its donor: all but the reserved
/// `kubernetes.io` and `k8s.io` ones (and their subdomains).
pub fn inherited(n: &Node) -> BTreeMap<&String, &String> {
    n.labels().iter().filter(|(k, _)| !reserved(k)).collect()
}

/// `^(.+\.|)(kubernetes|k8s)\.io(/.*)?$`, by hand.
pub fn reserved(key: &str) -> bool {
    let prefix = key.split_once('/').map_or(key, |(p, _)| p);
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")))
}

pub(super) fn unset(n: &Node, key: &str) -> Effect {
    Effect::PatchNode {
        node: n.name_any(),
        resource_version: n.resource_version(),
        patch: json!({ "metadata": { "annotations": { key: null } } }),
    }
}

pub(super) fn set(n: &Node, key: &str, value: &str) -> Effect {
    Effect::PatchNode {
        node: n.name_any(),
        resource_version: n.resource_version(),
        patch: json!({ "metadata": { "annotations": { key: value } } }),
    }
}

pub(super) fn delete_pending(p: &PendingNode) -> Effect {
    Effect::DeleteObject {
        kind: Kind::PendingNode,
        name: p.name_any(),
        uid: p.uid(),
    }
}

/// Each joined surge node pairs with an outdated node of its scaling group
/// (mints and outdated nodes by name, so the order is deterministic), or
/// is obsolete when none is left. Every joined node pairs in the same
/// round: with maxSurge 3 a wave's three nodes pair at once instead of one
/// per round, each round waiting for the watches and the provider.
pub(super) fn pair(s: &Snapshot, c: &Classes) -> Option<Plan> {
    let mut mints: Vec<&(&Node, &PendingNode)> = c.mints.iter().collect();
    mints.sort_by_key(|(m, _)| m.name_any());
    let mut taken: Vec<String> = Vec::new();
    let (mut fx, mut lines) = (leftover_joins(s, c), Vec::new());
    for (mint, pn) in mints {
        let group = pn
            .spec
            .group_id
            .as_deref()
            .unwrap_or_default()
            .to_lowercase();
        let mut outdated: Vec<&&Node> = c
            .outdated
            .iter()
            .filter(|o| group_of(s, o).as_deref() == Some(group.as_str()))
            .filter(|o| !crate::decide::do_not_disrupt::node_holds(o))
            .filter(|o| !taken.contains(&o.name_any()))
            .collect();
        outdated.sort_by_key(|o| o.name_any());
        match free_donor(s, &outdated) {
            Donor::Waiting => continue,
            Donor::Free(donor) => {
                taken.push(donor.name_any());
                fx.extend([
                    set(mint, DONOR_ANNOTATION, &donor.name_any()),
                    set(donor, HEIR_ANNOTATION, &mint.name_any()),
                    delete_pending(pn),
                ]);
                lines.push(format!(
                    "node {} replaces node {}",
                    mint.name_any(),
                    donor.name_any()
                ));
            }
            Donor::None => {
                fx.extend([delete_pending(pn), set(mint, OBSOLETE_ANNOTATION, "true")]);
                lines.push(format!(
                    "node {} joined with nothing left to replace in its group: obsolete",
                    mint.name_any()
                ));
            }
        }
    }
    (!fx.is_empty()).then(|| Plan::steps(fx).info(lines.join("; ")))
}

/// Join PendingNodes of nodes already paired (the donor names the heir
/// back) or called obsolete: the pairing's delete did not go through (a
/// refused or lost write). Deleted now: left, a heir released once its
/// donor is gone would look like a new node and pair again — two nodes
/// replaced by one (found by the random worlds, `tests/world.rs`). A
/// pairing only half written keeps its PendingNode: unpaired, the node
/// pairs again.
fn leftover_joins(s: &Snapshot, c: &Classes) -> Vec<Effect> {
    let paired = c.heirs.iter().filter(|h| {
        let donor = annotation(h, DONOR_ANNOTATION).unwrap_or_default();
        c.donors.iter().any(|d| {
            d.name_any() == donor && annotation(d, HEIR_ANNOTATION) == Some(h.name_any().as_str())
        })
    });
    let placed: BTreeSet<String> = paired
        .chain(c.obsolete.iter())
        .map(|n| n.name_any())
        .collect();
    s.pending
        .iter()
        .filter(|p| p.spec.goal.as_deref() == Some("Join"))
        .filter(|p| {
            p.spec
                .node_name
                .as_ref()
                .is_some_and(|n| placed.contains(n))
        })
        .map(|p| delete_pending(p))
        .collect()
}

enum Donor<'n> {
    Free(&'n Node),
    /// Outdated nodes are left, but a pod opted out of disruption holds
    /// each (or is not read yet): the new node waits unpaired rather than
    /// becoming obsolete, which would only ask for another.
    Waiting,
    None,
}

/// The first outdated node (by name) none of whose pods opts out of
/// disruption (Karpenter's `karpenter.sh/do-not-disrupt`). Pods are read
/// in that order and only until one is free, so a round reads the pods of
/// a few nodes, not of every outdated one.
fn free_donor<'n>(s: &Snapshot, outdated: &[&&'n Node]) -> Donor<'n> {
    let mut held = false;
    for o in outdated {
        match (s.node_pods)(&o.name_any()) {
            None => return Donor::Waiting,
            Some(pods) if crate::decide::do_not_disrupt::longest(&pods, s.now).is_some() => {
                held = true;
            }
            Some(_) => return Donor::Free(o),
        }
    }
    if held { Donor::Waiting } else { Donor::None }
}

/// Heirs whose donor does not name them back, and donors whose heir does
/// not name them back, lose the annotation.
/// A heir whose donor is gone keeps its annotation: it inherited, and is
/// released by the round after. (Only the donor's side was once undone: a
/// pairing whose donor write was refused left the heir paired with a
/// node that never named it, holding a surge slot for good while that
/// node waited for another — found by the random worlds.)
pub(super) fn unpair(s: &Snapshot, c: &Classes) -> Option<Plan> {
    let mut fx = Vec::new();
    for d in &c.donors {
        let heir = annotation(d, HEIR_ANNOTATION).unwrap_or_default();
        let named_back = c.heirs.iter().any(|h| {
            h.name_any() == heir && annotation(h, DONOR_ANNOTATION) == Some(d.name_any().as_str())
        });
        if !named_back {
            fx.push(unset(d, HEIR_ANNOTATION));
        }
    }
    for h in &c.heirs {
        let donor = annotation(h, DONOR_ANNOTATION).unwrap_or_default();
        let names_back = |n: &&Arc<Node>| {
            n.name_any() == donor && annotation(n, HEIR_ANNOTATION) == Some(h.name_any().as_str())
        };
        let donor_here = s.nodes.iter().any(|n| n.name_any() == donor);
        if donor_here && !s.nodes.iter().any(|n| names_back(&n)) {
            fx.push(unset(h, DONOR_ANNOTATION));
        }
    }
    (!fx.is_empty()).then(|| Plan::steps(fx))
}

/// How long a donor's Failed NodeMaintenance stays before it is given
/// back and the node taken again.
const FAILED_DRAIN_RETRY_SECONDS: i64 = 30;

/// How often a donor whose drain is past its deadline is looked at when no
/// event comes (the drain's end kicks the task).
const OVERDUE_RECHECK: Duration = Duration::from_secs(60);

pub(super) enum Retire {
    Act(Vec<Effect>),
    Wait(Option<Duration>),
    Gone,
}

/// The NodeMaintenance this NodeVersion takes `node` with.
pub(super) fn maintenance_of<'a>(s: &'a Snapshot, node: &str) -> Option<&'a Arc<NodeMaintenance>> {
    s.maintenances
        .iter()
        .find(|m| m.spec.node_name == node && disrupt::owned_by(m, "NodeVersion", &s.nv.name_any()))
}

/// Take a node out: drain it through a NodeMaintenance, then (control
/// plane: its etcd member removed through the provider) record the Leave,
/// delete the Node and give the maintenance back. The instance is deleted
/// by the Leave's lifecycle, so a crash after the Node is gone still
/// deletes it exactly once.
pub(super) fn retire(s: &Snapshot, node: &Node) -> Retire {
    let name = node.name_any();
    let Some(nm) = maintenance_of(s, &name) else {
        // Another disruption holds the node (an administrator's
        // maintenance preempted ours, a reboot): ours would only fail
        // again. Its end is a NodeMaintenance event, which kicks us.
        if disrupt::held_by_other(s.maintenances, &name, |_| false).is_some() {
            return Retire::Wait(None);
        }
        // Karpenter's opt-out on the node: not drained while it is there
        // (its removal is a node event, which kicks us).
        if crate::decide::do_not_disrupt::node_holds(node) {
            return Retire::Wait(None);
        }
        // A pod's opt-out: waits until it is taken off (a pod event
        // wakes nothing here, so look again) or its duration ends.
        let mut again = None;
        if rollout::pods_hold((s.node_pods)(&name), s.now, |d| again = Some(d)).is_some() {
            return Retire::Wait(again);
        }
        let owner = disrupt::owner_ref(s.nv, "NodeVersion");
        let drain = DrainSpec {
            timeout_seconds: s.nv.spec.drain_timeout_seconds.clamp(1, 86400) as i32,
            ..Default::default()
        };
        let nm = disrupt::take(
            owner,
            &disrupt::maintenance_name(MAINTENANCE_PREFIX, &name),
            &name,
            &drain,
            disrupt::boot_id(node).unwrap_or_default(),
            REASON.into(),
        );
        return Retire::Act(vec![Effect::CreateMaintenance { nm: Box::new(nm) }]);
    };
    match nm.status.as_ref().and_then(|st| st.phase) {
        Some(Phase::Succeeded) => {}
        Some(Phase::Failed) if nm.is_deleting() => return Retire::Wait(None),
        Some(Phase::Failed) => {
            // Preempted by an administrator's maintenance, or the medik8s
            // lease held by a remediator: the donor waited for ever. Give
            // the node back, after a pause so a lease that stays held is
            // not fought for in a loop; it is taken again once nothing
            // else holds it.
            let failed_at = nm.status.as_ref().and_then(|st| st.last_update.as_ref());
            let retry = failed_at.map(|t| plus(t.0, FAILED_DRAIN_RETRY_SECONDS));
            if let Some(t) = retry.filter(|t| *t > s.now) {
                return Retire::Wait(Some(crate::decide::duration_until(s.now, t)));
            }
            return Retire::Act(nm.uid().map_or_else(Vec::new, |uid| {
                vec![Effect::DeleteMaintenance {
                    nm: nm.name_any(),
                    uid,
                }]
            }));
        }
        _ => {
            // A deadline that has passed is reported by the drain itself
            // (DrainOverdue) and ends with a NodeMaintenance event: it
            // means "look again later", never "now" (0 made the task run
            // its passes back to back for as long as the drain was late).
            let until = drain_deadline(s, nm)
                .map(|t| crate::decide::duration_until(s.now, t))
                .filter(|d| !d.is_zero())
                .unwrap_or(OVERDUE_RECHECK);
            return Retire::Wait(Some(until));
        }
    }
    let mut fx = Vec::new();
    let key = format!("remove-etcd-member/{name}");
    if is_control_plane(node) {
        if let Some(d) = backing_off(s, &key) {
            return Retire::Wait(Some(d));
        }
        // The member is found by this address. Without one Constellation
        // stops here ("no VPC IP found"); an empty one would find no
        // member, which its etcd client answers as removed, and the node
        // would go while its member stays. Kept and said instead
        // (`classify::message`); the address appearing is a node event.
        let ip = internal_ip(node);
        if ip.is_empty() {
            return Retire::Wait(Some(OVERDUE_RECHECK));
        }
        fx.push(Effect::Provider {
            key,
            verb: "remove-etcd-member",
            request: json!({ "nodeName": name, "internalIP": ip }),
        });
    }
    let leave_exists = s
        .pending
        .iter()
        .any(|p| p.name_any() == name && p.spec.goal.as_deref() == Some("Leave"));
    if !leave_exists {
        fx.push(Effect::CreateObject {
            kind: Kind::PendingNode,
            object: leave(s, node),
        });
    }
    fx.push(Effect::DeleteNode {
        name: name.clone(),
        uid: node.uid(),
    });
    if let Some(uid) = nm.uid() {
        fx.push(Effect::DeleteMaintenance {
            nm: nm.name_any(),
            uid,
        });
    }
    if fx.is_empty() {
        Retire::Gone
    } else {
        Retire::Act(fx)
    }
}

/// The node's `InternalIP` address (empty if it reports none): what a
/// control plane's `remove-etcd-member` names, as Constellation finds the
/// member by its VPC IP.
pub fn internal_ip(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .unwrap_or_default()
}

pub(super) fn plus(now: Timestamp, secs: i64) -> Timestamp {
    now.checked_add(SignedDuration::from_secs(secs))
        .unwrap_or(now)
}

/// A controller owner reference to the NodeVersion, as JSON.
pub(super) fn owned(s: &Snapshot) -> Value {
    json!([disrupt::owner_ref(s.nv, "NodeVersion")])
}

pub(super) fn leave(s: &Snapshot, node: &Node) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "PendingNode",
        "metadata": { "name": node.name_any(), "ownerReferences": owned(s) },
        "spec": {
            "providerID": provider_id(node),
            "groupID": annotation(node, SCALING_GROUP_ANNOTATION),
            "nodeName": node.name_any(),
            "goal": "Leave",
            "deadline": plus(s.now, s.nv.spec.leave_timeout_seconds),
        }
    })
}

/// When a drain counts as overdue.
pub(super) fn drain_deadline(s: &Snapshot, nm: &NodeMaintenance) -> Option<Timestamp> {
    let created = nm.metadata.creation_timestamp.as_ref()?.0;
    Some(plus(created, s.nv.spec.drain_timeout_seconds))
}
