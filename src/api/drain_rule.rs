//! The `DrainRule` API (`nodekeeper.io/v1alpha1`, cluster-scoped): how every
//! drain nodekeeper runs treats the pods a rule selects — an
//! administrator's NodeMaintenance, a reboot's, an upgrade's, a
//! replacement's. The semantics are Cluster API's MachineDrainRule
//! (`cluster.x-k8s.io/v1beta2`, read in cluster-api's
//! `api/core/v1beta2/machinedrainrules_types.go` and
//! `core/reconcilers/machine/drain/`), with `nodes[]` in place of
//! `machines[]`: behaviour Drain, Skip or WaitCompleted; Drain pods in
//! tiers by `order`; rules taken in alphabetical order of name, the first
//! that selects a pod wins; a pod label beats every rule.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// nodekeeper's pod label: `skip` or `wait-completed` beats every rule.
pub const DRAIN_LABEL: &str = "nodekeeper.io/drain";
/// Cluster API's pod label with the same values, honoured as Cluster API
/// honours it (a pod moved from a CAPI-managed cluster keeps its meaning).
pub const CAPI_DRAIN_LABEL: &str = "cluster.x-k8s.io/drain";

/// How the pods a DrainRule selects are drained.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "nodekeeper.io",
    version = "v1alpha1",
    kind = "DrainRule",
    plural = "drainrules",
    shortname = "dr",
    doc = "DrainRule says how every nodekeeper drain treats the pods it selects: Drain (in tiers by order), Skip, or WaitCompleted; rules apply in alphabetical order of name, the first match wins, and the pod labels nodekeeper.io/drain and cluster.x-k8s.io/drain beat every rule.",
    printcolumn(
        name = "Behavior",
        type_ = "string",
        json_path = ".spec.drain.behavior",
        description = "Drain, Skip or WaitCompleted"
    ),
    printcolumn(
        name = "Order",
        type_ = "integer",
        json_path = ".spec.drain.order",
        description = "the tier of Drain pods: lower orders go first"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DrainRuleSpec {
    /// If and how the selected pods are drained.
    pub drain: DrainRuleDrain,
    /// Which nodes the rule applies on (not set: every node). Entries are
    /// ORed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("self.all(x, self.exists_one(y, x == y))").message("entries in nodes must be unique"))]
    pub nodes: Option<Vec<DrainRuleNodes>>,
    /// Which pods the rule applies to (not set: every pod). Entries are
    /// ORed; within one, selector and namespaceSelector are ANDed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("self.all(x, self.exists_one(y, x == y))").message("entries in pods must be unique"))]
    pub pods: Option<Vec<DrainRulePods>>,
}

/// If and how pods are drained.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.order) || self.behavior == 'Drain'").message("order can only be set if behavior is Drain"))]
pub struct DrainRuleDrain {
    /// Drain: evicted, in tiers by order. Skip: left on the node.
    /// WaitCompleted: never evicted; the drain waits until the pod has
    /// finished (Succeeded or Failed) by itself.
    pub behavior: Behavior,
    /// The tier of Drain pods (not set: 0): only the pods of the lowest
    /// order still on the node are evicted; the next order starts when
    /// they are gone. WaitCompleted pods count as order 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i32>,
}

/// Drain, Skip or WaitCompleted.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum Behavior {
    #[default]
    Drain,
    Skip,
    WaitCompleted,
}

impl Behavior {
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Drain => "Drain",
            Behavior::Skip => "Skip",
            Behavior::WaitCompleted => "WaitCompleted",
        }
    }
}

/// Nodes a rule applies on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.selector)").message("an entry of nodes needs a selector"))]
pub struct DrainRuleNodes {
    /// The nodes' labels (empty: every node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Pods a rule applies to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.selector) || has(self.namespaceSelector)").message("an entry of pods needs a selector or a namespaceSelector"))]
pub struct DrainRulePods {
    /// The pods' labels (not set or empty: every pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The labels of the pods' namespaces (not set or empty: every
    /// namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}
