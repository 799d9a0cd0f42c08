//! The mutex operator's APIs in the loop (cluster role without a pool
//! selector only: a run spans the cluster's ClusterVersion and pools).
//! At start, [`discover`] asks which APIs are served — the three mutex
//! CRDs (installed with `nodekeeper crds --mutex`), MachineConfigPools,
//! ClusterVersions — and only those are watched, so a cluster without them
//! costs nothing. Every event triggers the anchor's pass, which runs
//! [`reconcile`] after the UpgradePlans.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use smol::stream::{Stream, StreamExt};

use super::context::Context;
pub use super::stores::MutexStores;
use crate::api::mutex::*;
use crate::decide::mutex::{self, RunSnapshot};
use crate::decide::{Effect, Outcome, earliest};
use crate::error::Result;
use crate::runtime::Latch;

/// Which of the APIs the mutex flow uses are served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Discovery {
    /// The three mutex CRDs.
    pub mutex: bool,
    pub pools: bool,
    pub cluster_versions: bool,
}

pub(super) async fn served(client: &Client, ar: &ApiResource) -> Result<bool> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(crate::error::Error::kube(format!(
            "checking whether {} is served",
            ar.plural
        ))(e)),
    }
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

/// The typed objects of an untyped store; one that does not parse is
/// logged and skipped (the API server's schema makes that rare).
pub(super) fn typed<K: serde::de::DeserializeOwned>(store: &Store<DynamicObject>) -> Vec<Arc<K>> {
    store
        .state()
        .iter()
        .filter_map(|o| {
            let v = serde_json::to_value(&**o).ok()?;
            match serde_json::from_value::<K>(v) {
                Ok(k) => Some(Arc::new(k)),
                Err(e) => {
                    log::warn!("{}: cannot be read: {e}", o.name_any());
                    None
                }
            }
        })
        .collect()
}

pub(super) type Trigger = std::pin::Pin<Box<dyn Stream<Item = ()> + Send>>;

pub(super) fn watch_dynamic(
    client: &Client,
    ar: &ApiResource,
    latch: Latch,
) -> (Store<DynamicObject>, Trigger) {
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let events = watcher(api, super::watch_config())
        .backoff(super::stores::WatchBackoff::default())
        .reflect(writer)
        .inspect(move |ev| super::stores::observe(ev, &latch, |_| {}))
        .touched_objects()
        .filter_map(|r| r.ok().map(|_| ()));
    (store, Box::pin(events))
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
    crate::runtime::spawn(async move {
        for l in &latches {
            l.wait().await;
        }
        synced.open();
    })
    .detach();
    let merged = triggers
        .into_iter()
        .reduce(|a, b| Box::pin(smol::stream::or(a, b)))
        .unwrap_or_else(|| Box::pin(smol::stream::pending()));
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

/// Decide and act for every MutexRule, MutexTarget and MutexRunConfig.
pub async fn reconcile(ctx: &Context) -> Result<Option<Duration>> {
    let Some(m) = &ctx.mutex else {
        return Ok(None);
    };
    let now = Timestamp::now();
    let nodes = ctx.all_nodes();
    let (pools, pool_versions) = match &m.pools {
        None => (None, BTreeMap::new()),
        Some(store) => {
            let mut views = BTreeMap::new();
            let mut versions = BTreeMap::new();
            for p in store.state() {
                let view: PoolView =
                    serde_json::from_value(p.data["spec"].clone()).unwrap_or_default();
                views.insert(p.name_any(), view);
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
            .map(|o| ClusterVersionView::from_json(&serde_json::to_value(&*o).unwrap_or_default()))
    });
    let mut effects: Vec<Effect> = Vec::new();
    let rules: Vec<Arc<MutexRule>> = typed(&m.rules);
    for r in &rules {
        effects.extend(mutex::rule(r, now));
    }
    let targets: Vec<Arc<MutexTarget>> = typed(&m.targets);
    for t in &targets {
        effects.extend(mutex::target(t, pools.as_ref(), &nodes, now));
    }
    perform(ctx, &effects).await?;
    if !effects.is_empty() {
        // Runs read the statuses just written: decide them on the next
        // pass, which those writes trigger.
        return Ok(None);
    }
    let jobs: HashMap<String, crate::decide::jobs::JobState> = ctx.jobs_by_key();
    let job_errors = ctx.job_errors();
    let mut wake = None;
    for run in typed::<MutexRunConfig>(&m.runs) {
        let plan = mutex::run(&RunSnapshot {
            run: &run,
            rules: &rules,
            targets: &targets,
            pools: pools.as_ref(),
            pool_versions: &pool_versions,
            cluster_version: cluster_version.as_ref(),
            nodes: &nodes,
            jobs: &jobs,
            job_errors: &job_errors,
            now,
        });
        perform(ctx, &plan.effects).await?;
        if let crate::decide::Then::Wait(d) = plan.then {
            wake = earliest(wake, d);
        }
    }
    Ok(wake)
}

async fn perform(ctx: &Context, effects: &[Effect]) -> Result<()> {
    for effect in effects {
        log::debug!("mutex: {}", crate::effects::describe(effect));
        let outcome = ctx.effects.perform(effect).await?;
        ctx.remember(&outcome);
        if let (Effect::CreateJob { job }, Outcome::JobRefused(why)) = (effect, &outcome) {
            let key = crate::decide::upgrade::job_key(
                job.metadata.namespace.as_deref().unwrap_or_default(),
                &job.name_any(),
            );
            log::warn!("mutex: Job {key} refused: {why}");
            ctx.set_job_error(key, why.clone());
        }
    }
    Ok(())
}
