//! The deployment commands: `crds`, `manifests --for TARGET`, and
//! `host-kubeconfig NODE` (credentials for a host-mode agent).

use std::path::PathBuf;
use std::process::ExitCode;

use argh::FromArgs;
use kube::Api;
use kube::api::PostParams;

use crate::error::{Error, Result};
use crate::service::connect;

/// Print every nodekeeper CRD as YAML (pipe to kubectl apply -f -).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "crds")]
pub struct CrdsArgs {
    /// print the OpenShift node-upgrade mutex operator's three CRDs
    /// (MutexRule, MutexTarget, MutexRunConfig) instead, for serving them
    /// in its place
    #[argh(switch)]
    pub mutex: bool,
    /// print Constellation's five node-operator CRDs (NodeVersion,
    /// ScalingGroup, PendingNode, AutoscalingStrategy, JoiningNode)
    /// instead, for node replacement
    #[argh(switch)]
    pub constellation: bool,
}

/// Print or write deployment artifacts (CRDs, RBAC, admission policy, DaemonSet, static pod, systemd unit, k3s folder, Talos extension, image recipe).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "manifests")]
pub struct ManifestsArgs {
    /// what to generate: crds, rbac, admission, daemonset, deployment, k3s, helm, prometheus, static-pod, systemd, package, talos, containerfile, webhook, webhook-service
    #[argh(option, long = "for")]
    pub target: String,
    /// write the files into this folder instead of printing them
    #[argh(option)]
    pub out: Option<PathBuf>,
    /// container image (default localhost/nodekeeper:VERSION, as `just image` names it)
    #[argh(option)]
    pub image: Option<String>,
    /// namespace for the agents and their ServiceAccounts (default nodekeeper)
    #[argh(option)]
    pub namespace: Option<String>,
    /// kubeconfig path on the host for static-pod, systemd and talos (default /etc/nodekeeper/kubeconfig)
    #[argh(option)]
    pub kubeconfig: Option<String>,
    /// log level: error, warn, info, debug, trace (default info)
    #[argh(option)]
    pub log_level: Option<String>,
    /// metrics address HOST:PORT, :PORT or off (default :9477 in pods, 127.0.0.1:9477 on the host)
    #[argh(option)]
    pub metrics_address: Option<String>,
    /// let the node role reboot its host (daemonset, static-pod, systemd, k3s): host PID, root and three capabilities (host root in effect)
    #[argh(switch)]
    pub reboot: bool,
    /// the reboot profile plus what upgrade commands (UpgradePlan) need: host root, a privileged container or an unsandboxed unit
    #[argh(switch)]
    pub upgrade: bool,
    /// deployment: node agents run beside it, so it only admits (the k3s folder always does)
    #[argh(switch)]
    pub node_agents: bool,
    /// static-pod, systemd, deployment: serve the NodeMaintenance webhook (apply the webhook or webhook-service target too)
    #[argh(switch)]
    pub admission: bool,
    /// deployment: the Secret whose keys are every RebootPolicy's and UpgradePlan's default notifications (run --notify-default); the cluster role may read it
    #[argh(option)]
    pub notify_default: Option<String>,
    /// deployment: a Secret the objects' notifications name (repeatable); the cluster role may read these and no other
    #[argh(option)]
    pub notify_secret: Vec<String>,
    /// deployment, k3s: the cluster role may create Jobs in any namespace (UpgradePlan hooks, strategy type Job, the mutex operator's rule Jobs); a Job runs pods as any ServiceAccount there
    #[argh(switch)]
    pub upgrade_jobs: bool,
    /// deployment, k3s: the cluster role may delete nodes and patch Deployments (Constellation node replacement with --provider-command)
    #[argh(switch)]
    pub replacement: bool,
}

impl ManifestsArgs {
    pub fn options(&self) -> crate::deploy::Options {
        let d = crate::deploy::Options::default();
        crate::deploy::Options {
            image: self.image.clone().unwrap_or(d.image),
            namespace: self.namespace.clone().unwrap_or(d.namespace),
            kubeconfig: self.kubeconfig.clone().unwrap_or(d.kubeconfig),
            log_level: self.log_level.clone().unwrap_or(d.log_level),
            metrics_address: self.metrics_address.clone(),
            reboot: self.reboot || self.upgrade,
            upgrade: self.upgrade,
            node_agents: self.node_agents,
            admission: self.admission,
            notify_default: self.notify_default.clone(),
            notify_secrets: self.notify_secret.clone(),
            upgrade_jobs: self.upgrade_jobs,
            replacement: self.replacement,
        }
    }
}

/// Print a kubeconfig for a host-mode agent (static pod, systemd, Talos): a token of the node agent's ServiceAccount bound to the Node, which the admission policy confines to that node.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "host-kubeconfig")]
pub struct HostKubeconfigArgs {
    /// the node the agent will own
    #[argh(positional)]
    pub node: String,
    /// token lifetime in hours (default 8760, a year; the API server may shorten it)
    #[argh(option, default = "8760")]
    pub hours: u64,
    /// namespace of nodekeeper's ServiceAccounts (default nodekeeper)
    #[argh(option, default = "String::from(\"nodekeeper\")")]
    pub namespace: String,
    /// kubeconfig with the right to create tokens (default: $KUBECONFIG, ~/.kube/config)
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
    /// write the kubeconfig to this file (mode 0600, replaced atomically)
    /// instead of printing it
    #[argh(option)]
    pub out: Option<PathBuf>,
    /// with --out: this group may read the file too (mode 0640): the
    /// static pod's user is 65532:65532, the image's, not the file's owner
    #[argh(option)]
    pub group: Option<u32>,
}

