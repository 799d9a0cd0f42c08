//! `nodekeeper run`: the service, wired here (wiring only). One
//! kube-runtime `Controller` whose object is the Node; every kind the
//! process reads (pods, NodeMaintenances, RebootPolicies, UpgradePlans,
//! Jobs by the managed-by label, the mutex operator's and Constellation's
//! kinds where served) is watched once and reflected into a store that is
//! both a trigger and the snapshot decisions read.
//!
//! The node role watches its own Node and only the pods bound to it (field
//! selectors); its policies and plans trigger its own node's reconcile. The
//! cluster role (`--all-nodes`) runs only while it holds the leader lease
//! ([`roles`]); its node controller reconciles nodes, and every kind the
//! cluster-wide passes read kicks their scheduler ([`cluster`]) or the
//! replacement task ([`replace`]) instead of a node. Its pods are watched
//! per drained node and per gate ([`pod_watches`]), started and stopped as
//! it needs them.

pub mod admission;
pub mod alerts;
pub mod channels;
pub mod cluster;
pub mod config;
pub mod connect;
pub mod contain;
pub mod context;
pub mod executor;
pub mod failing;
pub mod fresh;
pub mod gate_answers;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod mutex;
pub mod notifier;
pub mod passes;
pub mod planned;
pub mod pod_watches;
pub mod reboots;
pub mod reconcile;
pub mod replace;
pub mod requests;
pub mod roles;
#[cfg(test)]
mod scripted_tests;
pub mod stores;
pub mod upgrades;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::api::pod::Pod;
use k8s_openapi::api::core::v1::Node;
use kube::api::ApiResource;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use smol::stream::StreamExt;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::api::upgrade::UpgradePlan;
use crate::effects::Interpreter;
use crate::error::{Error, Result};
use crate::runtime::Latch;
pub use config::RunConfig;
use context::Context;
use roles::{Scope, map_maintenance};
use stores::{Fresh, Stores, Synced};
use watch::{WatchBackoff, observe, slim_job, slim_node, watch_config, watch_ok};

