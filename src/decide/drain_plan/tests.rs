//! One drain's plan: kubectl's filters before the rules, tiers in order,
//! WaitCompleted ending at completion, Force past the deadline on the tier
//! draining now, and nothing out of order while a placement is undecided.

use super::*;
use crate::api::pod::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A running ReplicaSet pod `app=<app>` (the maintenance tests' pod).
fn pod(name: &str, app: &str) -> Arc<Pod> {
    let base = crate::decide::maintenance::tests_support::pod(name, "ReplicaSet");
    with(&base, |p| {
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into())
    })
}

fn with(p: &Arc<Pod>, change: impl FnOnce(&mut Pod)) -> Arc<Pod> {
    let mut p = (**p).clone();
    change(&mut p);
    Arc::new(p)
}

fn rule(name: &str, app: &str, behavior: Behavior, order: Option<i32>) -> Arc<DrainRule> {
    Arc::new(crate::decide::drain_rules::tests::app_rule(
        name, app, behavior, order,
    ))
}

fn book(rules: Vec<Arc<DrainRule>>) -> RuleBook {
    RuleBook {
        rules,
        namespaces: HashMap::new(),
    }
}

/// Pod name → its fate's kind, for short assertions.
fn kinds(planned: &[Planned]) -> Vec<(String, &'static str)> {
    planned
        .iter()
        .map(|p| {
            let kind = match &p.fate {
                Fate::Evict => "evict",
                Fate::Delete(_) => "delete",
                Fate::Terminating => "terminating",
                Fate::Held(_) => "held",
                Fate::Skip(_) => "skip",
            };
            (p.pod.metadata.name.clone().unwrap_or_default(), kind)
        })
        .collect()
}

fn run(pods: &[Arc<Pod>], book: &RuleBook, force: bool) -> Vec<(String, &'static str)> {
    kinds(&plan(
        pods,
        &BTreeMap::new(),
        book,
        Drain {
            force,
            ..Drain::default()
        },
    ))
}

fn named(pairs: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
    pairs.iter().map(|(n, k)| (n.to_string(), *k)).collect()
}

/// Without rules the plan is kubectl drain's, as before DrainRules.
#[test]
fn without_rules_every_pod_is_one_tier() {
    let pods = [pod("a", "web"), pod("b", "db")];
    assert_eq!(
        run(&pods, &book(vec![]), false),
        named(&[("a", "evict"), ("b", "evict")])
    );
    assert_eq!(
        run(&pods, &book(vec![]), true),
        named(&[("a", "delete"), ("b", "delete")])
    );
}

/// Only the lowest order still present is evicted; the next starts when
/// those are gone — a terminating pod of the lower tier still holds it.
#[test]
fn tiers_drain_lowest_order_first() {
    let rules = book(vec![
        rule("late", "db", Behavior::Drain, Some(10)),
        rule("early", "web", Behavior::Drain, Some(-1)),
    ]);
    let web = pod("w", "web");
    let db = pod("d", "db");
    let other = pod("o", "other");
    assert_eq!(
        run(&[web.clone(), db.clone(), other.clone()], &rules, false),
        named(&[("w", "evict"), ("d", "held"), ("o", "held")])
    );
    let leaving = with(&web, |p| {
        p.metadata.deletion_timestamp = Some(Time(Default::default()))
    });
    assert_eq!(
        run(&[leaving, db.clone(), other.clone()], &rules, false),
        named(&[("w", "terminating"), ("d", "held"), ("o", "held")])
    );
    assert_eq!(
        run(&[db.clone(), other], &rules, false),
        named(&[("d", "held"), ("o", "evict")])
    );
    assert_eq!(run(&[db], &rules, false), named(&[("d", "evict")]));
}

/// WaitCompleted pods are never evicted and hold later tiers until they
/// finish; a finished one is done waiting even while it is still there.
#[test]
fn wait_completed_ends_at_completion() {
    let rules = book(vec![
        rule("batch", "batch", Behavior::WaitCompleted, None),
        rule("late", "db", Behavior::Drain, Some(5)),
    ]);
    let job = pod("j", "batch");
    let db = pod("d", "db");
    assert_eq!(
        run(&[job.clone(), db.clone()], &rules, false),
        named(&[("j", "held"), ("d", "held")])
    );
    let done = with(&job, |p| {
        p.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        })
    });
    assert_eq!(
        run(&[done, db.clone()], &rules, false),
        named(&[("j", "skip"), ("d", "evict")])
    );
    let failed = with(&job, |p| {
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        })
    });
    assert_eq!(run(&[failed], &rules, false), named(&[("j", "skip")]));
}

/// Past the deadline, Force deletes the tier draining now, WaitCompleted
/// pods included; later tiers still wait their turn.
#[test]
fn force_deletes_the_tier_draining_now() {
    let rules = book(vec![
        rule("batch", "batch", Behavior::WaitCompleted, None),
        rule("late", "db", Behavior::Drain, Some(5)),
    ]);
    let planned = plan(
        &[pod("j", "batch"), pod("w", "web"), pod("d", "db")],
        &BTreeMap::new(),
        &rules,
        Drain {
            force: true,
            ..Drain::default()
        },
    );
    assert_eq!(
        kinds(&planned),
        named(&[("j", "delete"), ("w", "delete"), ("d", "held")])
    );
    assert_eq!(planned[0].fate, Fate::Delete(FORCED_WAITING));
}

