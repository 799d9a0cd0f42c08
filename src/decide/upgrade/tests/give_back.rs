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
