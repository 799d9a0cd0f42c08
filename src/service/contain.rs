//! How one object's failure stays with that object: [`contain`] runs its
//! decision unless it is backing off, and a failure is counted, logged,
//! published on the object (status field and `ReconcileFailed` event) and
//! backed off while every other object goes on. [`give_back`] hands back
//! the nodes of owners that are gone, each NodeMaintenance on its own in
//! the same way. Apart from the context so that the context (state) does
//! not call the executor (actions).

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use super::context::Context;
use super::failing::{Failing, Subject};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::decide::Effect;
use crate::error::{Error, Result};

/// Decide for one object unless it is backing off: `decide` gets why its
/// last pass failed (for its status) and returns when to look again. Its
/// error stays with the object: reported on it, retried with backoff.
pub async fn contain<F, Fut>(ctx: &Context, subject: &Subject, decide: F) -> Option<Duration>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Duration>>>,
{
    contain_in(ctx, &ctx.failing, subject, decide).await
}

/// [`contain`] with another memory of failures than the scheduler's (the
/// replacement task keeps its own).
pub async fn contain_in<F, Fut>(
    ctx: &Context,
    failing: &Failing,
    subject: &Subject,
    decide: F,
) -> Option<Duration>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Duration>>>,
{
    if let Err(wait) = failing.due(&subject.key, subject.change.as_deref()) {
        return Some(wait);
    }
    let result = decide(failing.message(&subject.key)).await;
    report(ctx, failing, subject, result).await
}

/// Settle one object's result: success forgets its failure; an error is
/// counted, logged, published on the object, and backed off.
async fn report(
    ctx: &Context,
    failing: &Failing,
    subject: &Subject,
    result: Result<Option<Duration>>,
) -> Option<Duration> {
    let err = match result {
        Ok(wake) => {
            failing.succeeded(&subject.key);
            return wake;
        }
        Err(e) => e,
    };
    if let Error::LostLease(_) = err {
        return None;
    }
    if err.api_code() == Some(409) {
        match failing.conflicted(&subject.key) {
            Ok(wait) => {
                super::metrics::count_error(&err);
                log::debug!("{}: {err} (deciding again in {wait:?})", subject.key);
                return Some(wait);
            }
            // Another writer keeps winning: from here it is a failure,
            // reported on the object and backed off.
            Err(n) => log::debug!("{}: {n} conflicts in a row", subject.key),
        }
    }
    super::metrics::count_error(&err);
    let message = err.to_string();
    let delay = failing.failed(&subject.key, subject.change.clone(), message.clone());
    log::warn!(
        "{}: {message} (its other work goes on; retrying it in {} s)",
        subject.key,
        delay.as_secs()
    );
    let event = Effect::Event {
        object: subject.reference.clone(),
        warning: true,
        reason: "ReconcileFailed",
        note: message,
    };
    let plan = crate::decide::Plan::steps(vec![event]);
    if let Err(e) = super::executor::execute_plain(ctx, &subject.key, plan).await {
        log::debug!("{}: publishing its failure: {e}", subject.key);
    }
    Some(delay)
}

/// Perform the give-backs `effects` (NodeMaintenances whose `K` owner
/// looked gone). The stores of two kinds can disagree for a moment (a
/// new owner's maintenance seen before the owner), so the API server
/// has the last word: a GET of the owner, only for the rare candidate.
/// Each maintenance on its own: one that fails is reported on it and
/// backed off, and the others go on.
pub async fn give_back<K>(
    ctx: &Context,
    maintenances: &[Arc<NodeMaintenance>],
    effects: Vec<crate::decide::Effect>,
) -> Option<std::time::Duration>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let kind = K::kind(&());
    let api: kube::Api<K> = kube::Api::all(ctx.effects.client.clone());
    let mut wake = None;
    for effect in effects {
        let crate::decide::Effect::DeleteMaintenance { nm, .. } = &effect else {
            continue;
        };
        let Some(m) = maintenances.iter().find(|m| &m.name_any() == nm) else {
            continue;
        };
        let owner = m
            .owner_references()
            .iter()
            .find(|o| o.kind == kind)
            .cloned();
        let subject = Subject::typed(m.as_ref());
        let (api, kind, effect) = (&api, &kind, &effect);
        let w = contain(ctx, &subject, |_| async move {
            if let Some(o) = &owner {
                let live = api
                    .get_opt(&o.name)
                    .await
                    .map_err(crate::error::Error::kube(format!(
                        "reading {kind} {}",
                        o.name
                    )))?;
                if live.is_some_and(|p| p.meta().uid.as_deref() == Some(o.uid.as_str())) {
                    return Ok(None);
                }
            }
            log::info!("NodeMaintenance {nm}: its {kind} is gone; giving the node back");
            let plan = crate::decide::Plan::steps(vec![effect.clone()]);
            super::executor::execute_plain(ctx, "give-back", plan).await?;
            Ok(None)
        })
        .await;
        wake = crate::decide::earliest(wake, w);
    }
    wake
}
