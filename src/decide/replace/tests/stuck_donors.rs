//! Donors whose drain does not end well: overdue (a PodDisruptionBudget
//! that never yields) or Failed (preempted by an administrator's
//! maintenance, the medik8s lease held by a remediator). Neither may make
//! the task run its rounds back to back, and a Failed drain is given back
//! and taken again, never waited on for ever.

use super::surge::nm_for;
use super::*;
use crate::decide::Then;

fn donor_world() -> World {
    let mut w = World::new("img-2", 1);
    w.nv.spec.drain_timeout_seconds = 60;
    w.nodes = vec![
        node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")]),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    w
}

/// The wake-up of a round with its status already written.
fn wake(w: &mut World) -> Then {
    w.settle_status();
    decide(&w.snap()).then
}

#[test]
fn an_overdue_drain_asks_to_look_again_later_never_at_once() {
    let mut w = donor_world();
    let mut nm = (*nm_for(&w, "old", Some(Phase::Running))).clone();
    nm.metadata.creation_timestamp = Some(Time("2026-11-22T11:50:00Z".parse().unwrap()));
    w.maintenances = vec![Arc::new(nm)];
    match wake(&mut w) {
        Then::Wait(Some(d)) => assert!(d >= std::time::Duration::from_secs(1), "{d:?}"),
        Then::Wait(None) => {}
        other => panic!("{other:?}: the task ran its rounds back to back"),
    }
}

fn failed(w: &World, last_update: &str) -> Arc<NodeMaintenance> {
    let mut nm = (*nm_for(w, "old", Some(Phase::Failed))).clone();
    if let Some(st) = nm.status.as_mut() {
        st.last_update = Some(Time(last_update.parse().unwrap()));
        st.last_error = Some("preempted by NodeMaintenance admin".into());
    }
    Arc::new(nm)
}

fn gives_back(plan: &Plan) -> bool {
    plan.effects.iter().any(|e| {
        matches!(e, Effect::DeleteMaintenance { nm, .. }
            if *nm == disrupt::maintenance_name(MAINTENANCE_PREFIX, "old"))
    })
}

#[test]
fn a_failed_donor_drain_is_given_back_after_a_pause_and_taken_again() {
    let mut w = donor_world();
    // Failed a moment ago: it waits out the pause, not at once.
    w.maintenances = vec![failed(&w, "2026-11-22T11:59:50Z")];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(!gives_back(&plan), "{plan:?}");
    assert!(
        matches!(plan.then, Then::Wait(Some(d)) if d.as_secs() >= 1),
        "{plan:?}"
    );
    // Failed long ago: given back.
    w.maintenances = vec![failed(&w, "2026-11-22T11:00:00Z")];
    w.settle_status();
    assert!(gives_back(&decide(&w.snap())));
    // Gone, and an administrator's maintenance still holds the node: not
    // taken while it does (ours would fail as preempted again).
    let mut admin = (*nm_for(&w, "old", Some(Phase::Running))).clone();
    admin.metadata.name = Some("admin".into());
    admin.metadata.owner_references = None;
    admin.metadata.labels = None;
    w.maintenances = vec![Arc::new(admin)];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        !plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::CreateMaintenance { .. })),
        "{plan:?}"
    );
    // Once it is gone, the donor is taken again.
    w.maintenances.clear();
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::CreateMaintenance { nm } if nm.spec.node_name == "old")),
        "{plan:?}"
    );
}
