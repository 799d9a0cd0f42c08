//! The reboot decisions on hand-built worlds: admission order and limits,
//! each phase's step, the no-double-reboot guard, the node role's half.

use std::sync::Arc;
use std::time::Duration;

use crate::api::node::{Node, NodeSpec, NodeStatus};
use crate::api::pod::{Pod, PodSpec};
use k8s_openapi::api::core::v1::{NodeCondition, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::*;
use crate::api::common::{BlockingPods, Window};
use crate::api::nodemaintenance::{
    DRAIN_GRACE_ANNOTATION, DRAIN_ON_TIMEOUT_ANNOTATION, DRAIN_POD_SELECTOR_ANNOTATION,
    NodeMaintenanceSpec, NodeMaintenanceStatus, Phase,
};
use crate::decide::HostAction;
use crate::decide::Then;

fn now() -> Timestamp {
    "2026-11-23T12:00:00Z".parse().unwrap_or_default()
}

fn node(name: &str, boot: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("7".into()),
            annotations: Some(
                [(
                    NEEDED_ANNOTATION.to_string(),
                    "2026-11-23T11:00:00Z".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                boot_id: boot.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn no_need(mut n: Node) -> Node {
    n.metadata.annotations = None;
    n
}

fn not_ready(mut n: Node) -> Node {
    if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        c[0].status = "False".into();
    }
    n
}

fn annotate(mut n: Node, k: &str, v: &str) -> Node {
    n.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(k.into(), v.into());
    n
}

fn policy(max: i32) -> RebootPolicy {
    let mut p = RebootPolicy::new("weekly", RebootPolicySpec::default());
    p.metadata.uid = Some("uid-policy".into());
    p.metadata.resource_version = Some("3".into());
    p.spec.budget.max_unavailable = IntOrString::Int(max);
    p
}

fn with_entry(mut p: RebootPolicy, e: NodeReboot) -> RebootPolicy {
    p.status.get_or_insert_with(Default::default).nodes.push(e);
    p
}

fn entry(name: &str, phase: RebootPhase, boot: &str, since: Timestamp) -> NodeReboot {
    NodeReboot {
        name: name.into(),
        phase,
        since: Time(since),
        boot_id_before: Some(boot.into()),
        need: None,
        message: None,
        reason: None,
    }
}

fn ours(p: &RebootPolicy, n: &Node, boot: &str, phase: Option<Phase>) -> NodeMaintenance {
    let mut m = maintenance_for(p, n, boot);
    m.metadata.uid = Some(format!("nm-uid-{}", n.name_any()));
    m.status = phase.map(|ph| NodeMaintenanceStatus {
        phase: Some(ph),
        ..Default::default()
    });
    m
}

struct World {
    policy: RebootPolicy,
    /// Every other RebootPolicy in the cluster.
    others: Vec<Arc<RebootPolicy>>,
    nodes: Vec<Arc<Node>>,
    nms: Vec<Arc<NodeMaintenance>>,
    pods: Vec<Arc<Pod>>,
    now: Timestamp,
    remote: bool,
    /// The service has not read any node's pods yet.
    unread: bool,
    health: Option<crate::decide::health::Health>,
    /// The node the cluster role runs on, and what the service answers
    /// about it.
    own: Option<(String, crate::decide::rollout::OwnNode)>,
}

impl World {
    fn new(policy: RebootPolicy, nodes: Vec<Node>) -> World {
        World {
            policy,
            others: Vec::new(),
            nodes: nodes.into_iter().map(Arc::new).collect(),
            nms: Vec::new(),
            pods: Vec::new(),
            now: now(),
            remote: false,
            unread: false,
            health: None,
            own: None,
        }
    }

    fn plan(&self) -> Plan {
        let pods = self.pods.clone();
        let pods_on = move |n: &str| -> Vec<Arc<Pod>> {
            pods.iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n))
                .cloned()
                .collect()
        };
        let node_pods = |n: &str| (!self.unread).then(|| pods_on(n));
        let mut policies = self.others.clone();
        policies.push(Arc::new(self.policy.clone()));
        // Each node as its agent leaves it once it found the reboot
        // command runnable (unless the test says otherwise).
        let nodes: Vec<Arc<Node>> = self
            .nodes
            .iter()
            .map(|n| {
                if annotation(n, CHECK_ANNOTATION).is_some() {
                    return n.clone();
                }
                let mut x = (**n).clone();
                x.metadata.annotations.get_or_insert_default().insert(
                    CHECK_ANNOTATION.into(),
                    format!("{} ok", crate::decide::command_check::key(&self.policy)),
                );
                Arc::new(x)
            })
            .collect();
        decide(&Snapshot {
            policy: &self.policy,
            nodes: &nodes,
            maintenances: &self.nms,
            policies: &policies,
            pods_on: &pods_on,
            node_pods: &node_pods,
            own_node: &|n| match &self.own {
                Some((own, answer)) if own == n => answer.clone(),
                _ => crate::decide::rollout::OwnNode::NotOurs,
            },
            now: self.now,
            remote: self.remote,
            failing: None,
            alerts: None,
            health: self.health.as_ref(),
            gates_unlisted: None,
            notified: None,
        })
    }
}

fn status_of(plan: &Plan) -> RebootPolicyStatus {
    plan.effects
        .iter()
        .find_map(|e| match e {
            Effect::WritePolicyStatus { status, .. } => Some((**status).clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no status write in {:?}", plan.effects))
}

fn phase_of(st: &RebootPolicyStatus, n: &str) -> (RebootPhase, String) {
    let e = st
        .nodes
        .iter()
        .find(|e| e.name == n)
        .unwrap_or_else(|| panic!("{n} not in status"));
    (e.phase, e.message.clone().unwrap_or_default())
}

fn created(plan: &Plan) -> Vec<String> {
    plan.effects
        .iter()
        .filter_map(|e| match e {
            Effect::CreateMaintenance { nm } => Some(nm.spec.node_name.clone()),
            _ => None,
        })
        .collect()
}

fn runs(plan: &Plan) -> usize {
    plan.effects
        .iter()
        .filter(|e| matches!(e, Effect::RunHost { .. }))
        .count()
}

#[test]
fn admits_in_name_order_up_to_the_budget_and_writes_the_record_first() {
    let w = World::new(
        policy(2),
        ["n3", "n1", "n2", "n4"]
            .iter()
            .map(|n| node(n, "b0"))
            .collect(),
    );
    let plan = w.plan();
    assert!(
        matches!(plan.effects[0], Effect::WritePolicyStatus { ref resource_version, .. } if resource_version.as_deref() == Some("3"))
    );
    assert_eq!(created(&plan), ["n1", "n2"]);
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "n1").0, RebootPhase::Draining);
    let (ph, msg) = phase_of(&st, "n3");
    assert_eq!(ph, RebootPhase::Waiting);
    assert!(msg.contains("2 of 4"), "{msg}");
    assert_eq!((st.needing, st.rebooting), (2, 2));
    let nm = plan.effects.iter().find_map(|e| match e {
        Effect::CreateMaintenance { nm } => Some(nm.clone()),
        _ => None,
    });
    let nm = nm.unwrap_or_else(|| panic!("no maintenance"));
    assert_eq!(
        nm.annotations().get(BOOT_ID_ANNOTATION).map(String::as_str),
        Some("b0")
    );
    assert_eq!(nm.spec.reason.as_deref(), Some("reboot: weekly"));
    assert!(!nm.annotations().contains_key(DRAIN_GRACE_ANNOTATION));
    assert_eq!(
        nm.annotations()
            .get(DRAIN_ON_TIMEOUT_ANNOTATION)
            .map(String::as_str),
        Some("Wait")
    );
}

#[test]
fn nodes_unavailable_for_any_reason_take_budget() {
    let mut cordoned = no_need(node("c", "b0"));
    cordoned.spec = Some(NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    let w = World::new(
        policy(2),
        vec![
            node("a", "b0"),
            node("b", "b0"),
            not_ready(no_need(node("x", "b0"))),
            cordoned,
        ],
    );
    let plan = w.plan();
    assert!(created(&plan).is_empty(), "2 of 4 already down");
    let (ph, _) = phase_of(&status_of(&plan), "a");
    assert_eq!(ph, RebootPhase::Waiting);
}

#[test]
fn an_admins_maintenance_counts_and_holds_its_node() {
    let mut w = World::new(
        policy(2),
        vec![node("a", "b0"), node("b", "b0"), node("c", "b0")],
    );
    let mut admin = NodeMaintenance::new(
        "fix-a",
        NodeMaintenanceSpec {
            node_name: "a".into(),
            reason: None,
        },
    );
    admin.metadata.uid = Some("u".into());
    w.nms.push(Arc::new(admin));
    let plan = w.plan();
    assert_eq!(
        created(&plan),
        ["b"],
        "a is in maintenance and counts: 1 + b = 2"
    );
    let (ph, msg) = phase_of(&status_of(&plan), "a");
    assert_eq!(ph, RebootPhase::Waiting);
    assert!(msg.contains("fix-a"), "{msg}");
}

#[test]
fn a_closed_window_admits_nothing_and_wakes_at_the_opening() {
    let mut p = policy(5);
    p.spec.windows = vec![Window {
        days: vec![],
        start: "22:00".into(),
        end: "02:00".into(),
        time_zone: "UTC".into(),
        ..Default::default()
    }];
    let w = World::new(p, vec![node("a", "b0")]);
    let plan = w.plan();
    assert!(created(&plan).is_empty());
    let (ph, msg) = phase_of(&status_of(&plan), "a");
    // The status says when it opens (the world's now is 12:00 UTC).
    assert_eq!(ph, RebootPhase::Waiting);
    assert!(
        msg.starts_with("outside every reboot window; the next opens at ")
            && msg.ends_with("T22:00:00Z"),
        "{msg}"
    );
    assert_eq!(plan.then, Then::Wait(Some(Duration::from_secs(10 * 3600))));
}

#[test]
fn a_blocking_pod_is_named_and_a_paused_node_waits() {
    let mut p = policy(5);
    p.spec.gates.blocking_pods = vec![BlockingPods {
        namespace: None,
        selector: LabelSelector {
            match_labels: Some([("app".to_string(), "db".to_string())].into()),
            ..Default::default()
        },
    }];
    let mut w = World::new(
        p,
        vec![
            node("a", "b0"),
            annotate(
                node("b", "b0"),
                &format!("{FLUO_PREFIX}reboot-paused"),
                "true",
            ),
        ],
    );
    w.pods.push(Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some("db-0".into()),
            namespace: Some("prod".into()),
            labels: Some([("app".to_string(), "db".to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("a".into()),
            ..Default::default()
        }),
        status: None,
    }));
    let plan = w.plan();
    assert!(created(&plan).is_empty());
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "a").1, "blocked by pod prod/db-0");
    assert_eq!(phase_of(&st, "b").0, RebootPhase::Waiting);
    assert!(phase_of(&st, "b").1.contains("paused"));
}

#[test]
fn coreos_and_fluo_annotations_mean_need() {
    let coreos = annotate(no_need(node("a", "b0")), COREOS_NEEDED_ANNOTATION, "");
    let fluo = annotate(
        no_need(node("b", "b0")),
        &format!("{FLUO_PREFIX}reboot-needed"),
        "true",
    );
    let fluo_no = annotate(
        no_need(node("c", "b0")),
        &format!("{FLUO_PREFIX}reboot-needed"),
        "false",
    );
    let plan = World::new(policy(5), vec![coreos, fluo, fluo_no]).plan();
    assert_eq!(created(&plan), ["a", "b"]);
}

#[test]
fn drained_nodes_are_rebooted_once_per_boot_in_remote_mode() {
    let mut p = policy(1);
    p.spec.reboot.remote_command = vec!["ipmi-reboot".into(), "{node}".into()];
    let p = with_entry(p, entry("a", RebootPhase::Draining, "b0", now()));
    let a = node("a", "b0");
    let mut w = World::new(p.clone(), vec![a.clone()]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    w.remote = true;
    let plan = w.plan();
    assert_eq!(runs(&plan), 1);
    let issue = plan
        .effects
        .iter()
        .position(|e| matches!(e, Effect::PatchNode { .. }));
    let run = plan
        .effects
        .iter()
        .position(|e| matches!(e, Effect::RunHost { .. }));
    assert!(issue < run, "the record is written before the command");
    assert!(
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::RunHost { action: HostAction::Remote(argv), .. } if argv == &["ipmi-reboot", "a"]))
    );
    // Issued in this boot: never again, whatever else happens.
    w.nodes = vec![Arc::new(annotate(a.clone(), ISSUED_ANNOTATION, "b0"))];
    assert_eq!(runs(&w.plan()), 0);
    // Node role mode: the cluster role never runs it.
    w.nodes = vec![Arc::new(a)];
    w.remote = false;
    assert_eq!(runs(&w.plan()), 0);
}

