//! The mutex operator's APIs in the loop (cluster role without a pool
//! selector only: a run spans the cluster's ClusterVersion and pools).
//! At start, [`discover`] asks which APIs are served — the three mutex
//! CRDs (installed with `nodekeeper crds --mutex`), MachineConfigPools,
//! ClusterVersions — and only those are watched, so a cluster without them
//! costs nothing. Every event triggers the anchor's pass, which runs
//! [`pass`] after the UpgradePlans.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};

use super::contain::contain;
use super::context::Context;
use super::executor;
use super::failing::Subject;
use super::watch::{Trigger, read, served, watch_dynamic};
use crate::api::mutex::*;
use crate::decide::mutex::{self, RunSnapshot};
use crate::decide::{Effect, Outcome, Plan, Then, earliest};
use crate::error::{Error, Result};
use crate::runtime::Latch;

/// The stores of the mutex flow. Every kind is watched untyped (one
/// watcher instantiation for all five: each typed watcher costs the binary
/// ~25 KiB) and read typed when a pass runs.
pub struct MutexStores {
    pub rules: Store<kube::api::DynamicObject>,
    pub targets: Store<kube::api::DynamicObject>,
    pub runs: Store<kube::api::DynamicObject>,
    pub pools: Option<Store<kube::api::DynamicObject>>,
    pub versions: Option<Store<kube::api::DynamicObject>>,
}

/// Which of the APIs the mutex flow uses are served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Discovery {
    /// The three mutex CRDs.
    pub mutex: bool,
    pub pools: bool,
    pub cluster_versions: bool,
}

pub async fn discover(client: &Client) -> Result<Discovery> {
    let mutex = served(client, &ApiResource::erase::<MutexRunConfig>(&())).await?;
    if !mutex {
        return Ok(Discovery::default());
    }
    Ok(Discovery {
        mutex,
        pools: served(client, &pool_resource()).await?,
        cluster_versions: served(client, &cluster_version_resource()).await?,
    })
}

/// Watch what `d` says is served; `synced` opens once every watch listed.
/// Returns the stores and one stream of "something changed".
pub fn start(client: &Client, d: Discovery, synced: Latch) -> (Option<MutexStores>, Trigger) {
    if !d.mutex {
        synced.open();
        return (None, Box::pin(smol::stream::pending()));
    }
    let latches: Vec<Latch> = (0..5).map(|_| Latch::default()).collect();
    let erase = |ar: ApiResource, l: &Latch| watch_dynamic(client, &ar, l.clone());
    let (rules, t1) = erase(ApiResource::erase::<MutexRule>(&()), &latches[0]);
    let (targets, t2) = erase(ApiResource::erase::<MutexTarget>(&()), &latches[1]);
    let (runs, t3) = erase(ApiResource::erase::<MutexRunConfig>(&()), &latches[2]);
    let mut triggers: Vec<Trigger> = vec![t1, t2, t3];
    let pools = if d.pools {
        let (s, t) = watch_dynamic(client, &pool_resource(), latches[3].clone());
        triggers.push(t);
        Some(s)
    } else {
        latches[3].open();
        None
    };
    let versions = if d.cluster_versions {
        let (s, t) = watch_dynamic(client, &cluster_version_resource(), latches[4].clone());
        triggers.push(t);
        Some(s)
    } else {
        latches[4].open();
        None
    };
    super::watch::open_when_all(latches, synced);
    let merged = super::watch::merge(triggers);
    (
        Some(MutexStores {
            rules,
            targets,
            runs,
            pools,
            versions,
        }),
        merged,
    )
}

/// The `Kind/namespace/name` keys of every mutex object (what the
/// scheduler's per-object memory may keep).
pub fn keys(m: &MutexStores) -> Vec<String> {
    let mut keys = Vec::new();
    for (store, kind) in [
        (&m.rules, MutexRule::kind(&())),
        (&m.targets, MutexTarget::kind(&())),
        (&m.runs, MutexRunConfig::kind(&())),
    ] {
        keys.extend(store.state().iter().map(|o| subject(&kind, o).key));
    }
    keys
}

fn subject(kind: &str, o: &DynamicObject) -> Subject {
    Subject::of(&MutexRule::api_version(&()), kind, &o.metadata)
}

/// Report the objects of a kind that do not parse, each on its own (they
/// are skipped, never acted on with defaults in their place).
async fn report_unreadable(
    ctx: &Context,
    kind: &str,
    bad: super::watch::Unreadable,
) -> Option<Duration> {
    let mut wake = None;
    for (o, why) in bad {
        let w = contain(ctx, &subject(kind, &o), |_| async move {
            Err(Error::Invalid(format!("cannot be read: {why}")))
        })
        .await;
        wake = earliest(wake, w);
    }
    wake
}

