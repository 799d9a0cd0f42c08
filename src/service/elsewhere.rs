//! Which of a drained node's pods another node could run, read when a
//! reboot's or upgrade's maintenance asks ([`crate::decide::elsewhere`]).
//!
//! The cluster role that sees every node answers from its node store. A
//! node agent watches only its own node, and a pool's cluster role only
//! its pool, so those read the nodes: a paged list, asking each page only
//! about the pods no earlier page could take, and stopping once every pod
//! has a place (in a cluster of many nodes, the first page). The answer is
//! kept for 30 s per node (`HomesCache` in `service::context`), so a drain's many reconciles read once.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::api::node::Node;
use kube::Client;
use kube::api::{Api, ListParams};

use super::context::Context;
use crate::api::pod::Pod;
use crate::decide::elsewhere::{Homes, homeless};

/// Nodes per page of the list (a real kubelet's Node, with its image
/// list, is tens of KB; a node agent's memory is counted in MB).
const PAGE: u32 = 25;
/// How long the paged read may take before the drain goes on without it.
const READ_BOUND: std::time::Duration = std::time::Duration::from_secs(15);

/// Ask about `uids` (pods of `node`) and return everything known for the
/// node. A failed read counts every pod as having a place: the drain
/// evicts them, as it did before this question existed.
pub async fn read(ctx: &Context, node: &str, pods: &[Arc<Pod>], uids: &[String]) -> Homes {
    let asked: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
        .map(|p| p.as_ref())
        .collect();
    let found = if ctx.scope.sees_all_nodes() {
        let nodes = ctx.all_nodes();
        let nodes: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        homeless(asked.iter().copied(), &nodes, node)
    } else {
        // Bounded: the drain's reconcile waits for this answer, and a list
        // that hangs (a connection gone quiet) must not hold the drain.
        match crate::runtime::timeout(READ_BOUND, listed(ctx, node, &asked)).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                log::warn!(
                    "node {node}: cannot tell whether other nodes could run its pods ({e}); evicting them"
                );
                BTreeSet::new()
            }
            Err(()) => {
                log::warn!(
                    "node {node}: reading the other nodes took over {} s; evicting its pods",
                    READ_BOUND.as_secs()
                );
                BTreeSet::new()
            }
        }
    };
    ctx.homes.add(
        node,
        Homes {
            asked: uids.iter().cloned().collect(),
            homeless: found,
        },
    )
}

/// The paged read: each page asked only about the pods still without a
/// place.
async fn listed(ctx: &Context, node: &str, pods: &[&Pod]) -> kube::Result<BTreeSet<String>> {
    let mut left: Vec<&Pod> = pods.to_vec();
    pages(&ctx.effects.client, |nodes| {
        let without = homeless(left.iter().copied(), nodes, node);
        left.retain(|p| p.metadata.uid.as_ref().is_some_and(|u| without.contains(u)));
        !left.is_empty()
    })
    .await?;
    Ok(left.iter().filter_map(|p| p.metadata.uid.clone()).collect())
}

/// Every node, 25 at a time, each page shown to `more` until it
/// says it needs no more (`false`) or the list ends.
pub async fn pages(client: &Client, mut more: impl FnMut(&[&Node]) -> bool) -> kube::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut params = ListParams {
        limit: Some(PAGE),
        ..Default::default()
    };
    loop {
        let page = api.list(&params).await?;
        let nodes: Vec<&Node> = page.items.iter().collect();
        let go_on = more(&nodes);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) if go_on => params.continue_token = Some(token),
            _ => return Ok(()),
        }
    }
}
