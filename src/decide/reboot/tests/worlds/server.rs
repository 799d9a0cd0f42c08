//! The API server's and the host's side of the random worlds: each effect
//! a decision asks for is applied as they would (resourceVersion guards,
//! 409s, the maintenance controller's uncordon), with faults injected per
//! effect (`faults.rs`), and every invariant that is checked at the moment
//! of a write — one feature NodeMaintenance per node, the oldest policy
//! admits, budgets, no node someone else holds, one reboot command per
//! ask and boot, nothing untrusted in an argv, an image or a label.

use super::*;

impl World {
    /// NotReady, cordoned, or with any NodeMaintenance (budgets count a
    /// Failed one too until it is deleted).
    pub(super) fn unavailable(&self, n: &Node) -> bool {
        !crate::decide::disrupt::ready(n)
            || crate::decide::disrupt::unschedulable(n)
            || self.nms.iter().any(|m| m.spec.node_name == n.name_any())
    }

    /// Apply one effect as the API server and the host would; `Err` ends
    /// the plan (a conflict), as the interpreter does.
    pub(super) fn apply(&mut self, who: &str, e: &Effect) -> Result<(), String> {
        // Nothing a hostile channel answered reaches an argv, an image or
        // a label (statuses may quote it, refused).
        if matches!(
            e,
            Effect::RunHost { .. } | Effect::CreateJob { .. } | Effect::PatchNode { .. }
        ) {
            assert!(
                !format!("{e:?}").contains(upgrades::MARKER),
                "{who}: an untrusted channel answer reached {e:?}"
            );
        }
        match e {
            Effect::WritePolicyStatus {
                policy,
                resource_version,
                status,
            } => self.write_policy_status(who, policy, resource_version, status)?,
            Effect::WriteUpgradeStatus {
                plan,
                resource_version,
                status,
            } => self.write_plan_status(who, plan, resource_version, status)?,
            Effect::CreateMaintenance { nm } => self.create_maintenance(who, nm),
            Effect::DeleteMaintenance { nm, uid } => {
                self.nms
                    .retain(|m| !(m.name_any() == *nm && m.metadata.uid.as_deref() == Some(uid)));
                self.uncordon_free();
            }
            Effect::PatchNode {
                node,
                resource_version,
                patch,
            } => self.patch_node(who, node, resource_version, patch)?,
            Effect::RunHost { .. } if upgrades::is_upgrade(e) => self.run_upgrade(who, e)?,
            Effect::RunHost { node, id, .. } => self.run_reboot(who, e, node, id)?,
            Effect::CreateJob { job } => self.create_job(who, job)?,
            Effect::Event { .. } => {}
            other => panic!("{who}: unexpected effect {other:?}"),
        }
        Ok(())
    }

    /// A policy's status write, refused on a stale copy; the nodes it
    /// admits now are noted for the budget check of their create.
    fn write_policy_status(
        &mut self,
        who: &str,
        policy: &str,
        resource_version: &Option<String>,
        status: &RebootPolicyStatus,
    ) -> Result<(), String> {
        let rv = self.bump();
        let Some(p) = self.policies.iter_mut().find(|p| p.name_any() == *policy) else {
            return Err("policy gone".into());
        };
        if resource_version.is_some() && *resource_version != p.metadata.resource_version {
            return Err(format!("{who}: status write on a stale policy refused"));
        }
        let was = |n: &str| {
            p.status
                .iter()
                .flat_map(|s| s.nodes.iter())
                .find(|e| e.name == n)
                .map(|e| e.phase)
        };
        let admitted: Vec<String> = status
            .nodes
            .iter()
            .filter(|e| e.phase == RebootPhase::Draining && was(&e.name) != Some(e.phase))
            .map(|e| format!("{policy}/{}", e.name))
            .collect();
        self.admitted_now.extend(admitted);
        p.status = Some(status.clone());
        p.metadata.resource_version = Some(rv);
        Ok(())
    }

