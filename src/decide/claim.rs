//! One node agent per node. Each agent process claims its node with the
//! annotation `nodekeeper.io/agent` (who it is, its PID, when it started).
//! An agent that finds its claim replaced learns that another agent started
//! for the same node — two agents drain and reboot one node independently
//! of each other — and says so, once per other claim, in its log and an
//! Event on the node. It never claims back, so two agents never fight over
//! the annotation; a claim left by an agent that has gone is simply taken.

use crate::api::node::Node;
use serde_json::json;

use super::Effect;
use super::disrupt::node_ref;
use kube::ResourceExt;

pub const AGENT_ANNOTATION: &str = "nodekeeper.io/agent";
pub const ANOTHER_AGENT: &str = "AnotherAgent";

/// What an agent knows of its claim.
#[derive(Debug, Default)]
pub struct Claim {
    /// Its claim was written (the annotation named it once).
    pub claimed: bool,
    /// Other claims already reported.
    pub reported: Vec<String>,
}

/// The effects for the agent `me` on its `node` as seen now: claim it
/// while unclaimed, report another claim that replaced ours once.
pub fn decide(node: &Node, me: &str, state: &mut Claim) -> Vec<Effect> {
    match node.annotations().get(AGENT_ANNOTATION) {
        Some(current) if current == me => {
            state.claimed = true;
            Vec::new()
        }
        Some(other) if state.claimed => {
            if state.reported.contains(other) {
                return Vec::new();
            }
            state.reported.push(other.clone());
            vec![Effect::Event {
                object: node_ref(node),
                warning: true,
                reason: ANOTHER_AGENT,
                note: format!(
                    "another nodekeeper agent runs for this node ({other}) beside this one ({me}): each drains and reboots it on its own; stop one"
                ),
            }]
        }
        _ => vec![Effect::PatchNode {
            node: node.name_any(),
            resource_version: None,
            patch: json!({"metadata": {"annotations": {AGENT_ANNOTATION: me}}}),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(claim: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("a".into());
        if let Some(c) = claim {
            n.metadata.annotations = Some([(AGENT_ANNOTATION.to_string(), c.to_string())].into());
        }
        n
    }

    #[test]
    fn an_agent_claims_once_and_reports_each_other_claim_once() {
        let mut s = Claim::default();
        let claim = decide(&node(None), "me", &mut s);
        assert!(matches!(&claim[..], [Effect::PatchNode { .. }]));
        // A dead agent's claim is taken, not reported.
        assert!(matches!(
            &decide(&node(Some("gone")), "me", &mut s)[..],
            [Effect::PatchNode { .. }]
        ));
        assert!(decide(&node(Some("me")), "me", &mut s).is_empty());
        let report = decide(&node(Some("other")), "me", &mut s);
        assert!(matches!(
            &report[..],
            [Effect::Event { reason: ANOTHER_AGENT, note, .. }] if note.contains("(other)")
        ));
        assert!(
            decide(&node(Some("other")), "me", &mut s).is_empty(),
            "reported once"
        );
        assert_eq!(decide(&node(Some("third")), "me", &mut s).len(), 1);
        // Never claimed back from another agent; a claim a person removed
        // is simply written again.
        assert!(
            !decide(&node(Some("fourth")), "me", &mut s)
                .iter()
                .any(|e| matches!(e, Effect::PatchNode { .. }))
        );
    }
}
