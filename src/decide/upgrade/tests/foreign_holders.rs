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
