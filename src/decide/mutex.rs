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
//! `run.rs` validates a run and prepares it; `turns.rs` moves the node in
//! progress through its Jobs, release, version and cleanup, and finishes.

mod run;
mod turns;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::api::node::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;

use super::Effect;
use super::jobs::{self, JobState};
use crate::api::mutex::*;
pub use run::run;

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

pub(super) fn condition<'a>(
    conds: &'a [MutexCondition],
    type_: &str,
) -> Option<&'a MutexCondition> {
    conds.iter().find(|c| c.type_ == type_)
}

pub(super) fn write(kind: Kind, meta: &ObjectMeta, status: serde_json::Value) -> Effect {
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
    } else if !crate::api::common::is_dns_label(&r.spec.job_name) {
        // Both reach a Job's URL: checked again for rules stored before
        // the schema refused such names.
        Some(format!("spec.jobName {:?} is not a name", r.spec.job_name))
    } else if !crate::api::common::is_dns_label(&r.spec.job_namespace) {
        Some(format!(
            "spec.jobNamespace {:?} is not a namespace name",
            r.spec.job_namespace
        ))
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

pub(super) fn no_pool_api() -> String {
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
pub(crate) const PREPARING: &str = "Preparing";
pub(crate) const JOBS: &str = "Jobs";
pub(crate) const UPGRADING: &str = "Upgrading";
pub(crate) const CLEANUP: &str = "Cleanup";
pub(crate) const FINISHING: &str = "Finishing";
pub(crate) const DONE: &str = "Done";
pub(crate) const FAILED: &str = "Failed";

/// Seconds a released node may take to report the version by default: the
/// original's 100 polls, 60 s apart.
pub const DEFAULT_UPGRADE_TIMEOUT: i64 = 6000;

pub(crate) struct Run<'a> {
    pub(crate) s: &'a RunSnapshot<'a>,
    pub(crate) conds: Vec<MutexCondition>,
    pub(crate) effects: Vec<Effect>,
    pub(crate) wake: Option<std::time::Duration>,
}

impl Run<'_> {
    pub(crate) fn cond(&mut self, t: &str, ok: bool, reason: &str, msg: &str) {
        set(&mut self.conds, self.s.now, t, ok, reason, msg);
    }

    pub(crate) fn event(&mut self, warning: bool, reason: &'static str, note: String) {
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

/// The rules and targets a run config names, found and valid.
pub(crate) struct Parts {
    pub(crate) rules: Vec<Arc<MutexRule>>,
    pub(crate) targets: Vec<Arc<MutexTarget>>,
}

#[cfg(test)]
mod tests;
