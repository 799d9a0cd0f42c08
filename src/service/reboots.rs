//! Coordinated reboots in the loop. The cluster role decides every
//! RebootPolicy in the scheduler's pass ([`pass`], see `cluster.rs`), each
//! policy on its own. The node role looks at its host's signals at the
//! governing policy's period and acts on its own node's reboot
//! ([`reconcile_own_node`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::contain::contain;
use super::context::{Context, HostSignal};
use super::executor;
use super::failing::Subject;
use super::metrics;
use crate::api::reboot::RebootPolicy;
use crate::decide::once_per_boot;
use crate::decide::reboot::{self, node};
use crate::decide::{Effect, Outcome, earliest};
use crate::effects::host;
use crate::error::Result;

/// Cluster role: one scheduler pass over every RebootPolicy this role
/// handles, each on its own (see [`super::contain`]), then the give-back
/// of nodes whose policy is gone. Returns when to look again (settle ends,
/// return deadlines, window boundaries, backoff).
pub async fn pass(ctx: &Context) -> Option<Duration> {
    let mut wake = None;
    let policies = ctx.policies();
    for policy in &policies {
        if !super::roles::handles_policy(&ctx.scope, policy) {
            continue;
        }
        let subject = Subject::typed(policy.as_ref());
        let w = contain(ctx, &subject, |failing| async move {
            reconcile_policy(ctx, policy, failing.as_deref()).await
        })
        .await;
        wake = earliest(wake, w);
    }
    let marks = reboot::orphaned_marks(&ctx.all_nodes(), &policies);
    let wake = earliest(
        wake,
        executor::clean_up(ctx, "marks of RebootPolicies gone from their nodes", marks).await,
    );
    let maintenances = ctx.all_maintenances();
    let effects = reboot::orphans(&maintenances, &policies);
    earliest(
        wake,
        super::contain::give_back::<RebootPolicy>(ctx, &maintenances, effects).await,
    )
}

async fn reconcile_policy(
    ctx: &Context,
    policy: &RebootPolicy,
    failing: Option<&str>,
) -> Result<Option<Duration>> {
    let now = Timestamp::now();
    let holding = policy
        .status
        .as_ref()
        .is_some_and(|s| s.nodes.iter().any(|e| e.phase.holds_slot()));
    let gates = super::gate_answers::answers(ctx, &policy.spec.gates, holding);
    ctx.notify.observe_policy(policy, None);
    let notified = ctx.notify.status(policy.uid().as_deref());
    let plan = {
        let nodes = ctx.all_nodes();
        let maintenances = ctx.all_maintenances();
        let pods_on = |n: &str| ctx.pods_on(n);
        let policies = ctx.policies();
        super::node_pods::deciding(ctx, |node_pods, own_node| {
            reboot::decide(&reboot::Snapshot {
                policy,
                nodes: &nodes,
                maintenances: &maintenances,
                policies: &policies,
                pods_on: &pods_on,
                node_pods,
                own_node,
                now,
                remote: !ctx.node_agents,
                failing,
                alerts: gates.alerts.as_ref(),
                health: gates.health.as_ref(),
                gates_unlisted: gates.unlisted.as_deref(),
                notified: notified.as_ref(),
            })
        })
        .await
    };
    let who = format!("RebootPolicy {}", policy.name_any());
    let then = executor::execute(ctx, &who, plan, |effect, outcome| {
        observe(ctx, policy, effect, outcome);
        record_command(effect, outcome)
    })
    .await?;
    Ok(earliest(executor::wake(then), gates.again))
}

/// A host command's result, recorded on its node next (a failed reboot:
/// the policy reports it).
fn record_command(effect: &Effect, outcome: &Outcome) -> executor::After {
    match once_per_boot::after_command(effect, outcome) {
        Some(follow) => {
            log_command_failure(effect, outcome);
            executor::After::First(vec![follow])
        }
        None => executor::After::Go,
    }
}