/// Run the service until `shutdown` resolves (or leadership is lost).
pub async fn run(
    config: RunConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let client = connect::connect_with(config.kubeconfig.as_deref(), config.transport).await?;
    if let Some(node) = &config.node {
        connect::require_node(&client, node).await?;
    }
    require_crds(&client).await?;
    // Evictions are streams of one connection over HTTP/2, but each holds a
    // TLS connection over HTTP/1.1 (also when the server refuses h2).
    let http2 = connect::speaks_http2(&client).await;
    let evictions_in_flight = config.evictions_in_flight.unwrap_or(if http2 {
        crate::effects::evict::HTTP2_IN_FLIGHT
    } else {
        crate::effects::evict::HTTP1_IN_FLIGHT
    });
    log::info!(
        "talking {} to the API server; up to {evictions_in_flight} evictions in flight",
        if http2 { "HTTP/2" } else { "HTTP/1.1" }
    );
    // The pod watch reads over an HTTP/1.1 connection of its own. A drain
    // makes several hundred pod events in a second, and a pod watch
    // selected by spec.nodeName has a buffer of only 10 events in the API
    // server's watch cache: served over HTTP/2 (each event handed to the
    // connection's writer) the server fell behind and closed it as
    // unresponsive, 3–13 times in 5 drains of `just bench-drain`, and
    // also with the watches on an HTTP/2 connection apart from the
    // evictions; over HTTP/1.1 (the handler writes to the socket itself)
    // never, in 15 drains.
    let pod_client = if http2 {
        connect::connect_with(config.kubeconfig.as_deref(), connect::Transport::Http1Only).await?
    } else {
        client.clone()
    };
    let (scope, identity) = match &config.node {
        Some(node) => {
            log::info!("nodekeeper {} owns node {node}", env!("CARGO_PKG_VERSION"));
            (Scope::Node(node.clone()), node.clone())
        }
        None => {
            log::info!(
                "nodekeeper {} runs for all nodes",
                env!("CARGO_PKG_VERSION")
            );
            if let Some(sel) = &config.node_selector
                && roles::equality_terms(sel).is_none()
            {
                log::warn!(
                    "--node-selector {sel:?} is not key=value terms, so no RebootPolicy provably lies in this pool: RebootPolicies are left to other cluster roles"
                );
            }
            (
                Scope::AllNodes {
                    selector: config.node_selector.clone(),
                },
                config.identity.clone(),
            )
        }
    };

    // Serve health before waiting for leadership: a standby replica is alive.
    let (nms, nm_writer) = reflector::store::<NodeMaintenance>();
    let (policies, policy_writer) = reflector::store::<RebootPolicy>();
    if let Some(addr) = config.metrics_address {
        metrics::serve(addr, nms.clone(), policies.clone()).await?;
    }
    // The webhook reads the API server, not our stores: a standby replica
    // and an agent still listing answer as well.
    let webhook = match config.admission.clone() {
        Some(admission) => Some(admission::serve(admission, client.clone()).await?.1),
        None => None,
    };

    // One latch for "stop now": SIGTERM, or a lost leader lease. The wait
    // for leadership, the controller's graceful shutdown and the shutdown
    // bound below all watch it.
    let stopping = Latch::default();
    {
        let stopping = stopping.clone();
        crate::runtime::spawn(async move {
            shutdown.await;
            // Checks still running (a hanging sentinel command) answer no
            // one now; they stop with us.
            crate::effects::host::stop_checks();
            stopping.open();
        })
        .detach();
    }
    metrics::set_role(match &scope {
        Scope::Node(n) => metrics::Role::Node(n.clone()),
        Scope::AllNodes { .. } => metrics::Role::Cluster,
    });
    let lost_leadership: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let mut gate = crate::effects::gate::LeaderGate::always();
    let mut leadership = None;
    if matches!(scope, Scope::AllNodes { .. }) {
        let lead = leader::lead(
            client.clone(),
            config.leader_namespace.clone(),
            config.leader_lease.clone(),
            identity.clone(),
        );
        // A standby waiting for the lease still stops on SIGTERM.
        let waiting = async {
            stopping.wait().await;
            None
        };
        let Some(won) = smol::future::or(async { Some(lead.await) }, waiting).await else {
            log::info!("stopped before becoming the leader");
            if let Some(webhook) = &webhook {
                webhook.withdraw().await;
            }
            return Ok(());
        };
        let won = won?;
        gate = won.gate.clone();
        metrics::export_cluster_gauges();
        let (stopping, lost, lost_rx) =
            (stopping.clone(), lost_leadership.clone(), won.lost.clone());
        leadership = Some(won);
        crate::runtime::spawn(async move {
            if let Ok(why) = lost_rx.recv().await {
                *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            }
            stopping.open();
        })
        .detach();
    }

    let node_wc = match &scope {
        Scope::Node(n) => watch_config().fields(&format!("metadata.name={n}")),
        Scope::AllNodes {
            selector: Some(sel),
        } => watch_config().labels(sel),
        Scope::AllNodes { selector: None } => watch_config(),
    };

    // Every kind is reflected by our own watcher so that we see its first
    // full list (readiness, through a latch every waiter can share) and its
    // deletions (pruning our mutation cache).
    let synced = Synced::default();
    // The cluster role's cluster-wide work runs on its scheduler
    // (`cluster.rs`) and replacement on its own task; each watch of a kind
    // they read kicks them. The node role has neither.
    let cluster_role = matches!(scope, Scope::AllNodes { .. });
    let (kick, kicks) = passes::Kick::new();
    let planned_kick = kick.clone();
    let (replace_kick, replace_kicks) = passes::Kick::new();
    let (anchor_kick, anchor_kicks) = passes::Kick::new();
    let (plans, plan_writer) = reflector::store::<UpgradePlan>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let fresh = Arc::new(Fresh::default());
    let arrivals = Arc::new(stores::Arrivals::default());
    let node_events = {
        let (latch, fresh) = (synced.nodes.clone(), fresh.clone());
        let changes = watch::NodeChanges::default();
        watcher(Api::<Node>::all(client.clone()), node_wc)
            .backoff(WatchBackoff::default())
            .modify(slim_node)
            .reflect(node_writer)
            .inspect(move |ev| observe(ev, &latch, |name| fresh.nodes.forget(name)))
            // Heartbeats update the store but trigger nothing.
            .filter(move |ev| !cluster_role || changes.matters(ev))
            .inspect(passes::on_event(
                cluster_role,
                vec![kick.clone(), replace_kick.clone()],
            ))
            .touched_objects()
            .filter(|r| watch_ok(r, "nodes"))
    };
    // The node role watches its own node's pods for its whole life; the
    // cluster role only the pods of nodes it drains and of its gates
    // (`pod_watches.rs`), whose events come back on `pod_reconciles` (a
    // node's) or kick the scheduler (a gate's).
    let (pod_reconcile, pod_reconciles) = smol::channel::unbounded::<ObjectRef<Node>>();
    let (pods, pod_events): (Arc<pod_watches::PodWatches>, watch::Trigger) = match &scope {
        Scope::Node(n) => {
            let (store, pod_writer) = reflector::store::<Pod>();
            let latch = synced.pods.clone();
            let wc = watch_config().fields(&format!("spec.nodeName={n}"));
            let events = watcher(Api::<Pod>::all(pod_client.clone()), wc)
                .backoff(WatchBackoff::default())
                // No `modify`: `api::pod::Pod` reads only what the drain needs.
                .reflect(pod_writer)
                .inspect(move |ev| observe(ev, &latch, |_| {}))
                .touched_objects()
                .filter(|r| watch_ok(r, "pods"))
                .map(|_| ());
            (Arc::new(pod_watches::fixed(store)), Box::pin(events))
        }
        Scope::AllNodes { .. } => {
            synced.pods.open();
            let pods = pod_watches::scoped(pod_client.clone(), pod_reconcile, kick.clone());
            (Arc::new(pods), Box::pin(smol::stream::pending()))
        }
    };
    let nm_wc = roles::maintenance_watch(&client, &scope).await;
    let nm_events = {
        let (latch, fresh, order) = (synced.maintenances.clone(), fresh.clone(), arrivals.clone());
        watcher(Api::<NodeMaintenance>::all(client.clone()), nm_wc)
            .backoff(WatchBackoff::default())
            .inspect(move |ev| order.note(ev))
            .reflect(nm_writer)
            .inspect(move |ev| observe(ev, &latch, |name| fresh.maintenances.forget(name)))
            .inspect(passes::on_event(
                cluster_role,
                vec![kick.clone(), replace_kick.clone()],
            ))
            .touched_objects()
            .filter(|r| watch_ok(r, "NodeMaintenances"))
    };

    let policy_events = {
        let (latch, fresh) = (synced.policies.clone(), fresh.clone());
        watcher(Api::<RebootPolicy>::all(client.clone()), watch_config())
            .backoff(WatchBackoff::default())
            .reflect(policy_writer)
            .inspect(move |ev| observe(ev, &latch, |name| fresh.policies.forget(name)))
            .inspect(passes::on_event(cluster_role, vec![kick.clone()]))
            .touched_objects()
            .filter(|r| watch_ok(r, "RebootPolicies"))
    };

    let plan_events = {
        let (latch, fresh) = (synced.plans.clone(), fresh.clone());
        watcher(Api::<UpgradePlan>::all(client.clone()), watch_config())
            .backoff(WatchBackoff::default())
            .reflect(plan_writer)
            .inspect(move |ev| observe(ev, &latch, |name| fresh.plans.forget(name)))
            .inspect(passes::on_event(cluster_role, vec![kick.clone()]))
            .touched_objects()
            .filter(|r| watch_ok(r, "UpgradePlans"))
    };
    // Hook Jobs: the cluster role's, by their plan label. The node role
    // runs none and may not list them.
    let job_resource = ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&());
    let job_writer =
        reflector::store::Writer::<kube::api::DynamicObject>::new(job_resource.clone());
    let jobs = job_writer.as_reader();
    let job_events: std::pin::Pin<
        Box<
            dyn smol::stream::Stream<
                    Item = std::result::Result<kube::api::DynamicObject, watcher::Error>,
                > + Send,
        >,
    > = if matches!(scope, Scope::AllNodes { .. }) {
        let latch = synced.jobs.clone();
        let jobs_wc = watch_config().labels(&format!(
            "{}={}",
            crate::decide::jobs::MANAGED_BY_LABEL,
            crate::decide::jobs::MANAGED_BY
        ));
        Box::pin(
            watcher(
                Api::<kube::api::DynamicObject>::all_with(client.clone(), &job_resource),
                jobs_wc,
            )
            .backoff(WatchBackoff::default())
            .modify(slim_job)
            .reflect(job_writer)
            .inspect(move |ev| observe(ev, &latch, |_| {}))
            .inspect(passes::on_event(cluster_role, vec![kick.clone()]))
            .touched_objects()
            .filter(|r| watch_ok(r, "Jobs")),
        )
    } else {
        synced.jobs.open();
        Box::pin(smol::stream::pending())
    };

    // The mutex operator's APIs: only an unscoped cluster role runs them,
    // and only what the API server serves is watched.
    let discovery = if scope.sees_all_nodes() {
        mutex::discover(&client).await?
    } else {
        mutex::Discovery::default()
    };
    if discovery.mutex {
        log::info!(
            "the mutex operator's APIs are served: reconciling MutexRules, MutexTargets and MutexRunConfigs (MachineConfigPools {}, ClusterVersions {})",
            if discovery.pools {
                "served"
            } else {
                "not served"
            },
            if discovery.cluster_versions {
                "served"
            } else {
                "not served"
            }
        );
    }
    let (mutex_stores, mutex_events) = mutex::start(&client, discovery, synced.mutex.clone());
    // Constellation's APIs: any cluster role given a provider plugin.
    let (replace_stores, replace_events) = if matches!(scope, Scope::AllNodes { .. }) {
        replace::start(&client, config.provider.is_some(), synced.replace.clone()).await?
    } else {
        synced.replace.open();
        (None, Box::pin(smol::stream::pending()) as watch::Trigger)
    };

    // Watch errors stop at the watchers (each backs off on its own, see
    // WatchBackoff): kube's Controller would otherwise put its own
    // backoff (up to 30 s) on the merged trigger stream, and one failing
    // watch would hold back the events of all the others.
    //
    // At most RECONCILES_AT_ONCE node reconciles run at once; the rest
    // wait in the controller's queue as object references. Unbounded, a
    // start-up on 5 000 nodes parked 5 000 reconcile futures on the first
    // full list of every kind (`synced`), and the allocator kept their
    // memory: 79.8 MiB after a restart against 43.4 MiB while the same
    // cluster grew.
    let controller = Controller::for_stream(node_events, nodes.clone())
        .with_config(ControllerConfig::default().concurrency(RECONCILES_AT_ONCE))
        .trigger_backoff(WatchBackoff::default());
    let events = crate::effects::events::Events::new(client.clone(), "nodekeeper", Some(identity));
    let ctx = Arc::new(Context::new(
        Interpreter {
            client: client.clone(),
            events,
            evictions: crate::effects::evict::Permits::new(evictions_in_flight),
            exec: config.host_exec,
            records: config.command_records.clone(),
            talos: crate::effects::talos::Machined {
                socket: config.talos_socket.clone(),
            },
            provider: config.provider.clone(),
            gate,
        },
        scope.clone(),
        Stores {
            nodes: nodes.clone(),
            pods,
            maintenances: nms,
            policies,
            plans,
            jobs,
            synced: synced.clone(),
            fresh,
            arrivals,
        },
        config.drain_timeout,
        config.node_agents,
        crate::effects::host::HostRoot(config.host_root.clone()),
        anchor_kick,
    ));

    metrics::watch_sizes(metrics::Watched {
        nodes: ctx.nodes.clone(),
        pods: ctx.pods.clone(),
        jobs: ctx.jobs.clone(),
    });
    if cluster_role {
        ctx.notify.configure(
            client.clone(),
            config.leader_namespace.clone(),
            config.notify_default.clone(),
            planned_kick.clone(),
        );
        ctx.channels
            .configure(config.channel_interval, planned_kick.clone());
        let versions = replace_stores.as_ref().map(|r| r.stores.versions.clone());
        cluster::start(ctx.clone(), mutex_stores, versions, kicks);
        replace::start_task(
            ctx.clone(),
            replace_stores,
            replace_kick.clone(),
            replace_kicks,
        );
    }

    // /readyz turns green once every watch has listed once; the watchdog
    // behind /healthz starts counting now.
    metrics::progress();
    crate::runtime::spawn(async move {
        synced.wait().await;
        metrics::set_ready();
    })
    .detach();

    // The heartbeat: the anchor node is reconciled at least this often, so
    // a loop that stops making progress shows on /healthz, and foreign
    // objects and per-node memory get looked after even in a quiet cluster.
    let beat_scope = scope.clone();
    let beat_nodes = nodes.clone();
    let heartbeat = smol::Timer::interval(metrics::HEARTBEAT).filter_map(move |_| {
        let anchor = roles::anchor(&beat_scope, &beat_nodes);
        if anchor.is_none() {
            // A cluster role whose selector matches no node yet has nothing
            // to reconcile, and nothing that could be wedged: idle is
            // progress, or /healthz would restart it forever.
            metrics::progress();
        }
        anchor.map(|n| ObjectRef::<Node>::new(&n))
    });

    let nm_scope = scope.clone();
    let nm_nodes = nodes.clone();
    let (policy_scope, policy_nodes) = (scope.clone(), nodes.clone());
    let (plan_scope, plan_nodes) = (scope.clone(), nodes.clone());
    let stop = {
        let stopping = stopping.clone();
        async move { stopping.wait().await }
    };
    let run = controller
        // The node role's pod events reconcile its node; the cluster
        // role's come from the watches of the nodes it drains.
        .reconcile_on(pod_events.filter_map({
            let (scope, nodes) = (scope.clone(), nodes.clone());
            move |_| own_node(&scope, &nodes)
        }))
        .reconcile_on(pod_reconciles)
        .watches_stream(nm_events, move |nm: NodeMaintenance| {
            map_maintenance(&nm, &nm_scope, &nm_nodes)
        })
        // In the node role a policy or plan concerns the own node's reboot
        // or upgrade step. In the cluster role they (and Jobs, and the
        // mutex and replacement kinds) only kick the scheduler or the
        // replacement task (see where the watches are built): no node
        // reconcile runs for them.
        .watches_stream(policy_events, move |_: RebootPolicy| {
            own_node(&policy_scope, &policy_nodes)
        })
        .watches_stream(plan_events, move |_: UpgradePlan| {
            own_node(&plan_scope, &plan_nodes)
        })
        .watches_stream_with(job_events, |_: kube::api::DynamicObject| None, job_resource)
        .reconcile_on(heartbeat)
        .reconcile_on(mutex_events.filter_map(move |_| {
            kick.kick();
            None::<ObjectRef<Node>>
        }))
        .reconcile_on(replace_events.filter_map(move |_| {
            // The scheduler's pass publishes MaintenancePlanned from the
            // NodeVersions' outdated nodes too.
            replace_kick.kick();
            planned_kick.kick();
            None::<ObjectRef<Node>>
        }))
        // Work found outside the controller for NodeMaintenances no agent
        // owns goes through the anchor's reconcile.
        .reconcile_on({
            let (scope, nodes) = (scope.clone(), nodes.clone());
            anchor_kicks.filter_map(move |_| {
                roles::anchor(&scope, &nodes).map(|a| ObjectRef::<Node>::new(&a))
            })
        })
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, error_policy, ctx)
        .for_each(|res| {
            metrics::progress();
            match res {
                Ok((obj, _)) => log::trace!("reconciled node {}", obj.name),
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    log::debug!("reconcile of node {} failed: {e}", obj.name)
                }
                Err(e) => log::debug!("controller: {e}"),
            }
        });
    // Graceful shutdown lets reconciles in flight finish; a wedged one must
    // not keep the process alive (kubelet and systemd would SIGKILL it
    // eventually, but a bounded stop is ours to give).
    let bound = async {
        stopping.wait().await;
        crate::runtime::sleep(SHUTDOWN_GRACE).await;
        log::warn!(
            "reconciles still running {} s after the shutdown request; stopping without them",
            SHUTDOWN_GRACE.as_secs()
        );
    };
    smol::future::or(run, bound).await;
    let lost = lost_leadership
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(why) = lost {
        if let Some(webhook) = &webhook {
            webhook.withdraw().await;
        }
        return Err(Error::LostLease(format!(
            "{why}; exiting so a fresh start can compete again"
        )));
    }
    if let Some(won) = leadership {
        won.step_down().await;
    }
    if let Some(webhook) = &webhook {
        webhook.withdraw().await;
    }
    crate::effects::host::stop_checks();
    log::info!("stopped");
    Ok(())
}

