//! The node-upgrade mutex operator's behaviour, pure: validate MutexRules,
//! gather MutexTargets' nodes, and move a MutexRunConfig's run along —
//! pause the target pools, label their nodes per rule, move the canary
//! pool's selector, then node by node: run each rule's Job (off the node),
//! release the node into the canary pool, wait for its version label, run
//! cleanup Jobs; at the end unpause and restore the selectors.
//!
//! Unlike the Ansible original, the run's progress is in the run config's
//! status (written before each step acts): a restart resumes where it was,
//! a Job is never started twice for a node and rule, and everything is
//! driven by watches (no 10-minute polling, no 60-second version poll).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::json;

use super::disrupt::fnv;
use super::jobs::{self, JobState, MANAGED_BY, MANAGED_BY_LABEL};
use super::{Effect, Plan, Then};
use crate::api::mutex::*;
use crate::api::upgrade::ENV_NODE;

/// Which of the three kinds a status write is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Rule,
    Target,
    RunConfig,
}

/// Set a condition; its transition time changes only with its status (the
/// original rewrites it on every reconcile).
pub fn set(
    conds: &mut Vec<MutexCondition>,
    now: Timestamp,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) {
    let status = if status { "True" } else { "False" };
    if let Some(c) = conds.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = now.to_string();
        }
        c.status = status.into();
        c.reason = reason.into();
        c.message = message.into();
    } else {
        conds.push(MutexCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: now.to_string(),
        });
    }
}

fn condition<'a>(conds: &'a [MutexCondition], type_: &str) -> Option<&'a MutexCondition> {
    conds.iter().find(|c| c.type_ == type_)
}

fn write(kind: Kind, meta: &ObjectMeta, status: serde_json::Value) -> Effect {
    Effect::WriteMutexStatus {
        kind,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone(),
        status,
    }
}

/// A MutexRule: is its Job spec a Job spec? (Never deletes anything: the
/// original's validation deleted any Job named like the rule.)
pub fn rule(r: &MutexRule, now: Timestamp) -> Option<Effect> {
    let old = r.status.clone().unwrap_or_default();
    let mut conds = old.conditions.clone();
    let problem = if r.spec.job_name.is_empty() {
        Some("spec.jobName is empty".to_string())
    } else if r.spec.job_namespace.is_empty() {
        Some("spec.jobNamespace is empty".to_string())
    } else {
        let check = |what: &str, v: &serde_json::Value| {
            jobs::check(v)
                .err()
                .map(|e| format!("{what} is not a batch/v1 JobSpec: {e}"))
        };
        check("spec.jobSpec", &r.spec.job_spec).or_else(|| {
            r.spec
                .cleanup_job_spec
                .as_ref()
                .and_then(|c| check("spec.cleanupJobSpec", c))
        })
    };
    match &problem {
        None => set(
            &mut conds,
            now,
            "ValidConfig",
            true,
            "ValidConfig",
            "The Host/Token/Job combination is valid.",
        ),
        Some(p) => set(
            &mut conds,
            now,
            "ValidConfig",
            false,
            "InvalidConfig",
            &format!("The Host/Token/Job combination is not valid: {p}"),
        ),
    }
    let status = MutexRuleStatus { conditions: conds };
    (status != old).then(|| write(Kind::Rule, &r.metadata, json!(status)))
}