#[test]
fn a_new_boot_and_ready_is_verified_given_back_and_settles() {
    let mut p = policy(1);
    p.spec.gates.settle_seconds = 60;
    let p = with_entry(p, entry("a", RebootPhase::Rebooting, "b0", now()));
    let a = annotate(node("a", "b1"), ISSUED_ANNOTATION, "b0");
    let mut w = World::new(p.clone(), vec![a.clone(), node("b", "b0")]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    let plan = w.plan();
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "a").0, RebootPhase::Settling);
    assert!(
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::DeleteMaintenance { nm, .. } if nm == "reboot-a"))
    );
    assert!(plan.effects.iter().any(|e| matches!(e, Effect::PatchNode { patch, .. } if patch["metadata"]["annotations"].get(NEEDED_ANNOTATION).is_some_and(serde_json::Value::is_null))));
    assert!(created(&plan).is_empty(), "a settles in its slot; b waits");
    // After the settle time, with the maintenance gone: Done and b goes.
    let p2 = with_entry(policy(1), entry("a", RebootPhase::Settling, "b0", now()));
    let mut w2 = World::new(p2, vec![no_need(node("a", "b1")), node("b", "b0")]);
    w2.now = now()
        .checked_add(SignedDuration::from_secs(61))
        .unwrap_or_default();
    let plan = w2.plan();
    assert_eq!(phase_of(&status_of(&plan), "a").0, RebootPhase::Done);
    assert_eq!(created(&plan), ["b"]);
}

