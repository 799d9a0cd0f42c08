//! Unit tests of the drain: which pods are evicted, refusals waiting for
//! their backoff, the drain timeout announced once, how often progress is
//! written, and success on an empty node.

use super::*;

#[test]
fn cordoned_node_is_drained_of_evictable_pods_only() {
    let mut w = World::new(
        Some(maintained("m", false)),
        vec![nm("m", 0, Some(Phase::Running))],
    );
    w.pods = vec![pod("a", "ReplicaSet"), pod("ds", "DaemonSet")];
    let Step::Drain { pods, .. } = w.decide() else {
        panic!("expected Drain, got {:?}", w.decide())
    };
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].0.name_any(), "a");
}

#[test]
fn refused_pods_wait_for_their_backoff_and_are_named_in_last_error() {
    let w = World::draining(
        nm("m", 0, Some(Phase::Running)),
        Attempt {
            retry_at: Some(ts(12)),
            error: Some("PodDisruptionBudget web: needs 2".into()),
            refusals: 1,
        },
    );
    let Step::WriteStatus {
        status, announce, ..
    } = w.decide()
    else {
        panic!("got {:?}", w.decide())
    };
    assert_eq!(announce, None);
    assert_eq!(status.phase, Some(Phase::Running));
    let err = status.last_error.unwrap_or_default();
    assert!(
        err.contains("pod ns/a") && err.contains("PodDisruptionBudget web"),
        "{err}"
    );
    assert_eq!(status.drain_progress, Some(50), "1 of 2 eviction pods gone");
}

#[test]
fn waiting_wakes_for_the_next_retry() {
    let mut w = World::draining(
        nm("m", 0, Some(Phase::Running)),
        Attempt {
            retry_at: Some(ts(12)),
            error: None,
            refusals: 1,
        },
    );
    let step = w.decide();
    let Step::WriteStatus { status, .. } = step else {
        panic!("got {step:?}")
    };
    w.nms[0].status = Some(*status);
    assert_eq!(w.decide(), Step::Wait(Some(Duration::from_secs(2))));
}

#[test]
fn a_pod_stuck_terminating_past_its_retry_time_never_asks_for_an_immediate_wake() {
    // Evicted at 0 s with 30 s grace: retry at 60 s. It is still
    // Terminating at 100 s (a finalizer): the node was requeued at 0 ms
    // for ever, a core burnt with no log line.
    let mut w = World::draining(
        nm("m", 0, Some(Phase::Running)),
        Attempt {
            retry_at: Some(ts(60)),
            error: None,
            refusals: 0,
        },
    );
    let mut stuck = (*w.pods[0]).clone();
    stuck.metadata.deletion_timestamp = Some(Time(ts(1)));
    w.pods = vec![Arc::new(stuck)];
    w.now = ts(100);
    for _ in 0..3 {
        match w.decide() {
            Step::WriteStatus { status, .. } => w.nms[0].status = Some(*status),
            Step::Wait(after) => {
                // The drain deadline (30 s after creation) has passed too:
                // nothing is due until the pod goes (a pod event).
                assert!(
                    after.is_none_or(|d| d >= Duration::from_secs(1)),
                    "{after:?}"
                );
                return;
            }
            other => panic!("got {other:?}"),
        }
    }
    panic!("never settled on a wait");
}

#[test]
fn drain_timeout_is_announced_once() {
    let mut w = World::draining(
        nm("m", 0, Some(Phase::Running)),
        Attempt {
            retry_at: Some(ts(99)),
            error: Some("blocked".into()),
            refusals: 3,
        },
    );
    w.now = ts(31);
    let Step::WriteStatus {
        status, announce, ..
    } = w.decide()
    else {
        panic!("got {:?}", w.decide())
    };
    assert!(matches!(announce, Some(Announce::DrainTimeout(_))));
    w.nms[0].status = Some(*status);
    w.now = ts(40);
    assert!(
        matches!(w.decide(), Step::Wait(_)),
        "no second announcement"
    );
}

/// `ms` milliseconds after 10 s: times within one second of `lastUpdate`.
fn at(ms: i64) -> Timestamp {
    ts(10)
        .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(ms))
        .unwrap()
}

