//! Surge: how many extra nodes a rollout has out, the requests recorded
//! on the NodeVersion before the provider is asked, and the PendingNode a
//! create-node answer is recorded as.

use super::*;
use crate::decide::rollout;

/// Surge requests recorded on the NodeVersion and not yet PendingNodes:
/// `(request id, group id)`.
pub fn surge_requests(nv: &NodeVersion) -> Vec<(String, String)> {
    nv.annotations()
        .get(SURGE_REQUESTS_ANNOTATION)
        .map(|v| {
            v.split(',')
                .filter_map(|r| r.split_once('='))
                .map(|(id, g)| (id.to_string(), g.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn write_requests(nv: &NodeVersion, requests: &[(String, String)]) -> Effect {
    let value = if requests.is_empty() {
        Value::Null
    } else {
        json!(
            requests
                .iter()
                .map(|(i, g)| format!("{i}={g}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    annotate(nv, SURGE_REQUESTS_ANNOTATION, value)
}

/// Set (`null`: remove) one of nodekeeper's annotations on the NodeVersion,
/// guarded by the resourceVersion it was decided on.
pub(super) fn annotate(nv: &NodeVersion, key: &str, value: Value) -> Effect {
    Effect::PatchObject {
        kind: Kind::NodeVersion,
        namespace: None,
        name: nv.name_any(),
        patch: json!({ "metadata": {
            "annotations": { key: value },
            "resourceVersion": nv.resource_version(),
        }}),
        status: false,
        strategic: false,
    }
}

/// Extra nodes a rollout has out now: heirs, awaiting nodes, obsolete
/// nodes (surplus still running: a surge node that joined outdated, or
/// with nothing left to replace), PendingNodes (joining or leaving) and
/// surge requests not yet PendingNodes.
pub(super) fn extra(s: &Snapshot, c: &Classes) -> usize {
    let recorded: Vec<String> = surge_requests(s.nv)
        .into_iter()
        .filter(|(id, _)| !s.pending.iter().any(|p| request_of(p) == Some(id.as_str())))
        .map(|(id, _)| id)
        .collect();
    c.heirs.len() + c.awaiting.len() + c.obsolete.len() + s.pending.len() + recorded.len()
}

/// The surge request a PendingNode was created for.
pub(super) fn request_of(p: &PendingNode) -> Option<&str> {
    p.annotations().get(REQUEST_LABEL).map(String::as_str)
}

/// PendingNode annotation: the surge request it records.
pub const REQUEST_LABEL: &str = "nodekeeper.io/surge-request";

/// A key's last failure still backing off: how long is left.
pub(super) fn backing_off(s: &Snapshot, key: &str) -> Option<Duration> {
    let f = s.failures.get(key)?;
    let until =
        f.at.checked_add(SignedDuration::try_from(PROVIDER_BACKOFF).unwrap_or_default())
            .ok()?;
    (until > s.now).then(|| crate::decide::duration_until(s.now, until))
}

pub(super) enum Step {
    Act(Vec<Effect>),
    Wait(Option<Duration>),
    Idle,
}

/// Surge nodes: a request recorded but not yet a PendingNode is asked of
/// the provider again (same id: the same instance), then recorded; new
/// requests go to the groups with outdated nodes — control-plane groups
/// first and alone while any control plane is outdated, then by name.
pub(super) fn surge_step(s: &Snapshot, c: &Classes, budget: usize, needs: &Needs) -> Step {
    let requests = surge_requests(s.nv);
    // (Requests already recorded as PendingNodes were dropped earlier in
    // the round.)
    // Every open request is asked in one round (a failure ends the batch).
    let mut asks = Vec::new();
    let mut wait = None;
    for (id, group) in &requests {
        let key = format!("create-node/{group}");
        match backing_off(s, &key) {
            Some(d) => wait = crate::decide::earliest(wait, Some(d)),
            None => asks.push(Effect::Provider {
                key,
                verb: "create-node",
                request: json!({ "groupId": group, "requestId": id }),
            }),
        }
    }
    if !asks.is_empty() {
        return Step::Act(asks);
    }
    if wait.is_some() {
        return Step::Wait(wait);
    }
    if budget == 0 || c.outdated.is_empty() {
        return Step::Idle;
    }
    let needed = &needs.per_group;
    wait = crate::decide::earliest(wait, needs.wait);
    let mut groups: Vec<&Arc<ScalingGroup>> = following(s)
        .filter(|g| {
            let id = g
                .spec
                .group_id
                .as_deref()
                .unwrap_or_default()
                .to_lowercase();
            needed.get(&id).copied().unwrap_or(0) > 0
        })
        .collect();
    groups.sort_by_key(|g| (g.spec.role.as_deref() != Some("ControlPlane"), g.name_any()));
    // As many requests as the budget allows, recorded in one write.
    let mut all = requests.clone();
    let mut left = budget;
    for g in groups {
        let id = g.spec.group_id.clone().unwrap_or_default();
        let current = g
            .status
            .as_ref()
            .and_then(|st| st.image_reference.as_deref());
        if !eq(current, s.nv.spec.image.as_deref()) {
            // The group still creates old nodes: wait for its image.
            continue;
        }
        if let Some(d) = backing_off(s, &format!("create-node/{id}")) {
            wait = crate::decide::earliest(wait, Some(d));
            continue;
        }
        let want = needed
            .get(&id.to_lowercase())
            .copied()
            .unwrap_or(0)
            .min(left);
        // Ids are the NodeVersion, the group, the instant and a counter,
        // hashed; one already out (recorded, or a PendingNode's) is
        // skipped. Two rounds at one instant gave a request the id of the
        // first round's, already a PendingNode: the round dropped it as
        // recorded and the next asked it again, back to back (a busy loop
        // the random worlds found; their clock stands still in a pass).
        let taken = |all: &[(String, String)], r: &str| {
            all.iter().any(|(x, _)| x == r) || s.pending.iter().any(|p| request_of(p) == Some(r))
        };
        let mut i = 0;
        for _ in 0..want {
            let request = loop {
                let r = format!(
                    "{:012x}",
                    super::disrupt::fnv(
                        format!("{}/{id}/{}/{i}", s.nv.uid().unwrap_or_default(), s.now).as_bytes()
                    ) & 0xffff_ffff_ffff
                );
                i += 1;
                if !taken(&all, &r) {
                    break r;
                }
            };
            all.push((request, id.clone()));
        }
        left -= want;
        if left == 0 {
            break;
        }
    }
    if all.len() > requests.len() {
        return Step::Act(vec![write_requests(s.nv, &all)]);
    }
    match wait {
        Some(d) => Step::Wait(Some(d)),
        None => Step::Idle,
    }
}

/// What the surge step may ask for this round ([`surge_needs`]).
#[derive(Default)]
pub(super) struct Needs {
    /// Surge nodes each eligible group (lowercased id) needs.
    pub per_group: BTreeMap<String, usize>,
    /// When to look again at nodes a pod's opt-out holds.
    pub wait: Option<Duration>,
    /// Outdated nodes that get no surge node while a pod's opt-out holds
    /// them: what the status says of each.
    pub held: Vec<String>,
}

/// How many surge nodes each group the rollout may grow now needs (the
/// control-plane groups alone while a control plane is outdated): its
/// outdated nodes not paired yet and not opted out of disruption, less
/// those covered by a joining node or an open request. A node one of
/// whose pods opts out (Karpenter's `karpenter.sh/do-not-disrupt`) gets no
/// surge node while it holds: the new node would wait unpaired, running
/// for nothing. Pods are read in name order and only until a group has
/// `covered + budget` free nodes, so a round reads a budget's worth of
/// nodes, not the rollout's; nodes whose pods are not read yet are asked
/// about (the service reads them and decides again) and count as held.
/// Nothing is read with no budget or nothing outdated.
pub(super) fn surge_needs(s: &Snapshot, c: &Classes, budget: usize) -> Needs {
    if budget == 0 || c.outdated.is_empty() {
        return Needs::default();
    }
    let cp = has_outdated_control_planes(s, c);
    // Joining PendingNodes and requests not yet recorded as one each
    // cover one outdated node.
    let mut covered: BTreeMap<String, usize> = BTreeMap::new();
    let joining = s
        .pending
        .iter()
        .filter(|p| p.spec.goal.as_deref() == Some("Join"))
        .filter_map(|p| p.spec.group_id.clone());
    let asked = surge_requests(s.nv).into_iter().map(|(_, g)| g);
    for g in joining.chain(asked) {
        *covered.entry(g.to_lowercase()).or_default() += 1;
    }
    let eligible: BTreeSet<String> = following(s)
        .filter(|g| !cp || g.spec.role.as_deref() == Some("ControlPlane"))
        .filter_map(|g| g.spec.group_id.as_deref().map(str::to_lowercase))
        .collect();
    let mut free: BTreeMap<String, usize> = BTreeMap::new();
    let mut needs = Needs::default();
    for n in &c.outdated {
        // Paired already, or opted out (no surge node for it meanwhile).
        if annotation(n, HEIR_ANNOTATION).is_some() || crate::decide::do_not_disrupt::node_holds(n)
        {
            continue;
        }
        let Some(g) = group_of(s, n).filter(|g| eligible.contains(g)) else {
            continue;
        };
        let enough = covered.get(&g).copied().unwrap_or(0) + budget;
        if free.get(&g).copied().unwrap_or(0) >= enough {
            continue;
        }
        let pods = (s.node_pods)(&n.name_any());
        let again = |d| needs.wait = crate::decide::earliest(needs.wait, Some(d));
        match rollout::pods_hold(pods, s.now, again) {
            Some((crate::decide::rollout::WAIT_PODS_UNREAD, _)) => {}
            Some((_, why)) => needs.held.push(format!("node {}: {why}", n.name_any())),
            None => *free.entry(g).or_default() += 1,
        }
    }
    needs.per_group = free
        .into_iter()
        .map(|(g, n)| {
            let left = n.saturating_sub(covered.get(&g).copied().unwrap_or(0));
            (g, left)
        })
        .collect();
    needs
}

/// The PendingNode a create-node answer is recorded as.
pub fn joining(s: &Snapshot, request: &str, group: &str, answer: &Value) -> Result<Value, String> {
    let name = ask::field(answer, "create-node", "nodeName")?;
    let pid = ask::field(answer, "create-node", "providerID")?;
    Ok(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "PendingNode",
        "metadata": {
            "name": name,
            "ownerReferences": owned(s),
            "annotations": { REQUEST_LABEL: request },
        },
        "spec": {
            "providerID": pid,
            "groupID": group,
            "nodeName": name,
            "goal": "Join",
            "deadline": plus(s.now, s.nv.spec.join_timeout_seconds),
        }
    }))
}
