//! The labels both features may set on a node (`during` marks) in the
//! random worlds: never fought over within a step (one actor setting a
//! key another removes), and none left once every object is gone.

use super::*;

/// The `during` label both features may set.
pub(super) const MARK: &str = "example.com/maintenance";

impl World {
    /// Two objects fighting over one mark: within one step, a key one
    /// actor set is removed by another actor (before ownership, every
    /// pass of a RebootPolicy holding a node and an UpgradePlan done with
    /// it did this, for as long as both stood).
    pub(super) fn watch_for_fights(&mut self, who: &str, node: &str, patch: &serde_json::Value) {
        let Some(labels) = patch["metadata"]["labels"].as_object() else {
            return;
        };
        for (k, v) in labels {
            let key = (node.to_string(), k.clone());
            if v.is_null() {
                if let Some(setter) = self.mark_writers.get(&key) {
                    assert!(
                        setter == who || who.contains("marks"),
                        "{node}: {k} set by {setter} and removed by {who} in one step (a fight)"
                    );
                }
            } else {
                self.mark_writers.insert(key, who.to_string());
            }
        }
    }

    /// After every object went: no mark of theirs on any node.
    pub(super) fn assert_no_marks_left(&self) {
        for n in &self.nodes {
            let name = n.name_any();
            assert!(!n.labels().contains_key(MARK), "{name}: {MARK} left");
            let taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            assert!(
                !taints
                    .iter()
                    .any(|t| t.key == crate::decide::marking::WAITING_TAINT),
                "{name}: a soft taint left: {taints:?}"
            );
            assert!(
                !n.annotations()
                    .keys()
                    .any(|k| k.starts_with(crate::decide::marking::OWNER_PREFIX)),
                "{name}: an owner record left"
            );
        }
    }
}
