//! Leases: the medik8s node lease (`medik8s-leases/node-<node>`, holder
//! `node-maintenance`) that NodeMaintenance holds so medik8s remediators
//! leave the node alone, and the taking of cluster mode's leader lease
//! (its election and hand-over are `service::leader`'s, the gate [`super::gate`]'s). Writes use
//! the lease's resourceVersion, so two writers never both win.

use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// What a standby last saw of another holder's record, and when by its
/// own monotonic clock: the record expires `leaseDurationSeconds` after
/// it was last seen to change, as client-go decides, so a clock skewed
/// against the holder's can neither take a live lease early nor wait out a
/// dead one late. And the leader's own last write, which its next renewal
/// updates without reading first.
#[derive(Debug, Default)]
pub struct Observed {
    seen: Mutex<Option<(String, Instant)>>,
    written: Mutex<Option<Lease>>,
}

impl Observed {
    /// Our last write of the lease, taken (a renewal that fails reads the
    /// lease again).
    fn take_written(&self) -> Option<Lease> {
        crate::runtime::lock(&self.written).take()
    }

    fn wrote(&self, lease: Lease) {
        *crate::runtime::lock(&self.written) = Some(lease);
    }

    /// Has the record `lease` shows stood unchanged for its whole duration?
    fn expired(&self, lease: &Lease) -> bool {
        let spec = lease.spec.as_ref();
        let seconds = spec.and_then(|s| s.lease_duration_seconds).unwrap_or(0);
        let record = format!(
            "{}/{:?}/{:?}",
            spec.and_then(|s| s.holder_identity.as_deref())
                .unwrap_or_default(),
            spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            lease.metadata.resource_version
        );
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match &*seen {
            Some((r, at)) if *r == record => {
                at.elapsed() >= Duration::from_secs(seconds.max(0) as u64)
            }
            _ => {
                *seen = Some((record, Instant::now()));
                seconds <= 0
            }
        }
    }
}