/// Write `text` to `path` readable by its owner (whoever runs this) and, if
/// given, one group: a temporary file beside it, created 0600, given to the
/// group and widened to 0640 only then, renamed over the old one, so the
/// agent never reads a half-written file and nobody else ever can.
fn write_private(path: &std::path::Path, text: &str, group: Option<u32>) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(Error::io(format!("creating {}", tmp.display())))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(Error::io(format!("writing {}", tmp.display())))?;
        if let Some(gid) = group {
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::fchown(&file, None, Some(gid))
                .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(0o640)))
                .map_err(Error::io(format!("letting group {gid} read {shown}")))?;
        }
        std::fs::rename(&tmp, path).map_err(Error::io(format!("replacing {shown}")))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `host-kubeconfig NODE`: mint a token of the node agent's ServiceAccount
/// bound to the Node (the API server then names the node in the token's
/// user info, which the admission policy checks) and print a kubeconfig with
/// it and the current context's cluster.
pub async fn host_kubeconfig(args: HostKubeconfigArgs) -> Result<ExitCode> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;

    if args.group.is_some() && args.out.is_none() {
        return Err(Error::Invalid(
            "--group needs --out: a printed kubeconfig has no file to share".into(),
        ));
    }
    let raw = match &args.kubeconfig {
        Some(p) => crate::service::kubeconfig::read_from(p),
        None => crate::service::kubeconfig::read(),
    }
    .map_err(|e| {
        Error::NoCredentials(format!(
            "host-kubeconfig needs a kubeconfig to copy the cluster from: {}",
            crate::error::first_line(&e)
        ))
    })?;
    let context = raw
        .current_context
        .as_ref()
        .and_then(|c| raw.contexts.iter().find(|n| &n.name == c))
        .and_then(|n| n.context.as_ref())
        .ok_or_else(|| Error::NoCredentials("the kubeconfig has no current context".into()))?;
    let cluster = raw
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| {
            Error::NoCredentials(format!(
                "the kubeconfig has no cluster {:?}",
                context.cluster
            ))
        })?;
    let mut cluster_json = serde_json::to_value(&cluster)
        .map_err(|e| Error::Invalid(format!("encoding the cluster entry: {e}")))?;
    // The host will not have the file this machine's kubeconfig points at.
    if let Some(path) = cluster.certificate_authority.as_deref() {
        let pem = std::fs::read(path).map_err(Error::io(format!(
            "reading the cluster CA {path} named by the kubeconfig"
        )))?;
        let data = serde_json::to_value(k8s_openapi::ByteString(pem))
            .map_err(|e| Error::Invalid(format!("encoding the cluster CA: {e}")))?;
        if let Some(obj) = cluster_json.as_object_mut() {
            obj.remove("certificate-authority");
            obj.insert("certificate-authority-data".into(), data);
        }
    }

    let client = connect::connect(args.kubeconfig.as_deref()).await?;
    let node = super::named_node(&client, &args.node).await?;
    let account = crate::deploy::AGENT_ACCOUNT;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &args.namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some((args.hours.saturating_mul(3600)).min(i64::MAX as u64) as i64),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(args.node.clone()),
                uid: node.metadata.uid.clone(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => Error::Invalid(format!(
                "ServiceAccount {}/{account} not found; install it first: nodekeeper manifests --for rbac | kubectl apply -f -",
                args.namespace
            )),
            e => Error::kube(format!(
                "requesting a token for {}/{account} bound to node {}",
                args.namespace, args.node
            ))(e),
        })?;
    let status = issued.status.ok_or_else(|| {
        Error::Invalid("the API server returned a token request without a token".into())
    })?;
    let expires = status
        .expiration_timestamp
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| "at an unknown time".into());
    let whose = format!("{}/{account} bound to node {}", args.namespace, args.node);
    let user = format!("nodekeeper-{}", args.node);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster_json}],
        "users": [{"name": user, "user": {"token": status.token}}],
        "contexts": [{"name": "nodekeeper", "context": {"cluster": "cluster", "user": user}}],
        "current-context": "nodekeeper"
    });
    let text = crate::yaml::documents(&[doc]);
    match &args.out {
        Some(path) => {
            write_private(path, &text, args.group)?;
            let mode = args
                .group
                .map_or_else(|| "mode 0600".into(), |g| format!("mode 0640, group {g}"));
            eprintln!(
                "wrote {} ({mode}): token for {whose}, expires {expires}",
                path.display()
            );
        }
        None => {
            eprintln!(
                "token for {whose} expires {expires}; put this at the host's --kubeconfig path (e.g. /etc/nodekeeper/kubeconfig), readable by the agent's user only (--out FILE writes it so; add --group 65532 for the static pod)"
            );
            super::args::out(format_args!("{text}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_private_file_is_0600_or_0640_for_one_group_replaced_whole_with_no_temporary_left() {
        let dir = std::env::temp_dir().join(format!("nk-private-{}", std::process::id()));
        let path = dir.join("sub").join("kubeconfig");
        write_private(&path, "first", None).expect("first write");
        assert_eq!(
            std::fs::metadata(&path).map(|m| m.mode() & 0o777).ok(),
            Some(0o600)
        );
        // A group this process is in (its own), so the test needs no root.
        let gid = std::fs::metadata(&path).map(|m| m.gid()).expect("written");
        write_private(&path, "second", Some(gid)).expect("second write");
        let meta = std::fs::metadata(&path).expect("written");
        assert_eq!((meta.mode() & 0o777, meta.gid()), (0o640, gid));
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some("second")
        );
        let names: Vec<_> = std::fs::read_dir(dir.join("sub"))
            .expect("listing")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
