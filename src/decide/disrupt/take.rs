//! How a feature takes a node and gives it back: a NodeMaintenance it owns
//! (named after the feature and the node, carrying its drain options and
//! the boot ID the node was taken in), who holds a node meanwhile, and the
//! nodes of an owner that is gone.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::api::common::DrainSpec;
use crate::api::nodemaintenance::{
    DRAIN_GRACE_ANNOTATION, DRAIN_ON_TIMEOUT_ANNOTATION, DRAIN_POD_SELECTOR_ANNOTATION,
    DRAIN_TIMEOUT_ANNOTATION, NodeMaintenance, NodeMaintenanceSpec, OWNER_LABEL,
};
use crate::api::reboot::BOOT_ID_ANNOTATION;
use crate::decide::Effect;
use crate::decide::maintenance::owner_of;

/// Does this NodeMaintenance hold its node against other features? A
/// Failed one does not: it ended without a drain to finish (invalid
/// options, a lease another holder has), and waiting for a person to
/// delete it would stall every feature on that node. Budgets still count
/// its node as unavailable until it is deleted.
pub fn holds_node(nm: &NodeMaintenance) -> bool {
    nm.phase() != Some(crate::api::nodemaintenance::Phase::Failed)
}

/// A live NodeMaintenance on `node` that holds it and is not `mine`:
/// another disruption took the node.
pub fn held_by_other<'a>(
    maintenances: &'a [Arc<NodeMaintenance>],
    node: &str,
    mine: impl Fn(&NodeMaintenance) -> bool,
) -> Option<&'a Arc<NodeMaintenance>> {
    maintenances
        .iter()
        .find(|m| m.spec.node_name == node && !m.is_deleting() && holds_node(m) && !mine(m))
}

/// Why an admission was withdrawn: another disruption took the node
/// before its NodeMaintenance was created (the create failed once, or the
/// hooks ran first). One owner per node; the node waits its turn again.
pub fn taken_meanwhile(other: &NodeMaintenance) -> String {
    format!(
        "in maintenance (NodeMaintenance {}) before its admission was carried out",
        other.name_any()
    )
}

/// Is this NodeMaintenance the one the `kind` object `owner` takes its
/// node with?
pub fn owned_by(nm: &NodeMaintenance, kind: &str, owner: &str) -> bool {
    owner_of(nm) == Some(kind)
        && nm
            .owner_references()
            .iter()
            .any(|o| o.kind == kind && o.name == owner)
}

/// `<prefix>-<node>`, with a stable hash suffix past the 253-character
/// limit of object names.
pub fn maintenance_name(prefix: &str, node: &str) -> String {
    let name = format!("{prefix}-{node}");
    if name.len() <= 253 {
        return name;
    }
    format!("{}-{:016x}", &name[..236], fnv(node.as_bytes()))
}

/// FNV-1a: a stable short hash for names past a length limit.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A controller owner reference to a cluster-scoped feature object.
pub fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K, kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into(),
        kind: kind.into(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The NodeMaintenance a feature takes `node` with: labelled and owned by
/// the feature object (deleting it gives its nodes back), the boot ID the
/// node was taken in recorded, the feature's drain options attached.
pub fn take(
    owner: OwnerReference,
    name: &str,
    node: &str,
    drain: &DrainSpec,
    boot: &str,
    reason: String,
) -> NodeMaintenance {
    let mut annotations = vec![
        (BOOT_ID_ANNOTATION, boot.to_string()),
        (DRAIN_TIMEOUT_ANNOTATION, drain.timeout_seconds.to_string()),
        (DRAIN_ON_TIMEOUT_ANNOTATION, drain.on_timeout.clone()),
    ];
    if let Some(g) = drain.grace_period_seconds {
        annotations.push((DRAIN_GRACE_ANNOTATION, g.to_string()));
    }
    if let Some(sel) = &drain.pod_selector
        && let Ok(json) = serde_json::to_string(sel)
    {
        annotations.push((DRAIN_POD_SELECTOR_ANNOTATION, json));
    }
    NodeMaintenance {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some([(OWNER_LABEL.to_string(), owner.kind.clone())].into()),
            annotations: Some(
                annotations
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: NodeMaintenanceSpec {
            node_name: node.to_string(),
            reason: Some(reason),
        },
        status: None,
    }
}

/// NodeMaintenances a `kind` object took nodes with whose owner is gone
/// (`live`: the `(name, uid)` of every such object there is): give those
/// nodes back. (The garbage collector would not: the medik8s finalizer
/// step makes the Node an owner too, and an object goes only when all its
/// owners are gone.)
pub fn orphans(
    maintenances: &[Arc<NodeMaintenance>],
    kind: &str,
    live: &[(String, Option<String>)],
) -> Vec<Effect> {
    maintenances
        .iter()
        .filter(|m| owner_of(m) == Some(kind) && !m.is_deleting())
        .filter(|m| {
            let owner = m.owner_references().iter().find(|o| o.kind == kind);
            owner.is_none_or(|o| {
                !live
                    .iter()
                    .any(|(name, uid)| *name == o.name && uid.as_deref() == Some(o.uid.as_str()))
            })
        })
        .filter_map(|m| {
            Some(Effect::DeleteMaintenance {
                nm: m.name_any(),
                uid: m.uid()?,
            })
        })
        .collect()
}
