//! Replacing outdated nodes: surge requests recorded then asked, joined
//! nodes paired with donors, donors inheriting labels, drained and
//! retired, overdue drains, and provider failures backing off. (Control
//! planes: `control_planes.rs`.)

use super::*;

/// Three outdated workers in one group moving to img-2, surge `surge`.
pub(super) fn three_outdated_workers(surge: i32) -> World {
    let mut w = World::new("img-2", surge);
    w.nodes = vec![
        node("a", "g", "img-1", &[]),
        node("b", "g", "img-1", &[]),
        node("c", "g", "img-1", &[]),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.settle_status();
    w
}

/// The surge requests the first decision records (its first effect, the
/// guarded write), and that write's resourceVersion.
fn recorded_requests(w: &World) -> (String, serde_json::Value) {
    let plan = decide(&w.snap());
    let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    let reqs = patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (reqs, patch["metadata"]["resourceVersion"].clone())
}

#[test]
fn surge_records_its_requests_before_asking_the_provider() {
    let mut w = three_outdated_workers(2);
    // Surge 2: two requests, recorded in one guarded write.
    let (reqs, rv) = recorded_requests(&w);
    let ids: Vec<&str> = reqs
        .split(',')
        .map(|r| r.split('=').next().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{reqs}");
    assert_ne!(ids[0], ids[1]);
    assert_eq!(rv, "7");
    // Recorded: the next round asks the provider for both, by id.
    w.nv.metadata.annotations =
        Some([(SURGE_REQUESTS_ANNOTATION.to_string(), reqs.clone())].into());
    w.settle_status();
    assert_eq!(w.nv.status.as_ref().unwrap().budget, 0);
    let plan = decide(&w.snap());
    let asked: Vec<&str> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Provider {
                verb: "create-node",
                request,
                ..
            } => request["requestId"].as_str(),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ids);
    // Once a PendingNode records a request, the request leaves the
    // annotation; the other stays.
    let mut p = (*pending("new-1", "g", "Join", "Creating")).clone();
    p.metadata.annotations = Some([(REQUEST_LABEL.to_string(), ids[0].to_string())].into());
    w.pending = vec![Arc::new(p)];
    w.settle_status();
    let plan = decide(&w.snap());
    let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(
        patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION],
        json!(reqs.split(',').nth(1).unwrap())
    );
}

/// Constellation's own `maxNodeBudget` (its CLI writes it; upstream
/// `api/v1alpha1/nodeversion_types.go`) is the surge when set
/// (where-features-meet.md C2: it was pruned).
#[test]
fn constellations_max_node_budget_is_the_surge_when_set() {
    let mut w = three_outdated_workers(1);
    w.nv.spec.max_node_budget = Some(3);
    w.settle_status();
    let (reqs, _) = recorded_requests(&w);
    assert_eq!(reqs.split(',').count(), 3, "{reqs}");
}

#[test]
fn no_surge_while_the_group_still_has_the_old_image_or_the_budget_is_spent() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("a", "g", "img-1", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-1")];
    w.settle_status();
    assert!(decide(&w.snap()).effects.is_empty());
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.pending = vec![pending("x", "g", "Join", "Creating")];
    w.settle_status();
    assert_eq!(w.nv.status.as_ref().unwrap().budget, 0);
    assert!(decide(&w.snap()).effects.is_empty());
}

