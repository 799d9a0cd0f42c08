//! Unit tests of pods with nowhere else to go (`decide::elsewhere`): a
//! reboot's drain asks which pods another node could run, evicts only
//! those, says Succeeded with the rest named for the shutdown; an
//! administrator's drain evicts every pod as NMO's does.

use super::owners::owned;
use super::*;

/// A reboot's (or an administrator's) maintenance Running on the cordoned
/// node with pods `a` (nowhere else to go) and `b`.
fn two_pods(m: NodeMaintenance) -> World {
    let mut w = World::new(Some(maintained("m", false)), vec![m]);
    w.pods = vec![pod("a", "ReplicaSet"), pod("b", "ReplicaSet")];
    w.nowhere = ["uid-a".to_string()].into();
    w
}

fn left_condition(
    st: &NodeMaintenanceStatus,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == crate::decide::elsewhere::CONDITION)
}

#[test]
fn a_reboots_drain_asks_about_the_pods_it_would_evict_and_evicts_only_those_with_a_place() {
    let w = two_pods(owned(nm("m", 0, Some(Phase::Running))));
    // Asked first, about both (the DaemonSet's pod would not be).
    let Step::ReadHomes { pods, .. } = decide(&w.snapshot()) else {
        panic!("expected ReadHomes, got {:?}", decide(&w.snapshot()))
    };
    assert_eq!(pods, ["uid-a", "uid-b"]);
    let Step::Drain { pods, .. } = w.decide() else {
        panic!("expected Drain, got {:?}", w.decide())
    };
    let names: Vec<String> = pods.iter().map(|(p, _)| p.name_any()).collect();
    assert_eq!(names, ["b"]);
}

#[test]
fn it_says_succeeded_with_the_pods_left_for_the_shutdown_named() {
    let mut w = two_pods(owned(nm("m", 0, Some(Phase::Running))));
    w.volumes = Some(crate::decide::volumes::Volumes::Read(Vec::new()));
    w.pods.retain(|p| p.name_any() == "a");
    let Step::WriteStatus {
        status, announce, ..
    } = w.decide()
    else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(announce, Some(Announce::Succeeded));
    assert_eq!(status.pending_count, Some(0));
    let c = left_condition(&status).expect("a LeftForShutdown condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NowhereElseToRun")
    );
    assert!(
        c.message.contains("1 pod (ns/a)") && c.message.contains("graceful node shutdown"),
        "{}",
        c.message
    );
}

#[test]
fn a_pdb_that_refuses_for_ever_does_not_hold_a_pod_with_nowhere_to_go() {
    let mut w = two_pods(owned(nm("m", 0, Some(Phase::Running))));
    w.volumes = Some(crate::decide::volumes::Volumes::Read(Vec::new()));
    w.pods.retain(|p| p.name_any() == "a");
    w.attempts.insert(
        "uid-a".into(),
        Attempt {
            retry_at: Some(ts(12)),
            error: Some("PodDisruptionBudget db: needs 1".into()),
            refusals: 40,
        },
    );
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(status.last_error, None);
}

#[test]
fn an_administrators_drain_evicts_every_pod_and_asks_nothing() {
    let w = two_pods(nm("m", 0, Some(Phase::Running)));
    let Step::Drain { pods, .. } = decide(&w.snapshot()) else {
        panic!("expected Drain, got {:?}", decide(&w.snapshot()))
    };
    assert_eq!(pods.len(), 2);
}

#[test]
fn a_pod_opted_out_of_disruption_is_still_waited_for() {
    let mut w = two_pods(owned(nm("m", 0, Some(Phase::Running))));
    let mut a = (*w.pods[0]).clone();
    a.metadata.annotations = Some(
        [(
            crate::api::pod::DO_NOT_DISRUPT.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    w.pods[0] = Arc::new(a);
    w.pods.truncate(1);
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.pending_count, Some(1));
    assert!(left_condition(&status).is_none());
}

#[test]
fn a_pod_that_finds_a_place_later_is_evicted_and_the_condition_goes() {
    let mut w = two_pods(owned(nm("m", 0, Some(Phase::Running))));
    w.pods.truncate(1);
    w.volumes = Some(crate::decide::volumes::Volumes::Read(Vec::new()));
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert!(left_condition(&status).is_some());
    // Another node became Ready: the next answer has a place for it.
    let mut m = w.nms[0].clone();
    m.status = Some(*status);
    w.nms = vec![m];
    w.node = Some(published(maintained("m", false), &w.nms));
    w.nowhere.clear();
    let Step::Drain { pods, .. } = w.decide() else {
        panic!("expected Drain, got {:?}", w.decide())
    };
    assert_eq!(pods[0].0.name_any(), "a");
}
