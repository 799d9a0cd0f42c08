//! Unit tests of the wait for volumes: a feature's drained maintenance
//! says Succeeded only once the evicted pods' volumes are detached; an
//! administrator's is not held; the deadline's escalation applies.

use super::owners::{owned, with_drain};
use super::*;
use crate::decide::volumes::{Attached, Volumes};

/// A drained node (no pods left) in the reboot's maintenance `m`, begun
/// at `ts(0)`, with `attached` as the service read it; now is `ts(now)`.
fn drained(m: NodeMaintenance, attached: Vec<Attached>, now: i64) -> World {
    let mut w = World::new(Some(maintained("m", false)), vec![m]);
    w.volumes = Some(Volumes::Read(attached));
    w.now = ts(now);
    w
}

/// [`drained`]: the reboot's maintenance Running since `ts(0)`.
fn running_drained(attached: Vec<Attached>, now: i64) -> World {
    drained(owned(nm("m", 0, Some(Phase::Running))), attached, now)
}

fn data_volume() -> Attached {
    Attached {
        attachment: "csi-1".into(),
        volume: "pv-1".into(),
        claim: Some("shop/data".into()),
        unique: Some("kubernetes.io/csi/csi.example^pv-1".into()),
    }
}

/// The status's VolumesDetached condition (there must be one).
fn detached_condition(
    st: &NodeMaintenanceStatus,
) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "VolumesDetached")
        .expect("a VolumesDetached condition")
}

fn written(w: &World) -> (NodeMaintenanceStatus, Option<Announce>) {
    match w.decide() {
        Step::WriteStatus {
            status, announce, ..
        } => (*status, announce),
        other => panic!("expected a status write, got {other:?}"),
    }
}

#[test]
fn a_features_drained_maintenance_asks_for_the_volumes_before_it_says_succeeded() {
    let mut w = running_drained(vec![], 10);
    w.volumes = None;
    assert_eq!(w.decide(), Step::ReadVolumes { nm: "m".into() });
    // An administrator's is not held, nor asked about.
    let w = World::new(
        Some(maintained("m", false)),
        vec![nm("m", 0, Some(Phase::Running))],
    );
    assert_eq!(written(&w).0.phase, Some(Phase::Succeeded));
}

#[test]
fn attached_volumes_hold_it_running_with_the_claims_named_and_a_look_again() {
    let w = running_drained(vec![data_volume()], 10);
    let (status, announce) = written(&w);
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(announce, None, "no Succeeded announced");
    assert_eq!(status.drain_progress, Some(100));
    let c = detached_condition(&status);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "VolumesAttached")
    );
    assert!(
        c.message.contains("claim shop/data (volume pv-1)"),
        "{}",
        c.message
    );
    assert_eq!(status.last_error.as_deref(), Some(c.message.as_str()));
    // Written, the same world waits and looks again within 2 s (nothing
    // watched says when an attachment goes), not sooner.
    let mut w = w;
    w.nms[0].status = Some(status);
    let Step::Wait(Some(d)) = w.decide() else {
        panic!("got {:?}", w.decide())
    };
    assert_eq!(d, Duration::from_secs(2));
}

#[test]
fn once_detached_it_says_succeeded_and_so_does_the_condition() {
    let w = running_drained(vec![], 10);
    let (status, announce) = written(&w);
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(announce, Some(Announce::Succeeded));
    let c = detached_condition(&status);
    assert_eq!(c.status, "True");
}

#[test]
fn a_volume_of_a_pod_that_stays_is_not_waited_for() {
    let mut w = running_drained(vec![data_volume()], 10);
    let mut ds = (*pod("shipper", "DaemonSet")).clone();
    ds.metadata.namespace = Some("shop".into());
    ds.spec = Some(crate::api::pod::PodSpec {
        node_name: Some(NODE.into()),
        claims: vec!["data".into()],
        ..Default::default()
    });
    w.pods = vec![Arc::new(ds)];
    assert_eq!(written(&w).0.phase, Some(Phase::Succeeded));
}

#[test]
fn past_the_deadline_force_goes_on_skip_gives_the_node_back_wait_keeps_waiting() {
    let at = |esc: &str| {
        let m = with_drain(owned(nm("m", 0, Some(Phase::Running))), "60", esc);
        drained(m, vec![data_volume()], 61)
    };
    let (forced, announce) = written(&at("Force"));
    assert_eq!(forced.phase, Some(Phase::Succeeded));
    assert_eq!(announce, Some(Announce::Succeeded));
    let reason = |st: &NodeMaintenanceStatus| Some(detached_condition(st).reason.clone());
    assert_eq!(reason(&forced).as_deref(), Some("DetachTimeout"));
    let Step::Fail {
        reason: why,
        message,
        ..
    } = at("Skip").decide()
    else {
        panic!("expected Fail, got {:?}", at("Skip").decide())
    };
    assert_eq!(why, REASON_DRAIN_TIMEOUT);
    assert!(message.contains("claim shop/data"), "{message}");
    let (waiting, _) = written(&at("Wait"));
    assert_eq!(waiting.phase, Some(Phase::Running));
    assert_eq!(reason(&waiting).as_deref(), Some("DetachTimeout"));
}

#[test]
fn before_the_deadline_it_wakes_for_the_deadline_if_that_comes_first() {
    let m = with_drain(owned(nm("m", 0, Some(Phase::Running))), "30", "Skip");
    let mut w = drained(m, vec![data_volume()], 29);
    let (status, _) = written(&w);
    w.nms[0].status = Some(status);
    assert_eq!(w.decide(), Step::Wait(Some(Duration::from_secs(1))));
}

#[test]
fn a_failed_read_waits_saying_why_and_an_unreadable_one_goes_on() {
    let mut w = running_drained(vec![], 10);
    w.volumes = Some(Volumes::Failed(
        "listing VolumeAttachments: timed out".into(),
    ));
    let (status, _) = written(&w);
    assert_eq!(status.phase, Some(Phase::Running));
    assert!(
        status
            .last_error
            .unwrap_or_default()
            .contains("could not be read"),
    );
    w.volumes = Some(Volumes::Unreadable("forbidden".into()));
    let (status, _) = written(&w);
    assert_eq!(status.phase, Some(Phase::Succeeded));
}

#[test]
fn a_succeeded_maintenance_never_goes_back_to_running_for_a_volume() {
    let w = drained(
        owned(nm("m", 0, Some(Phase::Succeeded))),
        vec![data_volume()],
        10,
    );
    assert!(matches!(
        w.decide(),
        Step::Wait(_) | Step::WriteStatus { .. }
    ));
    if let Step::WriteStatus { status, .. } = w.decide() {
        assert_eq!(status.phase, Some(Phase::Succeeded));
    }
}
