//! The Prometheus gate: which active alerts hold admissions, and what a
//! waiting node is told.

use super::*;
use crate::api::common::PrometheusGate;
#[allow(unused_imports)]
use crate::api::common::{Budget, DrainSpec, Gates};
#[allow(unused_imports)]
use crate::api::node::Node;
use crate::api::node::NodeStatus;
use crate::decide::selector::*;
use k8s_openapi::api::core::v1::NodeCondition;
#[allow(unused_imports)]
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
#[allow(unused_imports)]
use std::sync::Arc;

fn gate(alerts: Option<&str>, ignore: Option<&str>, firing_only: bool) -> PrometheusGate {
    PrometheusGate {
        url: "http://prometheus.monitoring:9090".into(),
        alerts: alerts.map(str::to_string),
        ignore_alerts: ignore.map(str::to_string),
        firing_only,
    }
}

fn active() -> Alerts {
    Alerts::Active(
        [
            ("KubeNodeNotReady", "firing"),
            ("Watchdog", "firing"),
            ("DiskFilling", "pending"),
            ("KubeNodeNotReady", "firing"),
        ]
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect(),
    )
}

#[test]
fn matching_alerts_hold_admissions_as_kureds_flags_say() {
    // Every active alert, pending ones included, once each, sorted.
    assert_eq!(
        blocking_alerts(&gate(None, None, false), &active()),
        Ok(vec![
            "DiskFilling".into(),
            "KubeNodeNotReady".into(),
            "Watchdog".into()
        ])
    );
    // --alert-firing-only; --alert-filter-regexp (ignored names).
    assert_eq!(
        blocking_alerts(&gate(None, Some("Watchdog"), true), &active()),
        Ok(vec!["KubeNodeNotReady".into()])
    );
    // A pattern matches anywhere in the name, as kured's; anchored, the
    // whole name.
    assert_eq!(
        blocking_alerts(&gate(Some("Node"), None, false), &active()),
        Ok(vec!["KubeNodeNotReady".into()])
    );
    assert_eq!(
        blocking_alerts(&gate(Some("^Node"), None, false), &active()),
        Ok(vec![])
    );
    // Not known holds, saying why.
    assert_eq!(
        blocking_alerts(
            &gate(None, None, false),
            &Alerts::Unknown("no answer within 5 s".into())
        ),
        Err("no answer within 5 s".into())
    );
}

#[test]
fn a_pattern_that_is_not_a_regular_expression_makes_the_object_unusable() {
    let gates = Gates {
        prometheus: Some(gate(Some("Kube(.*"), None, false)),
        ..Default::default()
    };
    let drain: crate::api::common::DrainSpec =
        serde_json::from_value(serde_json::json!({})).unwrap_or_else(|e| panic!("{e}"));
    let problems = check_pod_selectors(&gates, &drain);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("gates.prometheus.alerts: not a regular expression"),
        "{problems:?}"
    );
}

#[test]
fn a_ready_node_waits_with_reason_alert_naming_the_alert() {
    let node = Node {
        metadata: ObjectMeta {
            name: Some("a".into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let gates = Gates {
        prometheus: Some(gate(None, Some("Watchdog"), true)),
        ..Default::default()
    };
    let budget = Budget::default();
    let admission = |alerts: Option<&Alerts>| {
        wait(&Admission {
            what: "reboot",
            window_open: true,
            window_opens: None,
            node: &node,
            gates: &gates,
            others_not_ready: &[],
            pods: &[],
            budget: &budget,
            members: &[],
            alerts,
            unlisted: None,
        })
    };
    assert_eq!(
        admission(Some(&active())),
        Some((
            WAIT_ALERT,
            "alert KubeNodeNotReady active in Prometheus (http://prometheus.monitoring:9090)"
                .into()
        ))
    );
    let (reason, why) = admission(None).unwrap_or_default();
    assert_eq!(reason, WAIT_ALERT);
    assert!(why.contains("Prometheus not asked yet"), "{why}");
    let quiet = Alerts::Active(vec![("Watchdog".into(), "firing".into())]);
    assert_ne!(admission(Some(&quiet)).map(|w| w.0), Some(WAIT_ALERT));
}

#[test]
fn gate_selectors_and_namespaces_are_checked_as_the_api_server_would() {
    use crate::api::common::BlockingPods;
    let gate = |k: &str, v: &str, ns: Option<&str>| BlockingPods {
        namespace: ns.map(str::to_string),
        selector: LabelSelector {
            match_labels: Some([(k.to_string(), v.to_string())].into()),
            ..Default::default()
        },
    };
    assert!(check_gate(&gate("app", "web", Some("prod"))).is_ok());
    assert!(check_gate(&gate("example.com/app", "", None)).is_ok());
    // The API server answers 400 to these: a watch built on one retried
    // for ever and held every reboot in the cluster.
    let spaced = check_gate(&gate("app", "my app", None)).unwrap_err();
    assert!(spaced.contains("\"my app\""), "{spaced}");
    assert!(check_gate(&gate("bad key", "x", None)).is_err());
    assert!(check_gate(&gate("app", &"x".repeat(64), None)).is_err());
    // The namespace reaches the URL path.
    assert!(check_gate(&gate("app", "web", Some("../nodes"))).is_err());
    assert!(check_gate(&gate("app", "web", Some("Prod"))).is_err());
    // And the object that carries them is reported unusable, field named.
    let gates = crate::api::common::Gates {
        blocking_pods: vec![gate("app", "web", None), gate("app", "my app", Some("a/b"))],
        ..Default::default()
    };
    let problems = check_pod_selectors(&gates, &Default::default());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("gates.blockingPods[1].selector"));
    assert!(problems[1].starts_with("gates.blockingPods[1].namespace"));
}

/// kured's `--blocking-pod-selector`: every pod on the node that matches
/// blocks, but a finished one and one in phase `Unknown` (its field
/// selector, `pkg/blockers/kubernetespod.go`); Pending and Running do.
#[test]
fn blocking_pods_are_the_ones_kured_counts() {
    use crate::api::common::BlockingPods;
    use crate::api::pod::PodStatus;
    let gates = Gates {
        blocking_pods: vec![BlockingPods {
            namespace: None,
            selector: LabelSelector {
                match_labels: Some([("app".to_string(), "db".to_string())].into()),
                ..Default::default()
            },
        }],
        ..Default::default()
    };
    let pod = |name: &str, phase: Option<&str>| {
        Arc::new(crate::api::pod::Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("prod".into()),
                labels: Some([("app".to_string(), "db".to_string())].into()),
                ..Default::default()
            },
            spec: None,
            status: phase.map(|p| PodStatus {
                phase: Some(p.into()),
                ..Default::default()
            }),
        })
    };
    for phase in ["Succeeded", "Failed", "Unknown"] {
        assert_eq!(
            blocking_pod(&gates, &[pod("db-0", Some(phase))]),
            None,
            "{phase}"
        );
    }
    for phase in [Some("Pending"), Some("Running"), None] {
        assert_eq!(
            blocking_pod(&gates, &[pod("db-0", phase)]).as_deref(),
            Some("prod/db-0"),
            "{phase:?}"
        );
    }
}
