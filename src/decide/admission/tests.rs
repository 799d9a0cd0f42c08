//! Unit tests of the admission decisions and the shared caBundle.

use std::sync::Arc;

use super::*;
use crate::api::node::{NodeSpec, NodeStatus};
use crate::api::nodemaintenance::{NodeMaintenanceSpec, NodeMaintenanceStatus, OWNER_LABEL};
use k8s_openapi::api::core::v1::NodeCondition;

fn node(name: &str, control_plane: bool, ready: bool, schedulable: bool) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    if control_plane {
        n.metadata.labels = Some([(CONTROL_PLANE_LABEL.to_string(), String::new())].into());
    }
    n.spec = Some(NodeSpec {
        unschedulable: (!schedulable).then_some(true),
        ..Default::default()
    });
    n.status = Some(NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    n
}

fn nm(name: &str, node: &str) -> NodeMaintenance {
    NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: None,
        },
    )
}

fn failed(mut m: NodeMaintenance) -> NodeMaintenance {
    m.status = Some(NodeMaintenanceStatus {
        phase: Some(Phase::Failed),
        ..Default::default()
    });
    m
}

fn check(
    new: &NodeMaintenance,
    node: Option<&Node>,
    cp: &[Node],
    existing: Vec<NodeMaintenance>,
) -> Result<(), String> {
    let existing: Vec<Arc<NodeMaintenance>> = existing.into_iter().map(Arc::new).collect();
    review(&Request {
        nm: new,
        node,
        control_plane: cp,
        existing: &existing,
        quorum_check: true,
        // Every labelled object here has its owner (see the forged one).
        owner_live: true,
    })
}

#[test]
fn a_missing_node_is_refused_with_nmos_message() {
    assert_eq!(
        check(&nm("m", "ghost"), None, &[], vec![]),
        Err("invalid nodeName, no node with name ghost found".into())
    );
}

#[test]
fn a_second_live_maintenance_is_refused_a_failed_one_is_not() {
    let w = node("w", false, true, true);
    assert_eq!(
        check(&nm("b", "w"), Some(&w), &[], vec![nm("a", "w")]),
        Err("invalid nodeName, a NodeMaintenance for node w already exists".into())
    );
    assert_eq!(
        check(&nm("b", "w"), Some(&w), &[], vec![failed(nm("a", "w"))]),
        Ok(())
    );
    // The object itself (a retried create) is not its own duplicate.
    assert_eq!(
        check(&nm("a", "w"), Some(&w), &[], vec![nm("a", "w")]),
        Ok(())
    );
}

#[test]
fn features_maintenances_are_left_to_their_budgets() {
    let mut feature = nm("reboot-w", "w");
    feature.metadata.labels = Some([(OWNER_LABEL.to_string(), "reboot".to_string())].into());
    assert_eq!(check(&feature, None, &[], vec![nm("a", "w")]), Ok(()));
    // The label alone, without a live owner behind it, skips nothing.
    let forged = review(&Request {
        nm: &feature,
        node: None,
        control_plane: &[],
        existing: &[],
        quorum_check: true,
        owner_live: false,
    });
    assert_eq!(
        forged,
        Err("invalid nodeName, no node with name w found".into())
    );
    // And an administrator's preempts a feature's (status does the rest).
    let w = node("w", false, true, true);
    assert_eq!(check(&nm("a", "w"), Some(&w), &[], vec![feature]), Ok(()));
}

#[test]
fn control_plane_quorum_is_kept() {
    let cp: Vec<Node> = (1..=3)
        .map(|i| node(&format!("cp{i}"), true, true, true))
        .collect();
    // 3 members, quorum 2: taking one leaves 2.
    assert_eq!(check(&nm("m", "cp1"), Some(&cp[0]), &cp, vec![]), Ok(()));
    // With cp2 already in maintenance, taking cp1 leaves 1.
    assert_eq!(
        check(&nm("m", "cp1"), Some(&cp[0]), &cp, vec![nm("x", "cp2")]),
        Err(quorum_message("cp1", 1, 3, 2))
    );
    // A NotReady or cordoned member does not count either.
    let mut degraded = cp.clone();
    degraded[1] = node("cp2", true, false, true);
    assert!(check(&nm("m", "cp1"), Some(&degraded[0]), &degraded, vec![]).is_err());
    degraded[1] = node("cp2", true, true, false);
    assert!(check(&nm("m", "cp1"), Some(&degraded[0]), &degraded, vec![]).is_err());
    // A single control-plane node can never be taken with the check on.
    let one = [node("cp1", true, true, true)];
    assert_eq!(
        check(&nm("m", "cp1"), Some(&one[0]), &one, vec![]),
        Err(quorum_message("cp1", 0, 1, 1))
    );
    // Workers are not subject to it.
    let w = node("w", false, true, true);
    assert_eq!(
        check(&nm("m", "w"), Some(&w), &one, vec![nm("x", "cp1")]),
        Ok(())
    );
}

fn sha(s: &str) -> String {
    format!(
        "sha-{}",
        s.len() + s.bytes().map(usize::from).sum::<usize>()
    )
}

fn pem(body: &str) -> String {
    format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n")
}

fn owned(identity: &str, block: &str, not_after: i64) -> Owned {
    Owned {
        identity: identity.into(),
        sha256: sha(block),
        not_after: Timestamp::from_second(not_after).unwrap_or(Timestamp::UNIX_EPOCH),
    }
}

#[test]
fn the_bundle_swaps_our_ca_keeps_others_until_expiry_and_hand_added_ones() {
    let now = Timestamp::from_second(1000).unwrap_or(Timestamp::UNIX_EPOCH);
    let (old_mine, other, expired, manual, new_mine) = (
        pem("OLDMINE"),
        pem("OTHER"),
        pem("EXPIRED"),
        pem("MANUAL"),
        pem("NEWMINE"),
    );
    let bundle = format!("{old_mine}{other}{expired}{manual}");
    let owners = vec![
        owned("a", &old_mine, 5000),
        owned("b", &other, 5000),
        owned("c", &expired, 999),
    ];
    let mine = vec![(new_mine.clone(), owned("a", &new_mine, 6000))];
    let (out, kept) = merge_bundle(&bundle, &owners, "a", &mine, now, sha);
    assert_eq!(out, format!("{other}{manual}{new_mine}"));
    assert_eq!(
        kept,
        vec![owned("b", &other, 5000), owned("a", &new_mine, 6000)]
    );
    // Idempotent: merging again changes nothing.
    let again = merge_bundle(&out, &kept, "a", &mine, now, sha);
    assert_eq!(again, (out, kept));
}

#[test]
fn rotation_comes_after_two_thirds_of_the_life() {
    let from = Timestamp::from_second(0).unwrap_or(Timestamp::UNIX_EPOCH);
    let to = Timestamp::from_second(3000).unwrap_or(Timestamp::UNIX_EPOCH);
    assert_eq!(rotate_at(from, to).as_second(), 2000);
}
