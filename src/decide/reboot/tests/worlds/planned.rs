//! MaintenancePlanned in the random worlds: the cluster role's pass
//! (`node_conditions::planned`) runs as one more actor on the features'
//! records, its patches merged by type as the API server does. Checked by
//! the world: it never changes a condition someone else set (an
//! administrator sets `MaintenancePlanned=True` on a node now and then),
//! a second pass on the same world writes nothing (no write churn), and
//! once every policy and plan is gone no node says it is planned.

use super::*;
use crate::api::nodemaintenance::MAINTENANCE_PLANNED;
use crate::decide::maintenance::tests_support::apply_conditions;
use crate::decide::node_conditions::planned;
use k8s_openapi::api::core::v1::NodeCondition;

/// The administrator's own MaintenancePlanned (not ours: no prefix).
const ADMIN_MESSAGE: &str = "rack 4 power work on Friday";

fn planned_condition(n: &Node) -> Option<&NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == MAINTENANCE_PLANNED)
}

fn ours_true(n: &Node) -> bool {
    planned_condition(n).is_some_and(|c| {
        c.status == "True" && c.message.as_deref().is_some_and(|m| m != ADMIN_MESSAGE)
    })
}

impl World {
    /// The planned pass, then the same pass again on its result.
    pub(super) fn planned_pass(&mut self) {
        let effects = self.planned_effects();
        let admins: Vec<(String, NodeCondition)> = self
            .nodes
            .iter()
            .filter_map(|n| {
                let c = planned_condition(n)?;
                (c.message.as_deref() == Some(ADMIN_MESSAGE)).then(|| (n.name_any(), c.clone()))
            })
            .collect();
        for e in &effects {
            let Effect::PatchNodeStatus { node, patch } = e else {
                panic!("planned pass: unexpected effect {e:?}");
            };
            if let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == *node) {
                apply_conditions(n, patch);
                self.trace.push(format!("{node}: planned {patch}"));
                if ours_true(n) {
                    self.planned_writes.0 += 1;
                } else {
                    self.planned_writes.1 += 1;
                }
            }
        }
        for (node, before) in admins {
            let now = self.nodes.iter().find(|n| n.name_any() == node);
            assert_eq!(
                now.and_then(planned_condition),
                Some(&before),
                "the planned pass changed {node}'s administrator-set MaintenancePlanned"
            );
        }
        let again = self.planned_effects();
        assert!(
            again.is_empty(),
            "a second planned pass on the same world wrote again: {again:?}"
        );
    }

    fn planned_effects(&self) -> Vec<Effect> {
        let wanted = planned::planned(&Self::arcs(&self.policies), &Self::arcs(&self.plans), &[]);
        planned::effects(
            &Self::arcs(&self.nodes),
            &wanted,
            &|_| false,
            self.clock(super::faults::CLUSTER),
        )
    }

    /// Now and then an administrator plans work on a node themselves, or
    /// withdraws it.
    pub(super) fn admin_plans(&mut self) {
        if !self.rng.chance(5) {
            return;
        }
        let i = self.rng.below(self.nodes.len() as u64) as usize;
        let n = &mut self.nodes[i];
        let admin =
            planned_condition(n).is_some_and(|c| c.message.as_deref() == Some(ADMIN_MESSAGE));
        if admin {
            if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
                c.retain(|c| c.type_ != MAINTENANCE_PLANNED);
            }
        } else if planned_condition(n).is_none_or(|c| c.status != "True") {
            let patch = serde_json::json!({"status": {"conditions": [{
                "type": MAINTENANCE_PLANNED, "status": "True",
                "reason": "RackWork", "message": ADMIN_MESSAGE,
            }]}});
            apply_conditions(n, &patch);
        }
    }

    /// After everything went: nothing of ours says planned.
    pub(super) fn assert_nothing_planned(&mut self) {
        self.planned_pass();
        let left: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| ours_true(n))
            .map(|n| n.name_any())
            .collect();
        assert!(
            left.is_empty(),
            "still MaintenancePlanned after every policy and plan went: {left:?}"
        );
    }
}
