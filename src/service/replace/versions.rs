//! A replacement round's NodeVersions: each decided on its own nodes
//! (the oldest selecting a node governs it), the provider asked what the
//! round needs, and the effects performed, provider failures recorded
//! per NodeVersion.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::decide::replace::{self, Facts, Failure, Read};
use crate::decide::{Effect, Outcome, Then, earliest};
use crate::error::Result;
use crate::service::context::Context;
use crate::service::watch::typed;

use super::*;

/// Each NodeVersion this role handles, oldest first; a node belongs to the
/// oldest NodeVersion selecting it, so two never fight over one.
pub(super) async fn versions(
    ctx: &Context,
    r: &Replace,
    now: Timestamp,
    expect: &mut Expect,
) -> Result<(bool, Option<Duration>)> {
    let mut nvs: Vec<Arc<NodeVersion>> = typed(&r.stores.versions);
    nvs.sort_by_key(|v| {
        (
            v.metadata.creation_timestamp.as_ref().map(|t| t.0),
            v.name_any(),
        )
    });
    let all_nodes = ctx.all_nodes();
    let mut taken: HashSet<String> = HashSet::new();
    let pending: Vec<Arc<PendingNode>> = typed(&r.stores.pending);
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let strategies: Vec<Arc<AutoscalingStrategy>> = typed(&r.stores.strategies);
    let maintenances = ctx.all_maintenances();
    let mut wake = None;
    for nv in &nvs {
        let selector = nv.spec.node_selector.as_ref();
        if !crate::service::roles::handles_node_version(&ctx.scope, selector) {
            continue;
        }
        let (nodes, elsewhere): (Vec<Arc<Node>>, Vec<Arc<Node>>) = all_nodes
            .iter()
            .filter(|n| {
                selector.is_none_or(|s| crate::decide::drain::selector_matches(s, n.labels()))
            })
            .cloned()
            .partition(|n| !taken.contains(&n.name_any()));
        taken.extend(nodes.iter().map(|n| n.name_any()));
        let owned: Vec<Arc<PendingNode>> = pending
            .iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == nv.uid().as_ref())
            })
            .cloned()
            .collect();
        let failures = lock(&r.failures)
            .get(&nv.uid().unwrap_or_default())
            .cloned()
            .unwrap_or_default();
        let others_busy = nvs.iter().any(|o| {
            o.uid() != nv.uid()
                && crate::service::roles::handles_node_version(
                    &ctx.scope,
                    o.spec.node_selector.as_ref(),
                )
                && o.status.as_ref().is_none_or(|st| {
                    !st.outdated.is_empty()
                        || !st.pending.is_empty()
                        || !st.heirs.is_empty()
                        || !st.donors.is_empty()
                        || !st.obsolete.is_empty()
                        || !st.awaiting_annotation.is_empty()
                })
        });
        let in_flight = lock(&r.in_flight).clone();
        let mut snap = replace::Snapshot {
            nv,
            nodes: &nodes,
            pending: &owned,
            groups: &groups,
            strategies: &strategies,
            maintenances: &maintenances,
            facts: &Facts::default(),
            failures: &failures,
            in_flight: &in_flight,
            server_version: r.server_version.as_deref(),
            others_busy,
            governed_elsewhere: elsewhere.len(),
            now,
        };
        let facts = super::ask::ask(ctx, r, replace::questions(&snap)).await;
        snap.facts = &facts;
        let plan = replace::decide(&snap);
        if let Some((level, line)) = &plan.note {
            log::log!(*level, "NodeVersion {}: {line}", nv.name_any());
        }
        let acted = perform(ctx, r, &snap, &plan.effects, expect).await?;
        match plan.then {
            Then::Again if acted => return Ok((true, None)),
            Then::Again => wake = earliest(wake, Some(Duration::from_millis(200))),
            Then::Wait(d) => wake = earliest(wake, d),
        }
    }
    Ok((false, wake))
}

/// Perform a round's effects in order; a provider failure ends the batch
/// (what follows depended on it) and is recorded for status and backoff.
/// Returns whether anything was written.
async fn perform(
    ctx: &Context,
    r: &Replace,
    snap: &replace::Snapshot<'_>,
    effects: &[Effect],
    expect: &mut Expect,
) -> Result<bool> {
    let mut acted = false;
    let nv_uid = snap.nv.uid().unwrap_or_default();
    let fail = |key: &str, message: String| {
        lock(&r.failures).entry(nv_uid.clone()).or_default().insert(
            key.to_string(),
            Failure {
                message,
                at: Timestamp::now(),
            },
        );
    };
    // After a failed provider call the writes that depended on it are
    // left for the next round; events are not (a JoinTimeout is news
    // whether or not deleting the instance worked).
    let mut failed = false;
    let mut i = 0;
    while i < effects.len() {
        let effect = &effects[i];
        i += 1;
        if failed && !matches!(effect, Effect::Event { .. }) {
            continue;
        }
        if let Effect::Event { object, reason, .. } = effect {
            let key = format!("{reason}/{}", object.name.as_deref().unwrap_or_default());
            if !lock(&r.published).insert(key) {
                continue;
            }
        }
        // Provider calls in a row are independent (a surge's create-node
        // asks, a round's instance deletes): they run at once, each a
        // process that may take seconds; their outcomes are taken in order.
        let run: Vec<&Effect> = match effect {
            Effect::Provider { .. } => effects[i - 1..]
                .iter()
                .take_while(|e| matches!(e, Effect::Provider { .. }))
                .collect(),
            _ => vec![effect],
        };
        i += run.len() - 1;
        for e in &run {
            log::debug!("replace: {}", crate::effects::describe(e));
        }
        // An instance's delete runs beside the rounds: nothing after it in
        // the round needs its answer (it was recorded as issued first),
        // and a cloud's delete may take minutes, which would hold up every
        // other pairing, drain and join behind it.
        let (background, run): (Vec<&Effect>, Vec<&Effect>) = run
            .into_iter()
            .partition(|e| matches!(e, Effect::Provider { verb, .. } if BACKGROUND.contains(verb)));
        for e in background {
            in_background(ctx, r, &nv_uid, e)?;
            acted = true;
        }
        let outcomes =
            crate::runtime::join_all(run.iter().map(|e| ctx.effects.perform(e)).collect()).await;
        for (effect, outcome) in run.into_iter().zip(outcomes) {
            after(
                ctx,
                r,
                snap,
                effect,
                outcome?,
                expect,
                &fail,
                &mut acted,
                &mut failed,
            )
            .await?;
        }
    }
    Ok(acted)
}

