//! Faults in the random worlds, as the real API server and hosts give
//! them: any write may be refused (409, 500, 403, a timeout) — the k-th
//! effect of a plan after earlier ones succeeded included — or may succeed
//! on the server while the client sees a timeout; a reboot command may
//! report failure while the host goes down anyway (ssh's 255 as the
//! connection drops). A refused or unanswered effect ends its plan, as
//! the executor does.
//!
//! The world is also unlike a test bench ([`RealWorld`]): a created
//! NodeMaintenance reaches the agents' stores a step later (the cluster
//! role reads its own creates through its mutation cache, those that timed
//! out included, as the executor does); each process reads its own wall clock, up to 30 s off;
//! a pod on some nodes never leaves Terminating, so their drains never
//! end; and machines reboot now and then with no one asking (a kernel
//! panic, a person at the console).
//!
//! Invariants checked here, never read from the product's status: a node
//! whose reboot or upgrade the status calls finished (Done, or Settling
//! past its settle time) is given back within a few passes whatever
//! failed meanwhile; at most one reboot command per need; and no policy
//! decision with nothing to do asks to run again within a second pass
//! after pass.

use super::*;

/// Passes a finished node may stay held before it counts as never given
/// back (each pass may fail its give-back at the fault rate).
const GIVE_BACK_PASSES: u32 = 12;
/// Decisions in a row with no effect asking for a wake-up under a second.
const QUICK_PASSES: u32 = 6;

/// What the faults did in one world (summed over all for the test's line).
#[derive(Default, Debug)]
pub(super) struct Faults {
    pub on: bool,
    pub refused: BTreeMap<&'static str, usize>,
    /// Passes in a row each finished node was still held, per owner/node.
    held: BTreeMap<String, u32>,
    /// Passes in a row a feature's NodeMaintenance held a node its live
    /// owner's status did not list, per NodeMaintenance.
    unlisted: BTreeMap<String, u32>,
    /// Wake-ups under a second with no effect, per policy.
    quick: BTreeMap<String, u32>,
    /// Reboot commands per node and need.
    per_need: BTreeMap<(String, String), u32>,
}

/// How an effect failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fault {
    /// The server refused it (409, 500, 403).
    Refused,
    /// No answer, and it did not happen.
    Lost,
    /// No answer, yet it happened.
    AppliedLost,
}

const KINDS: [&str; 4] = [
    "409 conflict",
    "500 internal error",
    "403 forbidden",
    "timeout",
];

impl Faults {
    pub(super) fn on() -> Faults {
        Faults {
            on: true,
            ..Default::default()
        }
    }
}

impl World {
    /// Should `e` fail, and how?
    pub(super) fn fault(&mut self, e: &Effect) -> Option<Fault> {
        // Events are fire-and-forget; host commands fail in their own ways
        // (`command_fails_yet_reboots`).
        if !self.faults.on || matches!(e, Effect::Event { .. } | Effect::RunHost { .. }) {
            return None;
        }
        let roll = self.rng.below(100);
        if roll < 7 {
            let kind = KINDS[self.rng.below(KINDS.len() as u64) as usize];
            *self.faults.refused.entry(kind).or_default() += 1;
            Some(if kind == "timeout" {
                Fault::Lost
            } else {
                Fault::Refused
            })
        } else if roll < 9 {
            *self
                .faults
                .refused
                .entry("applied, then timeout")
                .or_default() += 1;
            Some(Fault::AppliedLost)
        } else {
            None
        }
    }

    /// A reboot command that says it failed while the host reboots anyway.
    pub(super) fn command_fails_yet_reboots(&mut self) -> bool {
        let yes = self.faults.on && self.rng.chance(5);
        if yes {
            *self
                .faults
                .refused
                .entry("reboot failed, host rebooted")
                .or_default() += 1;
        }
        yes
    }

