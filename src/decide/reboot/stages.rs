//! One RebootPolicy decision in the making ([`Decision`]), and the steps a
//! held node goes through: draining, rebooting (issued here in remote
//! mode), verifying, settling, and the return deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

use super::facts::*;
use super::{NOT_RETURNED, Snapshot, WAIT_IN_MAINTENANCE};
use crate::api::nodemaintenance::{NodeMaintenance, Phase};
use crate::api::reboot::*;
use crate::decide::maintenance::owner_of;
use crate::decide::once_per_boot::{Ask, failure_in, issued_in};
use crate::decide::rollout::{self, after};
use crate::decide::{Effect, HostAction, duration_until, earliest};

/// One decision in the making: the new entries, the effects that follow
/// the status write, and when to look again.
pub(super) struct Decision<'a> {
    pub(super) s: &'a Snapshot<'a>,
    pub(super) name: String,
    pub(super) previous: BTreeMap<&'a str, &'a NodeReboot>,
    pub(super) entries: BTreeMap<String, NodeReboot>,
    pub(super) effects: Vec<Effect>,
    pub(super) wake: Option<Duration>,
    pub(super) not_returned: Vec<String>,
}

impl<'a> Decision<'a> {
    pub(super) fn prev(&self, node: &str) -> Option<&'a NodeReboot> {
        self.previous.get(node).copied()
    }

    /// Record `node` in `phase`; `since` carries over while the phase stays.
    pub(super) fn set(
        &mut self,
        node: &str,
        phase: RebootPhase,
        boot: Option<&str>,
        reason: Option<&str>,
        msg: String,
    ) {
        let since = match self.prev(node) {
            Some(e) if e.phase == phase => e.since.clone(),
            _ => Time(self.s.now),
        };
        // The need is taken when the node is admitted and kept through the
        // reboot that answers it.
        let stamped = || {
            self.s
                .nodes
                .iter()
                .find(|n| n.name_any() == node)
                .and_then(|n| crate::decide::maintenance::annotation(n, NEEDED_ANNOTATION))
                .map(str::to_string)
        };
        let need = match self.prev(node) {
            Some(e) if phase != RebootPhase::Draining || e.phase == RebootPhase::Draining => {
                e.need.clone().or_else(stamped)
            }
            _ => stamped(),
        };
        self.entries.insert(
            node.to_string(),
            NodeReboot {
                name: node.to_string(),
                phase,
                since,
                boot_id_before: boot.map(str::to_string),
                need,
                message: Some(msg),
                reason: reason.map(str::to_string),
            },
        );
    }

    pub(super) fn wake_at(&mut self, t: Timestamp) {
        self.wake_in(duration_until(self.s.now, t));
    }

    pub(super) fn wake_in(&mut self, d: Duration) {
        self.wake = earliest(self.wake, Some(d.max(Duration::from_millis(50))));
    }

    pub(super) fn event(&mut self, node: &Node, warning: bool, reason: &'static str, what: &str) {
        let (policy, n) = (self.name.clone(), node.name_any());
        self.effects.push(Effect::Event {
            object: node_ref(node),
            warning,
            reason,
            note: format!("RebootPolicy {policy}: {what}"),
        });
        self.effects.push(Effect::Event {
            object: policy_ref(self.s.policy),
            warning,
            reason,
            note: format!("node {n}: {what}"),
        });
    }

    pub(super) fn give_back(&mut self, nm: &NodeMaintenance) {
        self.effects.extend(rollout::give_back(nm));
    }

    /// `node` waits: another disruption holds it.
    fn in_maintenance(&mut self, node: &str, msg: String) {
        self.set(
            node,
            RebootPhase::Waiting,
            None,
            Some(WAIT_IN_MAINTENANCE),
            msg,
        );
    }

    /// A node whose reboot was verified (Settling or Done): our
    /// NodeMaintenance goes and the need it was rebooted for is cleared,
    /// on every pass until both are so. The status records the phase
    /// before these writes run, so one that failed is only ever repaired
    /// here.
    pub(super) fn reassert_give_back(
        &mut self,
        node: &Node,
        ours: Option<&NodeMaintenance>,
        entry: &NodeReboot,
    ) {
        if let Some(m) = ours.filter(|m| !m.is_deleting()) {
            self.give_back(m);
        }
        if stale_need(node, entry) {
            self.effects.push(Effect::PatchNode {
                node: node.name_any(),
                resource_version: node.resource_version(),
                patch: clear_need_patch(node),
            });
        }
    }

    /// A node we hold (or held): one step along its reboot.
    pub(super) fn follow(
        &mut self,
        node: &Node,
        ours: Option<&NodeMaintenance>,
        others: &[&Arc<NodeMaintenance>],
    ) {
        let n = node.name_any();
        let prev = self.prev(&n);
        let boot = boot_id(node);
        let Some(before) = ours
            .and_then(|m| m.annotations().get(BOOT_ID_ANNOTATION).cloned())
            .or_else(|| prev.and_then(|e| e.boot_id_before.clone()))
        else {
            // Only a hand-edited object gets here: without the boot it was
            // admitted in, a reboot could be neither issued safely nor
            // verified. Give the node back and say so.
            if let Some(m) = ours {
                self.give_back(m);
            }
            let msg = "admission record has no boot ID; given back without a reboot";
            self.set(&n, RebootPhase::Failed, boot, None, msg.into());
            return;
        };
        let changed = boot.is_some_and(|b| b != before);
        if !changed && self.stopped_before_issue(node, ours, &before) {
            return;
        }
        let Some(m) = ours else {
            self.follow_given_back(node, &before, changed, others);
            return;
        };
        if m.is_deleting() {
            if let Some(p) = prev {
                self.entries.insert(n, p.clone());
            }
            return;
        }
        match m.phase() {
            Some(Phase::Failed) if !changed => self.drain_failed(node, m, &before, others),
            Some(Phase::Succeeded) | Some(Phase::Failed) => self.drained(node, m, &before, changed),
            Some(Phase::Running) | None => {
                let draining = format!("draining through NodeMaintenance {}", maintenance_name(&n));
                self.set(&n, RebootPhase::Draining, Some(&before), None, draining);
            }
        }
    }

    /// A person may stop an admitted reboot until its command is issued:
    /// `reboot-paused` on the node, or the need withdrawn
    /// (`reboot-required --clear`). The node is given back undisrupted
    /// beyond its drain; the node role checks the same before it issues.
    /// True when it was stopped so.
    fn stopped_before_issue(
        &mut self,
        node: &Node,
        ours: Option<&NodeMaintenance>,
        before: &str,
    ) -> bool {
        let n = node.name_any();
        let stopped = paused(node) || !needs_reboot(node);
        if !stopped || issued_in(node, &Ask::need(node, before)) {
            return false;
        }
        if let Some(m) = ours.filter(|m| !m.is_deleting()) {
            self.give_back(m);
        }
        if paused(node) {
            let msg = "paused by a reboot-paused annotation; given back before its reboot";
            self.set(
                &n,
                RebootPhase::Waiting,
                None,
                Some(super::WAIT_PAUSED),
                msg.into(),
            );
        } else {
            self.event(
                node,
                false,
                "RebootWithdrawn",
                "the reboot was no longer needed before its command; given back",
            );
        }
        true
    }

    /// A node whose NodeMaintenance of ours is gone: rebooted and given
    /// back by someone else, admitted but not taken yet, or withdrawn.
    fn follow_given_back(
        &mut self,
        node: &Node,
        before: &str,
        changed: bool,
        others: &[&Arc<NodeMaintenance>],
    ) {
        let n = node.name_any();
        let prev = self.prev(&n);
        let draining = format!("draining through NodeMaintenance {}", maintenance_name(&n));
        if changed && ready(node) {
            // Given back by someone else after it rebooted: verified.
            self.verified(node, before);
        } else if changed {
            self.verifying(node, before);
        } else if prev.is_some_and(|e| e.phase == RebootPhase::Draining)
            && let Some(other) = others.first()
        {
            // Admitted, but our create failed and another disruption
            // took the node meanwhile: the admission is withdrawn and
            // its slot freed.
            self.in_maintenance(&n, crate::decide::disrupt::taken_meanwhile(other));
        } else if prev.is_some_and(|e| e.phase == RebootPhase::Draining)
            && let Some(g) =
                super::node::governing(node, self.s.policies).filter(|g| g.name_any() != self.name)
        {
            // Admitted, not taken yet, and an older policy selects the
            // node now (a person relabelled it): the admission is
            // withdrawn before it takes the node, which is the older
            // policy's to reboot.
            let msg = format!(
                "also selected by the older RebootPolicy {}, which reboots it; the admission is withdrawn",
                g.name_any()
            );
            self.set(
                &n,
                RebootPhase::Waiting,
                None,
                Some(super::WAIT_OTHER_POLICY),
                msg,
            );
        } else if prev.is_some_and(|e| e.phase == RebootPhase::Draining)
            && let Some((reason, msg)) = {
                let s = self.s;
                rollout::withdrawn(node, (s.node_pods)(&n), s.now, |d| self.wake_in(d))
            }
        {
            // Admitted, not taken yet, and someone else took the node
            // meanwhile, or a pod opted out: withdrawn.
            self.set(&n, RebootPhase::Waiting, None, Some(reason), msg);
        } else if prev.is_some_and(|e| e.phase == RebootPhase::Draining) {
            // Admitted, not taken yet (or our create is not in the store
            // yet: creating again is a harmless 409).
            let nm = maintenance_for(self.s.policy, node, before);
            self.effects.extend(stamp_need_boot(node, before));
            self.effects
                .push(Effect::CreateMaintenance { nm: Box::new(nm) });
            self.set(&n, RebootPhase::Draining, Some(before), None, draining);
        } else if issued_in(node, &Ask::need(node, before)) {
            self.rebooting(node, before, false);
        } else {
            let msg = "admission withdrawn: its NodeMaintenance was deleted before the reboot";
            self.set(&n, RebootPhase::Pending, None, None, msg.into());
        }
    }

    /// Our drain failed before any reboot: given back, and the failure
    /// reported (or the node left to an administrator's maintenance that
    /// preempted it).
    fn drain_failed(
        &mut self,
        node: &Node,
        m: &NodeMaintenance,
        before: &str,
        others: &[&Arc<NodeMaintenance>],
    ) {
        let n = node.name_any();
        self.give_back(m);
        if let Some(admin) = others.iter().find(|o| owner_of(o).is_none()) {
            let msg = format!("preempted by NodeMaintenance {}", admin.name_any());
            self.in_maintenance(&n, msg);
        } else {
            let why = m.status.as_ref().and_then(|st| st.last_error.clone());
            let why = why.unwrap_or_else(|| "the NodeMaintenance failed".into());
            self.event(node, true, "RebootFailed", &format!("not rebooted: {why}"));
            self.set(
                &n,
                RebootPhase::Failed,
                Some(before),
                None,
                format!("not rebooted: {why}"),
            );
        }
    }

    /// Drained (or failed after the reboot): verified once the node is
    /// back in a new boot, else waiting for the command or its failure.
    fn drained(&mut self, node: &Node, m: &NodeMaintenance, before: &str, changed: bool) {
        let n = node.name_any();
        if changed && ready(node) {
            self.verified(node, before);
            self.give_back(m);
        } else if changed {
            self.verifying(node, before);
        } else if let Some(why) = failure_in(node, &Ask::need(node, before))
            && let Some(due) = self.still_may_return(&n)
        {
            // A command that says it failed may have taken the host
            // down anyway (ssh exits 255 as the connection drops):
            // given back now, the node was uncordoned while it went
            // down and rebooted a second time after. A new boot ID
            // before the return deadline means it rebooted.
            let msg = format!(
                "the reboot command reported a failure ({why}); waiting for a new boot ID until the return deadline before calling it failed"
            );
            self.set(&n, RebootPhase::Rebooting, Some(before), None, msg);
            self.wake_at(due);
        } else if let Some(why) = failure_in(node, &Ask::need(node, before)) {
            let why = why.to_string();
            self.give_back(m);
            self.event(
                node,
                true,
                "RebootFailed",
                &format!("the reboot command failed: {why}"),
            );
            self.set(
                &n,
                RebootPhase::Failed,
                Some(before),
                None,
                format!("reboot command failed: {why}"),
            );
        } else {
            self.rebooting(node, before, true);
        }
    }

    /// The return deadline of a node that was Rebooting, if it has not
    /// passed.
    fn still_may_return(&self, n: &str) -> Option<Timestamp> {
        let prev = self.prev(n).filter(|e| e.phase == RebootPhase::Rebooting)?;
        let limit = i64::from(self.s.policy.spec.reboot.return_timeout_seconds.max(0));
        let due = after(prev.since.0, limit);
        (self.s.now < due).then_some(due)
    }

    /// Back with a new boot, not Ready yet; the return deadline still runs.
    fn verifying(&mut self, node: &Node, before: &str) {
        let msg = "new boot ID; waiting for Ready".to_string();
        self.set(
            &node.name_any(),
            RebootPhase::Verifying,
            Some(before),
            None,
            msg,
        );
        self.deadline(node);
    }

    /// Given back after its verified reboot, it keeps its slot for
    /// `settleSeconds` and, with `gates.health`, until the cluster is
    /// healthy again (or the gate's timeout says otherwise).
    pub(super) fn settling(&mut self, node: &Node, given_back: bool, prev: &NodeReboot) {
        let n = node.name_any();
        let before = prev.boot_id_before.as_deref();
        let (next, warn, wake) = rollout::settle(&rollout::Settling {
            gates: &self.s.policy.spec.gates,
            node,
            health: self.s.health,
            alerts: self.s.alerts,
            now: self.s.now,
            since: prev.since.0,
            reason: prev.reason.as_deref(),
            given_back,
            done: "reboot verified",
        });
        if let Some(t) = wake {
            self.wake_at(t);
        }
        if let Some(msg) = warn {
            self.event(node, true, "HealthTimeout", &msg);
        }
        match next {
            rollout::Settled::Done(reason, msg) => {
                self.set(&n, RebootPhase::Done, before, reason, msg)
            }
            rollout::Settled::Settling(reason, msg) => {
                self.set(&n, RebootPhase::Settling, before, reason, msg)
            }
            rollout::Settled::Unchanged => {
                self.entries.insert(n, prev.clone());
            }
        }
    }

    /// Back with a new boot and Ready: its need cleared, it keeps its slot
    /// while it settles (the caller gives the node back).
    fn verified(&mut self, node: &Node, before: &str) {
        let n = node.name_any();
        let settle = self.s.policy.spec.gates.settle_seconds.max(0) as u64;
        if settle == 0 && self.s.policy.spec.gates.health.is_none() {
            self.set(
                &n,
                RebootPhase::Done,
                Some(before),
                None,
                "reboot verified".into(),
            );
        } else {
            self.wake = earliest(self.wake, Some(Duration::from_secs(settle)));
            let msg = format!("reboot verified; settling for {settle} s");
            self.set(&n, RebootPhase::Settling, Some(before), None, msg);
        }
        self.effects.push(Effect::PatchNode {
            node: n,
            resource_version: node.resource_version(),
            patch: clear_need_patch(node),
        });
        let new = boot_id(node).unwrap_or_default().to_string();
        self.event(
            node,
            false,
            "RebootVerified",
            &format!("rebooted (boot {before} -> {new}) and Ready"),
        );
    }

    /// Drained, same boot: the reboot is issued (here in remote mode) and
    /// must come back within `returnTimeoutSeconds`.
    fn rebooting(&mut self, node: &Node, before: &str, held: bool) {
        let n = node.name_any();
        let spec = &self.s.policy.spec.reboot;
        let ask = Ask::need(node, before);
        let issued = issued_in(node, &ask);
        let remote = self.s.remote && !spec.remote_command.is_empty();
        // Which path the node takes, so `kubectl describe` says it.
        let how = match (remote, reboot_action(spec, node)) {
            (true, _) => "reboot.remoteCommand".to_string(),
            (false, HostAction::TalosReboot) => "Talos's machine API".to_string(),
            (false, action) => action.to_string(),
        };
        let msg = if issued {
            format!("reboot issued by {how}; waiting for the node to come back with a new boot ID")
        } else if remote {
            "drained; rebooting with reboot.remoteCommand".to_string()
        } else if self.s.remote {
            "drained; waiting for a node agent to reboot it (no reboot.remoteCommand)".to_string()
        } else {
            format!("drained; waiting for the node agent to reboot it by {how}")
        };
        self.set(&n, RebootPhase::Rebooting, Some(before), None, msg);
        if !issued && remote && held {
            let remote = HostAction::Remote(argv(&spec.remote_command, &n));
            self.effects
                .extend(crate::decide::once_per_boot::issue(node, &ask, remote));
        }
        self.deadline(node);
    }

    /// A Rebooting or Verifying node past `returnTimeoutSeconds` keeps its
    /// slot and is reported, once.
    fn deadline(&mut self, node: &Node) {
        let n = node.name_any();
        let limit = i64::from(self.s.policy.spec.reboot.return_timeout_seconds.max(0));
        let Some(e) = self.entries.get_mut(&n) else {
            return;
        };
        let due = after(e.since.0, limit);
        if self.s.now < due {
            self.wake_at(due);
            return;
        }
        e.reason = Some(NOT_RETURNED.into());
        e.message = Some(format!(
            "{} for over {limit} s (returnTimeoutSeconds); the node keeps its slot",
            e.phase.as_str()
        ));
        self.not_returned.push(n.clone());
        if self.prev(&n).and_then(|p| p.reason.as_deref()) != Some(NOT_RETURNED) {
            let what = format!(
                "did not come back within {limit} s of its reboot (boot ID {}); its slot stays taken",
                boot_id(node).unwrap_or("unknown")
            );
            self.event(node, true, "NodeNotReturned", &what);
        }
    }
}

fn policy_ref(p: &RebootPolicy) -> ObjectReference {
    p.object_ref(&())
}
