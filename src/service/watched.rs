//! Every kind the process watches, in one place: for each, its watch
//! (what it selects), the store it reflects into, and what its events wake.
//! Where a new watched kind goes, and what it starts, is answered here:
//!
//! | kind | node role | cluster role | wakes |
//! |---|---|---|---|
//! | Node | its own (field selector) | every node, or the pool's (labels), slim | its reconcile; the scheduler and replacement on changes that matter |
//! | Pod | bound to its node | per drained node and per gate ([`super::pod_watches`]) | the node's reconcile; a gate's kick the scheduler |
//! | NodeMaintenance | naming its node | every one (or the pool's) | the named node's reconcile; the scheduler and replacement |
//! | RebootPolicy, UpgradePlan | every one | every one | the own node's reconcile; the scheduler |
//! | DrainRule | every one, from the first drain that needs it | every one | the own node's reconcile; in the cluster role every drained node's |
//! | Job (managed-by label) | not watched | every one, slim | the scheduler |
//! | the mutex operator's kinds | not watched | where served, unscoped only | the scheduler |
//! | Constellation's kinds | not watched | where served, with a provider | replacement, and MaintenancePlanned |

use std::pin::Pin;
use std::sync::Arc;

use crate::api::node::Node;
use crate::api::pod::Pod;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use smol::stream::{Stream, StreamExt};

use super::passes::Kick;
use super::roles::Scope;
use super::stores::{Arrivals, Fresh, Synced};
use super::watch::{self, WatchBackoff, observe, slim_job, slim_node, watch_config, watch_ok};
use super::{mutex, pod_watches, replace};
use crate::api::drain_rule::DrainRule;
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::api::upgrade::UpgradePlan;
use crate::error::Result;
use crate::runtime::Latch;

/// A watch's objects as they change (errors logged and dropped by
/// [`watch_ok`]; each watch backs off on its own).
pub type Objects<K> = Pin<Box<dyn Stream<Item = std::result::Result<K, watcher::Error>> + Send>>;

/// What exists before the watches start: the stores `/metrics` serves
/// from while a standby waits for the lease, with their writers, and how
/// the NodeMaintenance watch lists (asked by the start-up's CRD check,
/// `roles::maintenance_watch`).
pub struct Early {
    pub maintenances: Writer<NodeMaintenance>,
    pub policies: Writer<RebootPolicy>,
    pub maintenance_watch: watcher::Config,
}

/// Whom the watches wake besides the node controller.
pub struct Wakes<'a> {
    /// The cluster role's scheduler ([`super::cluster`]).
    pub scheduler: &'a Kick,
    /// The replacement task ([`super::replace`]).
    pub replace: &'a Kick,
}

/// Every watch started: the streams the controller is built from and the
/// stores the context reads.
pub struct Watched {
    pub nodes: Store<Node>,
    pub node_events: Objects<Node>,
    pub pods: Arc<pod_watches::PodWatches>,
    /// The node role's pod events (the cluster role's come back on
    /// `pod_reconciles`, per drained node).
    pub pod_events: watch::Trigger,
    pub pod_reconciles: smol::channel::Receiver<ObjectRef<Node>>,
    pub maintenance_events: Objects<NodeMaintenance>,
    pub plans: Store<UpgradePlan>,
    pub policy_events: Objects<RebootPolicy>,
    pub plan_events: Objects<UpgradePlan>,
    /// As the API serves them; [`super::drain_rules`] parses them.
    pub drain_rules: Store<DynamicObject>,
    pub drain_rule_events: Objects<DynamicObject>,
    pub jobs: Store<DynamicObject>,
    pub job_events: Objects<DynamicObject>,
    pub job_resource: ApiResource,
    pub mutex_stores: Option<mutex::MutexStores>,
    pub mutex_events: watch::Trigger,
    pub replace_stores: Option<replace::Replace>,
    pub replace_events: watch::Trigger,
    pub fresh: Arc<Fresh>,
    pub arrivals: Arc<Arrivals>,
}

