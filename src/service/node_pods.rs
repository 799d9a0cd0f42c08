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
//! module answers what it could not.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use super::context::Context;
use crate::api::pod::Pod;
use crate::runtime::lock;

/// Decides again after reading the nodes asked about, at most this many
/// times in one pass (each time at least one node more was read; a node a
/// do-not-disrupt pod holds lets the next one be asked about).
const ROUNDS: usize = 4;

/// Run `decide` with every node's pods this pass can know, reading the
/// nodes it asks about and deciding again while it asks for more.
pub async fn deciding<P>(
    ctx: &Context,
    decide: impl Fn(&dyn Fn(&str) -> Option<Vec<Arc<Pod>>>) -> P,
) -> P {
    let pods = Known {
        ctx,
        read: Mutex::default(),
        asked: Mutex::default(),
    };
    let mut plan = decide(&|n| pods.get(n));
    for _ in 0..ROUNDS {
        if !pods.read_asked().await {
            break;
        }
        plan = decide(&|n| pods.get(n));
    }
    plan
}

struct Known<'c> {
    ctx: &'c Context,
    /// Nodes read in this pass.
    read: Mutex<HashMap<String, Vec<Arc<Pod>>>>,
    /// Nodes asked about and not known.
    asked: Mutex<BTreeSet<String>>,
}

impl Known<'_> {
    fn get(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        if let Some(pods) = self.ctx.pods.known_on(node) {
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

/// Every pod on `node`, read once: a list from the API server's watch
/// cache, no watch started. `None` when it failed (logged) or in the node
/// role, which holds only its own node's pods and never admits.
async fn read_on(ctx: &Context, node: &str) -> Option<Vec<Arc<Pod>>> {
    let api = kube::Api::all(ctx.pods.client()?.clone());
    let config = kube::runtime::watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let what = format!("pods on node {node}");
    let (pods, _) = super::pod_watches::list_from_cache(&api, &config, &what).await?;
    Some(pods.into_iter().map(Arc::new).collect())
}
