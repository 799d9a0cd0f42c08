//! The random worlds' Jobs: UpgradePlans with `strategy.type: Job` (the
//! cluster role runs the upgrade as a Job on the drained node) and with
//! before and after hook Jobs. The Job store is the API server's and the
//! Job controller's: a created Job reaches the cluster role's store a step
//! later (so a decision re-creates it under its name: a 409, done), runs
//! for a few steps and then completes (an upgrade Job's node then reports
//! the version, as an upgrade image replacing the binaries would) or fails;
//! the Jobs of a deleted plan are collected with it. Creates fail as any
//! write does (`faults.rs`).
//!
//! Invariants, checked when the API server takes a create: an upgrade Job
//! only for a node its plan holds in a NodeMaintenance that has drained
//! it; never a second upgrade Job of a node and version while one runs or
//! after one completed; a before hook only while its plan holds no
//! NodeMaintenance on the node (it runs before the node is touched); an
//! after hook only once the node reports the version it is for.

use std::collections::HashMap;

use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::super::world_tools::Rng;
use super::upgrades::VERSION;
use super::*;
use crate::api::upgrade::{ENV_VERSION, NODE_LABEL, PLAN_LABEL, STAGE_LABEL};
use crate::decide::jobs::{self, JobState};

/// One Job as the API server holds it.
#[derive(Debug, Clone)]
pub(super) struct WorldJob {
    plan: String,
    node: String,
    stage: String,
    /// The version an upgrade Job installs (from its image's tag).
    version: String,
    state: JobState,
    /// In the cluster role's store yet (a create reaches it a step later).
    seen: bool,
}

impl World {
    /// A person deletes a running Job of ours to stop it (the README:
    /// "what a person deletes stays deleted"). It is never created again.
    /// The person acts on a Job the plan's status has recorded as seen
    /// (also in the copy a stale read gives): between the Job's first
    /// sighting and that record — one pass, milliseconds in a cluster,
    /// where the service's mutation cache also covers its own status
    /// write — a deleted Job could be created once more.
    pub(super) fn delete_a_job(&mut self) {
        fn recorded<'a>(mut plans: impl Iterator<Item = &'a UpgradePlan>, key: &str) -> bool {
            plans.any(|p| {
                p.status
                    .iter()
                    .flat_map(|s| s.nodes.iter())
                    .any(|e| e.job_seen && e.job.as_deref() == Some(key))
            })
        }
        let running: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.seen && j.state == JobState::Running)
            .map(|(k, _)| k.clone())
            .filter(|k| recorded(self.plans.iter(), k) && recorded(self.stale_plans.values(), k))
            .collect();
        if running.is_empty() {
            return;
        }
        let key = running[self.rng.below(running.len() as u64) as usize].clone();
        if let Some(j) = self.jobs.remove(&key) {
            self.trace.push(format!("a person deletes Job {key}"));
            self.deleted_jobs.insert(key.clone(), (j.plan, j.node));
            self.jobs_deleted += 1;
        }
    }

    /// A deleted Job's admission has ended (the node failed with
    /// `JobDeleted`, or the plan went): a later admission of the node (a
    /// retry after a spec change, a channel's version named again) may
    /// use the name again.
    pub(super) fn forget_ended_admissions(&mut self) {
        let plans = &self.plans;
        self.deleted_jobs.retain(|_, (plan, node)| {
            plans
                .iter()
                .find(|p| p.name_any() == *plan)
                .and_then(|p| p.entry(node))
                .is_some_and(|e| e.phase.admitted())
        });
    }
}

/// The upgrade Job's image (`{version}` filled by the plan).
const IMAGE: &str = "registry.invalid/upgrade:{version}";

/// A plan's strategy and hooks: the command (as before) or a Job, and now
/// and then a before and an after hook.
pub(super) fn strategy_and_hooks(rng: &mut Rng) -> (Value, Value) {
    let strategy = if rng.chance(40) {
        json!({"type": "Job", "command": [], "job": {
            "namespace": "ops", "image": IMAGE, "args": ["upgrade", "{node}"],
        }})
    } else {
        json!({"command": ["/sbin/upgrade", "{version}"]})
    };
    let hook = |name: &str| {
        json!([{"name": name, "namespace": "ops", "job": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "h", "image": "registry.invalid/hook:1"}],
        }}}}])
    };
    let mut hooks = json!({});
    if rng.chance(30) {
        hooks["before"] = hook("snapshot");
    }
    if rng.chance(30) {
        hooks["after"] = hook("smoke");
    }
    (strategy, hooks)
}

