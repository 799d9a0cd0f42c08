//! Deployment artifacts, generated from the same types and constants the
//! agent uses so they cannot drift from the code: `nodekeeper manifests --for
//! TARGET [--out DIR]`. The checked-in copies under `k3s-manifests/` and
//! `image/` are these outputs with the default [`Options`]; a test fails when
//! they differ.
//!
//! Identities: the node agent (`nodekeeper-agent`, one per node: DaemonSet
//! pods, or host modes with a node-bound token of the same ServiceAccount)
//! and cluster mode (`nodekeeper-cluster`, the `--all-nodes` Deployment).
//! Both get exactly the verbs in [`AGENT_RULES`]; cluster mode adds its
//! leader Lease. The ValidatingAdmissionPolicy in [`admission`] then
//! confines the node agent to its own Node.

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::nodemaintenance::{
    APPLIED_ANNOTATION, CORDONED_ANNOTATION, EXCLUDE_REMEDIATION_LABEL, LEASE_NAMESPACE,
};

/// The node agent's ServiceAccount (DaemonSet pods and host-mode tokens).
pub const AGENT_ACCOUNT: &str = "nodekeeper-agent";
/// The `--all-nodes` Deployment's ServiceAccount.
pub const CLUSTER_ACCOUNT: &str = "nodekeeper-cluster";
/// The ClusterRole both identities are bound to.
pub const AGENT_ROLE: &str = "nodekeeper-agent";
/// The admission policy (and its binding) confining node agents.
pub const OWN_NODE_POLICY: &str = "nodekeeper-own-node";
/// The port `/metrics`, `/healthz` and `/readyz` are served on.
pub const METRICS_PORT: u16 = 9477;
/// The user-info extra key the API server fills from a token bound to a pod
/// (its node) or to a node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The knobs a deployment needs. One set of defaults serves every target.
#[derive(Debug, Clone)]
pub struct Options {
    /// Image reference. The default is the name `just image` gives the
    /// archive, which OS images preload (no registry involved).
    pub image: String,
    /// Namespace of the agents, their ServiceAccounts and the leader Lease.
    pub namespace: String,
    /// Kubeconfig path on the host (static pod, systemd, Talos).
    pub kubeconfig: String,
    /// nodekeeper's log level: error, warn, info, debug or trace.
    pub log_level: String,
    /// `--metrics-address` for every mode; `None` takes each mode's default
    /// (all interfaces in pods on the pod network, loopback on the host).
    pub metrics_address: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            image: format!("localhost/nodekeeper:{}", env!("CARGO_PKG_VERSION")),
            namespace: "nodekeeper".into(),
            kubeconfig: "/etc/nodekeeper/kubeconfig".into(),
            log_level: "info".into(),
            metrics_address: None,
        }
    }
}

impl Options {
    /// Reject values that would produce broken manifests.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, why: &str| Err(Error::Invalid(format!("{what}: {why}")));
        if self.image.trim().is_empty() || self.image.contains(char::is_whitespace) {
            return bad("--image", "must be an image reference without spaces");
        }
        let ns = &self.namespace;
        if ns.is_empty()
            || ns.len() > 63
            || !ns
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            || ns.starts_with('-')
            || ns.ends_with('-')
        {
            return bad(
                "--namespace",
                &format!("{ns:?} is not a valid namespace name"),
            );
        }
        if !self.kubeconfig.starts_with('/') {
            return bad("--kubeconfig", "must be an absolute path on the host");
        }
        if !["error", "warn", "info", "debug", "trace"].contains(&self.log_level.as_str()) {
            return bad(
                "--log-level",
                &format!(
                    "{:?} is not one of error, warn, info, debug, trace",
                    self.log_level
                ),
            );
        }
        if let Some(a) = &self.metrics_address {
            crate::metrics::parse_address(a)?;
        }
        Ok(())
    }

    fn rust_log(&self) -> String {
        format!("nodekeeper={}", self.log_level)
    }

    fn pod_metrics(&self) -> String {
        self.metrics_address
            .clone()
            .unwrap_or_else(|| format!(":{METRICS_PORT}"))
    }

    fn host_metrics(&self) -> String {
        self.metrics_address
            .clone()
            .unwrap_or_else(|| crate::metrics::DEFAULT_ADDRESS.to_string())
    }

    fn metrics_port(&self, default: &str) -> u16 {
        let addr = self.metrics_address.as_deref().unwrap_or(default);
        match crate::metrics::parse_address(addr) {
            Ok(Some(a)) => a.port(),
            _ => METRICS_PORT,
        }
    }

    fn metrics_off(&self) -> bool {
        matches!(
            self.metrics_address
                .as_deref()
                .map(crate::metrics::parse_address),
            Some(Ok(None))
        )
    }
}

