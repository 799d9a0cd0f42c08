//! Pods that opt out of disruption in the random worlds: now and then a
//! person starts a pod with Karpenter's `karpenter.sh/do-not-disrupt` on a
//! node (`"true"`, or a duration of 10-60 s since it started) and takes it
//! off again later; and the cluster role's read of a node's pods fails now
//! and then (the answer is `None`: not read).
//!
//! Invariant, checked on every decision of a RebootPolicy or an
//! UpgradePlan (stale copies too), by the world's own reading of the
//! annotation at the deciding clock: no node is admitted, and no feature's
//! NodeMaintenance is created, while such a pod holds the node or while
//! its pods could not be read.

use super::*;

#[derive(Default)]
pub(super) struct OptedOut {
    /// The opted-out pod on each node: its value and when it started.
    pods: BTreeMap<String, (String, Timestamp)>,
    /// The pods of these nodes are not read in this step.
    unread: std::collections::BTreeSet<String>,
    /// Opted-out pods started.
    pub(super) started: usize,
    /// Nodes admitted that had held an earlier admission back (the pod
    /// taken off, or its duration over): the hold ends, not for ever.
    pub(super) taken_after: usize,
    /// Nodes held back at some decision.
    held_back: std::collections::BTreeSet<String>,
}

impl OptedOut {
    /// Does the pod on `node` hold it at `now`, by the world's own reading
    /// (`"true"` while it runs; `"Ns"` until N seconds after it started)?
    fn holds(&self, node: &str, now: Timestamp) -> bool {
        let Some((value, started)) = self.pods.get(node) else {
            return false;
        };
        if value == "true" {
            return true;
        }
        let secs: i64 = value.trim_end_matches('s').parse().unwrap_or(0);
        started
            .checked_add(SignedDuration::from_secs(secs))
            .is_ok_and(|until| now < until)
    }

    /// What the service would answer for the pods of `node`.
    pub(super) fn pods_of(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        if self.unread.contains(node) {
            return None;
        }
        Some(
            self.pods
                .get(node)
                .map(|(value, started)| {
                    vec![crate::decide::do_not_disrupt::tests::opted_out_pod(
                        "keep",
                        node,
                        value,
                        "Running",
                        Some(*started),
                    )]
                })
                .unwrap_or_default(),
        )
    }
}

impl World {
    /// A person starts an opted-out pod, or takes one off; reads of some
    /// nodes' pods fail in the next step.
    pub(super) fn opted_out_pods_change(&mut self) {
        if self.rng.chance(12) {
            let i = self.rng.below(self.nodes.len() as u64) as usize;
            let node = self.nodes[i].name_any();
            let value = match self.rng.below(3) {
                0 => "true".to_string(),
                _ => format!("{}s", 10 + 10 * self.rng.below(6)),
            };
            self.trace
                .push(format!("{node}: a pod with do-not-disrupt={value}"));
            self.opted.pods.insert(node, (value, self.now));
            self.opted.started += 1;
        }
        if !self.opted.pods.is_empty() && self.rng.chance(10) {
            let i = self.rng.below(self.opted.pods.len() as u64) as usize;
            if let Some(node) = self.opted.pods.keys().nth(i).cloned() {
                self.trace.push(format!("{node}: the opted-out pod goes"));
                self.opted.pods.remove(&node);
            }
        }
        self.opted.unread = self
            .nodes
            .iter()
            .map(|n| n.name_any())
            .filter(|_| self.rng.chance(5))
            .collect();
    }

    /// The decision of `who`, taken at `now`, admitted no node and created
    /// no NodeMaintenance of a feature on a node an opted-out pod held or
    /// whose pods were not read.
    pub(super) fn check_opted_out(&mut self, who: &str, now: Timestamp, effects: &[Effect]) {
        for e in effects {
            let node = match e {
                Effect::Event { object, reason, .. }
                    if (*reason == "RebootAdmitted" || *reason == "UpgradeAdmitted")
                        && object.kind.as_deref() == Some("Node") =>
                {
                    object.name.clone().unwrap_or_default()
                }
                Effect::CreateMaintenance { nm } if !nm.name_any().starts_with("admin-") => {
                    nm.spec.node_name.clone()
                }
                _ => continue,
            };
            let held = self.opted.holds(&node, now);
            assert!(
                !held && !self.opted.unread.contains(&node),
                "{who} took {node} while {}",
                match held {
                    true => format!("its pod held it: {:?}", self.opted.pods.get(&node)),
                    false => "its pods were not read".to_string(),
                }
            );
            if matches!(e, Effect::Event { .. }) && self.opted.held_back.remove(&node) {
                self.opted.taken_after += 1;
            }
        }
        // Nodes that would have been candidates and were held: recorded
        // so a later admission counts as the hold ending.
        let now_held: Vec<String> = self
            .opted
            .pods
            .keys()
            .filter(|n| self.opted.holds(n, now))
            .cloned()
            .collect();
        self.opted.held_back.extend(now_held);
    }
}
