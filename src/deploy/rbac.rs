//! Identities and what they may do: namespaces, ServiceAccounts, the RBAC
//! table keyed by identity (node agent, cluster role) with the reason for
//! every verb, and the ValidatingAdmissionPolicy that confines each node
//! agent to its own Node.

use serde_json::{Value, json};

use super::*;

/// The agent's permissions: (API group, resource, verbs, why). Both
/// identities get exactly these; nothing else is granted anywhere.
pub const AGENT_RULES: [(&str, &str, &[&str], &str); 8] = [
    (
        "",
        "nodes",
        &["get", "list", "watch", "patch"],
        "watch its node (field-selected); get a node a NodeMaintenance names; patch cordon, taints, label, annotations",
    ),
    (
        "",
        "pods",
        &["list", "watch", "delete"],
        "watch the pods bound to its node (field-selected); delete unmanaged and finished pods",
    ),
    (
        "",
        "pods/eviction",
        &["create"],
        "evict pods (PodDisruptionBudgets apply)",
    ),
    (
        "nodemaintenance.medik8s.io",
        "nodemaintenances",
        &["get", "list", "watch", "patch"],
        "watch NodeMaintenances; add and remove the finalizer",
    ),
    (
        "nodemaintenance.medik8s.io",
        "nodemaintenances/status",
        &["patch"],
        "write phase, counters, conditions",
    ),
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        "record BeginMaintenance etc.; patch repeats an event's count",
    ),
    (
        "",
        "namespaces",
        &["create"],
        "create medik8s-leases when missing (a Namespace is cluster-scoped)",
    ),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update", "delete"],
        "the medik8s node lease, in medik8s-leases only (a Role, not the ClusterRole)",
    ),
];

pub(super) fn rules_comment() -> String {
    let lines: Vec<String> = AGENT_RULES
        .iter()
        .map(|(g, r, v, why)| {
            let res = if g.is_empty() {
                (*r).to_string()
            } else {
                format!("{r}.{g}")
            };
            format!("#   {res}: {} — {why}", v.join(", "))
        })
        .collect();
    format!("# Verbs granted, and why:\n{}", lines.join("\n"))
}

/// The rules of [`AGENT_RULES`] for leases (`true`: the medik8s lease Role)
/// or for everything else (`false`: the ClusterRole).
pub(super) fn rules(leases: bool) -> Value {
    Value::Array(
        AGENT_RULES
            .iter()
            .filter(|(_, r, _, _)| (*r == "leases") == leases)
            .map(|(g, r, v, _)| json!({"apiGroups": [g], "resources": [r], "verbs": v}))
            .collect(),
    )
}

pub(super) fn service_account(name: &str, o: &Options) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": o.namespace, "labels": labels()}})
}

pub(super) fn labels() -> Value {
    json!({"app.kubernetes.io/name": "nodekeeper"})
}

/// Bind `account` to the agent ClusterRole and the medik8s lease Role.
pub(super) fn bindings(account: &str, o: &Options) -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": o.namespace}]);
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": account, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": AGENT_ROLE},
               "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": account, "namespace": LEASE_NAMESPACE, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodekeeper-medik8s-lease"},
               "subjects": subject}),
    ]
}

/// Namespaces, the node agent's ServiceAccount, the shared roles and the
/// node agent's bindings.
pub fn rbac(o: &Options) -> Vec<Value> {
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": o.namespace}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}}),
        service_account(AGENT_ACCOUNT, o),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": AGENT_ROLE, "labels": labels()}, "rules": rules(false)}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "nodekeeper-medik8s-lease", "namespace": LEASE_NAMESPACE, "labels": labels()},
               "rules": rules(true)}),
    ];
    docs.extend(bindings(AGENT_ACCOUNT, o));
    docs
}

/// The ValidatingAdmissionPolicy: a request from the node agent's
/// ServiceAccount may update a Node only if its token is bound to that node
/// (directly, or through a pod scheduled there), and may change only
/// nodekeeper's own label and annotations on it. Taints and cordon are not
/// restricted by key: maintenance needs both, and they are spec fields of
/// the node the agent owns anyway.
pub fn admission(o: &Options) -> Vec<Value> {
    let user = format!("system:serviceaccount:{}:{AGENT_ACCOUNT}", o.namespace);
    let annotation_prefix = APPLIED_ANNOTATION
        .split_once('/')
        .map(|(p, _)| format!("{p}/"))
        .unwrap_or_default();
    debug_assert!(CORDONED_ANNOTATION.starts_with(&annotation_prefix));
    // Keys whose value differs between old and new (added, removed, changed).
    let changed = |field: &str| {
        format!(
            "object.metadata.?{field}.orValue({{}}).filter(k, !(k in oldObject.metadata.?{field}.orValue({{}})) || oldObject.metadata.{field}[k] != object.metadata.{field}[k]) + \
             oldObject.metadata.?{field}.orValue({{}}).filter(k, !(k in object.metadata.?{field}.orValue({{}})))"
        )
    };
    vec![
        json!({
          "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
          "metadata": {"name": OWN_NODE_POLICY, "labels": labels()},
          "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
              "apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["nodes"]
            }]},
            "matchConditions": [{"name": "node-agent", "expression": format!("request.userInfo.username == '{user}'")}],
            "variables": [
              {"name": "boundNode", "expression": format!(
                "'{NODE_NAME_EXTRA}' in request.userInfo.extra ? request.userInfo.extra['{NODE_NAME_EXTRA}'][0] : ''")},
              {"name": "changedLabels", "expression": changed("labels")},
              {"name": "changedAnnotations", "expression": changed("annotations")}
            ],
            "validations": [
              {"expression": "variables.boundNode != ''", "reason": "Forbidden",
               "message": format!("{user} must use a token bound to a pod or a node (a DaemonSet pod's token, or kubectl create token --bound-object-kind Node)")},
              {"expression": "variables.boundNode == object.metadata.name", "reason": "Forbidden",
               "messageExpression": "'nodekeeper agent of node ' + variables.boundNode + ' may not modify node ' + object.metadata.name"},
              {"expression": format!("variables.changedLabels.all(k, k == '{EXCLUDE_REMEDIATION_LABEL}')"), "reason": "Forbidden",
               "messageExpression": format!("'nodekeeper agent may change only the label {EXCLUDE_REMEDIATION_LABEL}, not ' + variables.changedLabels.join(', ')")},
              {"expression": format!("variables.changedAnnotations.all(k, k.startsWith('{annotation_prefix}'))"), "reason": "Forbidden",
               "messageExpression": format!("'nodekeeper agent may change only {annotation_prefix}* annotations, not ' + variables.changedAnnotations.join(', ')")}
            ]
          }
        }),
        json!({
          "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
          "metadata": {"name": OWN_NODE_POLICY, "labels": labels()},
          "spec": {"policyName": OWN_NODE_POLICY, "validationActions": ["Deny"]}
        }),
    ]
}
