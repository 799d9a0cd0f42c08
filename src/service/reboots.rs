//! Coordinated reboots in the loop. The cluster role runs one pass over
//! every RebootPolicy (and UpgradePlan, see `upgrades.rs`) after any
//! reconcile ([`reconcile_policies`]): one
//! pass at a time, and triggers that arrive during a pass fold into one
//! more pass instead of queueing one each. The node role looks at its
//! host's signals at the governing policy's period and acts on its own
//! node's reboot ([`reconcile_own_node`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::context::{Context, HostSignal};
use super::metrics;
use crate::api::reboot::RebootPolicy;
use crate::decide::reboot::{self, node};
use crate::decide::{Effect, Outcome, earliest};
use crate::effects::host;
use crate::error::Result;

/// Cluster role: decide and act for every RebootPolicy. Returns when to
/// look again (settle ends, return deadlines, window boundaries).
pub async fn reconcile_policies(ctx: &Context) -> Result<Option<Duration>> {
    ctx.policies_dirty.store(true, Ordering::SeqCst);
    let mut wake = None;
    loop {
        // Someone else is running a pass: it will see the flag and run
        // once more for us.
        let Some(guard) = ctx.policy_pass.try_lock() else {
            return Ok(wake);
        };
        while ctx.policies_dirty.swap(false, Ordering::SeqCst) {
            wake = None;
            let policies = ctx.policies();
            for policy in &policies {
                if super::roles::handles_policy(&ctx.scope, policy) {
                    wake = earliest(wake, reconcile_policy(ctx, policy).await?);
                }
            }
            give_back_orphans(ctx, &policies).await?;
            // UpgradePlans share the pass: one writer of admissions at a
            // time, whichever feature they are for.
            wake = earliest(wake, super::upgrades::reconcile_plans(ctx).await?);
            wake = earliest(wake, super::mutex::reconcile(ctx).await?);
        }
        drop(guard);
        // A trigger between our last check and the unlock found the pass
        // taken and left; take it again for it.
        if !ctx.policies_dirty.load(Ordering::SeqCst) {
            return Ok(wake);
        }
    }
}

/// Delete the NodeMaintenances of policies that are gone.
async fn give_back_orphans(ctx: &Context, policies: &[Arc<RebootPolicy>]) -> Result<()> {
    let maintenances = ctx.all_maintenances();
    let effects = reboot::orphans(&maintenances, policies);
    give_back::<RebootPolicy>(ctx, &maintenances, effects).await
}

/// Perform the give-backs `effects` (NodeMaintenances whose `K` owner
/// looked gone). The stores of two kinds can disagree for a moment (a new
/// owner's maintenance seen before the owner), so the API server has the
/// last word: a GET of the owner, only for the rare candidate.
pub(super) async fn give_back<K>(
    ctx: &Context,
    maintenances: &[Arc<crate::api::nodemaintenance::NodeMaintenance>],
    effects: Vec<Effect>,
) -> Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let kind = K::kind(&());
    let api: kube::Api<K> = kube::Api::all(ctx.effects.client.clone());
    for effect in effects {
        let Effect::DeleteMaintenance { nm, .. } = &effect else {
            continue;
        };
        let owner = maintenances
            .iter()
            .find(|m| &m.name_any() == nm)
            .and_then(|m| {
                m.owner_references()
                    .iter()
                    .find(|o| o.kind == kind)
                    .cloned()
            });
        if let Some(o) = &owner {
            let live = api
                .get_opt(&o.name)
                .await
                .map_err(crate::error::Error::kube(format!(
                    "reading {kind} {}",
                    o.name
                )))?;
            if live.is_some_and(|p| p.meta().uid.as_deref() == Some(o.uid.as_str())) {
                continue;
            }
        }
        log::info!("NodeMaintenance {nm}: its {kind} is gone; giving the node back");
        ctx.effects.perform(&effect).await?;
    }
    Ok(())
}

