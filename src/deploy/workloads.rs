//! The in-cluster run modes, each with its security profile: the node-role
//! DaemonSet, the cluster-role Deployment, and the static pod (host network,
//! before any CNI).

use serde_json::{Value, json};

use super::*;

pub(super) fn pod_env(o: &Options) -> Value {
    json!([
      {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
      {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
      {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
      {"name": "RUST_LOG", "value": o.rust_log()}
    ])
}

/// Resource figures from `just bench-drain`: 6.7 MiB idle and 9.8 MiB peak
/// RSS with 110 pods on the node; the limit leaves room for bigger nodes.
pub(super) fn resources() -> Value {
    json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}})
}

/// The pod run modes, each with its security profile. Nothing nodekeeper
/// does needs a capability, host PID or a writable root, except rebooting
/// the host: only the node-role modes rendered with `--reboot` get what
/// that takes ([`reboot_profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PodMode {
    /// Node role as a DaemonSet pod: pod network, pod-bound token.
    DaemonSet,
    /// Cluster role as a Deployment: pod network, its own identity.
    Deployment,
    /// Node role as a static pod: host network, kubeconfig from the host.
    StaticPod,
}

impl PodMode {
    /// The container's securityContext: no capabilities, no escalation,
    /// nothing writable, the runtime's seccomp profile, the image's non-root
    /// user.
    pub(super) fn security(self) -> Value {
        let mut sc = json!({"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}});
        // Every mode runs as the image's user. The static pod reads its
        // kubeconfig from the host as group 65532: `host-kubeconfig --out
        // FILE --group 65532` writes it root-owned, mode 0640.
        sc["runAsNonRoot"] = json!(true);
        sc["runAsUser"] = json!(IMAGE_USER);
        sc["runAsGroup"] = json!(IMAGE_USER);
        sc
    }
}

/// What a node-role pod needs to reboot its host, and no more: host PID
/// (to reach PID 1), root, and three capabilities — SYS_PTRACE to open PID
/// 1's /proc entries (its capabilities exceed ours), SYS_ADMIN and
/// SYS_CHROOT for setns(2) into its mount namespace (`host-exec`); `systemctl
/// reboot` then asks systemd over D-Bus as root with SYS_ADMIN. AppArmor's
/// runtime default forbids reading an unconfined PID 1's /proc entries, so
/// the container is unconfined by AppArmor; seccomp stays RuntimeDefault
/// (it allows setns with SYS_ADMIN). kured runs fully privileged instead.
/// The sentinel file is read through /proc/1/root: no hostPath mount.
pub(super) fn reboot_profile(pod: &mut Value, container: &mut Value, upgrade: bool) {
    pod["hostPID"] = json!(true);
    let sc = &mut container["securityContext"];
    // Root, said outright: the image's USER is 65532, and capabilities added
    // to a non-root container are not effective under every runtime. The
    // group stays the image's, so a static pod's 0640 kubeconfig is readable
    // either way.
    sc["runAsNonRoot"] = json!(false);
    sc["runAsUser"] = json!(0);
    sc["capabilities"] = json!({"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"]});
    sc["appArmorProfile"] = json!({"type": "Unconfined"});
    if upgrade {
        // Host root, said plainly: upgrade commands (a package manager)
        // write anywhere, change owners, load modules. They run as the
        // host's processes (effects::host_run) with the capabilities this
        // container has, so it has them all.
        sc["privileged"] = json!(true);
        sc["allowPrivilegeEscalation"] = json!(true);
        sc["seccompProfile"] = json!({"type": "Unconfined"});
        if let Some(sc) = sc.as_object_mut() {
            sc.remove("capabilities");
        }
    }
    if let Some(args) = container["args"].as_array_mut() {
        args.extend(["--host-root", "/proc/1/root", "--host-exec"].map(|a| json!(a)));
    }
}

pub(super) fn probe(path: &str, port: u16, host: Option<&str>) -> Value {
    let mut get = json!({"path": path, "port": port});
    if let Some(h) = host {
        get["host"] = json!(h);
    }
    json!({"httpGet": get, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3})
}

/// The agent container for pod-network workloads (DaemonSet, Deployment).
pub(super) fn pod_container(o: &Options, mode: PodMode, args: &[&str], readiness: bool) -> Value {
    let metrics = o.pod_metrics();
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(["--metrics-address".into(), metrics.clone()]);
    let mut c = json!({
      "name": "nodekeeper", "image": o.image, "imagePullPolicy": "IfNotPresent",
      "args": args, "env": pod_env(o), "resources": resources(),
      "securityContext": mode.security()
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
    let mut container = pod_container(o, PodMode::DaemonSet, &["run"], true);
    let mut pod = json!({
      "serviceAccountName": AGENT_ACCOUNT,
      "priorityClassName": "system-node-critical",
      // It must keep running on the nodes it cordons and taints, and on
      // control-plane nodes.
      "tolerations": [{"operator": "Exists"}],
      "terminationGracePeriodSeconds": 30
    });
    if o.reboot {
        reboot_profile(&mut pod, &mut container, o.upgrade);
    }
    pod["containers"] = json!([container]);
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
    "metadata": {"name": "nodekeeper", "namespace": o.namespace, "labels": labels()},
    "spec": {
      "selector": {"matchLabels": labels()},
      "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
      "template": {
        "metadata": {"labels": labels()},
        "spec": pod
      }
    }})
}

/// The FlowSchema that gives the cluster role's leader Lease the API
/// server's `leader-election` priority level, as `system-leader-election`
/// gives the controller manager's and the scheduler's. Without it the
/// renewals fall under the default `service-accounts` schema into
/// `workload-low`, in one flow with the cluster role's own evictions: on an
/// overloaded server a renewal queued behind a burst's evictions missed its
/// 10 s deadline and the leader stepped down mid-burst (bench-scale at 5 000
/// nodes). Only the leader namespace's leases: the medik8s node leases are
/// per-node work, not election. A cluster role whose `--leader-namespace` is
/// elsewhere needs that namespace added here; a schema naming a priority
/// level the server lacks is marked Dangling and skipped, never an error.
pub const LEADER_FLOW_SCHEMA: &str = "nodekeeper-leader-election";

fn leader_flow_schema(o: &Options) -> Value {
    json!({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
    "metadata": {"name": LEADER_FLOW_SCHEMA, "labels": labels()},
    "spec": {
      // Before the catch-all service-accounts (9000); beside
      // workload-leader-election (200), which does this for kube-system's.
      "matchingPrecedence": 200,
      "priorityLevelConfiguration": {"name": "leader-election"},
      "distinguisherMethod": {"type": "ByUser"},
      "rules": [{
        "subjects": [{"kind": "ServiceAccount",
                      "serviceAccount": {"name": CLUSTER_ACCOUNT, "namespace": o.namespace}}],
        "resourceRules": [{"verbs": ["get", "list", "watch", "create", "update"],
                           "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "namespaces": [o.namespace]}]
      }]
    }})
}

/// Cluster mode: its own identity, the leader Lease it needs, and two
/// replicas of which one leads.
pub fn deployment(o: &Options) -> Vec<Value> {
    let mut docs = vec![
        service_account(CLUSTER_ACCOUNT, o),
        cluster_role(Identity::Cluster),
    ];
    docs.extend(bindings(Identity::Cluster, o));
    for e in Elevated::ALL.into_iter().filter(|e| e.rendered(o)) {
        docs.extend(elevated(e, o));
    }
    docs.extend([
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "nodekeeper-leader", "namespace": o.namespace, "labels": labels()},
               "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                          // update also hands the lease over at shutdown
                          // (no delete); a standby watches it to lead at once.
                          "verbs": ["get", "list", "watch", "create", "update"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "nodekeeper-leader", "namespace": o.namespace, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodekeeper-leader"},
               "subjects": [{"kind": "ServiceAccount", "name": CLUSTER_ACCOUNT, "namespace": o.namespace}]}),
        leader_flow_schema(o),
    ]);
    docs.extend(notify_rbac(o));
    let sel =
        json!({"app.kubernetes.io/name": "nodekeeper", "app.kubernetes.io/component": "cluster"});
    let cluster_args: &[&str] = if o.node_agents {
        &["run", "--all-nodes", "--node-agents"]
    } else {
        &["run", "--all-nodes"]
    };
    let mut cluster_container = pod_container(o, PodMode::Deployment, cluster_args, false);
    if let (Some(secret), Some(args)) =
        (&o.notify_default, cluster_container["args"].as_array_mut())
    {
        args.extend([json!("--notify-default"), json!(secret)]);
    }
    if o.admission {
        if let Some(args) = cluster_container["args"].as_array_mut() {
            args.extend(super::webhook::service_args(o).into_iter().map(Value::from));
        }
        let port =
            json!({"name": "admission", "containerPort": crate::service::admission::DEFAULT_PORT});
        match cluster_container["ports"].as_array_mut() {
            Some(ports) => ports.push(port),
            None => cluster_container["ports"] = json!([port]),
        }
        cluster_container["volumeMounts"] = json!([super::webhook::client_ca_volume().1]);
    }
    docs.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "nodekeeper-cluster", "namespace": o.namespace, "labels": sel},
    "spec": {
      "replicas": 2,
      "selector": {"matchLabels": sel},
      // The replicas never share a node (below), so a surge pod would
      // find none free: a rollout replaces one replica at a time.
      "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
      "template": {
        "metadata": {"labels": sel},
        "spec": {
          "serviceAccountName": CLUSTER_ACCOUNT,
          "priorityClassName": "system-cluster-critical",
          // Never two replicas on one node: draining or rebooting a node
          // (nodekeeper's own work) takes one of them at most. No
          // PodDisruptionBudget: on a single-node cluster (k3s at the edge)
          // the second replica stays Pending, so any budget would refuse
          // every eviction of the running one and no drain of that node
          // would ever end.
          "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": sel}, "topologyKey": "kubernetes.io/hostname"}
          ]}},
          // The standby waits for the Lease and never becomes ready, so
          // only liveness is probed.
          "containers": [cluster_container]
        }
      }
    }}));
    if o.admission
        && let Some(spec) = docs
            .last_mut()
            .and_then(|d| d["spec"]["template"]["spec"].as_object_mut())
    {
        spec.insert(
            "volumes".into(),
            json!([super::webhook::client_ca_volume().0]),
        );
    }
    docs
}

