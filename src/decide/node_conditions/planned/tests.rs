//! Which nodes are planned, and that a planned node's condition is
//! written once, withdrawn once, and never over someone else's.

use super::*;
use crate::api::constellation::{NodeVersionSpec, NodeVersionStatus};
use crate::api::node::NodeStatus;
use crate::api::reboot::{NodeReboot, RebootPolicyStatus};
use crate::api::upgrade::{NodeUpgrade, UpgradePlanSpec, UpgradePlanStatus};
use k8s_openapi::api::core::v1::{NodeCondition, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn policy(name: &str, nodes: &[(&str, RebootPhase, Option<&str>)]) -> Arc<RebootPolicy> {
    let mut p = RebootPolicy::new(name, Default::default());
    p.status = Some(RebootPolicyStatus {
        nodes: nodes
            .iter()
            .map(|(n, phase, reason)| NodeReboot {
                name: n.to_string(),
                phase: *phase,
                since: Time(ts(0)),
                boot_id_before: None,
                need: None,
                message: Some(format!("{n} waits 3m12s more")),
                reason: reason.map(str::to_string),
            })
            .collect(),
        ..Default::default()
    });
    Arc::new(p)
}

fn plan(name: &str, nodes: &[(&str, UpgradePhase)]) -> Arc<UpgradePlan> {
    let spec: UpgradePlanSpec = serde_json::from_value(json!({
        "version": "v2",
        "versionFrom": {"source": "Label", "key": "v"},
        "strategy": {"command": ["/sbin/upgrade"]},
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let mut p = UpgradePlan::new(name, spec);
    p.status = Some(UpgradePlanStatus {
        nodes: nodes
            .iter()
            .map(|(n, phase)| NodeUpgrade {
                name: n.to_string(),
                phase: *phase,
                since: Time(ts(0)),
                group: None,
                version: Some("v2".into()),
                attempt: None,
                boot_id_before: None,
                hook: None,
                job: None,
                job_seen: false,
                maintenance_gone_at: None,
                message: None,
                reason: None,
            })
            .collect(),
        ..Default::default()
    });
    Arc::new(p)
}

fn version(outdated: &[&str], donors: &[&str]) -> Arc<NodeVersion> {
    let refs = |names: &[&str]| {
        names
            .iter()
            .map(|n| ObjectReference {
                kind: Some("Node".into()),
                name: Some(n.to_string()),
                ..Default::default()
            })
            .collect()
    };
    let mut v = NodeVersion::new("constellation-version", NodeVersionSpec::default());
    v.status = Some(NodeVersionStatus {
        outdated: refs(outdated),
        donors: refs(donors),
        ..Default::default()
    });
    Arc::new(v)
}

fn node(name: &str, planned: Option<(&str, &str, &str)>) -> Arc<Node> {
    let mut conditions = vec![NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        ..Default::default()
    }];
    if let Some((status, reason, message)) = planned {
        conditions.push(NodeCondition {
            type_: MAINTENANCE_PLANNED.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Default::default()
        });
    }
    let mut n = Node {
        status: Some(NodeStatus {
            conditions: Some(conditions),
            ..Default::default()
        }),
        ..Default::default()
    };
    n.metadata.name = Some(name.into());
    Arc::new(n)
}

fn apply(n: &Arc<Node>, effects: &[Effect]) -> Arc<Node> {
    let mut n = (**n).clone();
    for e in effects {
        if let Effect::PatchNodeStatus { node, patch } = e
            && Some(node) == n.metadata.name.as_ref()
        {
            crate::decide::maintenance::tests_support::apply_conditions(&mut n, patch);
        }
    }
    Arc::new(n)
}

fn said(n: &Node) -> Option<(String, String, String)> {
    let c = current(n, MAINTENANCE_PLANNED)?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

#[test]
fn waiting_and_pending_nodes_of_every_feature_are_planned_and_begun_ones_are_not() {
    let p = planned(
        &[
            policy(
                "weekly",
                &[
                    ("a", RebootPhase::Waiting, Some("Budget")),
                    ("b", RebootPhase::Draining, None),
                    ("c", RebootPhase::Pending, None),
                    ("d", RebootPhase::Failed, Some("NotReturned")),
                ],
            ),
            policy("alpha", &[("a", RebootPhase::Waiting, Some("Window"))]),
        ],
        &[plan(
            "os",
            &[
                ("a", UpgradePhase::Waiting),
                ("e", UpgradePhase::PreHooks),
                ("f", UpgradePhase::Upgrading),
                ("g", UpgradePhase::Done),
            ],
        )],
        &[version(&["h", "i"], &["i"])],
    );
    let names: Vec<&str> = p.keys().map(String::as_str).collect();
    assert_eq!(names, ["a", "c", "e", "h"]);
    let a = &p["a"];
    assert_eq!(
        (a.type_, a.status, a.reason),
        (MAINTENANCE_PLANNED, true, REASON_REBOOT)
    );
    // Every feature named, policies by name; the reason, never the
    // status message (it counts down, and each change would be a write).
    assert_eq!(
        a.message,
        "NodeMaintenance planned: RebootPolicy alpha needs a reboot (Waiting: Window); \
         RebootPolicy weekly needs a reboot (Waiting: Budget); \
         UpgradePlan os upgrades it to v2 (Waiting)"
    );
    assert_eq!(p["e"].reason, REASON_UPGRADE);
    assert!(
        p["e"].message.contains("running its before hooks"),
        "{}",
        p["e"].message
    );
    assert_eq!(p["h"].reason, REASON_REPLACEMENT);
    assert_eq!(
        p["h"].message,
        "NodeMaintenance planned: NodeVersion constellation-version replaces it (outdated)"
    );
}

#[test]
fn published_once_withdrawn_once_and_a_node_never_planned_costs_no_write() {
    let nodes = [node("a", None), node("quiet", None)];
    let wanted = planned(
        &[policy(
            "weekly",
            &[("a", RebootPhase::Waiting, Some("Budget"))],
        )],
        &[],
        &[],
    );
    let first = effects(&nodes, &wanted, &|_| false, ts(1));
    assert_eq!(
        first.len(),
        1,
        "only the planned node is written: {first:?}"
    );
    let a = apply(&nodes[0], &first);
    let (status, reason, message) = said(&a).expect("published");
    assert_eq!((status.as_str(), reason.as_str()), ("True", REASON_REBOOT));
    assert!(message.starts_with("NodeMaintenance planned: RebootPolicy weekly"));
    // Ready (the kubelet's) untouched.
    assert_eq!(
        current(&a, "Ready").map(|c| c.status.as_str()),
        Some("True")
    );
    // The same world again: nothing to write.
    let nodes = [a, nodes[1].clone()];
    assert!(effects(&nodes, &wanted, &|_| false, ts(2)).is_empty());
    // Admitted: planned no more.
    let gone = effects(&nodes, &Planned::new(), &|_| false, ts(3));
    let a = apply(&nodes[0], &gone);
    let (status, reason, _) = said(&a).expect("still there, False");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", REASON_NOT_PLANNED)
    );
    assert!(effects(&[a], &Planned::new(), &|_| false, ts(4)).is_empty());
}

#[test]
fn someone_elses_planned_condition_is_left_alone() {
    let theirs = Some(("True", "RackWork", "rack 4 power work on Friday"));
    let nodes = [node("a", theirs), node("b", theirs)];
    let wanted = planned(
        &[policy("weekly", &[("a", RebootPhase::Waiting, None)])],
        &[],
        &[],
    );
    assert!(
        effects(&nodes, &wanted, &|_| false, ts(1)).is_empty(),
        "a True of someone else's already says planned, and is theirs to withdraw"
    );
    // Their False is overwritten when we plan: it says nothing is planned.
    let nodes = [node("a", Some(("False", "RackWork", "done")))];
    assert_eq!(effects(&nodes, &wanted, &|_| false, ts(1)).len(), 1);
}

#[test]
fn a_node_whose_last_write_was_refused_waits() {
    let nodes = [node("a", None)];
    let wanted = planned(
        &[policy("weekly", &[("a", RebootPhase::Waiting, None)])],
        &[],
        &[],
    );
    assert!(effects(&nodes, &wanted, &|n| n == "a", ts(1)).is_empty());
}
