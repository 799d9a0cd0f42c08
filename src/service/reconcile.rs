//! The reconciler: for one node, gather a snapshot from the stores, ask
//! `decide` for the next step and its plan, have the interpreter perform
//! it, fold the outcomes back, and repeat until the plan is to wait. Each
//! effect is one small, guarded API write; everything needed to resume
//! lives in the API server (status, node annotations, the lease), so a crash
//! between any two effects converges after restart.
//!
//! Our own writes are folded back through the mutation cache: the watch
//! that reflects them may lag behind, and acting on a stale store would
//! repeat a step or trip over a 409.

use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use super::context::Context;
use super::roles::{Scope, anchor};
use crate::api::common::is_node_name;
use crate::decide::Effect;
use crate::decide::foreign::{self, LastCheck};
use crate::decide::maintenance::{self, Snapshot, Step};
use crate::decide::{Then, duration_until, earliest};
use crate::error::{Error, Result};

/// Upper bound on decisions per reconcile; the loop normally ends far sooner.
const MAX_STEPS: usize = 32;

/// When a reconcile that hit [`MAX_STEPS`] goes on.
const BUSY_AGAIN: Duration = Duration::from_secs(5);

/// The controller's reconcile: the node itself (its maintenance; in the
/// node role also its reboot and upgrade), and, on the anchor node,
/// NodeMaintenances whose node has no agent (it does not exist). Nothing
/// cluster-wide runs here.
pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    // Decisions on a half-filled store would count pods wrong: wait for the
    // first full list of every watched kind.
    ctx.synced.wait().await;
    crate::service::metrics::inc(&crate::service::metrics::COUNTERS.reconciles);
    let started = std::time::Instant::now();
    let key = super::conflict_key(&node.name_any());
    let result = reconcile_inner(node, &ctx).await;
    if result.is_ok() {
        ctx.failing.succeeded(&key);
    }
    crate::service::metrics::observe_work(
        crate::service::metrics::Timed::NodeReconcile,
        started.elapsed(),
    );
    result
}

async fn reconcile_inner(queued: Arc<Node>, ctx: &Arc<Context>) -> Result<Action> {
    let name = queued.name_any();
    // The freshest view: `queued` is what the watch had when this
    // reconcile was queued, which can predate our own writes (a restarted
    // agent read its predecessor's claim there, 4 ms after writing its
    // own, and warned on the node of another agent).
    let node = ctx.node(&name).unwrap_or(queued);
    let summary = summarize(&node);
    if ctx.log_if_changed(&name, summary.clone()) {
        log::info!("node {name}: {summary}");
    }
    // A cluster role beside node agents leaves each node's maintenance
    // to its agent: two drainers of one node would only race.
    // An error in the node's maintenance does not skip its reboot and
    // upgrade steps below (a refused status write held back a reboot the
    // node was drained for); it is returned after them.
    let (mut wake, failed) = if ctx.node_agents {
        (None, None)
    } else {
        match reconcile_node(ctx, &name, true).await {
            Ok(w) => (w, None),
            Err(e) => (None, Some(e)),
        }
    };
    if anchor(&ctx.scope, &ctx.nodes).as_deref() == Some(name.as_str()) {
        ctx.prune();
        wake = earliest(wake, reconcile_foreign(ctx).await);
    }
    // The node role's own reboot and upgrade; the cluster role's
    // cluster-wide work has its own scheduler (`cluster.rs`).
    if let Scope::Node(_) = ctx.scope {
        claim_node(ctx, &node).await;
        super::upgrades::reconcile_own_node(ctx, &name).await?;
        wake = earliest(wake, super::reboots::reconcile_own_node(ctx, &name).await?);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(match wake {
        // Never "at once": a decision that asks for it again and again
        // would spin the one-thread executor.
        Some(d) => Action::requeue(d.max(super::executor::MIN_WAKE)),
        None => Action::await_change(),
    })
}

/// The node role's claim on its node (`decide::claim`). A failed write is
/// tried at the next reconcile; it never holds up the node's own work.
async fn claim_node(ctx: &Context, node: &Node) {
    let effects = {
        let mut agent = crate::runtime::lock(&ctx.agent);
        let (me, state) = &mut *agent;
        crate::decide::claim::decide(node, me, state)
    };
    for effect in &effects {
        if let Effect::Event { note, .. } = effect {
            log::warn!("node {}: {note}", node.name_any());
        }
    }
    let plan = crate::decide::Plan::together(effects);
    let claimed = super::executor::execute(ctx, "claim", plan, |effect, _| {
        if matches!(effect, Effect::PatchNode { .. }) {
            crate::runtime::lock(&ctx.agent).1.claimed = true;
        }
        super::executor::After::Go
    })
    .await;
    if let Err(e) = claimed {
        log::warn!(
            "node {}: cannot claim it for this agent: {e}",
            node.name_any()
        );
    }
}

/// What an operator wants to see in the log about a node, in one line.
fn summarize(node: &Node) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
        .unwrap_or("Unknown");
    let spec = node.spec.as_ref();
    let schedulable = !spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let taints = spec
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    format!("ready={ready} schedulable={schedulable} taints=[{taints}]")
}

