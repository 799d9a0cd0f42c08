//! What admissions read off a Node: its boot ID, Ready, schedulable, and
//! a reference to it for events.

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::ResourceExt;

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
