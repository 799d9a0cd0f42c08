//! Monitoring artifacts (`nodekeeper manifests --for prometheus`): the
//! alerting rules, as a plain Prometheus rules file and as the Prometheus
//! Operator's `PrometheusRule`, a `PodMonitor` for the agents and the
//! cluster role, and a Grafana dashboard. Every expression names metrics
//! the exposition writes (`service::metrics`); a test loads the rules into
//! a real Prometheus and makes the alerts fire and resolve.

use serde_json::{Value, json};

use super::*;

/// One alert: name, expression, `for`, severity, summary, description.
type Alert = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const ALERTS: [Alert; 8] = [
    (
        "NodekeeperDrainStuck",
        "max by (node, nodemaintenance) (nodekeeper_maintenance_drain_overdue) > 0",
        "0s",
        "warning",
        "Drain of node {{ $labels.node }} is past its deadline",
        "NodeMaintenance {{ $labels.nodemaintenance }} has not drained node {{ $labels.node }} within its drain timeout; `kubectl describe nm {{ $labels.nodemaintenance }}` names the pods and PodDisruptionBudgets that block it.",
    ),
    (
        "NodekeeperNodeNotReturned",
        "max by (policy, node) (nodekeeper_reboot_not_returned_nodes) > 0",
        "0s",
        "critical",
        "Node {{ $labels.node }} did not come back from its reboot",
        "Node {{ $labels.node }} was rebooted by RebootPolicy {{ $labels.policy }} and missed its return deadline (returnTimeoutSeconds); it keeps its slot, so no other node reboots until it is back or deleted.",
    ),
    (
        "NodekeeperRebootFailed",
        "increase(nodekeeper_reboots_failed_total[30m]) > 0",
        "0s",
        "warning",
        "A node admitted for a reboot was given back without one",
        "A drain was skipped or a reboot command failed in the last 30 minutes; `kubectl get rebootpolicy -o yaml` shows the node's Failed entry and why.",
    ),
    (
        "NodekeeperUpgradeFailed",
        // A reason's first event creates its series at 1, which increase()
        // does not see: a series 30 minutes old or younger counts too.
        "sum by (reason) ((nodekeeper_events_total{kind=\"UpgradePlan\",type=\"Warning\"} unless nodekeeper_events_total{kind=\"UpgradePlan\",type=\"Warning\"} offset 30m) or increase(nodekeeper_events_total{kind=\"UpgradePlan\",type=\"Warning\"}[30m])) > 0",
        "0s",
        "warning",
        "An UpgradePlan reported a failure ({{ $labels.reason }})",
        "An UpgradePlan wrote a Warning event with reason {{ $labels.reason }} in the last 30 minutes (a failed command or hook, a node not returned, a command that cannot run); `kubectl describe upgradeplan` shows it.",
    ),
    (
        "NodekeeperReplacementStalled",
        "sum by (kind, reason) ((nodekeeper_events_total{kind=~\"NodeVersion|ScalingGroup|PendingNode|JoiningNode\",type=\"Warning\"} unless nodekeeper_events_total{kind=~\"NodeVersion|ScalingGroup|PendingNode|JoiningNode\",type=\"Warning\"} offset 30m) or increase(nodekeeper_events_total{kind=~\"NodeVersion|ScalingGroup|PendingNode|JoiningNode\",type=\"Warning\"}[30m])) > 0",
        "0s",
        "warning",
        "Node replacement reported a problem ({{ $labels.kind }} {{ $labels.reason }})",
        "A {{ $labels.kind }} wrote a Warning event with reason {{ $labels.reason }} in the last 30 minutes (a provider call failing, a node that did not join); the rollout waits. `kubectl describe` on it shows the event.",
    ),
    (
        "NodekeeperNoLeader",
        "max(nodekeeper_leader) == 0",
        "1m",
        "critical",
        "No nodekeeper cluster-role replica leads",
        "Every cluster-role replica is standing by: no reboot, upgrade or replacement is admitted. Check the Lease nodekeeper-leader and the replicas' logs.",
    ),
    (
        "NodekeeperNotReady",
        // A standby replica lists nothing until it leads.
        "nodekeeper_ready == 0 unless on (instance) (nodekeeper_leader == 0)",
        "5m",
        "warning",
        "nodekeeper on {{ $labels.node }}{{ $labels.instance }} has not listed its watches",
        "The agent started but some watch never listed (no CRDs, no permission, an unreachable API server); its log says which in one line.",
    ),
    (
        "NodekeeperReconcileErrors",
        "increase(nodekeeper_reconcile_errors_total[10m]) > 5",
        "10m",
        "warning",
        "nodekeeper on {{ $labels.instance }} keeps failing to reconcile",
        "Node reconciles have failed for 10 minutes; the agent retries with backoff. `nodekeeper_errors_total` says which kind and the log says why.",
    ),
];

