//! Rolling node replacement in the loop (cluster role, with
//! `--provider-command`, where Constellation's CRDs are served). The five
//! kinds are watched untyped (read typed per pass, as the mutex kinds),
//! and every change of them, of nodes or of NodeMaintenances kicks the
//! feature's task ([`start_task`]).
//!
//! The pass runs on its own task, one at a time, apart from the policy
//! pass: provider calls are processes that may take their whole timeout,
//! and they must never hold up maintenance, reboots or upgrades. Within a
//! pass, rounds go: ask the provider what the round needs (memoised where
//! the answer cannot change), decide, perform, and wait for the watches to
//! show our writes before the next round decides on them.
//!
//! Here: the feature's state, its task and a pass's rounds. A round's
//! NodeVersions and their effects are in `versions.rs`, the provider's
//! questions and the scaling-group listing in `ask.rs`, the other kinds
//! (JoiningNodes, AutoscalingStrategies) in `kinds.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::context::Context;
use super::failing::{Failing, Subject};
use super::passes::Kick;
use super::watch::{Trigger, typed, watch_dynamic};
use crate::api::constellation::*;
use crate::decide::earliest;
use crate::decide::replace::{self, Failure, Read};
use crate::error::Result;
use crate::runtime::Latch;

mod ask;
mod kinds;
mod versions;

/// Rounds per pass before it yields (a pass normally ends far sooner).
const MAX_ROUNDS: usize = 64;
/// How long a round waits for the watches to show our writes.
const SETTLE: Duration = Duration::from_secs(2);
/// How often the provider's scaling groups are listed (Constellation: 15 min).
const LIST_GROUPS_EVERY: Duration = Duration::from_secs(15 * 60);
/// The first retry of a failed listing (doubling up to the period).
const LIST_GROUPS_RETRY: Duration = Duration::from_secs(15);

/// The watched kinds.
pub struct ReplaceStores {
    pub versions: Store<DynamicObject>,
    pub groups: Store<DynamicObject>,
    pub pending: Store<DynamicObject>,
    pub strategies: Store<DynamicObject>,
    pub joining: Store<DynamicObject>,
}

/// A provider answer and until when it may be used again (`None`: for as
/// long as what it is about exists).
type Answer = (Option<Instant>, Result<String, String>);

/// How long a failed provider write is reported in its NodeVersion's
/// status after it happened: a failure that persists is recorded again at
/// every retry (10 s), one that does not is not reported for ever.
const FAILURE_SHOWN: Duration = Duration::from_secs(60);

/// What the replacement feature keeps between passes.
pub struct Replace {
    pub stores: ReplaceStores,
    server_version: Option<String>,
    /// Failed provider writes, per NodeVersion (by UID): each reports only
    /// its own, and forgets them after [`FAILURE_SHOWN`]. Shared with the
    /// deletes running in the background (`versions::in_background`).
    failures: Arc<Mutex<HashMap<String, BTreeMap<String, Failure>>>>,
    /// Provider writes running in the background, by key, and the kick
    /// each gives the task when it is answered.
    in_flight: Arc<Mutex<BTreeSet<String>>>,
    kick: Option<Kick>,
    /// Provider answers kept as [`Read::reuse`] says, by read and id;
    /// pruned when the node, instance or group they are about is gone.
    answers: Mutex<HashMap<(Read, String), Answer>>,
    /// Escalation events already published (`reason/object`), pruned with
    /// the objects.
    published: Mutex<HashSet<String>>,
    /// AutoscalingStrategies whose last check failed (reported on them and
    /// backed off), pruned with them.
    failing: Failing,
    /// Per strategy: the resourceVersions it was last checked at (its own
    /// and the groups'), so the Deployment is read only when they change.
    /// With a missing Deployment, also when to look for it again.
    strategy_checked: Mutex<HashMap<String, (String, Option<Instant>)>>,
    groups_listed: Mutex<Listed>,
}

/// When the provider's scaling groups are listed next, and how many
/// listings in a row failed.
#[derive(Default)]
struct Listed {
    next: Option<Instant>,
    failures: u32,
}

use crate::runtime::lock;

