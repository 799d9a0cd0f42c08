//! Maintenances whose Node does not exist (never did, or was deleted).

use super::*;

#[test]
fn missing_node_fails_new_maintenance_with_medik8s_message() {
    let w = World::new(None, vec![nm("m", 0, None)]);
    assert_eq!(
        w.decide(),
        Step::Fail {
            nm: "m".into(),
            reason: REASON_INVALID_NODE,
            message: "invalid nodeName, no node with name n1 found".into()
        }
    );
}

#[test]
fn deletion_completes_when_the_node_is_gone() {
    let w = World::new(None, vec![deleting(nm("m", 0, Some(Phase::Running)))]);
    assert_eq!(
        w.decide(),
        Step::Finish {
            nm: "m".into(),
            release_lease: true
        }
    );
}

/// A node deleted under a running maintenance fails it; one deleted after
/// the drain succeeded (a decommission, a replacement) is no failure: no
/// Warning for every replaced node. Once the maintenances are gone, the
/// lease this process held for the node goes (it would hold a node of the
/// same name from medik8s remediators for an hour).
#[test]
fn a_node_deleted_fails_a_running_maintenance_only_and_its_lease_goes_after() {
    let w = World::new(None, vec![nm("m", 0, Some(Phase::Running))]);
    assert!(
        matches!(
            w.decide(),
            Step::Fail {
                reason: REASON_NODE_GONE,
                ..
            }
        ),
        "{:?}",
        w.decide()
    );
    let w = World::new(None, vec![nm("m", 0, Some(Phase::Succeeded))]);
    assert_eq!(w.decide(), Step::Wait(None));
    let mut w = World::new(None, vec![]);
    assert_eq!(w.decide(), Step::ReleaseLease);
    w.lease_renew_at = None;
    assert_eq!(w.decide(), Step::Wait(None));
}

#[test]
fn failed_maintenance_is_final() {
    let w = World::new(None, vec![nm("m", 0, Some(Phase::Failed))]);
    assert_eq!(w.decide(), Step::Wait(None));
}