/// NodeMaintenances for nodes we do not own. In the node role any agent may
/// fail or finish them once the node proves missing; writes carry the
/// resourceVersion, so of many agents exactly one succeeds. A failing check
/// backs off per object, with jitter, and never fails the own node's
/// reconcile: one bad object must not make every agent poll.
async fn reconcile_foreign(ctx: &Context) -> Option<Duration> {
    let now = Timestamp::now();
    let mut wake = None;
    let mut targets: Vec<String> = ctx
        .maintenances
        .state()
        .iter()
        .filter(|m| !ctx.owns(&m.spec.node_name) || ctx.node(&m.spec.node_name).is_none())
        .filter(|m| foreign::needs_attention(m))
        .filter_map(|m| {
            // A name no node can have needs no look-up: it fails at once.
            if ctx.scope.sees_all_nodes() || !is_node_name(&m.spec.node_name) {
                return Some(m.spec.node_name.clone());
            }
            let last = ctx.last_check(&m.name_any());
            let seed = foreign::jitter_seed(
                ctx.scope.agent(),
                &m.name_any(),
                last.map_or(0, |l| l.failures),
            );
            let due = foreign::due(m, last, seed)?;
            if due <= now {
                Some(m.spec.node_name.clone())
            } else {
                wake = earliest(wake, Some(duration_until(now, due)));
                None
            }
        })
        .collect();
    targets.sort();
    targets.dedup();
    let nodes: Api<Node> = Api::all(ctx.effects.client.clone());
    for target in targets {
        let exists = if ctx.scope.sees_all_nodes() {
            Ok(ctx.node(&target).is_some())
        } else if !is_node_name(&target) {
            Ok(false)
        } else {
            let found = nodes
                .get_opt(&target)
                .await
                .map(|n| n.is_some())
                .map_err(Error::kube(format!(
                    "checking whether node {target} exists"
                )));
            for m in ctx.maintenances.state().iter() {
                if m.spec.node_name == target {
                    let failures = match (&found, ctx.last_check(&m.name_any())) {
                        (Ok(_), _) => 0,
                        (Err(_), Some(c)) => c.failures.saturating_add(1),
                        (Err(_), None) => 1,
                    };
                    ctx.set_last_check(m.name_any(), LastCheck { at: now, failures });
                }
            }
            found
        };
        let result = match exists {
            Ok(false) => reconcile_node(ctx, &target, false).await,
            Ok(true) => Ok(None),
            Err(e) => Err(e),
        };
        match result {
            Ok(w) => wake = earliest(wake, w),
            Err(e) => {
                log::warn!("NodeMaintenance for node {target:?}: {e} (backing off)");
                wake = earliest(wake, Some(foreign::recheck_after(1, 0)));
            }
        }
    }
    wake
}

