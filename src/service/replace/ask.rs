//! What replacement asks the provider: a round's reads (reused as
//! `decide::replace::Read` says), and the scaling groups it lists at start
//! and every 15 minutes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::constellation::*;
use crate::decide::replace::ask::Reuse;
use crate::decide::replace::{self, Facts, Read};
use crate::decide::{Effect, Outcome};
use crate::service::context::Context;
use crate::service::watch::typed;

use super::*;

/// Provider questions asked at once: a cloud API answers in hundreds of
/// milliseconds, and a round with several joining nodes should not wait
/// for each in turn.
const ASK_IN_PARALLEL: usize = 8;

/// Ask the provider what a round needs, reusing answers as long as
/// [`Read::reuse`] allows. Also when to run the round again because a
/// failed read may be asked again then: a round that skipped what it could
/// not read has nothing else to wake it (a provider that timed out once
/// stalled a rollout until the next 15-minute listing).
pub(super) async fn ask(
    ctx: &Context,
    r: &Replace,
    questions: Vec<(Read, String)>,
) -> (Facts, Option<Duration>) {
    let mut facts = Facts::default();
    let mut fresh: Vec<(Read, String)> = Vec::new();
    let mut retry: Option<Instant> = None;
    let mut failed_until = |until: Option<Instant>, a: &Result<String, String>| {
        if let (Some(t), Err(_)) = (until, a) {
            retry = Some(retry.map_or(t, |r| r.min(t)));
        }
    };
    {
        let answers = lock(&r.answers);
        for (read, id) in questions {
            let kept = answers
                .get(&(read, id.clone()))
                .filter(|(until, _)| until.is_none_or(|t| Instant::now() < t));
            match kept {
                Some((until, a)) => {
                    failed_until(*until, a);
                    facts.insert(read, id, a.clone())
                }
                None => fresh.push((read, id)),
            }
        }
    }
    for chunk in fresh.chunks(ASK_IN_PARALLEL) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|(read, id)| {
                let (provider, read, request) =
                    (ctx.effects.provider.clone(), *read, read.request(id));
                let gate = ctx.effects.gate.clone();
                crate::runtime::spawn(async move {
                    gate.may_act().map_err(|e| e.to_string())?;
                    match provider {
                        Some(p) => p.call(read.verb(), &request).await,
                        None => Err("no provider plugin".to_string()),
                    }
                })
            })
            .collect();
        for ((read, id), task) in chunk.iter().zip(tasks) {
            let a = task.await.and_then(|v| read.answer(&v));
            if let Err(e) = &a {
                log::warn!("{e}");
            }
            let until = match read.reuse(a.is_ok()) {
                Reuse::Never => None,
                Reuse::WhileItExists => Some(None),
                Reuse::For(d) => Some(Some(Instant::now() + d)),
            };
            if let Some(until) = until {
                failed_until(until, &a);
                lock(&r.answers).insert((*read, id.clone()), (until, a.clone()));
            }
            facts.insert(*read, id.clone(), a);
        }
    }
    let again = retry.map(|t| t.saturating_duration_since(Instant::now()));
    (facts, again)
}

/// Create a ScalingGroup for each group the provider lists that has none
/// (at start, then every 15 minutes), and delete the ones nodekeeper
/// created whose group is gone. A ScalingGroup someone else created is
/// never deleted (Constellation deletes every undiscovered one).
pub(super) async fn list_groups(ctx: &Context, r: &Replace) -> Option<Duration> {
    {
        let listed = lock(&r.groups_listed);
        if let Some(next) = listed.next
            && next > Instant::now()
        {
            return Some(next - Instant::now());
        }
    }
    let answer = match ctx
        .effects
        .perform(&Effect::Provider {
            key: "list-scaling-groups".into(),
            verb: "list-scaling-groups",
            request: serde_json::json!({}),
        })
        .await
    {
        Ok(Outcome::ProviderAnswered(v)) => v,
        other => {
            // Asked again soon (30 s doubling to the period), not only
            // after a whole period: the time is recorded after the answer.
            let mut listed = lock(&r.groups_listed);
            listed.failures = listed.failures.saturating_add(1);
            let delay = (LIST_GROUPS_RETRY * (1 << listed.failures.min(5))).min(LIST_GROUPS_EVERY);
            listed.next = Some(Instant::now() + delay);
            match other {
                Ok(Outcome::ProviderFailed(e)) => log::warn!("node replacement: {e}"),
                Err(e) => log::warn!("node replacement: listing scaling groups: {e}"),
                _ => {}
            }
            return Some(delay);
        }
    };
    *lock(&r.groups_listed) = Listed {
        next: Some(Instant::now() + LIST_GROUPS_EVERY),
        failures: 0,
    };
    let existing: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let nv_name = typed::<NodeVersion>(&r.stores.versions)
        .first()
        .map(|v| v.name_any())
        .unwrap_or_else(|| NODE_VERSION_NAME.to_string());
    let effects = replace::discovered_groups(&answer, &existing, &nv_name);
    // Each group's object is independent of the others.
    let plan = crate::decide::Plan::together(effects);
    if let Err(err) = crate::service::executor::execute_plain(ctx, "replace", plan).await {
        log::warn!("node replacement: scaling groups: {err}");
    }
    Some(LIST_GROUPS_EVERY)
}
