//! The pods of the nodes a reboot or upgrade decision is about to admit,
//! for Karpenter's `karpenter.sh/do-not-disrupt` (`decide::do_not_disrupt`).
//!
//! The cluster role holds no pods but those of nodes it drains, so a
//! decision that would take a node asks for its pods (`Snapshot::node_pods`
//! answers `None`); the pass then lists the pods of every node asked about,
//! once each, from the API server's watch cache, and decides again. Only
//! nodes every other limit admits are asked about, so a pass reads a
//! budget's worth of nodes, not the cluster; a waiting decision asks again
//! on its next pass. The decision stays pure: it reads a snapshot; this
//! module answers what it could not. A read answers for a second
//! (`PodWatches::recently_read`): the passes of one burst share it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use super::context::Context;
use crate::api::pod::Pod;
use crate::decide::rollout::OwnNode;
use crate::runtime::lock;

/// Decides again after reading the nodes asked about, at most this many
/// times in one pass (each time at least one node more was read; a node a
/// do-not-disrupt pod holds lets the next one be asked about).
const ROUNDS: usize = 4;

/// What a decision asks of the node's pods.
pub type NodePods<'a> = dyn Fn(&str) -> Option<Vec<Arc<Pod>>> + Sync + 'a;
/// What a decision asks of the node the cluster role runs on.
pub type OwnNodeAsk<'a> = dyn Fn(&str) -> OwnNode + Sync + 'a;

/// Run `decide` with every node's pods this pass can know, reading the
/// nodes it asks about and deciding again while it asks for more; and
/// likewise whether the node this cluster role runs on may be taken
/// (`service::own_node`).
pub async fn deciding<P>(ctx: &Context, decide: impl Fn(&NodePods, &OwnNodeAsk) -> P) -> P {
    let pods = Known {
        ctx,
        read: Mutex::default(),
        asked: Mutex::default(),
        own: Mutex::new(None),
        own_asked: Default::default(),
    };
    let mut plan = decide(&|n| pods.get(n), &|n| pods.own(n));
    for _ in 0..ROUNDS {
        if !pods.read_asked().await {
            break;
        }
        plan = decide(&|n| pods.get(n), &|n| pods.own(n));
    }
    plan
}

struct Known<'c> {
    ctx: &'c Context,
    /// Nodes read in this pass.
    read: Mutex<HashMap<String, Vec<Arc<Pod>>>>,
    /// Nodes asked about and not known.
    asked: Mutex<BTreeSet<String>>,
    /// Whether the own node may be taken, once read in this pass.
    own: Mutex<Option<OwnNode>>,
    own_asked: std::sync::atomic::AtomicBool,
}

impl Known<'_> {
    fn own(&self, node: &str) -> OwnNode {
        if self.ctx.whereabouts.node.as_deref() != Some(node) {
            return OwnNode::NotOurs;
        }
        if let Some(known) = lock(&self.own).clone() {
            return known;
        }
        self.own_asked
            .store(true, std::sync::atomic::Ordering::Relaxed);
        OwnNode::Unknown
    }

    fn get(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        if let Some(pods) = self.ctx.pods.known_on(node) {
            return Some(pods);
        }
        if let Some(pods) = self.ctx.pods.recently_read(node) {
            return Some(pods);
        }
        if let Some(pods) = lock(&self.read).get(node) {
            return Some(pods.clone());
        }
        lock(&self.asked).insert(node.to_string());
        None
    }

    /// Read the nodes asked about since the last call; whether any was.
    async fn read_asked(&self) -> bool {
        let asked = std::mem::take(&mut *lock(&self.asked));
        let mut any = false;
        if self
            .own_asked
            .swap(false, std::sync::atomic::Ordering::Relaxed)
            && lock(&self.own).is_none()
        {
            let answer = super::own_node::read(self.ctx).await;
            *lock(&self.own) = Some(answer);
            any = true;
        }
        for node in asked {
            if lock(&self.read).contains_key(&node) {
                continue;
            }
            // A failed list leaves the node unread: it waits, saying so.
            if let Some(pods) = read_on(self.ctx, &node).await {
                lock(&self.read).insert(node, pods);
                any = true;
            }
        }
        any
    }
}

/// How long one read of a node's pods may take.
const READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Every pod on `node`, read once: a list from the API server's watch
/// cache, no watch started. `None` when it failed (the node waits, saying
/// its pods are not read) or in the node role, which holds only its own
/// node's pods and never admits.
///
/// An identity refused a cluster-wide list of pods (403: not the shipped
/// RBAC, which grants it) gets no pods here, logged once: the node is
/// taken without the admission's check, and the drain still holds an
/// opted-out pod (the node's agent, or the drain's own watch, reads it).
async fn read_on(ctx: &Context, node: &str) -> Option<Vec<Arc<Pod>>> {
    let api: kube::Api<Pod> = kube::Api::all(ctx.pods.client()?.clone());
    let params = kube::api::ListParams {
        field_selector: Some(format!("spec.nodeName={node}")),
        resource_version: Some("0".into()),
        version_match: Some(kube::api::VersionMatch::NotOlderThan),
        ..Default::default()
    };
    // Bounded: the read holds one of the few `READS` permits every node's
    // first look also waits for.
    let read = {
        let _permit = super::pod_watches::READS.acquire().await;
        crate::runtime::timeout(READ_DEADLINE, api.list(&params)).await
    };
    let Ok(read) = read else {
        log::debug!(
            "reading the pods on node {node}: no answer within {} s",
            READ_DEADLINE.as_secs()
        );
        return None;
    };
    match read {
        Ok(list) => {
            let pods: Vec<Arc<Pod>> = list.items.into_iter().map(Arc::new).collect();
            ctx.pods.remember_read(node, &pods);
            Some(pods)
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            static TOLD: std::sync::Once = std::sync::Once::new();
            TOLD.call_once(|| {
                log::warn!(
                    "may not list pods across namespaces ({}): karpenter.sh/do-not-disrupt on pods is checked by drains only, not before a node is taken",
                    crate::error::first_line(&status.message)
                )
            });
            Some(Vec::new())
        }
        Err(e) => {
            log::debug!("reading the pods on node {node}: {e}");
            None
        }
    }
}
