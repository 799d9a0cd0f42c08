//! The cluster role's own node in the random worlds. In some worlds the
//! cluster role runs on `n0`, and whether it may take that node changes as
//! its replicas come and go (`OwnNode`): not read yet, free (a replica
//! elsewhere, or nowhere else it could ever run), held (nothing would run
//! it meanwhile), or free only for a feature whose agent gives the node
//! back, because the drain evicts its only pod (`Evicted`).
//!
//! Invariant, checked on every decision (also one taken on a stale copy):
//! no feature admits that node while the answer is unknown or held, and an
//! upgrade never while it is `Evicted` — only a reboot, whose node agent
//! gives the node back after the new boot.

use super::*;
use crate::decide::rollout::OwnNode;

pub(super) struct Own {
    /// The node the cluster role runs on, in the worlds where it runs on one.
    node: Option<String>,
    /// What the service would answer about it now.
    answer: OwnNode,
    /// Admissions of that node, and decisions that let it wait for it.
    pub(super) taken: usize,
    pub(super) waited: usize,
}

impl Own {
    pub(super) fn none() -> Own {
        Own {
            node: None,
            answer: OwnNode::NotOurs,
            taken: 0,
            waited: 0,
        }
    }

    /// What `own_node` answers for `node`.
    pub(super) fn of(&self, node: &str) -> OwnNode {
        match &self.node {
            Some(own) if own == node => self.answer.clone(),
            _ => OwnNode::NotOurs,
        }
    }
}

impl World {
    /// In half the worlds the cluster role runs on `n0`.
    pub(super) fn with_own_node(mut self) -> World {
        if self.rng.chance(50) {
            self.own.node = Some("n0".into());
            self.change_own_answer();
        }
        self
    }

    /// Replicas come and go: now and then the answer changes.
    pub(super) fn own_node_moves(&mut self) {
        if self.own.node.is_some() && self.rng.chance(30) {
            self.change_own_answer();
        }
    }

    fn change_own_answer(&mut self) {
        self.own.answer = match self.rng.below(20) {
            0..3 => OwnNode::Unknown,
            3..11 => OwnNode::Free,
            11..15 => OwnNode::Held("no replica runs on another node".into()),
            _ => OwnNode::Evicted("pinned to this node; the drain evicts its pod".into()),
        };
    }

    /// The decision of `who` (a RebootPolicy's pass when
    /// `agent_gives_back`, an UpgradePlan's otherwise) admitted the
    /// cluster role's node only when the answer allowed it.
    pub(super) fn check_own_node(&mut self, who: &str, agent_gives_back: bool, effects: &[Effect]) {
        let Some(own) = self.own.node.clone() else {
            return;
        };
        let admitted = effects.iter().any(|e| {
            matches!(e, Effect::Event { object, reason, .. }
                if (*reason == "RebootAdmitted" || *reason == "UpgradeAdmitted")
                    && object.kind.as_deref() == Some("Node")
                    && object.name.as_deref() == Some(own.as_str()))
        });
        let allowed = match &self.own.answer {
            OwnNode::NotOurs | OwnNode::Free => true,
            OwnNode::Evicted(_) => agent_gives_back,
            OwnNode::Unknown | OwnNode::Held(_) => false,
        };
        if admitted {
            assert!(
                allowed,
                "{who} admitted {own}, the cluster role's node, while it answered {:?}",
                self.own.answer
            );
            self.own.taken += 1;
        } else if !allowed {
            self.own.waited += 1;
        }
    }
}
