//! What every disruption feature (reboots, upgrades, replacement) shares,
//! pure: the node facts admissions read (boot ID, Ready, schedulable,
//! blocking pods, selector checks), and how a feature takes a node — a
//! NodeMaintenance it owns, carrying its drain options and the boot ID the
//! node was taken in — and gives back the nodes of an owner that is gone.

use std::sync::Arc;

use crate::api::pod::Pod;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::Effect;
use super::budget::{self, Member};
use super::drain::selector_matches;
use super::maintenance::owner_of;
use crate::api::common::{Budget, DrainSpec, Gates};
use crate::api::nodemaintenance::{
    DRAIN_GRACE_ANNOTATION, DRAIN_ON_TIMEOUT_ANNOTATION, DRAIN_POD_SELECTOR_ANNOTATION,
    DRAIN_TIMEOUT_ANNOTATION, NodeMaintenance, NodeMaintenanceSpec, OWNER_LABEL,
};
use crate::api::reboot::BOOT_ID_ANNOTATION;

/// The node's current boot ID, as its kubelet reports it.
pub fn boot_id(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.boot_id.as_str())
        .filter(|b| !b.is_empty())
}

pub fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

pub fn node_ref(node: &Node) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.name_any()),
        uid: node.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The first running pod matching a blocking-pod gate, as `ns/name`.
pub fn blocking_pod(gates: &Gates, pods: &[Arc<Pod>]) -> Option<String> {
    let running = |pod: &Pod| {
        !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        )
    };
    gates.blocking_pods.iter().find_map(|g| {
        pods.iter()
            .filter(|pod| running(pod))
            .filter(|pod| {
                g.namespace
                    .as_deref()
                    .is_none_or(|ns| pod.namespace().as_deref() == Some(ns))
            })
            .find(|pod| selector_matches(&g.selector, pod.labels()))
            .map(|pod| format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
    })
}

/// Machine-readable reasons for the waits every feature shares.
pub const WAIT_WINDOW: &str = "Window";
pub const WAIT_NOT_READY: &str = "NotReady";
pub const WAIT_GATE: &str = "Gate";
pub const WAIT_BLOCKING_POD: &str = "BlockingPod";
pub const WAIT_BUDGET: &str = "Budget";
pub const WAIT_ALERT: &str = "Alert";

/// What Prometheus last said about its active alerts, for a gate's URL.
#[derive(Debug, Clone, PartialEq)]
pub enum Alerts {
    /// Every active alert as (alertname, state: `firing` or `pending`).
    Active(Vec<(String, String)>),
    /// Not known: not asked yet, or the last question failed (why).
    Unknown(String),
}

