//! In-place upgrades in the loop. The cluster role decides every
//! UpgradePlan in the scheduler's pass ([`pass`], see `cluster.rs`), each
//! plan on its own, and records the Jobs the API server refuses to create
//! so the plan can report them. The node role runs its own node's upgrade command
//! ([`reconcile_own_node`]) in the background: an upgrade can take many
//! minutes, and the loop (and the watchdog behind `/healthz`) must not wait
//! for it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::contain::contain;
use super::context::Context;
use super::executor;
use super::failing::Subject;
use crate::api::upgrade::{RESULT_ANNOTATION, UpgradePlan};
use crate::decide::once_per_boot::after_command;
use crate::decide::upgrade::{self, node};
use crate::decide::{Effect, Outcome, Plan, earliest};
use crate::error::Result;

/// Cluster role: one scheduler pass over every UpgradePlan this role
/// handles, each on its own (see [`super::contain`]), then the give-back of
/// nodes whose plan is gone. Returns when to look again.
pub async fn pass(ctx: &Context) -> Option<Duration> {
    let mut wake = None;
    let plans = ctx.plans();
    for plan in &plans {
        if !super::roles::handles_plan(&ctx.scope, plan) {
            continue;
        }
        let subject = Subject::typed(plan.as_ref());
        let w = contain(ctx, &subject, |failing| async move {
            reconcile_plan(ctx, plan, failing.as_deref()).await
        })
        .await;
        wake = earliest(wake, w);
    }
    let urls: Vec<&str> = plans
        .iter()
        .filter_map(|p| p.spec.channel.as_deref())
        .collect();
    ctx.channels.retain(&urls);
    let marks = upgrade::orphaned_marks(&ctx.all_nodes(), &plans);
    let wake = earliest(
        wake,
        executor::clean_up(ctx, "marks of UpgradePlans gone from their nodes", marks).await,
    );
    let maintenances = ctx.all_maintenances();
    let effects = upgrade::orphans(&maintenances, &plans);
    earliest(
        wake,
        super::contain::give_back::<UpgradePlan>(ctx, &maintenances, effects).await,
    )
}

async fn reconcile_plan(
    ctx: &Context,
    plan: &UpgradePlan,
    failing: Option<&str>,
) -> Result<Option<Duration>> {
    let now = Timestamp::now();
    let holding = plan
        .status
        .as_ref()
        .is_some_and(|s| s.nodes.iter().any(|e| e.phase.admitted()));
    let gates = super::gate_answers::answers(ctx, &plan.spec.gates, holding);
    let again = gates.again;
    // The channel's last answer (asked in the background), if it has one.
    let (channel, again_channel) = plan
        .spec
        .channel
        .as_deref()
        .map(|url| ctx.channels.get(url))
        .unzip();
    let channel = channel.flatten();
    let again = earliest(again, again_channel);
    ctx.notify.observe_plan(plan, None);
    let notified = ctx.notify.status(plan.uid().as_deref());
    let plan_fx = {
        let nodes = ctx.all_nodes();
        let maintenances = ctx.all_maintenances();
        let jobs = ctx.jobs_by_key();
        let job_errors = ctx.job_errors();
        let pods_on = |n: &str| ctx.pods_on(n);
        // Fresh: an exclusive plan decided earlier in this pass may have
        // admitted a node since `plans` was read.
        let plans = ctx.plans();
        super::node_pods::deciding(ctx, |node_pods, own_node| {
            upgrade::decide(&upgrade::Snapshot {
                plan,
                nodes: &nodes,
                maintenances: &maintenances,
                jobs: &jobs,
                job_errors: &job_errors,
                pods_on: &pods_on,
                node_pods,
                own_node,
                now,
                plans: &plans,
                failing,
                alerts: gates.alerts.as_ref(),
                health: gates.health.as_ref(),
                gates_unlisted: gates.unlisted.as_deref(),
                notified: notified.as_ref(),
                channel: channel.as_ref(),
            })
        })
        .await
    };
    let name = plan.name_any();
    let mut refused = false;
    let who = format!("UpgradePlan {name}");
    let then = executor::execute(ctx, &who, plan_fx, |effect, outcome| {
        if let (Effect::WriteUpgradeStatus { status, .. }, Outcome::UpgradePlanWritten(_)) =
            (effect, outcome)
        {
            ctx.notify.observe_plan(plan, Some(status));
        }
        if let (Effect::CreateJob { job }, Outcome::JobRefused(why)) = (effect, outcome) {
            let key = crate::decide::jobs::key_of(
                job.metadata.namespace.as_deref().unwrap_or_default(),
                &job.name_any(),
            );
            log::warn!("UpgradePlan {name}: Job {key} refused: {why}");
            ctx.set_job_error(key, Subject::typed(plan).key, why.clone());
            refused = true;
        }
        executor::After::Go
    })
    .await?;
    // A refused Job is a failure the next decision records soon.
    let wake = if refused {
        Some(executor::MIN_WAKE)
    } else {
        executor::wake(then)
    };
    Ok(crate::decide::earliest(wake, again))
}