/// `gates.health`: a node that came back keeps its slot until the
/// workloads are available again; past the timeout `Pause` keeps it
/// (reported once), `Continue` gives it up (reported).
#[test]
fn the_health_gate_holds_the_slot_until_the_workloads_are_available() {
    use crate::decide::health::{HEALTH_TIMEOUT, Health, Workload};
    let db = |available| Workload {
        kind: "Deployment",
        namespace: "prod".into(),
        name: "db".into(),
        desired: 3,
        updated: 3,
        ready: available,
        available,
        observed: true,
        rule: crate::decide::health::Rule::Rollout { old: 0 },
    };
    let gated = |on_timeout: &str| {
        let mut p = policy(1);
        p.spec.gates.health = serde_json::from_value(serde_json::json!({
            "workloads": [{"namespace": "prod", "selector": {"matchLabels": {"tier": "db"}}}],
            "timeoutSeconds": 300,
            "onTimeout": on_timeout,
        }))
        .ok();
        assert!(p.spec.gates.health.is_some());
        with_entry(p, entry("a", RebootPhase::Settling, "b0", now()))
    };
    let reason = |st: &RebootPolicyStatus| {
        st.nodes
            .iter()
            .find(|e| e.name == "a")
            .and_then(|e| e.reason.clone())
    };
    let timeouts = |plan: &Plan| {
        plan.effects
            .iter()
            .filter(|e| matches!(e, Effect::Event { reason, .. } if *reason == "HealthTimeout"))
            .count()
    };
    let mut w = World::new(
        gated("Pause"),
        vec![no_need(node("a", "b1")), node("b", "b0")],
    );
    // Not listed yet: held.
    let plan = w.plan();
    assert_eq!(phase_of(&status_of(&plan), "a").0, RebootPhase::Settling);
    assert!(created(&plan).is_empty());
    // A workload short of a replica: held, and the status names it.
    w.health = Some(Health::Listed(vec![db(2)]));
    let plan = w.plan();
    let (phase, msg) = phase_of(&status_of(&plan), "a");
    assert_eq!(phase, RebootPhase::Settling);
    assert!(msg.contains("Deployment prod/db: 2/3 available"), "{msg}");
    assert!(created(&plan).is_empty(), "b waits for a's slot");
    // Available again: a is done and b is taken.
    w.health = Some(Health::Listed(vec![db(3)]));
    let plan = w.plan();
    assert_eq!(phase_of(&status_of(&plan), "a").0, RebootPhase::Done);
    assert_eq!(created(&plan), ["b"]);
    // Past the timeout, still short: Pause keeps the slot, reported once.
    w.health = Some(Health::Listed(vec![db(2)]));
    w.now = now()
        .checked_add(SignedDuration::from_secs(301))
        .unwrap_or_default();
    let plan = w.plan();
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "a").0, RebootPhase::Settling);
    assert_eq!(reason(&st).as_deref(), Some(HEALTH_TIMEOUT));
    assert!(created(&plan).is_empty());
    assert_eq!(timeouts(&plan), 2, "on the node and the policy");
    w.policy.status = Some(st);
    let again = w.plan();
    assert_eq!(timeouts(&again), 0, "reported once");
    // Continue: the slot goes, reported, and b is taken.
    let mut c = World::new(
        gated("Continue"),
        vec![no_need(node("a", "b1")), node("b", "b0")],
    );
    c.health = Some(Health::Listed(vec![db(2)]));
    c.now = w.now;
    let plan = c.plan();
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "a").0, RebootPhase::Done);
    assert_eq!(reason(&st).as_deref(), Some(HEALTH_TIMEOUT));
    assert_eq!(timeouts(&plan), 2);
    assert_eq!(created(&plan), ["b"]);
}

