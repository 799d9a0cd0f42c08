//! A replacement round's NodeVersions: each decided on its own nodes
//! (the oldest selecting a node governs it: `decide::replace::shares`),
//! the provider asked what the round needs, and the effects performed,
//! provider failures recorded per NodeVersion.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::decide::replace::{self, Facts, Failure, Read};
use crate::decide::{Effect, Outcome, Then, earliest};
use crate::error::Result;
use crate::service::context::Context;
use crate::service::executor::{self, After, Before, Hooks};
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
    let mut stored: Vec<Arc<NodeVersion>> = typed(&r.stores.versions);
    replace::oldest_first(&mut stored);
    // Each as it governs: its rollout fields from the spec, or recorded
    // when a client's write lost them (decide/replace/fields.rs).
    let (nvs, readings): (Vec<Arc<NodeVersion>>, Vec<replace::Reading>) = stored
        .iter()
        .map(|nv| {
            let (governing, reading) = replace::governing(nv);
            (Arc::new(governing), reading)
        })
        .unzip();
    let held: Vec<(Arc<NodeVersion>, bool)> = nvs
        .iter()
        .cloned()
        .zip(readings.iter().map(|r| r.hold))
        .collect();
    let handled =
        |s: Option<&LabelSelector>| crate::service::roles::handles_node_version(&ctx.scope, s);
    let shares = replace::shares(&held, &handled, &ctx.all_nodes());
    let pending: Vec<Arc<PendingNode>> = typed(&r.stores.pending);
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let strategies: Vec<Arc<AutoscalingStrategy>> = typed(&r.stores.strategies);
    let maintenances = ctx.all_maintenances();
    let mut wake = None;
    for ((nv, reading), share) in nvs.iter().zip(&readings).zip(shares) {
        let Some(share) = share else {
            continue;
        };
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
        let in_flight = lock(&r.in_flight).clone();
        let mut snap = replace::Snapshot {
            nv,
            nodes: &share.nodes,
            pending: &owned,
            groups: &groups,
            strategies: &strategies,
            maintenances: &maintenances,
            facts: &Facts::default(),
            failures: &failures,
            in_flight: &in_flight,
            server_version: r.server_version.as_deref(),
            others_busy: share.others_busy,
            others_unknown: share.others_unknown,
            governed_elsewhere: share.governed_elsewhere,
            held_elsewhere: &share.held_by,
            fields: reading,
            node_pods: &|_| None,
            now,
        };
        let (facts, ask_again) = super::ask::ask(ctx, r, replace::questions(&snap)).await;
        wake = earliest(wake, ask_again);
        snap.facts = &facts;
        let mut plan = super::super::node_pods::deciding(ctx, |pods, _| {
            replace::decide(&replace::Snapshot {
                node_pods: pods,
                ..snap
            })
        })
        .await;
        if let Some((_, line)) = &mut plan.note {
            *line = format!("NodeVersion {}: {line}", nv.name_any());
        }
        let mut round = Round {
            ctx,
            r,
            snap: &snap,
            nv_uid: nv.uid().unwrap_or_default(),
            expect: &mut *expect,
            acted: false,
            failed: false,
        };
        let then = executor::run(ctx, "replace", plan, &mut round).await?;
        let acted = round.acted;
        match then {
            Then::Again if acted => return Ok((true, None)),
            Then::Again => wake = earliest(wake, Some(Duration::from_millis(200))),
            Then::Wait(d) => wake = earliest(wake, d),
        }
    }
    Ok((false, wake))
}

/// One NodeVersion's round through the executor: a provider failure
/// ends what depended on it (the writes after it wait for the next round;
/// events do not: a JoinTimeout is news whether or not deleting the
/// instance worked) and is recorded for status and backoff; an event is
/// published once per reason and object; an instance's delete runs in the
/// background; `acted` says whether anything but an event was performed.
struct Round<'a, 's> {
    ctx: &'a Context,
    r: &'a Replace,
    snap: &'a replace::Snapshot<'s>,
    nv_uid: String,
    expect: &'a mut Expect,
    acted: bool,
    failed: bool,
}

impl Round<'_, '_> {
    fn fail(&mut self, key: &str, message: String) {
        lock(&self.r.failures)
            .entry(self.nv_uid.clone())
            .or_default()
            .insert(
                key.to_string(),
                Failure {
                    message,
                    at: Timestamp::now(),
                },
            );
        self.acted = true;
        self.failed = true;
    }
}

impl Hooks for Round<'_, '_> {
    fn before(&mut self, effect: &Effect) -> Result<Before> {
        if let Effect::Event { object, reason, .. } = effect {
            let key = format!("{reason}/{}", object.name.as_deref().unwrap_or_default());
            return Ok(if lock(&self.r.published).insert(key) {
                Before::Perform
            } else {
                Before::Skip
            });
        }
        if self.failed {
            return Ok(Before::Skip);
        }
        // An instance's delete runs beside the rounds: nothing after it in
        // the round needs its answer (it was recorded as issued first),
        // and a cloud's delete may take minutes, which would hold up every
        // other pairing, drain and join behind it.
        if matches!(effect, Effect::Provider { verb, .. } if BACKGROUND.contains(verb)) {
            in_background(self.ctx, self.r, &self.nv_uid, effect)?;
            return Ok(Before::Done(Outcome::Done));
        }
        Ok(Before::Perform)
    }

    fn after(&mut self, effect: &Effect, outcome: &Outcome) -> After {
        self.acted |= !matches!(effect, Effect::Event { .. });
        match (effect, outcome) {
            (_, Outcome::ObjectWritten { .. }) => self.expect.written_by(outcome),
            (Effect::CreateMaintenance { .. }, Outcome::MaintenanceWritten(m)) => {
                self.expect.maintenances.push(m.name_any())
            }
            (Effect::DeleteObject { kind, name, .. }, _) => {
                self.expect.gone.push((Some(*kind), name.clone()))
            }
            (Effect::DeleteNode { name, .. }, _) => self.expect.gone.push((None, name.clone())),
            _ => {}
        }
        let Effect::Provider { key, verb, request } = effect else {
            return After::Go;
        };
        match outcome {
            Outcome::ProviderFailed(message) => {
                log::warn!("node replacement: {message}");
                self.fail(key, message.clone());
            }
            Outcome::ProviderAnswered(answer) => {
                if let Some(per) = lock(&self.r.failures).get_mut(&self.nv_uid) {
                    per.remove(key);
                }
                if *verb == "set-scaling-group-image" {
                    let id = request["groupId"]
                        .as_str()
                        .unwrap_or_default()
                        .to_lowercase();
                    lock(&self.r.answers).remove(&(Read::ScalingGroupImage, id));
                }
                if *verb == "create-node" {
                    let id = request["requestId"].as_str().unwrap_or_default();
                    let group = request["groupId"].as_str().unwrap_or_default();
                    // The new machine is recorded as its PendingNode next,
                    // before anything else in the round.
                    match replace::joining(self.snap, id, group, answer) {
                        Ok(pn) => {
                            log::info!(
                                "NodeVersion {}: surge node {} created in group {group}",
                                self.snap.nv.name_any(),
                                pn["metadata"]["name"].as_str().unwrap_or_default()
                            );
                            return After::First(vec![Effect::CreateObject {
                                kind: Kind::PendingNode,
                                object: pn,
                            }]);
                        }
                        Err(message) => self.fail(key, message),
                    }
                }
            }
            _ => {}
        }
        After::Go
    }
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
