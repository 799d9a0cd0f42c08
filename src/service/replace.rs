//! Rolling node replacement in the loop (cluster role, with
//! `--provider-command`, where Constellation's CRDs are served). The five
//! kinds are watched untyped (read typed per pass, as the mutex kinds),
//! and every change kicks one replacement pass ([`kick`]).
//!
//! The pass runs on its own task, one at a time, apart from the policy
//! pass: provider calls are processes that may take their whole timeout,
//! and they must never hold up maintenance, reboots or upgrades. Within a
//! pass, rounds go: ask the provider what the round needs (memoised where
//! the answer cannot change), decide, perform, and wait for the watches to
//! show our writes before the next round decides on them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::cluster::Subject;
use super::context::Context;
use super::watch::{Trigger, typed, watch_dynamic};
use crate::api::constellation::*;
use crate::decide::replace::ask::Reuse;
use crate::decide::replace::{self, Facts, Failure, Read};
use crate::decide::{Effect, Outcome, Then, earliest};
use crate::error::Result;
use crate::runtime::Latch;

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
    /// its own, and forgets them after [`FAILURE_SHOWN`].
    failures: Mutex<HashMap<String, BTreeMap<String, Failure>>>,
    /// Provider answers kept as [`Read::reuse`] says, by read and id;
    /// pruned when the node, instance or group they are about is gone.
    answers: Mutex<HashMap<(Read, String), Answer>>,
    /// Escalation events already published (`reason/object`), pruned with
    /// the objects.
    published: Mutex<HashSet<String>>,
    /// Per strategy: the resourceVersions it was last checked at (its own
    /// and the groups'), so the Deployment is read only when they change.
    strategy_checked: Mutex<HashMap<String, String>>,
    groups_listed: Mutex<Listed>,
}

/// When the provider's scaling groups are listed next, and how many
/// listings in a row failed.
#[derive(Default)]
struct Listed {
    next: Option<Instant>,
    failures: u32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
            failures: Mutex::default(),
            answers: Mutex::default(),
            published: Mutex::default(),
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
pub fn start_task(ctx: Arc<Context>, kicks: smol::channel::Receiver<()>) {
    if ctx.replace.is_none() {
        return;
    }
    crate::runtime::spawn(async move {
        let Some(r) = &ctx.replace else { return };
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
            while kicks.try_recv().is_ok() {}
            if ctx.effects.gate.may_act().is_err() {
                return;
            }
            let wake = match pass(&ctx, r, &kicks).await {
                Ok(w) => w,
                Err(crate::error::Error::LostLease(_)) => return,
                Err(e) => {
                    log::warn!("node replacement: {e} (retrying in 5 s)");
                    Some(Duration::from_secs(5))
                }
            };
            due = wake.map(|d| Instant::now() + d);
        }
    })
    .detach();
}