/// Provider writes that run in the background of the rounds.
const BACKGROUND: &[&str] = &["delete-node"];

/// Run provider write `effect` on a task of its own: its key is in flight
/// (the decision waits for it) until it is answered; a refusal is recorded
/// for status and backoff as in a round, and the answer kicks the task.
/// It counts as an effect running under the leader gate until it ends, so
/// a stepping-down leader waits for it as for any other.
fn in_background(ctx: &Context, r: &Replace, nv_uid: &str, effect: &Effect) -> Result<()> {
    let Effect::Provider { key, verb, request } = effect else {
        return Ok(());
    };
    let running = ctx.effects.gate.enter()?;
    if !lock(&r.in_flight).insert(key.clone()) {
        return Ok(());
    }
    let (provider, in_flight, failures, kick) = (
        ctx.effects.provider.clone(),
        r.in_flight.clone(),
        r.failures.clone(),
        r.kick.clone(),
    );
    let (key, verb, request, nv_uid) = (key.clone(), *verb, request.clone(), nv_uid.to_string());
    crate::runtime::spawn(async move {
        let answer = match provider {
            Some(p) => p.call(verb, &request).await,
            None => Err("no provider plugin: start nodekeeper with --provider-command".into()),
        };
        {
            let mut failures = lock(&failures);
            let per = failures.entry(nv_uid).or_default();
            match answer {
                Ok(_) => {
                    per.remove(&key);
                }
                Err(message) => {
                    log::warn!("node replacement: {message}");
                    per.insert(
                        key.clone(),
                        Failure {
                            message,
                            at: Timestamp::now(),
                        },
                    );
                }
            }
        }
        lock(&in_flight).remove(&key);
        drop(running);
        if let Some(k) = kick {
            k.kick();
        }
    })
    .detach();
    Ok(())
}

/// What an effect's outcome changes: our memory of writes, what the next
/// round waits for, provider failures and answers (a create-node answer
/// is recorded as its PendingNode at once).
#[allow(clippy::too_many_arguments)]
async fn after(
    ctx: &Context,
    r: &Replace,
    snap: &replace::Snapshot<'_>,
    effect: &Effect,
    outcome: crate::decide::Outcome,
    expect: &mut Expect,
    fail: &(dyn Fn(&str, String) + Sync),
    acted: &mut bool,
    failed: &mut bool,
) -> Result<()> {
    let nv_uid = snap.nv.uid().unwrap_or_default();
    ctx.remember(&outcome);
    *acted |= !matches!(effect, Effect::Event { .. });
    match (effect, &outcome) {
        (
            _,
            Outcome::ObjectWritten {
                kind,
                name,
                resource_version,
            },
        ) => {
            expect
                .written
                .push((*kind, name.clone(), resource_version.clone()));
        }
        (Effect::CreateMaintenance { .. }, Outcome::MaintenanceWritten(m)) => {
            expect.maintenances.push(m.name_any())
        }
        (Effect::DeleteObject { kind, name, .. }, _) => {
            expect.gone.push((Some(*kind), name.clone()))
        }
        (Effect::DeleteNode { name, .. }, _) => expect.gone.push((None, name.clone())),
        _ => {}
    }
    let Effect::Provider { key, verb, request } = effect else {
        return Ok(());
    };
    match outcome {
        Outcome::ProviderFailed(message) => {
            log::warn!("node replacement: {message}");
            fail(key, message);
            *acted = true;
            *failed = true;
        }
        Outcome::ProviderAnswered(answer) => {
            if let Some(per) = lock(&r.failures).get_mut(&nv_uid) {
                per.remove(key);
            }
            if *verb == "set-scaling-group-image" {
                let id = request["groupId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_lowercase();
                lock(&r.answers).remove(&(Read::ScalingGroupImage, id));
            }
            if *verb == "create-node" {
                let id = request["requestId"].as_str().unwrap_or_default();
                let group = request["groupId"].as_str().unwrap_or_default();
                match replace::joining(snap, id, group, &answer) {
                    Ok(pn) => {
                        log::info!(
                            "NodeVersion {}: surge node {} created in group {group}",
                            snap.nv.name_any(),
                            pn["metadata"]["name"].as_str().unwrap_or_default()
                        );
                        let o = ctx
                            .effects
                            .perform(&Effect::CreateObject {
                                kind: Kind::PendingNode,
                                object: pn,
                            })
                            .await?;
                        if let Outcome::ObjectWritten {
                            kind,
                            name,
                            resource_version,
                        } = o
                        {
                            expect.written.push((kind, name, resource_version));
                        }
                    }
                    Err(message) => {
                        fail(key, message);
                        *acted = true;
                        *failed = true;
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}