    /// A NodeMaintenance created: a 409 for a name the server has, and
    /// the invariants of taking a node checked first.
    fn create_maintenance(&mut self, who: &str, nm: &NodeMaintenance) {
        let node = nm.spec.node_name.clone();
        let Some(n) = self.nodes.iter().find(|n| n.name_any() == node).cloned() else {
            return;
        };
        // A name the server has: 409, which the executor takes as
        // "created before" (a give-back whose delete failed, then
        // the node taken again by its owner for a new version).
        if let Some(m) = self.nms.iter().find(|m| m.name_any() == nm.name_any()) {
            let owner = |m: &NodeMaintenance| m.owner_references().first().map(|o| o.uid.clone());
            self.trace.push(format!(
                "{who}: NodeMaintenance {} exists (409), owned by {:?}",
                m.name_any(),
                owner(m)
            ));
            return;
        }
        if let Some(m) = self
            .nms
            .iter()
            .find(|m| m.spec.node_name == node && !failed(m))
        {
            panic!(
                "{who} took {node}, which already has NodeMaintenance {}",
                m.name_any()
            );
        }
        let (kind, owner) = nm
            .owner_references()
            .first()
            .map(|o| (o.kind.clone(), o.name.clone()))
            .unwrap_or_default();
        if kind == crate::api::upgrade::OWNER_KIND {
            self.check_plan_admission(who, &n, &owner);
        }
        if let Some(by_hand) = self.held_by_others.get(&node) {
            let how = if *by_hand {
                "a person cordoned"
            } else {
                "another tool drains or a person marked do-not-disrupt"
            };
            assert!(
                kind != OWNER_KIND && kind != crate::api::upgrade::OWNER_KIND,
                "{who} took {node}, which {how} (HeldByOther, DoNotDisrupt)"
            );
        }
        if kind == OWNER_KIND
            && let Some(p) = self.policies.iter().find(|p| p.name_any() == owner)
        {
            assert_eq!(
                node::check_of(&n, p),
                crate::decide::command_check::Check::Runnable,
                "{who} took {node} for a reboot without its agent saying it can reboot it"
            );
        }
        let governor = oldest_selecting(&n, &self.policies).map(|p| p.name_any());
        assert!(
            kind != OWNER_KIND || governor.as_deref() == Some(owner.as_str()),
            "{node} admitted by {owner}, not by the oldest policy selecting it"
        );
        if kind == OWNER_KIND && self.admitted_now.contains(&format!("{owner}/{node}")) {
            // (Else an UpgradePlan's, checked above, or admitted by an
            // earlier plan whose record held the slot.)
            self.check_policy_budget(who, &n, &owner);
        }
        let mut m = nm.clone();
        m.metadata.uid = Some(format!("nm-{}", self.bump()));
        m.metadata.resource_version = Some(self.bump());
        m.status = Some(NodeMaintenanceStatus {
            phase: Some(Phase::Running),
            ..Default::default()
        });
        self.real.created_now.insert(m.name_any());
        self.nms.push(m);
    }

    /// A policy admitted `n` now: no more of its nodes unavailable than
    /// its budget allows.
    fn check_policy_budget(&mut self, who: &str, n: &Node, owner: &str) {
        let node = n.name_any();
        let Some(p) = self.policies.iter().find(|p| p.name_any() == owner) else {
            return;
        };
        let budget = budget_of(&p.spec.budget.max_unavailable);
        let selected: Vec<&Node> = self.nodes.iter().filter(|x| selects(p, x)).collect();
        let down = selected
            .iter()
            .filter(|x| x.name_any() == node || self.unavailable(x))
            .count();
        self.trace.push(format!(
            "{who} admits {node}; unavailable: {:?}; nms: {:?}",
            selected
                .iter()
                .filter(|x| self.unavailable(x))
                .map(|x| (
                    x.name_any(),
                    crate::decide::disrupt::ready(x),
                    crate::decide::disrupt::unschedulable(x)
                ))
                .collect::<Vec<_>>(),
            self.nms
                .iter()
                .map(|m| (m.name_any(), m.spec.node_name.clone()))
                .collect::<Vec<_>>()
        ));
        // Admitting a node that is already unavailable (NotReady,
        // cordoned) takes nothing more from the budget.
        assert!(
            self.unavailable(n) || down <= budget,
            "{owner} admitted {node}: {down} of its nodes unavailable, budget {budget}"
        );
    }