#[test]
fn a_node_that_does_not_return_keeps_its_slot_and_is_reported_once() {
    let p = with_entry(policy(1), entry("a", RebootPhase::Rebooting, "b0", now()));
    let a = annotate(not_ready(node("a", "b0")), ISSUED_ANNOTATION, "b0");
    let mut w = World::new(p.clone(), vec![a.clone(), node("b", "b0")]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    w.now = now()
        .checked_add(SignedDuration::from_secs(901))
        .unwrap_or_default();
    let plan = w.plan();
    let st = status_of(&plan);
    let cond = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "NodeNotReturned");
    assert!(cond.is_some_and(|c| c.status == "True" && c.message.contains('a')));
    assert!(created(&plan).is_empty(), "no next node");
    let events = plan
        .effects
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::Event {
                    reason: "NodeNotReturned",
                    ..
                }
            )
        })
        .count();
    assert_eq!(events, 2, "one on the node, one on the policy");
    // Next decision, recorded as NotReturned: no new events.
    let mut w2 = World::new(
        RebootPolicy {
            status: Some(st),
            ..p.clone()
        },
        vec![a.clone(), node("b", "b0")],
    );
    w2.nms = w.nms.clone();
    w2.now = w.now;
    let again = w2.plan();
    assert!(
        !again
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Event { .. }))
    );
}

