//! Unit tests of what features rely on: an administrator's maintenance
//! preempts a feature's, per-object drain options and their escalations,
//! and the effects a step plans (status once, events, the lease follow-up).

use super::*;

pub(super) fn owned(mut m: NodeMaintenance) -> NodeMaintenance {
    m.metadata.labels = Some([(OWNER_LABEL.to_string(), "RebootPolicy".to_string())].into());
    m
}

pub(super) fn with_drain(
    mut m: NodeMaintenance,
    timeout: &str,
    on_timeout: &str,
) -> NodeMaintenance {
    m.metadata.annotations = Some(
        [
            (DRAIN_TIMEOUT_ANNOTATION.to_string(), timeout.to_string()),
            (
                DRAIN_ON_TIMEOUT_ANNOTATION.to_string(),
                on_timeout.to_string(),
            ),
        ]
        .into(),
    );
    m
}

/// A node in maintenance `m` whose one pod's eviction has been refused
/// since the cordon at `ts(0)`; `now` is `ts(now)`.
fn blocked(m: NodeMaintenance, now: i64) -> World {
    let mut w = World::draining(
        m,
        Attempt {
            retry_at: Some(ts(now + 5)),
            error: Some("PDB db allows no disruption".into()),
            refusals: 3,
        },
    );
    w.now = ts(now);
    w
}

#[test]
fn an_administrators_maintenance_preempts_one_a_feature_holds_the_node_with() {
    let w = World::new(
        Some(maintained("reboot", false)),
        vec![
            owned(nm("reboot", 0, Some(Phase::Running))),
            nm("admin", 5, None),
        ],
    );
    let Step::Fail {
        nm: failed,
        reason,
        message,
    } = w.decide()
    else {
        panic!("{:?}", w.decide())
    };
    assert_eq!((failed.as_str(), reason), ("reboot", REASON_PREEMPTED));
    assert!(
        message.contains("preempted by NodeMaintenance admin"),
        "{message}"
    );
    // An administrator's maintenance is never preempted by a feature's.
    let w = World::new(
        Some(maintained("admin", false)),
        vec![
            nm("admin", 0, Some(Phase::Running)),
            owned(nm("reboot", 5, None)),
        ],
    );
    assert!(
        matches!(w.decide(), Step::Fail { nm, reason: REASON_DUPLICATE, .. } if nm == "reboot")
    );
}

#[test]
fn the_owners_drain_timeout_applies_and_wait_keeps_draining() {
    let m = with_drain(nm("m", 0, Some(Phase::Running)), "10", "Wait");
    // The agent's default is 30 s; the owner's 10 s has passed at 12 s.
    let Step::WriteStatus {
        status, announce, ..
    } = blocked(m, 12).decide()
    else {
        panic!("expected a status write")
    };
    assert!(
        matches!(announce, Some(Announce::DrainTimeout(ref msg)) if msg.contains("within 10 s"))
    );
    assert_eq!(status.phase, Some(Phase::Running));
}

#[test]
fn force_deletes_what_eviction_could_not_move_after_the_deadline() {
    let m = with_drain(nm("m", 0, Some(Phase::Running)), "10", "Force");
    let mut w = blocked(m, 12);
    w.attempts.clear();
    let Step::Drain { pods, .. } = w.decide() else {
        panic!("{:?}", w.decide())
    };
    assert!(matches!(pods[0].1, Fate::Delete(_)), "{pods:?}");
    // Before the deadline it is an eviction, as always.
    let m = with_drain(nm("m", 0, Some(Phase::Running)), "10", "Force");
    let mut w = blocked(m, 5);
    w.attempts.clear();
    assert!(matches!(w.decide(), Step::Drain { pods, .. } if pods[0].1 == Fate::Evict));
}

#[test]
fn skip_fails_the_maintenance_so_the_node_is_given_back() {
    let m = with_drain(nm("m", 0, Some(Phase::Running)), "10", "Skip");
    let Step::Fail {
        reason, message, ..
    } = blocked(m, 12).decide()
    else {
        panic!("expected a failure")
    };
    assert_eq!(reason, REASON_DRAIN_TIMEOUT);
    assert!(
        message.contains("skipped") && message.contains("PDB db"),
        "{message}"
    );
}

