//! What the lifecycle conditions say through a maintenance, and that a
//! patch names only what changes.

use super::*;
use crate::api::node::NodeStatus;
use crate::api::nodemaintenance::{NodeMaintenanceSpec, NodeMaintenanceStatus, OWNER_LABEL};
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn nm(phase: Phase, owner: Option<(&str, &str)>) -> NodeMaintenance {
    let mut m = NodeMaintenance::new(
        "m",
        NodeMaintenanceSpec {
            node_name: "n1".into(),
            reason: Some("kernel".into()),
        },
    );
    if let Some((kind, name)) = owner {
        m.metadata.labels = Some([(OWNER_LABEL.to_string(), kind.to_string())].into());
        m.metadata.owner_references = Some(vec![OwnerReference {
            kind: kind.into(),
            name: name.into(),
            ..Default::default()
        }]);
    }
    m.status = Some(NodeMaintenanceStatus {
        phase: Some(phase),
        ..Default::default()
    });
    m
}

fn node_with(conditions: Vec<NodeCondition>) -> Node {
    Node {
        status: Some(NodeStatus {
            conditions: Some(conditions),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ready() -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: Some("KubeletReady".into()),
        ..Default::default()
    }
}

/// The node after the API server merged `patch` by type.
fn merged(mut node: Node, patch: &Value) -> Node {
    crate::decide::maintenance::tests_support::apply_conditions(&mut node, patch);
    node
}

fn said(node: &Node, type_: &str) -> (String, String, String) {
    let c = current(node, type_).expect("condition present");
    (
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    )
}

#[test]
fn an_administrators_drain_then_its_end_as_kubectl_drain_does_in_the_kep() {
    let node = node_with(vec![ready()]);
    let running = nm(Phase::Running, None);
    let p = patch(&node, &while_held(&running, None), ts(0)).expect("first publication");
    let types: Vec<&str> = p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(
        types, TYPES,
        "only lifecycle types are patched, never Ready"
    );
    let node = merged(node, &p);
    assert_eq!(
        said(&node, MAINTENANCE_IN_PROGRESS),
        (
            "True".into(),
            REASON_ADMIN.into(),
            "NodeMaintenance m of an administrator holds the node: kernel".into()
        )
    );
    assert_eq!(said(&node, DRAIN_IN_PROGRESS).0, "True");
    assert_eq!(said(&node, DRAINED).0, "False");
    assert_eq!(said(&node, "Ready").0, "True");
    assert_eq!(
        patch(&node, &while_held(&running, None), ts(5)),
        None,
        "no churn"
    );

    // Drained: only the two drain conditions change; in-progress keeps its
    // transition time.
    let done = nm(Phase::Succeeded, None);
    let p = patch(&node, &while_held(&done, None), ts(9)).expect("drained");
    assert_eq!(p["status"]["conditions"].as_array().map(Vec::len), Some(2));
    let node = merged(node, &p);
    assert_eq!(
        said(&node, DRAIN_IN_PROGRESS),
        (
            "False".into(),
            REASON_DRAIN_COMPLETED.into(),
            "NodeMaintenance m of an administrator drained the node".into()
        )
    );
    assert_eq!(said(&node, DRAINED).0, "True");
    let began =
        current(&node, MAINTENANCE_IN_PROGRESS).and_then(|c| c.last_transition_time.clone());
    assert_eq!(began, Some(Time(ts(0))));

    // Given back: what is True goes False; what is False stays as it is.
    let released = after_release(&node);
    let kinds: Vec<&str> = released.iter().map(|w| w.type_).collect();
    assert_eq!(kinds, [MAINTENANCE_IN_PROGRESS, DRAINED]);
    let p = patch(&node, &released, ts(20)).expect("given back");
    let node = merged(node, &p);
    for t in TYPES {
        assert_eq!(said(&node, t).0, "False", "{t}");
    }
    assert!(after_release(&node).is_empty(), "nothing more to write");
}

#[test]
fn a_features_maintenance_names_its_owner_and_cause() {
    for (kind, reason) in [
        ("RebootPolicy", REASON_REBOOT),
        ("UpgradePlan", REASON_UPGRADE),
        ("NodeVersion", REASON_REPLACEMENT),
        ("SomethingNew", REASON_FEATURE),
    ] {
        let m = nm(Phase::Running, Some((kind, "p1")));
        let [held, ..] = while_held(&m, Some(kind));
        assert_eq!(held.reason, reason);
        assert_eq!(
            held.message,
            format!("NodeMaintenance m of {kind} p1 holds the node: kernel")
        );
    }
}

#[test]
fn conditions_someone_else_set_are_left_alone() {
    // kubectl drain's, per the KEP, and an administrator's by hand.
    let node = node_with(vec![
        NodeCondition {
            type_: DRAIN_IN_PROGRESS.into(),
            status: "True".into(),
            reason: Some("KubectlDrainStarted".into()),
            message: Some("drain started by kubectl".into()),
            ..Default::default()
        },
        NodeCondition {
            type_: MAINTENANCE_IN_PROGRESS.into(),
            status: "True".into(),
            reason: Some(REASON_ADMIN.into()),
            message: Some("firmware, ask Kim".into()),
            ..Default::default()
        },
    ]);
    assert!(after_release(&node).is_empty());
}
