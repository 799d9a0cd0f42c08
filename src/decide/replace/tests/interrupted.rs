//! Rollouts whose writes landed in part, or whose image changed under
//! them — each case found by the random worlds (`world.rs`) and pinned
//! here: a pairing half written, a pairing whose PendingNode delete was
//! refused, a give-back refused after the node's delete, a pair under way
//! when the image changes, a second surge request at the same instant.

use super::surge::nm_for;
use super::*;
use serde_json::Value;

/// A heir (new node) paired with old node `old` and the donor naming it
/// back as its test wants.
fn pair(old_names_heir: bool) -> World {
    let mut w = World::new("img-2", 1);
    let heir_of_old: &[(&str, &str)] = if old_names_heir {
        &[(HEIR_ANNOTATION, "new")]
    } else {
        &[]
    };
    w.nodes = vec![
        node("old", "g", "img-1", heir_of_old),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w
}

fn unsets(plan: &Plan, node: &str, key: &str) -> bool {
    plan.effects.iter().any(|e| {
        matches!(e, Effect::PatchNode { node: n, patch, .. }
            if n == node && patch["metadata"]["annotations"].get(key) == Some(&Value::Null))
    })
}

/// The pairing's donor write refused: the new node names a donor that
/// does not name it back. It is unpaired (and, its PendingNode still
/// there, pairs again), instead of holding a surge slot for good while
/// the old node waits for another.
#[test]
fn a_heir_its_donor_never_named_back_is_unpaired() {
    let mut w = pair(false);
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(unsets(&plan, "new", DONOR_ANNOTATION), "{plan:?}");
}

/// The pairing written on both nodes, its PendingNode delete refused: the
/// Join PendingNode is deleted, so the heir, released once its donor is
/// gone, is not taken for a new node and paired again (two old nodes
/// replaced by one).
#[test]
fn a_finished_pairings_leftover_join_is_deleted() {
    let mut w = pair(true);
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects.iter().any(|e| matches!(e,
            Effect::DeleteObject { kind: Kind::PendingNode, name, .. } if name == "new")),
        "{plan:?}"
    );
}

/// The node deleted, the give-back of its NodeMaintenance refused: the
/// NodeMaintenance is given back in a later round, not left until the
/// NodeVersion goes.
#[test]
fn a_maintenance_of_a_deleted_node_is_given_back() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("new", "g", "img-2", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.maintenances = vec![nm_for(&w, "gone", Some(Phase::Succeeded))];
    let plan = decide(&w.snap());
    assert!(
        matches!(plan.effects.as_slice(), [Effect::DeleteMaintenance { nm, .. }] if nm == "replace-gone"),
        "{plan:?}"
    );
}

/// The image changes while a pair is under way: the pair completes (the
/// donor is still drained and goes; the heir, on an image no longer
/// named, stays a heir until then) instead of both being replaced, which
/// left the pool a node larger.
#[test]
fn a_pair_under_way_when_the_image_changes_completes() {
    let mut w = pair(true);
    w.nv.spec.image = Some("img-3".into());
    w.groups = vec![group("workers", "g", "Worker", "img-3")];
    w.settle_status();
    let s = w.snap();
    let c = classify(&s);
    assert_eq!(names(&c.heirs), ["new"]);
    assert_eq!(names(&c.donors), ["old"]);
    let plan = decide(&s);
    assert!(!unsets(&plan, "old", HEIR_ANNOTATION), "unpaired: {plan:?}");
    assert!(
        plan.effects.iter().any(|e| matches!(e,
            Effect::CreateMaintenance { nm } if nm.spec.node_name == "old")),
        "the donor is drained: {plan:?}"
    );
}

/// A surge request recorded as a PendingNode, and another one asked for
/// at the same instant: the new request gets an id of its own. It got the
/// first one's (ids hash the instant and a counter), which the next round
/// dropped as recorded, and the one after asked again: a busy loop.
#[test]
fn a_second_surge_request_at_one_instant_gets_an_id_of_its_own() {
    let mut w = super::surge::three_outdated_workers(2);
    let requests = |plan: &Plan| -> Vec<String> {
        let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
            panic!("{plan:?}");
        };
        let v = patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION]
            .as_str()
            .unwrap_or_default();
        v.split(',')
            .filter_map(|r| r.split_once('=').map(|(id, _)| id.to_string()))
            .collect()
    };
    let first = requests(&decide(&w.snap()));
    assert_eq!(first.len(), 2, "{first:?}");
    // The first request is a PendingNode already, the second was never
    // made: one more is asked for, now.
    let mut p = (*pending("new-1", "g", "Join", "Creating")).clone();
    p.metadata.annotations = Some([(REQUEST_LABEL.to_string(), first[0].clone())].into());
    w.pending = vec![Arc::new(p)];
    w.settle_status();
    let again = requests(&decide(&w.snap()));
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0], first[0], "the PendingNode's request asked again");
}