/// The alerts that hold admissions under `gate`, names sorted and
/// deduplicated. A pattern matches anywhere in a name, as kured's do
/// (anchor it with `^…$` for the whole name); `Err` when Prometheus's answer is not known (an unknown
/// answer holds admissions, as in kured) or a pattern is not a regular
/// expression.
pub fn blocking_alerts(
    gate: &crate::api::common::PrometheusGate,
    alerts: &Alerts,
) -> Result<Vec<String>, String> {
    let pattern = |field: &str, p: &Option<String>| -> Result<Option<regex::Regex>, String> {
        p.as_deref()
            .map(|p| {
                regex::Regex::new(p)
                    .map_err(|e| format!("gates.prometheus.{field}: not a regular expression: {e}"))
            })
            .transpose()
    };
    let only = pattern("alerts", &gate.alerts)?;
    let ignore = pattern("ignoreAlerts", &gate.ignore_alerts)?;
    let active = match alerts {
        Alerts::Active(v) => v,
        Alerts::Unknown(why) => return Err(why.clone()),
    };
    let mut names: Vec<String> = active
        .iter()
        .filter(|(_, state)| !gate.firing_only || state == "firing")
        .filter(|(name, _)| only.as_ref().is_none_or(|r| r.is_match(name)))
        .filter(|(name, _)| !ignore.as_ref().is_some_and(|r| r.is_match(name)))
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Why a Prometheus gate holds admissions now, if it does.
fn alert_wait(a: &Admission) -> Option<String> {
    let gate = a.gates.prometheus.as_ref()?;
    let unknown = Alerts::Unknown("Prometheus not asked yet".into());
    match blocking_alerts(gate, a.alerts.unwrap_or(&unknown)) {
        Ok(names) if names.is_empty() => None,
        Ok(names) => Some(format!(
            "alert {} active in Prometheus ({})",
            names.join(", "),
            gate.url
        )),
        Err(why) => Some(format!(
            "cannot tell whether an alert is active in Prometheus ({}): {why}",
            gate.url
        )),
    }
}

/// The admission checks every feature ends with, in order: the window, the
/// node's readiness, `requireReady`, Prometheus's alerts, blocking pods,
/// the budget. `None`
/// admits; otherwise the reason and the message (`what`: "reboot",
/// "upgrade", for the window's message).
pub struct Admission<'a> {
    pub what: &'a str,
    pub window_open: bool,
    pub node: &'a Node,
    pub gates: &'a Gates,
    /// Selected nodes that are NotReady and not waiting for this feature.
    pub others_not_ready: &'a [String],
    pub pods: &'a [Arc<Pod>],
    pub budget: &'a Budget,
    pub members: &'a [Member<'a>],
    /// Prometheus's last answer for the gate's URL, if the feature has a
    /// Prometheus gate.
    pub alerts: Option<&'a Alerts>,
    /// A blocking-pod gate of this object whose pods are not listed yet
    /// (the watch has not answered, or cannot: its selector refused):
    /// a blocking pod could not be seen, so nothing is admitted.
    pub unlisted: Option<&'a str>,
}

pub fn wait(a: &Admission) -> Option<(&'static str, String)> {
    let n = a.node.name_any();
    if !a.window_open {
        Some((WAIT_WINDOW, format!("outside every {} window", a.what)))
    } else if !ready(a.node) {
        Some((WAIT_NOT_READY, "the node is NotReady".into()))
    } else if a.gates.require_ready && !a.others_not_ready.is_empty() {
        Some((
            WAIT_GATE,
            format!(
                "requireReady: node {} is NotReady",
                a.others_not_ready.join(", ")
            ),
        ))
    } else if let Some(why) = alert_wait(a) {
        Some((WAIT_ALERT, why))
    } else if let Some(gate) = a.unlisted {
        Some((
            WAIT_GATE,
            format!("the pods of gate {gate} are not listed yet"),
        ))
    } else if let Some(pod) = blocking_pod(a.gates, a.pods) {
        Some((WAIT_BLOCKING_POD, format!("blocked by pod {pod}")))
    } else {
        let me = a
            .members
            .iter()
            .find(|m| m.name == n)
            .cloned()
            .unwrap_or_default();
        budget::admits(a.budget, a.members, &me)
            .err()
            .map(|why| (WAIT_BUDGET, why))
    }
}

/// A node selector's operators and values (the CRDs refuse a bad one; an
/// object stored before they did is caught here).
pub fn check_selector(sel: &LabelSelector) -> Result<(), String> {
    check_selector_at("nodeSelector", sel)
}

