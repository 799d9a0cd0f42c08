//! The node in progress of a mutex run: its rule Jobs (off the node), its
//! release into the canary pool, its version, its cleanup Jobs; a failure
//! that stops the run; the end that unpauses and restores the pools.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::json;

use super::{
    CLEANUP, DEFAULT_UPGRADE_TIMEOUT, DONE, FAILED, FINISHING, JOBS, Parts, Run, RunSnapshot,
    UPGRADING, version_lt,
};
use crate::api::mutex::*;
use crate::api::upgrade::ENV_NODE;
use crate::decide::Effect;
use crate::decide::disrupt::fnv;
use crate::decide::jobs::{self, JobState, MANAGED_BY, MANAGED_BY_LABEL};

/// The node in progress: its Jobs, its release, its version, its cleanup.
pub(super) fn advance(
    run: &mut Run,
    mut p: RunProgress,
    parts: &Parts,
    labels: &[String],
    target_pools: &[String],
    canary: &str,
    pools: &BTreeMap<String, PoolView>,
) -> RunProgress {
    let s = run.s;
    let now = s.now;
    // Bounded: each turn either waits (returns) or moves one step on.
    for _ in 0..(4 * (p.nodes.len() + 1) * (parts.rules.len() + 2)) {
        let Some(n) = usize::try_from(p.current)
            .ok()
            .and_then(|c| p.nodes.get(c))
            .cloned()
        else {
            p.step = FINISHING.into();
            p.since = now.to_string();
            return finish(run, p, target_pools, canary, pools);
        };
        let Some(node) = s.nodes.iter().find(|x| x.name_any() == n) else {
            run.event(true, "NodeGone", format!("node {n} is gone; skipping it"));
            next_node(&mut p, now);
            continue;
        };
        let turn = match p.step.as_str() {
            JOBS | CLEANUP => rule_jobs(run, p, parts, &n, labels, canary),
            UPGRADING => {
                let v = node.labels().get(VERSION_LABEL).cloned();
                upgrading(run, p, &n, &v.unwrap_or_default())
            }
            _ => Turn::Stop(p),
        };
        match turn {
            Turn::Again(next) => p = next,
            Turn::Stop(p) => return p,
        }
    }
    p
}

/// What one step of [`advance`] leaves: the run moved on and the next step
/// may follow in this pass, or the run waits (or failed) until the next.
enum Turn {
    Again(RunProgress),
    Stop(RunProgress),
}

/// The node's rule Jobs (or cleanup Jobs), one at a time in rule order;
/// when all have run, the node is released (or, after cleanup, the next
/// node starts).
fn rule_jobs(
    run: &mut Run,
    mut p: RunProgress,
    parts: &Parts,
    n: &str,
    labels: &[String],
    canary: &str,
) -> Turn {
    let s = run.s;
    let now = s.now;
    let cleanup = p.step == CLEANUP;
    let spec_of = |r: &MutexRule| -> Option<serde_json::Value> {
        if cleanup {
            r.spec.cleanup_job_spec.clone()
        } else {
            Some(r.spec.job_spec.clone())
        }
    };
    // Skip rules without a Job for this step.
    let at = |i: i32| usize::try_from(i).ok().and_then(|i| parts.rules.get(i));
    while at(p.rule).is_some_and(|r| spec_of(r).is_none()) {
        p.rule += 1;
    }
    let Some(rule) = at(p.rule).cloned() else {
        if cleanup {
            next_node(&mut p, now);
        } else {
            release(run, &mut p, n, labels, canary);
        }
        return Turn::Again(p);
    };
    let Some(job) = job_for(s.run, &rule, n, &p, cleanup) else {
        let msg = format!("MutexRule {}: its Job spec cannot be used", rule.name_any());
        return Turn::Stop(fail(run, p, "JobRun", "JobRunFailed", msg));
    };
    let key = jobs::key(&job);
    let what = if cleanup { "cleanup Job" } else { "Job" };
    if p.job.as_deref() != Some(key.as_str()) {
        // Recorded first (status is written before effects).
        p.job = Some(key.clone());
        p.since = now.to_string();
        p.message = Some(format!(
            "{what} {key} for node {n} (MutexRule {})",
            rule.name_any()
        ));
        run.effects.push(Effect::CreateJob { job: Box::new(job) });
        return Turn::Stop(p);
    }
    let state = match s.jobs.get(&key) {
        Some(j) => j.clone(),
        None => match s.job_errors.get(&key) {
            Some(e) => JobState::Failed(format!("could not be created: {e}")),
            None => {
                run.effects.push(Effect::CreateJob { job: Box::new(job) });
                return Turn::Stop(p);
            }
        },
    };
    match state {
        JobState::Running => Turn::Stop(p),
        JobState::Complete => {
            p.rule += 1;
            p.job = None;
            Turn::Again(p)
        }
        JobState::Failed(why) => {
            let msg = format!("{what} {key} for node {n} failed: {why}");
            Turn::Stop(fail(run, p, "JobRun", "JobRunFailed", msg))
        }
    }
}

