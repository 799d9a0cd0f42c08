//! One MutexRunConfig's decision: validate what it names, check for an
//! upgrade, start (or resume, or retry) a run, and prepare it — target
//! pools paused, waiting nodes labelled per rule, selectors moved — level
//! by level, each effect only where the world differs.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::node::Node;
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

/// The run's next state, with its conditions and effects added to `run`:
/// the configuration validated, the upgrade checked, which run (this
/// version's, or a new one), the preparation (pools paused, nodes
/// labelled, selectors moved), then the nodes' turns.
fn step(run: &mut Run, ns: &str, prev: Option<&RunProgress>) -> Option<RunProgress> {
    let s = run.s;
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
    let Some(upgrade) = check_upgrade(run) else {
        return prev.cloned();
    };
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
    let Some(mut p) = progress(run, prev, &parts, &upgrade, &target_pools, &canary, &pools) else {
        return prev.cloned();
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
        &format!("An upgrade to {} is available.", upgrade.desired),
    );
    if p.step == FINISHING {
        return Some(finish(run, p, &target_pools, &canary, &pools));
    }
    let prepared = prepare(run, &p, &labels, &target_pools, &canary, &pools);
    if p.step == PREPARING {
        if !prepared {
            return Some(p);
        }
        p.step = JOBS.into();
        p.since = s.now.to_string();
    }
    if !upgrade.ready() && p.step == JOBS && p.rule == 0 && p.job.is_none() {
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

/// What the cluster version says of an upgrade.
struct Upgrade {
    desired: String,
    /// A worker is behind the desired version.
    skew: bool,
    /// The cluster version's own update completed.
    completed: bool,
}

impl Upgrade {
    fn ready(&self) -> bool {
        self.skew && self.completed
    }
}

/// The desired version against the workers' (`UpgradeChecked`) and
/// whether an upgrade is ready (`UpgradeReady`); `None` when the cluster
/// version cannot say.
fn check_upgrade(run: &mut Run) -> Option<Upgrade> {
    let s = run.s;
    let Some(cv) = s.cluster_version else {
        let msg = format!("no {VERSION_KIND} named {CLUSTER_VERSION_NAME} ({VERSION_GROUP}/v1)");
        run.cond("UpgradeChecked", false, "CheckFailed", &msg);
        return None;
    };
    let Some(desired) = cv.desired.clone() else {
        let msg =
            format!("{VERSION_KIND} {CLUSTER_VERSION_NAME} has no spec.desiredUpdate.version");
        run.cond("UpgradeChecked", false, "CheckFailed", &msg);
        return None;
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
    let behind = workers
        .iter()
        .filter(|n| version_lt(&reported(n), &desired))
        .count();
    let msg = format!(
        "{behind} of {} workers are behind version {desired}",
        workers.len()
    );
    run.cond("UpgradeChecked", true, "CheckSucceeded", &msg);
    let upgrade = Upgrade {
        skew: behind > 0,
        completed: cv.history_state.as_deref() == Some("Completed"),
        desired,
    };
    if upgrade.ready() {
        run.cond(
            "UpgradeReady",
            true,
            "UpgradeReady",
            "An upgrade is available",
        );
    } else if upgrade.skew {
        let msg = format!(
            "an upgrade to {} is available; waiting for the cluster version's update to complete (history state {})",
            upgrade.desired,
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
    Some(upgrade)
}

/// Which run: the one in progress for this version (a failed one retried
/// from its failed node once the spec changed), or a new one when a
/// worker is behind — its node order frozen and the pools' selectors
/// remembered. `None`: no run, and none is needed.
fn progress(
    run: &mut Run,
    prev: Option<&RunProgress>,
    parts: &Parts,
    upgrade: &Upgrade,
    target_pools: &[String],
    canary: &String,
    pools: &BTreeMap<String, PoolView>,
) -> Option<RunProgress> {
    let s = run.s;
    let (now, desired) = (s.now, &upgrade.desired);
    let generation = s.run.metadata.generation.unwrap_or_default();
    match prev.filter(|p| &p.version == desired).cloned() {
        Some(p) if p.step == FAILED && p.generation != generation => Some(RunProgress {
            step: JOBS.into(),
            generation,
            rule: 0,
            job: None,
            since: now.to_string(),
            message: None,
            ..p
        }),
        Some(p) => Some(p),
        None if !upgrade.skew => {
            if prev.is_none_or(|p| p.step == DONE) {
                run.cond(
                    "UpgradeAvailable",
                    false,
                    "UpgradeUnavailable",
                    "An upgrade is not available.",
                );
            }
            None
        }
        None => {
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
                for name in target_pools.iter().chain([canary]) {
                    saved.insert(name.clone(), expressions(pools.get(name)));
                }
            }
            run.event(
                false,
                "RunStarted",
                format!("upgrade to {desired}: {} node(s) take turns", nodes.len()),
            );
            Some(RunProgress {
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
            })
        }
    }
}

/// The preparation, level-triggered: target pools paused, nodes not yet
/// released labelled per rule, the pools' selectors moved (targets select
/// the waiting nodes, the canary the released ones). Each effect only
/// where the world differs; `true` once all three hold.
fn prepare(
    run: &mut Run,
    p: &RunProgress,
    labels: &[String],
    target_pools: &[String],
    canary: &String,
    pools: &BTreeMap<String, PoolView>,
) -> bool {
    let s = run.s;
    let mut prepared = true;
    for name in target_pools {
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
        .chain([(canary, "DoesNotExist")])
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
    prepared && labelled && moved
}