/// kubectl's filters and the drain's pod selector decide before any rule:
/// a DaemonSet pod stays whatever a rule says, and so does a pod the
/// selector leaves out.
#[test]
fn kubectl_filters_and_the_pod_selector_come_first() {
    let rules = book(vec![rule("all-web", "web", Behavior::Drain, Some(1))]);
    let ds = with(&pod("ds", "web"), |p| {
        if let Some(o) = p.metadata.owner_references.as_mut() {
            o[0].kind = "DaemonSet".into();
        }
    });
    let sel = LabelSelector {
        match_labels: Some([("app".to_string(), "db".to_string())].into()),
        ..Default::default()
    };
    let planned = plan(
        &[ds, pod("w", "web"), pod("d", "db")],
        &BTreeMap::new(),
        &rules,
        Drain {
            pod_selector: Some(&sel),
            ..Drain::default()
        },
    );
    assert_eq!(
        kinds(&planned),
        named(&[("ds", "skip"), ("w", "skip"), ("d", "evict")])
    );
    assert_eq!(planned[0].placement, None);
}

/// A Skip rule leaves its pods and says which rule did.
#[test]
fn skip_rules_name_themselves() {
    let rules = book(vec![rule("keep-db", "db", Behavior::Skip, None)]);
    let planned = plan(
        &[pod("d", "db")],
        &BTreeMap::new(),
        &rules,
        Drain::default(),
    );
    assert_eq!(
        planned[0].fate,
        Fate::Skip("DrainRule keep-db: Skip".into())
    );
}

/// While one pod's placement waits for its namespace's labels, no tier is
/// evicted (it might be the lowest); once they are known the plan goes on.
#[test]
fn nothing_is_evicted_out_of_order_while_a_placement_is_undecided() {
    let mut by_ns = (*rule("team", "db", Behavior::Drain, Some(-5))).clone();
    if let Some(pods) = by_ns.spec.pods.as_mut() {
        pods[0].namespace_selector = Some(LabelSelector {
            match_labels: Some([("team".to_string(), "data".to_string())].into()),
            ..Default::default()
        });
    }
    let mut rules = book(vec![Arc::new(by_ns)]);
    let pods = [pod("d", "db"), pod("w", "web")];
    assert_eq!(
        run(&pods, &rules, false),
        named(&[("d", "held"), ("w", "held")])
    );
    rules.namespaces.insert(
        "ns".into(),
        [("team".to_string(), "data".to_string())].into(),
    );
    assert_eq!(
        run(&pods, &rules, false),
        named(&[("d", "evict"), ("w", "held")])
    );
}

/// A pod Karpenter's `karpenter.sh/do-not-disrupt` holds is waited for,
/// never evicted, with why; past the deadline `Force` deletes it as it
/// deletes a blocked pod. A duration that has ended holds nothing.
#[test]
fn do_not_disrupt_pods_are_held_until_the_escalation() {
    let opted = |value: &str| {
        with(&pod("k", "web"), |p| {
            p.metadata.annotations.get_or_insert_default().insert(
                crate::decide::do_not_disrupt::ANNOTATION.into(),
                value.into(),
            );
        })
    };
    let pods = [opted("true"), pod("w", "web")];
    assert_eq!(
        run(&pods, &book(vec![]), false),
        named(&[("k", "held"), ("w", "evict")])
    );
    let planned = plan(&pods, &BTreeMap::new(), &book(vec![]), Drain::default());
    assert_eq!(
        planned[0].fate,
        Fate::Held("karpenter.sh/do-not-disrupt=true".into())
    );
    let forced = plan(
        &pods,
        &BTreeMap::new(),
        &book(vec![]),
        Drain {
            force: true,
            ..Drain::default()
        },
    );
    assert_eq!(forced[0].fate, Fate::Delete(FORCED_OPTED_OUT));
    // Started at the epoch (the test pods' start time is unset: a
    // duration then holds, as in Karpenter); one that started long ago
    // and has ended holds nothing.
    let ended = with(&opted("1h"), |p| {
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            start_time: Some(Time(Timestamp::UNIX_EPOCH)),
        })
    });
    let how = Drain {
        now: "2026-11-29T12:00:00Z".parse().expect("time"),
        ..Drain::default()
    };
    assert_eq!(
        plan(&[ended], &BTreeMap::new(), &book(vec![]), how)[0].fate,
        Fate::Evict
    );
    assert_eq!(
        run(&[opted("1h")], &book(vec![]), false),
        named(&[("k", "held")])
    );
}

/// A node holding only pods kubectl's filters decide (DaemonSet, mirror)
/// needs no rule read; one pod a rule could place does, a finished one
/// too (kubectl deletes it; a Skip rule keeps it).
#[test]
fn rules_are_read_only_where_a_rule_could_place_a_pod() {
    use crate::decide::maintenance::tests_support::pod as owned;
    let daemon = owned("ds", "DaemonSet");
    let mirror = with(&owned("static", "Node"), |p| {
        p.metadata.annotations =
            Some([(drain::MIRROR_ANNOTATION.to_string(), "x".to_string())].into())
    });
    let finished = with(&pod("done", "batch"), |p| {
        if let Some(s) = p.status.as_mut() {
            s.phase = Some("Succeeded".into());
        }
    });
    assert!(!rules_can_apply(&[]));
    assert!(!rules_can_apply(&[daemon.clone(), mirror.clone()]));
    assert!(rules_can_apply(&[daemon.clone(), mirror.clone(), finished]));
    assert!(rules_can_apply(&[daemon, mirror, pod("a", "web")]));
}
