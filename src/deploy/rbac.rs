//! Identities and what they may do: namespaces, ServiceAccounts, the RBAC
//! table ([`GRANTS`]) keyed by feature and identity (node agent, cluster
//! role) with the reason for every verb, one ClusterRole per identity, and
//! the ValidatingAdmissionPolicy that confines each node agent to its own
//! Node.

use serde_json::{Value, json};

use crate::api::nodemaintenance::{DRAIN_TAINT, LIFECYCLE_CONDITIONS, UNSCHEDULABLE_TAINT};

use super::*;

mod grants;
pub use grants::GRANTS;

/// Who a permission is granted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The node role (`nodekeeper-agent`): DaemonSet pods and host modes.
    Agent,
    /// The cluster role (`nodekeeper-cluster`): the `--all-nodes` Deployment.
    Cluster,
}

impl Identity {
    /// Its ServiceAccount, which is also the name of its ClusterRole.
    pub fn account(self) -> &'static str {
        match self {
            Identity::Agent => AGENT_ACCOUNT,
            Identity::Cluster => CLUSTER_ACCOUNT,
        }
    }
}

/// One permission: which feature needs it, for which identities, and why.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub feature: &'static str,
    pub identities: &'static [Identity],
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub why: &'static str,
    /// Granted only when the feature that needs it is rendered, in a
    /// ClusterRole of its own (`None`: in the identity's ClusterRole).
    pub only_with: Option<Elevated>,
}

/// A grant that lets the cluster role run a pod as any ServiceAccount of a
/// namespace (create a Job, patch a Deployment's template) or remove a
/// node: given only when a feature that needs it is rendered
/// (where-features-meet.md finding 9), each in a ClusterRole of its own so
/// `kubectl get clusterroles` shows what was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elevated {
    /// UpgradePlans' hook Jobs and `strategy.type: Job`, and the mutex
    /// operator's rule Jobs (`manifests --upgrade-jobs`, Helm
    /// `cluster.upgradeJobs`).
    Jobs,
    /// Constellation node replacement (`manifests --replacement`, Helm:
    /// set with `cluster.providerCommand`).
    Replacement,
}

impl Elevated {
    pub const ALL: [Elevated; 2] = [Elevated::Jobs, Elevated::Replacement];

    /// Its ClusterRole (and ClusterRoleBinding).
    pub fn role(self) -> &'static str {
        match self {
            Elevated::Jobs => "nodekeeper-cluster-jobs",
            Elevated::Replacement => "nodekeeper-cluster-replacement",
        }
    }

    /// How it is asked for: the `manifests` switch and the Helm value.
    pub fn asked_by(self) -> &'static str {
        match self {
            Elevated::Jobs => crate::effects::JOBS_GRANT,
            Elevated::Replacement => crate::effects::REPLACEMENT_GRANT,
        }
    }

    /// Whether `o` renders it.
    pub fn rendered(self, o: &Options) -> bool {
        match self {
            Elevated::Jobs => o.upgrade_jobs,
            Elevated::Replacement => o.replacement,
        }
    }
}

/// The README's RBAC table: every grant of [`GRANTS`], who holds it and
/// why, then the two Roles by name (the leader Lease; the notifications'
/// Secrets). A test keeps the README's copy equal to this.
pub fn readme_table() -> String {
    let mut out =
        String::from("| resource | verbs | held by | feature | why |\n|---|---|---|---|---|\n");
    for g in GRANTS.iter() {
        let res = if g.group.is_empty() {
            g.resource.replace(',', ", ")
        } else {
            format!("{} ({})", g.resource.replace(',', ", "), g.group)
        };
        let who = match (g.identities.contains(&Identity::Agent), g.only_with) {
            (true, _) => "node agent, cluster role".to_string(),
            (false, None) => "cluster role".to_string(),
            (false, Some(e)) => format!("cluster role, only with {}", e.asked_by()),
        };
        out.push_str(&format!(
            "| {res} | {} | {who} | {} | {} |\n",
            g.verbs.join(", "),
            g.feature,
            g.why
        ));
    }
    out.push_str("| leases (coordination.k8s.io) in nodekeeper's namespace | get, list, watch, create, update | cluster role | leader election | the leader Lease (a Role); a standby watches it, a stopping leader hands it over by clearing its holder |\n");
    out.push_str("| secrets, by name, in nodekeeper's namespace | get | cluster role | notifications | only the Secrets `manifests --notify-secret`/`--notify-default` (Helm `notifications`) name, read when a notification is delivered; none without them (a Role) |\n");
    out
}

