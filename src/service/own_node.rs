//! The node this cluster role runs on, and whether it may take it
//! (`decide::rollout::own_node_hold`): only when a replica of it runs on
//! another node to take over while this one is drained and rebooted, or
//! when the cluster has this one node (whose agent gives it back after
//! the reboot, `decide::reboot::node`).
//!
//! Read on demand, like a node's pods (`service::node_pods`): only when a
//! decision is about to take the own node. The own node is `$NODE_NAME`
//! (the manifests set it from the downward API); the replicas are the pods
//! in `$POD_NAMESPACE` with this pod's labels (`$POD_NAME`), the
//! Deployment's `pod-template-hash` aside, running on another node. A
//! cluster role outside a pod has no replica; one without `$NODE_NAME`
//! knows no node of its own and is not held.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::api::pod::Pod;
use crate::decide::rollout::OwnNode;
use kube::Client;

/// Where this process runs, from the downward API: its node, and its pod
/// (name and namespace) when it is one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Whereabouts {
    pub node: Option<String>,
    pub pod: Option<(String, String)>,
}

impl Whereabouts {
    /// From `$NODE_NAME`, `$POD_NAMESPACE` and `$POD_NAME`.
    pub fn from_env() -> Whereabouts {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Whereabouts {
            node: var("NODE_NAME"),
            pod: var("POD_NAMESPACE").zip(var("POD_NAME")),
        }
    }
}

/// Whether the cluster role may take `node` now, read from the API server.
/// A failed read holds the node, saying why (it is asked again next pass).
pub async fn read(client: &Client, here: &Whereabouts) -> OwnNode {
    let Some(own) = &here.node else {
        return OwnNode::NotOurs;
    };
    match replica_elsewhere(client, here, own).await {
        Ok(Some(pod)) => {
            log::debug!("own node {own}: replica {pod} runs elsewhere");
            return OwnNode::Free;
        }
        Ok(None) => {}
        Err(e) => {
            return OwnNode::Held(format!(
                "nodekeeper's cluster role runs on this node and could not read its replicas ({})",
                crate::error::kube_cause(&e)
            ));
        }
    }
    match alone(client).await {
        Ok(true) => OwnNode::Free,
        Ok(false) => OwnNode::Held(
            "nodekeeper's cluster role runs on this node and no replica of it runs on another node to take over (run two replicas, as the shipped Deployment does)"
                .into(),
        ),
        Err(e) => OwnNode::Held(format!(
            "nodekeeper's cluster role runs on this node and could not count the nodes ({})",
            crate::error::kube_cause(&e)
        )),
    }
}

/// A running replica of this pod on another node, by name.
async fn replica_elsewhere(
    client: &Client,
    here: &Whereabouts,
    own: &str,
) -> kube::Result<Option<String>> {
    let Some((namespace, name)) = &here.pod else {
        return Ok(None);
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // A list, not a get: the shipped identity lists pods (drains, gates)
    // and has no reason to get one.
    let mine = pods
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await?;
    let labels: BTreeMap<String, String> = mine
        .items
        .into_iter()
        .next()
        .and_then(|me| me.metadata.labels)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != "pod-template-hash")
        .collect();
    if labels.is_empty() {
        return Ok(None);
    }
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(list.items.into_iter().find_map(|p| {
        let node = p.spec.as_ref()?.node_name.as_deref()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (node != own && running && p.metadata.deletion_timestamp.is_none())
            .then(|| p.metadata.name.clone().unwrap_or_default())
    }))
}

/// Does the cluster have one node only (a list of at most two)?
async fn alone(client: &Client) -> kube::Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default().limit(2)).await?;
    Ok(list.items.len() == 1)
}
