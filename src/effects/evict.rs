//! Draining's side effects: one eviction (or delete) request per pod, sent
//! concurrently (bounded), each guarded by the pod's UID so a replacement with the same
//! name is never hit. The pod's own grace period applies unless the
//! NodeMaintenance's owner set one (`nodekeeper.io/drain-grace-period-seconds`).

use std::sync::Arc;

use crate::api::pod::Pod;
use kube::api::{DeleteParams, EvictParams, Preconditions};
use kube::{Api, Client, ResourceExt};

use crate::decide::drain::{Fate, Removal as Outcome};
use crate::error::kube_cause;
use crate::runtime;

/// Evictions in flight at once over HTTP/1.1, where each holds a TLS
/// connection of its own: unbounded, a 110-pod drain took 0.84 s but peak
/// RSS reached 11.4 MiB; 16 gave 8.5 MiB but 1.74 s; 32 gave 8.7 MiB and
/// 1.08 s.
pub const HTTP1_IN_FLIGHT: usize = 32;
/// Evictions in flight at once over HTTP/2, where they are streams of one
/// connection: a node's whole drain (110, the kubelet's default pod
/// limit). kube-apiserver allows 100 streams per connection (the default
/// of `--http2-max-streams-per-connection`) and the watches hold a few, so
/// about 95 go at once and hyper sends the rest as the first are answered.
/// `just bench-drain`, 110 pods, Succeeded's median in one 7-round batch:
/// 32 in flight 1216 ms, 90 in flight 774 ms, 110 in flight 670 ms; two
/// connections more for the evictions alone (all 110 at once) made no
/// difference beyond the spread of batches: the API server's CPU is the
/// limit by then. Peak RSS 8.6–9.4 MiB in all.
pub const HTTP2_IN_FLIGHT: usize = 110;

/// The evictions and deletions one process keeps in flight, shared by
/// every drain it runs: a cluster role drains up to 128 nodes at once on
/// one HTTP/2 connection, and a limit per drain let 128 × 110 requests
/// queue behind the server's stream limit, watches and all.
#[derive(Clone)]
pub struct Permits(Arc<smol::lock::Semaphore>);

impl Permits {
    pub fn new(in_flight: usize) -> Permits {
        Permits(Arc::new(smol::lock::Semaphore::new(in_flight.max(1))))
    }
}

/// Evict or delete every pod, within the process's permits; results in
/// input order.
pub async fn drain_pods(
    client: &Client,
    pods: &[(Arc<Pod>, Fate)],
    grace_period: Option<i64>,
    permits: &Permits,
) -> Vec<Outcome> {
    let mut tasks = Vec::with_capacity(pods.len());
    for (pod, fate) in pods {
        // The permit is taken before the task exists, not inside it: a
        // cluster role given 100 NodeMaintenances at once spawned all
        // 3 000 evictions up front, each a 2 KB task waiting for one of
        // 110 permits (6 MiB of its heap at the peak, `just bench-scale`).
        let permit = permits.0.acquire_arc().await;
        let (client, pod, fate) = (client.clone(), pod.clone(), fate.clone());
        tasks.push(runtime::spawn(async move {
            let _permit = permit;
            remove(&client, &pod, &fate, grace_period).await
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

async fn remove(client: &Client, pod: &Pod, fate: &Fate, grace_period: Option<i64>) -> Outcome {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        grace_period_seconds: grace_period.map(|g| g.clamp(0, i64::from(u32::MAX)) as u32),
        ..Default::default()
    };
    let res = match fate {
        // The answer (the pod, now terminating) is read as our slim type.
        Fate::Delete(_) => Api::<Pod>::namespaced(client.clone(), &ns)
            .delete(&name, &dp)
            .await
            .map(|_| ()),
        // `evict` is kube's method on the full pod type's API; it answers a
        // Status, so no full pod is ever deserialized.
        _ => Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
            .evict(
                &name,
                &EvictParams {
                    delete_options: Some(dp),
                    ..Default::default()
                },
            )
            .await
            .map(|_| ()),
    };
    match res {
        Ok(()) => Outcome::Accepted,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Outcome::Gone,
        Err(kube::Error::Api(s)) if s.code == 429 => Outcome::Refused(refusal(&s)),
        Err(e) => Outcome::Refused(kube_cause(&e)),
    }
}

/// "Cannot evict pod as it would violate the pod's disruption budget. (The
/// disruption budget web needs 2 healthy pods and has 2 currently)": the
/// API's message with its causes, which name the PDB.
fn refusal(s: &kube::core::Status) -> String {
    let causes: Vec<&str> = s
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| c.message.as_str())
                .filter(|m| !m.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if causes.is_empty() {
        s.message.clone()
    } else {
        format!(
            "{} ({})",
            s.message.trim_end_matches('.'),
            causes.join("; ")
        )
    }
}
