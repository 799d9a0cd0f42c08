//! Unit tests of the rollout helpers every feature shares: the own node,
//! holds and their look-again, settling past the health gate, news of a
//! command that cannot run.

use super::*;
use crate::api::common::HealthGate;

fn at(secs: i64) -> Timestamp {
    after(Timestamp::UNIX_EPOCH, secs)
}

fn verdict(
    gates: &Gates,
    now: i64,
    reason: Option<&str>,
    given_back: bool,
) -> (Settled, Option<String>, Option<Timestamp>) {
    settle(&Settling {
        gates,
        node: &Node::default(),
        health: Some(&Health::Unknown("the list failed".into())),
        alerts: None,
        now: at(now),
        since: at(0),
        reason,
        given_back,
        done: "reboot verified",
    })
}

#[test]
fn a_pinned_cluster_role_whose_pod_a_drain_evicts_gives_its_node_to_reboots_only() {
    let evicted = || OwnNode::Evicted("evicted".into());
    assert_eq!(
        own_node_hold(evicted(), true, |_| {}),
        None,
        "a reboot: its agent gives it back"
    );
    assert_eq!(
        own_node_hold(evicted(), false, |_| {}),
        Some((WAIT_OWN_NODE, "evicted".to_string())),
        "an upgrade waits, saying why"
    );
    for feature_gives_back in [true, false] {
        assert_eq!(
            own_node_hold(OwnNode::Free, feature_gives_back, |_| {}),
            None
        );
        assert_eq!(
            own_node_hold(OwnNode::Held("held".into()), feature_gives_back, |_| {}),
            Some((WAIT_OWN_NODE, "held".to_string()))
        );
    }
}

/// What no watch tells (a replica started elsewhere, a pod's opt-out
/// taken off) is looked at again within LOOK_AGAIN; a duration's end
/// sooner.
#[test]
fn holds_no_watch_ends_are_looked_at_again() {
    let mut again = None;
    own_node_hold(OwnNode::Held("held".into()), true, |d| again = Some(d));
    assert_eq!(again, Some(LOOK_AGAIN));
    let mut again = None;
    own_node_hold(OwnNode::Free, true, |d| again = Some(d));
    assert_eq!(again, None, "nothing to look at");
    let opted_out = |value: &str| {
        vec![crate::decide::do_not_disrupt::tests::opted_out_pod(
            "db-0",
            "n",
            value,
            "Running",
            Some(at(0)),
        )]
    };
    let mut again = None;
    pods_hold(Some(opted_out("true")), at(0), |d| again = Some(d));
    assert_eq!(again, Some(LOOK_AGAIN));
    let mut again = None;
    pods_hold(Some(opted_out("10s")), at(0), |d| again = Some(d));
    assert_eq!(again, Some(Duration::from_secs(10)));
    let mut again = None;
    pods_hold(None, at(0), |d| again = Some(d));
    assert_eq!(again, Some(LOOK_AGAIN), "pods unread");
}

#[test]
fn a_node_settles_its_seconds_out_without_a_status_write() {
    let gates = Gates {
        settle_seconds: 30,
        ..Gates::default()
    };
    // A second more than asked: `since` is kept to the second.
    assert_eq!(
        verdict(&gates, 10, None, true),
        (Settled::Unchanged, None, Some(at(31)))
    );
    assert_eq!(
        verdict(&gates, 31, None, true),
        (Settled::Done(None, "reboot verified".into()), None, None)
    );
    // Not given back yet: it stays, whatever the clock says.
    assert_eq!(verdict(&gates, 40, None, false).0, Settled::Unchanged);
}

#[test]
fn past_the_health_timeout_a_node_keeps_its_slot_and_says_so_once() {
    let gates = Gates {
        health: Some(HealthGate {
            timeout_seconds: 60,
            on_timeout: "Pause".into(),
            ..HealthGate::default()
        }),
        ..Gates::default()
    };
    let (waiting, warn, wake) = verdict(&gates, 10, None, true);
    assert!(
        matches!(&waiting, Settled::Settling(None, m) if m.starts_with("reboot verified; waiting for health:")),
        "{waiting:?}"
    );
    assert_eq!((warn, wake), (None, Some(at(60))));
    let (held, warn, _) = verdict(&gates, 61, None, true);
    let Settled::Settling(Some(health::HEALTH_TIMEOUT), msg) = held else {
        panic!("{held:?}");
    };
    assert!(
        msg.starts_with("reboot verified; not healthy within 60 s"),
        "{msg}"
    );
    assert_eq!(warn, Some(msg), "said the first time");
    let (_, again, _) = verdict(&gates, 90, Some(health::HEALTH_TIMEOUT), true);
    assert_eq!(again, None, "not said again");
}

#[test]
fn on_timeout_continue_lets_a_given_back_node_go() {
    let gates = Gates {
        health: Some(HealthGate {
            timeout_seconds: 60,
            on_timeout: "Continue".into(),
            ..HealthGate::default()
        }),
        ..Gates::default()
    };
    let (done, warn, _) = verdict(&gates, 61, None, true);
    assert!(
        matches!(done, Settled::Done(Some(health::HEALTH_TIMEOUT), _)),
        "{done:?}"
    );
    assert!(warn.is_some());
    // Still held by its NodeMaintenance: the slot stays until it goes.
    let (held, _, _) = verdict(&gates, 61, None, false);
    assert!(matches!(held, Settled::Settling(Some(_), _)), "{held:?}");
}

#[test]
fn a_command_that_cannot_run_is_news_once() {
    let cannot = |why: &str| format!("cannot: {why}");
    let no = || Check::NotRunnable("no systemctl".into());
    assert_eq!(agent_wait(Check::Runnable, None, "asking", cannot), None);
    let asking = agent_wait(Check::Unchecked, None, "asking", cannot);
    assert_eq!(
        asking.map(|w| (w.reason, w.news)),
        Some((WAIT_AGENT_CHECK, false))
    );
    let found = agent_wait(no(), Some(WAIT_AGENT_CHECK), "asking", cannot);
    assert_eq!(
        found,
        Some(AgentWait {
            reason: WAIT_COMMAND,
            message: "cannot: no systemctl".into(),
            news: true
        })
    );
    let still = agent_wait(no(), Some(WAIT_COMMAND), "asking", cannot);
    assert_eq!(still.map(|w| w.news), Some(false));
}
