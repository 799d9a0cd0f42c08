//! The upgrading step of a held node: the command on the host (through
//! its agent), the upgrade Job or the Talos install, each with its
//! deadline; then verifying that the node reports the version.

use super::*;

/// Seconds a gone maintenance waits for the version to be seen
/// (`version_may_lag`): watches deliver in milliseconds; seconds on a
/// loaded API server.
const VERSION_LAG_SECONDS: i64 = 10;

impl Decision<'_> {
    /// The node is drained; its agent runs the command. Done when it
    /// reports the version (and, with a reboot, a new boot ID).
    pub(super) fn upgrading(
        &mut self,
        node: &Node,
        e: &NodeUpgrade,
        ours: Option<&NodeMaintenance>,
    ) {
        let p = self.s.plan;
        // A maintenance of its name is there again (a person's): the mark
        // of one gone before no longer holds.
        let unmarked;
        let e = if ours.is_some_and(|m| !m.is_deleting()) && e.maintenance_gone_at.is_some() {
            unmarked = NodeUpgrade {
                maintenance_gone_at: None,
                ..e.clone()
            };
            &unmarked
        } else {
            e
        };
        let v = version(e, p);
        let before = e.boot_id_before.as_deref().unwrap_or_default();
        let rebooted = boot_id(node).is_some_and(|b| b != before);
        let upgraded =
            at_version(node, &p.spec.version_from, v) && (rebooted || !p.spec.strategy.reboots());
        // Gone at the version: its agent gave the node back
        // (`node::agent_gives_back`), and verifying records it. Gone
        // before: someone ended the maintenance mid-upgrade.
        let agents = upgraded && node::agent_gives_back(p);
        if ours.is_none_or(|m| m.is_deleting()) && !agents {
            if node::agent_gives_back(p) && self.version_may_lag(e) {
                return;
            }
            let msg = format!(
                "its NodeMaintenance {} went away during the upgrade; the node may be half-upgraded",
                maintenance_name(&e.name)
            );
            return self.fail(e, FAILED_INTERRUPTED, msg);
        }
        let t = recorded_token(node, &self.name, v, before, e.attempt);
        let result = annotation(node, RESULT_ANNOTATION)
            .and_then(|r| r.strip_prefix(t.as_str()))
            .and_then(|r| r.strip_prefix(" failed: "));
        if upgraded {
            let message = format!("reports version {v}; waiting for Ready");
            self.step(
                e,
                Next {
                    phase: UpgradePhase::Verifying,
                    hook: None,
                    job: None,
                    reason: None,
                    message,
                },
            );
            let next = self
                .entries
                .get(&e.name)
                .cloned()
                .unwrap_or_else(|| e.clone());
            return self.verifying(node, &next, ours);
        }
        if let Some(why) = result {
            return self.fail(
                e,
                FAILED_COMMAND,
                format!("the upgrade command failed: {why}; the node stays in maintenance"),
            );
        }
        let marked;
        let mut e = e;
        if let Some(key) = upgrade_job::key(p, &attempt(e)) {
            match self.upgrade_job(e, &key) {
                Some(JobState::Failed(why)) => {
                    let msg = format!(
                        "the upgrade Job {key} failed: {why}; the node stays in maintenance"
                    );
                    return self.fail(e, FAILED_COMMAND, msg);
                }
                // Complete (the version is awaited below) or running:
                // seen, so gone from now on it was deleted.
                Some(_) => {
                    marked = NodeUpgrade {
                        job: Some(key),
                        job_seen: true,
                        ..e.clone()
                    };
                    e = &marked;
                }
                None => return,
            }
        }
        if !rebooted && let Some(why) = failure_in(node, &Ask::upgrade(before, &t)) {
            let msg = format!(
                "the reboot after the upgrade failed: {why}; the node stays in maintenance"
            );
            return self.fail(e, FAILED_COMMAND, msg);
        }
        let limit = p.spec.deadlines.upgrade_seconds;
        if self.s.now >= after(e.since.0, limit) {
            let seen = reported_version(node, &p.spec.version_from).unwrap_or("nothing");
            let msg = format!(
                "did not report version {v} within {limit} s (deadlines.upgradeSeconds; it reports {seen}); the node stays in maintenance"
            );
            return self.fail(e, FAILED_UPGRADE_TIMEOUT, msg);
        }
        let message = upgrading_message(node, e, p);
        self.step(
            e,
            Next {
                phase: UpgradePhase::Upgrading,
                hook: None,
                job: e.job.clone(),
                reason: None,
                message,
            },
        );
        self.upgrade_deadline(e);
    }

    /// The maintenance is gone and the node does not report the version in
    /// this role's store: its agent may have given the node back right
    /// after writing the version, which the node watch has not delivered
    /// yet (the maintenance watch did: two watches keep no order between
    /// them). Marked on the entry the first time; true (wait) until
    /// [`VERSION_LAG_SECONDS`] after the mark.
    fn version_may_lag(&mut self, e: &NodeUpgrade) -> bool {
        let now = self.s.now;
        let mark = e.maintenance_gone_at.as_ref().map_or(now, |t| t.0);
        let until = after(mark, VERSION_LAG_SECONDS);
        if now >= until {
            return false;
        }
        self.entries.insert(
            e.name.clone(),
            NodeUpgrade {
                maintenance_gone_at: Some(Time(mark)),
                message: Some(format!(
                    "its NodeMaintenance {} is gone; waiting up to {} s for the node to report the version its agent gave it back at",
                    maintenance_name(&e.name),
                    VERSION_LAG_SECONDS
                )),
                ..e.clone()
            },
        );
        self.wake_at(until);
        true
    }

    /// The upgrade Job's state. `None`: recorded and not in the store yet
    /// (created again under its name: a 409 if it exists, never a second
    /// run); the entry is kept and the caller waits. Or seen before and
    /// gone: deleted by a person, the node failed (`JobDeleted`).
    pub(super) fn upgrade_job(&mut self, e: &NodeUpgrade, key: &str) -> Option<JobState> {
        if let Some(state) = self.s.jobs.get(key) {
            return Some(state.clone());
        }
        if e.job_seen && e.job.as_deref() == Some(key) {
            self.job_deleted(e, &format!("the upgrade Job {key}"));
            return None;
        }
        if let Some(err) = self.s.job_errors.get(key) {
            return Some(JobState::Failed(format!("could not be created: {err}")));
        }
        if self.s.now >= after(e.since.0, upgrade_job::TTL_SECONDS) {
            let why = "the Job disappeared before its result was seen";
            return Some(JobState::Failed(why.into()));
        }
        if let Some(job) = upgrade_job::job_for(self.s.plan, &attempt(e)) {
            self.effects.push(Effect::CreateJob { job: Box::new(job) });
        }
        self.entries.insert(e.name.clone(), e.clone());
        self.upgrade_deadline(e);
        None
    }

    pub(super) fn upgrade_deadline(&mut self, e: &NodeUpgrade) {
        let since = self.entries.get(&e.name).map_or(e.since.0, |x| x.since.0);
        self.wake_at(after(since, self.s.plan.spec.deadlines.upgrade_seconds));
    }

    /// Reports the version: Ready makes it verified, then the after hooks.
    pub(super) fn verifying(
        &mut self,
        node: &Node,
        e: &NodeUpgrade,
        ours: Option<&NodeMaintenance>,
    ) {
        let p = self.s.plan;
        if ours.is_none_or(|m| m.is_deleting()) && !p.spec.hooks.after.is_empty() {
            let msg = format!(
                "its NodeMaintenance {} went away before the after hooks ran",
                maintenance_name(&e.name)
            );
            return self.fail(e, FAILED_INTERRUPTED, msg);
        }
        if ready(node) {
            return self.hooks_from(e, Stage::After, 0);
        }
        let limit = p.spec.deadlines.verify_seconds;
        let due = after(e.since.0, limit);
        if self.s.now >= due {
            let msg = format!(
                "reports version {} but was not Ready within {limit} s (deadlines.verifySeconds); the node stays in maintenance",
                version(e, p)
            );
            return self.fail(e, FAILED_VERIFY_TIMEOUT, msg);
        }
        self.wake_at(due);
        self.entries.insert(e.name.clone(), e.clone());
    }
}
