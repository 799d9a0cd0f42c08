//! One UpgradePlan decision in the making ([`Decision`]), and the steps of
//! a node it holds: hooks (before and after), draining, upgrading,
//! verifying, each with its deadline and what happens past it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::hooks::{self, Attempt, JobState, Stage};
use super::upgrade_job;
use super::*;
use crate::api::nodemaintenance::Phase;
use crate::decide::disrupt::{node_ref, owner_ref, take};
use crate::decide::maintenance::owner_of;
use crate::decide::once_per_boot::{Ask, failure_in};
use crate::decide::reboot::facts::talos_release;
use crate::decide::rollout::{self, after};
use crate::decide::{duration_until, earliest};

/// How long past a hook's deadline its Job may still run before we stop
/// waiting for it (the Job's own `activeDeadlineSeconds` normally ends it
/// first).
const HOOK_GRACE_SECS: i64 = 60;

mod hook_steps;
mod upgrading;

/// One decision in the making: the new entries, the effects that follow
/// the status write, and when to look again.
pub(super) struct Decision<'a> {
    pub(super) s: &'a Snapshot<'a>,
    pub(super) name: String,
    pub(super) generation: i64,
    pub(super) previous: BTreeMap<&'a str, &'a NodeUpgrade>,
    pub(super) entries: BTreeMap<String, NodeUpgrade>,
    pub(super) effects: Vec<Effect>,
    pub(super) wake: Option<Duration>,
}

/// What an entry moves to: the fields that change with a step.
struct Next<'e> {
    phase: UpgradePhase,
    hook: Option<String>,
    job: Option<String>,
    reason: Option<&'e str>,
    message: String,
}

