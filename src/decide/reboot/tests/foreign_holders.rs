//! Nodes someone else holds outside any NodeMaintenance (KEP-5683's
//! conditions written by another drainer, a graceful shutdown, a cordon by
//! a person or Talos) are never taken: `Waiting`, reason `HeldByOther`,
//! naming who. Our own condition left behind does not hold a node.

use super::*;
use crate::decide::disrupt::{DO_NOT_DISRUPT, GRACEFUL_SHUTDOWN, TALOS_CORDONED};
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

/// `karpenter.sh/do-not-disrupt` on a node keeps the reboot off it while
/// it is there, as Karpenter's `ValidateNodeDisruptable` keeps its own
/// disruptions off (the value exactly `"true"`:
/// `pkg/controllers/state/statenode.go`): `Waiting`, reason
/// `DoNotDisrupt`; an admission recorded but not carried out is
/// withdrawn; once it is removed the node is taken.
#[test]
fn do_not_disrupt_on_a_node_keeps_the_reboot_off_it() {
    let held = annotate(node("a-held", "b0"), DO_NOT_DISRUPT, "true");
    let not_the_value = annotate(node("b-free", "b0"), DO_NOT_DISRUPT, "yes");
    let plan = World::new(policy(10), vec![held.clone(), not_the_value]).plan();
    assert_eq!(created(&plan), ["b-free"]);
    let e = status_of(&plan)
        .nodes
        .into_iter()
        .find(|e| e.name == "a-held");
    let e = e.expect("a-held in the status");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (RebootPhase::Waiting, Some("DoNotDisrupt"))
    );
    let msg = e.message.unwrap_or_default();
    assert!(msg.contains("karpenter.sh/do-not-disrupt=true"), "{msg}");

    let admitted = with_entry(
        policy(1),
        entry("a-held", RebootPhase::Draining, "b0", now()),
    );
    let plan = World::new(admitted, vec![held]).plan();
    assert!(created(&plan).is_empty(), "taken under do-not-disrupt");
    let e = status_of(&plan)
        .nodes
        .into_iter()
        .find(|e| e.name == "a-held");
    let e = e.expect("a-held in the status");
    assert_eq!(e.reason.as_deref(), Some("DoNotDisrupt"));
    assert!(e.message.unwrap_or_default().contains("withdrawn"));

    let plan = World::new(policy(1), vec![node("a-held", "b0")]).plan();
    assert_eq!(
        created(&plan),
        ["a-held"],
        "taken once the annotation is gone"
    );
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

/// `karpenter.sh/do-not-disrupt` on a pod keeps the reboot off its node
/// while it holds, as Karpenter's `IsDoNotDisruptActive` says
/// (`pkg/utils/pod/scheduling.go`; parsing in `decide::do_not_disrupt`):
/// `"true"` while the pod runs, a duration until that long after it
/// started, when the pass wakes to take the node. A node whose pods are
/// not read yet is never taken.
#[test]
fn do_not_disrupt_on_a_pod_keeps_the_reboot_off_its_node_until_it_ends() {
    let started = Some(now() - SignedDuration::from_hours(1));
    let dnd_pod = |name: &str, node: &str, value: &str| {
        crate::decide::do_not_disrupt::tests::opted_out_pod(name, node, value, "Running", started)
    };
    let nodes = vec![node("a", "b0"), node("b", "b0"), node("c", "b0")];
    let mut w = World::new(policy(10), nodes);
    w.pods = vec![dnd_pod("db-0", "a", "true"), dnd_pod("batch", "b", "2h")];
    let plan = w.plan();
    assert_eq!(created(&plan), ["c"]);
    let st = status_of(&plan);
    for (n, says) in [
        ("a", "pod prod/db-0 has karpenter.sh/do-not-disrupt=true"),
        (
            "b",
            "pod prod/batch has karpenter.sh/do-not-disrupt until 2026-11-23T13:00:00Z",
        ),
    ] {
        let e = st
            .nodes
            .iter()
            .find(|e| e.name == n)
            .expect("in the status");
        assert_eq!(e.reason.as_deref(), Some("DoNotDisrupt"), "{n}");
        assert_eq!(e.message.as_deref(), Some(says), "{n}");
    }
    assert!(
        matches!(plan.then, Then::Wait(Some(d)) if d <= Duration::from_secs(3600)),
        "wakes when the duration ends: {:?}",
        plan.then
    );
    // An hour later the duration has ended: b is taken.
    w.now = now() + SignedDuration::from_mins(61);
    assert_eq!(created(&w.plan()), ["b", "c"]);
}

/// A node whose pods this process has not read is not taken: it waits
/// (reason `PodsUnread`) until the service has read them, and holds a
/// slot meanwhile, so one decision asks for a budget's worth of nodes
/// (all 20 were read in every pass of `just bench-reboot`: 69.8 requests
/// per reboot instead of 59).
#[test]
fn a_node_whose_pods_are_unread_is_not_taken_and_holds_a_slot_meanwhile() {
    let wait = crate::decide::rollout::pods_hold(None, now(), |_| {});
    let (reason, msg) = wait.expect("waits");
    assert_eq!(reason, "PodsUnread");
    assert!(msg.contains("not read yet"), "{msg}");
    let nodes = (0..6).map(|i| node(&format!("n{i}"), "b0")).collect();
    let mut w = World::new(policy(2), nodes);
    w.unread = true;
    let plan = w.plan();
    assert!(created(&plan).is_empty());
    let st = status_of(&plan);
    let unread: Vec<&str> = st
        .nodes
        .iter()
        .filter(|e| e.reason.as_deref() == Some("PodsUnread"))
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(unread, ["n0", "n1"], "only a budget's worth is asked about");
}

/// A node a pod's `"true"` holds, or the cluster role's own node held for
/// want of a replica elsewhere, is looked at again within 30 s (neither
/// the pod's annotation going nor a replica starting is an event the
/// cluster role watches), and that look writes nothing in an unchanged
/// world.
#[test]
fn holds_no_watch_ends_are_looked_at_again_and_write_nothing_unchanged() {
    use crate::decide::rollout::{LOOK_AGAIN, OwnNode};
    let opted_out = crate::decide::do_not_disrupt::tests::opted_out_pod;
    for own in [false, true] {
        let mut w = World::new(policy(10), vec![node("a", "b0")]);
        if own {
            w.own = Some(("a".into(), OwnNode::Held("no replica elsewhere".into())));
        } else {
            w.pods = vec![opted_out("db-0", "a", "true", "Running", None)];
        }
        let plan = w.plan();
        assert!(created(&plan).is_empty(), "taken: {plan:?}");
        assert_eq!(plan.then, Then::Wait(Some(LOOK_AGAIN)), "own node: {own}");
        w.policy.status = Some(status_of(&plan));
        w.now = now() + SignedDuration::from_secs(30);
        let again = w.plan();
        assert!(
            again.effects.is_empty(),
            "an unchanged world written again: {:?}",
            again.effects
        );
        assert_eq!(again.then, Then::Wait(Some(LOOK_AGAIN)));
    }
}