/// Node role: run the own node's upgrade command (in the background) or
/// the reboot after it, when the plan's status says it is due.
pub async fn reconcile_own_node(ctx: &Arc<Context>, name: &str) -> Result<()> {
    let Some(n) = ctx.node(name) else {
        return Ok(());
    };
    let plans = ctx.plans();
    if plans.is_empty() {
        return Ok(());
    }
    // Before the node can be admitted: can its governing plan's commands
    // run here? (A command that does not exist drained the node first and
    // left it in maintenance.) The plan admits the node only on `ok`.
    if let Some((key, actions)) = node::to_check(&n, &plans) {
        let what = format!("UpgradePlan {key}: its commands");
        executor::record_command_check(ctx, name, &what, actions, |answer| {
            node::record_check(&n, &key, answer)
        })
        .await?;
    }
    let nms = ctx.maintenances_for(name);
    let effects = node::decide(&node::Snapshot {
        node: &n,
        maintenances: nms.iter().map(|m| m.as_ref()).collect(),
        plans: &plans,
    });
    let now = Timestamp::now();
    // Host commands run in the background (a long upgrade or a hanging
    // `systemctl reboot` must not stall the node's reconciles or trip
    // /healthz, where-features-meet.md finding 11); what comes before them
    // (the once-per-boot or once-per-attempt record) is performed first,
    // and must have succeeded: it also keeps a command from being issued
    // again while it runs.
    let command_at = effects
        .iter()
        .position(|e| matches!(e, Effect::RunHost { .. }));
    let mut effects = effects;
    let background = command_at.map(|i| effects.split_off(i));
    let who = format!("node {name}");
    executor::execute(ctx, &who, Plan::steps(effects), |effect, outcome| {
        ctx.record(name, effect, outcome, now);
        executor::After::Go
    })
    .await?;
    let Some(effect) = background.and_then(|mut rest| (!rest.is_empty()).then(|| rest.remove(0)))
    else {
        return Ok(());
    };
    if matches!(&effect, Effect::RunHost { record, .. } if record.annotation != RESULT_ANNOTATION) {
        if let Effect::RunHost { action, .. } = &effect {
            log::info!("node {name}: upgraded; rebooting by {action}");
        }
        let (ctx, name) = (ctx.clone(), name.to_string());
        crate::runtime::spawn(async move {
            let who = format!("node {name}");
            let ran = executor::execute(&ctx, &who, Plan::steps(vec![effect]), |e, outcome| {
                ctx.record(&name, e, outcome, now);
                match after_command(e, outcome) {
                    Some(follow) => {
                        log::warn!("node {name}: the reboot after the upgrade failed");
                        executor::After::First(vec![follow])
                    }
                    None => executor::After::Go,
                }
            })
            .await;
            if let Err(e) = ran {
                log::warn!("node {name}: the reboot after the upgrade: {e}");
            }
            ctx.anchor.kick();
        })
        .detach();
        return Ok(());
    }
    {
        let Effect::RunHost { record, action, .. } = &effect else {
            return Ok(());
        };
        let token = record.succeeded.clone().unwrap_or_default();
        if !ctx.claim_upgrade(&token) {
            log::debug!("node {name}: an upgrade command is already running");
            return Ok(());
        }
        log::info!("node {name}: drained for its upgrade; upgrading by {action}");
        let (ctx, name) = (ctx.clone(), name.to_string());
        crate::runtime::spawn(async move {
            run_in_background(&ctx, &name, &effect).await;
            ctx.release_upgrade();
        })
        .detach();
    }
    Ok(())
}

/// Run the upgrade command and record its result on the node. The record
/// write is retried for up to [`RESULT_RETRIES`], holding the claim: it
/// is what tells the plan how the command ended, and until it lands this
/// agent would issue the command again — a host command attaches to its
/// record, but a Talos upgrade would be a second install (where-features-
/// meet.md finding 8: given up after 31 s, it was).
async fn run_in_background(ctx: &Context, name: &str, effect: &Effect) {
    let who = format!("node {name}");
    let mut follow = None;
    let ran = executor::execute(
        ctx,
        &who,
        Plan::steps(vec![effect.clone()]),
        |e, outcome| {
            if let Outcome::HostRan { ok, output } = outcome {
                if *ok {
                    log::info!("node {name}: the upgrade command succeeded");
                } else {
                    log::warn!("node {name}: the upgrade command failed: {output}");
                }
            }
            follow = after_command(e, outcome);
            executor::After::Go
        },
    )
    .await;
    if let Err(e) = ran {
        log::warn!("node {name}: upgrade command: {e}");
        return;
    }
    let Some(follow) = follow else {
        return;
    };
    let started = std::time::Instant::now();
    for attempt in 0u32.. {
        let plan = Plan::steps(vec![follow.clone()]);
        match executor::execute_plain(ctx, &who, plan).await {
            Ok(_) => return,
            Err(e) if started.elapsed() < RESULT_RETRIES => {
                log::warn!("node {name}: recording the upgrade's result: {e} (attempt {attempt})");
                crate::runtime::sleep(Duration::from_secs(1 << attempt.min(5))).await;
            }
            Err(e) => {
                log::warn!("node {name}: recording the upgrade's result: {e}; given up");
                return;
            }
        }
    }
}

/// How long the result of an upgrade command is retried.
const RESULT_RETRIES: Duration = Duration::from_secs(600);
