//! The OpenShift node-upgrade mutex operator's APIs
//! (`openshift-optional.skrzypek.io/v1alpha1`, namespaced, category
//! `numo`), served by nodekeeper as a drop-in: MutexRule (a Job run per
//! node before it may upgrade), MutexTarget (MachineConfigPools whose nodes
//! take turns) and MutexRunConfig (rules × targets, with the canary pool
//! nodes are released into). Same fields, JSON names and condition types
//! and reasons as the Ansible original; what nodekeeper adds is optional
//! and named as such (a cleanup Job, the run's progress in status).
//!
//! The MachineConfigPool and ClusterVersion views at the end read only
//! the fields the run needs from OpenShift's objects.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "openshift-optional.skrzypek.io";
/// Node label per (node, rule) while the node waits its turn:
/// `<prefix><rule name>.<rule namespace>` = "".
pub const RULE_LABEL_PREFIX: &str = "mutexrule.openshift-optional.skrzypek.io/";
/// The label a node reports its OpenShift release in (set by the MCO, or
/// by the original's NFD feature script).
pub const VERSION_LABEL: &str = "machineconfiguration.openshift.io/release-image-version";
pub const WORKER_LABEL: &str = "node-role.kubernetes.io/worker";
/// Labels on every Job a run creates.
pub const RUN_LABEL: &str = "nodekeeper.io/mutex-run";
pub const RULE_LABEL: &str = "nodekeeper.io/mutex-rule";
/// Environment appended to every container of a rule's Job.
pub const ENV_RULE: &str = "MUTEX_RULE";

/// One condition as the original writes it: every field a string.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MutexCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
}

/// A JobSpec kept as given (the original's `x-kubernetes-preserve-unknown-fields`).
fn job_spec(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

fn optional_job_spec(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A Job run for every node of the targets before it may upgrade.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "openshift-optional.skrzypek.io",
    version = "v1alpha1",
    kind = "MutexRule",
    plural = "mutexrules",
    namespaced,
    category = "numo",
    status = "MutexRuleStatus",
    printcolumn(name = "Job Name", type_ = "string", json_path = ".spec.jobName"),
    printcolumn(
        name = "Job Namespace",
        type_ = "string",
        json_path = ".spec.jobNamespace"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MutexRuleSpec {
    /// Prefix of the Jobs' names. Both it and the namespace become part
    /// of a request's path, so they must be names (empty is stored, as the
    /// original's, and reported on the rule).
    #[serde(default)]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self == '' || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("jobName must be a lowercase RFC 1123 label (a-z, 0-9 and '-')"))]
    pub job_name: String,
    /// Namespace the Jobs run in.
    #[serde(default)]
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self == '' || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("jobNamespace must be a lowercase RFC 1123 label (a-z, 0-9 and '-')"))]
    pub job_namespace: String,
    /// A batch/v1 JobSpec.
    #[serde(default)]
    #[schemars(schema_with = "job_spec")]
    pub job_spec: serde_json::Value,
    /// `kubernetes` (the only kind, and the default).
    #[serde(default = "kubernetes", rename = "type")]
    #[x_kube(validation = Rule::new("self == 'kubernetes'").message("type must be kubernetes"))]
    pub type_: String,
    /// nodekeeper's addition: a JobSpec run for each node after it reports
    /// the new version (the original has no cleanup step of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_job_spec")]
    pub cleanup_job_spec: Option<serde_json::Value>,
}

fn kubernetes() -> String {
    "kubernetes".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct MutexRuleStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MutexCondition>,
}

/// MachineConfigPools whose nodes take turns.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "openshift-optional.skrzypek.io",
    version = "v1alpha1",
    kind = "MutexTarget",
    plural = "mutextargets",
    namespaced,
    category = "numo",
    status = "MutexTargetStatus",
    printcolumn(
        name = "Machine Config Pools",
        type_ = "string",
        json_path = ".spec.machineConfigPools"
    ),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodes")
)]
#[serde(rename_all = "camelCase")]
pub struct MutexTargetSpec {
    #[serde(default)]
    pub machine_config_pools: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct MutexTargetStatus {
    /// The pools' nodes (by their selectors' matchLabels, as the original).
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MutexCondition>,
}

/// A reference to a rule or target (namespace defaults to the run config's).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct Ref {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct Canary {
    pub name: String,
}

