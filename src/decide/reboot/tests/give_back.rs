//! Give-backs that failed. The status records Settling or Done before the
//! give-back's writes run; a refused delete or a 409 on the node's need
//! must be repaired by later passes, never left holding the node (it stayed
//! cordoned and its slot taken for ever), and a need the verified reboot
//! served must never reboot the node again.

use super::*;

fn deletes_ours(plan: &Plan, node: &str) -> bool {
    plan.effects
        .iter()
        .any(|e| matches!(e, Effect::DeleteMaintenance { nm, .. } if *nm == maintenance_name(node)))
}

fn clears_need(plan: &Plan, node: &str) -> bool {
    plan.effects.iter().any(|e| {
        matches!(e, Effect::PatchNode { node: n, patch, .. }
            if n == node && patch["metadata"]["annotations"].get(NEEDED_ANNOTATION).is_some_and(serde_json::Value::is_null))
    })
}

#[test]
fn a_settling_node_whose_give_back_failed_is_given_back_on_every_pass_until_it_is() {
    let mut p = policy(1);
    p.spec.gates.settle_seconds = 5;
    // Verified at `now`: Settling, written before the delete and the need's
    // clear, both of which failed.
    let p = with_entry(p, entry("a", RebootPhase::Settling, "b0", now()));
    let a = node("a", "b1");
    let mut w = World::new(p.clone(), vec![a.clone(), node("b", "b0")]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    for secs in [1, 6, 60, 600] {
        w.now = now()
            .checked_add(SignedDuration::from_secs(secs))
            .unwrap_or_default();
        let plan = w.plan();
        assert!(deletes_ours(&plan, "a"), "{secs} s: {:?}", plan.effects);
        assert!(clears_need(&plan, "a"), "{secs} s: {:?}", plan.effects);
        assert!(
            created(&plan).is_empty(),
            "{secs} s: a still holds the slot"
        );
    }
    // The delete went through; the need's clear did not (409): Done, the
    // clear asked again, and b's turn.
    w.nms.clear();
    let plan = w.plan();
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "a").0, RebootPhase::Done);
    assert!(clears_need(&plan, "a"));
    assert_eq!(created(&plan), ["b"]);
}

#[test]
fn a_need_its_verified_reboot_served_never_reboots_the_node_again() {
    // Done, given back by hand (the NodeMaintenance deleted) while the
    // need's clear had failed: the old need is served.
    let p = with_entry(policy(1), entry("a", RebootPhase::Done, "b0", now()));
    let w = World::new(p.clone(), vec![node("a", "b1")]);
    let plan = w.plan();
    assert!(created(&plan).is_empty(), "a second reboot for one need");
    assert!(clears_need(&plan, "a"));
    // A need stamped after the verification is a new one.
    let later = annotate(node("a", "b1"), NEEDED_ANNOTATION, "2026-11-23T12:30:00Z");
    let w = World::new(p, vec![later]);
    let plan = w.plan();
    assert_eq!(created(&plan), ["a"]);
    assert!(!clears_need(&plan, "a"));
}

#[test]
fn a_need_is_matched_by_its_stamp_not_by_the_clocks() {
    // The reboot was admitted on the stamp 11:00 and verified at `now` by
    // the cluster role's clock; the stamp reads 30 s after `now` (the
    // stamping clock runs ahead). By time it looked newer than the
    // reboot, and the node was rebooted again for it.
    let ahead = now()
        .checked_add(SignedDuration::from_secs(30))
        .unwrap_or_default()
        .to_string();
    let mut e = entry("a", RebootPhase::Done, "b0", now());
    e.need = Some(ahead.clone());
    let p = with_entry(policy(1), e);
    let a = annotate(node("a", "b1"), NEEDED_ANNOTATION, &ahead);
    let plan = World::new(p.clone(), vec![a]).plan();
    assert!(created(&plan).is_empty(), "a second reboot for one need");
    assert!(clears_need(&plan, "a"));
    // A stamp other than the one admitted is a new need, even one that
    // reads earlier than the verification.
    let earlier = now()
        .checked_sub(SignedDuration::from_secs(30))
        .unwrap_or_default()
        .to_string();
    let a = annotate(node("a", "b1"), NEEDED_ANNOTATION, &earlier);
    let plan = World::new(p, vec![a]).plan();
    assert_eq!(created(&plan), ["a"]);
}

#[test]
fn a_need_stamped_in_an_earlier_boot_was_served_by_any_reboot_since() {
    // `reboot-required` stamped the need in boot b0; the machine rebooted
    // by itself (b1) before any policy admitted it: nothing to do but
    // clear the need. No status entry, no clock involved.
    let a = annotate(node("a", "b1"), NEEDED_BOOT_ANNOTATION, "b0");
    let plan = World::new(policy(1), vec![a]).plan();
    assert!(
        created(&plan).is_empty(),
        "rebooted again for a served need"
    );
    assert!(clears_need(&plan, "a"));
    // Stamped in the current boot: a need.
    let a = annotate(node("a", "b1"), NEEDED_BOOT_ANNOTATION, "b1");
    let plan = World::new(policy(1), vec![a]).plan();
    assert_eq!(created(&plan), ["a"]);
    // After a failed command, the machine rebooted by itself: served,
    // whatever the status entry says now.
    let p = with_entry(policy(1), entry("a", RebootPhase::Waiting, "b0", now()));
    let a = annotate(node("a", "b1"), NEEDED_BOOT_ANNOTATION, "b0");
    let plan = World::new(p, vec![a]).plan();
    assert!(created(&plan).is_empty());
}

/// A literal need (`now`, as a person or `just bench-reboot` writes it) is
/// tied to its boot when admitted, before the node is taken; after the
/// verified reboot that literal is served and cleared, and the same
/// literal written again after the clear is a new ask. (It was cleared
/// without a reboot: the stamp `now` equalled the one admitted.)
#[test]
fn the_same_literal_need_written_again_after_its_reboot_is_a_new_ask() {
    let a = annotate(node("a", "b0"), NEEDED_ANNOTATION, "now");
    let plan = World::new(policy(1), vec![a]).plan();
    let stamp = plan.effects.iter().position(|e| {
        matches!(e, Effect::PatchNode { node, patch, .. }
            if node == "a" && patch["metadata"]["annotations"][NEEDED_BOOT_ANNOTATION] == "b0")
    });
    let create = plan
        .effects
        .iter()
        .position(|e| matches!(e, Effect::CreateMaintenance { .. }));
    assert!(
        stamp.is_some() && stamp < create,
        "tied to its boot before it is taken: {:?}",
        plan.effects
    );
    let mut e = entry("a", RebootPhase::Done, "b0", now());
    e.need = Some("now".into());
    let p = with_entry(policy(1), e);
    // Rebooted, the clear not through yet: served, cleared again.
    let old = annotate(node("a", "b1"), NEEDED_ANNOTATION, "now");
    let old = annotate(old, NEEDED_BOOT_ANNOTATION, "b0");
    let plan = World::new(p.clone(), vec![old]).plan();
    assert!(created(&plan).is_empty(), "a second reboot for one need");
    assert!(clears_need(&plan, "a"));
    // Cleared, then `now` written again: a new ask.
    let again = annotate(node("a", "b1"), NEEDED_ANNOTATION, "now");
    let plan = World::new(p, vec![again]).plan();
    assert_eq!(created(&plan), ["a"]);
    assert!(!clears_need(&plan, "a"));
}
