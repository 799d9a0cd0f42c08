//! Leases: the medik8s node lease (`medik8s-leases/node-<node>`, holder
//! `node-maintenance`) that NodeMaintenance holds so medik8s remediators
//! leave the node alone, and the leader lease of cluster mode. Writes use
//! the lease's resourceVersion, so two writers never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client};

use crate::api::nodemaintenance::{LEASE_HOLDER, LEASE_NAMESPACE, LEASE_SECONDS, lease_name};
use crate::error::{Error, Result};

/// Result of trying to take a lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Acquired {
    /// We hold it until the given time.
    Held { until: Timestamp },
    /// Someone else holds it and it has not expired.
    HeldBy(String),
}

fn expiry(l: &Lease) -> Option<Timestamp> {
    let spec = l.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    renewed
        .checked_add(SignedDuration::from_secs(
            spec.lease_duration_seconds.unwrap_or(0) as i64,
        ))
        .ok()
}

/// Take or renew `namespace/name` for `holder` for `seconds`.
pub async fn acquire(
    client: &Client,
    namespace: &str,
    name: &str,
    holder: &str,
    seconds: i32,
    owner: Option<OwnerReference>,
) -> Result<Acquired> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let now = Timestamp::now();
    let until = now
        .checked_add(SignedDuration::from_secs(seconds as i64))
        .unwrap_or(now);
    let ctx = || format!("taking lease {namespace}/{name}");
    match api.get_opt(name).await.map_err(Error::kube(ctx()))? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some(namespace.into()),
                    owner_references: owner.map(|o| vec![o]),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(holder.into()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Acquired::Held { until }),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    ensure_namespace(client, namespace).await?;
                    api.create(&PostParams::default(), &lease)
                        .await
                        .map_err(Error::kube(ctx()))?;
                    Ok(Acquired::Held { until })
                }
                Err(e) => Err(Error::kube(ctx())(e)),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            let current = spec.holder_identity.clone().unwrap_or_default();
            let expired = expiry(&lease).is_none_or(|t| t <= now);
            if current != holder && !current.is_empty() && !expired {
                return Ok(Acquired::HeldBy(current));
            }
            let spec = lease.spec.get_or_insert_with(Default::default);
            if current != holder {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(holder.into());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(MicroTime(now));
            // replace() carries resourceVersion: a concurrent writer gets a 409.
            api.replace(name, &PostParams::default(), &lease)
                .await
                .map_err(Error::kube(ctx()))?;
            Ok(Acquired::Held { until })
        }
    }
}

/// Delete the lease if `holder` holds it; a lease someone else holds is theirs.
pub async fn release(client: &Client, namespace: &str, name: &str, holder: &str) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let ctx = || format!("releasing lease {namespace}/{name}");
    let Some(lease) = api.get_opt(name).await.map_err(Error::kube(ctx()))? else {
        return Ok(());
    };
    if lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        != Some(holder)
    {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(ctx())(e)),
    }
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("creating namespace {name}"))(e)),
    }
}

/// Take or renew the medik8s lease of `node`, owned by the Node like NMO's.
pub async fn acquire_node_lease(
    client: &Client,
    node: &str,
    node_uid: Option<String>,
) -> Result<Acquired> {
    let owner = node_uid.map(|uid| OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid,
        ..Default::default()
    });
    acquire(
        client,
        LEASE_NAMESPACE,
        &lease_name(node),
        LEASE_HOLDER,
        LEASE_SECONDS,
        owner,
    )
    .await
}

/// Release the medik8s lease of `node` if NodeMaintenance holds it.
pub async fn release_node_lease(client: &Client, node: &str) -> Result<()> {
    release(client, LEASE_NAMESPACE, &lease_name(node), LEASE_HOLDER).await
}

/// Leader election for cluster mode: block until `identity` holds the lease,
/// then renew it every `renew` on a task; the returned receiver yields once
/// leadership is lost, when the caller must stop (like client-go, we exit
/// rather than risk two leaders).
pub async fn lead(
    client: Client,
    namespace: String,
    name: String,
    identity: String,
) -> Result<smol::channel::Receiver<()>> {
    const DURATION: i32 = 15;
    let renew = Duration::from_secs(5);
    loop {
        match acquire(&client, &namespace, &name, &identity, DURATION, None).await {
            Ok(Acquired::Held { .. }) => break,
            Ok(Acquired::HeldBy(other)) => {
                log::info!("waiting for leadership: lease {namespace}/{name} is held by {other}")
            }
            Err(e) => log::warn!("leader election: {e}"),
        }
        crate::runtime::sleep(renew).await;
    }
    log::info!("leading as {identity} (lease {namespace}/{name})");
    let (tx, rx) = smol::channel::bounded(1);
    crate::runtime::spawn(async move {
        let mut last_ok = std::time::Instant::now();
        loop {
            crate::runtime::sleep(renew).await;
            match acquire(&client, &namespace, &name, &identity, DURATION, None).await {
                Ok(Acquired::Held { .. }) => last_ok = std::time::Instant::now(),
                Ok(Acquired::HeldBy(other)) => {
                    log::error!("lost leadership to {other}");
                    break;
                }
                Err(e) if last_ok.elapsed() < Duration::from_secs(DURATION as u64 - 2) => {
                    log::warn!("renewing leadership: {e}")
                }
                Err(e) => {
                    log::error!("could not renew leadership in time: {e}");
                    break;
                }
            }
        }
        let _ = tx.send(()).await;
    })
    .detach();
    Ok(rx)
}
