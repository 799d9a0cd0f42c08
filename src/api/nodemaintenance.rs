//! The `NodeMaintenance` API, exactly as medik8s's Node Maintenance Operator
//! serves it (`nodemaintenance.medik8s.io/v1beta1`), so clusters keep their
//! objects, `kubectl` habits and the medik8s tools that read NMO's lease and
//! label. Additions are compatible: printer columns, `conditions`, a CEL rule
//! for `nodeName` immutability (NMO's webhook check, without a webhook).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// medik8s's finalizer name, kept so objects created under NMO stay valid.
pub const FINALIZER: &str = "foregroundDeleteNodeMaintenance";
/// Node label that tells medik8s remediators to leave the node alone.
pub const EXCLUDE_REMEDIATION_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// The taint the node lifecycle controller also puts on cordoned nodes.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// medik8s's own drain taint.
pub const DRAIN_TAINT: &str = "medik8s.io/drain";
/// Namespace and holder of the medik8s node lease.
pub const LEASE_NAMESPACE: &str = "medik8s-leases";
pub const LEASE_HOLDER: &str = "node-maintenance";
pub const LEASE_SECONDS: i32 = 3600;
/// More lease conflicts than this while draining fail the maintenance (as NMO).
pub const MAX_LEASE_ERRORS: i32 = 3;

/// Node annotation naming the NodeMaintenance whose changes the node carries
/// (label, taints, cordon). Written in the same patch as those changes, so
/// after a crash we know exactly what is ours to undo.
pub const APPLIED_ANNOTATION: &str = "nodekeeper.io/maintenance";
/// Node annotation present only if nodekeeper set `spec.unschedulable`: an
/// admin's earlier cordon is never undone by us.
pub const CORDONED_ANNOTATION: &str = "nodekeeper.io/cordoned-by-maintenance";

/// CEL: `spec.nodeName` is a name a Node can have.
pub const NODE_NAME_RULE: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";
/// What `kubectl apply` says when that rule refuses an object (CEL
/// `messageExpression`). It starts with NMO's webhook wording for a missing
/// node, `invalid nodeName, no node with name <name> found`, because NMO's
/// tools and e2e suite look for that text and a name no Node can have is
/// refused here, before any webhook sees it. A name with a line break is
/// not repeated (a message with one would be dropped by the API server).
pub const NODE_NAME_MESSAGE_CEL: &str = "'invalid nodeName, no node with name ' + (self.matches('^[^\\n\\r]*$') ? self : '(with a line break)') + ' found: a node name is a lowercase RFC 1123 subdomain: a-z, 0-9, \\'-\\' and \\'.\\', starting and ending with a letter or digit, at most 253 characters'";

/// KEP-5683's Node lifecycle conditions (sig-node "Node Lifecycle
/// Conditions"): well-known Node condition types a maintenance controller
/// sets on the node it takes out of service.
pub const MAINTENANCE_IN_PROGRESS: &str = "MaintenanceInProgress";
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
pub const DRAINED: &str = "Drained";
pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";
/// Every lifecycle condition type: the only Node conditions a node agent
/// may change (the own-node admission policy).
pub const LIFECYCLE_CONDITIONS: [&str; 4] = [
    MAINTENANCE_IN_PROGRESS,
    DRAIN_IN_PROGRESS,
    DRAINED,
    MAINTENANCE_PLANNED,
];

/// Label on a NodeMaintenance that a nodekeeper feature created to take a
/// node, naming the owner's kind (e.g. `RebootPolicy`: a label value cannot
/// hold `Kind/name`, and a name may be longer than a label value); the
/// owner reference names the object. Without it the object is an
/// administrator's, which preempts.
pub const OWNER_LABEL: &str = "nodekeeper.io/owner";
/// Annotations with the owner's drain options: the drain deadline in whole
/// seconds, and `Wait`, `Force` or `Skip` after it. medik8s tools ignore
/// them; without them the agent's `--drain-timeout` and `Wait` apply.
pub const DRAIN_TIMEOUT_ANNOTATION: &str = "nodekeeper.io/drain-timeout-seconds";
pub const DRAIN_ON_TIMEOUT_ANNOTATION: &str = "nodekeeper.io/drain-on-timeout";
/// The grace period (whole seconds, 0–86400) sent with each eviction and
/// deletion; without it each pod's own applies (kubectl's -1).
pub const DRAIN_GRACE_ANNOTATION: &str = "nodekeeper.io/drain-grace-period-seconds";
/// A label selector, as JSON (`{"matchLabels": {...}}`): only matching pods
/// are drained; others stay (kured's `--drain-pod-selector`).
pub const DRAIN_POD_SELECTOR_ANNOTATION: &str = "nodekeeper.io/drain-pod-selector";

/// The medik8s lease name for a node.
pub fn lease_name(node: &str) -> String {
    format!("node-{node}")
}

