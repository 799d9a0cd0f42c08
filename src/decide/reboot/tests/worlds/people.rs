//! What people do in the random worlds, between decisions: ask for a
//! node's reboot, pause or unpause one, withdraw a need, and create or
//! delete an administrator's NodeMaintenance (some ending Failed at once),
//! delete a node.

use super::*;

impl World {
    pub(super) fn people(&mut self) {
        // Someone asks for a reboot of a node.
        if self.rng.chance(20) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            // Stamped by the person's own clock (`reboot-required`).
            let stamp = self.clock(super::faults::PEOPLE).to_string();
            let n = &mut self.nodes[i];
            let boot = boot_id(n).map(str::to_string);
            let a = n.metadata.annotations.get_or_insert_with(Default::default);
            a.insert(NEEDED_ANNOTATION.into(), stamp);
            // As `reboot-required` does, with the boot the need is stamped
            // in. (A hand-written annotation without it is compared by the
            // clocks; with skewed clocks and reboots nobody asked for that
            // cannot promise one reboot per need, and the unit tests
            // cover it.)
            if let Some(boot) = boot {
                a.insert(crate::api::reboot::NEEDED_BOOT_ANNOTATION.into(), boot);
            }
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
            } else if !self
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
        // A node is deleted now and then (scaled in, or replaced by hand),
        // whatever holds it; what held it must be given back.
        if self.nodes.len() > 1 && self.rng.chance(2) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            let gone = self.nodes.remove(i).name_any();
            self.down.remove(&gone);
            self.trace.push(format!("node {gone} deleted"));
        }
    }
}
