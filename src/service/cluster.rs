//! The cluster role's one scheduler for cluster-wide work. The node
//! controller reconciles nodes only; everything that decides across nodes
//! — RebootPolicies, UpgradePlans, the mutex operator's kinds — runs here,
//! as passes of one task:
//!
//! - **Triggers**: the kinds the passes read (nodes, NodeMaintenances,
//!   policies, plans, Jobs, the mutex kinds; pods only while a gate reads
//!   them) each [`Kick`] the scheduler. Kicks coalesce: any number of them
//!   during a pass make one more pass, never one each.
//! - **One pass at a time**, each feature in turn; a feature's pass never
//!   starts another's.
//! - **Its own wake-up**: a pass returns when it wants to look again
//!   (window boundaries, deadlines, backoff), and the task sleeps until
//!   then or the next kick.
//! - **Errors per object** ([`Failing`]): an object whose decision fails
//!   gets an event and a `Reconciled=False` condition naming the cause, is
//!   retried with backoff (at once if it changes), and every other object
//!   goes on.
//!
//! Replacement has its own task (`replace.rs`): provider calls may take
//! their whole timeout and must not hold these passes up.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::ObjectMeta;

use super::context::Context;
use super::metrics;
use crate::decide::{Effect, earliest};
use crate::error::{Error, Result};

/// A handle that asks for one more pass. Cloning it is cheap; kicking a
/// scheduler that already has a pass asked for does nothing.
#[derive(Clone)]
pub struct Kick(smol::channel::Sender<()>);

impl Kick {
    /// A kick and the receiving end its scheduler waits on.
    pub fn new() -> (Kick, smol::channel::Receiver<()>) {
        let (tx, rx) = smol::channel::bounded(1);
        (Kick(tx), rx)
    }

    /// Ask for a pass (coalesced with any pending one).
    pub fn kick(&self) {
        let _ = self.0.try_send(());
    }
}

/// A watch's inspector that kicks `kicks` at every event (never for a
/// watch error) if `enabled` (the cluster role).
pub fn on_event<K>(
    enabled: bool,
    kicks: Vec<Kick>,
) -> impl Fn(&std::result::Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>)
{
    move |ev| {
        if enabled && ev.is_ok() {
            kicks.iter().for_each(Kick::kick);
        }
    }
}

/// Run passes until `kicks` closes: one at start, then one per burst of
/// kicks, or when the last pass asked to look again.
pub fn start(ctx: Arc<Context>, kicks: smol::channel::Receiver<()>) {
    crate::runtime::spawn(async move {
        ctx.synced.wait().await;
        let mut due: Option<Instant> = Some(Instant::now());
        loop {
            let kicked = async { kicks.recv().await.is_ok() };
            let timer = async {
                match due {
                    Some(t) => {
                        smol::Timer::at(t).await;
                        true
                    }
                    None => smol::future::pending().await,
                }
            };
            if !smol::future::or(kicked, timer).await {
                return;
            }
            // Kicks that came with this one are answered by this pass.
            while kicks.try_recv().is_ok() {}
            if ctx.effects.gate.may_act().is_err() {
                // The process is stopping; nothing more starts.
                return;
            }
            let wake = pass(&ctx).await;
            metrics::progress();
            due = wake.map(|d| Instant::now() + d);
        }
    })
    .detach();
}

/// One pass: each feature decides for each of its objects.
async fn pass(ctx: &Context) -> Option<Duration> {
    metrics::inc(&metrics::COUNTERS.cluster_passes);
    ctx.prune_cluster(&live(ctx));
    let mut wake = super::reboots::pass(ctx).await;
    wake = earliest(wake, super::upgrades::pass(ctx).await);
    wake = earliest(wake, super::mutex::pass(ctx).await);
    wake
}

/// The keys of every object a pass decides for (what its per-object memory
/// may keep).
fn live(ctx: &Context) -> HashSet<String> {
    let mut keys: HashSet<String> = HashSet::new();
    keys.extend(
        ctx.policies
            .state()
            .iter()
            .map(|p| Subject::typed(p.as_ref()).key),
    );
    keys.extend(
        ctx.plans
            .state()
            .iter()
            .map(|p| Subject::typed(p.as_ref()).key),
    );
    keys.extend(
        ctx.maintenances
            .state()
            .iter()
            .map(|m| Subject::typed(m.as_ref()).key),
    );
    keys.extend(super::mutex::keys(ctx));
    keys.extend(super::replace::keys(ctx));
    keys
}

/// First retry of a failed object, doubling to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// A conflict (409) is a stale snapshot, not a failure: decide again soon.
const RETRY_CONFLICT: Duration = Duration::from_millis(200);

/// What one object's last failure was, so the next pass waits for its
/// backoff (or a change of the object) and says why in its status.
struct Failure {
    resource_version: Option<String>,
    count: u32,
    retry_at: Instant,
    message: String,
}

/// Per object (`Kind/name`): its last failure. Pruned with the objects.
#[derive(Default)]
pub struct Failing(Mutex<HashMap<String, Failure>>);

