//! The hook steps of a held node: its before and after hook Jobs run one
//! by one, each recorded in the plan's status before it is created; a
//! failed, late or deleted hook Job fails the node.

use super::*;

impl Decision<'_> {
    /// Start hook `index` of `stage`, or, past the last, the next stage.
    pub(super) fn hooks_from(&mut self, e: &NodeUpgrade, stage: Stage, index: usize) {
        let p = self.s.plan;
        let Some(hook) = stage.hooks(p).get(index) else {
            match stage {
                Stage::Before => self.drain(e),
                Stage::After => self.finish(e),
            }
            return;
        };
        let a = attempt(e);
        let Some(job) = hooks::job_for(p, stage, index, &a) else {
            // Only a spec edited since the check gets here.
            let msg = format!(
                "{} hook {}: the Job could not be built",
                stage.as_str(),
                hook.name
            );
            return self.fail(e, FAILED_HOOK, msg);
        };
        let key = crate::decide::jobs::key(&job);
        let phase = match stage {
            Stage::Before => UpgradePhase::PreHooks,
            Stage::After => UpgradePhase::PostHooks,
        };
        let message = format!("{} hook {}: running Job {key}", stage.as_str(), hook.name);
        self.step(
            e,
            Next {
                phase,
                hook: Some(hook.name.clone()),
                job: Some(key),
                reason: None,
                message,
            },
        );
        self.effects.push(Effect::CreateJob { job: Box::new(job) });
    }

    /// A hook's Job: wait for it, move on when it completes, fail (or
    /// ignore) when it fails or outlives its deadline.
    pub(super) fn hook(&mut self, e: &NodeUpgrade, stage: Stage) {
        let p = self.s.plan;
        let list = stage.hooks(p);
        let Some(index) = list.iter().position(|h| Some(&h.name) == e.hook.as_ref()) else {
            // The hook left the spec while it ran: go on with the next
            // stage rather than guess.
            let next = match stage {
                Stage::Before => list.len(),
                Stage::After => list.len(),
            };
            return self.hooks_from(e, stage, next);
        };
        let hook = &list[index];
        let key = e.job.clone().unwrap_or_default();
        let label = format!("{} hook {} (Job {key})", stage.as_str(), hook.name);
        let seen = NodeUpgrade {
            job_seen: true,
            ..e.clone()
        };
        let result = match self.s.jobs.get(&key) {
            Some(state) => state.clone(),
            None if e.job_seen => return self.job_deleted(e, &label),
            None => {
                if let Some(err) = self.s.job_errors.get(&key) {
                    JobState::Failed(format!("could not be created: {err}"))
                } else {
                    let ttl = i64::from(hook.ttl_seconds_after_finished);
                    if self.s.now < after(e.since.0, ttl) {
                        // Recorded, not seen yet: created (again) under its
                        // name; a second create is a 409, never a second run.
                        if let Some(job) = hooks::job_for(p, stage, index, &attempt(e)) {
                            self.effects.push(Effect::CreateJob { job: Box::new(job) });
                        }
                        self.entries.insert(e.name.clone(), e.clone());
                        return;
                    }
                    JobState::Failed("the Job disappeared before its result was seen".into())
                }
            }
        };
        match result {
            JobState::Complete => self.hooks_from(e, stage, index + 1),
            JobState::Running => {
                let due = after(e.since.0, hook.deadline_seconds + HOOK_GRACE_SECS);
                if self.s.now >= due {
                    let why = format!("still running {} s past its deadline", HOOK_GRACE_SECS);
                    self.hook_failed(e, stage, index, &label, &why);
                } else {
                    self.wake_at(due);
                    self.entries.insert(e.name.clone(), seen);
                }
            }
            JobState::Failed(why) => self.hook_failed(e, stage, index, &label, &why),
        }
    }

    /// A Job of ours that was seen is gone before its result was: a
    /// person deleted it to stop it. Never created again: the node fails
    /// with `JobDeleted` and is held where it is (as after any failure: in
    /// maintenance once drained) until a person gives it back or changes
    /// the spec.
    pub(super) fn job_deleted(&mut self, e: &NodeUpgrade, label: &str) {
        let kept = match e.phase {
            UpgradePhase::PreHooks => "the node was not touched",
            _ => {
                "the node stays in maintenance (delete its NodeMaintenance to give it back, or change the spec to retry)"
            }
        };
        let msg = format!("{label} was deleted before it finished; not created again; {kept}");
        self.fail(e, FAILED_JOB_DELETED, msg);
    }

    pub(super) fn hook_failed(
        &mut self,
        e: &NodeUpgrade,
        stage: Stage,
        index: usize,
        label: &str,
        why: &str,
    ) {
        let hook = &stage.hooks(self.s.plan)[index];
        if hook.on_failure == "Ignore" {
            let what = format!("{label} failed: {why} (onFailure: Ignore; going on)");
            self.event(&e.name, true, "UpgradeHookFailed", &what);
            return self.hooks_from(e, stage, index + 1);
        }
        let kept = match stage {
            Stage::Before => "the node was not touched",
            Stage::After => "the node stays in maintenance",
        };
        self.fail(e, FAILED_HOOK, format!("{label} failed: {why}; {kept}"));
    }
}
