//! What admissions read off a Node: its boot ID, Ready, schedulable, and
//! a reference to it for events.

use crate::api::node::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;

/// The node's current boot ID, as its kubelet reports it.
pub fn boot_id(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.boot_id.as_str())
        .filter(|b| !b.is_empty())
}

pub use crate::decide::node_ready as ready;

pub fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

pub fn node_ref(node: &Node) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.name_any()),
        uid: node.metadata.uid.clone(),
        ..Default::default()
    }
}

/// Talos's annotation on a node it cordoned itself (it uncordons only
/// those: `../shared/compat/talos.md`).
pub const TALOS_CORDONED: &str = "talos.dev/cordoned";

/// The node condition a kubelet's graceful shutdown (or whoever shuts the
/// node down) sets `True` (KEP-5683).
pub const GRACEFUL_SHUTDOWN: &str = "GracefulNodeShutdownInProgress";

/// Karpenter's opt-out ([`crate::decide::do_not_disrupt`]).
pub use crate::decide::do_not_disrupt::ANNOTATION as DO_NOT_DISRUPT;

/// Why a node is held by someone else: a person's or another tool's hold
/// ([`foreign_holder`]).
pub const WAIT_HELD_BY_OTHER: &str = "HeldByOther";
/// Why a node is held by `karpenter.sh/do-not-disrupt` on it.
pub const WAIT_DO_NOT_DISRUPT: &str = "DoNotDisrupt";

/// Who else holds the node, if anyone, as a reason and a message:
/// `karpenter.sh/do-not-disrupt: "true"` on it (`DoNotDisrupt`); or
/// (`HeldByOther`) it is shutting down
/// (`GracefulNodeShutdownInProgress=True`), someone else drains it
/// (`DrainInProgress=True` with a reason nodekeeper did not write, such as
/// `kubectl drain --report-node-conditions`' `KubectlDrain*`), or someone
/// else cordoned it (unschedulable, and no NodeMaintenance of ours applied:
/// a person, `kubectl drain`, Talos). A feature never takes such a node,
/// and nodekeeper never uncordons what it did not cordon. The writers'
/// reasons are untrusted text: only a short, plain token of each is shown.
pub fn foreign_holder(node: &Node) -> Option<(&'static str, String)> {
    if crate::decide::do_not_disrupt::node_holds(node) {
        let msg = format!("{DO_NOT_DISRUPT}=true on the node; left alone while it is there");
        return Some((WAIT_DO_NOT_DISRUPT, msg));
    }
    held_by_other(node).map(|who| (WAIT_HELD_BY_OTHER, who))
}

fn held_by_other(node: &Node) -> Option<String> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let true_ = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
    };
    if let Some(c) = true_(GRACEFUL_SHUTDOWN) {
        return Some(format!(
            "the node is shutting down ({GRACEFUL_SHUTDOWN}=True, reason {})",
            token(c.reason.as_deref())
        ));
    }
    if let Some(c) = true_(crate::decide::node_conditions::DRAIN_IN_PROGRESS)
        .filter(|c| !crate::decide::node_conditions::is_ours(c))
    {
        return Some(format!(
            "someone else drains the node (DrainInProgress=True, reason {})",
            token(c.reason.as_deref())
        ));
    }
    let ours = node
        .annotations()
        .contains_key(crate::api::nodemaintenance::APPLIED_ANNOTATION);
    if unschedulable(node) && !ours {
        let who = if node.annotations().contains_key(TALOS_CORDONED) {
            "Talos"
        } else {
            "someone else (a person or kubectl drain)"
        };
        return Some(format!("cordoned by {who}; left to them"));
    }
    None
}

/// A foreign writer's reason as a log-safe token: letters, digits and
/// `._-:` only, at most 64 characters.
fn token(reason: Option<&str>) -> String {
    let clean: String = reason
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-:".contains(*c))
        .take(64)
        .collect();
    if clean.is_empty() {
        "unset".into()
    } else {
        clean
    }
}