/// Rules × targets, node by node, released into the canary pool.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "openshift-optional.skrzypek.io",
    version = "v1alpha1",
    kind = "MutexRunConfig",
    plural = "mutexrunconfigs",
    namespaced,
    category = "numo",
    status = "MutexRunConfigStatus",
    printcolumn(name = "Canary", type_ = "string", json_path = ".spec.canary.name"),
    printcolumn(name = "Rules", type_ = "string", json_path = ".spec.mutexRules"),
    printcolumn(name = "Targets", type_ = "string", json_path = ".spec.mutexTargets")
)]
#[serde(rename_all = "camelCase")]
pub struct MutexRunConfigSpec {
    /// An existing unpaused MachineConfigPool in no target.
    #[serde(default)]
    pub canary: Canary,
    #[serde(default)]
    pub mutex_rules: Vec<Ref>,
    #[serde(default)]
    pub mutex_targets: Vec<Ref>,
    /// nodekeeper's addition: seconds a released node may take to report
    /// the new version (default 6000, the original's 100 polls × 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 604800))]
    pub upgrade_timeout_seconds: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MutexRunConfigStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MutexCondition>,
    /// nodekeeper's addition: where the run is, so a restart resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RunProgress>,
}

/// A run in progress (or its end). Written before each step acts, so a
/// restart neither repeats a Job nor skips a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunProgress {
    /// The version this run upgrades to.
    pub version: String,
    /// The spec generation the run started (or failed) in.
    #[serde(default)]
    pub generation: i64,
    /// The target nodes, in the order they take turns.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Index into `nodes` of the node in progress (`nodes.len()`: all done).
    #[serde(default)]
    pub current: i32,
    /// `Jobs`, `Upgrading`, `Cleanup`, `Finishing`, `Done` or `Failed`.
    pub step: String,
    /// The Job step's rule index, and the Job it started (`ns/name`).
    #[serde(default)]
    pub rule: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// When the step began (RFC 3339).
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Each pool's nodeSelector.matchExpressions before the run changed
    /// them, restored at the end (the original writes fixed ones back).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub saved_selectors: BTreeMap<String, Vec<LabelSelectorRequirement>>,
}

/// What the run reads of a MachineConfigPool (`machineconfiguration.openshift.io/v1`).
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub node_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// What the run reads of the ClusterVersion named `version`
/// (`config.openshift.io/v1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterVersionView {
    /// `spec.desiredUpdate.version`.
    pub desired: Option<String>,
    /// `status.history[0].state`.
    pub history_state: Option<String>,
}

impl ClusterVersionView {
    pub fn from_json(v: &serde_json::Value) -> ClusterVersionView {
        ClusterVersionView {
            desired: v["spec"]["desiredUpdate"]["version"]
                .as_str()
                .map(str::to_string),
            history_state: v["status"]["history"][0]["state"]
                .as_str()
                .map(str::to_string),
        }
    }
}

/// The MachineConfigPool and ClusterVersion APIs nodekeeper reads.
pub const POOL_GROUP: &str = "machineconfiguration.openshift.io";
pub const POOL_KIND: &str = "MachineConfigPool";
pub const POOL_PLURAL: &str = "machineconfigpools";
pub const VERSION_GROUP: &str = "config.openshift.io";
pub const VERSION_KIND: &str = "ClusterVersion";
pub const VERSION_PLURAL: &str = "clusterversions";
/// The ClusterVersion the run reads (the original's code reads `version`;
/// its README says `cluster`).
pub const CLUSTER_VERSION_NAME: &str = "version";

/// The MachineConfigPool resource, for dynamic access.
pub fn pool_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: POOL_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{POOL_GROUP}/v1"),
        kind: POOL_KIND.into(),
        plural: POOL_PLURAL.into(),
    }
}

/// The ClusterVersion resource, for dynamic access.
pub fn cluster_version_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: VERSION_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{VERSION_GROUP}/v1"),
        kind: VERSION_KIND.into(),
        plural: VERSION_PLURAL.into(),
    }
}

/// The label a rule puts on nodes.
pub fn rule_label(rule: &str, namespace: &str) -> String {
    format!("{RULE_LABEL_PREFIX}{rule}.{namespace}")
}

/// The three CRDs, generated by [`crds`], checked in (see
/// `super::CRDS`).
pub(crate) const CRDS: super::Embedded = super::embedded!("mutex-crds.json");

/// The three CRDs as YAML, for `nodekeeper crds --mutex`.
pub fn crds_yaml() -> crate::error::Result<String> {
    super::as_yaml(&CRDS)
}

/// The three CRDs, generated from the types (tests only).
#[cfg(test)]
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![MutexRule::crd(), MutexTarget::crd(), MutexRunConfig::crd()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crds_are_namespaced_in_the_numo_category_with_the_originals_names() {
        for crd in crds() {
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.names.categories, Some(vec!["numo".to_string()]));
        }
        let json = serde_json::to_string(&MutexRunConfig::crd()).unwrap_or_default();
        for needle in ["mutexRules", "mutexTargets", "canary", "Canary"] {
            assert!(json.contains(needle), "{needle}");
        }
        let json = serde_json::to_string(&MutexRule::crd()).unwrap_or_default();
        for needle in ["jobName", "jobNamespace", "jobSpec", "Job Namespace"] {
            assert!(json.contains(needle), "{needle}");
        }
    }
}
