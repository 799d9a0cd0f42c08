//! Leases: the medik8s node lease (`medik8s-leases/node-<node>`, holder
//! `node-maintenance`) that NodeMaintenance holds so medik8s remediators
//! leave the node alone, and the leader lease of cluster mode. Writes use
//! the lease's resourceVersion, so two writers never both win.

use std::sync::{Arc, Mutex};
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
/// dead one late.
#[derive(Debug, Default)]
pub struct Observed(Mutex<Option<(String, Instant)>>);

impl Observed {
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
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
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
            Ok(_) => return Ok(Acquired::Held { until }),
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
    api.replace(name, &PostParams::default(), &lease)
        .await
        .map_err(Error::kube(ctx()))?;
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

/// Hand the leader lease over as client-go's `ReleaseOnCancel` does: if
/// `holder` still holds it, write it back with no holder and a duration of
/// 1 s. An update, which the leader needs anyway: a delete needed a verb
/// the shipped Role did not grant (the hand-over was refused with 403 and
/// the standby waited out the 15 s), and a lease without a holder is taken
/// at once by whoever reads it next ([`acquire`]), a standby first: it
/// watches the lease ([`lead`]).
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
        LeaseKind::Node,
    )
    .await
}

/// Release the medik8s lease of `node` if NodeMaintenance holds it.
pub async fn release_node_lease(client: &Client, node: &str) -> Result<()> {
    release(client, LEASE_NAMESPACE, &lease_name(node), LEASE_HOLDER).await
}

/// Whether this process may still start effects as the cluster role's
/// leader. A replica that is not leader-elected (the node role) always may.
/// A leader may only until its renew deadline: 10 s after the start of its
/// last successful renewal, 5 s before the 15 s lease could pass to another
/// replica. So no effect of an old leader starts after a new one could
/// have begun, and only resourceVersion-guarded writes already in flight
/// can meet a new leader's.
///
/// It also counts the effects running, so a leader that steps down
/// ([`Leadership::step_down`]) hands its lease over only once none is.
#[derive(Clone, Default)]
pub struct LeaderGate(Option<Arc<GateState>>);

#[derive(Default)]
struct GateState {
    until: Mutex<Option<Instant>>,
    in_flight: std::sync::atomic::AtomicUsize,
}