/// Decide and act for one node until the decision is to wait.
async fn reconcile_node(
    ctx: &Context,
    node_name: &str,
    node_known: bool,
) -> Result<Option<Duration>> {
    // Read once per reconcile, when a drained feature's maintenance asks.
    let mut volumes = None;
    // Which pods another node could run: asked by a reboot's or upgrade's
    // drain, kept a while (`service::elsewhere`).
    let mut homes = ctx.homes.get(node_name);
    for _ in 0..MAX_STEPS {
        let node = if node_known {
            ctx.node(node_name)
        } else {
            None
        };
        let nms = ctx.maintenances_for(node_name);
        // Pods matter only to a maintenance (its drain and status). The
        // cluster role watches a node's pods only while it has one; before
        // their first list only the steps that read no pods go ahead (the
        // finalizer, the lease, the cordon), so the list's round trip is
        // not in front of the cordon. The DrainRules likewise: their watch
        // starts at the first drain with a pod a rule could place, and
        // until it has listed, that drain's pods are not listed either.
        let (pods, listed) = if node_known && !nms.is_empty() {
            match ctx.pods.drainable_now(node_name) {
                Some(pods) if super::drain_rules::ready_for(ctx, &pods) => (pods, true),
                _ => (Vec::new(), false),
            }
        } else {
            ctx.pods.release(node_name);
            ctx.homes.forget(node_name);
            (Vec::new(), true)
        };
        let mem = if listed {
            ctx.memory(node_name, &pods)
        } else {
            ctx.memory_as_is(node_name)
        };
        let book = super::drain_rules::rule_book(ctx, node.as_deref(), &pods).await;
        let now = Timestamp::now();
        let snapshot = Snapshot {
            node_name,
            node: node.as_deref(),
            maintenances: nms.iter().map(|m| m.as_ref()).collect(),
            pods: &pods,
            drain_rules: &book,
            attempts: &mem.attempts,
            lease_renew_at: mem.lease_renew_at,
            now,
            drain_timeout: ctx.drain_timeout,
            volumes: volumes.as_ref(),
            homes: homes.as_ref(),
            conditions_paused: mem.conditions_refused_until.is_some_and(|t| t > now),
        };
        let step = maintenance::decide(&snapshot);
        if matches!(step, Step::ReadVolumes { .. }) && volumes.is_none() {
            volumes = Some(super::volumes::read(ctx, node_name).await);
            continue;
        }
        if let Step::ReadHomes { pods: uids, .. } = &step
            && listed
        {
            homes = Some(super::elsewhere::read(ctx, node_name, &pods, uids).await);
            continue;
        }
        if !listed && !step.reads_no_pods() {
            if let Err(what) = listed_for_drain(ctx, node_name).await {
                log::warn!("node {node_name}: {what} not listed yet; looking again in 1 s");
                return Ok(Some(Duration::from_secs(1)));
            }
            continue;
        }
        let plan = maintenance::plan(&snapshot, step.clone());
        let who = format!("node {node_name}");
        let then = super::executor::execute(ctx, &who, plan, |effect, outcome| {
            ctx.record(node_name, effect, outcome, now);
            match maintenance::after(&snapshot, &step, outcome) {
                Some(follow) => super::executor::After::Instead(follow),
                None => super::executor::After::Go,
            }
        })
        .await?;
        if let Then::Wait(d) = then {
            return Ok(d);
        }
    }
    // A decision that never settles (a status field an older or foreign
    // CRD schema prunes, so the same write is asked for again) was a 5 Hz
    // write loop: it is looked at again in 5 s, and said.
    log::warn!(
        "node {node_name}: still busy after {MAX_STEPS} steps; continuing in {} s",
        BUSY_AGAIN.as_secs()
    );
    Ok(Some(BUSY_AGAIN))
}

/// Wait (bounded) for what a drain of `node` reads to be listed: its pods,
/// then the DrainRules if a rule could place one of them. What is still
/// not listed, for the log.
async fn listed_for_drain(ctx: &Context, node: &str) -> std::result::Result<(), String> {
    let Some(pods) = ctx.pods.drainable(node).await else {
        return Err("its pods are".into());
    };
    if super::drain_rules::listed_for(ctx, &pods).await {
        return Ok(());
    }
    let why = ctx.synced.drain_rules.failure();
    Err(format!(
        "the DrainRules are{}",
        why.map(|w| format!(" ({w})")).unwrap_or_default()
    ))
}