#[test]
fn the_slot_of_a_deleted_node_is_reclaimed() {
    let p = with_entry(
        policy(1),
        entry("gone", RebootPhase::Rebooting, "b0", now()),
    );
    let ghost = node("gone", "b0");
    let mut w = World::new(p.clone(), vec![node("b", "b0")]);
    w.nms
        .push(Arc::new(ours(&p, &ghost, "b0", Some(Phase::Succeeded))));
    let plan = w.plan();
    assert!(
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::DeleteMaintenance { nm, .. } if nm == "reboot-gone"))
    );
    assert_eq!(created(&plan), ["b"]);
    assert!(!status_of(&plan).nodes.iter().any(|e| e.name == "gone"));
}

#[test]
fn a_skipped_drain_fails_the_node_for_this_boot_and_frees_the_slot() {
    let p = with_entry(policy(1), entry("a", RebootPhase::Draining, "b0", now()));
    let a = node("a", "b0");
    let mut w = World::new(p.clone(), vec![a.clone(), node("b", "b0")]);
    let mut m = ours(&p, &a, "b0", Some(Phase::Failed));
    if let Some(s) = m.status.as_mut() {
        s.last_error = Some("drain skipped: blocked by pod x/y".into());
    }
    w.nms.push(Arc::new(m));
    let plan = w.plan();
    let st = status_of(&plan);
    assert_eq!(phase_of(&st, "a").0, RebootPhase::Failed);
    assert!(phase_of(&st, "a").1.contains("blocked by pod x/y"));
    // The failed maintenance still holds the node in this snapshot: b waits
    // until it is deleted.
    assert!(created(&plan).is_empty());
    // Once it is gone, a stays Failed in this boot and b is admitted.
    let mut w2 = World::new(
        RebootPolicy {
            status: Some(st),
            ..p
        },
        vec![a, node("b", "b0")],
    );
    w2.now = w.now;
    let plan = w2.plan();
    assert_eq!(created(&plan), ["b"]);
}