/// Start the feature if Constellation's CRDs are served: watches, and the
/// stream of "something changed". Without `--provider-command` they are
/// not watched and a line in the log says why.
pub async fn start(
    client: &Client,
    provider: bool,
    synced: Latch,
) -> Result<(Option<Replace>, Trigger)> {
    let nv = ApiResource::erase::<NodeVersion>(&());
    let served = super::watch::served(client, &nv).await?;
    if !served || !provider {
        if served {
            log::info!(
                "NodeVersions are served but no --provider-command was given: node replacement is off"
            );
        }
        synced.open();
        return Ok((None, Box::pin(smol::stream::pending())));
    }
    let server_version = client.apiserver_version().await.ok().map(|v| v.git_version);
    log::info!("NodeVersions are served: rolling node replacement is on");
    let latches: Vec<Latch> = (0..5).map(|_| Latch::default()).collect();
    let kinds = [
        Kind::NodeVersion,
        Kind::ScalingGroup,
        Kind::PendingNode,
        Kind::AutoscalingStrategy,
        Kind::JoiningNode,
    ];
    let mut stores = Vec::new();
    let mut triggers: Vec<Trigger> = Vec::new();
    for (k, l) in kinds.iter().zip(&latches) {
        let (s, t) = watch_dynamic(client, &k.resource(), l.clone());
        stores.push(s);
        triggers.push(t);
    }
    super::watch::open_when_all(latches, synced);
    let Ok([versions, groups, pending, strategies, joining]) =
        <[Store<DynamicObject>; 5]>::try_from(stores)
    else {
        return Err(crate::error::Error::Invalid("replacement stores".into()));
    };
    let stores = ReplaceStores {
        versions,
        groups,
        pending,
        strategies,
        joining,
    };
    let merged = super::watch::merge(triggers);
    Ok((
        Some(Replace {
            stores,
            server_version,
            failures: Arc::default(),
            in_flight: Arc::default(),
            kick: None,
            answers: Mutex::default(),
            published: Mutex::default(),
            failing: Failing::default(),
            strategy_checked: Mutex::default(),
            groups_listed: Mutex::default(),
        }),
        merged,
    ))
}

/// Run replacement passes on their own task until `kicks` closes: one at
/// start, then one per burst of kicks (its kinds, nodes, NodeMaintenances),
/// or when the last pass asked to look again. Apart from the cluster
/// scheduler: a provider call may take its whole timeout.
pub fn start_task(
    ctx: Arc<Context>,
    replace: Option<Replace>,
    kick: Kick,
    kicks: smol::channel::Receiver<()>,
) {
    let Some(mut r) = replace else {
        return;
    };
    r.kick = Some(kick);
    crate::runtime::spawn(async move {
        ctx.synced.wait().await;
        let (ctx, r, k) = (&*ctx, &r, &kicks);
        crate::service::passes::run_passes(&ctx.effects.gate, &kicks, move || async move {
            let started = Instant::now();
            // A round may wait on the provider for its whole timeout.
            let limit = crate::service::metrics::WEDGED_AFTER
                + ctx
                    .effects
                    .provider
                    .as_ref()
                    .map_or(Duration::ZERO, |p| p.timeout);
            let _busy = crate::service::metrics::Busy::start("replacement task", limit);
            let result = pass(ctx, r, k).await;
            crate::service::metrics::observe_work(
                crate::service::metrics::Timed::ReplacementPass,
                started.elapsed(),
            );
            match result {
                Ok(w) => w,
                // The gate closed mid-pass: `run_passes` looks again soon.
                Err(crate::error::Error::LostLease(_)) => None,
                Err(e) => {
                    log::warn!("node replacement: {e} (retrying in 5 s)");
                    Some(Duration::from_secs(5))
                }
            }
        })
        .await;
    })
    .detach();
}

/// What a round wrote, so the next one waits for the watches to show it.
#[derive(Default)]
struct Expect {
    written: Vec<(Kind, String, Option<String>)>,
    gone: Vec<(Option<Kind>, String)>,
    /// NodeMaintenances created (a donor's): until the watch shows one,
    /// the next round would create it again (and lose a 409).
    maintenances: Vec<String>,
}

impl Expect {
    /// Wait for the watch to show an object the server stored for us.
    fn written_by(&mut self, outcome: &crate::decide::Outcome) {
        if let crate::decide::Outcome::ObjectWritten {
            kind,
            name,
            resource_version,
        } = outcome
        {
            self.written
                .push((*kind, name.clone(), resource_version.clone()));
        }
    }
}

fn store_of(r: &Replace, kind: Kind) -> Option<&Store<DynamicObject>> {
    Some(match kind {
        Kind::NodeVersion => &r.stores.versions,
        Kind::ScalingGroup => &r.stores.groups,
        Kind::PendingNode => &r.stores.pending,
        Kind::AutoscalingStrategy => &r.stores.strategies,
        Kind::JoiningNode => &r.stores.joining,
        Kind::Deployment => return None,
    })
}

fn find(store: &Store<DynamicObject>, name: &str) -> Option<Arc<DynamicObject>> {
    store.state().into_iter().find(|o| o.name_any() == name)
}