impl World {
    /// The Jobs in the cluster role's store, as the decision reads them.
    pub(super) fn jobs_seen(&self) -> HashMap<String, JobState> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.seen)
            .map(|(k, j)| (k.clone(), j.state.clone()))
            .collect()
    }

    /// The API server's side of a Job create (a 409 for a name it has is
    /// the executor's "done").
    pub(super) fn create_job(&mut self, who: &str, job: &DynamicObject) -> Result<(), String> {
        let key = jobs::key(job);
        assert!(
            !self.deleted_jobs.contains_key(&key),
            "{who}: Job {key}, which a person deleted, created again in the same admission"
        );
        if self.jobs.contains_key(&key) {
            self.trace.push(format!("{who}: Job {key} exists (409)"));
            return Ok(());
        }
        let label = |k: &str| job.labels().get(k).cloned().unwrap_or_default();
        let (plan, node, stage) = (label(PLAN_LABEL), label(NODE_LABEL), label(STAGE_LABEL));
        let image = job.data["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default();
        // An upgrade Job's version is its image's tag; a hook Job's, its
        // environment's.
        let env = job.data["spec"]["template"]["spec"]["containers"][0]["env"].as_array();
        let version = match stage.as_str() {
            "upgrade" => image.rsplit(':').next().unwrap_or_default().to_string(),
            _ => env
                .and_then(|env| env.iter().find(|v| v["name"] == ENV_VERSION))
                .and_then(|v| v["value"].as_str())
                .unwrap_or_default()
                .to_string(),
        };
        let ours = self.nms.iter().find(|m| {
            m.spec.node_name == node
                && m.owner_references()
                    .iter()
                    .any(|o| o.kind == crate::api::upgrade::OWNER_KIND && o.name == plan)
        });
        let reports = self
            .nodes
            .iter()
            .find(|n| n.name_any() == node)
            .and_then(|n| n.labels().get(VERSION).cloned())
            .unwrap_or_default();
        match stage.as_str() {
            "upgrade" => {
                assert!(
                    ours.is_some_and(
                        |m| m.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded)
                    ),
                    "{who}: upgrade Job {key} for {node}, which {plan} has not drained"
                );
                let earlier: Vec<&WorldJob> = self
                    .jobs
                    .values()
                    .filter(|j| j.stage == "upgrade" && j.node == node && j.version == version)
                    .collect();
                assert!(
                    earlier
                        .iter()
                        .all(|j| matches!(j.state, JobState::Failed(_))),
                    "{who}: a second upgrade Job {key} of {node} to {version}: {earlier:?}"
                );
            }
            "before" => assert!(
                ours.is_none(),
                "{who}: before hook Job {key} while {plan} holds {node}"
            ),
            _ => assert!(
                reports == version,
                "{who}: after hook Job {key} while {node} reports {reports:?}, not {version:?}"
            ),
        }
        self.trace.push(format!(
            "{who}: Job {key} ({stage} {node} {version}) created"
        ));
        if stage != "upgrade" {
            self.hook_jobs += 1;
        }
        self.jobs.insert(
            key,
            WorldJob {
                plan,
                node,
                stage,
                version,
                state: JobState::Running,
                seen: false,
            },
        );
        Ok(())
    }

    /// The Job controller's step: created Jobs reach the store, running
    /// ones finish now and then; a deleted plan's Jobs are collected.
    pub(super) fn settle_jobs(&mut self) {
        let plans: Vec<String> = self.plans.iter().map(|p| p.name_any()).collect();
        self.jobs.retain(|_, j| plans.contains(&j.plan));
        let keys: Vec<String> = self.jobs.keys().cloned().collect();
        for key in keys {
            let roll = self.rng.below(100);
            let Some(j) = self.jobs.get_mut(&key) else {
                continue;
            };
            if !j.seen {
                j.seen = true;
                continue;
            }
            if j.state != JobState::Running {
                continue;
            }
            j.state = match roll {
                0..5 => JobState::Failed("BackoffLimitExceeded: the pod failed".into()),
                5..45 => JobState::Complete,
                _ => continue,
            };
            let (stage, node, version) = (j.stage.clone(), j.node.clone(), j.version.clone());
            self.trace.push(format!(
                "Job {key} ({stage} {node}): {:?}",
                self.jobs[&key].state
            ));
            if stage == "upgrade" && self.jobs[&key].state == JobState::Complete {
                *self
                    .job_upgrades
                    .entry((node.clone(), version.clone()))
                    .or_default() += 1;
                let rv = self.bump();
                if let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == node) {
                    n.metadata
                        .labels
                        .get_or_insert_default()
                        .insert(VERSION.into(), version);
                    n.metadata.resource_version = Some(rv);
                }
            }
        }
    }
}

/// Jobs created in a world, by stage (the worlds must exercise each).
pub(super) fn tally(w: &World, totals: &mut BTreeMap<&'static str, usize>) {
    *totals.entry("upgrade Jobs completed").or_default() += w.job_upgrades.values().sum::<usize>();
    *totals.entry("hook Jobs created").or_default() += w.hook_jobs;
    *totals.entry("Jobs deleted by a person").or_default() += w.jobs_deleted;
}
