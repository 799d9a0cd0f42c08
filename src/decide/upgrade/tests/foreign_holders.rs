//! An UpgradePlan never takes a node someone else holds outside any
//! NodeMaintenance (the reboot side: `reboot::tests::foreign_holders`).

use super::*;
use crate::decide::disrupt::{DO_NOT_DISRUPT, GRACEFUL_SHUTDOWN};
use crate::decide::node_conditions::DRAIN_IN_PROGRESS;
use crate::decide::reboot::tests::foreign_holders::{cordoned, with_condition};

#[test]
fn nodes_someone_else_holds_are_never_upgraded_and_say_who() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.before.clear();
    p.spec.budget.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10);
    let kubectl = with_condition(
        node("a", "v1", false),
        DRAIN_IN_PROGRESS,
        "KubectlDrainStarted",
        "kubectl drain",
    );
    let shutdown = with_condition(node("b", "v1", false), GRACEFUL_SHUTDOWN, "Shutdown", "");
    let by_hand = cordoned(node("c", "v1", false));
    let mut w = World::new(p, vec![kubectl, shutdown, by_hand, node("d", "v1", false)]);
    w.step();
    assert_ne!(w.phase("d"), UpgradePhase::Waiting, "a free node is taken");
    for (n, says) in [
        ("a", "reason KubectlDrainStarted"),
        ("b", "shutting down"),
        ("c", "cordoned by someone else"),
    ] {
        let e = w.entry(n);
        assert_eq!(e.phase, UpgradePhase::Waiting, "{n}");
        assert_eq!(e.reason.as_deref(), Some("HeldByOther"), "{n}");
        let msg = e.message.clone().unwrap_or_default();
        assert!(msg.contains(says), "{n}: {msg}");
    }
}

/// A node admitted (its before hooks ran) that someone else cordons or
/// drains before our NodeMaintenance is created is not taken: the
/// admission is withdrawn, `HeldByOther`. Found by the random worlds once
/// someone else holds nodes there.
#[test]
fn an_admission_is_withdrawn_when_someone_else_takes_the_node_before_our_drain() {
    for (held, says) in [
        (
            cordoned(node("w-1", "v1", false)),
            "cordoned by someone else",
        ),
        (
            with_condition(
                node("w-1", "v1", false),
                DRAIN_IN_PROGRESS,
                "OtherDrainer",
                "drained by another tool",
            ),
            "reason OtherDrainer",
        ),
    ] {
        let mut w = before_hooks_done();
        w.nodes = vec![Arc::new(held)];
        w.step();
        assert!(w.nms.is_empty(), "taken although someone else holds it");
        let e = w.entry("w-1");
        assert_eq!(e.phase, UpgradePhase::Waiting);
        assert_eq!(e.reason.as_deref(), Some("HeldByOther"));
        let msg = e.message.clone().unwrap_or_default();
        assert!(msg.contains(says) && msg.contains("withdrawn"), "{msg}");
    }
}

/// `karpenter.sh/do-not-disrupt: "true"` on a node keeps the upgrade off it
/// (the reboot side and Karpenter's source:
/// `reboot::tests::foreign_holders::do_not_disrupt_on_a_node_keeps_the_reboot_off_it`);
/// an admission whose before hooks ran is withdrawn.
#[test]
fn do_not_disrupt_on_a_node_keeps_the_upgrade_off_it() {
    let held = |name: &str| {
        let mut n = node(name, "v1", false);
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert(DO_NOT_DISRUPT.into(), "true".into());
        n
    };
    let mut w = World::new(ungrouped(), vec![held("a"), node("b", "v1", false)]);
    w.step();
    a_waits_do_not_disrupt_and_b_is_taken(&w);

    let mut w = before_hooks_done();
    w.nodes = vec![Arc::new(held("w-1"))];
    w.step();
    assert!(w.nms.is_empty(), "taken under do-not-disrupt");
    let e = w.entry("w-1");
    assert_eq!(e.reason.as_deref(), Some("DoNotDisrupt"));
    assert!(e.message.clone().unwrap_or_default().contains("withdrawn"));
}

/// `karpenter.sh/do-not-disrupt` on a pod keeps the upgrade off its node
/// (the reboot side:
/// `reboot::tests::foreign_holders::do_not_disrupt_on_a_pod_keeps_the_reboot_off_its_node_until_it_ends`).
#[test]
fn do_not_disrupt_on_a_pod_keeps_the_upgrade_off_its_node() {
    let mut w = World::new(
        ungrouped(),
        vec![node("a", "v1", false), node("b", "v1", false)],
    );
    let opted_out = crate::decide::do_not_disrupt::tests::opted_out_pod;
    w.pods.push(opted_out("db-0", "a", "true", "Running", None));
    w.step();
    let e = a_waits_do_not_disrupt_and_b_is_taken(&w);
    let msg = e.message.clone().unwrap_or_default();
    assert_eq!(msg, "pod prod/db-0 has karpenter.sh/do-not-disrupt=true");
}

/// A pod that opts out while the before hooks run: the admission is
/// withdrawn before the drain, as for a node someone else took. (Found by
/// the random worlds once pods opt out there: the NodeMaintenance was
/// created and the drain left to wait on the pod.)
#[test]
fn a_pod_opting_out_while_the_before_hooks_run_withdraws_the_admission() {
    let mut w = before_hooks_done();
    let opted_out = crate::decide::do_not_disrupt::tests::opted_out_pod;
    w.pods
        .push(opted_out("db-0", "w-1", "true", "Running", None));
    w.step();
    assert!(w.nms.is_empty(), "taken under a pod's do-not-disrupt");
    let e = w.entry("w-1");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Waiting, Some("DoNotDisrupt"))
    );
    let msg = e.message.clone().unwrap_or_default();
    assert_eq!(
        msg,
        "pod prod/db-0 has karpenter.sh/do-not-disrupt=true; the admission is withdrawn"
    );
}

/// Node w-1 admitted by a plan with a before hook, the hook's Job
/// complete: the next pass takes the node, unless something holds it now.
fn before_hooks_done() -> World {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.after.clear();
    let mut w = World::new(p, vec![node("w-1", "v1", false)]);
    w.step();
    assert_eq!(w.phase("w-1"), UpgradePhase::PreHooks);
    w.step();
    w.finish_job("w-1", true);
    w
}

/// Node b (free) is taken; node a waits `DoNotDisrupt`: its entry.
fn a_waits_do_not_disrupt_and_b_is_taken(w: &World) -> NodeUpgrade {
    assert_ne!(w.phase("b"), UpgradePhase::Waiting, "a free node is taken");
    let e = w.entry("a");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Waiting, Some("DoNotDisrupt"))
    );
    e
}

/// The test plan without groups or before hooks: one pass admits.
fn ungrouped() -> UpgradePlan {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.before.clear();
    p
}