/// The rule groups, as Prometheus reads them.
fn groups() -> Value {
    let rules: Vec<Value> = ALERTS
        .iter()
        .map(|(alert, expr, for_, severity, summary, description)| {
            json!({"alert": alert, "expr": expr, "for": for_,
                   "labels": {"severity": severity},
                   "annotations": {"summary": summary, "description": description}})
        })
        .collect();
    json!([{"name": "nodekeeper", "rules": rules}])
}

/// The dashboard's panels: a title, and each query with its legend (one
/// target each: series of two queries joined by `or` with equal labels
/// would hide the second).
type Panel = (&'static str, &'static [(&'static str, &'static str)]);

const PANELS: [Panel; 10] = [
    (
        "NodeMaintenances by phase",
        &[("max by (phase) (nodekeeper_nodemaintenances)", "{{phase}}")],
    ),
    (
        "Drains past their deadline",
        &[(
            "max by (node, nodemaintenance) (nodekeeper_maintenance_drain_overdue)",
            "{{node}} {{nodemaintenance}}",
        )],
    ),
    (
        "Reboots per hour",
        &[(
            "sum(increase(nodekeeper_reboots_verified_total[1h]))",
            "verified",
        )],
    ),
    (
        "Reboots failed, not returned",
        &[
            (
                "sum(increase(nodekeeper_reboots_failed_total[1h]))",
                "failed",
            ),
            (
                "max by (node) (nodekeeper_reboot_not_returned_nodes)",
                "not returned: {{node}}",
            ),
        ],
    ),
    (
        "Nodes needing a reboot, rebooting",
        &[
            (
                "max by (policy) (nodekeeper_reboot_needed_nodes)",
                "needing: {{policy}}",
            ),
            (
                "max by (policy) (nodekeeper_rebooting_nodes)",
                "rebooting: {{policy}}",
            ),
        ],
    ),
    (
        "Reboot duration p90 (admission to verified)",
        &[(
            "histogram_quantile(0.9, sum by (le) (rate(nodekeeper_reboot_duration_seconds_bucket[1h])))",
            "p90",
        )],
    ),
    (
        "Evictions per second",
        &[
            ("sum(rate(nodekeeper_pod_evictions_total[5m]))", "evicted"),
            (
                "sum(rate(nodekeeper_pod_eviction_refusals_total[5m]))",
                "refused",
            ),
        ],
    ),
    (
        "API requests per second",
        &[(
            "sum by (verb) (rate(nodekeeper_api_requests_total[5m]))",
            "{{verb}}",
        )],
    ),
    (
        "Objects held in watch caches",
        &[("sum by (kind) (nodekeeper_watched_objects)", "{{kind}}")],
    ),
    (
        "Ready agents, leader",
        &[
            ("sum(nodekeeper_ready)", "ready"),
            ("max(nodekeeper_leader)", "leader"),
        ],
    ),
];

fn dashboard() -> Value {
    let panels: Vec<Value> = PANELS
        .iter()
        .enumerate()
        .map(|(i, (title, queries))| {
            let targets: Vec<Value> = queries
                .iter()
                .zip(["A", "B"])
                .map(|((expr, legend), id)| json!({"refId": id, "expr": expr, "legendFormat": legend}))
                .collect();
            json!({"id": i + 1, "type": "timeseries", "title": title,
                   "datasource": {"type": "prometheus", "uid": "${datasource}"},
                   "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i / 2) * 8},
                   "targets": targets})
        })
        .collect();
    json!({"title": "nodekeeper", "uid": "nodekeeper", "schemaVersion": 39,
           "tags": ["nodekeeper", "kubernetes"], "time": {"from": "now-6h", "to": "now"},
           "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
           "panels": panels})
}

/// The files of the `prometheus` target.
pub(super) fn files(o: &Options) -> Vec<File> {
    let head = "# Generated by `nodekeeper manifests --for prometheus`; do not edit.\n";
    let rule = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "nodekeeper", "namespace": o.namespace, "labels": labels()},
        "spec": {"groups": groups()}});
    let monitor = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": "nodekeeper", "namespace": o.namespace, "labels": labels()},
        "spec": {"selector": {"matchExpressions": [
                    {"key": "app.kubernetes.io/name", "operator": "In", "values": ["nodekeeper"]}]},
                 "podMetricsEndpoints": [{"port": "metrics", "interval": "30s",
                    // A series' own `node` (the NodeMaintenance's node, on
                    // the cluster role's) wins over the pod's.
                    "honorLabels": true,
                    // The agent's node, as `node` on every series.
                    "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                     "targetLabel": "node"}]}]}});
    vec![
        File {
            path: "rules.yaml".into(),
            content: format!(
                "# nodekeeper's alerts, as a Prometheus rules file (rule_files).\n{head}{}",
                crate::yaml::documents(&[json!({"groups": groups()})])
            ),
        },
        File {
            path: "prometheus-rule.yaml".into(),
            content: format!(
                "# nodekeeper's alerts and how to scrape it, for the Prometheus Operator.\n{head}{}",
                crate::yaml::documents(&[rule, monitor])
            ),
        },
        File {
            path: "grafana-dashboard.json".into(),
            content: format!("{:#}\n", dashboard()),
        },
    ]
}
