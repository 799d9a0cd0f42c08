//! `nodekeeper run`: the service, wired here (wiring only): [`run`] is
//! its stages in order, each a function below; the watches and what each
//! wakes are [`watched`]'s. One
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
pub mod background;
pub mod channels;
pub mod cluster;
pub mod config;
pub mod connect;
pub mod contain;
pub mod context;
pub mod drain_rules;
pub mod elsewhere;
pub mod executor;
pub mod failing;
pub mod fresh;
pub mod gate_answers;
pub mod health;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod mutex;
mod node_controller;
pub mod node_pods;
pub mod notifier;
pub mod own_node;
pub mod passes;
pub mod planned;
pub mod pod_watches;
pub mod read_again;
pub mod reboots;
pub mod reconcile;
pub mod replace;
pub mod requests;
pub mod roles;
#[cfg(test)]
mod scripted_tests;
pub mod stores;
pub mod upgrades;
pub mod volumes;
pub mod watch;
pub mod watched;
pub mod yaml_tree;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Client, ResourceExt};
use smol::stream::StreamExt;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::api::upgrade::UpgradePlan;
use crate::effects::Interpreter;
use crate::error::{Error, Result};
use crate::runtime::Latch;
pub use config::RunConfig;
use context::Context;
pub(crate) use node_controller::conflict_key;
use node_controller::node_controller;
use roles::{Scope, map_maintenance};
use stores::{Stores, Synced};
use watch::WatchBackoff;