/// The scheduler's pass over every MutexRule, MutexTarget and
/// MutexRunConfig, each on its own (see [`super::contain`]).
pub async fn pass(ctx: &Context, m: &MutexStores) -> Option<Duration> {
    let now = Timestamp::now();
    let nodes = ctx.all_nodes();
    let (pools, pool_versions) = match &m.pools {
        None => (None, BTreeMap::new()),
        Some(store) => {
            let mut views = BTreeMap::new();
            let mut versions = BTreeMap::new();
            for p in store.state() {
                // A pool that does not parse is left out (targets naming it
                // report it missing): a default in its place would have
                // empty matchLabels, which select every node.
                match serde_json::from_value::<PoolView>(p.data["spec"].clone()) {
                    Ok(view) => {
                        views.insert(p.name_any(), view);
                    }
                    Err(e) => {
                        log::warn!("MachineConfigPool {}: cannot be read: {e}", p.name_any());
                        continue;
                    }
                }
                if let Some(rv) = p.resource_version() {
                    versions.insert(p.name_any(), rv);
                }
            }
            (Some(views), versions)
        }
    };
    let cluster_version = m.versions.as_ref().and_then(|s| {
        s.state()
            .into_iter()
            .find(|o| o.name_any() == CLUSTER_VERSION_NAME)
            .and_then(|o| serde_json::to_value(&*o).ok())
            .map(|v| ClusterVersionView::from_json(&v))
    });
    let (rule_kind, target_kind, run_kind) = (
        MutexRule::kind(&()),
        MutexTarget::kind(&()),
        MutexRunConfig::kind(&()),
    );
    let (rules, bad_rules) = read::<MutexRule>(&m.rules);
    let (targets, bad_targets) = read::<MutexTarget>(&m.targets);
    let (runs, bad_runs) = read::<MutexRunConfig>(&m.runs);
    let mut wake = report_unreadable(ctx, &rule_kind, bad_rules).await;
    wake = earliest(
        wake,
        report_unreadable(ctx, &target_kind, bad_targets).await,
    );
    wake = earliest(wake, report_unreadable(ctx, &run_kind, bad_runs).await);
    let mut acted = false;
    for r in &rules {
        let Some(effect) = mutex::rule(r, now) else {
            continue;
        };
        acted = true;
        let w = contain(ctx, &Subject::typed(r.as_ref()), |_| async move {
            // The write kicks the next pass.
            let plan = Plan {
                then: Then::Wait(None),
                ..Plan::steps(vec![effect])
            };
            perform(ctx, &MutexRule::kind(&()), r.as_ref(), plan).await
        })
        .await;
        wake = earliest(wake, w);
    }
    for t in &targets {
        let Some(effect) = mutex::target(t, pools.as_ref(), &nodes, now) else {
            continue;
        };
        acted = true;
        let w = contain(ctx, &Subject::typed(t.as_ref()), |_| async move {
            // The write kicks the next pass.
            let plan = Plan {
                then: Then::Wait(None),
                ..Plan::steps(vec![effect])
            };
            perform(ctx, &MutexTarget::kind(&()), t.as_ref(), plan).await
        })
        .await;
        wake = earliest(wake, w);
    }
    if acted {
        // Runs read the statuses just written: decide them on the next
        // pass, which those writes trigger.
        return wake;
    }
    let jobs: HashMap<String, crate::decide::jobs::JobState> = ctx.jobs_by_key();
    let job_errors = ctx.job_errors();
    for run in &runs {
        let snapshot = RunSnapshot {
            run,
            rules: &rules,
            targets: &targets,
            pools: pools.as_ref(),
            pool_versions: &pool_versions,
            cluster_version: cluster_version.as_ref(),
            nodes: &nodes,
            jobs: &jobs,
            job_errors: &job_errors,
            now,
        };
        let run_kind = &run_kind;
        let w = contain(ctx, &Subject::typed(run.as_ref()), |_| async move {
            perform(ctx, run_kind, run.as_ref(), mutex::run(&snapshot)).await
        })
        .await;
        wake = earliest(wake, w);
    }
    wake
}

/// Perform one object's effects; a Job the API server refuses is recorded
/// for as long as that object exists, so its next decision fails the step
/// instead of creating the Job again.
async fn perform<K: kube::Resource<DynamicType = ()> + Sync>(
    ctx: &Context,
    kind: &str,
    owner: &K,
    plan: Plan,
) -> Result<Option<Duration>> {
    let who = format!("mutex {kind}");
    let then = executor::execute(ctx, &who, plan, |effect, outcome| {
        if let (Effect::CreateJob { job }, Outcome::JobRefused(why)) = (effect, outcome) {
            let key = crate::decide::jobs::key_of(
                job.metadata.namespace.as_deref().unwrap_or_default(),
                &job.name_any(),
            );
            log::warn!("mutex: Job {key} refused: {why}");
            ctx.set_job_error(key, Subject::typed(owner).key, why.clone());
        }
        executor::After::Go
    })
    .await?;
    Ok(executor::wake(then))
}