/// One generated file: its path relative to the output folder, and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub content: String,
}

/// Every target, what it is for, and where its checked-in copy lives
/// (relative to the repository root; `None`: not checked in).
pub const TARGETS: [(&str, &str, Option<&str>); 10] = [
    ("crds", "the CustomResourceDefinitions", None),
    (
        "rbac",
        "namespaces, the node agent's ServiceAccount and RBAC",
        None,
    ),
    (
        "admission",
        "the ValidatingAdmissionPolicy confining node agents to their own Node",
        None,
    ),
    ("daemonset", "the node agent as a DaemonSet", None),
    (
        "deployment",
        "cluster mode (--all-nodes): its ServiceAccount, RBAC and a leader-elected Deployment",
        None,
    ),
    (
        "k3s",
        "crds + rbac + admission + daemonset as files for k3s's auto-deploy folder",
        Some("k3s-manifests"),
    ),
    (
        "static-pod",
        "the node agent as a static pod (host network, before CNI)",
        Some("image"),
    ),
    (
        "systemd",
        "the node agent as a host service: unit and environment file",
        Some("image"),
    ),
    (
        "talos",
        "a Talos system extension: manifest and extension service",
        Some("image/talos"),
    ),
    (
        "containerfile",
        "a FROM-scratch image recipe",
        Some("image"),
    ),
];