#[test]
fn progress_alone_is_written_every_two_seconds_at_most_but_success_at_once() {
    let mut w = World::new(
        Some(maintained("m", false)),
        vec![nm("m", 0, Some(Phase::Running))],
    );
    w.pods = vec![
        pod("a", "ReplicaSet"),
        pod("b", "ReplicaSet"),
        pod("c", "ReplicaSet"),
    ];
    for uid in ["uid-a", "uid-b", "uid-c"] {
        let accepted = Attempt {
            retry_at: Some(ts(60)),
            ..Default::default()
        };
        w.attempts.insert(uid.into(), accepted);
    }
    w.nms[0].status.as_mut().unwrap().eviction_pods = Some(3);
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("got {:?}", w.decide())
    };
    let mut written = *status;
    written.last_update = Some(Time(at(0)));
    w.nms[0].status = Some(written);

    // One pod gone 100 ms after that write: held until two seconds after
    // it (`lastUpdate` is stored in whole seconds).
    w.pods.pop();
    w.now = at(100);
    assert_eq!(w.decide(), Step::Wait(Some(Duration::from_millis(1900))));
    w.now = at(1600);
    assert_eq!(w.decide(), Step::Wait(Some(Duration::from_millis(400))));
    w.now = at(2000);
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("got {:?}", w.decide())
    };
    assert_eq!(status.drain_progress, Some(33));

    // The rest gone right after: Succeeded is written at once.
    let mut written = *status;
    written.last_update = Some(Time(at(2000)));
    w.nms[0].status = Some(written);
    w.pods.clear();
    w.now = at(2010);
    let Step::WriteStatus {
        status, announce, ..
    } = w.decide()
    else {
        panic!("got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(announce, Some(Announce::Succeeded));
}

/// The first status (Begin, after the cordon) already says what the
/// progress after it says but for the counts, so the first pods gone are
/// held like any progress: the next status written is Succeeded.
#[test]
fn the_first_progress_after_begin_is_held_too() {
    let mut m = nm("m", 0, None);
    m.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let mut w = World::new(Some(maintained("m", false)), vec![m]);
    w.pods = vec![pod("a", "ReplicaSet"), pod("b", "ReplicaSet")];
    w.now = at(0);
    let Step::Begin { status, .. } = w.decide() else {
        panic!("expected Begin, got {:?}", w.decide())
    };
    let mut written = *status;
    written.last_update = Some(Time(at(0)));
    w.nms[0].status = Some(written);
    w.node = Some(published(maintained("m", false), &w.nms));
    for uid in ["uid-a", "uid-b"] {
        let accepted = Attempt {
            retry_at: Some(ts(60)),
            ..Default::default()
        };
        w.attempts.insert(uid.into(), accepted);
    }
    w.pods.pop();
    w.now = at(300);
    assert_eq!(
        w.decide(),
        Step::Wait(Some(Duration::from_millis(1700))),
        "one of two pods gone right after Begin: held"
    );
    w.pods.clear();
    w.now = at(400);
    let Step::WriteStatus { status, .. } = w.decide() else {
        panic!("got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
}

#[test]
fn empty_node_succeeds_with_full_progress() {
    let w = World::new(
        Some(maintained("m", false)),
        vec![nm("m", 0, Some(Phase::Running))],
    );
    let Step::WriteStatus {
        status, announce, ..
    } = w.decide()
    else {
        panic!("got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(status.drain_progress, Some(100));
    assert_eq!(announce, Some(Announce::Succeeded));
}

#[test]
fn lifecycle_conditions_are_published_before_the_drain_and_withdrawn_before_the_uncordon() {
    // The node carries the maintenance but not yet its conditions: they
    // come first, then the drain.
    let mut w = World::draining(nm("m", 0, Some(Phase::Running)), Attempt::default());
    if let Some(status) = w.node.as_mut().and_then(|n| n.status.as_mut()) {
        status.conditions = None;
    }
    let Step::SetConditions { patch } = w.decide() else {
        panic!("conditions first, got {:?}", w.decide());
    };
    // A refused write holds nothing up: while paused, the drain goes on.
    w.conditions_paused = true;
    assert!(matches!(w.decide(), Step::Drain { .. }));
    w.conditions_paused = false;
    apply_conditions(w.node.as_mut().expect("node"), &patch);
    assert!(matches!(w.decide(), Step::Drain { .. }));

    // Deleted: what we published goes False while the node is still
    // cordoned, once; then the node is given back.
    w.nms = vec![deleting(nm("m", 0, Some(Phase::Running)))];
    let Step::SetConditions { patch } = w.decide() else {
        panic!("withdrawn first, got {:?}", w.decide());
    };
    let statuses: Vec<&str> = patch["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["status"].as_str())
        .collect();
    assert_eq!(
        statuses,
        ["False", "False"],
        "MaintenanceInProgress and DrainInProgress"
    );
    apply_conditions(w.node.as_mut().expect("node"), &patch);
    assert_eq!(
        w.decide(),
        Step::RemoveFromNode {
            nm: "m".into(),
            uncordon: true
        }
    );
}