/// Start every watch of `scope`'s role. `pods` are the connections the
/// pod watches read over (see `service::run`).
pub async fn start(
    client: &Client,
    pods: pod_watches::Connections,
    scope: &Scope,
    provider: bool,
    synced: &Synced,
    early: Early,
    wakes: Wakes<'_>,
) -> Result<Watched> {
    let cluster_role = matches!(scope, Scope::AllNodes { .. });
    let kick = wakes.scheduler;
    let both = vec![kick.clone(), wakes.replace.clone()];
    let fresh = Arc::new(Fresh::default());
    let arrivals = Arc::new(Arrivals::default());

    let (nodes, node_writer) = reflector::store::<Node>();
    let node_events = node_watch(client, scope, node_writer, synced, &fresh, both.clone());
    let (pod_reconcile, pod_reconciles) = smol::channel::unbounded::<ObjectRef<Node>>();
    let (pods, pod_events) = pod_watch(pods, scope, synced, pod_reconcile, kick);
    let maintenance_events = {
        let (latch, fresh, order) = (synced.maintenances.clone(), fresh.clone(), arrivals.clone());
        let api = Api::<NodeMaintenance>::all(client.clone());
        watcher(api, early.maintenance_watch)
            .backoff(WatchBackoff::default())
            .inspect(move |ev| order.note(ev))
            .reflect(early.maintenances)
            .inspect(move |ev| observe(ev, &latch, |name| fresh.maintenances.forget(name)))
            .inspect(super::passes::on_event(cluster_role, both))
            .touched_objects()
            .filter(|r| watch_ok(r, "NodeMaintenances"))
    };
    let policy_events = {
        let fresh = fresh.clone();
        let forget = move |name: &str| fresh.policies.forget(name);
        every(
            client,
            early.policies,
            &synced.policies,
            forget,
            cluster_role,
            kick,
        )
    };
    let (plans, plan_writer) = reflector::store::<UpgradePlan>();
    let plan_events = {
        let fresh = fresh.clone();
        let forget = move |name: &str| fresh.plans.forget(name);
        every(
            client,
            plan_writer,
            &synced.plans,
            forget,
            cluster_role,
            kick,
        )
    };
    // Few objects, read by every drain; nodekeeper never writes them.
    let (drain_rules, drain_rule_events) = drain_rule_watch(client, synced, cluster_role, kick);
    let job_resource = ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&());
    let job_writer = Writer::<DynamicObject>::new(job_resource.clone());
    let jobs = job_writer.as_reader();
    let job_events = job_watch(
        client,
        cluster_role,
        &job_resource,
        job_writer,
        synced,
        kick,
    );
    let (mutex_stores, mutex_events) = mutex_watches(client, scope, synced).await?;
    // Constellation's APIs: any cluster role given a provider plugin.
    let (replace_stores, replace_events) = if cluster_role {
        replace::start(client, provider, synced.replace.clone()).await?
    } else {
        synced.replace.open();
        (None, Box::pin(smol::stream::pending()) as watch::Trigger)
    };

    Ok(Watched {
        nodes,
        node_events,
        pods,
        pod_events,
        pod_reconciles,
        maintenance_events: Box::pin(maintenance_events),
        plans,
        policy_events,
        plan_events,
        drain_rules,
        drain_rule_events,
        jobs,
        job_events,
        job_resource,
        mutex_stores,
        mutex_events,
        replace_stores,
        replace_events,
        fresh,
        arrivals,
    })
}

/// The Nodes the role sees: its own (node role), or every node or its
/// pool's, slimmed (cluster role). Heartbeats update the store but wake
/// nothing in the cluster role.
fn node_watch(
    client: &Client,
    scope: &Scope,
    writer: Writer<Node>,
    synced: &Synced,
    fresh: &Arc<Fresh>,
    wakes: Vec<Kick>,
) -> Objects<Node> {
    let cluster_role = matches!(scope, Scope::AllNodes { .. });
    let wc = match scope {
        Scope::Node(n) => watch_config().fields(&format!("metadata.name={n}")),
        Scope::AllNodes {
            selector: Some(sel),
        } => watch_config().labels(sel),
        Scope::AllNodes { selector: None } => watch_config(),
    };
    let (latch, fresh) = (synced.nodes.clone(), fresh.clone());
    let changes = watch::NodeChanges::default();
    let events = watcher(Api::<Node>::all(client.clone()), wc)
        .backoff(WatchBackoff::default())
        .modify(slim_node)
        .reflect(writer)
        .inspect(move |ev| observe(ev, &latch, |name| fresh.nodes.forget(name)))
        .filter(move |ev| !cluster_role || changes.matters(ev))
        .inspect(super::passes::on_event(cluster_role, wakes))
        .touched_objects()
        .filter(|r| watch_ok(r, "nodes"));
    Box::pin(events)
}

/// The node role watches its own node's pods for its whole life; the
/// cluster role only the pods of nodes it drains and of its gates
/// (`pod_watches.rs`), whose events come back on `reconcile` (a node's)
/// or kick the scheduler (a gate's).
fn pod_watch(
    connections: pod_watches::Connections,
    scope: &Scope,
    synced: &Synced,
    reconcile: smol::channel::Sender<ObjectRef<Node>>,
    kick: &Kick,
) -> (Arc<pod_watches::PodWatches>, watch::Trigger) {
    match scope {
        Scope::Node(n) => {
            let (store, pod_writer) = reflector::store::<Pod>();
            let latch = synced.pods.clone();
            let wc = watch_config().fields(&format!("spec.nodeName={n}"));
            let events = watcher(Api::<Pod>::all(connections.client().clone()), wc)
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
            let pods = pod_watches::scoped(connections, reconcile, kick.clone());
            (Arc::new(pods), Box::pin(smol::stream::pending()))
        }
    }
}

