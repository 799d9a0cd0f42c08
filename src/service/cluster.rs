//! The cluster role's one scheduler for cluster-wide work. The node
//! controller reconciles nodes only; everything that decides across nodes
//! — RebootPolicies, UpgradePlans, the mutex operator's kinds — runs here,
//! as passes of one task:
//!
//! - **Triggers**: the kinds the passes read (nodes, NodeMaintenances,
//!   policies, plans, Jobs, the mutex kinds; the pods of blocking-pod gates,
//!   watched by selector for as long as a gate names them) each [`Kick`](super::passes::Kick)
//!   the scheduler. Kicks coalesce: any number of them
//!   during a pass make one more pass, never one each.
//! - **One pass at a time**, each feature in turn; a feature's pass never
//!   starts another's.
//! - **Its own wake-up**: a pass returns when it wants to look again
//!   (window boundaries, deadlines, backoff), and the task sleeps until
//!   then or the next kick.
//! - **Errors per object** (`failing.rs`, reported through
//!   [`super::contain`]): an object whose decision fails
//!   gets an event and a `Reconciled=False` condition naming the cause, is
//!   retried with backoff (at once if it changes), and every other object
//!   goes on.
//! - **Last, MaintenancePlanned** (`planned.rs`): each node says whether a
//!   feature waits to disrupt it, from the records the passes wrote.
//!
//! Replacement has its own task (`replace.rs`): provider calls may take
//! their whole timeout and must not hold these passes up.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use super::context::Context;
use super::failing::Subject;
use super::metrics;
use super::mutex::MutexStores;
use super::passes::run_passes;
use super::pod_watches::GateKey;
use crate::decide::earliest;

/// How long a pass waits for a new gate's pods to be listed before it
/// leaves reboots and upgrades for the next pass.
const GATES_LISTED: Duration = Duration::from_secs(5);

/// Run passes until `kicks` closes ([`run_passes`]).
/// `versions`: the NodeVersions, where replacement runs (their outdated
/// nodes are planned, see `planned.rs`).
pub fn start(
    ctx: Arc<Context>,
    mutex: Option<MutexStores>,
    versions: Option<Store<DynamicObject>>,
    kicks: smol::channel::Receiver<()>,
) {
    crate::runtime::spawn(async move {
        ctx.synced.wait().await;
        let (ctx, mutex, versions) = (&*ctx, mutex.as_ref(), versions.as_ref());
        run_passes(&ctx.effects.gate, &kicks, move || async move {
            let started = Instant::now();
            let _busy = metrics::Busy::start("cluster scheduler", metrics::WEDGED_AFTER);
            let wake = pass(ctx, mutex, versions).await;
            metrics::observe_work(metrics::Timed::ClusterPass, started.elapsed());
            metrics::progress();
            wake
        })
        .await;
    })
    .detach();
}

/// One pass: each feature decides for each of its objects, then the
/// nodes say what the features plan (MaintenancePlanned).
async fn pass(
    ctx: &Context,
    mutex: Option<&MutexStores>,
    versions: Option<&Store<DynamicObject>>,
) -> Option<Duration> {
    metrics::inc(&metrics::COUNTERS.cluster_passes);
    ctx.prune_cluster(&live(ctx, mutex));
    let (policies, plans) = (ctx.policies.state(), ctx.plans.state());
    let urls: Vec<&str> = policies
        .iter()
        .filter_map(|p| p.spec.gates.prometheus.as_ref())
        .chain(
            plans
                .iter()
                .filter_map(|p| p.spec.gates.prometheus.as_ref()),
        )
        .map(|g| g.url.as_str())
        .collect();
    ctx.alerts.retain(&urls);
    let health: Vec<_> = policies
        .iter()
        .filter_map(|p| p.spec.gates.health.as_ref())
        .chain(plans.iter().filter_map(|p| p.spec.gates.health.as_ref()))
        .collect();
    ctx.health.retain(&health);
    // Blocking-pod gates read the pods their selectors watch: a gate
    // decided on a watch that has not listed yet would admit a node whose
    // blocking pod it has not seen, so the features wait for it.
    // Only the gates of the objects this replica decides for (a
    // pool-scoped cluster role leaves other pools' to theirs).
    let scope = &ctx.scope;
    let gates: BTreeSet<GateKey> = policies
        .iter()
        .filter(|p| super::roles::handles_policy(scope, p))
        .flat_map(|p| p.spec.gates.blocking_pods.iter())
        .chain(
            plans
                .iter()
                .filter(|p| super::roles::handles_plan(scope, p))
                .flat_map(|p| p.spec.gates.blocking_pods.iter()),
        )
        .filter_map(GateKey::of)
        .collect();
    ctx.pods.want_gates(&gates);
    // Each object waits for its own gates only: a gate whose watch cannot
    // list held up every reboot and upgrade in the cluster, nodes already
    // admitted included. Its object admits nothing and says why; nodes it
    // holds go on.
    let listed = ctx.pods.gates_listed(GATES_LISTED).await;
    let mut wake = earliest(
        super::reboots::pass(ctx).await,
        super::upgrades::pass(ctx).await,
    );
    if !listed {
        log::debug!("some blocking-pod gates are not listed yet; their objects wait");
        wake = earliest(wake, Some(GATES_LISTED));
    }
    if let Some(m) = mutex {
        wake = earliest(wake, super::mutex::pass(ctx, m).await);
    }
    earliest(wake, super::planned::pass(ctx, versions).await)
}

/// The keys of every object a pass decides for (what its per-object memory
/// may keep).
fn live(ctx: &Context, mutex: Option<&MutexStores>) -> HashSet<String> {
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
    if let Some(m) = mutex {
        keys.extend(super::mutex::keys(m));
    }
    keys
}