/// Render one target's files.
pub fn render(target: &str, o: &Options) -> Result<Vec<File>> {
    o.validate()?;
    let file = |path: &str, what: &str, body: String| File {
        path: path.into(),
        content: format!(
            "# {what}\n# Generated by `nodekeeper manifests --for {target}`; do not edit.\n{body}"
        ),
    };
    let yaml = |docs: &[Value]| crate::yaml::documents(docs);
    Ok(match target {
        "crds" => vec![file("crds.yaml", "nodekeeper's CRDs", yaml(&crds()?))],
        "rbac" => vec![file(
            "rbac.yaml",
            &format!("nodekeeper's node agent identity.\n{}", rules_comment()),
            yaml(&rbac(o)),
        )],
        "admission" => vec![file(
            "admission.yaml",
            "Confines each node agent to its own Node (Kubernetes >= 1.30)",
            yaml(&admission(o)),
        )],
        "daemonset" => vec![file(
            "daemonset.yaml",
            "nodekeeper's node agent as a DaemonSet (needs crds, rbac and admission)",
            yaml(&[daemonset(o)]),
        )],
        "deployment" => vec![file(
            "deployment.yaml",
            "nodekeeper in cluster mode: one leader-elected agent for every node (needs crds and rbac)",
            yaml(&deployment(o)),
        )],
        "k3s" => vec![
            file(
                "nodekeeper-crds.yaml",
                "nodekeeper for k3s: copy this folder into /var/lib/rancher/k3s/server/manifests/",
                yaml(&crds()?),
            ),
            file(
                "nodekeeper-rbac.yaml",
                &format!(
                    "nodekeeper for k3s: the node agent identity.\n{}",
                    rules_comment()
                ),
                yaml(&rbac(o)),
            ),
            file(
                "nodekeeper-admission.yaml",
                "nodekeeper for k3s: confines each node agent to its own Node",
                yaml(&admission(o)),
            ),
            file(
                "nodekeeper-daemonset.yaml",
                "nodekeeper for k3s: the node agent on every node",
                yaml(&[daemonset(o)]),
            ),
        ],
        "static-pod" => vec![file(
            "static-pod.yaml",
            &format!(
                "nodekeeper as a static pod: copy into the kubelet's staticPodPath\n\
                 # (/etc/kubernetes/manifests, or /var/lib/rancher/k3s/agent/pod-manifests on k3s).\n\
                 # Needs a kubeconfig at {} on the host (see README, Deploy).",
                o.kubeconfig
            ),
            yaml(&[static_pod(o)]),
        )],
        "systemd" => vec![
            file(
                "nodekeeper.service",
                "nodekeeper as a host service: /etc/systemd/system/nodekeeper.service",
                systemd_unit(o),
            ),
            file(
                "nodekeeper.env",
                "Settings for nodekeeper.service: /etc/nodekeeper/nodekeeper.env (optional)",
                systemd_env(o),
            ),
        ],
        "talos" => vec![
            file(
                "manifest.yaml",
                "Talos system extension metadata (the image's /manifest.yaml)",
                yaml(&[talos_manifest()]),
            ),
            file(
                "rootfs/usr/local/etc/containers/nodekeeper.yaml",
                "Talos extension service; the binary is rootfs/usr/local/lib/containers/nodekeeper/nodekeeper",
                yaml(&[talos_service(o)]),
            ),
            file(
                "extension-service-config.yaml",
                "Example machine-config document for the extension: the kubeconfig and node name",
                yaml(&[talos_service_config(o)]),
            ),
        ],
        "containerfile" => vec![file(
            "Containerfile",
            "A FROM-scratch image holding only the static binary and CA certificates.\n\
             # `just image` builds the same image as an OCI archive without a container daemon and\n\
             # stages this recipe's build context: buildah build -f image/Containerfile target/image/context",
            containerfile(),
        )],
        other => {
            let known: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
            return Err(Error::Invalid(format!(
                "unknown target {other:?}; choose one of: {}",
                known.join(", ")
            )));
        }
    })
}

