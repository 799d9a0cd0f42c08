//! One MutexRunConfig's decision: validate what it names, check for an
//! upgrade, start (or resume, or retry) a run, and prepare it — target
//! pools paused, waiting nodes labelled per rule, selectors moved — level
//! by level, each effect only where the world differs.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::ResourceExt;
use serde_json::json;

use super::turns::{advance, expressions, finish, pool_patch};
use super::{
    DONE, FAILED, FINISHING, JOBS, Kind, PREPARING, Parts, Run, RunSnapshot, condition,
    no_pool_api, version_lt, write,
};
use crate::api::mutex::*;
use crate::decide::{Effect, Plan, Then};

/// One run config's next plan: its status first (guarded), then pool and
/// node patches, Jobs and events.
pub fn run(s: &RunSnapshot) -> Plan {
    let r = s.run;
    let ns = r.namespace().unwrap_or_default();
    let old = r.status.clone().unwrap_or_default();
    let mut run = Run {
        s,
        conds: old.conditions.clone(),
        effects: Vec::new(),
        wake: None,
    };
    let progress = step(&mut run, &ns, old.progress.as_ref());
    let status = MutexRunConfigStatus {
        conditions: run.conds,
        progress,
    };
    let mut effects = Vec::new();
    if status != old {
        effects.push(write(Kind::RunConfig, &r.metadata, json!(status)));
    }
    effects.extend(run.effects);
    Plan {
        effects,
        together: false,
        then: Then::Wait(run.wake),
        note: None,
    }
}

fn validate(s: &RunSnapshot, ns: &str) -> Result<Parts, String> {
    let mut rules = Vec::new();
    for r in &s.run.spec.mutex_rules {
        let want_ns = r.namespace.as_deref().unwrap_or(ns);
        let Some(rule) = s
            .rules
            .iter()
            .find(|x| x.name_any() == r.name && x.namespace().as_deref() == Some(want_ns))
        else {
            return Err(format!("MutexRule {want_ns}/{} not found", r.name));
        };
        let conds = rule
            .status
            .as_ref()
            .map(|st| st.conditions.as_slice())
            .unwrap_or(&[]);
        match condition(conds, "ValidConfig") {
            Some(c) if c.status == "True" => rules.push(rule.clone()),
            Some(c) => {
                return Err(format!(
                    "MutexRule {want_ns}/{} is not valid: {}",
                    r.name, c.message
                ));
            }
            None => {
                return Err(format!(
                    "MutexRule {want_ns}/{} is not validated yet",
                    r.name
                ));
            }
        }
    }
    let mut targets = Vec::new();
    for t in &s.run.spec.mutex_targets {
        let want_ns = t.namespace.as_deref().unwrap_or(ns);
        let Some(target) = s
            .targets
            .iter()
            .find(|x| x.name_any() == t.name && x.namespace().as_deref() == Some(want_ns))
        else {
            return Err(format!("MutexTarget {want_ns}/{} not found", t.name));
        };
        let conds = target
            .status
            .as_ref()
            .map(|st| st.conditions.as_slice())
            .unwrap_or(&[]);
        match condition(conds, "ValidConfig") {
            Some(c) if c.status == "True" => targets.push(target.clone()),
            Some(c) => {
                return Err(format!(
                    "MutexTarget {want_ns}/{} is not valid: {}",
                    t.name, c.message
                ));
            }
            None => {
                return Err(format!(
                    "MutexTarget {want_ns}/{} is not validated yet",
                    t.name
                ));
            }
        }
    }
    let Some(pools) = s.pools else {
        return Err(no_pool_api());
    };
    let canary = &s.run.spec.canary.name;
    if !pools.contains_key(canary) {
        return Err(format!("canary MachineConfigPool {canary:?} not found"));
    }
    if rules.is_empty() || targets.is_empty() {
        return Err("a run needs at least one MutexRule and one MutexTarget".into());
    }
    Ok(Parts { rules, targets })
}

