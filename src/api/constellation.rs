//! Constellation's node-operator APIs (`update.edgeless.systems/v1alpha1`,
//! cluster-scoped), served by nodekeeper as a drop-in for rolling node
//! replacement: NodeVersion (the image and Kubernetes components every
//! node should run), ScalingGroup (a cloud scaling group and the image it
//! creates nodes with), PendingNode (an instance joining or leaving),
//! AutoscalingStrategy (the cluster-autoscaler Deployment, paused during a
//! rollout) and JoiningNode (a joining node's components, stamped on it).
//!
//! Same fields, JSON names (lowercase ones included) and condition types,
//! reasons and messages as Constellation's, so its CLI and users' manifests
//! keep working. What nodekeeper adds is optional and marked: printer
//! columns, short names, CEL checks of enums, and the rollout's tuning on
//! NodeVersion (`maxSurge`, deadlines) with a `message` in its status.
//! Against Constellation's own CRDs these additions are pruned by the API
//! server and the defaults (Constellation's values) apply.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "update.edgeless.systems";
/// The NodeVersion Constellation's CLI reads and writes.
pub const NODE_VERSION_NAME: &str = "constellation-version";

/// Node annotations (Constellation's keys).
pub const SCALING_GROUP_ANNOTATION: &str = "constellation.edgeless.systems/scaling-group-id";
pub const IMAGE_ANNOTATION: &str = "constellation.edgeless.systems/node-image";
pub const HEIR_ANNOTATION: &str = "constellation.edgeless.systems/heir";
pub const DONOR_ANNOTATION: &str = "constellation.edgeless.systems/donor";
pub const OBSOLETE_ANNOTATION: &str = "constellation.edgeless.systems/obsolete";
pub const COMPONENTS_ANNOTATION: &str = "constellation.edgeless.systems/kubernetes-components";
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// NodeVersion annotation (nodekeeper's): surge nodes asked of the provider
/// and not yet recorded as PendingNodes, `<request id>=<group id>` joined
/// by `,`. Written before the provider is asked, so a crash between the
/// ask and the PendingNode repeats the ask with the same id (which the
/// provider answers with the same instance) instead of creating another.
pub const SURGE_REQUESTS_ANNOTATION: &str = "nodekeeper.io/surge-requests";
/// NodeVersion annotation (nodekeeper's): the rollout fields (`nodeSelector`,
/// `maxSurge`, the timeouts) last read in the spec, as JSON with the
/// spec's names, only those not at their defaults. Constellation's typed
/// clients keep metadata but drop spec fields they do not know; when a
/// write loses ours, this record governs (`decide/replace/fields.rs`).
pub const ROLLOUT_FIELDS_ANNOTATION: &str = "nodekeeper.io/rollout-fields";
/// PendingNode annotation (nodekeeper's): when the provider was last asked
/// to delete the instance (RFC 3339), so a slow cloud is not asked again
/// before the leave deadline.
pub const DELETE_ISSUED_ANNOTATION: &str = "nodekeeper.io/delete-issued";

pub const CONDITION_OUTDATED: &str = "Outdated";

fn default_surge() -> i32 {
    1
}
fn default_join() -> i64 {
    1800
}
fn default_leave() -> i64 {
    60
}
fn default_drain() -> i64 {
    1800
}