/// What `manifests --for T` prints without `--out`: a single file as is, or
/// YAML files as one multi-document stream (what `kubectl apply -f -` and
/// k3s accept). Other multi-file targets need a folder.
pub fn to_stdout(target: &str, files: &[File]) -> Result<String> {
    match files {
        [one] => Ok(one.content.clone()),
        many if many.iter().all(|f| f.path.ends_with(".yaml")) && target != "talos" => {
            Ok(many.iter().map(|f| f.content.as_str()).collect())
        }
        many => Err(Error::Invalid(format!(
            "{target} is {} files ({}); write them with --out DIR",
            many.len(),
            many.iter()
                .map(|f| f.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Write `files` under `dir`, creating folders as needed.
pub fn write(dir: &std::path::Path, files: &[File]) -> Result<()> {
    for f in files {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(Error::io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&path, &f.content)
            .map_err(Error::io(format!("writing {}", path.display())))?;
    }
    Ok(())
}

fn crds() -> Result<Vec<Value>> {
    crate::nodemaintenance::crds()
        .iter()
        .map(serde_json::to_value)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Invalid(format!("encoding CRDs: {e}")))
}

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

fn rules_comment() -> String {
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
fn rules(leases: bool) -> Value {
    Value::Array(
        AGENT_RULES
            .iter()
            .filter(|(_, r, _, _)| (*r == "leases") == leases)
            .map(|(g, r, v, _)| json!({"apiGroups": [g], "resources": [r], "verbs": v}))
            .collect(),
    )
}

fn service_account(name: &str, o: &Options) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": o.namespace, "labels": labels()}})
}

fn labels() -> Value {
    json!({"app.kubernetes.io/name": "nodekeeper"})
}

/// Bind `account` to the agent ClusterRole and the medik8s lease Role.
fn bindings(account: &str, o: &Options) -> Vec<Value> {
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

fn pod_env(o: &Options) -> Value {
    json!([
      {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
      {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
      {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
      {"name": "RUST_LOG", "value": o.rust_log()}
    ])
}

/// Resource figures from `just bench-drain`: 6.5 MiB idle and 8.5 MiB peak
/// RSS with 110 pods on the node; the limit leaves room for bigger nodes.
fn resources() -> Value {
    json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}})
}

fn restricted_security() -> Value {
    json!({"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
           "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
           "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}})
}

fn probe(path: &str, port: u16, host: Option<&str>) -> Value {
    let mut get = json!({"path": path, "port": port});
    if let Some(h) = host {
        get["host"] = json!(h);
    }
    json!({"httpGet": get, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3})
}

/// The agent container for pod-network workloads (DaemonSet, Deployment).
fn pod_container(o: &Options, args: &[&str], readiness: bool) -> Value {
    let metrics = o.pod_metrics();
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(["--metrics-address".into(), metrics.clone()]);
    let mut c = json!({
      "name": "nodekeeper", "image": o.image, "imagePullPolicy": "IfNotPresent",
      "args": args, "env": pod_env(o), "resources": resources(),
      "securityContext": restricted_security()
    });
    if !o.metrics_off() {
        let port = o.metrics_port(&metrics);
        c["ports"] = json!([{"name": "metrics", "containerPort": port, "protocol": "TCP"}]);
        c["livenessProbe"] = probe("/healthz", port, None);
        if readiness {
            c["readinessProbe"] = probe("/readyz", port, None);
        }
    }
    c
}

pub fn daemonset(o: &Options) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
    "metadata": {"name": "nodekeeper", "namespace": o.namespace, "labels": labels()},
    "spec": {
      "selector": {"matchLabels": labels()},
      "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
      "template": {
        "metadata": {"labels": labels()},
        "spec": {
          "serviceAccountName": AGENT_ACCOUNT,
          "priorityClassName": "system-node-critical",
          // It must keep running on the nodes it cordons and taints, and on
          // control-plane nodes.
          "tolerations": [{"operator": "Exists"}],
          "terminationGracePeriodSeconds": 30,
          "containers": [pod_container(o, &["run"], true)]
        }
      }
    }})
}

/// Cluster mode: its own identity, the leader Lease it needs, and two
/// replicas of which one leads.
pub fn deployment(o: &Options) -> Vec<Value> {
    let mut docs = vec![service_account(CLUSTER_ACCOUNT, o)];
    docs.extend(bindings(CLUSTER_ACCOUNT, o));
    docs.extend([
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "nodekeeper-leader", "namespace": o.namespace, "labels": labels()},
               "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                          "verbs": ["get", "create", "update"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "nodekeeper-leader", "namespace": o.namespace, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodekeeper-leader"},
               "subjects": [{"kind": "ServiceAccount", "name": CLUSTER_ACCOUNT, "namespace": o.namespace}]}),
    ]);
    let sel =
        json!({"app.kubernetes.io/name": "nodekeeper", "app.kubernetes.io/component": "cluster"});
    docs.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "nodekeeper-cluster", "namespace": o.namespace, "labels": sel},
    "spec": {
      "replicas": 2,
      "selector": {"matchLabels": sel},
      "template": {
        "metadata": {"labels": sel},
        "spec": {
          "serviceAccountName": CLUSTER_ACCOUNT,
          "priorityClassName": "system-cluster-critical",
          // The standby waits for the Lease and never becomes ready, so
          // only liveness is probed.
          "containers": [pod_container(o, &["run", "--all-nodes"], false)]
        }
      }
    }}));
    docs
}

