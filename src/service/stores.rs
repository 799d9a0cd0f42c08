//! What the loop decides from: one reflector store per watched kind, each
//! fed by our own watcher so that we see its first full list (readiness)
//! and its deletions (pruning the mutation cache), plus the mutation cache
//! itself ([`Fresh`]). RebootPolicies are watched in both roles: few
//! objects, and the node role needs its policy's sentinel and command.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodStatus, Volume};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use super::fresh::FreshCache;
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::runtime::Latch;

/// Each watched kind's first full list, as latches any number of tasks may
/// wait on (see [`Latch`] for why not `Store::wait_until_ready`).
#[derive(Clone, Default)]
pub struct Synced {
    pub nodes: Latch,
    pub pods: Latch,
    pub maintenances: Latch,
    pub policies: Latch,
}

impl Synced {
    pub async fn wait(&self) {
        self.nodes.wait().await;
        self.pods.wait().await;
        self.maintenances.wait().await;
        self.policies.wait().await;
    }
}

/// Our writes that the watches may not have delivered yet.
#[derive(Default)]
pub struct Fresh {
    pub nodes: FreshCache<Node>,
    pub maintenances: FreshCache<NodeMaintenance>,
    pub policies: FreshCache<RebootPolicy>,
}

/// The reflector stores the loop decides from.
pub struct Stores {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub maintenances: Store<NodeMaintenance>,
    pub policies: Store<RebootPolicy>,
    pub synced: Synced,
    pub fresh: Arc<Fresh>,
}

/// Watch an event stream on its way to the controller: open `latch` at the
/// first full list, and tell `forget` the name of every deleted object.
pub fn observe<K: kube::Resource>(
    ev: &Result<watcher::Event<K>, watcher::Error>,
    latch: &Latch,
    forget: impl Fn(&str),
) {
    match ev {
        Ok(watcher::Event::InitDone) => latch.open(),
        Ok(watcher::Event::Delete(obj)) => {
            if let Some(name) = obj.meta().name.as_deref() {
                forget(name)
            }
        }
        _ => {}
    }
}

/// Drop what the drain never reads (managed fields, container specs, status
/// details) before the pod enters the store: with 110 pods per node this is
/// most of the agent's memory.
pub fn slim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(ann) = pod.metadata.annotations.as_mut() {
        ann.retain(|k, _| k == crate::decide::drain::MIRROR_ANNOTATION);
    }
    if let Some(spec) = pod.spec.as_mut() {
        let keep = PodSpec {
            node_name: spec.node_name.take(),
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            priority: spec.priority,
            priority_class_name: spec.priority_class_name.take(),
            volumes: spec.volumes.take().map(|vs| {
                vs.into_iter()
                    .filter(|v| v.empty_dir.is_some())
                    .map(|v| Volume {
                        name: v.name,
                        empty_dir: v.empty_dir,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        };
        *spec = keep;
    }
    if let Some(status) = pod.status.as_mut() {
        *status = PodStatus {
            phase: status.phase.take(),
            ..Default::default()
        };
    }
}
