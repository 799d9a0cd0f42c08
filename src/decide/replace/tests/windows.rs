//! A NodeVersion's `windows`: outside them no replacement starts (no new
//! surge request, no obsolete node's drain), the budget says 0 and the
//! status says when the next window opens; what started inside one goes
//! on; a lost spec keeps its windows through the record.

use super::*;
use crate::api::common::Window;
use crate::decide::Then;

/// A window on `days` from `start` to `end`, UTC. The tests' now is
/// Sunday 2026-11-22 12:00 UTC.
fn window(days: &[&str], start: &str, end: &str) -> Window {
    Window {
        days: days.iter().map(|d| d.to_string()).collect(),
        start: start.into(),
        end: end.into(),
        ..Default::default()
    }
}

/// Three outdated workers moving to img-2 (surge 2) under `windows`.
fn outdated(windows: Vec<Window>) -> World {
    let mut w = super::surge::three_outdated_workers(2);
    w.nv.spec.windows = windows;
    w.settle_status();
    w
}

fn records_requests(plan: &Plan) -> bool {
    plan.effects.iter().any(|e| {
        matches!(e, Effect::PatchObject { patch, .. }
            if patch["metadata"]["annotations"].get(SURGE_REQUESTS_ANNOTATION).is_some())
    })
}

#[test]
fn outside_every_window_no_replacement_starts_and_the_status_says_when_one_opens() {
    let w = outdated(vec![window(&["Mon"], "02:00", "04:00")]);
    let status = w.nv.status.clone().unwrap_or_default();
    assert_eq!(status.budget, 0, "{status:?}");
    let msg = status.message.unwrap_or_default();
    assert!(
        msg.contains("outside every replacement window; the next opens at 2026-11-23T02:00:00Z"),
        "{msg}"
    );
    let plan = decide(&w.snap());
    assert!(!records_requests(&plan), "{plan:?}");
    // Woken at the window's opening, 14 h on, not later.
    let Then::Wait(Some(d)) = plan.then else {
        panic!("{plan:?}");
    };
    assert!(d <= Duration::from_secs(14 * 3600), "{d:?}");
}

#[test]
fn inside_a_window_replacements_start_as_without_one() {
    let w = outdated(vec![window(&["Sun"], "11:00", "13:00")]);
    assert_eq!(w.nv.status.as_ref().map(|s| s.budget), Some(2));
    assert!(records_requests(&decide(&w.snap())));
}

/// A surge request recorded inside the window is asked of the provider
/// after it closes: the replacement started.
#[test]
fn a_request_recorded_inside_a_window_is_asked_after_it_closes() {
    let mut w = outdated(vec![window(&["Mon"], "02:00", "04:00")]);
    w.nv.metadata.annotations = Some(
        [(
            SURGE_REQUESTS_ANNOTATION.to_string(),
            "000000000001=g".to_string(),
        )]
        .into(),
    );
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects.iter().any(|e| matches!(
            e,
            Effect::Provider {
                verb: "create-node",
                ..
            }
        )),
        "{plan:?}"
    );
}

/// An obsolete node's drain begins only inside a window; one under way
/// goes on.
#[test]
fn an_obsolete_nodes_drain_begins_only_inside_a_window() {
    let obsolete = || node("old", "g", "img-2", &[(OBSOLETE_ANNOTATION, "true")]);
    let takes = |plan: &Plan| {
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::CreateMaintenance { .. }))
    };
    let mut w = World::new("img-2", 1);
    w.nv.spec.windows = vec![window(&["Mon"], "02:00", "04:00")];
    w.nodes = vec![obsolete(), node("keep", "g", "img-2", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.settle_status();
    assert!(!takes(&decide(&w.snap())), "outside the window");
    let msg = w.nv.status.as_ref().and_then(|s| s.message.clone());
    assert!(
        msg.unwrap_or_default()
            .contains("outside every replacement window")
    );
    w.nv.spec.windows = vec![window(&["Sun"], "11:00", "13:00")];
    w.settle_status();
    assert!(takes(&decide(&w.snap())), "inside it");
    // Draining when the window closes: it goes on (Succeeded: deleted).
    w.nv.spec.windows = vec![window(&["Mon"], "02:00", "04:00")];
    w.maintenances = vec![surge::nm_for(&w, "old", Some(Phase::Succeeded))];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects.iter().any(
            |e| matches!(e, Effect::DeleteNode { name, .. } if name == "old")
                || matches!(e, Effect::PatchNode { node, .. } if node == "old")
        ),
        "the drained obsolete node goes on: {plan:?}"
    );
}

/// Constellation's CLI drops the windows with our other fields: the record
/// keeps them governing.
#[test]
fn windows_survive_a_write_that_drops_them() {
    let mut nv = nv("img-1", 1);
    nv.spec.windows = vec![window(&["Mon"], "02:00", "04:00")];
    let (_, reading) = governing(&nv);
    let Some(Effect::PatchObject { patch, .. }) = &reading.record else {
        panic!("{reading:?}");
    };
    let record = patch["metadata"]["annotations"][RECORD_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(record.contains("windows"), "{record}");
    let mut lost = nv.clone();
    lost.spec = NodeVersionSpec {
        image: Some("img-2".into()),
        ..NodeVersionSpec::default_rollout()
    };
    lost.metadata.annotations = Some([(RECORD_ANNOTATION.to_string(), record)].into());
    let (gov, reading) = governing(&lost);
    assert_eq!(gov.spec.windows, nv.spec.windows);
    assert!(reading.note.unwrap_or_default().contains("windows"));
}