async fn reconcile_policy(ctx: &Context, policy: &RebootPolicy) -> Result<Option<Duration>> {
    let now = Timestamp::now();
    let plan = {
        let nodes = ctx.all_nodes();
        let maintenances = ctx.all_maintenances();
        let pods_on = |n: &str| ctx.pods_on(n);
        reboot::decide(&reboot::Snapshot {
            policy,
            nodes: &nodes,
            maintenances: &maintenances,
            pods_on: &pods_on,
            now,
            remote: !ctx.node_agents,
        })
    };
    let name = policy.name_any();
    for effect in &plan.effects {
        log::debug!("RebootPolicy {name}: {}", crate::effects::describe(effect));
        let outcome = ctx.effects.perform(effect).await?;
        observe(ctx, policy, effect, &outcome);
        ctx.remember(&outcome);
        if let Some(follow) = node::after_command(effect, &outcome) {
            log_command_failure(effect, &outcome);
            ctx.effects.perform(&follow).await?;
        }
    }
    if let Some((level, line)) = &plan.note {
        log::log!(*level, "{line}");
    }
    Ok(match plan.then {
        crate::decide::Then::Wait(d) => d,
        crate::decide::Then::Again => Some(Duration::from_millis(100)),
    })
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
    if let (Effect::RunHost { node, argv, .. }, Outcome::HostRan { output, .. }) = (effect, outcome)
    {
        log::warn!(
            "node {node}: reboot command {:?} failed: {output}",
            argv.join(" ")
        );
    }
}

/// Node role: look at the host's signals when due, then mark need or issue
/// the reboot. Returns when the next look is due.
pub async fn reconcile_own_node(ctx: &Context, name: &str) -> Result<Option<Duration>> {
    let Some(n) = ctx.node(name) else {
        return Ok(None);
    };
    let policies = ctx.policies();
    let Some(governing) = node::governing(&n, &policies).cloned() else {
        // No policy covers this node: nothing reads its signals.
        return Ok(None);
    };
    let now = Timestamp::now();
    let period = governing.spec.detect.period_seconds.max(5) as i64;
    let last = ctx
        .host_signal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let signal = match last {
        Some(s) if now.duration_since(s.at) < SignedDuration::from_secs(period) => s,
        _ => {
            let s = look(ctx, &governing, now).await;
            *ctx.host_signal.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
            s
        }
    };
    let next_look = period - now.duration_since(signal.at).as_secs();
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
        if let Effect::RunHost { argv, .. } = effect {
            log::info!(
                "node {name}: drained for its reboot; running {:?}",
                argv.join(" ")
            );
        }
        let outcome = ctx.effects.perform(effect).await?;
        ctx.record(name, effect, &outcome, now);
        if let Some(follow) = node::after_command(effect, &outcome) {
            log_command_failure(effect, &outcome);
            let outcome = ctx.effects.perform(&follow).await?;
            ctx.record(name, &follow, &outcome, now);
        }
        if let Effect::PatchNode { patch, .. } = effect
            && patch["metadata"]["annotations"][crate::api::reboot::NEEDED_ANNOTATION].is_string()
        {
            log::info!("node {name}: the host says a reboot is needed; marked");
        }
    }
    Ok(Some(Duration::from_secs(next_look.max(1) as u64)))
}

/// One look at the host: the sentinel file, then the sentinel command.
async fn look(ctx: &Context, policy: &Arc<RebootPolicy>, now: Timestamp) -> HostSignal {
    let detect = &policy.spec.detect;
    let mut needed = match host::sentinel_file(&ctx.host_root, &detect.sentinel_file) {
        Ok(v) => Some(v),
        Err(e) => {
            log::warn!("reboot sentinel: {e}");
            None
        }
    };
    if needed != Some(true) && !detect.sentinel_command.is_empty() {
        let argv = host::command_line(&detect.sentinel_command, ctx.effects.exec);
        needed = match host::sentinel_command(&argv).await {
            Ok(v) => Some(v),
            Err(e) => {
                log::warn!(
                    "reboot sentinel command {:?}: {e}",
                    detect.sentinel_command.join(" ")
                );
                needed
            }
        };
    }
    HostSignal { at: now, needed }
}
