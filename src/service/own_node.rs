//! The node this cluster role runs on, and whether it may take it
//! (`decide::rollout::own_node_hold`): only when a replica of it runs on
//! another node to take over while this one is drained and rebooted, or
//! when no other node could ever run it: the cluster has this one node, or
//! the cluster role's pod is pinned to it by its node selector, required
//! affinity or lasting taints (the k3s and Talos edge, and a cluster role
//! placed on one machine). Its own pod is then evicted with the rest and
//! waits Pending; the node's agent gives the node back after the reboot
//! (`decide::reboot::node`), or after an upgrade it ran with nothing left
//! for the cluster role (`decide::upgrade::node::agent_gives_back`). Any
//! other upgrade waits where the drain evicts the cluster role's pod
//! (`OwnNode::Evicted`), as no one would give its node back; a static pod
//! or host service is not evicted. A cordoned or NotReady other node, or
//! one under maintenance, is not a reason: it comes back, and the own node
//! waits for it.
//!
//! Read on demand, like a node's pods (`service::node_pods`): only when a
//! decision is about to take the own node. The own node is `$NODE_NAME`
//! (the manifests set it from the downward API); the replicas are the pods
//! in `$POD_NAMESPACE` with this pod's labels (`$POD_NAME`), the
//! Deployment's `pod-template-hash` aside, running on another node. A
//! cluster role outside a pod has no replica and could run on any other
//! node; one without `$NODE_NAME` knows no node of its own and is not
//! held.

use std::collections::BTreeMap;

use crate::api::node::Node;
use kube::api::{Api, ListParams};

use super::context::{Context, Whereabouts};
use crate::api::pod::Pod;
use crate::decide::elsewhere::could_ever_run;
use crate::decide::rollout::OwnNode;
use kube::{Client, ResourceExt};

/// Whether the cluster role may take its own node now, read from the API
/// server (its nodes from the store when it sees every node). A failed
/// read holds the node, saying why (it is asked again next pass).
pub async fn read(ctx: &Context) -> OwnNode {
    let here = &ctx.whereabouts;
    let client = &ctx.effects.client;
    let Some(own) = &here.node else {
        return OwnNode::NotOurs;
    };
    let held = |what: &str, e: &kube::Error| {
        OwnNode::Held(format!(
            "nodekeeper's cluster role runs on this node and could not read {what} ({})",
            crate::error::kube_cause(e)
        ))
    };
    let mine = match own_pod(client, here).await {
        Ok(p) => p,
        Err(e) => return held("its own pod", &e),
    };
    match replica_elsewhere(client, here, mine.as_ref(), own).await {
        Ok(Some(pod)) => {
            log::debug!("own node {own}: replica {pod} runs elsewhere");
            return OwnNode::Free;
        }
        Ok(None) => {}
        Err(e) => return held("its replicas", &e),
    }
    match could_move(ctx, mine.as_ref(), own).await {
        Ok(false) if mine.as_ref().is_some_and(evicted) => OwnNode::Evicted(
            "nodekeeper's cluster role runs on this node, no other node could run it, and a drain evicts its pod: its agent gives the node back only after a reboot or an upgrade it finishes alone (no after hooks, no Job), so this would leave the node cordoned with the cluster role Pending (run it as a static pod or host service here, or let it run elsewhere)"
                .into(),
        ),
        Ok(false) => {
            log::debug!("own node {own}: no other node could ever run this cluster role");
            OwnNode::Free
        }
        Ok(true) => OwnNode::Held(
            "nodekeeper's cluster role runs on this node and no replica of it runs on another node to take over (run two replicas, as the shipped Deployment does)"
                .into(),
        ),
        Err(e) => held("the nodes", &e),
    }
}

/// Does a drain evict this pod (not a static pod's mirror, not a
/// DaemonSet's)?
fn evicted(pod: &Pod) -> bool {
    !matches!(
        crate::decide::drain::fate(pod, None),
        crate::decide::drain::Fate::Skip(_)
    )
}

/// This process's own pod, when it is one (a list, not a get: the shipped
/// identity lists pods, for drains and gates, and has no reason to get
/// one).
async fn own_pod(client: &Client, here: &Whereabouts) -> kube::Result<Option<Pod>> {
    let Some((namespace, name)) = &here.pod else {
        return Ok(None);
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mine = pods
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await?;
    Ok(mine.items.into_iter().next())
}

/// A running replica of `mine` on another node, by name.
async fn replica_elsewhere(
    client: &Client,
    here: &Whereabouts,
    mine: Option<&Pod>,
    own: &str,
) -> kube::Result<Option<String>> {
    let (Some((namespace, _)), Some(mine)) = (&here.pod, mine) else {
        return Ok(None);
    };
    let labels: BTreeMap<&String, &String> = mine
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| *k != "pod-template-hash")
        .collect();
    if labels.is_empty() {
        return Ok(None);
    }
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(list.items.into_iter().find_map(|p| {
        let node = p.spec.as_ref()?.node_name.as_deref()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (node != own && running && p.metadata.deletion_timestamp.is_none())
            .then(|| p.metadata.name.clone().unwrap_or_default())
    }))
}

/// Could a replica ever run on another node: is there another node at all
/// (outside a pod), or one whose labels and lasting taints admit the own
/// pod (`decide::elsewhere::could_ever_run`: a cordon or NotReady passes,
/// a pod pinned to this node by its selector or affinity never moves)?
/// Answered from the store by a cluster role that sees every node, else
/// from pages of the node list, stopping at the first such node.
async fn could_move(ctx: &Context, mine: Option<&Pod>, own: &str) -> kube::Result<bool> {
    let home = |n: &Node| n.name_any() != own && mine.is_none_or(|p| could_ever_run(p, n));
    if ctx.scope.sees_all_nodes() {
        return Ok(ctx.all_nodes().iter().any(|n| home(n)));
    }
    let mut found = false;
    super::elsewhere::pages(&ctx.effects.client, |nodes| {
        found = nodes.iter().any(|n| home(n));
        !found
    })
    .await?;
    Ok(found)
}
