//! The placement of pods by DrainRules and labels, and the tier that
//! drains, against Cluster API's MachineDrainRule semantics.

use super::*;
use crate::api::drain_rule::{DrainRuleDrain, DrainRuleNodes, DrainRulePods, DrainRuleSpec};
use kube::api::ObjectMeta;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(pairs)),
        ..Default::default()
    }
}

/// A rule for every pod on every node (its `pods` set by the test).
fn rule(name: &str, behavior: Behavior, order: Option<i32>) -> DrainRule {
    DrainRule {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: DrainRuleSpec {
            drain: DrainRuleDrain { behavior, order },
            nodes: None,
            pods: None,
        },
    }
}

/// A rule for the pods labelled `app=<app>`, on every node: the builder the
/// plan's tests and the random worlds share.
pub(crate) fn app_rule(name: &str, app: &str, behavior: Behavior, order: Option<i32>) -> DrainRule {
    pods(
        rule(name, behavior, order),
        vec![term(Some(&[("app", app)]), None)],
    )
}

fn pods(mut r: DrainRule, terms: Vec<DrainRulePods>) -> DrainRule {
    r.spec.pods = Some(terms);
    r
}

fn term(pod: Option<&[(&str, &str)]>, ns: Option<&[(&str, &str)]>) -> DrainRulePods {
    DrainRulePods {
        selector: pod.map(selector),
        namespace_selector: ns.map(selector),
    }
}