/// What a round wrote, so the next one waits for the watches to show it.
#[derive(Default)]
struct Expect {
    written: Vec<(Kind, String, Option<String>)>,
    gone: Vec<(Option<Kind>, String)>,
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
        let shown = e.written.iter().all(|(k, name, rv)| {
            // A different resourceVersion than ours would be someone's
            // later write; the bound covers that rare case.
            store_of(r, *k).is_none_or(|store| {
                find(store, name).is_some_and(|o| rv.is_none() || o.resource_version() == *rv)
            })
        }) && e.gone.iter().all(|(k, name)| match k {
            Some(k) => store_of(r, *k).is_none_or(|s| find(s, name).is_none()),
            None => ctx.node(name).is_none(),
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
    let listing = list_groups(ctx, r).await;
    let mut wake = None;
    let mut expect = Expect::default();
    for _ in 0..MAX_ROUNDS {
        settle(ctx, r, &expect, kicks).await;
        expect = Expect::default();
        let now = Timestamp::now();
        let acted_joining = joining(ctx, r, now, &mut expect, &mut wake).await?;
        let acted_strategies = strategies(ctx, r, &mut expect, &mut wake).await?;
        let (acted, w) = versions(ctx, r, now, &mut expect).await?;
        if !(acted || acted_joining || acted_strategies) {
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

/// Each NodeVersion this role handles, oldest first; a node belongs to the
/// oldest NodeVersion selecting it, so two never fight over one.
async fn versions(
    ctx: &Context,
    r: &Replace,
    now: Timestamp,
    expect: &mut Expect,
) -> Result<(bool, Option<Duration>)> {
    let mut nvs: Vec<Arc<NodeVersion>> = typed(&r.stores.versions);
    nvs.sort_by_key(|v| {
        (
            v.metadata.creation_timestamp.as_ref().map(|t| t.0),
            v.name_any(),
        )
    });
    let all_nodes = ctx.all_nodes();
    let mut taken: HashSet<String> = HashSet::new();
    let pending: Vec<Arc<PendingNode>> = typed(&r.stores.pending);
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let strategies: Vec<Arc<AutoscalingStrategy>> = typed(&r.stores.strategies);
    let maintenances = ctx.all_maintenances();
    let mut wake = None;
    for nv in &nvs {
        let selector = nv.spec.node_selector.as_ref();
        if !super::roles::handles_node_version(&ctx.scope, selector) {
            continue;
        }
        let nodes: Vec<Arc<Node>> = all_nodes
            .iter()
            .filter(|n| !taken.contains(&n.name_any()))
            .filter(|n| {
                selector.is_none_or(|s| crate::decide::drain::selector_matches(s, n.labels()))
            })
            .cloned()
            .collect();
        taken.extend(nodes.iter().map(|n| n.name_any()));
        let owned: Vec<Arc<PendingNode>> = pending
            .iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == nv.uid().as_ref())
            })
            .cloned()
            .collect();
        let failures = lock(&r.failures)
            .get(&nv.uid().unwrap_or_default())
            .cloned()
            .unwrap_or_default();
        let others_busy = nvs.iter().any(|o| {
            o.uid() != nv.uid()
                && super::roles::handles_node_version(&ctx.scope, o.spec.node_selector.as_ref())
                && o.status.as_ref().is_none_or(|st| {
                    !st.outdated.is_empty()
                        || !st.pending.is_empty()
                        || !st.heirs.is_empty()
                        || !st.donors.is_empty()
                        || !st.obsolete.is_empty()
                        || !st.awaiting_annotation.is_empty()
                })
        });
        let mut snap = replace::Snapshot {
            nv,
            nodes: &nodes,
            pending: &owned,
            groups: &groups,
            strategies: &strategies,
            maintenances: &maintenances,
            facts: &Facts::default(),
            failures: &failures,
            server_version: r.server_version.as_deref(),
            others_busy,
            now,
        };
        let facts = ask(ctx, r, replace::questions(&snap)).await;
        snap.facts = &facts;
        let plan = replace::decide(&snap);
        if let Some((level, line)) = &plan.note {
            log::log!(*level, "NodeVersion {}: {line}", nv.name_any());
        }
        let acted = perform(ctx, r, &snap, &plan.effects, expect).await?;
        match plan.then {
            Then::Again if acted => return Ok((true, None)),
            Then::Again => wake = earliest(wake, Some(Duration::from_millis(200))),
            Then::Wait(d) => wake = earliest(wake, d),
        }
    }
    Ok((false, wake))
}

/// Provider questions asked at once: a cloud API answers in hundreds of
/// milliseconds, and a round with several joining nodes should not wait
/// for each in turn.
const ASK_IN_PARALLEL: usize = 8;

/// Ask the provider what a round needs, reusing answers as long as
/// [`Read::reuse`] allows.
async fn ask(ctx: &Context, r: &Replace, questions: Vec<(Read, String)>) -> Facts {
    let mut facts = Facts::default();
    let mut fresh: Vec<(Read, String)> = Vec::new();
    {
        let answers = lock(&r.answers);
        for (read, id) in questions {
            let kept = answers
                .get(&(read, id.clone()))
                .filter(|(until, _)| until.is_none_or(|t| Instant::now() < t));
            match kept {
                Some((_, a)) => facts.insert(read, id, a.clone()),
                None => fresh.push((read, id)),
            }
        }
    }
    for chunk in fresh.chunks(ASK_IN_PARALLEL) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|(read, id)| {
                let (provider, read, request) =
                    (ctx.effects.provider.clone(), *read, read.request(id));
                let gate = ctx.effects.gate.clone();
                crate::runtime::spawn(async move {
                    gate.may_act().map_err(|e| e.to_string())?;
                    match provider {
                        Some(p) => p.call(read.verb(), &request).await,
                        None => Err("no provider plugin".to_string()),
                    }
                })
            })
            .collect();
        for ((read, id), task) in chunk.iter().zip(tasks) {
            let a = task.await.and_then(|v| read.answer(&v));
            if let Err(e) = &a {
                log::warn!("{e}");
            }
            let until = match read.reuse(a.is_ok()) {
                Reuse::Never => None,
                Reuse::WhileItExists => Some(None),
                Reuse::For(d) => Some(Some(Instant::now() + d)),
            };
            if let Some(until) = until {
                lock(&r.answers).insert((*read, id.clone()), (until, a.clone()));
            }
            facts.insert(*read, id.clone(), a);
        }
    }
    facts
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
    let mut names: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    names.extend(pending.iter().map(|p| p.name_any()));
    names.extend(r.stores.versions.state().iter().map(|v| v.name_any()));
    lock(&r.published).retain(|key| {
        key.split_once('/')
            .is_some_and(|(_, object)| names.contains(object))
    });
}