#[test]
fn a_joined_node_pairs_with_the_first_outdated_node_of_its_group() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("b-old", "g", "img-1", &[]),
        node("a-old", "g", "img-1", &[]),
        node("other", "h", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    let patches: Vec<String> = plan
        .effects
        .iter()
        .map(|e| match e {
            Effect::PatchNode { node, patch, .. } => {
                format!("{node} {}", patch["metadata"]["annotations"])
            }
            Effect::DeleteObject { name, .. } => format!("delete {name}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        patches,
        [
            format!("new {{\"{DONOR_ANNOTATION}\":\"a-old\"}}"),
            format!("a-old {{\"{HEIR_ANNOTATION}\":\"new\"}}"),
            "delete new".to_string(),
        ]
    );
}

#[test]
fn a_joined_node_with_nothing_to_replace_is_obsolete() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("old", "h", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(matches!(&plan.effects[0], Effect::DeleteObject { name, .. } if name == "new"));
    assert!(
        matches!(&plan.effects[1], Effect::PatchNode { node, patch, .. } if node == "new" && patch["metadata"]["annotations"][OBSOLETE_ANNOTATION] == "true")
    );
}

pub(super) fn nm_for(w: &World, node: &str, phase: Option<Phase>) -> Arc<NodeMaintenance> {
    let mut nm = disrupt::take(
        disrupt::owner_ref(&w.nv, "NodeVersion"),
        &disrupt::maintenance_name(MAINTENANCE_PREFIX, node),
        node,
        &DrainSpec::default(),
        "",
        REASON.into(),
    );
    nm.metadata.uid = Some(format!("nm-{node}"));
    nm.metadata.creation_timestamp = Some(Time(now()));
    nm.status = phase.map(|p| NodeMaintenanceStatus {
        phase: Some(p),
        ..Default::default()
    });
    Arc::new(nm)
}

#[test]
fn a_donor_inherits_labels_then_is_drained_then_deleted_with_a_leave() {
    let mut w = World::new("img-2", 1);
    let mut donor = (*node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")])).clone();
    donor
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("node.kubernetes.io/instance-type".into(), "big".into());
    donor
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "b".into());
    w.nodes = vec![
        Arc::new(donor),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    w.settle_status();
    // Labels first, reserved ones left out.
    let plan = decide(&w.snap());
    let Some(Effect::PatchNode { node, patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(node, "new");
    assert_eq!(patch["metadata"]["labels"], json!({ "team": "b" }));
    let mut heir = (*w.nodes[1]).clone();
    heir.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "b".into());
    w.nodes[1] = Arc::new(heir);
    // Then the drain, through a NodeMaintenance the NodeVersion owns.
    let plan = decide(&w.snap());
    let Some(Effect::CreateMaintenance { nm }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(nm.spec.node_name, "old");
    assert_eq!(nm.spec.reason.as_deref(), Some(REASON));
    w.maintenances = vec![nm_for(&w, "old", Some(Phase::Running))];
    assert!(decide(&w.snap()).effects.is_empty());
    // Drained: Leave recorded, Node deleted, maintenance given back.
    w.maintenances = vec![nm_for(&w, "old", Some(Phase::Succeeded))];
    let plan = decide(&w.snap());
    let kinds: Vec<String> = plan
        .effects
        .iter()
        .map(|e| match e {
            Effect::CreateObject { object, .. } => format!(
                "create {} {}",
                object["spec"]["goal"], object["metadata"]["name"]
            ),
            Effect::DeleteNode { name, .. } => format!("delete node {name}"),
            Effect::DeleteMaintenance { nm, .. } => format!("give back {nm}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "create \"Leave\" \"old\"",
            "delete node old",
            "give back replace-old"
        ]
    );
}

#[test]
fn an_overdue_drain_keeps_the_node_and_says_so() {
    let mut w = World::new("img-2", 1);
    w.nv.spec.drain_timeout_seconds = 60;
    w.nodes = vec![
        node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")]),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    let mut nm = (*nm_for(&w, "old", Some(Phase::Running))).clone();
    nm.metadata.creation_timestamp = Some(Time("2026-11-22T11:50:00Z".parse().unwrap()));
    w.maintenances = vec![Arc::new(nm)];
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("the drain of node old is overdue")
    );
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects.iter().all(|e| matches!(
            e,
            Effect::Event {
                reason: "DrainOverdue",
                ..
            }
        )),
        "{plan:?}"
    );
    assert_eq!(plan.effects.len(), 1);
}

#[test]
fn a_failed_provider_write_backs_off() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("a", "g", "img-1", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.nv.metadata.annotations =
        Some([(SURGE_REQUESTS_ANNOTATION.to_string(), "r1=g".to_string())].into());
    w.failures.insert(
        "create-node/g".into(),
        Failure {
            message: "provider create-node: exited with 1: quota".into(),
            at: now(),
        },
    );
    w.settle_status();
    assert!(
        w.nv.status
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("quota")
    );
    let plan = decide(&w.snap());
    assert!(plan.effects.is_empty(), "{plan:?}");
    assert!(matches!(plan.then, crate::decide::Then::Wait(Some(d)) if d <= PROVIDER_BACKOFF));
}

#[test]
fn a_recorded_request_is_dropped_before_its_pending_node_pairs() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("old", "g", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    let mut p = (*pending("new", "g", "Join", "Ready")).clone();
    p.metadata.annotations = Some([(REQUEST_LABEL.to_string(), "c2".to_string())].into());
    w.pending = vec![Arc::new(p)];
    w.nv.metadata.annotations =
        Some([(SURGE_REQUESTS_ANNOTATION.to_string(), "c2=g".to_string())].into());
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        matches!(&plan.effects[0], Effect::PatchObject { kind: Kind::NodeVersion, patch, .. } if patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION].is_null()),
        "{plan:?}"
    );
}

/// maxSurge 3: every joined node pairs in one round, each with its own
/// donor, and every ready pair's donor is taken in one round (a round per
/// pair made a surge-3 rollout 1.3 × its ideal).
#[test]
fn every_joined_node_pairs_and_every_ready_pair_moves_in_one_round() {
    let mut w = World::new("img-2", 3);
    w.nodes = vec![
        node("a-old", "g", "img-1", &[]),
        node("b-old", "g", "img-1", &[]),
        node("c-old", "g", "img-1", &[]),
        node("d-old", "g", "img-1", &[]),
        node("new-1", "g", "img-2", &[]),
        node("new-2", "g", "img-2", &[]),
        node("new-3", "g", "img-2", &[]),
    ];
    w.pending = vec![
        pending("new-2", "g", "Join", "Ready"),
        pending("new-1", "g", "Join", "Ready"),
        pending("new-3", "g", "Join", "Ready"),
    ];
    w.settle_status();
    let plan = decide(&w.snap());
    let pairs: Vec<String> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::PatchNode { node, patch, .. } => patch["metadata"]["annotations"]
                [DONOR_ANNOTATION]
                .as_str()
                .map(|d| format!("{node}<-{d}")),
            _ => None,
        })
        .collect();
    assert_eq!(pairs, ["new-1<-a-old", "new-2<-b-old", "new-3<-c-old"]);
    let deleted = plan
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::DeleteObject { .. }))
        .count();
    assert_eq!(deleted, 3, "each joined node's PendingNode: {plan:?}");

    // Paired: both ready heirs' donors are taken in the same round.
    w.nodes = vec![
        node("a-old", "g", "img-1", &[(HEIR_ANNOTATION, "new-1")]),
        node("b-old", "g", "img-1", &[(HEIR_ANNOTATION, "new-2")]),
        node("new-1", "g", "img-2", &[(DONOR_ANNOTATION, "a-old")]),
        node("new-2", "g", "img-2", &[(DONOR_ANNOTATION, "b-old")]),
    ];
    w.pending = vec![];
    w.settle_status();
    let plan = decide(&w.snap());
    let taken: Vec<&str> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::CreateMaintenance { nm } => Some(nm.spec.node_name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(taken, ["a-old", "b-old"], "{plan:?}");
    // Both drained: both leave in one round.
    w.maintenances = vec![
        nm_for(&w, "a-old", Some(Phase::Succeeded)),
        nm_for(&w, "b-old", Some(Phase::Succeeded)),
    ];
    let plan = decide(&w.snap());
    let deleted: Vec<&str> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteNode { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["a-old", "b-old"], "{plan:?}");
}