    /// One reboot command per need: the need it answers is counted.
    pub(super) fn count_need(&mut self, node: &str) {
        let Some(n) = self.nodes.iter().find(|n| n.name_any() == node) else {
            return;
        };
        let need = annotation(n, NEEDED_ANNOTATION)
            .unwrap_or("(marker)")
            .to_string();
        let count = self
            .faults
            .per_need
            .entry((node.to_string(), need.clone()))
            .or_default();
        *count += 1;
        assert!(
            *count <= 1,
            "{node}: a second reboot command for the need stamped {need}"
        );
    }

    /// After each step: every node the status calls finished is given
    /// back within [`GIVE_BACK_PASSES`].
    pub(super) fn check_given_back(&mut self) {
        let mut held_now = Vec::new();
        for p in &self.policies {
            let settle = p.spec.gates.settle_seconds.max(0) as i64;
            for e in p.status.iter().flat_map(|s| s.nodes.iter()) {
                let finished = match e.phase {
                    RebootPhase::Done => true,
                    // Past its settle time by the clock that wrote it.
                    RebootPhase::Settling => {
                        self.clock(CLUSTER).duration_since(e.since.0).as_secs() >= settle
                    }
                    _ => false,
                };
                let ours = self.nms.iter().any(|m| {
                    m.spec.node_name == e.name && owned_by(m, &p.name_any()) && !failed(m)
                });
                if finished && ours {
                    held_now.push(format!("RebootPolicy {} on {}", p.name_any(), e.name));
                }
            }
        }
        for p in &self.plans {
            for e in p.status.iter().flat_map(|s| s.nodes.iter()) {
                let ours = self.nms.iter().any(|m| {
                    m.spec.node_name == e.name
                        && crate::decide::disrupt::owned_by(
                            m,
                            crate::api::upgrade::OWNER_KIND,
                            &p.name_any(),
                        )
                });
                if e.phase == crate::api::upgrade::UpgradePhase::Done && ours {
                    held_now.push(format!("UpgradePlan {} on {}", p.name_any(), e.name));
                }
            }
        }
        self.faults.held.retain(|k, _| held_now.contains(k));
        for k in held_now {
            let n = self.faults.held.entry(k.clone()).or_default();
            *n += 1;
            assert!(
                *n <= GIVE_BACK_PASSES,
                "{k}: finished, yet its NodeMaintenance still holds the node after {n} passes"
            );
        }
    }

    /// Every node a feature holds is visibly held: while its owner stands,
    /// a NodeMaintenance it created (not Failed) names a node the owner's
    /// status lists, within [`GIVE_BACK_PASSES`] (a status write may be
    /// refused meanwhile). A node relabelled out of a selector mid-reboot
    /// dropped out of its policy's status while its NodeMaintenance held
    /// it cordoned for ever.
    pub(super) fn check_visibly_held(&mut self) {
        let mut unlisted = Vec::new();
        for m in self.nms.iter().filter(|m| !failed(m) && !m.is_deleting()) {
            let node = &m.spec.node_name;
            let listed = match crate::decide::maintenance::owner_of(m) {
                Some(OWNER_KIND) => self
                    .policies
                    .iter()
                    .find(|p| owned_by(m, &p.name_any()))
                    .map(|p| {
                        p.status
                            .iter()
                            .flat_map(|s| s.nodes.iter())
                            .any(|e| &e.name == node)
                    }),
                Some(crate::api::upgrade::OWNER_KIND) => self
                    .plans
                    .iter()
                    .find(|p| {
                        crate::decide::disrupt::owned_by(
                            m,
                            crate::api::upgrade::OWNER_KIND,
                            &p.name_any(),
                        )
                    })
                    .map(|p| {
                        p.status
                            .iter()
                            .flat_map(|s| s.nodes.iter())
                            .any(|e| &e.name == node)
                    }),
                _ => None,
            };
            if listed == Some(false) && self.nodes.iter().any(|n| &n.name_any() == node) {
                unlisted.push(m.name_any());
            }
        }
        self.faults.unlisted.retain(|k, _| unlisted.contains(k));
        for k in unlisted {
            let n = self.faults.unlisted.entry(k.clone()).or_default();
            *n += 1;
            assert!(
                *n <= GIVE_BACK_PASSES,
                "{k}: holds its node, yet its owner's status has not listed the node for {n} passes (held without a reason)"
            );
        }
    }

