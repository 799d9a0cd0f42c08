//! The node controller: kube-runtime's `Controller` over Nodes, what
//! triggers a node's reconcile (its pods, NodeMaintenances, the own node's
//! policies and plans, the heartbeat, the anchor's kicks), how many run at
//! once, and how a failed reconcile is retried.

use super::*;

/// The node controller and what triggers a node's reconcile. Watch errors
/// stop at the watchers (each backs off on its own, see WatchBackoff):
/// kube's Controller would otherwise put its own backoff (up to 30 s) on
/// the merged trigger stream, and one failing watch would hold back the
/// events of all the others.
///
/// At most RECONCILES_AT_ONCE node reconciles run at once; the rest wait
/// in the controller's queue as object references. Unbounded, a start-up
/// on 5 000 nodes parked 5 000 reconcile futures on the first full list of
/// every kind (`synced`), and the allocator kept their memory: 79.8 MiB
/// after a restart against 43.4 MiB while the same cluster grew.
pub(super) fn node_controller(
    w: watched::Watched,
    scope: &Scope,
    ctx: Arc<Context>,
    kick: &passes::Kick,
    replace_kick: &passes::Kick,
    anchor_kicks: smol::channel::Receiver<()>,
    stopping: &Latch,
) -> impl Future<Output = ()> + use<> {
    let nodes = w.nodes.clone();
    let controller = Controller::for_stream(w.node_events, nodes.clone())
        .with_config(ControllerConfig::default().concurrency(RECONCILES_AT_ONCE))
        .trigger_backoff(WatchBackoff::default());
    // The heartbeat: the anchor node is reconciled at least this often, so
    // a loop that stops making progress shows on /healthz, and foreign
    // objects and per-node memory get looked after even in a quiet cluster.
    let heartbeat = {
        let (scope, nodes) = (scope.clone(), nodes.clone());
        smol::Timer::interval(metrics::HEARTBEAT).filter_map(move |_| {
            let anchor = roles::anchor(&scope, &nodes);
            if anchor.is_none() {
                // A cluster role whose selector matches no node yet has
                // nothing to reconcile, and nothing that could be wedged:
                // idle is progress, or /healthz would restart it forever.
                metrics::progress();
            }
            anchor.map(|n| ObjectRef::<Node>::new(&n))
        })
    };
    let own = |scope: &Scope, nodes: &reflector::Store<Node>| {
        let (scope, nodes) = (scope.clone(), nodes.clone());
        move || own_node(&scope, &nodes)
    };
    let (own_pod, own_policy, own_plan) =
        (own(scope, &nodes), own(scope, &nodes), own(scope, &nodes));
    let (nm_scope, nm_nodes) = (scope.clone(), nodes.clone());
    let (kick, replace_kick, planned_kick) = (kick.clone(), replace_kick.clone(), kick.clone());
    let stop = {
        let stopping = stopping.clone();
        async move { stopping.wait().await }
    };
    controller
        // The node role's pod events reconcile its node; the cluster
        // role's come from the watches of the nodes it drains.
        .reconcile_on(w.pod_events.filter_map(move |_| own_pod()))
        .reconcile_on(w.pod_reconciles)
        .watches_stream(w.maintenance_events, move |nm: NodeMaintenance| {
            map_maintenance(&nm, &nm_scope, &nm_nodes)
        })
        // In the node role a policy or plan concerns the own node's reboot
        // or upgrade step. In the cluster role they (and Jobs, and the
        // mutex and replacement kinds) only kick the scheduler or the
        // replacement task (see `watched.rs`): no node reconcile runs for
        // them.
        .watches_stream(w.policy_events, move |_: RebootPolicy| own_policy())
        .watches_stream(w.plan_events, move |_: UpgradePlan| own_plan())
        // A DrainRule changes the plan of every drain: the node role's
        // own node; in the cluster role every node under maintenance.
        .reconcile_on({
            let (scope, nodes, ctx) = (scope.clone(), nodes.clone(), ctx.clone());
            w.drain_rule_events.flat_map(move |_| {
                let drained: Vec<ObjectRef<Node>> = match &scope {
                    Scope::Node(_) => own_node(&scope, &nodes).into_iter().collect(),
                    Scope::AllNodes { .. } => ctx
                        .maintenances
                        .state()
                        .iter()
                        .map(|m| m.spec.node_name.as_str())
                        .collect::<std::collections::BTreeSet<&str>>()
                        .into_iter()
                        .map(ObjectRef::new)
                        .collect(),
                };
                smol::stream::iter(drained)
            })
        })
        .watches_stream_with(w.job_events, |_: DynamicObject| None, w.job_resource)
        .reconcile_on(heartbeat)
        .reconcile_on(w.mutex_events.filter_map(move |_| {
            kick.kick();
            None::<ObjectRef<Node>>
        }))
        .reconcile_on(w.replace_events.filter_map(move |_| {
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
        })
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