#[test]
fn the_owners_grace_period_and_pod_selector_shape_the_drain() {
    let mut m = nm("m", 0, Some(Phase::Running));
    m.metadata.annotations = Some(
        [
            (DRAIN_GRACE_ANNOTATION.to_string(), "45".to_string()),
            (
                DRAIN_POD_SELECTOR_ANNOTATION.to_string(),
                r#"{"matchLabels":{"app":"web"}}"#.to_string(),
            ),
        ]
        .into(),
    );
    let mut w = World::draining(m, Attempt::default());
    w.attempts.clear();
    let mut web = (*pod("web-1", "ReplicaSet")).clone();
    web.metadata.uid = Some("uid-web".into());
    web.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    w.pods.push(Arc::new(web));
    let Step::Drain {
        pods, grace_period, ..
    } = w.decide()
    else {
        panic!("{:?}", w.decide())
    };
    assert_eq!(grace_period, Some(45));
    let names: Vec<String> = pods.iter().map(|(p, _)| p.name_any()).collect();
    assert_eq!(names, ["web-1"], "the unselected pod stays");
    let plan = plan(&w.snapshot(), w.decide());
    assert!(matches!(
        plan.effects.as_slice(),
        [Effect::Drain {
            grace_period: Some(45),
            ..
        }]
    ));
}

#[test]
fn bad_drain_options_fail_with_the_annotation_named() {
    for (key, value) in [
        (DRAIN_GRACE_ANNOTATION, "-1"),
        (DRAIN_GRACE_ANNOTATION, "soon"),
        (DRAIN_POD_SELECTOR_ANNOTATION, "app=web"),
    ] {
        let mut m = nm("m", 0, None);
        m.metadata.annotations = Some([(key.to_string(), value.to_string())].into());
        let Step::Fail { message, .. } = World::new(Some(node()), vec![m]).decide() else {
            panic!("{key}={value}")
        };
        assert!(message.contains(key), "{message}");
    }
    for (t, e) in [("0", "Wait"), ("soon", "Wait"), ("10", "force")] {
        let m = with_drain(nm("m", 0, None), t, e);
        let Step::Fail {
            reason, message, ..
        } = World::new(Some(node()), vec![m]).decide()
        else {
            panic!("{t} {e}")
        };
        assert_eq!(reason, REASON_INVALID_OPTIONS);
        assert!(
            message.starts_with("invalid annotation nodekeeper.io/drain-"),
            "{message}"
        );
    }
}

#[test]
fn a_failure_plan_writes_status_once_and_warns_with_an_event() {
    let w = World::new(None, vec![nm("m", 0, None)]);
    let snapshot = w.snapshot();
    let p = plan(&snapshot, decide(&snapshot));
    let [
        Effect::WriteStatus { status, .. },
        Effect::Event {
            warning: true,
            reason,
            ..
        },
    ] = p.effects.as_slice()
    else {
        panic!("{p:?}")
    };
    assert_eq!(*reason, "FailedMaintenance");
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(status.last_update, Some(Time(ts(10))));
    assert!(matches!(p.then, Then::Again));
}

#[test]
fn a_lease_held_elsewhere_is_counted_then_fails_after_three() {
    let step = Step::AcquireLease { nm: "m".into() };
    let refused = Outcome::LeaseHeldBy("someone".into());
    let mut m = nm("m", 0, Some(Phase::Running));
    let w = World::new(Some(node()), vec![m.clone()]);
    let Some(p) = after(&w.snapshot(), &step, &refused) else {
        panic!("no follow-up")
    };
    let [Effect::WriteStatus { status, .. }] = p.effects.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(status.error_on_lease_count, Some(1));
    assert!(matches!(p.then, Then::Wait(Some(d)) if d == LEASE_RETRY));

    if let Some(st) = m.status.as_mut() {
        st.error_on_lease_count = Some(3);
    }
    let w = World::new(Some(node()), vec![m]);
    let Some(p) = after(&w.snapshot(), &step, &refused) else {
        panic!("no follow-up")
    };
    let [
        Effect::WriteStatus { status, .. },
        Effect::Event { reason, .. },
    ] = p.effects.as_slice()
    else {
        panic!("{p:?}")
    };
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(*reason, "FailedMaintenance");
    // Any other outcome needs no follow-up.
    assert!(after(&w.snapshot(), &step, &Outcome::Done).is_none());
}

#[test]
fn a_status_write_clears_what_the_new_status_drops_whoever_wrote_it() {
    // A blocker an earlier write (ours, an older version's, a user's) left.
    let mut m = nm("m", 0, Some(Phase::Running));
    if let Some(st) = m.status.as_mut() {
        st.last_error = Some("pod ns/a: PDB db allows no disruption".into());
    }
    let w = World::new(Some(maintained("m", false)), vec![m]);
    // The pod is gone: the drain is done and nothing blocks any more.
    let snapshot = w.snapshot();
    let p = plan(&snapshot, decide(&snapshot));
    let [Effect::WriteStatus { status, clear, .. }, ..] = p.effects.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(status.last_error, None);
    assert_eq!(clear, &["lastError".to_string()]);
}