    /// A node patch, merged as a JSON merge patch, refused on a stale copy.
    fn patch_node(
        &mut self,
        who: &str,
        node: &str,
        resource_version: &Option<String>,
        patch: &serde_json::Value,
    ) -> Result<(), String> {
        self.watch_for_fights(who, node, patch);
        let rv = self.bump();
        let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == node) else {
            return Err("node gone".into());
        };
        if resource_version.is_some() && *resource_version != n.metadata.resource_version {
            return Err(format!("{who}: node patch on a stale node refused"));
        }
        let mut v = serde_json::to_value(&*n).map_err(|e| e.to_string())?;
        merge(&mut v, patch);
        *n = serde_json::from_value(v).map_err(|e| e.to_string())?;
        n.metadata.resource_version = Some(rv);
        Ok(())
    }

    /// A reboot command on the host: one per ask, a second in one boot
    /// only after the first failed; some fail, some of those reboot anyway.
    fn run_reboot(&mut self, who: &str, e: &Effect, node: &str, id: &str) -> Result<(), String> {
        let boot = self
            .nodes
            .iter()
            .find(|n| n.name_any() == node)
            .and_then(|n| boot_id(n).map(str::to_string))
            .unwrap_or_default();
        if let Some(n) = self.nodes.iter().find(|n| n.name_any() == node) {
            assert!(
                !crate::decide::reboot::facts::paused(n)
                    && crate::decide::reboot::facts::needs_reboot(n),
                "{node}: a reboot command although paused or no longer needed"
            );
        }
        // One command per ask; a second in one boot only after
        // every earlier one failed (a person asked again).
        let count = self.commands.entry(id.to_string()).or_default();
        *count += 1;
        assert!(
            *count <= 1,
            "{node}: a second reboot command for one ask ({id})"
        );
        let key = (node.to_string(), boot);
        let (run, failed) = self.boot_commands.get(&key).copied().unwrap_or_default();
        assert!(
            run == failed,
            "{node}: a second reboot command in one boot although the first did not fail"
        );
        self.count_need(node);
        let ok = !self.rng.chance(15);
        self.boot_commands
            .insert(key, (run + 1, failed + u32::from(!ok)));
        let rebooted_anyway = !ok && self.command_fails_yet_reboots();
        self.trace.push(format!(
            "{node}: reboot command, ok={ok}, rebooted anyway={rebooted_anyway}"
        ));
        if ok || rebooted_anyway {
            self.down
                .insert(node.to_string(), 1 + self.rng.below(3) as u32);
        }
        if !ok
            && let Some(follow) = crate::decide::once_per_boot::after_command(
                e,
                &Outcome::HostRan {
                    ok: false,
                    output: "exit 1".into(),
                },
            )
        {
            self.apply(who, &follow)?;
        }
        Ok(())
    }

    /// The maintenance controller uncordons a node before its last
    /// NodeMaintenance goes (the finalizer comes off last).
    pub(super) fn uncordon_free(&mut self) {
        for x in &mut self.nodes {
            let name = x.name_any();
            if !self.nms.iter().any(|m| m.spec.node_name == name)
                && self.held_by_others.get(&name) != Some(&true)
                && let Some(spec) = x.spec.as_mut()
            {
                spec.unschedulable = None;
            }
        }
    }

    pub(super) fn run(&mut self, who: &str, effects: &[Effect]) {
        self.admitted_now.clear();
        for e in effects {
            let fault = self.fault(e);
            if fault != Some(Fault::Refused) && fault != Some(Fault::Lost) {
                if let Err(why) = self.apply(who, e) {
                    self.trace.push(why);
                    return;
                }
                self.notice_written(e, fault.is_none());
            }
            // A create whose answer was lost, done on the server or not.
            if matches!(fault, Some(Fault::Lost | Fault::AppliedLost))
                && let Effect::CreateMaintenance { nm } = e
            {
                let mut m = (**nm).clone();
                m.metadata.uid = Some(format!("tentative-{}", m.name_any()));
                self.real.unanswered.push(m);
            }
            if let Some(f) = fault {
                self.trace.push(format!(
                    "{who}: {} failed ({f:?})",
                    crate::effects::describe(e),
                ));
                return;
            }
        }
    }
}
