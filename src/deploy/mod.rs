//! Deployment artifacts, generated from the same types and constants the
//! agent uses so they cannot drift from the code: `nodekeeper manifests --for
//! TARGET [--out DIR]`. The checked-in copies under `k3s-manifests/` and
//! `image/` are these outputs with the default [`Options`]; a test fails when
//! they differ.
//!
//! Identities: the node agent (`nodekeeper-agent`, one per node: DaemonSet
//! pods, or host modes with a node-bound token of the same ServiceAccount)
//! and cluster mode (`nodekeeper-cluster`, the `--all-nodes` Deployment).
//! Each gets exactly its rows of [`GRANTS`]; cluster mode adds its
//! leader Lease. The ValidatingAdmissionPolicy in [`admission`] then
//! confines the node agent to its own Node.

use serde_json::Value;

mod helm;
mod host;
mod monitoring;
mod rbac;
#[cfg(test)]
mod tests;
mod webhook;
mod workloads;

use host::*;
use rbac::*;
pub use rbac::{
    Elevated, GRANTS, Grant, Identity, admission, rbac, readme_table as rbac_readme_table,
};
pub use webhook::webhook;
use workloads::*;
pub use workloads::{LEADER_FLOW_SCHEMA, NOTIFY_ROLE, daemonset, deployment, notify_rbac};

use crate::api::nodemaintenance::{
    APPLIED_ANNOTATION, CORDONED_ANNOTATION, EXCLUDE_REMEDIATION_LABEL, LEASE_NAMESPACE,
};
use crate::error::{Error, Result};

/// The node agent's ServiceAccount (DaemonSet pods and host-mode tokens).
pub const AGENT_ACCOUNT: &str = "nodekeeper-agent";
/// The `--all-nodes` Deployment's ServiceAccount.
pub const CLUSTER_ACCOUNT: &str = "nodekeeper-cluster";
/// The admission policy (and its binding) confining node agents.
pub const OWN_NODE_POLICY: &str = "nodekeeper-own-node";
/// The ValidatingAdmissionPolicy that lets a node agent delete only its
/// own node's RebootPolicy NodeMaintenance.
pub const OWN_MAINTENANCE_POLICY: &str = "nodekeeper-own-node-maintenance";
/// The image's user and group (defined where the service names it).
pub use crate::service::connect::IMAGE_USER;
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
    /// Node-role modes may reboot their host (`--reboot`): the DaemonSet
    /// and static pod get host PID and the capabilities `host-exec` needs,
    /// the systemd unit the capabilities `systemctl reboot` needs.
    pub reboot: bool,
    /// The upgrade profile (`--upgrade`, implies `reboot`): upgrade
    /// commands need host root, so the DaemonSet's and static pod's
    /// container is privileged and the systemd unit unsandboxed.
    pub upgrade: bool,
    /// The cluster-role Deployment runs beside node agents (`--node-agents`):
    /// it admits and leaves draining and rebooting to them. Always so in
    /// the k3s folder, which has the DaemonSet.
    pub node_agents: bool,
    /// Serve the NodeMaintenance webhook (`--admission-address`): on
    /// loopback in the static pod and the systemd unit, through a Service
    /// in the Deployment. Its configuration is the `webhook` target.
    pub admission: bool,
    /// The cluster role's default notifications (`run --notify-default`).
    pub notify_default: Option<String>,
    /// Secrets the objects' notifications name: with the default, the
    /// only Secrets the cluster role may read (`get`, by name).
    pub notify_secrets: Vec<String>,
    /// The cluster role may create Jobs (`--upgrade-jobs`): UpgradePlans'
    /// hooks and `strategy.type: Job`, the mutex operator's rule Jobs
    /// ([`rbac::Elevated::Jobs`]).
    pub upgrade_jobs: bool,
    /// The cluster role may delete nodes and patch Deployments
    /// (`--replacement`): Constellation node replacement
    /// ([`rbac::Elevated::Replacement`]).
    pub replacement: bool,
}

impl Options {
    /// Every Secret the cluster role may read for notifications.
    pub fn notify_secret_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.notify_default.iter().cloned().collect();
        names.extend(self.notify_secrets.iter().cloned());
        names.sort();
        names.dedup();
        names
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            image: format!("localhost/nodekeeper:{}", env!("CARGO_PKG_VERSION")),
            namespace: "nodekeeper".into(),
            kubeconfig: "/etc/nodekeeper/kubeconfig".into(),
            log_level: "info".into(),
            metrics_address: None,
            reboot: false,
            upgrade: false,
            node_agents: false,
            admission: false,
            notify_default: None,
            notify_secrets: Vec::new(),
            upgrade_jobs: false,
            replacement: false,
        }
    }
}