impl Failing {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failure>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Ok` if the object may be decided now: it has not failed, its
    /// backoff is over, or it changed since (a fix is tried at once).
    /// Otherwise how long until it may.
    pub fn due(&self, key: &str, resource_version: Option<&str>) -> Result<(), Duration> {
        match self.map().get(key) {
            Some(f)
                if f.resource_version.as_deref() == resource_version
                    && f.retry_at > Instant::now() =>
            {
                Err(f.retry_at - Instant::now())
            }
            _ => Ok(()),
        }
    }

    /// Why the object's last pass failed, if it did.
    pub fn message(&self, key: &str) -> Option<String> {
        self.map().get(key).map(|f| f.message.clone())
    }

    /// Record a failure; returns how long to back off.
    fn failed(&self, key: &str, resource_version: Option<String>, message: String) -> Duration {
        let mut map = self.map();
        let count = map.get(key).map_or(0, |f| f.count).saturating_add(1);
        let delay = RETRY_FIRST
            .saturating_mul(1 << (count - 1).min(6))
            .min(RETRY_MAX);
        map.insert(
            key.to_string(),
            Failure {
                resource_version,
                count,
                retry_at: Instant::now() + delay,
                message,
            },
        );
        delay
    }

    fn succeeded(&self, key: &str) {
        self.map().remove(key);
    }

    /// Keep only the failures of objects `exists` still knows.
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.map().retain(|k, _| exists(k));
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The object a pass decided for, as its failure is reported.
pub struct Subject {
    /// `Kind/name` (namespaced kinds: `Kind/namespace/name`).
    pub key: String,
    pub reference: ObjectReference,
    pub resource_version: Option<String>,
}

impl Subject {
    pub fn of(api_version: &str, kind: &str, meta: &ObjectMeta) -> Subject {
        let name = meta.name.clone().unwrap_or_default();
        let key = match &meta.namespace {
            Some(ns) => format!("{kind}/{ns}/{name}"),
            None => format!("{kind}/{name}"),
        };
        Subject {
            key,
            reference: ObjectReference {
                api_version: Some(api_version.to_string()),
                kind: Some(kind.to_string()),
                name: Some(name),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                ..Default::default()
            },
            resource_version: meta.resource_version.clone(),
        }
    }

    pub fn typed<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Subject {
        Subject::of(&K::api_version(&()), &K::kind(&()), obj.meta())
    }
}

/// Decide for one object unless it is backing off: `decide` gets why its
/// last pass failed (for its status) and returns when to look again. Its
/// error stays with the object: reported on it, retried with backoff.
pub async fn contain<F, Fut>(ctx: &Context, subject: &Subject, decide: F) -> Option<Duration>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Duration>>>,
{
    if let Err(wait) = ctx
        .failing
        .due(&subject.key, subject.resource_version.as_deref())
    {
        return Some(wait);
    }
    let result = decide(ctx.failing.message(&subject.key)).await;
    report(ctx, subject, result).await
}

/// Settle one object's result: success forgets its failure; an error is
/// counted, logged, published on the object, and backed off.
pub async fn report(
    ctx: &Context,
    subject: &Subject,
    result: Result<Option<Duration>>,
) -> Option<Duration> {
    let err = match result {
        Ok(wake) => {
            ctx.failing.succeeded(&subject.key);
            return wake;
        }
        Err(e) => e,
    };
    if let Error::LostLease(_) = err {
        return None;
    }
    if err.api_code() == Some(409) {
        log::debug!("{}: {err} (deciding again)", subject.key);
        return Some(RETRY_CONFLICT);
    }
    metrics::count_error(&err);
    let message = err.to_string();
    let delay = ctx.failing.failed(
        &subject.key,
        subject.resource_version.clone(),
        message.clone(),
    );
    log::warn!(
        "{}: {message} (its other work goes on; retrying it in {} s)",
        subject.key,
        delay.as_secs()
    );
    let event = Effect::Event {
        object: subject.reference.clone(),
        warning: true,
        reason: "ReconcileFailed",
        note: message,
    };
    if let Err(e) = ctx.effects.perform(&event).await {
        log::debug!("{}: publishing its failure: {e}", subject.key);
    }
    Some(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_object_backs_off_doubling_and_is_due_again_once_it_changes() {
        let f = Failing::default();
        assert!(f.due("RebootPolicy/a", Some("1")).is_ok());
        let first = f.failed("RebootPolicy/a", Some("1".into()), "refused".into());
        assert_eq!(first, RETRY_FIRST);
        assert!(f.due("RebootPolicy/a", Some("1")).is_err());
        assert!(
            f.due("RebootPolicy/a", Some("2")).is_ok(),
            "a change is tried at once"
        );
        assert!(
            f.due("RebootPolicy/b", Some("1")).is_ok(),
            "others are not held"
        );
        let second = f.failed("RebootPolicy/a", Some("1".into()), "refused".into());
        assert_eq!(second, RETRY_FIRST * 2);
        for _ in 0..20 {
            f.failed("RebootPolicy/a", Some("1".into()), "refused".into());
        }
        assert!(f.due("RebootPolicy/a", Some("1")).err() <= Some(RETRY_MAX));
        assert_eq!(f.message("RebootPolicy/a").as_deref(), Some("refused"));
        f.succeeded("RebootPolicy/a");
        assert_eq!(f.message("RebootPolicy/a"), None);
        f.failed("RebootPolicy/c", None, "x".into());
        f.retain(|k| k != "RebootPolicy/c");
        assert!(f.is_empty());
    }
}
