//! A give-back whose write failed: the status already says `Done`, the
//! NodeMaintenance is still there. Every later pass deletes it again until
//! it is gone (the node was left cordoned and the plan stalled).

use super::*;

#[test]
fn a_done_node_whose_give_back_was_refused_is_given_back_on_the_next_pass() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.before.clear();
    p.spec.hooks.after.clear();
    let mut w = World::new(p, vec![node("a", "v1", false), node("b", "v1", false)]);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Draining);
    w.drained("a");
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading);
    w.upgrade_host("a", true);
    // Verified: `Done` is written first, then the delete, which the API
    // server refuses (a webhook, a 5xx): the maintenance stays.
    let held = w.nms.clone();
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Done);
    w.nms = held;
    for pass in 0..3 {
        let fx = w.decide().effects;
        assert!(
            fx.iter().any(
                |e| matches!(e, Effect::DeleteMaintenance { nm, .. } if *nm == maintenance_name("a"))
            ),
            "pass {pass}: the give-back is asked again: {fx:?}"
        );
    }
    // Once it goes, b's turn comes (a's slot was held for ever before).
    w.step();
    assert!(w.nms.iter().all(|m| m.spec.node_name != "a"));
    w.step();
    assert_eq!(w.phase("b"), UpgradePhase::Draining);
}

/// A node whose v2 give-back was refused, when the target moves on to v3:
/// the leftover NodeMaintenance is given back first and the node is
/// admitted afresh only once it is gone. Taken at once, the v3 attempt ran
/// its before hooks on a node still cordoned and adopted the old, drained
/// NodeMaintenance (its create a 409), skipping its own drain.
#[test]
fn a_new_version_waits_for_the_last_attempts_give_back_before_taking_the_node_again() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.after.clear();
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::PreHooks);
    w.finish_job("a", true);
    w.step();
    w.drained("a");
    w.step();
    w.upgrade_host("a", true);
    let held = w.nms.clone();
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Done);
    // The delete was refused; meanwhile the plan moves on to v3.
    w.nms = held;
    w.plan.spec.version = "v3".into();
    w.plan.metadata.generation = Some(2);
    let jobs_before = w.created.len();
    let fx = w.step();
    assert!(
        fx.iter().any(
            |e| matches!(e, Effect::DeleteMaintenance { nm, .. } if *nm == maintenance_name("a"))
        ),
        "the leftover is given back: {fx:?}"
    );
    assert!(
        !fx.iter().any(|e| matches!(
            e,
            Effect::CreateMaintenance { .. } | Effect::CreateJob { .. }
        )),
        "nothing of the new attempt while it is held: {fx:?}"
    );
    let e = w.entry("a");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Waiting, Some(WAIT_IN_MAINTENANCE))
    );
    assert_eq!(w.created.len(), jobs_before);
    // Gone: admitted afresh, its before hook on an untouched node.
    assert!(w.nms.is_empty());
    w.step();
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::PreHooks, "{e:?}");
    assert_eq!(e.version.as_deref(), Some("v3"));
    assert!(w.nms.is_empty(), "not taken before its before hooks");
}