/// A MutexTarget: the nodes of its pools, by each pool's
/// `nodeSelector.matchLabels` (as the original; matchExpressions are what
/// a run rewrites, so they must not move nodes in or out of a target).
/// `pools`: `None` when no MachineConfigPool API is served.
pub fn target(
    t: &MutexTarget,
    pools: Option<&BTreeMap<String, PoolView>>,
    nodes: &[Arc<Node>],
    now: Timestamp,
) -> Option<Effect> {
    let old = t.status.clone().unwrap_or_default();
    let mut conds = old.conditions.clone();
    let mut found = Vec::new();
    let problem = match pools {
        None => Some(no_pool_api()),
        Some(pools) => t
            .spec
            .machine_config_pools
            .iter()
            .find(|p| !pools.contains_key(*p))
            .map(|p| format!("MachineConfigPool {p} not found")),
    };
    if let (None, Some(pools)) = (&problem, pools) {
        for name in &t.spec.machine_config_pools {
            let labels = pools
                .get(name)
                .and_then(|p| p.node_selector.as_ref())
                .and_then(|s| s.match_labels.clone())
                .unwrap_or_default();
            for n in nodes {
                if labels.iter().all(|(k, v)| n.labels().get(k) == Some(v)) {
                    found.push(n.name_any());
                }
            }
        }
    }
    found.sort();
    found.dedup();
    match &problem {
        None => {
            set(
                &mut conds,
                now,
                "ValidConfig",
                true,
                "MachineConfigPoolFetchSucceeded",
                "All MachineConfigPools were found.",
            );
            set(
                &mut conds,
                now,
                "NodeListGathered",
                true,
                "MachineConfigPoolFetchSucceeded",
                "All nodes were successfully fetched.",
            );
        }
        Some(p) => {
            set(
                &mut conds,
                now,
                "ValidConfig",
                false,
                "MachineConfigPoolFetchFailed",
                p,
            );
            // The original wrote "True" here.
            set(
                &mut conds,
                now,
                "NodeListGathered",
                false,
                "MachineConfigPoolFetchFailed",
                p,
            );
        }
    }
    let status = MutexTargetStatus {
        nodes: found,
        conditions: conds,
    };
    (status != old).then(|| write(Kind::Target, &t.metadata, json!(status)))
}

fn no_pool_api() -> String {
    format!(
        "no MachineConfigPool API ({POOL_GROUP}/v1) on this cluster: the mutex flow needs OpenShift's machine-config operator; nothing was touched"
    )
}

/// `a < b` for release versions (`4.16.3`, `4.17.0-rc.1`): numeric
/// major.minor.patch, then a pre-release sorts before its release.
pub fn version_lt(a: &str, b: &str) -> bool {
    fn parse(v: &str) -> (Vec<u64>, Option<&str>) {
        let v = v.trim().trim_start_matches('v');
        let (core, pre) = match v.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (v, None),
        };
        let core = core.split('+').next().unwrap_or_default();
        let mut nums: Vec<u64> = core.split('.').map(|p| p.parse().unwrap_or(0)).collect();
        nums.resize(3, 0);
        (nums, pre)
    }
    let (an, ap) = parse(a);
    let (bn, bp) = parse(b);
    match an.cmp(&bn) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => match (ap, bp) {
            (Some(_), None) => true,
            (Some(x), Some(y)) => x < y,
            _ => false,
        },
    }
}

/// What a run decision reads.
pub struct RunSnapshot<'a> {
    pub run: &'a MutexRunConfig,
    pub rules: &'a [Arc<MutexRule>],
    pub targets: &'a [Arc<MutexTarget>],
    /// `None`: no MachineConfigPool API.
    pub pools: Option<&'a BTreeMap<String, PoolView>>,
    /// The pools' resourceVersions (patches are guarded by them).
    pub pool_versions: &'a BTreeMap<String, String>,
    /// `None`: no ClusterVersion named `version` (or no such API).
    pub cluster_version: Option<&'a ClusterVersionView>,
    pub nodes: &'a [Arc<Node>],
    /// Jobs by `namespace/name`.
    /// Jobs' states by `namespace/name`.
    pub jobs: &'a HashMap<String, JobState>,
    pub job_errors: &'a HashMap<String, String>,
    pub now: Timestamp,
}

/// The steps of a run, as `status.progress.step` spells them.
const PREPARING: &str = "Preparing";
const JOBS: &str = "Jobs";
const UPGRADING: &str = "Upgrading";
const CLEANUP: &str = "Cleanup";
const FINISHING: &str = "Finishing";
const DONE: &str = "Done";
const FAILED: &str = "Failed";

/// Seconds a released node may take to report the version by default: the
/// original's 100 polls, 60 s apart.
pub const DEFAULT_UPGRADE_TIMEOUT: i64 = 6000;

struct Run<'a> {
    s: &'a RunSnapshot<'a>,
    conds: Vec<MutexCondition>,
    effects: Vec<Effect>,
    wake: Option<std::time::Duration>,
}

