//! Leader election of the cluster role: the leader lease taken and renewed
//! ([`lead`]), the gate it opens for effects while it leads
//! ([`crate::effects::gate::LeaderGate`]), and the hand-over when it stops
//! ([`Leadership::step_down`]). The lease's reads and writes are effects
//! ([`crate::effects::lease::acquire`], which judges a leader lease's expiry
//! by local time, and [`crate::effects::lease::release_leader`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

use crate::effects::gate::LeaderGate;
use crate::effects::lease::{Acquired, LeaseKind, Observed, acquire, release_leader};
use crate::error::Result;

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
