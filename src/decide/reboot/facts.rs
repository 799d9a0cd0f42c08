//! What the reboot decisions read off nodes and NodeMaintenances, and the
//! objects and patches they write: need and pause markers (ours, the CoreOS
//! reboot operator's, FLUO's/CLUO's), boot IDs and the once-per-boot
//! record, the NodeMaintenance a policy takes a node with.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::nodemaintenance::{
    DRAIN_GRACE_ANNOTATION, DRAIN_ON_TIMEOUT_ANNOTATION, DRAIN_POD_SELECTOR_ANNOTATION,
    DRAIN_TIMEOUT_ANNOTATION, NodeMaintenance, NodeMaintenanceSpec, OWNER_LABEL,
};
use crate::api::reboot::*;
use crate::decide::drain::selector_matches;
use crate::decide::maintenance::{annotation, owner_of};

/// Does any of the supported signals say the node needs a reboot?
pub fn needs_reboot(node: &Node) -> bool {
    annotation(node, NEEDED_ANNOTATION).is_some()
        || annotation(node, COREOS_NEEDED_ANNOTATION).is_some()
        || [FLUO_PREFIX, CLUO_PREFIX]
            .iter()
            .any(|p| annotation(node, &format!("{p}reboot-needed")) == Some("true"))
}

/// When nodekeeper's own need marker was set, if it holds a time.
pub fn needed_since(node: &Node) -> Option<k8s_openapi::jiff::Timestamp> {
    annotation(node, NEEDED_ANNOTATION)?.parse().ok()
}

/// Is the node held by an administrator (`nodekeeper.io/reboot-paused`, or
/// FLUO's/CLUO's `reboot-paused`, set to "true")?
pub fn paused(node: &Node) -> bool {
    annotation(node, PAUSED_ANNOTATION) == Some("true")
        || [FLUO_PREFIX, CLUO_PREFIX]
            .iter()
            .any(|p| annotation(node, &format!("{p}reboot-paused")) == Some("true"))
}

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

/// Was a reboot issued in `boot`?
pub fn issued_in(node: &Node, boot: &str) -> bool {
    annotation(node, ISSUED_ANNOTATION) == Some(boot)
}

/// The failure of a reboot command in `boot`, if one was recorded.
pub fn failure_in<'a>(node: &'a Node, boot: &str) -> Option<&'a str> {
    annotation(node, FAILED_ANNOTATION)?
        .strip_prefix(boot)?
        .strip_prefix(": ")
}

/// The patch that clears every need marker we honour (FLUO's and CLUO's
/// are set to "false", as their agents do after a reboot).
pub fn clear_need_patch(node: &Node) -> serde_json::Value {
    let mut ann = serde_json::Map::new();
    for key in [NEEDED_ANNOTATION, COREOS_NEEDED_ANNOTATION] {
        if annotation(node, key).is_some() {
            ann.insert(key.into(), serde_json::Value::Null);
        }
    }
    let mut labels = serde_json::Map::new();
    for p in [FLUO_PREFIX, CLUO_PREFIX] {
        let key = format!("{p}reboot-needed");
        if annotation(node, &key) == Some("true") {
            ann.insert(key.clone(), json!("false"));
        }
        if node.labels().get(&key).map(String::as_str) == Some("true") {
            labels.insert(key, json!("false"));
        }
    }
    let mut meta = json!({ "annotations": ann });
    if !labels.is_empty() {
        meta["labels"] = serde_json::Value::Object(labels);
    }
    json!({ "metadata": meta })
}

/// Is this NodeMaintenance the one `policy` takes its node with?
pub fn owned_by(nm: &NodeMaintenance, policy: &str) -> bool {
    owner_of(nm) == Some(OWNER_KIND)
        && nm
            .owner_references()
            .iter()
            .any(|o| o.kind == OWNER_KIND && o.name == policy)
}

/// The name of the NodeMaintenance a policy takes `node` with.
pub fn maintenance_name(node: &str) -> String {
    let name = format!("reboot-{node}");
    if name.len() <= 253 {
        return name;
    }
    // FNV-1a: a stable short suffix for names past the limit.
    let h = node.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{}-{h:016x}", &name[..236])
}

/// The NodeMaintenance a policy takes a node with: owned by the policy
/// (deleting the policy gives its nodes back), the boot ID recorded, the
/// policy's drain options attached.
pub fn maintenance_for(p: &RebootPolicy, node: &Node, boot: &str) -> NodeMaintenance {
    let n = node.name_any();
    let owner = OwnerReference {
        api_version: RebootPolicy::api_version(&()).into(),
        kind: OWNER_KIND.into(),
        name: p.name_any(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut annotations = vec![
        (BOOT_ID_ANNOTATION, boot.to_string()),
        (
            DRAIN_TIMEOUT_ANNOTATION,
            p.spec.drain.timeout_seconds.to_string(),
        ),
        (DRAIN_ON_TIMEOUT_ANNOTATION, p.spec.drain.on_timeout.clone()),
    ];
    if let Some(g) = p.spec.drain.grace_period_seconds {
        annotations.push((DRAIN_GRACE_ANNOTATION, g.to_string()));
    }
    if let Some(sel) = &p.spec.drain.pod_selector
        && let Ok(json) = serde_json::to_string(sel)
    {
        annotations.push((DRAIN_POD_SELECTOR_ANNOTATION, json));
    }
    NodeMaintenance {
        metadata: ObjectMeta {
            name: Some(maintenance_name(&n)),
            labels: Some([(OWNER_LABEL.to_string(), OWNER_KIND.to_string())].into()),
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
            node_name: n,
            reason: Some(format!("reboot: {}", p.name_any())),
        },
        status: None,
    }
}

/// Expand `{node}` in an argv template. Arguments are never joined into a
/// shell string: a node name cannot inject a command.
pub fn argv(template: &[String], node: &str) -> Vec<String> {
    template.iter().map(|a| a.replace("{node}", node)).collect()
}

/// The first running pod matching a blocking-pod gate, as `ns/name`.
pub fn blocking_pod(p: &RebootPolicy, pods: &[Arc<Pod>]) -> Option<String> {
    let running = |pod: &Pod| {
        !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        )
    };
    p.spec.gates.blocking_pods.iter().find_map(|g| {
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

/// What the schema cannot check about a label selector: its operators.
pub fn check_selector(sel: &LabelSelector) -> Result<(), String> {
    for e in sel.match_expressions.iter().flatten() {
        match e.operator.as_str() {
            "In" | "NotIn" if e.values.as_ref().is_none_or(|v| v.is_empty()) => {
                return Err(format!(
                    "nodeSelector: {} {} needs values",
                    e.key, e.operator
                ));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "nodeSelector: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                ));
            }
        }
    }
    Ok(())
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