/// An effect running under the gate (counted until dropped).
pub struct InFlight(Option<Arc<GateState>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(state) = &self.0 {
            state
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl LeaderGate {
    /// A gate that never closes (no leader election).
    pub fn always() -> LeaderGate {
        LeaderGate(None)
    }

    fn elected() -> LeaderGate {
        LeaderGate(Some(Arc::default()))
    }

    fn slot(&self) -> Option<std::sync::MutexGuard<'_, Option<Instant>>> {
        self.0
            .as_ref()
            .map(|s| s.until.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// [`LeaderGate::may_act`], and count the effect until the guard drops.
    pub fn enter(&self) -> Result<InFlight> {
        // Counted before the check, released if it fails: checked first, a
        // step-down could revoke, read no effect in flight and hand the
        // lease over between the check and the count.
        if let Some(state) = &self.0 {
            state
                .in_flight
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let guard = InFlight(self.0.clone());
        self.may_act()?;
        Ok(guard)
    }

    fn in_flight(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |s| s.in_flight.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// `Ok` while effects may start; [`Error::LostLease`] once the lease is
    /// in doubt.
    pub fn may_act(&self) -> Result<()> {
        match self.slot() {
            None => Ok(()),
            Some(until) => match *until {
                Some(t) if Instant::now() < t => Ok(()),
                _ => Err(Error::LostLease(
                    "the leader lease was not renewed in time; starting nothing more".into(),
                )),
            },
        }
    }

    /// A leader's gate, closed until [`LeaderGate::open_for_test`].
    #[cfg(test)]
    pub fn closed_for_test() -> LeaderGate {
        LeaderGate::elected()
    }

    #[cfg(test)]
    pub fn open_for_test(&self, d: Duration) {
        self.extend(Instant::now() + d)
    }

    fn extend(&self, until: Instant) {
        if let Some(mut slot) = self.slot() {
            *slot = Some(until);
        }
    }

    fn revoke(&self) {
        if let Some(mut slot) = self.slot() {
            *slot = None;
        }
    }
}

/// The leader lease's timing (client-go's defaults for the first two).
const LEADER_LEASE_SECONDS: i32 = 15;
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_EVERY: Duration = Duration::from_secs(3);

/// One try to take or renew the leader lease, given up after `limit`; the
/// error as one line.
async fn try_leader_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    identity: &str,
    limit: Duration,
    observed: &Observed,
) -> std::result::Result<Acquired, String> {
    let tried = acquire(
        client,
        namespace,
        name,
        identity,
        LEADER_LEASE_SECONDS,
        None,
        LeaseKind::Leader(observed),
    );
    match crate::runtime::timeout(limit, tried).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(()) => Err(format!(
            "taking lease {namespace}/{name}: no answer within {} s",
            limit.as_secs()
        )),
    }
}

/// Leadership won: the gate effects check, and a channel that yields once
/// the lease is lost (why, in one line).
pub struct Leadership {
    pub gate: LeaderGate,
    pub lost: smol::channel::Receiver<String>,
    /// Stops the renewals ([`Leadership::step_down`]).
    stop: crate::runtime::Latch,
    renewer: smol::Task<()>,
    client: Client,
    namespace: String,
    name: String,
    identity: String,
}

/// How long a leader that steps down waits for its effects in flight
/// before it leaves the lease to expire instead.
const STEP_DOWN_WAIT: Duration = Duration::from_secs(5);

impl Leadership {
    /// Hand the lease over at shutdown (client-go's `ReleaseOnCancel`), so
    /// a standby or the next start leads at once rather than after the
    /// lease's 15 s: stop renewing, close the gate, wait for the effects
    /// running (up to 5 s), then clear the lease's holder if it is still
    /// ours ([`release_leader`]).
    /// With an effect still running the lease is left to expire: a new
    /// leader must not begin beside it.
    pub async fn step_down(self) {
        self.stop.open();
        self.renewer.await;
        self.gate.revoke();
        let settled = async {
            while self.gate.in_flight() > 0 {
                crate::runtime::sleep(Duration::from_millis(20)).await;
            }
            true
        };
        let waited = async {
            crate::runtime::sleep(STEP_DOWN_WAIT).await;
            false
        };
        if !smol::future::or(settled, waited).await {
            log::warn!(
                "{} effects still running {} s after the shutdown request: leaving lease {}/{} to expire",
                self.gate.in_flight(),
                STEP_DOWN_WAIT.as_secs(),
                self.namespace,
                self.name
            );
            return;
        }
        match release_leader(&self.client, &self.namespace, &self.name, &self.identity).await {
            Ok(()) => log::info!(
                "released lease {}/{}: another replica may lead now",
                self.namespace,
                self.name
            ),
            Err(e) => log::warn!("{e}; the lease expires in {LEADER_LEASE_SECONDS} s"),
        }
    }
}

/// Wait until `identity` holds the leader lease `namespace/name`, then keep
/// renewing it in the background. Every try starts its clock before its
/// request: the server's renewal time is later, so the deadline is safe.
pub async fn lead(
    client: Client,
    namespace: String,
    name: String,
    identity: String,
) -> Result<Leadership> {
    use smol::stream::StreamExt;
    let gate = LeaderGate::elected();
    let observed = Observed::default();
    // A standby learns of a hand-over from a watch of the lease (its
    // holder cleared, or the lease gone), not from its next poll up to 3 s
    // later; the polls stay for a holder that died without one.
    let mut released = Box::pin(released(Api::namespaced(client.clone(), &namespace), &name));
    loop {
        let start = Instant::now();
        let tried = try_leader_lease(
            &client,
            &namespace,
            &name,
            &identity,
            RENEW_DEADLINE,
            &observed,
        )
        .await;
        match tried {
            Ok(Acquired::Held { .. }) => {
                gate.extend(start + RENEW_DEADLINE);
                break;
            }
            Ok(Acquired::HeldBy(other)) => {
                log::info!("waiting for leadership: lease {namespace}/{name} is held by {other}")
            }
            Err(e) => log::warn!("leader election: {e}"),
        }
        smol::future::or(crate::runtime::sleep(RETRY_EVERY), async {
            if released.next().await.is_none() {
                // The watch never ends; if it did, the polls go on.
                std::future::pending::<()>().await
            }
        })
        .await;
    }
    drop(released);
    log::info!("leading as {identity} (lease {namespace}/{name})");
    let (tx, rx) = smol::channel::bounded(1);
    let renewing = gate.clone();
    let stop = crate::runtime::Latch::default();
    let stopped = stop.clone();
    // The renewals own the originals; stepping down uses these.
    let (c, ns, n, id) = (
        client.clone(),
        namespace.clone(),
        name.clone(),
        identity.clone(),
    );
    let renewer = crate::runtime::spawn(async move {
        let mut last_ok = Instant::now();
        let why = loop {
            let stepping_down = smol::future::or(
                async {
                    crate::runtime::sleep(RETRY_EVERY).await;
                    false
                },
                async {
                    stopped.wait().await;
                    true
                },
            )
            .await;
            if stepping_down {
                return;
            }
            let start = Instant::now();
            // A try may not outlive the deadline: a request sent while the
            // API server restarts could otherwise wait for a dead
            // connection's read timeout (minutes), neither renewing nor
            // stepping down.
            let left = RENEW_DEADLINE
                .saturating_sub(last_ok.elapsed())
                .max(Duration::from_secs(1));
            let tried =
                try_leader_lease(&client, &namespace, &name, &identity, left, &observed).await;
            match tried {
                Ok(Acquired::Held { .. }) => {
                    last_ok = start;
                    renewing.extend(start + RENEW_DEADLINE);
                }
                Ok(Acquired::HeldBy(other)) => {
                    break format!("lease {namespace}/{name} is held by {other}");
                }
                Err(e) if last_ok.elapsed() < RENEW_DEADLINE => {
                    log::warn!("renewing leadership: {e}")
                }
                Err(e) => {
                    break format!(
                        "could not renew lease {namespace}/{name} within {} s: {e}",
                        RENEW_DEADLINE.as_secs()
                    );
                }
            }
        };
        renewing.revoke();
        log::error!("lost leadership: {why}");
        let _ = tx.send(why).await;
    });
    Ok(Leadership {
        gate,
        lost: rx,
        stop,
        renewer,
        client: c,
        namespace: ns,
        name: n,
        identity: id,
    })
}

/// Yields each time the lease `name` is seen without a holder or gone
/// (a hand-over); watch errors back off and are logged at debug (a Role
/// without `watch` on leases leaves the 3 s polls).
fn released(api: Api<Lease>, name: &str) -> impl smol::stream::Stream<Item = ()> + Send + use<> {
    use kube::runtime::WatchStreamExt;
    use smol::stream::StreamExt;
    let name = name.to_string();
    kube::runtime::watcher::watch_object(api, &name)
        .default_backoff()
        .filter_map(move |seen| match seen {
            Ok(None) => Some(()),
            Ok(Some(lease)) => lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_none_or(str::is_empty)
                .then_some(()),
            Err(e) => {
                log::debug!("watching leader lease {name}: {e}");
                None
            }
        })
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
        if let Some(seen) = o.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            seen.1 = Instant::now() - Duration::from_secs(16);
        }
        assert!(o.expired(&old));
        // A renewal (new record) starts the count again.
        assert!(!o.expired(&lease("2020-01-01T00:00:03Z", "6")));
    }
}