/// Every rule Job of the node has run: it leaves the paused target pool
/// for the canary pool, whose MCO upgrades it.
fn release(run: &mut Run, p: &mut RunProgress, n: &str, labels: &[String], canary: &str) {
    let msg = format!(
        "Jobs for {n} have run successfully.\nNode is {} of {}",
        p.current + 1,
        p.nodes.len()
    );
    run.cond("JobRun", true, "JobRunSucceeded", &msg);
    let remove: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|l| (l.clone(), serde_json::Value::Null))
        .collect();
    run.effects.push(Effect::PatchNode {
        node: n.into(),
        resource_version: None,
        patch: json!({"metadata": {"labels": remove}}),
    });
    run.event(
        false,
        "NodeReleased",
        format!("node {n} released into pool {canary}"),
    );
    p.step = UPGRADING.into();
    p.rule = 0;
    p.job = None;
    p.since = run.s.now.to_string();
}

/// The released node, until it reports the run's version (then its
/// cleanup) or the upgrade timeout fails the run.
fn upgrading(run: &mut Run, mut p: RunProgress, n: &str, v: &str) -> Turn {
    let s = run.s;
    let now = s.now;
    if !v.is_empty() && !version_lt(v, &p.version) {
        let msg = format!("Node {n} reports version {v}.");
        run.cond("NodeUpgrade", true, "NodeUpgradeSucceeded", &msg);
        run.event(false, "NodeUpgraded", msg);
        p.step = CLEANUP.into();
        p.rule = 0;
        p.job = None;
        p.since = now.to_string();
        return Turn::Again(p);
    }
    let limit = s
        .run
        .spec
        .upgrade_timeout_seconds
        .unwrap_or(DEFAULT_UPGRADE_TIMEOUT);
    let since: Timestamp = p.since.parse().unwrap_or(now);
    let due = since
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(limit))
        .unwrap_or(now);
    if now >= due {
        let msg = format!(
            "node {n} did not report version {} within {limit} s (it reports {})",
            p.version,
            if v.is_empty() { "none" } else { v }
        );
        return Turn::Stop(fail(run, p, "NodeUpgrade", "NodeUpgradeFailed", msg));
    }
    run.wake = Some(crate::decide::duration_until(now, due));
    p.message = Some(format!(
        "node {n} released; waiting for version {}",
        p.version
    ));
    Turn::Stop(p)
}

fn next_node(p: &mut RunProgress, now: Timestamp) {
    p.current += 1;
    p.step = JOBS.into();
    p.rule = 0;
    p.job = None;
    p.since = now.to_string();
}

/// Stop the run where it is: pools stay paused and labels stay (as the
/// original), the condition says why (the original wrote `True`), and
/// nothing is retried until the spec changes.
fn fail(run: &mut Run, mut p: RunProgress, cond: &str, reason: &str, msg: String) -> RunProgress {
    run.cond(cond, false, reason, &msg);
    run.event(true, "RunFailed", msg.clone());
    p.step = FAILED.into();
    p.generation = run.s.run.metadata.generation.unwrap_or_default();
    p.message = Some(format!("{msg}; change the MutexRunConfig's spec to retry"));
    p
}

