//! What a policy's settings do beyond admission order: invalid zones,
//! percent and zone budgets, drain settings, deleted policies.

use super::*;

#[test]
fn an_unknown_time_zone_is_reported_and_admits_nothing() {
    let mut p = policy(1);
    p.spec.windows = vec![Window {
        days: vec![],
        start: "01:00".into(),
        end: "02:00".into(),
        time_zone: "Mars/Olympus".into(),
        ..Default::default()
    }];
    let plan = World::new(p, vec![node("a", "b0")]).plan();
    assert!(created(&plan).is_empty());
    let st = status_of(&plan);
    let valid = st.conditions.iter().flatten().find(|c| c.type_ == "Valid");
    assert!(valid.is_some_and(|c| c.status == "False" && c.message.contains("Mars/Olympus")));
}

#[test]
fn percent_and_zone_budgets_apply_to_the_selection() {
    let mut p = policy(0);
    p.spec.budget.max_unavailable = IntOrString::String("50%".into());
    p.spec.budget.per_topology = vec![crate::api::common::TopologyBudget {
        key: "zone".into(),
        max_unavailable: IntOrString::Int(1),
    }];
    let zoned = |n: &str, z: &str| {
        let mut x = node(n, "b0");
        x.metadata.labels = Some([("zone".to_string(), z.to_string())].into());
        x
    };
    let plan = World::new(
        p,
        vec![
            zoned("a1", "a"),
            zoned("a2", "a"),
            zoned("b1", "b"),
            zoned("b2", "b"),
        ],
    )
    .plan();
    assert_eq!(created(&plan), ["a1", "b1"], "2 of 4, one per zone");
}

#[test]
fn maintenances_of_a_deleted_policy_are_given_back() {
    let p = policy(1);
    let mut m = ours(&p, &node("a", "b0"), "b0", Some(Phase::Succeeded));
    m.metadata
        .owner_references
        .get_or_insert_with(Vec::new)
        .push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "Node".into(),
                name: "a".into(),
                ..Default::default()
            },
        );
    let nms = vec![Arc::new(m)];
    assert!(orphans(&nms, &[Arc::new(p.clone())]).is_empty());
    let fx = orphans(&nms, &[]);
    assert!(matches!(fx.as_slice(), [Effect::DeleteMaintenance { nm, .. }] if nm == "reboot-a"));
    // A policy recreated under the same name is another object.
    let mut again = p;
    again.metadata.uid = Some("uid-other".into());
    assert_eq!(orphans(&nms, &[Arc::new(again)]).len(), 1);
    // An administrator's maintenance is never touched.
    let admin = NodeMaintenance::new(
        "fix",
        NodeMaintenanceSpec {
            node_name: "a".into(),
            reason: None,
        },
    );
    assert!(orphans(&[Arc::new(admin)], &[]).is_empty());
}

#[test]
fn the_policys_drain_settings_travel_with_its_maintenance() {
    let mut p = policy(1);
    p.spec.drain.grace_period_seconds = Some(30);
    p.spec.drain.pod_selector = Some(LabelSelector {
        match_labels: Some([("tier".to_string(), "web".to_string())].into()),
        ..Default::default()
    });
    let nm = maintenance_for(&p, &node("a", "b0"), "b0");
    let ann = nm.annotations();
    assert_eq!(
        ann.get(DRAIN_GRACE_ANNOTATION).map(String::as_str),
        Some("30")
    );
    assert_eq!(
        ann.get(DRAIN_POD_SELECTOR_ANNOTATION).map(String::as_str),
        Some(r#"{"matchLabels":{"tier":"web"}}"#)
    );
}

#[test]
fn a_pod_selector_that_cannot_be_used_is_reported_and_admits_nothing() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    let req = |op: &str, values: Option<Vec<String>>| LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "app".into(),
            operator: op.into(),
            values,
        }]),
        ..Default::default()
    };
    let cases: Vec<(RebootPolicy, &str)> = vec![
        {
            let mut p = policy(1);
            p.spec.gates.blocking_pods = vec![BlockingPods {
                namespace: None,
                selector: req("Bogus", None),
            }];
            (p, "gates.blockingPods[0].selector: unknown operator")
        },
        {
            let mut p = policy(1);
            p.spec.drain.pod_selector = Some(req("In", None));
            (p, "drain.podSelector: app In needs values")
        },
        {
            let mut p = policy(1);
            p.spec.drain.pod_selector = Some(req("Exists", Some(vec!["x".into()])));
            (p, "drain.podSelector: app Exists takes no values")
        },
    ];
    for (p, why) in cases {
        let plan = World::new(p, vec![node("a", "b0")]).plan();
        assert!(created(&plan).is_empty(), "{why}: admitted");
        let st = status_of(&plan);
        let valid = st.conditions.iter().flatten().find(|c| c.type_ == "Valid");
        assert!(
            valid.is_some_and(|c| c.status == "False" && c.message.contains(why)),
            "{why}: {valid:?}"
        );
    }
}

#[test]
fn a_person_stops_an_admitted_reboot_before_its_command() {
    let deleted = |plan: &Plan| {
        plan.effects
            .iter()
            .filter(|e| matches!(e, Effect::DeleteMaintenance { .. }))
            .count()
    };
    // Drained and waiting for its command: paused, the node is given back.
    let p = with_entry(policy(1), entry("a", RebootPhase::Draining, "b0", now()));
    let a = annotate(node("a", "b0"), PAUSED_ANNOTATION, "true");
    let mut w = World::new(p.clone(), vec![a.clone()]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    let plan = w.plan();
    assert_eq!(deleted(&plan), 1, "{:?}", plan.effects);
    let (phase, msg) = phase_of(&status_of(&plan), "a");
    assert_eq!(phase, RebootPhase::Waiting);
    assert!(msg.contains("paused"), "{msg}");
    // The need withdrawn (`reboot-required --clear`): given back too.
    let a = no_need(node("a", "b0"));
    let mut w = World::new(p.clone(), vec![a.clone()]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    let plan = w.plan();
    assert_eq!(deleted(&plan), 1, "{:?}", plan.effects);
    assert!(!status_of(&plan).nodes.iter().any(|e| e.name == "a"));
    // Once its command is issued, it is too late: the reboot goes on.
    let a = annotate(
        annotate(node("a", "b0"), PAUSED_ANNOTATION, "true"),
        ISSUED_ANNOTATION,
        "b0",
    );
    let mut w = World::new(p.clone(), vec![a.clone()]);
    w.nms
        .push(Arc::new(ours(&p, &a, "b0", Some(Phase::Succeeded))));
    assert_eq!(deleted(&w.plan()), 0);
}

#[test]
fn a_selector_that_matches_no_node_is_reported() {
    let selected = |p: RebootPolicy| {
        let st = status_of(&World::new(p, vec![node("a", "b0")]).plan());
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "NodesSelected")
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let mut p = policy(1);
    p.spec.node_selector = Some(LabelSelector {
        match_labels: Some([("pool".to_string(), "nowhere".to_string())].into()),
        ..Default::default()
    });
    assert_eq!(selected(p), Some(("False".into(), "NoNodes".into())));
    assert_eq!(
        selected(policy(1)),
        Some(("True".into(), "NodesSelected".into()))
    );
}