/// A static pod: host network (it runs before any CNI), a kubeconfig from
/// the host, started by the kubelet before any controller.
fn static_pod(o: &Options) -> Value {
    let metrics = o.host_metrics();
    let dir = std::path::Path::new(&o.kubeconfig)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    let mut c = json!({
      "name": "nodekeeper", "image": o.image, "imagePullPolicy": "IfNotPresent",
      "args": ["run", "--kubeconfig", o.kubeconfig, "--metrics-address", metrics],
      "env": [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "RUST_LOG", "value": o.rust_log()}
      ],
      "volumeMounts": [{"name": "kubeconfig", "mountPath": dir, "readOnly": true}],
      "resources": resources(),
      // Root only so a root-owned 0600 kubeconfig stays readable; no
      // capabilities, no escalation, nothing writable.
      "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                          "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    });
    if !o.metrics_off() {
        let port = o.metrics_port(&metrics);
        let host = match crate::metrics::parse_address(&metrics) {
            Ok(Some(a)) if a.ip().is_unspecified() => "127.0.0.1".to_string(),
            Ok(Some(a)) => a.ip().to_string(),
            _ => "127.0.0.1".into(),
        };
        c["livenessProbe"] = probe("/healthz", port, Some(&host));
    }
    json!({
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "nodekeeper", "namespace": "kube-system", "labels": labels()},
      "spec": {
        "hostNetwork": true,
        // Resolve through the host: cluster DNS may not exist yet.
        "dnsPolicy": "Default",
        "priorityClassName": "system-node-critical",
        "containers": [c],
        "volumes": [{"name": "kubeconfig", "hostPath": {"path": dir, "type": "Directory"}}]
      }
    })
}

fn systemd_unit(o: &Options) -> String {
    format!(
        "\
[Unit]
Description=nodekeeper: node maintenance, drains, reboots and upgrades for Kubernetes
Wants=network-online.target
After=network-online.target
# Retry for ever: the API server may come up long after this host.
StartLimitIntervalSec=0

[Service]
Type=exec
# The node as the kubelet registered it: the host name unless the env file
# says otherwise.
Environment=NODE_NAME=%H
Environment=KUBECONFIG={kubeconfig}
Environment=RUST_LOG={rust_log}
Environment=NODEKEEPER_ARGS=
EnvironmentFile=-/etc/nodekeeper/nodekeeper.env
ExecStart=/usr/local/bin/nodekeeper run --metrics-address {metrics} $NODEKEEPER_ARGS
# Start-up errors (API server not up yet, node not registered yet) exit
# non-zero with one line in the journal; systemd retries.
Restart=always
RestartSec=5
TimeoutStopSec=30
# Root only to read a root-owned 0600 kubeconfig; every capability is gone.
CapabilityBoundingSet=
AmbientCapabilities=
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
MemoryMax=64M

[Install]
WantedBy=multi-user.target
",
        kubeconfig = o.kubeconfig,
        rust_log = o.rust_log(),
        metrics = o.host_metrics(),
    )
}

fn systemd_env(o: &Options) -> String {
    format!(
        "\
# Uncomment to override what nodekeeper.service sets.
# The node's name as registered in Kubernetes (default: the host name).
#NODE_NAME=
# Credentials: a kubeconfig with a node-bound token (see README, Deploy).
#KUBECONFIG={kubeconfig}
# Log level: nodekeeper=error|warn|info|debug|trace.
#RUST_LOG={rust_log}
# More flags for `nodekeeper run`, e.g. --drain-timeout 60.
#NODEKEEPER_ARGS=
",
        kubeconfig = o.kubeconfig,
        rust_log = o.rust_log(),
    )
}

fn talos_manifest() -> Value {
    json!({
      "version": "v1alpha1",
      "metadata": {
        "name": "nodekeeper",
        "version": env!("CARGO_PKG_VERSION"),
        "author": "nodekeeper authors",
        "description": "nodekeeper keeps the node healthy through maintenance, drains, reboots and upgrades; runs as the ext-nodekeeper service",
        // ExtensionServiceConfig (the kubeconfig) arrived in Talos 1.7.
        "compatibility": {"talos": {"version": ">= v1.7.0"}}
      }
    })
}