/// Which lease [`acquire`] takes: a node lease (usually absent, so
/// created first; expired by its renewal time, NMO's rule) or the leader
/// lease (read first; expired by [`Observed`]).
pub enum LeaseKind<'a> {
    Node,
    Leader(&'a Observed),
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
/// A node lease is created before it is read (one request where it is
/// usually absent: a maintenance's lease, released by the last one); the
/// leader lease is read first (one request fewer where it usually exists:
/// renewed every 3 s and polled by standbys).
pub async fn acquire(
    client: &Client,
    namespace: &str,
    name: &str,
    holder: &str,
    seconds: i32,
    owner: Option<OwnerReference>,
    kind: LeaseKind<'_>,
) -> Result<Acquired> {
    let (create_first, observed) = match kind {
        LeaseKind::Node => (true, None),
        LeaseKind::Leader(o) => (false, Some(o)),
    };
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let now = Timestamp::now();
    let until = now
        .checked_add(SignedDuration::from_secs(seconds as i64))
        .unwrap_or(now);
    let ctx = || format!("taking lease {namespace}/{name}");
    // Created first: a maintenance that begins finds no lease (the last
    // one released it by deleting it), so one request takes it where a
    // read and then a create took two, before the cordon.
    let fresh = Lease {
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
    // The leader's renewal, as client-go's fast path: the lease as we last
    // wrote it, updated in one request. Anyone else's write since fails it
    // with 409, and the read below judges the lease as it is. Under load
    // a read and a write took two of a 10 s deadline's round trips of
    // 1.4 s each, and the leader of a burst at 5 000 nodes stepped down.
    if let Some(o) = observed
        && let Some(mut mine) = o.take_written()
    {
        let spec = mine.spec.get_or_insert_with(Default::default);
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(seconds);
        match api.replace(name, &PostParams::default(), &mine).await {
            Ok(written) => {
                o.wrote(written);
                return Ok(Acquired::Held { until });
            }
            Err(e) => log::debug!("{}: renewing from our last write: {e}; reading it", ctx()),
        }
    }
    let mut attempt = 0;
    let mut lease = loop {
        attempt += 1;
        if attempt == 1 && !create_first {
            match api.get_opt(name).await.map_err(Error::kube(ctx()))? {
                Some(lease) => break lease,
                None => continue,
            }
        }
        let created = match api.create(&PostParams::default(), &fresh).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {
                ensure_namespace(client, namespace).await?;
                api.create(&PostParams::default(), &fresh).await
            }
            other => other,
        };
        // It exists: ours to renew, free to take, or someone else's.
        let conflict = match created {
            Ok(written) => {
                if let Some(o) = observed {
                    o.wrote(written);
                }
                return Ok(Acquired::Held { until });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => kube::Error::Api(s),
            Err(e) => return Err(Error::kube(ctx())(e)),
        };
        match api.get_opt(name).await.map_err(Error::kube(ctx()))? {
            Some(lease) => break lease,
            // Released between the create and the read: create again.
            None if attempt < 3 => continue,
            None => return Err(Error::kube(ctx())(conflict)),
        }
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let current = spec.holder_identity.clone().unwrap_or_default();
    // The leader lease is judged by local time since its record last
    // changed; a node lease by its renewal time (NMO's rule, which the
    // medik8s remediators share).
    let expired = match observed {
        Some(o) => o.expired(&lease),
        None => expiry(&lease).is_none_or(|t| t <= now),
    };
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
    let written = api
        .replace(name, &PostParams::default(), &lease)
        .await
        .map_err(Error::kube(ctx()))?;
    if let Some(o) = observed {
        o.wrote(written);
    }
    Ok(Acquired::Held { until })
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
    // The manifests create it; no shipped identity may create namespaces
    // (an administrator running the CLI may).
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 403 => Err(Error::Invalid(format!(
            "namespace {name} does not exist and this identity may not create it: apply nodekeeper's manifests (k3s-manifests/00-shared/, the rbac target or the Helm chart create it)"
        ))),
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
        LeaseKind::Node,
    )
    .await
}

/// Release the medik8s lease of `node` if NodeMaintenance holds it.
pub async fn release_node_lease(client: &Client, node: &str) -> Result<()> {
    release(client, LEASE_NAMESPACE, &lease_name(node), LEASE_HOLDER).await
}

/// The nodes whose medik8s lease NodeMaintenance holds (`node`: only
/// that one's, read with a get): what a process that just started may
/// hold without remembering it. A lease is taken beside a new
/// maintenance's finalizer; a refused finalizer, a restart and the
/// maintenance deleted before the next pass left it held from medik8s
/// remediators for its hour (found by the maintenance worlds).
pub async fn held_node_leases(client: &Client, node: Option<&str>) -> Result<Vec<String>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let ours = |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(LEASE_HOLDER)
    };
    let leases = match node {
        Some(n) => {
            let found = api
                .get_opt(&lease_name(n))
                .await
                .map_err(Error::kube(format!(
                    "reading lease {LEASE_NAMESPACE}/{}",
                    lease_name(n)
                )))?;
            found.into_iter().collect::<Vec<_>>()
        }
        None => {
            api.list(&Default::default())
                .await
                .map_err(Error::kube(format!("listing leases in {LEASE_NAMESPACE}")))?
                .items
        }
    };
    Ok(leases
        .iter()
        .filter(|l| ours(l))
        .filter_map(|l| l.metadata.name.as_deref()?.strip_prefix("node-"))
        .map(str::to_string)
        .collect())
}

/// Hand the leader lease over as client-go's `ReleaseOnCancel` does: if
/// `holder` still holds it, write it back with no holder and a duration of
/// 1 s. An update, which the leader needs anyway: a delete needed a verb
/// the shipped Role did not grant (the hand-over was refused with 403 and
/// the standby waited out the 15 s), and a lease without a holder is taken
/// at once by whoever reads it next ([`acquire`]), a standby first: it
/// watches the lease (`service::leader::lead`).
pub async fn release_leader(
    client: &Client,
    namespace: &str,
    name: &str,
    holder: &str,
) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let ctx = || format!("releasing lease {namespace}/{name}");
    let Some(mut lease) = api.get_opt(name).await.map_err(Error::kube(ctx()))? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        return Ok(());
    }
    let now = MicroTime(Timestamp::now());
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    // replace() carries resourceVersion: a lease taken meanwhile stays
    // its new holder's.
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(ctx())(e)),
    }
}

#[cfg(test)]
mod observed_tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    fn lease(renewed: &str, rv: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("other".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed.parse().unwrap_or_default())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_leader_lease_expires_by_local_time_since_its_record_last_changed() {
        // Renewed "an hour ago" by the holder's clock (ours is skewed
        // ahead): a standby comparing wall clocks took it at once.
        let o = Observed::default();
        let old = lease("2020-01-01T00:00:00Z", "5");
        assert!(!o.expired(&old), "first sight is never expired");
        assert!(!o.expired(&old), "seen unchanged for less than 15 s");
        // Unchanged for the whole duration by our own clock: expired.
        if let Some(seen) = o.seen.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            seen.1 = Instant::now() - Duration::from_secs(16);
        }
        assert!(o.expired(&old));
        // A renewal (new record) starts the count again.
        assert!(!o.expired(&lease("2020-01-01T00:00:03Z", "6")));
    }
}