/// A kind both roles watch whole (RebootPolicies, UpgradePlans): its
/// events wake the own node's reconcile, and the scheduler in the cluster
/// role.
fn every<K>(
    client: &Client,
    writer: Writer<K>,
    latch: &Latch,
    forget: impl Fn(&str) + Send + 'static,
    cluster_role: bool,
    kick: &Kick,
) -> Objects<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let latch = latch.clone();
    let what = K::plural(&()).to_string();
    let events = watcher(Api::<K>::all(client.clone()), watch_config())
        .backoff(WatchBackoff::default())
        .reflect(writer)
        .inspect(move |ev| observe(ev, &latch, &forget))
        .inspect(super::passes::on_event(cluster_role, vec![kick.clone()]))
        .touched_objects()
        .filter(move |r| watch_ok(r, &what));
    Box::pin(events)
}

/// DrainRules, held as the API serves them: the watcher and store of a
/// typed kind were ~90 KB of the binary; the dynamic ones are the Jobs'.
/// A drain parses the few rules when it reads them. A node agent lists
/// and watches nothing until a drain first needs the rules
/// ([`super::stores::OnDemand`]): its start after a reboot makes two
/// requests fewer, and while it has not drained, their watch is not
/// renewed every 290 s (12 requests an hour per agent).
fn drain_rule_watch(
    client: &Client,
    synced: &Synced,
    cluster_role: bool,
    kick: &Kick,
) -> (Store<DynamicObject>, Objects<DynamicObject>) {
    let resource = ApiResource::erase::<DrainRule>(&());
    let writer = Writer::<DynamicObject>::new(resource.clone());
    let store = writer.as_reader();
    let (on_demand, wanted) = (
        synced.drain_rules.clone(),
        synced.drain_rules.wanted.clone(),
    );
    // The cluster role watches them from its start: one process, started
    // rarely, whose drains (of nodes with no agent) need not wait for a
    // list. An agent restarts with every reboot of its node.
    if cluster_role {
        wanted.open();
    }
    // A watcher sends nothing before it is first polled.
    let events = watcher(
        Api::<DynamicObject>::all_with(client.clone(), &resource),
        watch_config(),
    )
    .backoff(WatchBackoff::default())
    .reflect(writer)
    .inspect(move |ev| match ev {
        Err(e) => on_demand.failed(e),
        ev => observe(ev, &on_demand.listed, |_| {}),
    })
    .inspect(super::passes::on_event(cluster_role, vec![kick.clone()]))
    .touched_objects()
    .filter(|r| watch_ok(r, "DrainRules"));
    let when_wanted = smol::stream::once_future(async move { wanted.wait().await })
        .filter_map(|()| None)
        .chain(events);
    (store, Box::pin(when_wanted))
}

/// Hook Jobs: the cluster role's, by their managed-by label, slimmed. The
/// node role runs none and may not list them.
fn job_watch(
    client: &Client,
    cluster_role: bool,
    resource: &ApiResource,
    writer: Writer<DynamicObject>,
    synced: &Synced,
    kick: &Kick,
) -> Objects<DynamicObject> {
    if !cluster_role {
        synced.jobs.open();
        return Box::pin(smol::stream::pending());
    }
    let latch = synced.jobs.clone();
    let wc = watch_config().labels(&format!(
        "{}={}",
        crate::decide::jobs::MANAGED_BY_LABEL,
        crate::decide::jobs::MANAGED_BY
    ));
    let events = watcher(Api::<DynamicObject>::all_with(client.clone(), resource), wc)
        .backoff(WatchBackoff::default())
        .modify(slim_job)
        .reflect(writer)
        .inspect(move |ev| observe(ev, &latch, |_| {}))
        .inspect(super::passes::on_event(cluster_role, vec![kick.clone()]))
        .touched_objects()
        .filter(|r| watch_ok(r, "Jobs"));
    Box::pin(events)
}

/// The mutex operator's APIs: only an unscoped cluster role runs them,
/// and only what the API server serves is watched.
async fn mutex_watches(
    client: &Client,
    scope: &Scope,
    synced: &Synced,
) -> Result<(Option<mutex::MutexStores>, watch::Trigger)> {
    let discovery = if scope.sees_all_nodes() {
        mutex::discover(client).await?
    } else {
        mutex::Discovery::default()
    };
    if discovery.mutex {
        let served = |yes: bool| if yes { "served" } else { "not served" };
        log::info!(
            "the mutex operator's APIs are served: reconciling MutexRules, MutexTargets and MutexRunConfigs (MachineConfigPools {}, ClusterVersions {})",
            served(discovery.pools),
            served(discovery.cluster_versions)
        );
    }
    Ok(mutex::start(client, discovery, synced.mutex.clone()))
}