/// A round that asks the provider to delete a leaving instance waits for
/// the answer: a donor drained meanwhile leaves in that round, ahead of
/// the call, instead of a round later (a wave's donors drain at nearly the
/// same time, and each round's instance delete held up the next donor).
#[test]
fn a_drained_donor_leaves_in_the_round_that_deletes_another_instance() {
    let mut w = World::new("img-2", 3);
    w.nodes = vec![
        node("b-old", "g", "img-1", &[(HEIR_ANNOTATION, "new-2")]),
        node("c-old", "g", "img-1", &[(HEIR_ANNOTATION, "new-3")]),
        node("new-1", "g", "img-2", &[]),
        node("new-2", "g", "img-2", &[(DONOR_ANNOTATION, "b-old")]),
        node("new-3", "g", "img-2", &[(DONOR_ANNOTATION, "c-old")]),
    ];
    // a-old's node is gone; its instance is to be deleted.
    w.pending = vec![pending("a-old", "g", "Leave", "Running")];
    w.settle_status();
    // b-old is drained, c-old not yet.
    w.maintenances = vec![
        nm_for(&w, "b-old", Some(Phase::Succeeded)),
        nm_for(&w, "c-old", Some(Phase::Running)),
    ];
    let plan = decide(&w.snap());
    let order: Vec<String> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteNode { name, .. } => Some(format!("delete node {name}")),
            Effect::Provider { verb, request, .. } => {
                Some(format!("{verb} {}", request["providerID"].as_str()?))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        order,
        ["delete node b-old", "delete-node kwok://a-old"],
        "{plan:?}"
    );
}