/// Perform a round's effects in order; a provider failure ends the batch
/// (what follows depended on it) and is recorded for status and backoff.
/// Returns whether anything was written.
async fn perform(
    ctx: &Context,
    r: &Replace,
    snap: &replace::Snapshot<'_>,
    effects: &[Effect],
    expect: &mut Expect,
) -> Result<bool> {
    let mut acted = false;
    let nv_uid = snap.nv.uid().unwrap_or_default();
    let fail = |key: &str, message: String| {
        lock(&r.failures).entry(nv_uid.clone()).or_default().insert(
            key.to_string(),
            Failure {
                message,
                at: Timestamp::now(),
            },
        );
    };
    // After a failed provider call the writes that depended on it are
    // left for the next round; events are not (a JoinTimeout is news
    // whether or not deleting the instance worked).
    let mut failed = false;
    for effect in effects {
        if failed && !matches!(effect, Effect::Event { .. }) {
            continue;
        }
        if let Effect::Event { object, reason, .. } = effect {
            let key = format!("{reason}/{}", object.name.as_deref().unwrap_or_default());
            if !lock(&r.published).insert(key) {
                continue;
            }
        }
        log::debug!("replace: {}", crate::effects::describe(effect));
        let outcome = ctx.effects.perform(effect).await?;
        ctx.remember(&outcome);
        acted |= !matches!(effect, Effect::Event { .. });
        match (effect, &outcome) {
            (
                _,
                Outcome::ObjectWritten {
                    kind,
                    name,
                    resource_version,
                },
            ) => {
                expect
                    .written
                    .push((*kind, name.clone(), resource_version.clone()));
            }
            (Effect::DeleteObject { kind, name, .. }, _) => {
                expect.gone.push((Some(*kind), name.clone()))
            }
            (Effect::DeleteNode { name, .. }, _) => expect.gone.push((None, name.clone())),
            _ => {}
        }
        let Effect::Provider { key, verb, request } = effect else {
            continue;
        };
        match outcome {
            Outcome::ProviderFailed(message) => {
                log::warn!("node replacement: {message}");
                fail(key, message);
                acted = true;
                failed = true;
            }
            Outcome::ProviderAnswered(answer) => {
                if let Some(per) = lock(&r.failures).get_mut(&nv_uid) {
                    per.remove(key);
                }
                if *verb == "set-scaling-group-image" {
                    let id = request["groupId"]
                        .as_str()
                        .unwrap_or_default()
                        .to_lowercase();
                    lock(&r.answers).remove(&(Read::ScalingGroupImage, id));
                }
                if *verb == "create-node" {
                    let id = request["requestId"].as_str().unwrap_or_default();
                    let group = request["groupId"].as_str().unwrap_or_default();
                    match replace::joining(snap, id, group, &answer) {
                        Ok(pn) => {
                            log::info!(
                                "NodeVersion {}: surge node {} created in group {group}",
                                snap.nv.name_any(),
                                pn["metadata"]["name"].as_str().unwrap_or_default()
                            );
                            let o = ctx
                                .effects
                                .perform(&Effect::CreateObject {
                                    kind: Kind::PendingNode,
                                    object: pn,
                                })
                                .await?;
                            if let Outcome::ObjectWritten {
                                kind,
                                name,
                                resource_version,
                            } = o
                            {
                                expect.written.push((kind, name, resource_version));
                            }
                        }
                        Err(message) => {
                            fail(key, message);
                            acted = true;
                            failed = true;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(acted)
}

/// JoiningNodes for the nodes this role sees.
async fn joining(
    ctx: &Context,
    r: &Replace,
    now: Timestamp,
    expect: &mut Expect,
    wake: &mut Option<Duration>,
) -> Result<bool> {
    let all: Vec<Arc<JoiningNode>> = typed(&r.stores.joining);
    // A scoped role leaves other nodes' JoiningNodes (and their deadlines)
    // to the role that sees them.
    let mine: Vec<Arc<JoiningNode>> = all
        .into_iter()
        .filter(|j| {
            !matches!(
                ctx.scope,
                super::roles::Scope::AllNodes { selector: Some(_) }
            ) || j
                .spec
                .name
                .as_deref()
                .is_some_and(|n| ctx.node(n).is_some())
        })
        .collect();
    let (effects, w) = replace::lifecycle_joining(&mine, &|n| ctx.node(n), now);
    *wake = earliest(*wake, w);
    for e in &effects {
        let outcome = ctx.effects.perform(e).await?;
        ctx.remember(&outcome);
        if let Effect::DeleteObject { kind, name, .. } = e {
            log::info!(
                "JoiningNode {name}: components stamped on its node (or its deadline passed); deleted"
            );
            expect.gone.push((Some(*kind), name.clone()));
        }
    }
    Ok(!effects.is_empty())
}

/// AutoscalingStrategies: read the Deployment when the strategy or the
/// groups changed since the last look, and bring it in line.
async fn strategies(
    ctx: &Context,
    r: &Replace,
    expect: &mut Expect,
    wake: &mut Option<Duration>,
) -> Result<bool> {
    let strategies: Vec<Arc<AutoscalingStrategy>> = typed(&r.stores.strategies);
    if strategies.is_empty() {
        return Ok(false);
    }
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let groups_rv: String = groups
        .iter()
        .map(|g| g.resource_version().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(",");
    let mut acted = false;
    for st in &strategies {
        let seen = format!("{}/{groups_rv}", st.resource_version().unwrap_or_default());
        if lock(&r.strategy_checked).get(&st.name_any()) == Some(&seen) {
            continue;
        }
        // Each strategy on its own: one whose Deployment cannot be read
        // (a bad name, a failed GET) is reported on it and backed off.
        let (groups, expect, did) = (&groups, &mut *expect, &mut acted);
        let retry = super::cluster::contain(ctx, &Subject::typed(st.as_ref()), |_| async move {
            strategy(ctx, r, st, groups, seen, expect, did).await
        })
        .await;
        *wake = earliest(*wake, retry);
    }
    Ok(acted)
}

/// Bring one strategy's Deployment in line (see [`strategies`]).
async fn strategy(
    ctx: &Context,
    r: &Replace,
    st: &AutoscalingStrategy,
    groups: &[Arc<ScalingGroup>],
    seen: String,
    expect: &mut Expect,
    acted: &mut bool,
) -> Result<Option<Duration>> {
    let (ns, name) = (&st.spec.deployment_namespace, &st.spec.deployment_name);
    // Names from a spec reach a URL only once they are names.
    if !crate::api::common::is_dns_label(ns) {
        return Err(crate::error::Error::Invalid(format!(
            "spec.deploymentNamespace {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        )));
    }
    if !crate::api::common::is_node_name(name) {
        return Err(crate::error::Error::Invalid(format!(
            "spec.deploymentName {name:?} is not a Deployment name (a DNS subdomain: lowercase letters, digits, '-' and '.')"
        )));
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.effects.client.clone(), ns, &Kind::Deployment.resource());
    let deployment = api
        .get_opt(name)
        .await
        .map_err(crate::error::Error::kube(format!(
            "reading Deployment {ns}/{name}"
        )))?;
    let value = deployment.map(|d| serde_json::to_value(d).unwrap_or_default());
    let effects = replace::strategy(st, groups, value.as_ref());
    if effects.is_empty() {
        lock(&r.strategy_checked).insert(st.name_any(), seen);
        return Ok(None);
    }
    for e in &effects {
        if let Effect::PatchObject { name, .. } = e {
            log::info!(
                "AutoscalingStrategy {}: Deployment {name} to {} replica(s)",
                st.name_any(),
                if st.spec.enabled { 1 } else { 0 }
            );
        }
        let outcome = ctx.effects.perform(e).await?;
        if let (
            Effect::WriteObjectStatus { .. },
            Outcome::ObjectWritten {
                kind,
                name,
                resource_version,
            },
        ) = (e, &outcome)
        {
            expect
                .written
                .push((*kind, name.clone(), resource_version.clone()));
        }
    }
    *acted = true;
    Ok(None)
}

/// The `Kind/name` keys of the replacement objects whose failures the
/// scheduler's memory keeps (see `cluster::Failing`).
pub fn keys(ctx: &Context) -> Vec<String> {
    let Some(r) = &ctx.replace else {
        return Vec::new();
    };
    typed::<AutoscalingStrategy>(&r.stores.strategies)
        .iter()
        .map(|s| Subject::typed(s.as_ref()).key)
        .collect()
}

/// Create a ScalingGroup for each group the provider lists that has none
/// (at start, then every 15 minutes), and delete the ones nodekeeper
/// created whose group is gone. A ScalingGroup someone else created is
/// never deleted (Constellation deletes every undiscovered one).
async fn list_groups(ctx: &Context, r: &Replace) -> Option<Duration> {
    {
        let listed = lock(&r.groups_listed);
        if let Some(next) = listed.next
            && next > Instant::now()
        {
            return Some(next - Instant::now());
        }
    }
    let answer = match ctx
        .effects
        .perform(&Effect::Provider {
            key: "list-scaling-groups".into(),
            verb: "list-scaling-groups",
            request: serde_json::json!({}),
        })
        .await
    {
        Ok(Outcome::ProviderAnswered(v)) => v,
        other => {
            // Asked again soon (30 s doubling to the period), not only
            // after a whole period: the time is recorded after the answer.
            let mut listed = lock(&r.groups_listed);
            listed.failures = listed.failures.saturating_add(1);
            let delay = (LIST_GROUPS_RETRY * (1 << listed.failures.min(5))).min(LIST_GROUPS_EVERY);
            listed.next = Some(Instant::now() + delay);
            match other {
                Ok(Outcome::ProviderFailed(e)) => log::warn!("node replacement: {e}"),
                Err(e) => log::warn!("node replacement: listing scaling groups: {e}"),
                _ => {}
            }
            return Some(delay);
        }
    };
    *lock(&r.groups_listed) = Listed {
        next: Some(Instant::now() + LIST_GROUPS_EVERY),
        failures: 0,
    };
    let existing: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let nv_name = typed::<NodeVersion>(&r.stores.versions)
        .first()
        .map(|v| v.name_any())
        .unwrap_or_else(|| NODE_VERSION_NAME.to_string());
    let effects = replace::discovered_groups(&answer, &existing, &nv_name);
    for e in effects {
        if let Err(err) = ctx.effects.perform(&e).await {
            log::warn!("node replacement: scaling groups: {err}");
        }
    }
    Some(LIST_GROUPS_EVERY)
}