/// Run the service until `shutdown` resolves (or leadership is lost).
/// Each stage is a function below, in this order.
pub async fn run(
    config: RunConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let (clients, pods) = Clients::connect(&config).await?;
    let (scope, identity) = scope_of(&config);
    // Serve health before waiting for leadership: a standby replica is alive.
    let (nms, nm_writer) = reflector::store::<NodeMaintenance>();
    let (policies, policy_writer) = reflector::store::<RebootPolicy>();
    let webhook = serve_beside(&config, &clients.api, &nms, &policies).await?;
    let stopping = stop_on(shutdown);
    metrics::set_role(match &scope {
        Scope::Node(n) => metrics::Role::Node(n.clone()),
        Scope::AllNodes { .. } => metrics::Role::Cluster,
    });
    let Some(elected) = elect(&config, &clients.leader, &scope, &identity, &stopping).await? else {
        log::info!("stopped before becoming the leader");
        withdraw(&webhook).await;
        return Ok(());
    };

    let synced = Synced::default();
    let (kick, kicks) = passes::Kick::new();
    let (replace_kick, replace_kicks) = passes::Kick::new();
    let (anchor_kick, anchor_kicks) = passes::Kick::new();
    let early = watched::Early {
        maintenances: nm_writer,
        policies: policy_writer,
        maintenance_watch: clients.maintenances.clone(),
    };
    let wakes = watched::Wakes {
        scheduler: &kick,
        replace: &replace_kick,
    };
    let provider = config.provider.is_some();
    let mut w = watched::start(&clients.api, pods, &scope, provider, &synced, early, wakes).await?;
    let stores = Stores {
        nodes: w.nodes.clone(),
        pods: w.pods.clone(),
        maintenances: nms,
        policies,
        plans: w.plans.clone(),
        drain_rules: w.drain_rules.clone(),
        jobs: w.jobs.clone(),
        synced: synced.clone(),
        fresh: w.fresh.clone(),
        arrivals: w.arrivals.clone(),
    };
    let ctx = context(
        &config,
        &clients,
        &scope,
        identity,
        elected.gate.clone(),
        stores,
        anchor_kick,
    );
    metrics::watch_sizes(metrics::Watched {
        nodes: ctx.nodes.clone(),
        pods: ctx.pods.clone(),
        jobs: ctx.jobs.clone(),
    });
    if matches!(scope, Scope::AllNodes { .. }) {
        start_cluster_role(
            &config,
            &ctx,
            &mut w,
            &kick,
            kicks,
            &replace_kick,
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

    remember_held_leases(&ctx, &scope).await;
    let run = node_controller(
        w,
        &scope,
        ctx,
        &kick,
        &replace_kick,
        anchor_kicks,
        &stopping,
    );
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
    shut_down(elected, &webhook).await
}

/// The medik8s leases this process may hold without remembering them (a
/// new maintenance's lease taken beside a refused finalizer, just before a
/// restart), remembered as held with their renewal due, before any
/// node's first pass: that pass renews a lease a maintenance needs and
/// releases one nothing needs (`decide::maintenance`). One list (the node
/// role: one get); a failed read is said and left to the maintenances.
async fn remember_held_leases(ctx: &Context, scope: &Scope) {
    if ctx.node_agents {
        return;
    }
    let node = match scope {
        Scope::Node(n) => Some(n.as_str()),
        Scope::AllNodes { .. } => None,
    };
    match crate::effects::lease::held_node_leases(&ctx.effects.client, node).await {
        Ok(nodes) => {
            let now = k8s_openapi::jiff::Timestamp::now();
            for n in nodes {
                ctx.remember_lease(&n, now);
            }
        }
        Err(e) => log::warn!(
            "{e}: a node lease taken just before this start is released only once its maintenance is"
        ),
    }
}

/// The API server's clients: one HTTP/2 connection for the watches and
/// every write, and the leader's Lease's own. The pods' connections
/// ([`pod_watches::Connections`]) are made beside them.
///
/// The node role's pod watch reads over an HTTP/1.1 connection of its
/// own. Its drain makes several hundred pod events in a second, and a pod
/// watch selected by spec.nodeName has a buffer of only 10 events in the
/// API server's watch cache: served over HTTP/2 (each event handed to the
/// connection's writer) the server fell behind and closed it as
/// unresponsive, 3–13 times in 5 drains of `just bench-drain`, and also
/// with the watches on an HTTP/2 connection apart from the evictions; over
/// HTTP/1.1 (the handler writes to the socket itself) never, in 15 drains.
/// The cluster role's watches, one per drained node, share HTTP/2
/// connections of their own (`pod_watches/connections.rs`: an HTTP/1.1
/// connection per watch was most of a burst's memory).
struct Clients {
    api: Client,
    /// The cluster role's leader Lease has a connection of its own, so a
    /// renewal never waits behind the loop's requests. The API server
    /// allows 100 streams on one HTTP/2 connection, and a burst's requests
    /// sit in its priority-and-fairness queues for seconds holding theirs;
    /// hyper then queues the next request where Go's client would open
    /// another connection. At 5 000 nodes with 100 NodeMaintenances at
    /// once, renewals over the shared connection reached the API server
    /// 0.6–1.7 s after they were sent (the audit log's receive times);
    /// over their own, about 0.3 s.
    leader: Client,
    evictions_in_flight: usize,
    /// How the NodeMaintenance watch lists (`roles::maintenance_watch`).
    maintenances: kube::runtime::watcher::Config,
}

impl Clients {
    /// Connect, and check what must be there before anything starts: the
    /// own node (node role) and our CRDs.
    async fn connect(config: &RunConfig) -> Result<(Clients, pod_watches::Connections)> {
        let kubeconfig = config.kubeconfig.as_deref();
        // Evictions are streams of one connection over HTTP/2, but each
        // holds a TLS connection over HTTP/1.1 (also when the server
        // refuses h2).
        let (api, http2) = connect::connect_reporting(kubeconfig, config.transport).await?;
        // The node role's own pod watch reads over HTTP/1.1 (above): that
        // client reads the node, so its path is proven by a request the
        // start makes anyway.
        let own_pods = match (&config.node, http2) {
            (Some(node), true) => Some(connect::http1_reading_node(kubeconfig, node).await?),
            (Some(node), false) => {
                connect::require_node(&api, node).await?;
                None
            }
            (None, _) => None,
        };
        let maintenances = require_crds_of(&api, config.node.as_deref()).await?;
        let evictions_in_flight = config.evictions_in_flight.unwrap_or(if http2 {
            crate::effects::evict::HTTP2_IN_FLIGHT
        } else {
            crate::effects::evict::HTTP1_IN_FLIGHT
        });
        log::info!(
            "talking {} to the API server; up to {evictions_in_flight} evictions in flight",
            if http2 { "HTTP/2" } else { "HTTP/1.1" }
        );
        if config.node.is_none() && connect::eviction_requests_served(&api).await {
            log::info!(
                "the API server serves EvictionRequests (lifecycle.k8s.io/v1alpha1); drains still evict through the Eviction API"
            );
        }
        let pods = match (own_pods, http2) {
            (Some(own), _) => pod_watches::Connections::one(own),
            (None, false) => pod_watches::Connections::one(api.clone()),
            (None, true) => pod_watches::Connections::shared(connect::load(kubeconfig).await?)?,
        };
        // Over HTTP/1.1 every request has a connection of its own anyway.
        let leader = if http2 && config.node.is_none() {
            connect::connect_with(kubeconfig, config.transport).await?
        } else {
            api.clone()
        };
        let clients = Clients {
            api,
            leader,
            evictions_in_flight,
            maintenances,
        };
        Ok((clients, pods))
    }
}

/// The role `config` asks for, and the identity its events and lease
/// carry.
fn scope_of(config: &RunConfig) -> (Scope, String) {
    if let Some(node) = &config.node {
        log::info!("nodekeeper {} owns node {node}", env!("CARGO_PKG_VERSION"));
        return (Scope::Node(node.clone()), node.clone());
    }
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
    let scope = Scope::AllNodes {
        selector: config.node_selector.clone(),
    };
    (scope, config.identity.clone())
}

/// `/metrics`, `/healthz` and `/readyz`, and the opt-in webhook: served
/// before the lease is won. The webhook reads the API server, not our
/// stores, so a standby replica and an agent still listing answer as well.
async fn serve_beside(
    config: &RunConfig,
    client: &Client,
    nms: &reflector::Store<NodeMaintenance>,
    policies: &reflector::Store<RebootPolicy>,
) -> Result<Option<admission::Webhook>> {
    if let Some(addr) = config.metrics_address {
        metrics::serve(addr, nms.clone(), policies.clone()).await?;
    }
    Ok(match config.admission.clone() {
        Some(admission) => Some(admission::serve(admission, client.clone()).await?.1),
        None => None,
    })
}

/// One latch for "stop now": SIGTERM (`shutdown`), or a lost leader lease.
/// The wait for leadership, the controller's graceful shutdown and the
/// shutdown bound all watch it.
fn stop_on(shutdown: impl Future<Output = ()> + Send + Sync + 'static) -> Latch {
    let stopping = Latch::default();
    let latch = stopping.clone();
    crate::runtime::spawn(async move {
        shutdown.await;
        // Checks still running (a hanging sentinel command) answer no one
        // now; they stop with us.
        crate::effects::host::stop_checks();
        latch.open();
    })
    .detach();
    stopping
}

/// What running as the leader (or as a node agent, which needs no lease)
/// gives: the gate every effect passes, and why the lease was lost if it
/// was.
struct Elected {
    gate: crate::effects::gate::LeaderGate,
    leadership: Option<leader::Leadership>,
    lost: Arc<std::sync::Mutex<Option<String>>>,
}

/// The cluster role waits for the leader lease (a standby still stops on
/// SIGTERM: `None`); a lost lease later opens `stopping`. The node role
/// runs at once.
async fn elect(
    config: &RunConfig,
    client: &Client,
    scope: &Scope,
    identity: &str,
    stopping: &Latch,
) -> Result<Option<Elected>> {
    let lost: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    if !matches!(scope, Scope::AllNodes { .. }) {
        return Ok(Some(Elected {
            gate: crate::effects::gate::LeaderGate::always(),
            leadership: None,
            lost,
        }));
    }
    let lead = leader::lead(
        client.clone(),
        config.leader_namespace.clone(),
        config.leader_lease.clone(),
        identity.to_string(),
    );
    let waiting = async {
        stopping.wait().await;
        None
    };
    let Some(won) = smol::future::or(async { Some(lead.await) }, waiting).await else {
        return Ok(None);
    };
    let won = won?;
    metrics::export_cluster_gauges();
    let (stopping, why, lost_rx) = (stopping.clone(), lost.clone(), won.lost.clone());
    crate::runtime::spawn(async move {
        if let Ok(reason) = lost_rx.recv().await {
            *why.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        }
        stopping.open();
    })
    .detach();
    Ok(Some(Elected {
        gate: won.gate.clone(),
        leadership: Some(won),
        lost,
    }))
}

/// The loop's shared state over the stores the watches fill.
fn context(
    config: &RunConfig,
    clients: &Clients,
    scope: &Scope,
    identity: String,
    gate: crate::effects::gate::LeaderGate,
    stores: Stores,
    anchor: passes::Kick,
) -> Arc<Context> {
    let client = clients.api.clone();
    let events = crate::effects::events::Events::new(client.clone(), "nodekeeper", Some(identity));
    Arc::new(Context::new(
        Interpreter {
            client,
            events,
            evictions: crate::effects::evict::Permits::new(clients.evictions_in_flight),
            exec: config.host_exec,
            records: config.command_records.clone(),
            talos: crate::effects::talos::Machined::new(config.talos_socket.clone()),
            provider: config.provider.clone(),
            gate,
        },
        scope.clone(),
        stores,
        config.drain_timeout,
        config.node_agents,
        crate::effects::host::HostRoot(config.host_root.clone()),
        anchor,
    ))
}

/// The cluster role's two tasks beside the node controller: the scheduler
/// of every cluster-wide pass ([`cluster`]) and replacement ([`replace`]);
/// and the background answers that kick the scheduler.
fn start_cluster_role(
    config: &RunConfig,
    ctx: &Arc<Context>,
    w: &mut watched::Watched,
    kick: &passes::Kick,
    kicks: smol::channel::Receiver<()>,
    replace_kick: &passes::Kick,
    replace_kicks: smol::channel::Receiver<()>,
) {
    ctx.notify.configure(
        ctx.effects.client.clone(),
        config.leader_namespace.clone(),
        config.notify_default.clone(),
        kick.clone(),
    );
    ctx.channels
        .configure(config.channel_interval, kick.clone());
    let versions = w.replace_stores.as_ref().map(|r| r.stores.versions.clone());
    cluster::start(ctx.clone(), w.mutex_stores.take(), versions, kicks);
    replace::start_task(
        ctx.clone(),
        w.replace_stores.take(),
        replace_kick.clone(),
        replace_kicks,
    );
}

/// After the loop: a lost lease is an error (a fresh start competes
/// again); otherwise the lease is handed over once no effect runs, and the
/// webhook withdrawn.
async fn shut_down(elected: Elected, webhook: &Option<admission::Webhook>) -> Result<()> {
    let lost = elected
        .lost
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(why) = lost {
        withdraw(webhook).await;
        return Err(Error::LostLease(format!(
            "{why}; exiting so a fresh start can compete again"
        )));
    }
    if let Some(won) = elected.leadership {
        won.step_down().await;
    }
    withdraw(webhook).await;
    crate::effects::host::stop_checks();
    log::info!("stopped");
    Ok(())
}

async fn withdraw(webhook: &Option<admission::Webhook>) {
    if let Some(webhook) = webhook {
        webhook.withdraw().await;
    }
}

/// How long reconciles in flight may run on after SIGTERM or a lost lease.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Every CRD we reconcile, each reconciled by every role.
fn our_crds() -> [ApiResource; 4] {
    [
        ApiResource::erase::<NodeMaintenance>(&()),
        ApiResource::erase::<RebootPolicy>(&()),
        ApiResource::erase::<UpgradePlan>(&()),
        ApiResource::erase::<crate::api::drain_rule::DrainRule>(&()),
    ]
}

/// Exit with an install hint unless every CRD we reconcile is served.
pub async fn require_crds(client: &Client) -> Result<()> {
    watch::check_served(client, &our_crds()).await
}

/// [`require_crds`] at a service's start, also saying how to watch
/// NodeMaintenances: a node agent asks about them with the list its watch
/// makes (`roles::maintenance_watch`), not a list of every one.
async fn require_crds_of(
    client: &Client,
    own: Option<&str>,
) -> Result<kube::runtime::watcher::Config> {
    let [nm, rest @ ..] = our_crds();
    let (watch, mut missing) = match own {
        Some(_) => match roles::maintenance_watch(client, own).await? {
            Some(watch) => (watch, vec![]),
            None => (watch::watch_config(), vec![watch::crd_name(&nm)]),
        },
        None => (
            watch::watch_config(),
            watch::not_served(client, &[nm]).await?,
        ),
    };
    missing.extend(watch::not_served(client, &rest).await?);
    watch::missing_or_fail(missing)?;
    Ok(watch)
}
