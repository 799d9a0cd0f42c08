//! Hook Jobs, pure: the Job an UpgradePlan's hook runs for one node (its
//! deterministic name, labels, owner, deadline, TTL; the environment and
//! the affinity that keeps it off the node come from [`crate::decide::jobs`]).

use kube::ResourceExt;
use kube::api::DynamicObject;

use crate::api::upgrade::*;
use crate::decide::disrupt::owner_ref;
pub use crate::decide::jobs::JobState;
use crate::decide::jobs::{self, MANAGED_BY, MANAGED_BY_LABEL};

/// Which list a hook is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Before,
    After,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Before => "before",
            Stage::After => "after",
        }
    }

    pub fn hooks(self, plan: &UpgradePlan) -> &[Hook] {
        match self {
            Stage::Before => &plan.spec.hooks.before,
            Stage::After => &plan.spec.hooks.after,
        }
    }
}

/// What one admission's Jobs are named after: the plan's UID, the node, the
/// version and the plan generation it was admitted in. A repeated create
/// of the same stage is a 409, never a second run; a retry (a new
/// generation) gets new names.
pub struct Attempt<'a> {
    pub node: &'a str,
    pub version: &'a str,
    pub attempt: i64,
}

/// `<plan>-<hook>` cut to 46 characters, then a hash of everything that
/// makes the run unique: at most 63 characters, the limit of the
/// `job-name` label the Job controller puts on its pods.
pub fn job_name(plan: &UpgradePlan, stage: Stage, index: usize, a: &Attempt) -> String {
    let hook = stage
        .hooks(plan)
        .get(index)
        .map(|h| h.name.as_str())
        .unwrap_or("hook");
    let key = format!(
        "{}|{}|{}|{index}|{}|{}",
        plan.metadata.uid.as_deref().unwrap_or_default(),
        a.node,
        stage.as_str(),
        a.version,
        a.attempt
    );
    jobs::name(&format!("{}-{hook}", plan.name_any()), &key)
}

/// The template of every hook, as the Job spec it must be (what the schema
/// leaves to the API server, checked early so a typo fails the spec, not a
/// node).
pub fn check(plan: &UpgradePlan) -> Vec<String> {
    [Stage::Before, Stage::After]
        .into_iter()
        .flat_map(|stage| {
            stage
                .hooks(plan)
                .iter()
                .enumerate()
                .filter_map(move |(i, h)| {
                    // The namespace becomes part of the Job's URL: checked
                    // again here for objects stored before the schema did.
                    if !crate::api::common::is_dns_label(&h.namespace) {
                        return Some(format!(
                            "hooks.{}[{i}] ({}): namespace {:?} is not a namespace name",
                            stage.as_str(),
                            h.name,
                            h.namespace
                        ));
                    }
                    jobs::check(&h.job).err().map(|e| {
                        format!(
                            "hooks.{}[{i}] ({}): job is not a batch/v1 JobSpec: {e}",
                            stage.as_str(),
                            h.name
                        )
                    })
                })
        })
        .collect()
}

/// The Job hook `index` of `stage` runs for one node.
pub fn job_for(
    plan: &UpgradePlan,
    stage: Stage,
    index: usize,
    a: &Attempt,
) -> Option<DynamicObject> {
    let hook = stage.hooks(plan).get(index)?;
    let plan_name = plan.name_any();
    let env = [
        (ENV_NODE, a.node),
        (ENV_PLAN, plan_name.as_str()),
        (ENV_VERSION, a.version),
    ];
    let labels = [
        (PLAN_LABEL, plan.name_any()),
        (NODE_LABEL, a.node.to_string()),
        (STAGE_LABEL, stage.as_str().to_string()),
        (HOOK_LABEL, hook.name.clone()),
        (MANAGED_BY_LABEL, MANAGED_BY.to_string()),
    ];
    jobs::build(
        &hook.job,
        jobs::JobFor {
            namespace: &hook.namespace,
            name: job_name(plan, stage, index, a),
            labels: labels.map(|(k, v)| (k.to_string(), v)).into(),
            owner: Some(owner_ref(plan, OWNER_KIND)),
            env: &env,
            node: a.node,
            deadline: Some(hook.deadline_seconds),
            ttl: Some(hook.ttl_seconds_after_finished),
        },
    )
}