#[test]
fn a_recorded_command_failure_fails_the_node_once_the_return_deadline_passes() {
    let p = with_entry(policy(1), entry("a", RebootPhase::Rebooting, "b0", now()));
    let a = annotate(
        annotate(node("a", "b0"), ISSUED_ANNOTATION, "b0"),
        FAILED_ANNOTATION,
        "b0: ssh exited with 255",
    );
    let mut w = World::new(p.clone(), vec![a.clone()]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    // Before the deadline the host may be going down anyway (ssh's 255 as
    // the connection drops): the node stays held, waiting for a new boot.
    let plan = w.plan();
    let (ph, msg) = phase_of(&status_of(&plan), "a");
    assert_eq!(ph, RebootPhase::Rebooting);
    assert!(msg.contains("ssh exited with 255"), "{msg}");
    assert!(
        !plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::DeleteMaintenance { .. })),
        "given back while it may be rebooting"
    );
    // It came back with a new boot: that was the reboot.
    let back = annotate(node("a", "b1"), ISSUED_ANNOTATION, "b0");
    let mut w2 = World::new(p.clone(), vec![back.clone()]);
    w2.nms
        .push(Arc::new(ours(&p, &back, "b0", Some(Phase::Succeeded))));
    assert_eq!(phase_of(&status_of(&w2.plan()), "a").0, RebootPhase::Done);
    // No new boot by the return deadline: failed, given back.
    w.now = now()
        .checked_add(SignedDuration::from_secs(
            p.spec.reboot.return_timeout_seconds as i64 + 1,
        ))
        .unwrap_or_default();
    let plan = w.plan();
    let (ph, msg) = phase_of(&status_of(&plan), "a");
    assert_eq!(ph, RebootPhase::Failed);
    assert!(msg.contains("ssh exited with 255"), "{msg}");
    assert!(
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::DeleteMaintenance { .. }))
    );
}

#[test]
fn an_admission_whose_create_was_lost_is_created_again() {
    let first = World::new(policy(1), vec![node("a", "b0")]).plan();
    assert_eq!(created(&first), ["a"]);
    // The status was written, the create was lost (a crash in between):
    let p = RebootPolicy {
        status: Some(status_of(&first)),
        ..policy(1)
    };
    let plan = World::new(p, vec![node("a", "b0")]).plan();
    assert_eq!(created(&plan), ["a"]);
    assert!(
        plan.effects
            .iter()
            .all(|e| !matches!(e, Effect::WritePolicyStatus { .. })),
        "status unchanged: no write"
    );
}

pub(crate) mod foreign_holders;
mod give_back;
mod node_role;
mod ownership;
mod settings;
/// The random worlds' generator and merge patch (the maintenance worlds
/// use them too).
pub(crate) mod world_tools;
mod worlds;