/// The notifications' Secrets: `get` of those names, in nodekeeper's
/// namespace, for the cluster role alone (no list, no watch: it reads one
/// when it delivers). Nothing when no Secret is named.
pub fn notify_rbac(o: &Options) -> Vec<Value> {
    let names = o.notify_secret_names();
    if names.is_empty() {
        return Vec::new();
    }
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": NOTIFY_ROLE, "namespace": o.namespace, "labels": labels()},
               "rules": [{"apiGroups": [""], "resources": ["secrets"],
                          "resourceNames": names, "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": NOTIFY_ROLE, "namespace": o.namespace, "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NOTIFY_ROLE},
               "subjects": [{"kind": "ServiceAccount", "name": CLUSTER_ACCOUNT, "namespace": o.namespace}]}),
    ]
}

/// The Role that lets the cluster role read the notifications' Secrets.
pub const NOTIFY_ROLE: &str = "nodekeeper-notify";

fn static_args(o: &Options, metrics: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--kubeconfig",
        &o.kubeconfig,
        "--metrics-address",
        metrics,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if o.admission {
        args.extend(super::webhook::loopback_args());
    }
    args
}

/// A static pod: host network (it runs before any CNI), a kubeconfig from
/// the host, started by the kubelet before any controller.
pub(super) fn static_pod(o: &Options) -> Value {
    let metrics = o.host_metrics();
    let dir = std::path::Path::new(&o.kubeconfig)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    let mut c = json!({
      "name": "nodekeeper", "image": o.image, "imagePullPolicy": "IfNotPresent",
      "args": static_args(o, &metrics),
      "env": [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "RUST_LOG", "value": o.rust_log()}
      ],
      "volumeMounts": [{"name": "kubeconfig", "mountPath": dir, "readOnly": true}],
      "resources": resources(),
      "securityContext": PodMode::StaticPod.security()
    });
    if !o.metrics_off() {
        let port = o.metrics_port(&metrics);
        let host = match crate::service::metrics::parse_address(&metrics) {
            Ok(Some(a)) if a.ip().is_unspecified() => "127.0.0.1".to_string(),
            Ok(Some(a)) => a.ip().to_string(),
            _ => "127.0.0.1".into(),
        };
        c["livenessProbe"] = probe("/healthz", port, Some(&host));
    }
    let mut pod = json!({
        "hostNetwork": true,
        // Resolve through the host: cluster DNS may not exist yet.
        "dnsPolicy": "Default",
        "priorityClassName": "system-node-critical",
        "volumes": [{"name": "kubeconfig", "hostPath": {"path": dir, "type": "Directory"}}]
    });
    if o.reboot {
        reboot_profile(&mut pod, &mut c, o.upgrade);
    }
    pod["containers"] = json!([c]);
    json!({
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "nodekeeper", "namespace": "kube-system", "labels": labels()},
      "spec": pod
    })
}