/// [`check_selector`] for the selector at `field`, named in the message.
/// Keys and values are checked as the API server checks label selectors:
/// one it refuses ("my app") made a blocking-pod gate's watch fail for
/// ever.
pub fn check_selector_at(field: &str, sel: &LabelSelector) -> Result<(), String> {
    for (k, v) in sel.match_labels.iter().flatten() {
        check_label_key(field, k)?;
        check_label_value(field, k, v)?;
    }
    for e in sel.match_expressions.iter().flatten() {
        check_label_key(field, &e.key)?;
        for v in e.values.iter().flatten() {
            check_label_value(field, &e.key, v)?;
        }
        let has_values = e.values.as_ref().is_some_and(|v| !v.is_empty());
        match e.operator.as_str() {
            "In" | "NotIn" if !has_values => {
                return Err(format!("{field}: {} {} needs values", e.key, e.operator));
            }
            "Exists" | "DoesNotExist" if has_values => {
                return Err(format!("{field}: {} {} takes no values", e.key, e.operator));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "{field}: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                ));
            }
        }
    }
    Ok(())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 characters (alphanumerics, `-`, `_`, `.`, alphanumeric at
/// both ends).
pub(crate) fn check_label_key(field: &str, key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(crate::api::common::is_node_name);
    if !prefix_ok || !label_name(name) {
        return Err(format!("{field}: {key:?} is not a valid label key"));
    }
    Ok(())
}

pub(crate) fn check_label_value(field: &str, key: &str, value: &str) -> Result<(), String> {
    if !value.is_empty() && !label_name(value) {
        return Err(format!(
            "{field}: {key}={value:?} is not a valid label value (at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends)"
        ));
    }
    Ok(())
}

/// A label name or value: 1 to 63 of `[A-Za-z0-9_.-]`, alphanumeric at
/// both ends.
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// One blocking-pod gate as its watch would be built: selector and
/// namespace (which reaches the URL path).
pub fn check_gate(gate: &crate::api::common::BlockingPods) -> Result<(), String> {
    check_selector_at("selector", &gate.selector)?;
    check_namespace("namespace", gate.namespace.as_deref())
}

/// A namespace at `field`, if given, is a valid namespace name (it
/// reaches a URL path).
fn check_namespace(field: &str, ns: Option<&str>) -> Result<(), String> {
    match ns {
        Some(ns) if !ns.is_empty() && !crate::api::common::is_dns_label(ns) => {
            Err(format!("{field}: {ns:?} is not a valid namespace name"))
        }
        _ => Ok(()),
    }
}

/// The pod selectors of a feature's gates and drain, checked like
/// [`check_selector`]: a pod selector that cannot be used makes the whole
/// object unusable (reported, nothing admitted), never "matches nothing"
/// (a blocking-pod gate that blocks nothing) or "matches everything".
pub fn check_pod_selectors(
    gates: &crate::api::common::Gates,
    drain: &crate::api::common::DrainSpec,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, b) in gates.blocking_pods.iter().enumerate() {
        if let Err(e) = check_selector_at(&format!("gates.blockingPods[{i}].selector"), &b.selector)
        {
            problems.push(e);
        }
        let field = format!("gates.blockingPods[{i}].namespace");
        if let Err(e) = check_namespace(&field, b.namespace.as_deref()) {
            problems.push(e);
        }
    }
    if let Some(sel) = &drain.pod_selector
        && let Err(e) = check_selector_at("drain.podSelector", sel)
    {
        problems.push(e);
    }
    // The health gate's lists carry these in their URL.
    for (i, w) in gates.health.iter().flat_map(|h| &h.workloads).enumerate() {
        if let Err(e) = check_selector_at(
            &format!("gates.health.workloads[{i}].selector"),
            &w.selector,
        ) {
            problems.push(e);
        }
        let field = format!("gates.health.workloads[{i}].namespace");
        if let Err(e) = check_namespace(&field, w.namespace.as_deref()) {
            problems.push(e);
        }
    }
    // A pattern that is not a regular expression makes the gate unusable.
    if let Some(gate) = &gates.prometheus
        && let Err(e) = blocking_alerts(gate, &Alerts::Active(Vec::new()))
    {
        problems.push(e);
    }
    problems
}

/// Does this NodeMaintenance hold its node against other features? A
/// Failed one does not: it ended without a drain to finish (invalid
/// options, a lease another holder has), and waiting for a person to
/// delete it would stall every feature on that node. Budgets still count
/// its node as unavailable until it is deleted.
pub fn holds_node(nm: &NodeMaintenance) -> bool {
    nm.phase() != Some(crate::api::nodemaintenance::Phase::Failed)
}

/// A live NodeMaintenance on `node` that holds it and is not `mine`:
/// another disruption took the node.
pub fn held_by_other<'a>(
    maintenances: &'a [Arc<NodeMaintenance>],
    node: &str,
    mine: impl Fn(&NodeMaintenance) -> bool,
) -> Option<&'a Arc<NodeMaintenance>> {
    maintenances
        .iter()
        .find(|m| m.spec.node_name == node && !m.is_deleting() && holds_node(m) && !mine(m))
}

