//! DrainRules in the random maintenance worlds: each pod gets a behaviour
//! and tier from the world's own table (Drain at order -1, 0 or 3,
//! WaitCompleted, Skip), written as one DrainRule per pod or, now and then,
//! as the pod label that beats every rule. Now and then rules overlap the
//! table's without changing it, as Cluster API's order says they must not:
//! a second rule for a pod named after its own (the first in name order
//! wins), a rule for every pod named after all of them (only the pods the
//! label places are left to it, and the label wins), and a rule for every
//! pod named before all of them that applies only on other nodes. Every
//! such decoy says "Drain at order -5", so a decoy that wrongly won would
//! evict a pod the table keeps, or before a lower tier is gone, which the
//! invariants catch. The drain must read the same table back from the
//! rules: the invariants are checked against the table, never against the
//! product's placement.

use std::collections::HashMap;

use super::*;
use crate::api::drain_rule::{Behavior, DRAIN_LABEL, DrainRule, DrainRuleNodes};
use crate::decide::reboot::tests::world_tools::Rng;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The world's table and the rules that encode it.
#[derive(Debug, Default)]
pub(super) struct WorldRules {
    pub(super) book: RuleBook,
    /// Pod UID → its behaviour and order, as the world means them.
    table: HashMap<String, (Behavior, i32)>,
}

impl WorldRules {
    /// A table for `pods` (relabelled `app=<name>`, or the skip label) and
    /// its rules, in random name order.
    pub(super) fn random(rng: &mut Rng, pods: &mut [Arc<Pod>]) -> WorldRules {
        let mut w = WorldRules::default();
        for (i, pod) in pods.iter_mut().enumerate() {
            let (behavior, order) = match rng.below(100) {
                0..25 => (Behavior::Drain, -1),
                25..50 => (Behavior::Drain, 0),
                50..70 => (Behavior::Drain, 3),
                70..85 => (Behavior::WaitCompleted, 0),
                _ => (Behavior::Skip, 0),
            };
            let mut p = (**pod).clone();
            let name = p.metadata.name.clone().unwrap_or_default();
            let labels = p.metadata.labels.get_or_insert_default();
            if behavior == Behavior::Skip && rng.chance(50) {
                labels.insert(DRAIN_LABEL.into(), "skip".into());
            } else {
                labels.insert("app".into(), name.clone());
                w.book.rules.push(Arc::new(rule(
                    &format!("r{}-{i}", rng.below(1000)),
                    &name,
                    behavior,
                    order,
                )));
                if rng.chance(20) {
                    // After every "r…" name: the pod's own rule wins.
                    w.book
                        .rules
                        .push(Arc::new(decoy(&format!("s-{i}"), Some(&name))));
                }
            }
            w.table.insert(
                p.metadata.uid.clone().unwrap_or_default(),
                (behavior, order),
            );
            *pod = Arc::new(p);
        }
        if rng.chance(50) {
            // Every pod, after every other name: left only the labelled.
            w.book.rules.push(Arc::new(decoy("zz-every-pod", None)));
        }
        if rng.chance(50) {
            // Every pod, before every other name, but on other nodes only.
            let mut elsewhere = decoy("a-other-nodes", None);
            elsewhere.spec.nodes = Some(vec![DrainRuleNodes {
                selector: Some(LabelSelector {
                    match_labels: Some(
                        [("world.nodekeeper.io/elsewhere".into(), "true".into())].into(),
                    ),
                    ..Default::default()
                }),
            }]);
            w.book.rules.push(Arc::new(elsewhere));
        }
        w
    }

    fn of(&self, pod: &Pod) -> (Behavior, i32) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.table.get(uid).copied().unwrap_or((Behavior::Drain, 0))
    }

    /// Is this pod waited for by the world's reading (a WaitCompleted pod
    /// only until it has finished)?
    fn waited(&self, pod: &Pod) -> bool {
        match self.of(pod).0 {
            Behavior::Skip => false,
            Behavior::WaitCompleted => !finished(pod),
            Behavior::Drain => true,
        }
    }

    /// Removals the world's table forbids: a Skip or WaitCompleted pod, or
    /// a pod while one of a lower order is still waited for. (The worlds'
    /// drains have no Force deadline.)
    pub(super) fn check(&self, removed: &[(Arc<Pod>, Fate)], present: &[Arc<Pod>]) {
        for (pod, fate) in removed {
            let (behavior, order) = self.of(pod);
            assert!(
                behavior == Behavior::Drain,
                "{} removed ({fate:?}) though its rule says {behavior:?}",
                pod.name_any()
            );
            let lower = present
                .iter()
                .filter(|p| self.waited(p))
                .find(|p| self.of(p).1 < order);
            assert!(
                lower.is_none(),
                "{} (order {order}) removed while {} (order {}) is still there",
                pod.name_any(),
                lower.map(|p| p.name_any()).unwrap_or_default(),
                lower.map(|p| self.of(p).1).unwrap_or_default()
            );
        }
    }

    /// A WaitCompleted pod finishes by itself now and then.
    pub(super) fn finish_some<'p>(
        &self,
        rng: &mut Rng,
        pods: impl Iterator<Item = &'p mut Arc<Pod>>,
    ) {
        for pod in pods {
            if self.of(pod).0 == Behavior::WaitCompleted && !finished(pod) && rng.chance(10) {
                let mut p = (**pod).clone();
                p.status = Some(PodStatus {
                    phase: Some("Succeeded".into()),
                    ..Default::default()
                });
                *pod = Arc::new(p);
            }
        }
    }
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A rule that must lose (see the module's comment): the pods labelled
/// `app=<app>`, or every pod; Drain at order -5, the first tier.
fn decoy(name: &str, app: Option<&str>) -> DrainRule {
    let mut r = rule(name, app.unwrap_or_default(), Behavior::Drain, -5);
    if app.is_none() {
        r.spec.pods = None;
    }
    r
}

fn rule(name: &str, app: &str, behavior: Behavior, order: i32) -> DrainRule {
    let order = (behavior == Behavior::Drain).then_some(order);
    crate::decide::drain_rules::tests::app_rule(name, app, behavior, order)
}