    /// A policy decision that did nothing and asked to run again within a
    /// second, over and over while the world moved on by seconds: a spin.
    pub(super) fn check_liveness(&mut self, policy: &str, plan: &Plan) {
        let quick = plan.effects.is_empty()
            && matches!(plan.then, Then::Wait(Some(d)) if d < Duration::from_secs(1));
        let n = self.faults.quick.entry(policy.to_string()).or_default();
        *n = if quick { *n + 1 } else { 0 };
        assert!(
            *n <= QUICK_PASSES,
            "policy {policy}: {n} decisions in a row with nothing to do asked to run again within a second ({:?})",
            plan.then
        );
    }
}

/// The cluster role's clock (every policy and plan pass reads it).
pub(super) const CLUSTER: &str = "(cluster role)";
/// The clock of whoever stamps a need by hand.
pub(super) const PEOPLE: &str = "(people)";

/// What makes the worlds unlike a test bench (see the module's doc).
#[derive(Default, Debug)]
pub(super) struct RealWorld {
    /// Each process's clock offset from the world's time.
    skew: BTreeMap<String, SignedDuration>,
    /// Nodes whose drains never end.
    pub stuck: std::collections::BTreeSet<String>,
    /// NodeMaintenances created in this step: not yet in any store.
    pub created_now: std::collections::BTreeSet<String>,
    /// NodeMaintenances whose create the cluster role saw time out (done
    /// on the server or not): the executor reads them as existing until
    /// its store shows them (`FreshCache::remember_created`), here for the
    /// rest of the step. Without that, a plan's create that timed out yet
    /// happened was unseen by a policy deciding next, which took the same
    /// node (world 366).
    pub unanswered: Vec<NodeMaintenance>,
}

impl World {
    /// Give the world its clocks and its stuck drains.
    pub(super) fn with_real_world(mut self) -> World {
        let mut actors: Vec<String> = self.nodes.iter().map(|n| n.name_any()).collect();
        actors.extend([CLUSTER.to_string(), PEOPLE.to_string()]);
        for a in actors {
            let skew = self.rng.below(61) as i64 - 30;
            self.real.skew.insert(a, SignedDuration::from_secs(skew));
        }
        for n in &self.nodes {
            if self.rng.chance(10) {
                self.real.stuck.insert(n.name_any());
                *self
                    .faults
                    .refused
                    .entry("nodes whose drains never end")
                    .or_default() += 1;
            }
        }
        self
    }

    /// What process `actor` reads as now.
    pub(super) fn clock(&self, actor: &str) -> Timestamp {
        let skew = self.real.skew.get(actor).copied().unwrap_or_default();
        self.now.checked_add(skew).unwrap_or(self.now)
    }

    /// The NodeMaintenances the cluster role's decisions read: its store
    /// plus what it created and saw answered.
    pub(super) fn seen_by_cluster(&self) -> Vec<Arc<NodeMaintenance>> {
        let stored = |name: &str| self.nms.iter().any(|m| m.name_any() == name);
        let tentative = self
            .real
            .unanswered
            .iter()
            .filter(|m| !stored(&m.name_any()));
        self.nms
            .iter()
            .chain(tentative)
            .cloned()
            .map(Arc::new)
            .collect()
    }

    /// The NodeMaintenances a node agent's store holds: none created in
    /// this step.
    pub(super) fn seen_by_agents(&self, node: &str) -> Vec<&NodeMaintenance> {
        let hidden = &self.real.created_now;
        self.nms
            .iter()
            .filter(|m| m.spec.node_name == node && !hidden.contains(&m.name_any()))
            .collect()
    }

    /// Now and then a machine that is up reboots with no one asking.
    pub(super) fn reboot_out_of_band(&mut self) {
        if !self.faults.on {
            return;
        }
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].name_any();
            if self.down.contains_key(&name) || !self.rng.chance(2) {
                continue;
            }
            *self
                .faults
                .refused
                .entry("rebooted out of band")
                .or_default() += 1;
            self.trace.push(format!("{name}: rebooted out of band"));
            self.down.insert(name, 1);
        }
    }
}
