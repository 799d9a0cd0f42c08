//! Whether a node may be taken now, and if not why it waits: windows,
//! Ready, blocking pods, Prometheus alerts, the budget ([`wait`]), with the
//! reasons a waiting node reports.

use std::sync::Arc;

use crate::api::node::Node;
use crate::api::pod::Pod;
use kube::ResourceExt;

use super::node_facts::*;
use crate::api::common::{Budget, Gates};
use crate::decide::budget::{self, Member};
use crate::decide::selector::*;

/// The first pod matching a blocking-pod gate, as `ns/name`: any pod on
/// the node but a finished one or one whose state is `Unknown`, as kured
/// asks (`status.phase!=Succeeded,status.phase!=Failed,
/// status.phase!=Unknown`, its `pkg/blockers/kubernetespod.go`).
pub fn blocking_pod(gates: &Gates, pods: &[Arc<Pod>]) -> Option<String> {
    let running = |pod: &Pod| {
        !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed" | "Unknown")
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
    /// Outside every window: when the next one opens, if known.
    pub window_opens: Option<k8s_openapi::jiff::Timestamp>,
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
        Some((
            WAIT_WINDOW,
            crate::decide::window::closed_message(a.what, a.window_opens),
        ))
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