impl<'a> Decision<'a> {
    pub(super) fn prev(&self, node: &str) -> Option<&'a NodeUpgrade> {
        self.previous.get(node).copied()
    }

    /// Record a node that is not admitted (Pending, Waiting, Done).
    pub(super) fn set(
        &mut self,
        node: &str,
        phase: UpgradePhase,
        group: Option<String>,
        reason: Option<&str>,
        message: String,
    ) {
        let since = match self.prev(node) {
            Some(e) if e.phase == phase => e.since.clone(),
            _ => Time(self.s.now),
        };
        self.entries.insert(
            node.to_string(),
            NodeUpgrade {
                name: node.to_string(),
                phase,
                since,
                group,
                version: None,
                attempt: None,
                boot_id_before: None,
                hook: None,
                job: None,
                job_seen: false,
                maintenance_gone_at: None,
                message: Some(message),
                reason: reason.map(str::to_string),
            },
        );
    }

    /// Move an admitted entry on; `since` restarts with a new phase or hook.
    fn step(&mut self, e: &NodeUpgrade, next: Next) {
        let since = if e.phase == next.phase && e.hook == next.hook {
            e.since.clone()
        } else {
            Time(self.s.now)
        };
        self.entries.insert(
            e.name.clone(),
            NodeUpgrade {
                phase: next.phase,
                since,
                hook: next.hook,
                // Seen stays true only for the same Job.
                job_seen: e.job_seen && next.job == e.job,
                job: next.job,
                // The gone maintenance's mark belongs to Upgrading only.
                maintenance_gone_at: (e.phase == next.phase)
                    .then(|| e.maintenance_gone_at.clone())
                    .flatten(),
                reason: next.reason.map(str::to_string),
                message: Some(next.message),
                ..e.clone()
            },
        );
    }

    pub(super) fn wake_at(&mut self, t: Timestamp) {
        self.wake_in(duration_until(self.s.now, t));
    }

    pub(super) fn wake_in(&mut self, d: Duration) {
        self.wake = earliest(self.wake, Some(d.max(Duration::from_millis(50))));
    }

    pub(super) fn event(&mut self, node: &str, warning: bool, reason: &'static str, what: &str) {
        let node_obj = self.s.nodes.iter().find(|n| n.name_any() == node);
        if let Some(n) = node_obj {
            self.effects.push(Effect::Event {
                object: node_ref(n),
                warning,
                reason,
                note: format!("UpgradePlan {}: {what}", self.name),
            });
        }
        self.effects.push(Effect::Event {
            object: plan_ref(self.s.plan),
            warning,
            reason,
            note: format!("node {node}: {what}"),
        });
    }

    pub(super) fn give_back(&mut self, nm: &NodeMaintenance) {
        self.effects.extend(rollout::give_back(nm));
    }

    /// Admit a node: the entry (the admission record) and the first step's
    /// effect, a hook Job or the NodeMaintenance.
    pub(super) fn admit(&mut self, node: &Node, group: Option<String>) {
        let n = node.name_any();
        let e = NodeUpgrade {
            name: n.clone(),
            phase: UpgradePhase::Pending,
            since: Time(self.s.now),
            group,
            version: Some(self.s.target().to_string()),
            attempt: Some(self.generation),
            boot_id_before: boot_id(node).map(str::to_string),
            hook: None,
            job: None,
            job_seen: false,
            maintenance_gone_at: None,
            message: None,
            reason: None,
        };
        let what = format!("admitted for version {}", self.s.target());
        self.event(&n, false, "UpgradeAdmitted", &what);
        self.hooks_from(&e, Stage::Before, 0);
    }

    /// `e`'s node waits: another disruption holds it.
    fn in_maintenance(&mut self, e: &NodeUpgrade, msg: String) {
        self.set(
            &e.name,
            UpgradePhase::Waiting,
            e.group.clone(),
            Some(WAIT_IN_MAINTENANCE),
            msg,
        );
    }

    /// Take the node: its NodeMaintenance drains it.
    fn drain(&mut self, e: &NodeUpgrade) {
        let p = self.s.plan;
        // Not taken yet, and an older plan selects the node now (a person
        // relabelled it): the admission is withdrawn before it takes the
        // node, which is the older plan's to upgrade.
        if self.ours(&e.name).is_none()
            && let Some(node) = self.s.nodes.iter().find(|n| n.name_any() == e.name)
            && let Some(g) = governing(node, self.s.plans).filter(|g| g.name_any() != self.name)
        {
            let msg = format!(
                "also selected by the older UpgradePlan {}, which upgrades it; the admission is withdrawn",
                g.name_any()
            );
            let group = e.group.clone();
            return self.set(
                &e.name,
                UpgradePhase::Waiting,
                group,
                Some(WAIT_OTHER_PLAN),
                msg,
            );
        }
        // Not taken yet, and someone else took the node meanwhile (a
        // person's cordon, another drainer), or a pod opted out while the
        // before hooks ran: the admission is withdrawn.
        if self.ours(&e.name).is_none()
            && let Some(node) = self.s.nodes.iter().find(|n| n.name_any() == e.name)
            && let Some((reason, msg)) = {
                let s = self.s;
                rollout::withdrawn(node, (s.node_pods)(&e.name), s.now, |d| self.wake_in(d))
            }
        {
            let group = e.group.clone();
            return self.set(&e.name, UpgradePhase::Waiting, group, Some(reason), msg);
        }
        // Admitted, but another disruption took the node before our
        // create went through: the admission is withdrawn.
        let mine =
            |m: &NodeMaintenance| crate::decide::disrupt::owned_by(m, OWNER_KIND, &self.name);
        if let Some(other) =
            crate::decide::disrupt::held_by_other(self.s.maintenances, &e.name, mine)
        {
            return self.in_maintenance(e, crate::decide::disrupt::taken_meanwhile(other));
        }
        let nm = take(
            owner_ref(p, OWNER_KIND),
            &maintenance_name(&e.name),
            &e.name,
            &p.spec.drain,
            e.boot_id_before.as_deref().unwrap_or_default(),
            format!("upgrade to {}: {}", version(e, p), self.name),
        );
        let message = format!("draining through NodeMaintenance {}", nm.name_any());
        self.effects
            .push(Effect::CreateMaintenance { nm: Box::new(nm) });
        self.step(
            e,
            Next {
                phase: UpgradePhase::Draining,
                hook: None,
                job: None,
                reason: None,
                message,
            },
        );
    }

    /// Verified and after hooks done: give the node back; it settles in
    /// its slot when the plan's gates ask for it.
    fn finish(&mut self, e: &NodeUpgrade) {
        if let Some(m) = self.ours(&e.name) {
            self.give_back(&m);
        }
        let v = version(e, self.s.plan).to_string();
        self.event(
            &e.name,
            false,
            "UpgradeVerified",
            &format!("upgraded to {v} and verified"),
        );
        let gates = &self.s.plan.spec.gates;
        let (phase, message) = if gates.settle_seconds > 0 || gates.health.is_some() {
            (UpgradePhase::Settling, format!("upgraded to {v}; settling"))
        } else {
            (UpgradePhase::Done, format!("upgraded to {v}"))
        };
        self.step(
            e,
            Next {
                phase,
                hook: None,
                job: None,
                reason: None,
                message,
            },
        );
    }

    /// Given back after its verified upgrade, it keeps its slot for
    /// `settleSeconds` and, with `gates.health`, until the cluster is
    /// healthy again (or the gate's timeout says otherwise). The give-back
    /// is asked again on every pass until it happened.
    fn settling(&mut self, node: &Node, e: &NodeUpgrade, ours: Option<&NodeMaintenance>) {
        if let Some(m) = ours.filter(|m| !m.is_deleting()) {
            self.give_back(m);
        }
        let done = format!("upgraded to {}", version(e, self.s.plan));
        let (next, warn, wake) = rollout::settle(&rollout::Settling {
            gates: &self.s.plan.spec.gates,
            node,
            health: self.s.health,
            alerts: self.s.alerts,
            now: self.s.now,
            since: e.since.0,
            reason: e.reason.as_deref(),
            given_back: ours.is_none(),
            done: &done,
        });
        if let Some(t) = wake {
            self.wake_at(t);
        }
        if let Some(msg) = warn {
            self.event(&e.name, true, "HealthTimeout", &msg);
        }
        let (phase, reason, message) = match next {
            rollout::Settled::Done(reason, msg) => (UpgradePhase::Done, reason, msg),
            rollout::Settled::Settling(reason, msg) => (UpgradePhase::Settling, reason, msg),
            rollout::Settled::Unchanged => {
                self.entries.insert(e.name.clone(), e.clone());
                return;
            }
        };
        let next = Next {
            phase,
            hook: None,
            job: None,
            reason,
            message,
        };
        self.step(e, next);
    }

    /// The node failed: recorded with its generation (a spec change
    /// retries it), reported, and left where it is.
    fn fail(&mut self, e: &NodeUpgrade, reason: &'static str, message: String) {
        self.event(&e.name, true, "UpgradeFailed", &message);
        let (hook, job) = match reason {
            FAILED_HOOK => (e.hook.clone(), e.job.clone()),
            _ => (None, None),
        };
        self.step(
            e,
            Next {
                phase: UpgradePhase::Failed,
                hook,
                job,
                reason: Some(reason),
                message,
            },
        );
        if let Some(x) = self.entries.get_mut(&e.name) {
            x.attempt = Some(self.generation);
        }
    }

    fn ours(&self, node: &str) -> Option<NodeMaintenance> {
        self.s
            .maintenances
            .iter()
            .find(|m| m.spec.node_name == node && owned_by(m, OWNER_KIND, &self.name))
            .map(|m| (**m).clone())
    }

    /// A node we hold: one step along its upgrade.
    pub(super) fn follow(
        &mut self,
        node: &Node,
        ours: Option<&NodeMaintenance>,
        group: Option<String>,
    ) {
        let Some(prev) = self.prev(&node.name_any()) else {
            return;
        };
        let mut e = prev.clone();
        e.group = group;
        match e.phase {
            UpgradePhase::PreHooks => self.hook(&e, Stage::Before),
            UpgradePhase::PostHooks => self.hook(&e, Stage::After),
            UpgradePhase::Draining => self.draining(node, &e, ours),
            UpgradePhase::Upgrading => self.upgrading(node, &e, ours),
            UpgradePhase::Verifying => self.verifying(node, &e, ours),
            UpgradePhase::Settling => self.settling(node, &e, ours),
            _ => {
                self.entries.insert(e.name.clone(), e);
            }
        }
    }

    fn draining(&mut self, node: &Node, e: &NodeUpgrade, ours: Option<&NodeMaintenance>) {
        let Some(m) = ours else {
            // Admitted, not taken yet (or our create is not in the store
            // yet: creating again is a harmless 409).
            return self.drain(e);
        };
        if m.is_deleting() {
            self.entries.insert(e.name.clone(), e.clone());
            return;
        }
        match m.phase() {
            Some(Phase::Succeeded) => {
                let p = self.s.plan;
                let message = upgrading_message(node, e, p);
                // Type Job: the Job is recorded before it is created (the
                // status write comes first in the plan).
                let a = attempt(e);
                let job = upgrade_job::key(p, &a);
                self.step(
                    e,
                    Next {
                        phase: UpgradePhase::Upgrading,
                        hook: None,
                        job: job.clone(),
                        reason: None,
                        message,
                    },
                );
                if job.is_some()
                    && let Some(j) = upgrade_job::job_for(p, &a)
                {
                    self.effects.push(Effect::CreateJob { job: Box::new(j) });
                }
                self.upgrade_deadline(e);
            }
            Some(Phase::Failed) => {
                self.give_back(m);
                let admin = self.s.maintenances.iter().find(|o| {
                    o.spec.node_name == e.name
                        && owner_of(o).is_none()
                        && !o.is_deleting()
                        && crate::decide::disrupt::holds_node(o)
                });
                if let Some(admin) = admin {
                    let msg = format!("preempted by NodeMaintenance {}", admin.name_any());
                    self.in_maintenance(e, msg);
                } else {
                    let why = m.status.as_ref().and_then(|st| st.last_error.clone());
                    let why = why.unwrap_or_else(|| "the NodeMaintenance failed".into());
                    self.fail(
                        e,
                        FAILED_DRAIN,
                        format!("drain failed: {why}; the node was given back"),
                    );
                }
            }
            _ => {
                let message = format!("draining through NodeMaintenance {}", m.name_any());
                self.step(
                    e,
                    Next {
                        phase: UpgradePhase::Draining,
                        hook: None,
                        job: None,
                        reason: None,
                        message,
                    },
                );
            }
        }
    }
}

