//! The node agent gives its node back after the upgrade it ran, verified
//! as the cluster role verifies it (the command's result, the version, a
//! new boot when the plan reboots, Ready), when nothing is left for the
//! cluster role (no after hook, no Job): a single-node cluster's cluster
//! role, evicted by the drain, may be Pending on that very node. The
//! cluster role records such a node upgraded, not interrupted; and only
//! such a plan takes the node whose drain evicts the cluster role.

use super::*;
use crate::decide::rollout::OwnNode;

fn gives_back(fx: &[Effect]) -> bool {
    fx.iter()
        .any(|e| matches!(e, Effect::DeleteMaintenance { nm, .. } if *nm == maintenance_name("a")))
}

/// One node `a` under a plan with no hooks (its strategy rebooting or not),
/// drained and Upgrading.
fn upgrading(reboots: bool) -> World {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.before.clear();
    p.spec.hooks.after.clear();
    p.spec.strategy.reboot = reboots;
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    w.drained("a");
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading);
    w
}

#[test]
fn the_agent_gives_back_the_node_it_upgraded_and_the_cluster_role_records_it_upgraded() {
    let mut w = upgrading(false);
    assert!(!gives_back(&w.agent("a")), "not before the command ran");
    w.upgrade_host("a", true);
    let fx = w.agent("a");
    assert!(gives_back(&fx), "{fx:?}");
    // As the API server applies it, before the cluster role looks again.
    w.nms.retain(|m| m.spec.node_name != "a");
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Done, "{:?}", w.entry("a"));
    assert!(w.events.contains(&"UpgradeVerified"), "{:?}", w.events);
}

#[test]
fn with_a_reboot_the_agent_gives_back_only_in_the_new_boot() {
    let mut w = upgrading(true);
    w.upgrade_host("a", true);
    let fx = w.agent("a");
    assert!(!gives_back(&fx), "the reboot comes first: {fx:?}");
    assert!(
        fx.iter().any(|e| matches!(e, Effect::RunHost { .. })),
        "the reboot is issued: {fx:?}"
    );
    w.edit_node("a", |n| {
        if let Some(info) = n.status.as_mut().and_then(|s| s.node_info.as_mut()) {
            info.boot_id = "boot-a-2".into();
        }
    });
    assert!(
        gives_back(&w.agent("a")),
        "back in a new boot at the version"
    );
    w.nms.retain(|m| m.spec.node_name != "a");
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Done, "{:?}", w.entry("a"));
}

#[test]
fn the_agent_keeps_the_node_when_the_command_failed_it_is_not_ready_or_hooks_remain() {
    // Failed: the node stays in maintenance for a person to look at.
    let mut w = upgrading(false);
    w.upgrade_host("a", false);
    w.edit_node("a", |n| {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(VERSION_LABEL.into(), "v2".into());
    });
    assert!(!gives_back(&w.agent("a")), "a failed command's node");
    // Not Ready: the cluster role's verification would wait too.
    let mut w = upgrading(false);
    w.upgrade_host("a", true);
    w.edit_node("a", |n| {
        if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].status = "False".into();
        }
    });
    assert!(!gives_back(&w.agent("a")), "a NotReady node");
    // After hooks: the cluster role runs them before giving the node back.
    let mut w = upgrading(false);
    w.plan.spec.hooks.after = vec![hook("check", "Stop")];
    w.upgrade_host("a", true);
    assert!(!gives_back(&w.agent("a")), "after hooks remain");
}

/// Someone else ending the maintenance mid-upgrade is still an
/// interruption: the node is not at the version, 10 s after the
/// maintenance was first found gone (a lagging node watch's allowance).
#[test]
fn a_maintenance_gone_before_the_version_is_still_an_interruption() {
    let mut w = upgrading(false);
    let all = w.nms.clone();
    w.nms.retain(|m| m.spec.node_name != "a");
    w.step();
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::Upgrading, "{e:?}");
    assert!(e.maintenance_gone_at.is_some(), "{e:?}");
    // One of its name there again (a person's) drops the mark; gone
    // again, the 10 s start over.
    w.nms = all;
    w.later(30);
    w.step();
    assert_eq!(w.entry("a").maintenance_gone_at, None);
    w.nms.retain(|m| m.spec.node_name != "a");
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading);
    w.later(9);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading);
    w.later(1);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed);
    assert_eq!(w.entry("a").reason.as_deref(), Some(FAILED_INTERRUPTED));
    assert_eq!(w.entry("a").maintenance_gone_at, None);
}

/// The agent writes the version, then deletes the maintenance; the
/// cluster role's maintenance watch delivered the deletion before its
/// node watch delivered the version (two watches keep no order; seen in
/// a gate's demo). The node is upgraded, not interrupted.
#[test]
fn a_give_back_seen_before_the_version_is_not_an_interruption() {
    let mut w = upgrading(false);
    let before = w.node("a");
    w.upgrade_host("a", true);
    let upgraded = w.node("a");
    assert!(gives_back(&w.agent("a")));
    // The cluster role's node store still has the node before the agent's
    // writes; its maintenance store no longer has the maintenance.
    w.edit_node("a", |n| *n = before);
    w.nms.retain(|m| m.spec.node_name != "a");
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading, "{:?}", w.entry("a"));
    // The node watch catches up a moment later.
    w.later(1);
    w.edit_node("a", |n| *n = upgraded);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Done, "{:?}", w.entry("a"));
    assert!(!w.events.contains(&"UpgradeFailed"), "{:?}", w.events);
}

/// The node whose drain evicts the cluster role's only pod: a plan whose
/// agent gives the node back takes it; one with after hooks waits, saying
/// why.
#[test]
fn only_a_plan_its_agent_finishes_takes_the_node_whose_drain_evicts_the_cluster_role() {
    for (after_hooks, taken) in [(false, true), (true, false)] {
        let mut p = plan();
        p.spec.groups.clear();
        p.spec.hooks.before.clear();
        if !after_hooks {
            p.spec.hooks.after.clear();
        }
        let mut w = World::new(p, vec![node("a", "v1", false)]);
        w.own = Some(("a", OwnNode::Evicted("pinned to a".into())));
        w.step();
        let e = w.entry("a");
        if taken {
            assert_eq!(e.phase, UpgradePhase::Draining, "{e:?}");
        } else {
            assert_eq!(e.phase, UpgradePhase::Waiting, "{e:?}");
            assert_eq!(e.reason.as_deref(), Some(rollout::WAIT_OWN_NODE), "{e:?}");
        }
    }
}
