//! Unit tests of pods with nowhere else to go (`decide::elsewhere`): a
//! reboot's drain evicts every pod as kured does; one whose eviction its
//! PDB refuses is asked about, and left for the shutdown when no other
//! node can run it, named in the status; an administrator's drain waits
//! on it as NMO's does.

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

/// `a`'s eviction refused by its PDB, and only `a` left on the node.
fn a_refused(m: NodeMaintenance) -> World {
    let mut w = two_pods(m);
    w.volumes = Some(crate::decide::volumes::Volumes::Read(Vec::new()));
    w.pods.truncate(1);
    w.attempts.insert(
        "uid-a".into(),
        Attempt {
            retry_at: Some(ts(12)),
            error: Some("PodDisruptionBudget db: needs 1".into()),
            refusals: 1,
        },
    );
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
fn a_reboots_drain_evicts_every_pod_first_and_asks_nothing() {
    let w = two_pods(owned(nm("m", 0, Some(Phase::Running))));
    let Step::Drain { pods, .. } = decide(&w.snapshot()) else {
        panic!("expected Drain, got {:?}", decide(&w.snapshot()))
    };
    assert_eq!(pods.len(), 2);
}

#[test]
fn a_refused_pod_is_asked_about_and_left_for_the_shutdown_with_its_name() {
    let w = a_refused(owned(nm("m", 0, Some(Phase::Running))));
    let Step::ReadHomes { pods, .. } = decide(&w.snapshot()) else {
        panic!("expected ReadHomes, got {:?}", decide(&w.snapshot()))
    };
    assert_eq!(pods, ["uid-a"]);
    let Step::WriteStatus {
        status, announce, ..
    } = w.decide()
    else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(announce, Some(Announce::Succeeded));
    assert_eq!(status.pending_count, Some(0));
    assert_eq!(status.last_error, None);
    let c = left_condition(&status).expect("a LeftForShutdown condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NowhereElseToRun")
    );
    assert!(
        c.message.contains("1 pod (ns/a)") && c.message.contains("machine's shutdown"),
        "{}",
        c.message
    );
}

#[test]
fn a_refused_pod_that_could_run_elsewhere_is_waited_for() {
    let mut w = a_refused(owned(nm("m", 0, Some(Phase::Running))));
    w.nowhere.clear();
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Running));
    assert!(left_condition(&status).is_none());
}

#[test]
fn an_administrators_drain_waits_on_the_refused_pod_and_asks_nothing() {
    let w = a_refused(nm("m", 0, Some(Phase::Running)));
    let Step::WriteStatus { status, .. } = decide(&w.snapshot()) else {
        panic!("expected a status write, got {:?}", decide(&w.snapshot()))
    };
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.pending_count, Some(1));
}

#[test]
fn a_pod_opted_out_of_disruption_is_still_waited_for() {
    let mut w = a_refused(owned(nm("m", 0, Some(Phase::Running))));
    let mut a = (*w.pods[0]).clone();
    a.metadata.annotations = Some(
        [(
            crate::api::pod::DO_NOT_DISRUPT.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    w.pods[0] = Arc::new(a);
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("expected a status write, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.pending_count, Some(1));
    assert!(left_condition(&status).is_none());
}

#[test]
fn a_pod_that_finds_a_place_later_is_evicted_and_the_condition_goes() {
    let mut w = a_refused(owned(nm("m", 0, Some(Phase::Running))));
    if let Some(a) = w.attempts.get_mut("uid-a") {
        a.retry_at = Some(ts(5));
    }
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
