//! Admission of NodeMaintenances, pure: NMO's webhook refusals
//! ([`review`]), the caBundle every serving nodekeeper shares
//! ([`merge_bundle`]) and when to rotate its certificate ([`rotate_at`]).
//! The service serves the webhook and gathers what these read; nothing
//! here does I/O or reads a clock.
//!
//! The checks are NMO's, with its messages, for administrators'
//! maintenances: the node must exist, no second live maintenance may name
//! it, and a control-plane node may be taken only while a quorum of the
//! control plane stays Ready and schedulable (etcd's). A feature's own
//! maintenances (the owner label, with an owner reference to a live object
//! of that kind) are admitted: their budgets already decided, and an
//! administrator's preempts them in status. The label alone is an
//! administrator's object like any other.

use crate::api::node::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use super::maintenance::{duplicate_message, missing_node_message, owner_of};
use crate::api::nodemaintenance::{NodeMaintenance, Phase};

/// The node-role label that marks a control-plane node (kubeadm, k3s, Talos).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// What a review reads.
pub struct Request<'a> {
    /// The object being created.
    pub nm: &'a NodeMaintenance,
    /// Its node, if it exists.
    pub node: Option<&'a Node>,
    /// Every control-plane node (read only when `node` is one).
    pub control_plane: &'a [Node],
    /// Every NodeMaintenance the API server has stored.
    pub existing: &'a [std::sync::Arc<NodeMaintenance>],
    /// Apply the control-plane quorum rule (`--admission-skip-quorum-check` turns it off).
    pub quorum_check: bool,
    /// Whether the object's owner reference of the kind its owner label
    /// names is a live object of that kind (same uid, not being deleted):
    /// only then does the label skip the checks. A label anyone can set.
    pub owner_live: bool,
}

/// `Err` is the refusal, as `kubectl apply` prints it.
pub fn review(r: &Request) -> Result<(), String> {
    let node_name = &r.nm.spec.node_name;
    if owner_of(r.nm).is_some() && r.owner_live {
        return Ok(());
    }
    let Some(node) = r.node else {
        return Err(missing_node_message(node_name));
    };
    let live = |m: &&std::sync::Arc<NodeMaintenance>| {
        !m.is_deleting() && m.phase() != Some(Phase::Failed) && owner_of(m).is_none()
    };
    if r.existing
        .iter()
        .filter(live)
        .any(|m| m.spec.node_name == *node_name && m.name_any() != r.nm.name_any())
    {
        return Err(duplicate_message(node_name));
    }
    if r.quorum_check && is_control_plane(node) {
        let members = r.control_plane.len().max(1);
        let quorum = members / 2 + 1;
        let in_maintenance = |n: &str| {
            r.existing.iter().any(|m| {
                !m.is_deleting() && m.phase() != Some(Phase::Failed) && m.spec.node_name == n
            })
        };
        let available = r
            .control_plane
            .iter()
            .filter(|n| n.name_any() != *node_name)
            .filter(|n| is_ready(n) && !is_unschedulable(n) && !in_maintenance(&n.name_any()))
            .count();
        if available < quorum {
            return Err(quorum_message(node_name, available, members, quorum));
        }
    }
    Ok(())
}

/// NMO's wording for its etcd-quorum refusal, word for word (NMO's e2e
/// suite and its users match on it), then the numbers behind it.
pub fn quorum_message(node: &str, available: usize, members: usize, quorum: usize) -> String {
    format!(
        "can not put master/control-plane node into maintenance at this moment, disrupting node {node} will violate etcd quorum: {available} of {members} control-plane nodes would stay Ready and schedulable, a quorum needs {quorum}"
    )
}

pub fn is_control_plane(node: &Node) -> bool {
    node.labels().contains_key(CONTROL_PLANE_LABEL)
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// One CA in the shared caBundle that a serving nodekeeper put there: the
/// ValidatingWebhookConfiguration's [`OWNERS_ANNOTATION`] lists them, so
/// each instance replaces only its own and drops only expired ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owned {
    /// Who serves with it (the node, or the pod of a Deployment).
    pub identity: String,
    /// SHA-256 of the PEM block, hex.
    pub sha256: String,
    #[serde(rename = "notAfter")]
    pub not_after: Timestamp,
}

/// Annotation on the ValidatingWebhookConfiguration: JSON list of [`Owned`].
pub const OWNERS_ANNOTATION: &str = "nodekeeper.io/ca-bundle-owners";

/// The PEM certificate blocks of a bundle, each ending in a newline.
pub fn pem_blocks(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let stop = start + end + END.len();
        out.push(format!("{}\n", rest[start..stop].trim()));
        rest = &rest[stop..];
    }
    out
}

/// The bundle with `mine` (this instance's CAs, newest first) in place of
/// whatever this instance put there before, other instances' CAs until they
/// expire, and blocks nobody claims (added by hand) kept. `sha` fingerprints
/// a block. Deterministic: an unchanged bundle needs no write.
pub fn merge_bundle(
    bundle: &str,
    owners: &[Owned],
    me: &str,
    mine: &[(String, Owned)],
    now: Timestamp,
    sha: impl Fn(&str) -> String,
) -> (String, Vec<Owned>) {
    let mine_sha: Vec<&str> = mine.iter().map(|(_, o)| o.sha256.as_str()).collect();
    let mut kept_owners: Vec<Owned> = Vec::new();
    let mut out = String::new();
    for block in pem_blocks(bundle) {
        let fp = sha(&block);
        if mine_sha.contains(&fp.as_str()) {
            continue;
        }
        match owners.iter().find(|o| o.sha256 == fp) {
            Some(o) if o.identity == me || o.not_after <= now => continue,
            Some(o) => kept_owners.push(o.clone()),
            None => {}
        }
        out.push_str(&block);
    }
    for (pem, o) in mine {
        out.push_str(&format!("{}\n", pem.trim()));
        kept_owners.push(o.clone());
    }
    (out, kept_owners)
}

/// How long a generated CA and serving certificate are valid.
pub const CERT_LIFETIME: SignedDuration = SignedDuration::from_hours(24 * 30);

/// When to replace a certificate valid from `not_before` to `not_after`:
/// after two thirds of its life, leaving a third for the new CA to reach
/// every API server.
pub fn rotate_at(not_before: Timestamp, not_after: Timestamp) -> Timestamp {
    let life = not_after.duration_since(not_before);
    not_before.checked_add(life * 2 / 3).unwrap_or(not_before)
}

#[cfg(test)]
mod tests;
