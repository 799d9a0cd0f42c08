//! An UpgradePlan never takes a node someone else holds outside any
//! NodeMaintenance (the reboot side: `reboot::tests::foreign_holders`).

use super::*;
use crate::decide::disrupt::GRACEFUL_SHUTDOWN;
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
        let mut p = plan();
        p.spec.groups.clear();
        p.spec.hooks.after.clear();
        let mut w = World::new(p, vec![node("w-1", "v1", false)]);
        w.step();
        assert_eq!(w.phase("w-1"), UpgradePhase::PreHooks);
        w.step();
        w.finish_job("w-1", true);
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