impl Run<'_> {
    fn cond(&mut self, t: &str, ok: bool, reason: &str, msg: &str) {
        set(&mut self.conds, self.s.now, t, ok, reason, msg);
    }

    fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        let r = self.s.run;
        self.effects.push(Effect::Event {
            object: k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(format!("{GROUP}/v1alpha1")),
                kind: Some("MutexRunConfig".into()),
                name: r.metadata.name.clone(),
                namespace: r.metadata.namespace.clone(),
                uid: r.metadata.uid.clone(),
                ..Default::default()
            },
            warning,
            reason,
            note,
        });
    }
}

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
        then: Then::Wait(run.wake),
        note: None,
    }
}

/// The rules and targets a run config names, found and valid.
struct Parts {
    rules: Vec<Arc<MutexRule>>,
    targets: Vec<Arc<MutexTarget>>,
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

/// The node in progress: its Jobs, its release, its version, its cleanup.
fn advance(
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
        let total = p.nodes.len();
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
        match p.step.as_str() {
            JOBS | CLEANUP => {
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
                        let msg = format!(
                            "Jobs for {n} have run successfully.\nNode is {} of {total}",
                            p.current + 1
                        );
                        run.cond("JobRun", true, "JobRunSucceeded", &msg);
                        // Release: the node leaves the paused target pool
                        // for the canary pool, whose MCO upgrades it.
                        let remove: serde_json::Map<String, serde_json::Value> = labels
                            .iter()
                            .map(|l| (l.clone(), serde_json::Value::Null))
                            .collect();
                        run.effects.push(Effect::PatchNode {
                            node: n.clone(),
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
                        p.since = now.to_string();
                    }
                    continue;
                };
                let Some(job) = job_for(s.run, &rule, &n, &p, cleanup) else {
                    let msg = format!("MutexRule {}: its Job spec cannot be used", rule.name_any());
                    return fail(run, p, "JobRun", "JobRunFailed", msg);
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
                    return p;
                }
                let state = match s.jobs.get(&key) {
                    Some(j) => j.clone(),
                    None => match s.job_errors.get(&key) {
                        Some(e) => JobState::Failed(format!("could not be created: {e}")),
                        None => {
                            run.effects.push(Effect::CreateJob { job: Box::new(job) });
                            return p;
                        }
                    },
                };
                match state {
                    JobState::Running => return p,
                    JobState::Complete => {
                        p.rule += 1;
                        p.job = None;
                    }
                    JobState::Failed(why) => {
                        let msg = format!("{what} {key} for node {n} failed: {why}");
                        return fail(run, p, "JobRun", "JobRunFailed", msg);
                    }
                }
            }
            UPGRADING => {
                let v = node
                    .labels()
                    .get(VERSION_LABEL)
                    .cloned()
                    .unwrap_or_default();
                if !v.is_empty() && !version_lt(&v, &p.version) {
                    let msg = format!("Node {n} reports version {v}.");
                    run.cond("NodeUpgrade", true, "NodeUpgradeSucceeded", &msg);
                    run.event(false, "NodeUpgraded", msg);
                    p.step = CLEANUP.into();
                    p.rule = 0;
                    p.job = None;
                    p.since = now.to_string();
                    continue;
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
                        if v.is_empty() { "none" } else { &v }
                    );
                    return fail(run, p, "NodeUpgrade", "NodeUpgradeFailed", msg);
                }
                run.wake = Some(super::duration_until(now, due));
                p.message = Some(format!(
                    "node {n} released; waiting for version {}",
                    p.version
                ));
                return p;
            }
            _ => return p,
        }
    }
    p
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
fn finish(
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

fn expressions(view: Option<&PoolView>) -> Vec<LabelSelectorRequirement> {
    view.and_then(|v| v.node_selector.as_ref())
        .and_then(|s| s.match_expressions.clone())
        .unwrap_or_default()
}

fn pool_patch(s: &RunSnapshot, name: &str, patch: serde_json::Value) -> Effect {
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

#[cfg(test)]
mod tests;
