//! The two roles of the one loop. The **node role** (`run --node`, the
//! default) owns one node: it watches that Node and the pods bound to it
//! and does the node-local work. The **cluster role** (`run --all-nodes`,
//! one leader-elected replica) watches every node and is the single writer
//! of cluster-wide decisions; today it drains every node it selects, and it
//! is where admissions within budgets, Jobs and replacement will live.
//!
//! Both look after NodeMaintenances that no agent owns (see
//! `decide::foreign`) from one **anchor** node's reconcile: the own node in
//! the node role, the first node by name in the cluster role.

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use k8s_openapi::api::core::v1::Node;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::decide::foreign;

/// Which nodes this process reconciles.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// Node role: exactly this node.
    Node(String),
    /// Cluster role: every node (one leader-elected replica), or only those
    /// matching a label selector.
    AllNodes { selector: Option<String> },
}

impl Scope {
    /// Does our node store hold every node of the cluster, so that absence
    /// from it proves a node does not exist?
    pub fn sees_all_nodes(&self) -> bool {
        matches!(self, Scope::AllNodes { selector: None })
    }

    /// Who we are for jitter: the own node, or the cluster role.
    pub fn agent(&self) -> &str {
        match self {
            Scope::Node(n) => n,
            Scope::AllNodes { .. } => "cluster",
        }
    }
}

/// The anchor node's name, if there is one yet.
pub fn anchor(scope: &Scope, nodes: &Store<Node>) -> Option<String> {
    match scope {
        Scope::Node(n) => Some(n.clone()),
        Scope::AllNodes { .. } => nodes.state().iter().map(|n| n.name_any()).min(),
    }
}

/// A NodeMaintenance triggers its node; one whose node is not ours (or does
/// not exist) may need someone to fail or finish it: the anchor node does.
pub fn map_maintenance(
    nm: &NodeMaintenance,
    scope: &Scope,
    nodes: &Store<Node>,
) -> Option<ObjectRef<Node>> {
    let target = &nm.spec.node_name;
    match scope {
        Scope::Node(own) if own == target => Some(ObjectRef::new(own)),
        Scope::Node(own) => foreign::needs_attention(nm).then(|| ObjectRef::new(own)),
        Scope::AllNodes { .. } => {
            if nodes.get(&ObjectRef::new(target)).is_some() {
                Some(ObjectRef::new(target))
            } else if foreign::needs_attention(nm) {
                anchor(scope, nodes).map(|a| ObjectRef::new(&a))
            } else {
                None
            }
        }
    }
}