fn talos_service(o: &Options) -> Value {
    json!({
      "name": "nodekeeper",
      "depends": [
        // Waits for the ExtensionServiceConfig that carries the kubeconfig.
        {"configuration": true},
        {"network": ["addresses", "connectivity", "hostname", "etcfiles"]}
      ],
      "container": {
        "entrypoint": "./nodekeeper",
        "args": ["run", "--kubeconfig", o.kubeconfig, "--metrics-address", o.host_metrics()],
        "environment": [format!("RUST_LOG={}", o.rust_log())],
        "security": {"writeableRootfs": false}
      },
      "restart": "always"
    })
}

fn talos_service_config(o: &Options) -> Value {
    json!({
      "apiVersion": "v1alpha1",
      "kind": "ExtensionServiceConfig",
      "name": "nodekeeper",
      "configFiles": [{
        "content": "REPLACE with the node's kubeconfig (nodekeeper host-kubeconfig NODE)",
        "mountPath": o.kubeconfig
      }],
      "environment": ["NODE_NAME=REPLACE-with-the-node-name"]
    })
}

fn containerfile() -> String {
    "\
FROM scratch
COPY nodekeeper /nodekeeper
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT [\"/nodekeeper\"]
CMD [\"run\"]
"
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_renders_with_defaults() {
        for (t, _, _) in TARGETS {
            let files = render(t, &Options::default());
            assert!(
                files.as_ref().is_ok_and(|f| !f.is_empty()),
                "{t}: {files:?}"
            );
        }
    }

    #[test]
    fn options_flow_into_the_manifests() {
        let o = Options {
            image: "registry.example/nk:9".into(),
            namespace: "ops".into(),
            kubeconfig: "/var/lib/nk/kc".into(),
            log_level: "debug".into(),
            metrics_address: Some("127.0.0.1:9999".into()),
        };
        let text: String = ["k3s", "static-pod", "systemd", "deployment"]
            .iter()
            .flat_map(|t| render(t, &o).unwrap_or_default())
            .map(|f| f.content)
            .collect();
        for want in [
            "registry.example/nk:9",
            "namespace: ops",
            "system:serviceaccount:ops:nodekeeper-agent",
            "/var/lib/nk/kc",
            "nodekeeper=debug",
            "127.0.0.1:9999",
            "containerPort: 9999",
        ] {
            assert!(text.contains(want), "missing {want}");
        }
        assert!(!text.contains("namespace: nodekeeper\n"));
    }

    #[test]
    fn bad_options_are_refused_with_the_flag_named() {
        let cases = [
            (
                Options {
                    namespace: "Ops".into(),
                    ..Default::default()
                },
                "--namespace",
            ),
            (
                Options {
                    kubeconfig: "kc".into(),
                    ..Default::default()
                },
                "--kubeconfig",
            ),
            (
                Options {
                    log_level: "loud".into(),
                    ..Default::default()
                },
                "--log-level",
            ),
            (
                Options {
                    image: "".into(),
                    ..Default::default()
                },
                "--image",
            ),
            (
                Options {
                    metrics_address: Some("x".into()),
                    ..Default::default()
                },
                "--metrics-address",
            ),
        ];
        for (o, flag) in cases {
            let err = render("daemonset", &o)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn metrics_off_drops_ports_and_probes() {
        let o = Options {
            metrics_address: Some("off".into()),
            ..Default::default()
        };
        let ds = daemonset(&o);
        let c = &ds["spec"]["template"]["spec"]["containers"][0];
        assert!(c.get("livenessProbe").is_none() && c.get("ports").is_none());
        assert!(c["args"].to_string().contains("off"));
    }

    #[test]
    fn multi_file_targets_need_a_folder_unless_they_are_one_yaml_stream() {
        let o = Options::default();
        let k3s = render("k3s", &o).unwrap_or_default();
        assert!(to_stdout("k3s", &k3s).is_ok_and(|s| s.contains("kind: DaemonSet")));
        let talos = render("talos", &o).unwrap_or_default();
        let err = to_stdout("talos", &talos)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("--out DIR") && err.contains("manifest.yaml"),
            "{err}"
        );
    }
}