/// The image and Kubernetes components every node should run.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "NodeVersion",
    plural = "nodeversions",
    shortname = "nv",
    status = "NodeVersionStatus",
    doc = "NodeVersion names the image and Kubernetes components every node should run; nodes that differ are replaced by new ones (surge first, then drain and delete).",
    printcolumn(
        name = "Image Version",
        type_ = "string",
        json_path = ".spec.imageVersion"
    ),
    printcolumn(
        name = "Kubernetes",
        type_ = "string",
        json_path = ".spec.kubernetesClusterVersion"
    ),
    printcolumn(
        name = "Outdated",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Outdated\")].status"
    ),
    printcolumn(name = "Budget", type_ = "integer", json_path = ".status.budget"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeVersionSpec {
    /// The cloud image reference every node should run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The cloud-independent image version (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_version: Option<String>,
    /// ConfigMap in kube-system listing the Kubernetes components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_components_reference: Option<String>,
    /// The advertised Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_cluster_version: Option<String>,
    /// Constellation's own: the most nodes created at once. Set, it is
    /// the rollout's surge (Constellation's CLI writes it; `maxSurge` is
    /// nodekeeper's name for the same, which that CLI does not keep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_node_budget: Option<u32>,
    /// nodekeeper: extra nodes a rollout may create at once (default 1,
    /// Constellation's fixed value). Control-plane groups always use 1.
    #[serde(default = "default_surge")]
    #[schemars(range(min = 1, max = 100))]
    pub max_surge: i32,
    /// nodekeeper: seconds a new node has to join before its instance is
    /// deleted (default 1800).
    #[serde(default = "default_join")]
    #[schemars(range(min = 10, max = 86400))]
    pub join_timeout_seconds: i64,
    /// nodekeeper: seconds a deleted instance has to terminate before the
    /// delete is asked again and a warning raised (default 60).
    #[serde(default = "default_leave")]
    #[schemars(range(min = 5, max = 86400))]
    pub leave_timeout_seconds: i64,
    /// nodekeeper: seconds a replaced node's drain may take; past it the
    /// node is kept (not deleted) and a warning raised (default 1800).
    #[serde(default = "default_drain")]
    #[schemars(range(min = 10, max = 86400))]
    pub drain_timeout_seconds: i64,
    /// nodekeeper: only nodes matching this are governed (default: every
    /// node, as Constellation). A `--node-selector` cluster role handles
    /// the NodeVersions whose `matchLabels` include its selector's terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// nodekeeper: when replacements may start (empty: any time), as a
    /// RebootPolicy's windows. Outside them no surge node is created and
    /// no obsolete node is drained; a replacement already started (its
    /// surge node asked for) finishes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub windows: Vec<super::common::Window>,
}

impl NodeVersionSpec {
    /// No image, and nodekeeper's rollout fields at the defaults the API
    /// server fills in.
    pub fn default_rollout() -> Self {
        NodeVersionSpec {
            max_surge: default_surge(),
            join_timeout_seconds: default_join(),
            leave_timeout_seconds: default_leave(),
            drain_timeout_seconds: default_drain(),
            ..Default::default()
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeVersionStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outdated: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub up_to_date: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub donors: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heirs: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mints: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_annotation: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub obsolete: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid: Vec<ObjectReference>,
    /// Extra nodes that may be created now.
    #[serde(default)]
    pub budget: i32,
    /// Exactly one condition, `Outdated` (Constellation's CLI insists).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// A Kubernetes (kubeadm) upgrade is in progress; nodekeeper runs none,
    /// so always false.
    #[serde(default)]
    pub activeclusterversionupgrade: bool,
    /// nodekeeper: what holds the rollout up, in one line (provider errors,
    /// overdue drains or leaves, a Kubernetes version it does not upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A cloud scaling group, and the image it creates nodes with.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "ScalingGroup",
    plural = "scalinggroups",
    shortname = "sg",
    status = "ScalingGroupStatus",
    doc = "ScalingGroup is a cloud scaling group: nodekeeper keeps its image on the NodeVersion's and creates surge nodes in it.",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Group ID", type_ = "string", json_path = ".spec.groupId"),
    printcolumn(name = "Image", type_ = "string", json_path = ".status.imageReference"),
    printcolumn(
        name = "Outdated",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Outdated\")].status"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ScalingGroupSpec {
    /// Name of the NodeVersion this group follows (the JSON name is
    /// Constellation's, kept for compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("nodeImage must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.')"))]
    pub node_image: Option<String>,
    /// The provider's id of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler_group_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_group_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i32>,
    /// `Worker` or `ControlPlane`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Worker', 'ControlPlane']").message("role must be Worker or ControlPlane"))]
    pub role: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingGroupStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_reference: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// An instance joining the cluster or leaving it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "PendingNode",
    plural = "pendingnodes",
    shortname = "pn",
    status = "PendingNodeStatus",
    doc = "PendingNode is an instance nodekeeper created (goal Join) or deleted (goal Leave), until it joined or terminated.",
    printcolumn(name = "Goal", type_ = "string", json_path = ".spec.goal"),
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.groupID"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.cspState"),
    printcolumn(name = "Reached", type_ = "boolean", json_path = ".status.reachedGoal"),
    printcolumn(name = "Deadline", type_ = "date", json_path = ".spec.deadline")
)]
pub struct PendingNodeSpec {
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(default, rename = "groupID", skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    #[serde(default, rename = "nodeName", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("nodeName must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.')"))]
    pub node_name: Option<String>,
    /// `Join` or `Leave`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Join', 'Leave']").message("goal must be Join or Leave"))]
    pub goal: Option<String>,
    /// Join: the instance is deleted if it has not joined by then. Leave:
    /// past it, the delete is asked again and a warning raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingNodeStatus {
    /// Unknown, Creating, Ready, Stopped, Terminating, Terminated or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Unknown', 'Creating', 'Ready', 'Stopped', 'Terminating', 'Terminated', 'Failed']").message("cspState must be one of Unknown, Creating, Ready, Stopped, Terminating, Terminated, Failed"))]
    pub csp_state: Option<String>,
    #[serde(default)]
    pub reached_goal: bool,
}

/// The cluster-autoscaler Deployment, scaled to 0 during a rollout.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "AutoscalingStrategy",
    plural = "autoscalingstrategies",
    shortname = "ass",
    status = "AutoscalingStrategyStatus",
    doc = "AutoscalingStrategy runs the cluster-autoscaler Deployment (1 replica) while enabled and scales it to 0 while disabled; nodekeeper disables it during a rollout.",
    printcolumn(name = "Enabled", type_ = "boolean", json_path = ".spec.enabled"),
    printcolumn(
        name = "Deployment",
        type_ = "string",
        json_path = ".spec.deploymentName"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas")
)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStrategySpec {
    pub enabled: bool,
    /// The autoscaler Deployment's name; it becomes part of a request's
    /// path, so it must be a name the API server could have given.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("deploymentName must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.')"))]
    pub deployment_name: String,
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("deploymentNamespace must be a lowercase RFC 1123 label (a-z, 0-9 and '-')"))]
    pub deployment_namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub autoscaler_extra_args: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct AutoscalingStrategyStatus {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub replicas: i32,
    /// nodekeeper: `DeploymentFound=False` (reason `NotFound`) while the
    /// Deployment the spec names does not exist; absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A joining node's Kubernetes components, stamped on its Node.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "JoiningNode",
    plural = "joiningnodes",
    shortname = "jn",
    status = "JoiningNodeStatus",
    doc = "JoiningNode names the Kubernetes components a joining node runs; nodekeeper annotates the node with them and deletes the JoiningNode.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.name"),
    printcolumn(
        name = "Components",
        type_ = "string",
        json_path = ".spec.componentsreference"
    ),
    printcolumn(name = "Deadline", type_ = "date", json_path = ".spec.deadline")
)]
pub struct JoiningNodeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("name must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.')"))]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub componentsreference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscontrolplane: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct JoiningNodeStatus {}