impl Options {
    /// Reject values that would produce broken manifests.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, why: &str| Err(Error::Invalid(format!("{what}: {why}")));
        for name in self.notify_secret_names() {
            if !crate::api::common::is_node_name(&name) {
                return bad(
                    &format!("--notify-secret/--notify-default {name:?}"),
                    "is not a Secret name (lowercase letters, digits, '-' and '.', at most 253)",
                );
            }
        }
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
            crate::service::metrics::parse_address(a)?;
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
            .unwrap_or_else(|| crate::service::metrics::DEFAULT_ADDRESS.to_string())
    }

    fn metrics_port(&self, default: &str) -> u16 {
        let addr = self.metrics_address.as_deref().unwrap_or(default);
        match crate::service::metrics::parse_address(addr) {
            Ok(Some(a)) => a.port(),
            _ => METRICS_PORT,
        }
    }

    fn metrics_off(&self) -> bool {
        matches!(
            self.metrics_address
                .as_deref()
                .map(crate::service::metrics::parse_address),
            Some(Ok(None))
        )
    }
}

/// The README's table of `manifests --for` targets, from [`TARGETS`].
pub fn targets_readme_table() -> String {
    let mut out = String::from("| `--for` | what | checked in at |\n|---|---|---|\n");
    for (t, what, at) in TARGETS {
        let at = at.map(|a| format!("`{a}/`")).unwrap_or_else(|| "–".into());
        out.push_str(&format!("| `{t}` | {what} | {at} |\n"));
    }
    out
}

/// One generated file: its path relative to the output folder, and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub content: String,
}

/// Every target, what it is for, and where its checked-in copy lives
/// (relative to the repository root; `None`: not checked in).
pub const TARGETS: [(&str, &str, Option<&str>); 15] = [
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
        "cluster mode (--all-nodes): its ServiceAccount, RBAC, a leader-elected Deployment and the FlowSchema that gives its leader Lease the API server's leader-election priority",
        None,
    ),
    (
        "k3s",
        "crds + rbac + admission + daemonset + the cluster role (admissions) as files for k3s's auto-deploy folder",
        Some("k3s-manifests"),
    ),
    (
        "helm",
        "a Helm chart of the k3s layout (node agents, cluster role), with values for each knob",
        Some("image/helm"),
    ),
    (
        "prometheus",
        "alerting rules (a rules file and a PrometheusRule), a PodMonitor and a Grafana dashboard",
        Some("image/monitoring"),
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
        "package",
        "what an OS package or system extension installs: the unit under /usr, the reboot and upgrade profiles as drop-ins, the env file",
        Some("image/package"),
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
    (
        "webhook",
        "the opt-in NodeMaintenance webhook, called on loopback (static pod, systemd: run them with --admission)",
        None,
    ),
    (
        "webhook-service",
        "the opt-in NodeMaintenance webhook, called through a Service (deployment --admission)",
        None,
    ),
];