/// Puts a node into maintenance: cordon, taint and drain it, and hold it there
/// until this object is deleted.
// Each printcolumn(...) repeats `type_ = ...`; clippy reads them as one
// attribute's duplicated keys.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "nodemaintenance.medik8s.io",
    version = "v1beta1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    shortname = "nm",
    status = "NodeMaintenanceStatus",
    // Node agents watch only their own node's objects
    // (`fieldSelector=spec.nodeName=…`, Kubernetes ≥ 1.31).
    selectable = ".spec.nodeName",
    doc = "NodeMaintenance puts a node into maintenance: cordoned, tainted and drained until the object is deleted.",
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.nodeName",
        description = "the node in maintenance"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Running, Succeeded or Failed"
    ),
    printcolumn(
        name = "Progress",
        type_ = "integer",
        json_path = ".status.drainProgress",
        description = "percent of evictable pods gone"
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.pendingCount",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".spec.reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// Node name to put into maintenance. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("updating spec.NodeName isn't allowed"))]
    // The API server's own rule for Node names (a lowercase RFC 1123
    // subdomain); maxLength also bounds the CEL cost of matches().
    #[x_kube(validation = Rule::new(NODE_NAME_RULE).message(kube::core::Message::Expression(NODE_NAME_MESSAGE_CEL.into())))]
    #[schemars(length(max = 253))]
    pub node_name: String,
    /// Why the node is in maintenance (free text, shown by `kubectl get nm -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where a maintenance is. The strings are medik8s's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Phase {
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

/// A pod still to be drained, as medik8s's `PodReference`.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub struct PodReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Field names and JSON keys are medik8s's (note `totalpods`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    /// Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Percent of the evictable pods that are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_progress: Option<i32>,
    /// When nodekeeper last changed this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
    /// What is wrong or blocking, in one line (pod, PDB and the API's cause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Names of the pods still to be drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods: Option<Vec<String>>,
    /// Namespaces and names of the pods still to be drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods_refs: Option<Vec<PodReference>>,
    /// nodekeeper: how many pods are still to be drained (kubectl's
    /// PENDING column: a printer column's JSONPath cannot count a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_count: Option<i32>,
    /// Pods on the node when maintenance began.
    #[serde(default, rename = "totalpods", skip_serializing_if = "Option::is_none")]
    pub total_pods: Option<i32>,
    /// Pods that had to be drained when maintenance began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_pods: Option<i32>,
    /// Times the medik8s lease was found held by another holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_on_lease_count: Option<i32>,
    /// Standard conditions: Accepted, Cordoned, Drained; for a feature's
    /// maintenance also VolumesDetached and LeftForShutdown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
}

/// `metav1.Condition` list, keyed by type as `kubectl` and SSA expect.
pub(crate) fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    let obj = schema.ensure_object();
    obj.insert("x-kubernetes-list-type".into(), "map".into());
    obj.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}

impl NodeMaintenance {
    pub fn phase(&self) -> Option<Phase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    pub fn has_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// Every printer column reads a field the status really has (the
    /// PENDING column read `.status.pendingPods.length()`, which kubectl's
    /// JSONPath cannot evaluate, so it was always empty).
    #[test]
    fn printer_columns_read_fields_that_are_written() {
        let crd = NodeMaintenance::crd();
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        let status = serde_json::to_value(NodeMaintenanceStatus {
            phase: Some(Phase::Running),
            drain_progress: Some(50),
            pending_count: Some(3),
            ..Default::default()
        })
        .unwrap_or_default();
        for c in &columns {
            let Some(field) = c.json_path.strip_prefix(".status.") else {
                continue;
            };
            assert!(
                status.get(field).is_some(),
                "column {} reads {}, which the status does not have: {status}",
                c.name,
                c.json_path
            );
        }
        assert!(columns.iter().any(|c| c.name == "Pending"));
    }

    #[test]
    fn crd_matches_medik8s_names() {
        let crd = NodeMaintenance::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("nodemaintenances.nodemaintenance.medik8s.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["nm".to_string()]));
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1beta1");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let json = serde_json::to_string(&crd).unwrap_or_default();
        assert!(
            json.contains(r#""totalpods""#),
            "status key is lowercase as medik8s"
        );
        assert!(json.contains("updating spec.NodeName isn't allowed"));
        assert!(json.contains(r#""required":["nodeName"]"#), "{json}");
    }

    #[test]
    fn status_round_trips_medik8s_json() {
        let medik8s = serde_json::json!({
            "phase": "Running", "drainProgress": 50, "lastError": "x",
            "pendingPods": ["a"], "pendingPodsRefs": [{"namespace": "n", "name": "a"}],
            "totalpods": 3, "evictionPods": 2, "errorOnLeaseCount": 1
        });
        let st: NodeMaintenanceStatus = serde_json::from_value(medik8s.clone()).unwrap_or_default();
        assert_eq!(st.total_pods, Some(3));
        assert_eq!(serde_json::to_value(&st).unwrap_or_default(), medik8s);
    }
}
