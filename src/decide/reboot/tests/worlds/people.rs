//! What people do in the random worlds, between decisions: ask for a
//! node's reboot, pause or unpause one, withdraw a need, and create or
//! delete an administrator's NodeMaintenance (some ending Failed at once),
//! relabel a node into the other pool, delete a node; and someone else —
//! a person with `kubectl cordon`, another drainer writing the KEP's
//! `DrainInProgress`, a person's `karpenter.sh/do-not-disrupt` — holds a
//! node for a while, which no feature may take meanwhile (`HeldByOther`,
//! `DoNotDisrupt`).

use super::*;

impl World {
    pub(super) fn people(&mut self) {
        // Someone asks for a reboot of a node, exactly as
        // `reboot-required` does (also after a failure, also twice): a
        // new ask stamped with the boot, the last failure cleared, or
        // nothing while its reboot is under way. (A hand-written
        // annotation without the boot is compared by the clocks; with
        // skewed clocks and reboots nobody asked for that cannot promise
        // one reboot per need, and the unit tests cover it.)
        if self.rng.chance(20) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            // Stamped by the person's own clock.
            let stamp = self.clock(super::faults::PEOPLE).to_string();
            if let Ok(patch) = crate::decide::reboot::facts::ask_again(&self.nodes[i], &stamp) {
                let mut v = serde_json::to_value(&self.nodes[i]).unwrap_or_default();
                merge(&mut v, &patch);
                if let Ok(n) = serde_json::from_value(v) {
                    self.nodes[i] = n;
                }
                self.asked_again += 1;
            }
        }
        if self.rng.chance(5) {
            self.someone_else();
        }
        // A person deletes a running Job to stop it.
        if self.rng.chance(25) {
            self.delete_a_job();
        }
        // A person pauses or unpauses a node's reboots, or withdraws its
        // need (`reboot-required --clear`).
        if self.rng.chance(6) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            let a = self.nodes[i]
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            if a.remove(crate::api::reboot::PAUSED_ANNOTATION).is_none() {
                a.insert(crate::api::reboot::PAUSED_ANNOTATION.into(), "true".into());
            }
        }
        if self.rng.chance(4) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            if let Some(a) = self.nodes[i].metadata.annotations.as_mut() {
                a.remove(NEEDED_ANNOTATION);
            }
        }
        // An administrator's maintenance comes or goes.
        if self.rng.chance(8) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            let node = self.nodes[i].name_any();
            let admin = format!("admin-{node}");
            if self.nms.iter().any(|m| m.name_any() == admin) {
                self.nms.retain(|m| m.name_any() != admin);
                self.uncordon_free();
            } else if !self.held_by_others.contains_key(&node)
                && !self
                    .nms
                    .iter()
                    .any(|m| m.spec.node_name == node && !failed(m))
            {
                let mut m = NodeMaintenance::new(
                    &admin,
                    NodeMaintenanceSpec {
                        node_name: node,
                        reason: Some("admin".into()),
                    },
                );
                m.metadata.uid = Some(format!("uid-{admin}"));
                // Some end Failed at once (invalid drain options): they
                // must hold nothing.
                if self.rng.chance(30) {
                    m.status = Some(NodeMaintenanceStatus {
                        phase: Some(Phase::Failed),
                        ..Default::default()
                    });
                }
                self.nms.push(m);
            }
        }
        // A person relabels a node into the other pool, whatever holds it
        // (policies and plans select by pool).
        if self.rng.chance(3) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            let labels = self.nodes[i]
                .metadata
                .labels
                .get_or_insert_with(Default::default);
            let other = if labels.get("pool").map(String::as_str) == Some("a") {
                "b"
            } else {
                "a"
            };
            labels.insert("pool".into(), other.into());
            let name = self.nodes[i].name_any();
            self.trace
                .push(format!("node {name} relabelled into pool {other}"));
        }
        // A node is deleted now and then (scaled in, or replaced by hand),
        // whatever holds it; what held it must be given back.
        if self.nodes.len() > 1 && self.rng.chance(2) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            let gone = self.nodes.remove(i).name_any();
            self.down.remove(&gone);
            self.held_by_others.remove(&gone);
            self.trace.push(format!("node {gone} deleted"));
        }
    }
}

impl World {
    /// Someone else takes a node nothing holds, or lets one go: a person
    /// cordons it by hand, or another drainer marks it `DrainInProgress`
    /// (reason `OtherDrainer`, not nodekeeper's message).
    fn someone_else(&mut self) {
        let i = self.rng.below(self.nodes.len() as u64) as usize;
        let name = self.nodes[i].name_any();
        if self.held_by_others.contains_key(&name) {
            self.let_go(i);
            return;
        }
        if self.nms.iter().any(|m| m.spec.node_name == name) {
            return;
        }
        let how = self.rng.below(3);
        let by_hand = how == 0;
        if by_hand {
            if let Some(spec) = self.nodes[i].spec.as_mut() {
                spec.unschedulable = Some(true);
            }
        } else if how == 2 {
            let a = self.nodes[i].metadata.annotations.get_or_insert_default();
            a.insert(
                crate::decide::do_not_disrupt::ANNOTATION.into(),
                "true".into(),
            );
        } else if let Some(c) = self.nodes[i]
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
        {
            c.push(k8s_openapi::api::core::v1::NodeCondition {
                type_: crate::decide::node_conditions::DRAIN_IN_PROGRESS.into(),
                status: "True".into(),
                reason: Some("OtherDrainer".into()),
                message: Some("drained by another tool".into()),
                ..Default::default()
            });
        }
        self.held_by_others.insert(name.clone(), by_hand);
        self.others_took += 1;
        self.trace.push(format!(
            "node {name} held by someone else ({})",
            ["cordoned", "DrainInProgress", "do-not-disrupt"][how as usize]
        ));
    }

    /// Someone else lets node `i` go: uncordoned, or its condition gone.
    fn let_go(&mut self, i: usize) {
        let name = self.nodes[i].name_any();
        self.held_by_others.remove(&name);
        if let Some(a) = self.nodes[i].metadata.annotations.as_mut() {
            a.remove(crate::decide::do_not_disrupt::ANNOTATION);
        }
        if let Some(c) = self.nodes[i]
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
        {
            c.retain(|c| c.type_ != crate::decide::node_conditions::DRAIN_IN_PROGRESS);
        }
        // `kubectl uncordon`, unless a NodeMaintenance holds the node
        // meanwhile (then the next settle keeps it cordoned).
        let held = self
            .nms
            .iter()
            .any(|m| m.spec.node_name == name && !failed(m));
        if !held && let Some(spec) = self.nodes[i].spec.as_mut() {
            spec.unschedulable = None;
        }
        self.trace
            .push(format!("node {name} let go by someone else"));
    }

    /// At the end of a world, everyone else lets go.
    pub(super) fn others_let_go(&mut self) {
        for i in 0..self.nodes.len() {
            if self.held_by_others.contains_key(&self.nodes[i].name_any()) {
                self.let_go(i);
            }
        }
        self.held_by_others.clear();
    }
}