/// Render one target's files.
pub fn render(target: &str, o: &Options) -> Result<Vec<File>> {
    o.validate()?;
    if o.reboot && !["daemonset", "static-pod", "systemd", "k3s", "helm"].contains(&target) {
        return Err(Error::Invalid(format!(
            "--reboot applies to the node-role modes (daemonset, static-pod, systemd, k3s), not {target}{}",
            if target == "talos" {
                " (Talos nodes reboot through Talos's own API)"
            } else {
                ""
            }
        )));
    }
    if o.node_agents && target != "deployment" {
        return Err(Error::Invalid(format!(
            "--node-agents applies to the deployment target only{}",
            if target == "k3s" {
                " (the k3s folder's cluster role always runs with it)"
            } else {
                ""
            }
        )));
    }
    if o.admission && !["static-pod", "systemd", "deployment"].contains(&target) {
        return Err(Error::Invalid(format!(
            "--admission applies to the modes that serve the webhook (static-pod, systemd, deployment), not {target}; the webhook's configuration is the webhook or webhook-service target"
        )));
    }
    let file = |path: &str, what: &str, body: String| File {
        path: path.into(),
        content: format!(
            "# {what}\n# Generated by `nodekeeper manifests --for {target}`; do not edit.\n{body}"
        ),
    };
    let yaml = |docs: &[Value]| crate::yaml::documents(docs);
    Ok(match target {
        "crds" => vec![file(
            "crds.yaml",
            "nodekeeper's CRDs",
            crate::api::crds_yaml()?,
        )],
        "rbac" => vec![file(
            "rbac.yaml",
            &format!(
                "nodekeeper's node agent identity.\n{}",
                rules_comment(Identity::Agent)
            ),
            yaml(&rbac(o)),
        )],
        "admission" => vec![file(
            "admission.yaml",
            "Confines each node agent to its own Node (Kubernetes >= 1.30)",
            yaml(&admission(o)),
        )],
        // The reboot profile raises the namespace's Pod Security level to
        // the privileged one it needs (rbac renders it restricted).
        "daemonset" => vec![file(
            "daemonset.yaml",
            "nodekeeper's node agent as a DaemonSet (needs crds, rbac and admission)",
            yaml(&if o.reboot {
                vec![rbac::namespace(o), daemonset(o)]
            } else {
                vec![daemonset(o)]
            }),
        )],
        "deployment" => vec![file(
            "deployment.yaml",
            &format!(
                "nodekeeper in cluster mode: one leader-elected agent for every node (needs crds and rbac).\n{}",
                rules_comment(Identity::Cluster)
            ),
            yaml(&deployment(o)),
        )],
        // Numbered in dependency order (the CRDs, then the namespaces with
        // the RBAC, then what lives in them): `kubectl apply -f DIR` applies a
        // folder's files in lexical order and stops an object whose namespace
        // does not exist yet. k3s retries, kubectl does not.
        "k3s" => vec![
            file(
                "00-nodekeeper-crds.yaml",
                "nodekeeper for k3s: copy this folder into /var/lib/rancher/k3s/server/manifests/",
                crate::api::crds_yaml()?,
            ),
            // Shared with medik8s's operators: in a subfolder, which k3s
            // applies (it walks the folder) and `kubectl apply -R` too,
            // but a plain `kubectl delete -f k3s-manifests/` leaves alone.
            file(
                "00-shared/medik8s-leases.yaml",
                "The medik8s node leases' namespace, shared with medik8s's remediation operators.\n# `kubectl delete -f k3s-manifests/` (without -R) leaves it; delete it only when no operator uses it",
                yaml(&[rbac::lease_namespace()]),
            ),
            file(
                "01-nodekeeper-rbac.yaml",
                &format!(
                    "nodekeeper for k3s: the node agent identity.\n{}",
                    rules_comment(Identity::Agent)
                ),
                yaml(
                    &rbac(o)
                        .into_iter()
                        .filter(|d| d != &rbac::lease_namespace())
                        .collect::<Vec<_>>(),
                ),
            ),
            file(
                "02-nodekeeper-admission.yaml",
                "nodekeeper for k3s: confines each node agent to its own Node",
                yaml(&admission(o)),
            ),
            file(
                "03-nodekeeper-daemonset.yaml",
                "nodekeeper for k3s: the node agent on every node",
                yaml(&[daemonset(o)]),
            ),
            file(
                "04-nodekeeper-cluster.yaml",
                &format!(
                    "nodekeeper for k3s: the cluster role, which admits reboots within budgets
                     # (the node agents drain and reboot).
{}",
                    rules_comment(Identity::Cluster)
                ),
                yaml(&deployment(&Options {
                    node_agents: true,
                    ..o.clone()
                })),
            ),
        ],
        "helm" => helm::chart(o)?,
        "prometheus" => monitoring::files(o),
        "static-pod" => vec![file(
            "static-pod.yaml",
            &format!(
                "nodekeeper as a static pod: copy into the kubelet's staticPodPath\n\
                 # (/etc/kubernetes/manifests, or /var/lib/rancher/k3s/agent/pod-manifests on k3s).\n\
                 # Needs a kubeconfig at {kc} on the host that group {IMAGE_USER} can read:
                 #   nodekeeper host-kubeconfig NODE --out {kc} --group {IMAGE_USER}",
                kc = o.kubeconfig
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
        "package" => package_files(o)
            .into_iter()
            .map(|(path, what, body)| file(&path, what, body))
            .collect(),
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
        "webhook" | "webhook-service" => vec![file(
            &format!("{target}.yaml"),
            "The opt-in NodeMaintenance webhook (NMO's refusals at create time). nodekeeper\n\
             # fills in the caBundle itself; failurePolicy Ignore: if no nodekeeper answers,\n\
             # the object is admitted and a bad one fails in status. See README, Admission.",
            yaml(&webhook(o, target == "webhook-service")),
        )],
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