/// Metrics from what a policy's effects did: admissions, outcomes, reboot
/// durations (admission to verified: the NodeMaintenance's age), and newly
/// refused admissions by reason.
fn observe(ctx: &Context, policy: &RebootPolicy, effect: &Effect, outcome: &Outcome) {
    match (effect, outcome) {
        (Effect::Event { reason, object, .. }, _) if object.kind.as_deref() == Some("Node") => {
            match *reason {
                "RebootAdmitted" => metrics::inc(&metrics::REBOOTS.admitted),
                "RebootFailed" => metrics::inc(&metrics::REBOOTS.failed),
                "NodeNotReturned" => metrics::inc(&metrics::REBOOTS.not_returned),
                "RebootVerified" => {
                    metrics::inc(&metrics::REBOOTS.verified);
                    let node = object.name.clone().unwrap_or_default();
                    let age = ctx
                        .maintenances_for(&node)
                        .iter()
                        .filter(|m| reboot::owned_by(m, &policy.name_any()))
                        .find_map(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
                    if let Some(created) = age {
                        let secs = Timestamp::now().duration_since(created).as_secs_f64();
                        metrics::observe_reboot_seconds(secs.max(0.0));
                    }
                }
                _ => {}
            }
        }
        (Effect::WritePolicyStatus { status, .. }, Outcome::PolicyWritten(_)) => {
            ctx.notify.observe_policy(policy, Some(status));
            let old = policy.status.clone().unwrap_or_default();
            for e in &status.nodes {
                let was = old.nodes.iter().find(|o| o.name == e.name);
                let reason = e.reason.as_deref();
                if e.phase == crate::api::reboot::RebootPhase::Waiting
                    && was.is_none_or(|w| w.reason.as_deref() != reason)
                {
                    metrics::refused(reason.unwrap_or("Unknown"));
                }
            }
        }
        _ => {}
    }
}

fn log_command_failure(effect: &Effect, outcome: &Outcome) {
    if let (Effect::RunHost { node, action, .. }, Outcome::HostRan { output, .. }) =
        (effect, outcome)
    {
        log::warn!("node {node}: reboot by {action} failed: {output}");
    }
}

/// Node role: look at the host's signals when due, then mark need or issue
/// the reboot. Returns when the next look is due.
///
/// The look runs in the background and this reconcile decides on the last
/// one: a sentinel command that hangs (`sleep 3600`) held the node's
/// reconcile for its whole timeout, so a NodeMaintenance of that node did
/// not start and `/healthz` went 503. The look's end kicks a reconcile.
pub async fn reconcile_own_node(ctx: &Arc<Context>, name: &str) -> Result<Option<Duration>> {
    let Some(n) = ctx.node(name) else {
        return Ok(None);
    };
    let policies = ctx.policies();
    let Some(governing) = node::governing(&n, &policies).cloned() else {
        // No policy covers this node: nothing reads its signals (and a
        // failure recorded under a policy that is gone is taken back).
        if let Some(e) = node::sentinel_record(&n, None) {
            let who = format!("node {name}");
            executor::execute_plain(ctx, &who, crate::decide::Plan::steps(vec![e])).await?;
        }
        return Ok(None);
    };
    // Before the node can be admitted: can the policy's reboot command run
    // here? (An agent without --reboot has no `systemctl`: its node was
    // drained, then the reboot failed.) The policy admits only on `ok`.
    if let Some((key, action)) = node::to_check(&n, &policies) {
        let what = format!("RebootPolicy {key}: its reboot by {action}");
        executor::record_command_check(ctx, name, &what, vec![action], |answer| {
            node::record_check(&n, &key, answer)
        })
        .await?;
    }
    let now = Timestamp::now();
    let period = governing.spec.detect.period_seconds.max(5) as i64;
    let last = ctx
        .host_signal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let last_known = last.is_some();
    let due = last
        .as_ref()
        .is_none_or(|s| now.duration_since(s.at) >= SignedDuration::from_secs(period));
    if due && !ctx.host_look_running.swap(true, Ordering::SeqCst) {
        let ctx = ctx.clone();
        crate::runtime::spawn(async move {
            let s = look(&ctx, &governing, now).await;
            *ctx.host_signal.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
            ctx.host_look_running.store(false, Ordering::SeqCst);
            ctx.anchor.kick();
        })
        .detach();
    }
    // Until the first look ends, nothing is known about the host.
    let signal = last.unwrap_or(HostSignal {
        at: now,
        needed: None,
        error: None,
    });
    // A look that failed is reported on the node (the policy shows it per
    // node), once per change; one that works takes it back.
    if last_known && let Some(e) = node::sentinel_record(&n, signal.error.as_deref()) {
        match &signal.error {
            Some(why) => log::warn!("node {name}: reboot signal unreadable: {why}"),
            None => log::info!("node {name}: reboot signal readable again"),
        }
        let who = format!("node {name}");
        executor::execute_plain(ctx, &who, crate::decide::Plan::steps(vec![e])).await?;
    }
    let next_look = if due {
        // The look's end kicks a reconcile; this is a backstop.
        SENTINEL_TIMEOUT.as_secs() as i64
    } else {
        period - now.duration_since(signal.at).as_secs()
    };
    let nms = ctx.maintenances_for(name);
    let effects = node::decide(&node::Snapshot {
        node: &n,
        maintenances: nms.iter().map(|m| m.as_ref()).collect(),
        policies: &policies,
        host_needs: signal.needed,
        now,
    });
    log::debug!("node {name}: reboot step: {} effect(s)", effects.len());
    for effect in &effects {
        if let Effect::RunHost { action, .. } = effect {
            log::info!("node {name}: drained for its reboot; rebooting by {action}");
        }
        if let Effect::PatchNode { patch, .. } = effect
            && patch["metadata"]["annotations"][crate::api::reboot::NEEDED_ANNOTATION].is_string()
        {
            log::info!("node {name}: the host says a reboot is needed; marked");
        }
    }
    // The reboot command runs beside the loop: a `systemctl reboot` that
    // hangs held the node's reconciles (a NodeMaintenance of this node did
    // not start) for its whole timeout. What comes before it (the
    // once-per-boot record) must have been written first; it also keeps
    // the command from being issued again while it runs.
    let mut effects = effects;
    let command = effects
        .iter()
        .position(|e| matches!(e, Effect::RunHost { .. }))
        .map(|i| effects.split_off(i));
    run_own_steps(ctx, name, effects, now).await?;
    if let Some(command) = command {
        let (ctx, name) = (ctx.clone(), name.to_string());
        crate::runtime::spawn(async move {
            if let Err(e) = run_own_steps(&ctx, &name, command, now).await {
                log::warn!("node {name}: reboot command: {e}");
            }
            ctx.anchor.kick();
        })
        .detach();
    }
    Ok(Some(Duration::from_secs(next_look.max(1) as u64)))
}

/// The node role's reboot effects for its own node: each outcome into the
/// node's memory, a command's result recorded on the node next.
async fn run_own_steps(
    ctx: &Context,
    name: &str,
    effects: Vec<Effect>,
    now: Timestamp,
) -> Result<()> {
    let who = format!("node {name}");
    let plan = crate::decide::Plan::steps(effects);
    executor::execute(ctx, &who, plan, |effect, outcome| {
        ctx.record(name, effect, outcome, now);
        record_command(effect, outcome)
    })
    .await
    .map(|_| ())
}

/// How long a sentinel command may run (then it is killed and the look
/// counts as failed). It runs beside the loop, so this bounds only how
/// stale the answer can get.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(60);

/// One look at the host: the sentinel file, then the sentinel command.
async fn look(ctx: &Context, policy: &Arc<RebootPolicy>, now: Timestamp) -> HostSignal {
    let detect = &policy.spec.detect;
    let mut error = None;
    let looked = host::sentinel_file_bounded(ctx.host_root.clone(), detect.sentinel_file.clone());
    let mut needed = match looked.await {
        Ok(v) => Some(v),
        Err(e) => {
            error = Some(format!("sentinel file: {e}"));
            None
        }
    };
    if needed != Some(true) && !detect.sentinel_command.is_empty() {
        let shown = detect.sentinel_command.join(" ");
        // Checked first: an empty or missing program is named as such,
        // also where commands start through `host-exec`.
        let runs =
            host::can_run_bounded(vec![detect.sentinel_command.clone()], ctx.effects.exec).await;
        let argv = host::command_line(&detect.sentinel_command, ctx.effects.exec);
        let answer = match runs {
            Ok(()) => host::sentinel_command(&argv, SENTINEL_TIMEOUT).await,
            Err(e) => Err(e),
        };
        needed = match answer {
            Ok(v) => Some(v),
            Err(e) => {
                error = Some(format!("sentinel command {shown:?}: {e}"));
                needed
            }
        };
    }
    HostSignal {
        at: now,
        needed,
        error,
    }
}
