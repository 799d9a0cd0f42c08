use super::*;
use crate::api::node::{NodeSpec, NodeStatus};
use crate::api::pod::{NodeSelectorTerm, PodSpec};
use k8s_openapi::api::core::v1::NodeCondition;

fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, &str)]) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    n.spec = Some(NodeSpec {
        taints: Some(
            taints
                .iter()
                .map(|(k, e)| Taint {
                    key: k.to_string(),
                    effect: e.to_string(),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    });
    n.status = Some(NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    n
}

fn pod(uid: &str, placement: Placement) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.spec = Some(PodSpec {
        placement: Some(Box::new(placement)),
        ..Default::default()
    });
    p
}

fn toleration(key: &str, op: &str, effect: &str) -> Toleration {
    Toleration {
        key: (!key.is_empty()).then(|| key.into()),
        operator: Some(op.into()),
        value: None,
        effect: (!effect.is_empty()).then(|| effect.into()),
    }
}

fn req(key: &str, op: &str, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

#[test]
fn a_one_node_cluster_has_nowhere_for_any_pod() {
    let own = node("n1", &[], &[]);
    let plain = pod("u1", Placement::default());
    assert_eq!(
        homeless([&plain], &[&own], "n1"),
        BTreeSet::from(["u1".to_string()])
    );
    assert!(homeless([&plain], &[&own, &node("n2", &[], &[])], "n1").is_empty());
}

#[test]
fn cordoned_and_not_ready_nodes_are_no_place() {
    let mut cordoned = node("n2", &[], &[]);
    if let Some(s) = cordoned.spec.as_mut() {
        s.unschedulable = Some(true);
    }
    let mut down = node("n3", &[], &[]);
    down.status = None;
    let plain = pod("u1", Placement::default());
    assert_eq!(homeless([&plain], &[&cordoned, &down], "n1").len(), 1);
}

#[test]
fn a_passing_state_does_not_pin_a_pod_but_its_selector_and_other_taints_do() {
    let mut cordoned = node(
        "n2",
        &[("kubernetes.io/hostname", "n2")],
        &[
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
            ("node.kubernetes.io/not-ready", "NoExecute"),
            // Under maintenance: NMO's drain taint goes with it.
            (crate::api::nodemaintenance::DRAIN_TAINT, "NoSchedule"),
        ],
    );
    if let Some(s) = cordoned.spec.as_mut() {
        s.unschedulable = Some(true);
    }
    cordoned.status = None;
    let plain = pod("u1", Placement::default());
    assert!(!fits(&plain, &cordoned), "not now");
    assert!(could_ever_run(&plain, &cordoned), "but once it is back");
    let pinned = pod(
        "u2",
        Placement {
            node_selector: [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
            ..Default::default()
        },
    );
    assert!(!could_ever_run(&pinned, &cordoned));
    let dedicated = node("n3", &[], &[("dedicated", "NoSchedule")]);
    assert!(!could_ever_run(&plain, &dedicated));
}

#[test]
fn taints_need_a_matching_toleration_and_prefer_no_schedule_does_not_count() {
    let tainted = node("n2", &[], &[("gpu", "NoSchedule")]);
    let soft = node("n3", &[], &[("gpu", "PreferNoSchedule")]);
    let plain = pod("u1", Placement::default());
    assert!(!fits(&plain, &tainted));
    assert!(fits(&plain, &soft));
    for tol in [
        toleration("gpu", "Exists", "NoSchedule"),
        toleration("gpu", "Exists", ""),
        toleration("", "Exists", ""),
    ] {
        let p = pod(
            "u",
            Placement {
                tolerations: vec![tol.clone()],
                ..Default::default()
            },
        );
        assert!(fits(&p, &tainted), "{tol:?}");
    }
    let wrong = pod(
        "u",
        Placement {
            tolerations: vec![toleration("gpu", "Exists", "NoExecute")],
            ..Default::default()
        },
    );
    assert!(!fits(&wrong, &tainted));
}

#[test]
fn the_node_selector_and_required_affinity_must_match() {
    let n = node("n2", &[("zone", "a"), ("cores", "8")], &[]);
    let selected = |sel: &[(&str, &str)]| {
        pod(
            "u",
            Placement {
                node_selector: sel
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            },
        )
    };
    assert!(fits(&selected(&[("zone", "a")]), &n));
    assert!(!fits(&selected(&[("zone", "b")]), &n));
    let affine = |terms: Vec<NodeSelectorTerm>| {
        pod(
            "u",
            Placement {
                required_terms: terms,
                ..Default::default()
            },
        )
    };
    let term = |exprs: Vec<Requirement>, fields: Vec<Requirement>| NodeSelectorTerm {
        match_expressions: exprs,
        match_fields: fields,
    };
    assert!(fits(
        &affine(vec![term(vec![req("zone", "In", &["a", "b"])], vec![])]),
        &n
    ));
    assert!(!fits(
        &affine(vec![term(vec![req("zone", "NotIn", &["a"])], vec![])]),
        &n
    ));
    assert!(fits(
        &affine(vec![term(vec![req("cores", "Gt", &["4"])], vec![])]),
        &n
    ));
    assert!(!fits(
        &affine(vec![term(vec![req("cores", "Lt", &["4"])], vec![])]),
        &n
    ));
    assert!(!fits(
        &affine(vec![term(vec![req("gpu", "Exists", &[])], vec![])]),
        &n
    ));
    // Terms are ORed; an empty term matches nothing.
    assert!(fits(
        &affine(vec![
            term(vec![req("gpu", "Exists", &[])], vec![]),
            term(vec![req("zone", "Exists", &[])], vec![])
        ]),
        &n
    ));
    assert!(!fits(&affine(vec![term(vec![], vec![])]), &n));
    // A DaemonSet's pod is pinned by field to its node.
    let pinned = affine(vec![term(
        vec![],
        vec![req("metadata.name", "In", &["n1"])],
    )]);
    assert!(!fits(&pinned, &n));
    assert!(fits(&pinned, &node("n1", &[], &[])));
}

#[test]
fn the_message_names_the_first_pods_and_counts_the_rest() {
    let pods: Vec<String> = (0..7).map(|i| format!("ns/p{i}")).collect();
    let m = message(&pods);
    assert!(
        m.starts_with(
            "no other node can run 7 pods (ns/p0, ns/p1, ns/p2, ns/p3, ns/p4 and 2 more)"
        ),
        "{m}"
    );
}

#[test]
fn the_default_tolerations_every_pod_gets_are_not_kept() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]}
    }))
    .unwrap();
    assert_eq!(p.spec.unwrap().placement, None);
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"nodeSelector": {"zone": "a"}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}]}}}}
    }))
    .unwrap();
    let placement = p.spec.unwrap().placement.unwrap();
    assert_eq!(
        placement.node_selector.get("zone").map(String::as_str),
        Some("a")
    );
    assert_eq!(placement.required_terms[0].match_expressions[0].key, "k");
}
