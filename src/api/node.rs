//! A Node as nodekeeper holds it: the metadata, the spec fields a
//! disruption reads (taints, unschedulable, provider ID) and the status a
//! decision reads (conditions, system info, addresses, attached volumes).
//! It is deserialized straight from the API's JSON (serde skips the rest:
//! the images a real kubelet lists, capacity, daemon endpoints, …), so the
//! rest of a node never reaches memory.
//!
//! Why not `k8s_openapi`'s `Node` with the unread parts cleared (as
//! `service::watch::slim_node` did): that struct is 1 552 bytes before any
//! of its strings, every optional field of its spec and status inline, and
//! the cluster role holds every node of the cluster: at 5 000 nodes the
//! node store was 29 MiB of its 64 MiB limit (`just bench-scale`). This
//! one is under half of that. Field names follow the API (and
//! `k8s_openapi`), so code reads `node.status.as_ref()?.conditions` either
//! way, and the parts it keeps are `k8s_openapi`'s own types.
//!
//! Nodes are only ever written by merge patch, never replaced from this
//! copy, so nothing it leaves out can be lost.

use k8s_openapi::api::core::v1::{
    AttachedVolume, NodeAddress, NodeCondition, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// The parts of a Node nodekeeper reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct Node {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<NodeSpec>,
    pub status: Option<NodeStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct NodeSpec {
    /// The cloud's name of the instance (replacement asks the provider by it).
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    pub taints: Option<Vec<Taint>>,
    /// Cordoned.
    pub unschedulable: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub conditions: Option<Vec<NodeCondition>>,
    /// Boot ID and versions.
    pub node_info: Option<NodeSystemInfo>,
    /// The cluster role keeps only the `InternalIP` ones
    /// (`service::watch::slim_node`): a control plane's etcd member is
    /// named by it.
    pub addresses: Option<Vec<NodeAddress>>,
    /// What the attach/detach controller reports attached (the wait for
    /// volumes before a reboot, `decide::volumes`).
    pub volumes_attached: Option<Vec<AttachedVolume>>,
}

core_v1_kind!(Node, "Node", "nodes", k8s_openapi::ClusterResourceScope);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_decisions_need_from_a_full_node_and_skips_the_rest() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {"a": "b"}, "annotations": {"x": "y"}, "uid": "u"},
            "spec": {"unschedulable": true, "providerID": "kwok://n1", "podCIDR": "10.0.0.0/24",
                "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"bootID": "b1", "kubeletVersion": "v1.37.1", "machineID": "", "systemUUID": "",
                    "kernelVersion": "6.1", "osImage": "Debian", "containerRuntimeVersion": "", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "volumesAttached": [{"name": "kubernetes.io/csi/d^v", "devicePath": ""}],
                "capacity": {"cpu": "4"}, "images": [{"names": ["i"]}], "phase": "Running",
            },
        }))
        .unwrap_or_default();
        let spec = node.spec.clone().unwrap_or_default();
        assert_eq!(spec.provider_id.as_deref(), Some("kwok://n1"));
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.map(|t| t.len()), Some(1));
        let status = node.status.clone().unwrap_or_default();
        assert_eq!(
            status.conditions.map(|c| c[0].type_.clone()).as_deref(),
            Some("Ready")
        );
        let info = status.node_info.unwrap_or_default();
        assert_eq!(
            (info.boot_id.as_str(), info.os_image.as_str()),
            ("b1", "Debian")
        );
        assert_eq!(
            status.addresses.map(|a| a[0].address.clone()).as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(status.volumes_attached.map(|v| v.len()), Some(1));
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        assert!(
            std::mem::size_of::<Node>() * 2
                < std::mem::size_of::<k8s_openapi::api::core::v1::Node>(),
            "{} bytes",
            std::mem::size_of::<Node>()
        );
    }
}