pub(super) fn rules_comment(identity: Identity) -> String {
    let lines: Vec<String> = GRANTS
        .iter()
        .filter(|g| g.identities.contains(&identity))
        .map(|g| {
            let res = if g.group.is_empty() {
                g.resource.to_string()
            } else {
                format!("{}.{}", g.resource, g.group)
            };
            let only = g
                .only_with
                .map(|e| format!(" (only with {})", e.asked_by()))
                .unwrap_or_default();
            format!(
                "#   {res}: {}{only} — [{}] {}",
                g.verbs.join(", "),
                g.feature,
                g.why
            )
        })
        .collect();
    format!("# Verbs granted, and why:\n{}", lines.join("\n"))
}

/// The rules `identity` is granted: for leases (`true`: the medik8s lease
/// Role) or for everything else (`false`: its ClusterRole).
pub(super) fn rules(identity: Identity, leases: bool) -> Value {
    Value::Array(
        GRANTS
            .iter()
            .filter(|g| {
                g.identities.contains(&identity)
                    && (g.resource == "leases") == leases
                    && g.only_with.is_none()
            })
            .map(|g| json!({"apiGroups": [g.group], "resources": g.resource.split(',').collect::<Vec<_>>(), "verbs": g.verbs}))
            .collect(),
    )
}

/// The ClusterRole of grant `e` and its binding to the cluster role.
pub fn elevated(e: Elevated, o: &Options) -> Vec<Value> {
    let rules: Vec<Value> = GRANTS
        .iter()
        .filter(|g| g.only_with == Some(e))
        .map(|g| json!({"apiGroups": [g.group], "resources": g.resource.split(',').collect::<Vec<_>>(), "verbs": g.verbs}))
        .collect();
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": e.role(), "labels": labels()}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": e.role(), "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": e.role()},
               "subjects": [{"kind": "ServiceAccount", "name": CLUSTER_ACCOUNT, "namespace": o.namespace}]}),
    ]
}

/// The ClusterRole of `identity`, named after its ServiceAccount.
pub(super) fn cluster_role(identity: Identity) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": identity.account(), "labels": labels()}, "rules": rules(identity, false)})
}

pub(super) fn service_account(name: &str, o: &Options) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": o.namespace, "labels": labels()}})
}

pub(super) fn labels() -> Value {
    json!({"app.kubernetes.io/name": "nodekeeper"})
}

/// Bind `identity` to its ClusterRole and the medik8s lease Role.
pub(super) fn bindings(identity: Identity, o: &Options) -> Vec<Value> {
    let account = identity.account();
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": o.namespace}]);
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": account, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
               "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": account, "namespace": LEASE_NAMESPACE, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodekeeper-medik8s-lease"},
               "subjects": subject}),
    ]
}

/// nodekeeper's namespace, enforcing the Pod Security level its workloads
/// need: `restricted` for the maintenance-only agent and the cluster role
/// (non-root, no capabilities, RuntimeDefault seccomp), `privileged` for
/// the reboot profile (host PID and capabilities are beyond `baseline`).
pub(super) fn namespace(o: &Options) -> Value {
    let level = if o.reboot { "privileged" } else { "restricted" };
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": o.namespace,
           "labels": {"pod-security.kubernetes.io/enforce": level}}})
}

/// The namespace of the medik8s node leases, shared with medik8s's
/// remediation operators (NMO, SNR, FAR take the same leases): nodekeeper
/// creates it with its manifests but never deletes it (the k3s folder keeps
/// it in a subfolder a plain `kubectl delete -f` leaves alone, Helm keeps it
/// on uninstall), and no nodekeeper identity may create namespaces.
pub fn lease_namespace() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE,
           "annotations": {"nodekeeper.io/shared": "the medik8s node leases, shared with medik8s's remediation operators: not deleted with nodekeeper"}}})
}