/// The five kinds, as effects name them (and the autoscaler Deployment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NodeVersion,
    ScalingGroup,
    PendingNode,
    AutoscalingStrategy,
    JoiningNode,
    Deployment,
}

impl Kind {
    /// The kind's name, for logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NodeVersion => "NodeVersion",
            Kind::ScalingGroup => "ScalingGroup",
            Kind::PendingNode => "PendingNode",
            Kind::AutoscalingStrategy => "AutoscalingStrategy",
            Kind::JoiningNode => "JoiningNode",
            Kind::Deployment => "Deployment",
        }
    }

    pub fn resource(self) -> kube::api::ApiResource {
        use kube::api::ApiResource;
        match self {
            Kind::NodeVersion => ApiResource::erase::<NodeVersion>(&()),
            Kind::ScalingGroup => ApiResource::erase::<ScalingGroup>(&()),
            Kind::PendingNode => ApiResource::erase::<PendingNode>(&()),
            Kind::AutoscalingStrategy => ApiResource::erase::<AutoscalingStrategy>(&()),
            Kind::JoiningNode => ApiResource::erase::<JoiningNode>(&()),
            Kind::Deployment => ApiResource {
                group: "apps".into(),
                version: "v1".into(),
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                plural: "deployments".into(),
            },
        }
    }
}

/// The CRDs, as checked in (see `api::CRDS`).
pub(crate) const CRDS: super::Embedded = super::embedded!("constellation-crds.json");

/// The CRDs as YAML, for `nodekeeper crds --constellation`.
pub fn crds_yaml() -> crate::error::Result<String> {
    super::as_yaml(&CRDS)
}

#[cfg(test)]
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        NodeVersion::crd(),
        ScalingGroup::crd(),
        PendingNode::crd(),
        AutoscalingStrategy::crd(),
        JoiningNode::crd(),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn checked_in_crds_match_the_types() {
        crate::api::check_generated(super::crds(), &super::CRDS);
    }
}
