//! Nodes someone else holds outside any NodeMaintenance (KEP-5683's
//! conditions written by another drainer, a graceful shutdown, a cordon by
//! a person or Talos) are never taken: `Waiting`, reason `HeldByOther`,
//! naming who. Our own condition left behind does not hold a node.

use super::*;
use crate::decide::disrupt::{GRACEFUL_SHUTDOWN, TALOS_CORDONED};
use crate::decide::node_conditions::{DRAIN_IN_PROGRESS, REASON_DRAIN_STARTED};

/// `n` with a condition of `type_` True, written with `reason` and
/// `message`.
pub(crate) fn with_condition(mut n: Node, type_: &str, reason: &str, message: &str) -> Node {
    if let Some(cs) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        cs.push(NodeCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Default::default()
        });
    }
    n
}

pub(crate) fn cordoned(mut n: Node) -> Node {
    n.spec = Some(NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    n
}

#[test]
fn nodes_someone_else_holds_wait_held_by_other_and_are_never_taken() {
    let kubectl = with_condition(
        node("a-kubectl", "b0"),
        DRAIN_IN_PROGRESS,
        "KubectlDrainStarted",
        "kubectl drain",
    );
    let shutdown = with_condition(
        node("b-shutdown", "b0"),
        GRACEFUL_SHUTDOWN,
        "ShutdownInProgress;\nrm -rf /",
        "",
    );
    let by_hand = cordoned(node("c-by-hand", "b0"));
    let talos = annotate(cordoned(node("d-talos", "b0")), TALOS_CORDONED, "true");
    // Our own DrainInProgress=True left behind (its give-back's status
    // write lost) holds nothing: the node is taken.
    let ours = with_condition(
        node("e-ours", "b0"),
        DRAIN_IN_PROGRESS,
        REASON_DRAIN_STARTED,
        "NodeMaintenance reboot-e-ours: draining",
    );
    let w = World::new(policy(10), vec![kubectl, shutdown, by_hand, talos, ours]);
    let plan = w.plan();
    assert_eq!(created(&plan), ["e-ours"]);
    let st = status_of(&plan);
    for (n, says) in [
        (
            "a-kubectl",
            "someone else drains the node (DrainInProgress=True, reason KubectlDrainStarted)",
        ),
        (
            "b-shutdown",
            "shutting down (GracefulNodeShutdownInProgress=True, reason ShutdownInProgressrm-rf)",
        ),
        ("c-by-hand", "cordoned by someone else"),
        ("d-talos", "cordoned by Talos"),
    ] {
        let e = st.nodes.iter().find(|e| e.name == n);
        let e = e.unwrap_or_else(|| panic!("{n} not in status"));
        assert_eq!(e.phase, RebootPhase::Waiting, "{n}");
        assert_eq!(e.reason.as_deref(), Some("HeldByOther"), "{n}");
        let msg = e.message.clone().unwrap_or_default();
        assert!(msg.contains(says), "{n}: {msg}");
    }
    // Nothing touches the held nodes: no patch, no maintenance.
    for e in &plan.effects {
        if let Effect::PatchNode { node, .. } = e {
            assert_eq!(node, "e-ours", "{e:?}");
        }
    }
}

/// An admission recorded but not carried out (its create was lost) on a
/// node someone else cordoned or drains since is withdrawn, `HeldByOther`:
/// never taken by the create's retry. Found by the random worlds once
/// someone else holds nodes there.
#[test]
fn an_admission_not_carried_out_is_withdrawn_when_someone_else_takes_the_node() {
    for (held, says) in [
        (cordoned(node("n1", "boot-1")), "cordoned by someone else"),
        (
            with_condition(
                node("n1", "boot-1"),
                DRAIN_IN_PROGRESS,
                "OtherDrainer",
                "drained by another tool",
            ),
            "reason OtherDrainer",
        ),
    ] {
        let p = with_entry(
            policy(1),
            entry("n1", RebootPhase::Draining, "boot-1", now()),
        );
        let plan = World::new(p, vec![held]).plan();
        assert!(created(&plan).is_empty(), "taken by the create's retry");
        let (phase, msg) = phase_of(&status_of(&plan), "n1");
        assert_eq!(phase, RebootPhase::Waiting);
        assert!(msg.contains(says) && msg.contains("withdrawn"), "{msg}");
    }
}
