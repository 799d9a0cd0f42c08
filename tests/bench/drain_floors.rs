//! The benchmark's own drainers for `just bench-drain`, the rows nodekeeper
//! is measured against: **the floor** (every eviction at once, nothing
//! else) and **the protocol** (the writes every NMO-compatible drain
//! makes, in order, with nothing decided in between). Neither runs a
//! nodekeeper or NMO process; both use the benchmark identity, so the audit
//! log counts their requests like every other row's.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, Phase};
use smol::stream::StreamExt;

use super::support::{self, audit_ids_since};
use super::{Run, cordon};

/// The floor: cordon `node` (before the clock, so the replacements land on
/// the other node), then send an eviction for every pod on it at once over
/// `evictor` (one HTTP/2 connection), each sent again after 50 ms until the
/// server accepts it, and time the last pod gone as [`super::measure`] does. No
/// list of our own (the watch's list gives the names before the clock), no
/// decision, no status.
pub async fn floor(client: &Client, evictor: &Client, node: &str, audit: &std::path::Path) -> Run {
    let nodes: Api<Node> = Api::all(client.clone());
    cordon(&nodes, node, true).await;
    let pod_wc = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut pod_events = Box::pin(watcher::watcher(Api::<Pod>::all(client.clone()), pod_wc));
    let mut on_node = std::collections::HashMap::new();
    while let Some(ev) = pod_events.next().await {
        match ev {
            Ok(Event::InitApply(p)) if p.metadata.deletion_timestamp.is_none() => {
                on_node.insert(p.name_any(), p.namespace().unwrap_or_default());
            }
            Ok(Event::InitDone) => break,
            _ => {}
        }
    }
    let audit_start = support::audit_offset_of(audit);
    let start = Instant::now();
    let evictions = evict_all(evictor, on_node.iter());
    while let Some(ev) = pod_events.next().await {
        if let Ok(Event::Delete(p)) = ev {
            on_node.remove(&p.name_any());
            if on_node.is_empty() {
                break;
            }
        }
    }
    let gone = start.elapsed();
    for e in evictions {
        e.await;
    }
    Run {
        cordon: Duration::ZERO,
        last_pod_gone: gone,
        drained: gone,
        requests: audit_ids_since(audit, audit_start),
        pod_watches: 0,
        cpu_ms: 0.0,
        apiserver_cpu_ms: 0.0,
        bytes: 0,
        to_first_eviction: None,
    }
}

/// An eviction for every pod at once over `evictor`, each sent again after
/// 50 ms until the server accepts it (or the pod is gone).
fn evict_all<'a>(
    evictor: &Client,
    pods: impl Iterator<Item = (&'a String, &'a String)>,
) -> Vec<smol::Task<()>> {
    pods.map(|(name, ns)| {
        let api: Api<Pod> = Api::namespaced(evictor.clone(), ns);
        let name = name.clone();
        nodekeeper::runtime::spawn(async move {
            loop {
                match api.evict(&name, &kube::api::EvictParams::default()).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 404 => return,
                    Err(_) => nodekeeper::runtime::sleep(Duration::from_millis(50)).await,
                }
            }
        })
    })
    .collect()
}

/// The benchmark as a drainer ([`Who::Protocol`]): its client (the
/// benchmark identity, so the audit log counts its requests) and where its
/// lease goes.
#[derive(Clone, Copy)]
pub struct Drainer<'a> {
    pub client: &'a Client,
    pub lease_namespace: &'a str,
}

/// The writes an NMO-compatible drain of `node` for maintenance `nm` makes,
/// each after the one before, with nothing decided in between: the
/// finalizer and the node's lease together, the cordon and the drain taint,
/// the first status (Running, the pending pods' names and references, as
/// NMO writes it), every eviction at once, and Succeeded once `all_gone`
/// says the last pod is gone. No events, no node conditions: nodekeeper's
/// own additions, which its rows include.
pub async fn protocol(
    d: Drainer<'_>,
    nm: &str,
    node: &str,
    pods: &[(String, String)],
    all_gone: smol::channel::Receiver<()>,
) {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use nodekeeper::api::nodemaintenance::{FINALIZER, NodeMaintenanceStatus, PodReference};
    let merge = |v: serde_json::Value| kube::api::Patch::Merge(v);
    let params = kube::api::PatchParams::default();
    let nms: Api<NodeMaintenance> = Api::all(d.client.clone());
    let nodes: Api<Node> = Api::all(d.client.clone());
    let leases: Api<Lease> = Api::namespaced(d.client.clone(), d.lease_namespace);
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("node-{node}")),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("bench".into()),
            lease_duration_seconds: Some(3600),
            ..Default::default()
        }),
    };
    let finalizer = serde_json::json!({"metadata": {"finalizers": [FINALIZER]}});
    let (f, l) = smol::future::zip(
        nms.patch(nm, &params, &merge(finalizer)),
        leases.create(&PostParams::default(), &lease),
    )
    .await;
    f.expect("the protocol's finalizer");
    l.expect("the protocol's lease");
    let cordon = serde_json::json!({"spec": {"unschedulable": true,
        "taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]}});
    nodes
        .patch(node, &params, &merge(cordon))
        .await
        .expect("the protocol's cordon");
    let mut refs: Vec<PodReference> = pods
        .iter()
        .map(|(name, namespace)| PodReference {
            namespace: namespace.clone(),
            name: name.clone(),
        })
        .collect();
    refs.sort();
    let n = refs.len() as i32;
    let first = NodeMaintenanceStatus {
        phase: Some(Phase::Running),
        drain_progress: Some(0),
        total_pods: Some(n),
        eviction_pods: Some(n),
        pending_pods: Some(refs.iter().map(|r| r.name.clone()).collect()),
        pending_count: Some(n),
        pending_pods_refs: Some(refs),
        error_on_lease_count: Some(0),
        ..Default::default()
    };
    nms.patch_status(nm, &params, &merge(serde_json::json!({ "status": first })))
        .await
        .expect("the protocol's first status");
    let evictions = evict_all(d.client, pods.iter().map(|(name, ns)| (name, ns)));
    let _ = all_gone.recv().await;
    let done = serde_json::json!({"status": {"phase": "Succeeded", "drainProgress": 100,
        "pendingPods": [], "pendingPodsRefs": [], "pendingCount": 0}});
    nms.patch_status(nm, &params, &merge(done))
        .await
        .expect("the protocol's Succeeded");
    for e in evictions {
        e.await;
    }
}

/// Undo what [`protocol`] did (no agent runs to do it): the finalizer, the
/// maintenance, the cordon and taint, the lease.
pub async fn protocol_undo(
    client: &Client,
    id: &str,
    run: usize,
    node: &str,
    lease_namespace: &str,
) {
    let merge = |v: serde_json::Value| kube::api::Patch::Merge(v);
    let params = kube::api::PatchParams::default();
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let name = format!("{id}-run{run}");
    nms.patch(
        &name,
        &params,
        &merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("removing the protocol's finalizer");
    nms.delete(&name, &DeleteParams::default())
        .await
        .expect("deleting the protocol's maintenance");
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &params,
            &merge(serde_json::json!({"spec": {"unschedulable": null, "taints": null}})),
        )
        .await
        .expect("uncordoning after the protocol");
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), lease_namespace)
        .delete(&format!("node-{node}"), &DeleteParams::default())
        .await
        .expect("deleting the protocol's lease");
}
