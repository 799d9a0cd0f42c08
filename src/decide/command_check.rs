//! Can a node's agent run the commands a policy would have it run? Asked
//! before the node is taken, never after: a reboot or upgrade command that
//! does not exist on the host (the maintenance-only install has no
//! `systemctl`, a typo in an UpgradePlan) used to drain the node first and
//! then fail, leaving it in maintenance. The agent looks at its host and
//! records the answer on its node under one annotation per feature
//! (`<object>/<generation>/<uid8> ok` or `… cannot run: why`); the cluster
//! role admits only a node whose agent said `ok` for the object's current
//! spec. Pure: the look itself is `effects::host::can_run`.

use crate::api::node::Node;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Effect;
use super::maintenance::annotation;

/// What a node's agent said about an object's commands on its host.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// Not (yet) said for the object's current spec.
    Unchecked,
    Runnable,
    /// Why not (a missing program, one that is not executable).
    NotRunnable(String),
}

/// What a check is of: the object's name, spec generation and uid (one
/// re-created under the same name is checked afresh).
pub fn key<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    let uid = meta.uid.as_deref().unwrap_or_default();
    format!(
        "{}/{}/{}",
        meta.name.as_deref().unwrap_or_default(),
        meta.generation.unwrap_or_default(),
        uid.get(..8).unwrap_or(uid)
    )
}

/// The check of `key` as recorded on `node` under `annotation_key`.
pub fn recorded(node: &Node, annotation_key: &str, key: &str) -> Check {
    let Some(rest) = annotation(node, annotation_key).and_then(|v| v.strip_prefix(key)) else {
        return Check::Unchecked;
    };
    match rest.strip_prefix(' ') {
        Some("ok") => Check::Runnable,
        Some(r) => Check::NotRunnable(r.strip_prefix("cannot run: ").unwrap_or(r).to_string()),
        None => Check::Unchecked,
    }
}

/// Record the agent's answer on its node, unless it says so already (one
/// key of our own: no guard).
pub fn record(
    node: &Node,
    annotation_key: &'static str,
    key: &str,
    answer: &Result<(), String>,
) -> Option<Effect> {
    let value = match answer {
        Ok(()) => format!("{key} ok"),
        Err(why) => format!("{key} cannot run: {why}"),
    };
    (annotation(node, annotation_key) != Some(value.as_str())).then(|| Effect::PatchNode {
        node: node.name_any(),
        resource_version: None,
        patch: json!({"metadata": {"annotations": {annotation_key: value}}}),
    })
}
