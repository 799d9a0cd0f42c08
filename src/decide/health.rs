//! The health gate (`gates.health`), pure: after a node came back from its
//! reboot or upgrade it keeps its budget slot until the cluster is healthy
//! again, not merely the node — the node Ready and schedulable, every
//! workload the gate names fully available, no matching Prometheus alert —
//! for at least `settleSeconds`; past `timeoutSeconds` its `onTimeout`
//! says whether the slot is kept (`Pause`) or given back (`Continue`).
//!
//! The workloads' state comes from the service (`service::health` lists
//! them while a node waits for the gate) as [`Workload`] rows; this module
//! only reads them. "Available" is what `kubectl rollout status` waits for
//! ([`Rule`]: a partitioned StatefulSet once its partition is rolled out;
//! OnDelete workloads and paused Deployments by their ready and available
//! counts only), and the message says which rule held it.

use crate::api::node::Node;
use kube::ResourceExt;

use super::disrupt::{Alerts, blocking_alerts};
use crate::api::common::Gates;

/// Machine-readable reason of an entry the gate held past its timeout.
pub const HEALTH_TIMEOUT: &str = "HealthTimeout";

/// One Deployment, StatefulSet or DaemonSet as the gate reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub desired: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
    /// Its controller has observed its latest spec.
    pub observed: bool,
    /// Which of `kubectl rollout status`'s rules applies.
    pub rule: Rule,
}

/// How `kubectl rollout status` judges a workload
/// (`pkg/polymorphichelpers/rollout_status.go`, its three status viewers).
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// A rolling update: updated, ready and available reach the desired
    /// count; a Deployment's old replicas are gone (`old`).
    Rollout { old: i32 },
    /// A StatefulSet with `rollingUpdate.partition`: done once
    /// `updatedReplicas >= replicas - partition` ("partitioned roll out
    /// complete"), all replicas ready.
    Partitioned { target: i32 },
    /// A StatefulSet without `rollingUpdate`: all ready and the current
    /// revision is the update revision.
    Revision { current: bool },
    /// `OnDelete` (kubectl: "rollout status is only available for
    /// RollingUpdate") or a paused Deployment: its template waits for
    /// someone else, so only ready and available counts hold the gate.
    CountsOnly(&'static str),
}