fn pod(pairs: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            labels: Some(labels(pairs)),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn place(rules: &[DrainRule], p: &Pod) -> Placement {
    let rules: Vec<Arc<DrainRule>> = rules.iter().cloned().map(Arc::new).collect();
    let on = NodeRules::on(&rules, &BTreeMap::new());
    on.place(p, Some(&BTreeMap::new()))
        .unwrap_or_else(|u| panic!("undecided: {u:?}"))
}

#[test]
fn no_rule_drains_at_order_zero() {
    assert_eq!(place(&[], &pod(&[])), Placement::DEFAULT);
}

/// Rules are tried in alphabetical order of name, whatever order the
/// store lists them in; the first that selects the pod wins.
#[test]
fn the_first_rule_by_name_that_selects_the_pod_wins() {
    let web = &[("app", "web")][..];
    let rules = [
        pods(
            rule("b-skip", Behavior::Skip, None),
            vec![term(Some(web), None)],
        ),
        pods(
            rule("c-late", Behavior::Drain, Some(10)),
            vec![term(None, None)],
        ),
        pods(
            rule("a-db", Behavior::WaitCompleted, None),
            vec![term(Some(&[("app", "db")]), None)],
        ),
    ];
    let p = place(&rules, &pod(web));
    assert_eq!(
        (p.behavior, p.by),
        (Behavior::Skip, By::Rule("b-skip".into()))
    );
    let p = place(&rules, &pod(&[("app", "other")]));
    assert_eq!((p.behavior, p.order), (Behavior::Drain, 10));
    let p = place(&rules, &pod(&[("app", "db")]));
    assert_eq!((p.behavior, p.order), (Behavior::WaitCompleted, 0));
}

/// A pod label beats every rule, ours before Cluster API's, in any case
/// and with Cluster API's spelling; another value leaves it to the rules.
#[test]
fn pod_labels_beat_every_rule() {
    let rules = [rule("all", Behavior::Drain, Some(5))];
    for (key, value, want) in [
        (DRAIN_LABEL, "skip", Behavior::Skip),
        (DRAIN_LABEL, "Skip", Behavior::Skip),
        (DRAIN_LABEL, "wait-completed", Behavior::WaitCompleted),
        (CAPI_DRAIN_LABEL, "wait-completed", Behavior::WaitCompleted),
        (CAPI_DRAIN_LABEL, "WaitCompleted", Behavior::WaitCompleted),
        (CAPI_DRAIN_LABEL, "skip", Behavior::Skip),
    ] {
        let p = place(&rules, &pod(&[(key, value)]));
        assert_eq!(
            (p.behavior, p.order, &p.by),
            (want, 0, &By::Label(key)),
            "{key}={value}"
        );
    }
    let both = pod(&[(DRAIN_LABEL, "skip"), (CAPI_DRAIN_LABEL, "wait-completed")]);
    assert_eq!(place(&rules, &both).by, By::Label(DRAIN_LABEL));
    let unknown = pod(&[(DRAIN_LABEL, "never")]);
    assert_eq!(place(&rules, &unknown).by, By::Rule("all".into()));
}

/// Within one entry of pods, selector and namespaceSelector are ANDed;
/// entries are ORed.
#[test]
fn pod_entries_are_ored_and_their_selectors_anded() {
    let rules = [pods(
        rule("prom", Behavior::Skip, None),
        vec![
            term(Some(&[("app", "prometheus")]), Some(&[("team", "mon")])),
            term(Some(&[("app", "logging")]), None),
        ],
    )];
    let rules: Vec<Arc<DrainRule>> = rules.into_iter().map(Arc::new).collect();
    let on = NodeRules::on(&rules, &BTreeMap::new());
    let mon = labels(&[("team", "mon")]);
    let other = labels(&[("team", "web")]);
    let prom = pod(&[("app", "prometheus")]);
    assert_eq!(
        on.place(&prom, Some(&mon)).map(|p| p.behavior),
        Ok(Behavior::Skip)
    );
    assert_eq!(
        on.place(&prom, Some(&other)).map(|p| p.behavior),
        Ok(Behavior::Drain)
    );
    let logging = pod(&[("app", "logging")]);
    assert_eq!(
        on.place(&logging, Some(&other)).map(|p| p.behavior),
        Ok(Behavior::Skip)
    );
    assert!(on.need_namespaces());
}

/// A pod whose rule depends on namespace labels not known yet is held
/// undecided, never placed by a later rule or the default; a rule that
/// cannot select it by its own labels does not hold it.
#[test]
fn unknown_namespace_labels_hold_only_pods_a_rule_might_select() {
    let rules = [
        pods(
            rule("a", Behavior::Skip, None),
            vec![term(Some(&[("app", "db")]), Some(&[("team", "data")]))],
        ),
        rule("b", Behavior::Drain, Some(3)),
    ];
    let rules: Vec<Arc<DrainRule>> = rules.into_iter().map(Arc::new).collect();
    let on = NodeRules::on(&rules, &BTreeMap::new());
    assert_eq!(
        on.place(&pod(&[("app", "db")]), None),
        Err(Undecided {
            namespace: "ns".into()
        })
    );
    assert_eq!(
        on.place(&pod(&[("app", "web")]), None).map(|p| p.order),
        Ok(3)
    );
    // A label decides before any namespace is needed.
    assert!(
        on.place(&pod(&[("app", "db"), (DRAIN_LABEL, "skip")]), None)
            .is_ok()
    );
}

/// `nodes` entries are ORed node selectors; a rule without them applies
/// on every node.
#[test]
fn rules_apply_on_the_nodes_they_select() {
    let mut gpu = rule("gpu", Behavior::Skip, None);
    gpu.spec.nodes = Some(vec![
        DrainRuleNodes {
            selector: Some(selector(&[("gpu", "true")])),
        },
        DrainRuleNodes {
            selector: Some(selector(&[("pool", "ml")])),
        },
    ]);
    let rules = vec![
        Arc::new(gpu),
        Arc::new(rule("all", Behavior::Drain, Some(1))),
    ];
    let names = |node: &[(&str, &str)]| -> Vec<String> {
        NodeRules::on(&rules, &labels(node))
            .rules
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .collect()
    };
    assert_eq!(names(&[("gpu", "true")]), ["all", "gpu"]);
    assert_eq!(names(&[("pool", "ml")]), ["all", "gpu"]);
    assert_eq!(names(&[("pool", "web")]), ["all"]);
}

/// An order stored with Skip or WaitCompleted (before the schema refused
/// it) is not a tier: WaitCompleted is order 0.
#[test]
fn only_drain_has_an_order() {
    let p = place(&[rule("w", Behavior::WaitCompleted, Some(7))], &pod(&[]));
    assert_eq!(p.order, 0);
}

/// The lowest order still waited for drains; Skip is never waited for;
/// WaitCompleted pods at 0 hold higher tiers, as in Cluster API; negative
/// orders go before the default.
#[test]
fn the_lowest_order_still_waited_for_drains() {
    let at = |behavior, order| Placement {
        behavior,
        order,
        by: By::Default,
    };
    assert_eq!(current_tier(&[]), None);
    assert_eq!(current_tier(&[at(Behavior::Skip, -5)]), None);
    let waiting = [
        at(Behavior::Drain, 10),
        at(Behavior::WaitCompleted, 0),
        at(Behavior::Skip, -5),
    ];
    assert_eq!(current_tier(&waiting), Some(0));
    assert_eq!(
        current_tier(&[at(Behavior::Drain, 10), at(Behavior::Drain, -1)]),
        Some(-1)
    );
}