/// where-features-meet.md C3: the image changed while a surge node came
/// up, so it joined on the old one. Its reached Join PendingNode held the
/// surge budget (no timeout, nothing said) and the rollout never moved.
/// Now the join is over and the node is surplus: called obsolete (it was
/// made to replace a node that now gets one of the new image), its
/// PendingNode goes, it counts in the surge until it is gone, and then
/// the budget is spent on the next surge. (Replaced in turn like an
/// outdated node, it grew the pool for good: the random worlds.)
#[test]
fn a_surge_node_that_joined_on_the_old_image_is_surplus_and_then_frees_the_budget() {
    let mut w = three_outdated_workers(1);
    w.nodes.push(node("d", "g", "img-1", &[]));
    w.pending = vec![pending("d", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        matches!(&plan.effects[0], Effect::PatchNode { node, patch, .. }
            if node == "d" && patch["metadata"]["annotations"][OBSOLETE_ANNOTATION] == "true"),
        "{:?}",
        plan.effects
    );
    assert!(
        matches!(&plan.effects[1], Effect::DeleteObject { kind: Kind::PendingNode, name, .. } if name == "d"),
        "{:?}",
        plan.effects
    );
    assert!(
        plan.effects.iter().any(|e| matches!(
            e,
            Effect::Event {
                reason: "JoinedOutdated",
                ..
            }
        )),
        "{:?}",
        plan.effects
    );
    // Obsolete and still there: it holds the surge.
    w.nodes[3] = node("d", "g", "img-1", &[(OBSOLETE_ANNOTATION, "true")]);
    w.pending.clear();
    w.settle_status();
    let st = w.nv.status.as_ref().unwrap();
    assert_eq!((st.outdated.len(), st.obsolete.len(), st.budget), (3, 1, 0));
    // Gone: the budget is spent on the next surge.
    w.nodes.truncate(3);
    w.settle_status();
    let st = w.nv.status.as_ref().unwrap();
    assert_eq!((st.outdated.len(), st.budget), (3, 1));
    let (reqs, _) = recorded_requests(&w);
    assert_eq!(reqs.split(',').count(), 1, "{reqs}");
    // A surge node on the new image pairs as before (its PendingNode goes
    // with the pairing).
    let mut fresh = three_outdated_workers(1);
    fresh.nodes.push(node("e", "g", "img-2", &[]));
    fresh.pending = vec![pending("e", "g", "Join", "Ready")];
    fresh.settle_status();
    let plan = decide(&fresh.snap());
    assert!(
        matches!(&plan.effects[0], Effect::PatchNode { node, patch, .. } if node == "e" && patch["metadata"]["annotations"][DONOR_ANNOTATION] == "a"),
        "{:?}",
        plan.effects
    );
}