/// Wait (bounded) until the stores show what the last round wrote. Every
/// event of the kinds this checks kicks the task, so it looks again at each
/// kick rather than on a timer.
async fn settle(ctx: &Context, r: &Replace, e: &Expect, kicks: &smol::channel::Receiver<()>) {
    let deadline = Instant::now() + SETTLE;
    loop {
        // An object written and then deleted in the same round (a leave's
        // last status) is looked for as gone only: waiting for the write
        // to show would wait out the bound.
        let deleted = |k: Kind, name: &str| e.gone.iter().any(|(g, n)| *g == Some(k) && n == name);
        let shown = e
            .written
            .iter()
            .filter(|(k, name, _)| !deleted(*k, name))
            .all(|(k, name, rv)| {
                // A different resourceVersion than ours would be someone's
                // later write; the bound covers that rare case.
                store_of(r, *k).is_none_or(|store| {
                    find(store, name).is_some_and(|o| rv.is_none() || o.resource_version() == *rv)
                })
            })
            && e.gone.iter().all(|(k, name)| match k {
                Some(k) => store_of(r, *k).is_none_or(|s| find(s, name).is_none()),
                None => ctx.node(name).is_none(),
            })
            && (e.maintenances.is_empty() || {
                let shown = ctx.all_maintenances();
                e.maintenances
                    .iter()
                    .all(|name| shown.iter().any(|m| m.name_any() == *name))
            });
        if shown || Instant::now() >= deadline {
            return;
        }
        let kicked = async {
            let _ = kicks.recv().await;
        };
        smol::future::or(kicked, async {
            smol::Timer::at(deadline).await;
        })
        .await;
    }
}

/// One replacement pass: rounds until nothing is left to do now.
async fn pass(
    ctx: &Context,
    r: &Replace,
    kicks: &smol::channel::Receiver<()>,
) -> Result<Option<Duration>> {
    prune(ctx, r);
    let listing = ask::list_groups(ctx, r).await;
    let mut wake = None;
    let mut expect = Expect::default();
    for _ in 0..MAX_ROUNDS {
        settle(ctx, r, &expect, kicks).await;
        expect = Expect::default();
        let now = Timestamp::now();
        let acted_joining = kinds::joining(ctx, r, now, &mut expect, &mut wake).await?;
        let acted_strategies = kinds::strategies(ctx, r, &mut expect, &mut wake).await?;
        let acted_groups = kinds::groups(ctx, r, now, &mut expect).await?;
        let (acted, w) = versions::versions(ctx, r, now, &mut expect).await?;
        if !(acted || acted_joining || acted_strategies || acted_groups) {
            // A replaced node's maintenance, deleted after its Node, is
            // finished here: its deletion event may have mapped to the Node
            // while the store still had it, and nothing else would look
            // before the next heartbeat.
            let orphaned = ctx.all_maintenances().iter().any(|m| {
                crate::decide::maintenance::owner_of(m) == Some("NodeVersion")
                    && ctx.node(&m.spec.node_name).is_none()
                    && crate::decide::foreign::needs_attention(m)
            });
            if orphaned {
                ctx.anchor.kick();
            }
            return Ok(earliest(listing, earliest(wake, w)));
        }
        wake = None;
    }
    Ok(Some(Duration::from_millis(100)))
}

/// Forget what the feature keeps about things that are gone: answers about
/// nodes, instances and groups no longer seen, failures of NodeVersions
/// that are gone or too old to report, checks of strategies that are gone,
/// and published escalations of objects that are gone.
fn prune(ctx: &Context, r: &Replace) {
    let nodes = ctx.all_nodes();
    let pending: Vec<Arc<PendingNode>> = typed(&r.stores.pending);
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let mut ids: HashSet<String> = nodes
        .iter()
        .filter_map(|n| replace::provider_id(n).map(str::to_string))
        .collect();
    ids.extend(pending.iter().filter_map(|p| p.spec.provider_id.clone()));
    ids.extend(
        groups
            .iter()
            .filter_map(|g| g.spec.group_id.as_ref().map(|id| id.to_lowercase())),
    );
    lock(&r.answers).retain(|(_, id), _| ids.contains(id));
    let versions: HashSet<String> = typed::<NodeVersion>(&r.stores.versions)
        .iter()
        .filter_map(|v| v.uid())
        .collect();
    let now = Timestamp::now();
    let shown = k8s_openapi::jiff::SignedDuration::try_from(FAILURE_SHOWN).unwrap_or_default();
    let mut failures = lock(&r.failures);
    failures.retain(|uid, _| versions.contains(uid));
    for per in failures.values_mut() {
        per.retain(|_, f| now.duration_since(f.at) < shown);
    }
    drop(failures);
    let strategies: HashSet<String> = r
        .stores
        .strategies
        .state()
        .iter()
        .map(|s| s.name_any())
        .collect();
    lock(&r.strategy_checked).retain(|name, _| strategies.contains(name));
    let keys: HashSet<String> = typed::<AutoscalingStrategy>(&r.stores.strategies)
        .iter()
        .map(|s| Subject::typed(s.as_ref()).key)
        .collect();
    r.failing.retain(|k| keys.contains(k));
    let mut names: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    names.extend(pending.iter().map(|p| p.name_any()));
    names.extend(r.stores.versions.state().iter().map(|v| v.name_any()));
    lock(&r.published).retain(|key| {
        key.split_once('/')
            .is_some_and(|(_, object)| names.contains(object))
    });
}