/// The node role's own node (the anchor), for kinds that concern only its
/// own reboot or upgrade step; nothing in the cluster role.
fn own_node(
    scope: &Scope,
    nodes: &kube::runtime::reflector::Store<Node>,
) -> Option<ObjectRef<Node>> {
    match scope {
        Scope::Node(_) => roles::anchor(scope, nodes).map(|a| ObjectRef::<Node>::new(&a)),
        Scope::AllNodes { .. } => None,
    }
}

/// Node reconciles at once (see where the controller is built). A drain's
/// reconcile holds its slot while its evictions are in flight, so this is
/// also how many nodes a cluster role without agents drains at once: far
/// above what budgets admit, and the evictions share one in-flight limit.
const RECONCILES_AT_ONCE: u16 = 128;

/// How long reconciles in flight may run on after SIGTERM or a lost lease.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn error_policy(node: Arc<Node>, err: &Error, ctx: Arc<Context>) -> Action {
    metrics::inc(&metrics::COUNTERS.reconcile_errors);
    metrics::count_error(err);
    // 409: someone wrote first (the scheduler's conditions, a kubelet's
    // status, another feature's annotation); re-read promptly rather than
    // back off. It is optimistic concurrency doing its job, not a fault:
    // logged at debug and counted in the metrics, where a warning for
    // every such race was noise. Conflicts in a row back off (200 ms
    // doubling to 5 s), and a long run of them is warned about: another
    // writer fighting over the same object was a silent 5 Hz loop.
    let (retry, level) = match err.api_code() {
        Some(409) => match ctx.failing.conflicted(&conflict_key(&node.name_any())) {
            Ok(wait) => (wait, log::Level::Debug),
            Err(_) => (Duration::from_secs(5), log::Level::Warn),
        },
        _ => (Duration::from_secs(5), log::Level::Warn),
    };
    log::log!(
        level,
        "node {}: {err} (retrying in {retry:?})",
        node.name_any()
    );
    Action::requeue(retry)
}

/// The key a node's conflicts in a row are counted under.
pub(crate) fn conflict_key(node: &str) -> String {
    format!("Node/{node}")
}

/// Exit with an install hint unless every CRD we reconcile is served.
pub async fn require_crds(client: &Client) -> Result<()> {
    watch::check_served(
        client,
        &[
            ApiResource::erase::<NodeMaintenance>(&()),
            ApiResource::erase::<RebootPolicy>(&()),
            ApiResource::erase::<UpgradePlan>(&()),
        ],
    )
    .await
}