/// A node whose agent cannot reboot it (installed without --reboot: no
/// `systemctl` in its container) is never taken: it waits, the policy says
/// why per node and warns once; one whose agent has not answered yet waits
/// for it; its neighbour, whose agent can, is admitted. A cluster role
/// that reboots with `reboot.remoteCommand` needs no agent's word.
#[test]
fn a_node_whose_agent_cannot_reboot_it_is_never_drained_and_says_why() {
    let key = crate::decide::command_check::key(&policy(3));
    let with_check = |name: &str, value: Option<String>| {
        let mut n = node(name, "b0");
        let ann = n.metadata.annotations.get_or_insert_default();
        match value {
            Some(v) => ann.insert(CHECK_ANNOTATION.into(), v),
            // Another policy's answer: not this one's.
            None => ann.insert(CHECK_ANNOTATION.into(), "older/1/deadbeef ok".into()),
        };
        n
    };
    let mut w = World::new(
        policy(3),
        vec![
            with_check("a", Some(format!("{key} cannot run: systemctl: not found"))),
            with_check("b", None),
            with_check("c", Some(format!("{key} ok"))),
        ],
    );
    let plan = w.plan();
    assert_eq!(created(&plan), ["c"]);
    let st = status_of(&plan);
    let a = st.nodes.iter().find(|e| e.name == "a").cloned();
    let a = a.unwrap_or_else(|| panic!("a in {st:?}"));
    assert_eq!(
        (a.phase, a.reason.as_deref()),
        (RebootPhase::Waiting, Some(WAIT_COMMAND))
    );
    assert!(
        a.message
            .as_deref()
            .unwrap_or_default()
            .contains("systemctl: not found"),
        "{a:?}"
    );
    let b = st
        .nodes
        .iter()
        .find(|e| e.name == "b")
        .map(|e| e.reason.clone());
    assert_eq!(b, Some(Some(WAIT_AGENT_CHECK.to_string())));
    let warned = |plan: &Plan| {
        plan.effects
            .iter()
            .filter(|e| matches!(e, Effect::Event { reason, .. } if *reason == "RebootCommandNotRunnable"))
            .count()
    };
    assert_eq!(warned(&plan), 2, "on the node and on the policy");
    // The next pass, with the status it wrote: no second warning.
    w.policy.status = Some(st);
    assert_eq!(warned(&w.plan()), 0);
    // Rebooted from the cluster role: no agent is asked.
    w.policy.spec.reboot.remote_command = vec!["ipmi-reboot".into(), "{node}".into()];
    w.policy.status = None;
    w.remote = true;
    assert_eq!(created(&w.plan()), ["a", "b", "c"]);

    // The agent's side: it checks the governing policy's command, records
    // a changed answer only, and stops asking once it can.
    let policies = [Arc::new(policy(3))];
    let fresh = node("a", "b0");
    let (k, action) =
        node::to_check(&fresh, &policies).unwrap_or_else(|| panic!("nothing to check"));
    assert_eq!(
        (k.as_str(), action),
        (
            key.as_str(),
            HostAction::Command(vec!["systemctl".into(), "reboot".into()])
        )
    );
    let no = Err("systemctl: not found".to_string());
    assert!(node::record_check(&fresh, &key, &no).is_some());
    let said = with_check("a", Some(format!("{key} cannot run: systemctl: not found")));
    assert!(node::record_check(&said, &key, &no).is_none());
    assert!(node::to_check(&said, &policies).is_some(), "asked again");
    let ok = with_check("a", Some(format!("{key} ok")));
    assert!(node::to_check(&ok, &policies).is_none());
}

/// The node the cluster role runs on waits while no replica runs
/// elsewhere (the next node is admitted in its place), is asked about
/// before it is taken, and is taken once free.
#[test]
fn the_cluster_roles_own_node_waits_without_a_replica_elsewhere() {
    use crate::decide::rollout::OwnNode;
    let nodes = ["n1", "n2"].iter().map(|n| node(n, "b0")).collect();
    let mut w = World::new(policy(1), nodes);
    w.own = Some(("n1".into(), OwnNode::Unknown));
    let plan = w.plan();
    assert_eq!(
        created(&plan),
        ["n2"],
        "not the own node while it is asked about"
    );
    let (ph, msg) = phase_of(&status_of(&plan), "n1");
    assert_eq!(ph, RebootPhase::Waiting);
    assert!(msg.contains("reading whether a replica runs"), "{msg}");
    w.own = Some(("n1".into(), OwnNode::Held("no replica elsewhere".into())));
    let plan = w.plan();
    assert_eq!(created(&plan), ["n2"]);
    let st = status_of(&plan);
    let entry = st
        .nodes
        .iter()
        .find(|e| e.name == "n1")
        .expect("n1's entry");
    assert_eq!(entry.reason.as_deref(), Some("OwnNode"));
    assert_eq!(entry.message.as_deref(), Some("no replica elsewhere"));
    w.own = Some(("n1".into(), OwnNode::Free));
    assert_eq!(created(&w.plan()), ["n1"]);
}