/// The run's next state, with its conditions and effects added to `run`.
fn step(run: &mut Run, ns: &str, prev: Option<&RunProgress>) -> Option<RunProgress> {
    let s = run.s;
    let now = s.now;
    let parts = match validate(s, ns) {
        Ok(p) => p,
        Err(e) => {
            run.cond("ConfigValidated", false, "FetchFailed", &e);
            return prev.cloned();
        }
    };
    run.cond(
        "ConfigValidated",
        true,
        "FetchSucceeded",
        "All MutexRules, MutexTargets and the canary MachineConfigPool were found.",
    );
    let Some(cv) = s.cluster_version else {
        let msg = format!("no {VERSION_KIND} named {CLUSTER_VERSION_NAME} ({VERSION_GROUP}/v1)");
        run.cond("UpgradeChecked", false, "CheckFailed", &msg);
        return prev.cloned();
    };
    let Some(desired) = cv.desired.clone() else {
        let msg =
            format!("{VERSION_KIND} {CLUSTER_VERSION_NAME} has no spec.desiredUpdate.version");
        run.cond("UpgradeChecked", false, "CheckFailed", &msg);
        return prev.cloned();
    };
    let workers: Vec<&Arc<Node>> = s
        .nodes
        .iter()
        .filter(|n| n.labels().contains_key(WORKER_LABEL))
        .collect();
    let reported = |n: &Node| -> String {
        n.labels()
            .get(VERSION_LABEL)
            .cloned()
            .unwrap_or_else(|| "0.0.0".into())
    };
    let behind: Vec<String> = workers
        .iter()
        .filter(|n| version_lt(&reported(n), &desired))
        .map(|n| n.name_any())
        .collect();
    let skew = !behind.is_empty();
    run.cond(
        "UpgradeChecked",
        true,
        "CheckSucceeded",
        &format!(
            "{} of {} workers are behind version {desired}",
            behind.len(),
            workers.len()
        ),
    );
    let completed = cv.history_state.as_deref() == Some("Completed");
    if skew && completed {
        run.cond(
            "UpgradeReady",
            true,
            "UpgradeReady",
            "An upgrade is available",
        );
    } else if skew {
        let msg = format!(
            "an upgrade to {desired} is available; waiting for the cluster version's update to complete (history state {})",
            cv.history_state.as_deref().unwrap_or("unknown")
        );
        run.cond("UpgradeReady", false, "UpgradeNotReady", &msg);
    } else {
        run.cond(
            "UpgradeReady",
            false,
            "UpgradeNotReady",
            "No worker is behind the desired version.",
        );
    }

    let generation = s.run.metadata.generation.unwrap_or_default();
    let pools = s.pools.cloned().unwrap_or_default();
    let target_pools: Vec<String> = parts
        .targets
        .iter()
        .flat_map(|t| t.spec.machine_config_pools.clone())
        .collect();
    let canary = s.run.spec.canary.name.clone();
    let labels: Vec<String> = parts
        .rules
        .iter()
        .map(|r| rule_label(&r.name_any(), &r.namespace().unwrap_or_default()))
        .collect();

    // Which run: the one in progress for this version, or a new one.
    let current = prev.filter(|p| p.version == desired).cloned();
    let mut p = match current {
        Some(p) if p.step == FAILED && p.generation != generation => {
            // The spec changed since it failed: retry from the failed node.
            RunProgress {
                step: JOBS.into(),
                generation,
                rule: 0,
                job: None,
                since: now.to_string(),
                message: None,
                ..p
            }
        }
        Some(p) => p,
        None if !skew => {
            if prev.is_none_or(|p| p.step == DONE) {
                run.cond(
                    "UpgradeAvailable",
                    false,
                    "UpgradeUnavailable",
                    "An upgrade is not available.",
                );
            }
            return prev.cloned();
        }
        None => {
            // A new run: freeze the node order, remember the selectors.
            let mut nodes = Vec::new();
            for t in &parts.targets {
                for n in t
                    .status
                    .as_ref()
                    .map(|s| s.nodes.clone())
                    .unwrap_or_default()
                {
                    if !nodes.contains(&n) {
                        nodes.push(n);
                    }
                }
            }
            let mut saved = prev.map(|p| p.saved_selectors.clone()).unwrap_or_default();
            if prev.is_none_or(|p| p.step == DONE) {
                saved.clear();
                for name in target_pools.iter().chain([&canary]) {
                    let exprs = expressions(pools.get(name));
                    saved.insert(name.clone(), exprs);
                }
            }
            run.event(
                false,
                "RunStarted",
                format!("upgrade to {desired}: {} node(s) take turns", nodes.len()),
            );
            RunProgress {
                version: desired.clone(),
                generation,
                nodes,
                current: 0,
                step: PREPARING.into(),
                rule: 0,
                job: None,
                since: now.to_string(),
                message: None,
                saved_selectors: saved,
            }
        }
    };
    if p.step == DONE {
        run.cond(
            "UpgradeAvailable",
            false,
            "UpgradeUnavailable",
            "An upgrade is not available.",
        );
        return Some(p);
    }
    if p.step == FAILED {
        return Some(p);
    }
    run.cond(
        "UpgradeAvailable",
        true,
        "UpgradeAvailable",
        &format!("An upgrade to {desired} is available."),
    );

    if p.step == FINISHING {
        return Some(finish(run, p, &target_pools, &canary, &pools));
    }

    // Preparation, level-triggered: pools paused, nodes not yet released
    // labelled, selectors moved. Each effect only where the world differs.
    let mut prepared = true;
    for name in &target_pools {
        if !pools.get(name).is_some_and(|v| v.paused) {
            prepared = false;
            run.effects
                .push(pool_patch(s, name, json!({"spec": {"paused": true}})));
        }
    }
    run.cond(
        "TargetPoolsPaused",
        prepared,
        if prepared { "Paused" } else { "NotPaused" },
        if prepared {
            "Target MachineConfigPools are paused."
        } else {
            "Pausing the target MachineConfigPools."
        },
    );
    let mut labelled = true;
    for (i, n) in p.nodes.iter().enumerate() {
        let i = i as i32;
        let released = i < p.current || (i == p.current && p.step != PREPARING && p.step != JOBS);
        let Some(node) = s.nodes.iter().find(|x| &x.name_any() == n) else {
            continue;
        };
        let missing: Vec<&String> = labels
            .iter()
            .filter(|l| !node.labels().contains_key(*l))
            .collect();
        if !released && !missing.is_empty() {
            labelled = false;
            let add: serde_json::Map<String, serde_json::Value> =
                missing.iter().map(|l| (l.to_string(), json!(""))).collect();
            run.effects.push(Effect::PatchNode {
                node: n.clone(),
                resource_version: None,
                patch: json!({"metadata": {"labels": add}}),
            });
        }
    }
    run.cond(
        "MutexRulesApplied",
        labelled,
        if labelled {
            "ApplySucceeded"
        } else {
            "ApplyFailed"
        },
        if labelled {
            "Every target node carries its MutexRule labels."
        } else {
            "Labelling target nodes."
        },
    );
    let want = |op: &str| -> Vec<LabelSelectorRequirement> {
        labels
            .iter()
            .map(|l| LabelSelectorRequirement {
                key: l.clone(),
                operator: op.into(),
                values: None,
            })
            .collect()
    };
    let mut moved = true;
    for (name, op) in target_pools
        .iter()
        .map(|t| (t, "Exists"))
        .chain([(&canary, "DoesNotExist")])
    {
        let w = want(op);
        if expressions(pools.get(name)) != w {
            moved = false;
            run.effects.push(pool_patch(
                s,
                name,
                json!({"spec": {"nodeSelector": {"matchExpressions": w}}}),
            ));
        }
    }
    run.cond(
        "MCPUpdated",
        moved,
        if moved {
            "UpdateSucceeded"
        } else {
            "UpdateFailed"
        },
        if moved {
            "Target pools select the waiting nodes; the canary pool the released ones."
        } else {
            "Moving the pools' selectors."
        },
    );
    if p.step == PREPARING {
        if prepared && labelled && moved {
            p.step = JOBS.into();
            p.since = now.to_string();
        } else {
            return Some(p);
        }
    }
    if !(skew && completed) && p.step == JOBS && p.rule == 0 && p.job.is_none() {
        // Prepared; node work waits until the upgrade is ready.
        p.message = Some("waiting for UpgradeReady".into());
        return Some(p);
    }
    Some(advance(
        run,
        p,
        &parts,
        &labels,
        &target_pools,
        &canary,
        &pools,
    ))
}