/// A Deployment, StatefulSet or DaemonSet as the API returns it, read
/// into the fields the gate judges by and nothing else: serde skips the
/// rest (pod template, managedFields) as it reads a list page, so a page
/// of 100 objects never becomes a tree of JSON values (the health gate
/// over 3 000 Deployments raised the cluster role's RSS 6–7 MiB while its
/// heap moved 0.3 MB: trees freed and not given back). Not k8s-openapi's
/// apps/v1 types: those cost the static binary 400 KB for these few
/// fields.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Listed {
    metadata: ListedMeta,
    spec: ListedSpec,
    status: ListedStatus,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct ListedMeta {
    name: String,
    namespace: String,
    generation: i64,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ListedSpec {
    /// `None`: the API's default of 1.
    replicas: Option<i64>,
    paused: bool,
    /// StatefulSet and DaemonSet.
    update_strategy: Strategy,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Strategy {
    #[serde(rename = "type")]
    type_: Option<String>,
    rolling_update: Option<RollingUpdate>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct RollingUpdate {
    partition: i64,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ListedStatus {
    observed_generation: i64,
    replicas: i64,
    updated_replicas: i64,
    ready_replicas: i64,
    available_replicas: i64,
    desired_number_scheduled: i64,
    updated_number_scheduled: i64,
    number_ready: i64,
    number_available: i64,
    current_revision: Option<String>,
    update_revision: Option<String>,
}

impl Workload {
    /// The row for one listed object of `kind`.
    pub fn read(kind: &'static str, o: &Listed) -> Workload {
        let (spec, status, meta) = (&o.spec, &o.status, &o.metadata);
        let int = |v: i64| v as i32;
        let on_delete = spec.update_strategy.type_.as_deref() == Some("OnDelete");
        let (desired, updated, ready, available) = if kind == "DaemonSet" {
            (
                int(status.desired_number_scheduled),
                int(status.updated_number_scheduled),
                int(status.number_ready),
                int(status.number_available),
            )
        } else {
            (
                spec.replicas.map_or(1, int),
                int(status.updated_replicas),
                int(status.ready_replicas),
                int(status.available_replicas),
            )
        };
        let rule = match kind {
            "Deployment" if spec.paused => Rule::CountsOnly("paused"),
            "Deployment" => Rule::Rollout {
                old: int(status.replicas) - updated,
            },
            "DaemonSet" if on_delete => Rule::CountsOnly("OnDelete"),
            "StatefulSet" if on_delete => Rule::CountsOnly("OnDelete"),
            "StatefulSet" => match &spec.update_strategy.rolling_update {
                Some(r) => Rule::Partitioned {
                    target: desired - int(r.partition),
                },
                None => Rule::Revision {
                    current: status.current_revision == status.update_revision,
                },
            },
            _ => Rule::Rollout { old: 0 },
        };
        let (generation, observed) = (meta.generation, status.observed_generation);
        Workload {
            kind,
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            desired,
            updated,
            ready,
            available,
            // A StatefulSet's controller that never wrote observedGeneration
            // has observed nothing (kubectl's `ObservedGeneration == 0`).
            observed: generation <= observed && !(kind == "StatefulSet" && observed == 0),
            rule,
        }
    }

    /// Why it is not available as `kubectl rollout status` would judge it,
    /// naming the rule, if it is not.
    pub fn unavailable(&self) -> Option<String> {
        let what = format!("{} {}/{}", self.kind, self.namespace, self.name);
        if !self.observed {
            return Some(format!("{what}: its latest spec not yet observed"));
        }
        let (d, u, r, a) = (self.desired, self.updated, self.ready, self.available);
        let counts = format!("{a}/{d} available ({u} updated, {r} ready)");
        match &self.rule {
            Rule::CountsOnly(why) if r < d || a < d => Some(format!(
                "{what}: {counts}; {why}: ready and available counts only"
            )),
            Rule::CountsOnly(_) => None,
            Rule::Partitioned { target } if r < d || u < *target => Some(format!(
                "{what}: {counts}; partitioned: {u} of {target} updated"
            )),
            Rule::Partitioned { .. } => None,
            Rule::Revision { current } if r < d || !current => Some(format!(
                "{what}: {counts}; the update revision not yet current"
            )),
            Rule::Revision { .. } => None,
            Rule::Rollout { old } if u < d || r < d || a < d || *old > 0 => {
                let old = if *old > 0 {
                    format!("; {old} old replicas pending termination")
                } else {
                    String::new()
                };
                Some(format!("{what}: {counts}{old}"))
            }
            Rule::Rollout { .. } => None,
        }
    }
}

/// The gate's workloads as last listed.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    Listed(Vec<Workload>),
    /// Not listed yet, or the last list failed (why): holds the slot.
    Unknown(String),
}

/// What still holds a node that came back under `gates` (empty: healthy,
/// and always without a health gate: then `settleSeconds` alone counts).
pub fn unhealthy(
    gates: &Gates,
    node: &Node,
    health: Option<&Health>,
    alerts: Option<&Alerts>,
) -> Vec<String> {
    let mut out = Vec::new();
    if gates.health.is_none() {
        return out;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        out.push(format!("node {} not Ready", node.name_any()));
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        out.push(format!("node {} cordoned", node.name_any()));
    }
    match health {
        Some(Health::Listed(workloads)) => {
            out.extend(workloads.iter().filter_map(Workload::unavailable));
        }
        Some(Health::Unknown(why)) => out.push(format!("workloads not known: {why}")),
        None => out.push("workloads not listed yet".into()),
    }
    if let Some(gate) = &gates.prometheus {
        match alerts.map(|a| blocking_alerts(gate, a)) {
            Some(Ok(firing)) => out.extend(firing.into_iter().map(|a| format!("alert {a}"))),
            Some(Err(why)) => out.push(why),
            None => out.push("Prometheus not asked yet".into()),
        }
    }
    out
}

/// `reasons` joined for a status message, the first few only.
pub fn summary(reasons: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut s = reasons
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if reasons.len() > SHOWN {
        s.push_str(&format!("; and {} more", reasons.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::node::{NodeSpec, NodeStatus};
    use k8s_openapi::api::core::v1::NodeCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    /// A workload as the API would list it, read as the service reads it.
    fn from_json(kind: &'static str, o: &serde_json::Value) -> Workload {
        let listed: Listed = serde_json::from_value(o.clone()).unwrap_or_else(|e| panic!("{e}"));
        Workload::read(kind, &listed)
    }

    fn deployment(replicas: i32, available: i32, generation: i64, observed: i64) -> Workload {
        from_json(
            "Deployment",
            &serde_json::json!({
                "metadata": {"name": "api", "namespace": "prod", "generation": generation},
                "spec": {"replicas": replicas},
                "status": {"observedGeneration": observed, "updatedReplicas": replicas,
                    "readyReplicas": available, "availableReplicas": available},
            }),
        )
    }

    fn node(ready: bool, cordoned: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    /// kubectl's `pkg/polymorphichelpers/rollout_status.go`: a partitioned
    /// StatefulSet is done at `updated >= replicas - partition`; OnDelete
    /// workloads and paused Deployments hold by their counts only
    /// (where-features-meet.md, finding 7: they held a slot for ever).
    #[test]
    fn partitions_on_delete_and_paused_workloads_are_judged_as_kubectl_rollout_status_does() {
        let sts = |strategy: serde_json::Value, updated: i32| {
            from_json(
                "StatefulSet",
                &serde_json::json!({
                    "metadata": {"name": "db", "namespace": "prod", "generation": 2},
                    "spec": {"replicas": 3, "updateStrategy": strategy},
                    "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": updated,
                        "readyReplicas": 3, "availableReplicas": 3,
                        "currentRevision": "a", "updateRevision": "b"},
                }),
            )
        };
        let canary = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}});
        assert_eq!(sts(canary.clone(), 1).unavailable(), None, "1 >= 3 - 2");
        let why = sts(canary, 0).unavailable().unwrap_or_default();
        assert!(why.contains("partitioned: 0 of 1 updated"), "{why}");
        assert_eq!(sts(json!({"type": "OnDelete"}), 0).unavailable(), None);
        let rolling = sts(json!({"type": "RollingUpdate", "rollingUpdate": {}}), 1);
        assert!(rolling.unavailable().is_some(), "partition 0: all updated");
        assert!(
            sts(json!({}), 3).unavailable().is_some(),
            "revisions differ"
        );
        let ds = |strategy: &str, available: i32| {
            from_json(
                "DaemonSet",
                &serde_json::json!({
                    "metadata": {"name": "cni", "namespace": "kube-system", "generation": 1},
                    "spec": {"updateStrategy": {"type": strategy}},
                    "status": {"observedGeneration": 1, "desiredNumberScheduled": 4,
                        "updatedNumberScheduled": 1, "numberReady": available,
                        "numberAvailable": available},
                }),
            )
        };
        assert_eq!(ds("OnDelete", 4).unavailable(), None);
        let why = ds("OnDelete", 3).unavailable().unwrap_or_default();
        assert!(
            why.contains("OnDelete: ready and available counts only"),
            "{why}"
        );
        assert!(
            ds("RollingUpdate", 4).unavailable().is_some(),
            "1 of 4 updated"
        );
        let paused = from_json(
            "Deployment",
            &serde_json::json!({
                "metadata": {"name": "api", "namespace": "prod", "generation": 3},
                "spec": {"replicas": 2, "paused": true},
                "status": {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 0,
                    "readyReplicas": 2, "availableReplicas": 2},
            }),
        );
        assert_eq!(paused.unavailable(), None);
        let mut old = deployment(3, 3, 2, 2);
        old.rule = Rule::Rollout { old: 1 };
        assert!(
            old.unavailable()
                .unwrap_or_default()
                .contains("1 old replicas pending termination")
        );
    }

    #[test]
    fn a_workload_is_available_when_rollout_status_would_say_so() {
        assert_eq!(deployment(3, 3, 2, 2).unavailable(), None);
        assert_eq!(
            deployment(3, 2, 2, 2).unavailable(),
            Some("Deployment prod/api: 2/3 available (3 updated, 2 ready)".into())
        );
        assert!(
            deployment(3, 3, 3, 2)
                .unavailable()
                .is_some_and(|w| w.contains("not yet observed"))
        );
    }

    #[test]
    fn the_gate_holds_for_the_node_its_workloads_and_its_alerts() {
        let gates: Gates = serde_json::from_value(serde_json::json!({
            "health": {"workloads": [{"selector": {"matchLabels": {"tier": "db"}}}]},
        }))
        .unwrap_or_default();
        let ok = Health::Listed(vec![deployment(1, 1, 1, 1)]);
        assert!(unhealthy(&gates, &node(true, false), Some(&ok), None).is_empty());
        // A DaemonSet reads its scheduled counts; no status at all is not
        // available.
        let ds = from_json(
            "DaemonSet",
            &serde_json::json!({"metadata": {"name": "agent", "namespace": "kube-system", "generation": 1},
                "status": {"observedGeneration": 1, "desiredNumberScheduled": 3,
                    "updatedNumberScheduled": 3, "numberReady": 3, "numberAvailable": 2}}),
        );
        assert!(
            ds.unavailable()
                .is_some_and(|w| w.contains("2/3 available"))
        );
        let fresh = from_json(
            "StatefulSet",
            &serde_json::json!({"metadata": {"name": "db", "namespace": "x", "generation": 1}, "spec": {"replicas": 1}}),
        );
        assert!(fresh.unavailable().is_some());
        let held = unhealthy(&gates, &node(true, true), None, None);
        assert_eq!(held, ["node a cordoned", "workloads not listed yet"]);
        // No gate: nothing but settleSeconds holds the slot.
        let none = Gates::default();
        assert!(unhealthy(&none, &node(false, true), None, None).is_empty());
        assert_eq!(
            unhealthy(&gates, &node(false, false), Some(&ok), None),
            ["node a not Ready"]
        );
        // An alert of the Prometheus gate holds it too.
        let mut with_alerts = gates.clone();
        with_alerts.prometheus =
            serde_json::from_value(serde_json::json!({"url": "http://p:9090"})).ok();
        let firing = Alerts::Active(vec![("DiskFull".into(), "firing".into())]);
        assert_eq!(
            unhealthy(&with_alerts, &node(true, false), Some(&ok), Some(&firing)),
            ["alert DiskFull"]
        );
        assert_eq!(
            summary(&["a".into(), "b".into(), "c".into(), "d".into(), "e".into()]),
            "a; b; c; and 2 more"
        );
    }
}