/// Namespaces, the node agent's ServiceAccount, the shared roles and the
/// node agent's bindings.
pub fn rbac(o: &Options) -> Vec<Value> {
    let mut docs = vec![
        namespace(o),
        lease_namespace(),
        service_account(AGENT_ACCOUNT, o),
        cluster_role(Identity::Agent),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "nodekeeper-medik8s-lease", "namespace": LEASE_NAMESPACE, "labels": labels()},
               "rules": rules(Identity::Agent, true)}),
    ];
    docs.extend(bindings(Identity::Agent, o));
    docs
}

/// The ValidatingAdmissionPolicy: a request from the node agent's
/// ServiceAccount may update a Node only if its token is bound to that node
/// (directly, or through a pod scheduled there), and may change only
/// nodekeeper's own label and annotations on it, and in its status only
/// the lifecycle conditions. In its spec it may cordon and change only
/// the two taints a maintenance sets (medik8s's drain taint and the
/// unschedulable one); finalizers and owner references stay as they are,
/// so a stolen token can neither keep pods off the node with a taint of
/// its own nor hold the Node's deletion.
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
    // Condition types whose entry was added, changed or removed.
    let changed_conditions = "object.status.?conditions.orValue([]).filter(c, !oldObject.status.?conditions.orValue([]).exists(o, o == c)).map(c, c.type) + \
         oldObject.status.?conditions.orValue([]).filter(o, !object.status.?conditions.orValue([]).exists(c, c.type == o.type)).map(o, o.type)";
    let lifecycle = format!(
        "[{}]",
        LIFECYCLE_CONDITIONS
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Every other status field stays as it was, whatever fields this
    // Kubernetes version has (status is a map to CEL at run time).
    let changed_status = "object.status.filter(k, k != 'conditions' && (!(k in oldObject.status) || object.status[k] != oldObject.status[k])) + \
         oldObject.status.filter(k, k != 'conditions' && !(k in object.status))";
    // The same for the spec, but for the cordon and the taints.
    let changed_spec = "object.spec.filter(k, k != 'unschedulable' && k != 'taints' && (!(k in oldObject.spec) || object.spec[k] != oldObject.spec[k])) + \
         oldObject.spec.filter(k, k != 'unschedulable' && k != 'taints' && !(k in object.spec))";
    let ours = format!("['{DRAIN_TAINT}', '{UNSCHEDULABLE_TAINT}']");
    let other_taints =
        |o: &str| format!("{o}.spec.?taints.orValue([]).filter(t, !(t.key in {ours}))");
    let mut policies: Vec<Value> = agent_policy(
        OWN_NODE_POLICY,
        &user,
        json!({"apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["nodes", "nodes/status"]}),
        json!([
              {"name": "changedLabels", "expression": changed("labels")},
              {"name": "changedAnnotations", "expression": changed("annotations")},
              {"name": "changedConditions", "expression": changed_conditions},
              {"name": "changedStatus", "expression": changed_status},
              {"name": "changedSpec", "expression": changed_spec}
        ]),
        json!([
              {"expression": "variables.boundNode == object.metadata.name", "reason": "Forbidden",
               "messageExpression": "'nodekeeper agent of node ' + variables.boundNode + ' may not modify node ' + object.metadata.name"},
              {"expression": format!("variables.changedLabels.all(k, k == '{EXCLUDE_REMEDIATION_LABEL}')"), "reason": "Forbidden",
               "messageExpression": format!("'nodekeeper agent may change only the label {EXCLUDE_REMEDIATION_LABEL}, not ' + variables.changedLabels.join(', ')")},
              {"expression": format!("variables.changedAnnotations.all(k, k.startsWith('{annotation_prefix}'))"), "reason": "Forbidden",
               "messageExpression": format!("'nodekeeper agent may change only {annotation_prefix}* annotations, not ' + variables.changedAnnotations.join(', ')")},
              {"expression": format!("variables.changedConditions.all(t, t in {lifecycle})"), "reason": "Forbidden",
               "messageExpression": "'nodekeeper agent may change only the node lifecycle conditions (KEP-5683), not ' + variables.changedConditions.join(', ')"},
              {"expression": "variables.changedStatus.size() == 0", "reason": "Forbidden",
               "messageExpression": "'nodekeeper agent may not change node status ' + variables.changedStatus.join(', ')"},
              {"expression": "variables.changedSpec.size() == 0", "reason": "Forbidden",
               "messageExpression": "'nodekeeper agent may change only the cordon and its own taints in node spec, not ' + variables.changedSpec.join(', ')"},
              {"expression": format!("{} == {}", other_taints("object"), other_taints("oldObject")), "reason": "Forbidden",
               "message": format!("nodekeeper agent may add or remove only the taints {DRAIN_TAINT} and {UNSCHEDULABLE_TAINT}")},
              {"expression": "object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) && object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])", "reason": "Forbidden",
               "message": "nodekeeper agent may not change a node's finalizers or owner references"}
        ]),
    )
    .to_vec();
    policies.extend(own_maintenance_policy(&user));
    policies
}

/// The node agent may delete a NodeMaintenance only of its own node and
/// only a RebootPolicy's or an UpgradePlan's: it gives its node back after
/// the reboot or upgrade it ran (`decide::reboot::node`,
/// `decide::upgrade::node`), and nothing else — never an administrator's.
fn own_maintenance_policy(user: &str) -> [Value; 2] {
    let owner = crate::api::nodemaintenance::OWNER_LABEL;
    let reboot = crate::api::reboot::OWNER_KIND;
    let upgrade = crate::api::upgrade::OWNER_KIND;
    agent_policy(
        OWN_MAINTENANCE_POLICY,
        user,
        json!({"apiGroups": ["nodemaintenance.medik8s.io"], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["nodemaintenances"]}),
        json!([]),
        json!([
          {"expression": "oldObject.spec.nodeName == variables.boundNode", "reason": "Forbidden",
           "messageExpression": "'nodekeeper agent of node ' + variables.boundNode + ' may not delete a NodeMaintenance of node ' + oldObject.spec.nodeName"},
          {"expression": format!("oldObject.metadata.?labels.orValue({{}})[?'{owner}'].orValue('') in ['{reboot}', '{upgrade}']"), "reason": "Forbidden",
           "message": "nodekeeper agent may delete only a RebootPolicy's or an UpgradePlan's NodeMaintenance (its node given back after the reboot or upgrade)"}
        ]),
    )
}

/// A ValidatingAdmissionPolicy on the node agent's requests that `rule`
/// matches, and its binding: the variable `boundNode` (the node its token
/// is bound to, directly or through its pod) before `variables`, and a
/// token bound to nothing refused before `validations`.
fn agent_policy(
    name: &str,
    user: &str,
    rule: Value,
    variables: Value,
    validations: Value,
) -> [Value; 2] {
    let mut all_variables = vec![json!({"name": "boundNode", "expression": format!(
        "'{NODE_NAME_EXTRA}' in request.userInfo.extra ? request.userInfo.extra['{NODE_NAME_EXTRA}'][0] : ''")})];
    all_variables.extend(variables.as_array().into_iter().flatten().cloned());
    let mut all_validations = vec![
        json!({"expression": "variables.boundNode != ''", "reason": "Forbidden",
        "message": format!("{user} must use a token bound to a pod or a node (a DaemonSet pod's token, or kubectl create token --bound-object-kind Node)")}),
    ];
    all_validations.extend(validations.as_array().into_iter().flatten().cloned());
    [
        json!({
          "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
          "metadata": {"name": name, "labels": labels()},
          "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "matchConditions": [{"name": "node-agent", "expression": format!("request.userInfo.username == '{user}'")}],
            "variables": all_variables,
            "validations": all_validations
          }
        }),
        json!({
          "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
          "metadata": {"name": name, "labels": labels()},
          "spec": {"policyName": name, "validationActions": ["Deny"]}
        }),
    ]
}