/// After the last node: unpause the targets and put every selector back
/// as it was before the run.
pub(super) fn finish(
    run: &mut Run,
    mut p: RunProgress,
    target_pools: &[String],
    canary: &str,
    pools: &BTreeMap<String, PoolView>,
) -> RunProgress {
    let s = run.s;
    let mut restored = true;
    for name in target_pools.iter().map(String::as_str).chain([canary]) {
        let saved = p.saved_selectors.get(name).cloned().unwrap_or_default();
        let view = pools.get(name);
        let mut patch = json!({"spec": {}});
        if expressions(view) != saved {
            patch["spec"]["nodeSelector"] = json!({"matchExpressions": saved});
        }
        if name != canary && view.is_some_and(|v| v.paused) {
            patch["spec"]["paused"] = json!(false);
        }
        if patch["spec"].as_object().is_some_and(|o| !o.is_empty()) {
            restored = false;
            run.effects.push(pool_patch(s, name, patch));
        }
    }
    if restored {
        run.cond(
            "TargetPoolsPaused",
            false,
            "NotPaused",
            "Target MachineConfigPools are unpaused.",
        );
        run.cond(
            "UpgradeAvailable",
            false,
            "UpgradeUnavailable",
            "An upgrade is not available.",
        );
        run.event(
            false,
            "RunFinished",
            format!("every target node reports {}", p.version),
        );
        p.step = DONE.into();
        p.since = s.now.to_string();
        p.message = None;
    }
    p
}

pub(super) fn expressions(view: Option<&PoolView>) -> Vec<LabelSelectorRequirement> {
    view.and_then(|v| v.node_selector.as_ref())
        .and_then(|s| s.match_expressions.clone())
        .unwrap_or_default()
}

pub(super) fn pool_patch(s: &RunSnapshot, name: &str, patch: serde_json::Value) -> Effect {
    let mut patch = patch;
    patch["metadata"] = json!({"resourceVersion": s.pool_versions.get(name)});
    Effect::PatchPool {
        name: name.to_string(),
        patch,
    }
}

/// The Job a rule runs for a node: named from the run, node, rule,
/// version and generation (a repeat is a 409, never a second run), its
/// env appended (`NODE_NAME`, `MUTEX_RULE`) and kept off the node — the
/// original replaced the first container's env and the whole affinity.
fn job_for(
    r: &MutexRunConfig,
    rule: &MutexRule,
    node: &str,
    p: &RunProgress,
    cleanup: bool,
) -> Option<DynamicObject> {
    let raw = if cleanup {
        rule.spec.cleanup_job_spec.as_ref()?
    } else {
        &rule.spec.job_spec
    };
    let rule_name = rule.name_any();
    let key = format!(
        "{}|{node}|{rule_name}|{}|{}|{cleanup}",
        r.metadata.uid.as_deref().unwrap_or_default(),
        p.version,
        p.generation
    );
    let base = if cleanup {
        format!("{}-cleanup", rule.spec.job_name)
    } else {
        rule.spec.job_name.clone()
    };
    let mut prefix: String = base.chars().take(46).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    let run_id = format!("{}.{}", r.namespace().unwrap_or_default(), r.name_any());
    let run_label = if run_id.len() <= 63 {
        run_id
    } else {
        format!("{:016x}", fnv(run_id.as_bytes()))
    };
    let labels = [
        (RUN_LABEL, run_label),
        (RULE_LABEL, rule_name.chars().take(63).collect()),
        (
            crate::api::upgrade::NODE_LABEL,
            node.chars().take(63).collect(),
        ),
        (MANAGED_BY_LABEL, MANAGED_BY.to_string()),
    ];
    jobs::build(
        raw,
        jobs::JobFor {
            namespace: &rule.spec.job_namespace,
            name: format!("{prefix}-{:016x}", fnv(key.as_bytes())),
            labels: labels.map(|(k, v)| (k.to_string(), v)).into(),
            owner: None,
            env: &[(ENV_NODE, node), (ENV_RULE, rule_name.as_str())],
            node,
            deadline: None,
            ttl: None,
        },
    )
}