fn upgrading_message(node: &Node, e: &NodeUpgrade, p: &UpgradePlan) -> String {
    let v = version(e, p);
    let before = e.boot_id_before.as_deref().unwrap_or_default();
    let issued = annotation(node, ISSUED_ANNOTATION)
        == Some(recorded_token(node, &p.name_any(), v, before, e.attempt).as_str());
    if let Some(key) = upgrade_job::key(p, &attempt(e)) {
        return format!(
            "drained; the upgrade Job {key} upgrades it to {v}; waiting for the node to report it"
        );
    }
    let how = if p.spec.strategy.type_ == "Talos" {
        match talos_release(node) {
            Some(r) if r < (1, 13) => "Talos's MachineService/Upgrade",
            _ => "Talos's LifecycleService/Upgrade",
        }
    } else {
        "strategy.command"
    };
    if issued {
        format!("upgrade issued by {how}; waiting for the node to report version {v}")
    } else {
        format!("drained; waiting for the node agent to upgrade it to {v} by {how}")
    }
}

/// The version an admission upgrades to (recorded at admission).
fn version<'p>(e: &'p NodeUpgrade, p: &'p UpgradePlan) -> &'p str {
    e.version.as_deref().unwrap_or(p.target_version())
}

fn attempt(e: &NodeUpgrade) -> Attempt<'_> {
    Attempt {
        node: &e.name,
        version: e.version.as_deref().unwrap_or_default(),
        attempt: e.attempt.unwrap_or_default(),
    }
}

fn plan_ref(p: &UpgradePlan) -> ObjectReference {
    p.object_ref(&())
}