/// Why an admission was withdrawn: another disruption took the node
/// before its NodeMaintenance was created (the create failed once, or the
/// hooks ran first). One owner per node; the node waits its turn again.
pub fn taken_meanwhile(other: &NodeMaintenance) -> String {
    format!(
        "in maintenance (NodeMaintenance {}) before its admission was carried out",
        other.name_any()
    )
}

/// Is this NodeMaintenance the one the `kind` object `owner` takes its
/// node with?
pub fn owned_by(nm: &NodeMaintenance, kind: &str, owner: &str) -> bool {
    owner_of(nm) == Some(kind)
        && nm
            .owner_references()
            .iter()
            .any(|o| o.kind == kind && o.name == owner)
}

/// `<prefix>-<node>`, with a stable hash suffix past the 253-character
/// limit of object names.
pub fn maintenance_name(prefix: &str, node: &str) -> String {
    let name = format!("{prefix}-{node}");
    if name.len() <= 253 {
        return name;
    }
    format!("{}-{:016x}", &name[..236], fnv(node.as_bytes()))
}

/// FNV-1a: a stable short hash for names past a length limit.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A controller owner reference to a cluster-scoped feature object.
pub fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K, kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into(),
        kind: kind.into(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The NodeMaintenance a feature takes `node` with: labelled and owned by
/// the feature object (deleting it gives its nodes back), the boot ID the
/// node was taken in recorded, the feature's drain options attached.
pub fn take(
    owner: OwnerReference,
    name: &str,
    node: &str,
    drain: &DrainSpec,
    boot: &str,
    reason: String,
) -> NodeMaintenance {
    let mut annotations = vec![
        (BOOT_ID_ANNOTATION, boot.to_string()),
        (DRAIN_TIMEOUT_ANNOTATION, drain.timeout_seconds.to_string()),
        (DRAIN_ON_TIMEOUT_ANNOTATION, drain.on_timeout.clone()),
    ];
    if let Some(g) = drain.grace_period_seconds {
        annotations.push((DRAIN_GRACE_ANNOTATION, g.to_string()));
    }
    if let Some(sel) = &drain.pod_selector
        && let Ok(json) = serde_json::to_string(sel)
    {
        annotations.push((DRAIN_POD_SELECTOR_ANNOTATION, json));
    }
    NodeMaintenance {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some([(OWNER_LABEL.to_string(), owner.kind.clone())].into()),
            annotations: Some(
                annotations
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: NodeMaintenanceSpec {
            node_name: node.to_string(),
            reason: Some(reason),
        },
        status: None,
    }
}

/// NodeMaintenances a `kind` object took nodes with whose owner is gone
/// (`live`: the `(name, uid)` of every such object there is): give those
/// nodes back. (The garbage collector would not: the medik8s finalizer
/// step makes the Node an owner too, and an object goes only when all its
/// owners are gone.)
pub fn orphans(
    maintenances: &[Arc<NodeMaintenance>],
    kind: &str,
    live: &[(String, Option<String>)],
) -> Vec<Effect> {
    maintenances
        .iter()
        .filter(|m| owner_of(m) == Some(kind) && !m.is_deleting())
        .filter(|m| {
            let owner = m.owner_references().iter().find(|o| o.kind == kind);
            owner.is_none_or(|o| {
                !live
                    .iter()
                    .any(|(name, uid)| *name == o.name && uid.as_deref() == Some(o.uid.as_str()))
            })
        })
        .filter_map(|m| {
            Some(Effect::DeleteMaintenance {
                nm: m.name_any(),
                uid: m.uid()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
