//! Command-line interface: the argh flag structs (raw, no system calls) and
//! `dispatch`, which validates them into runtime configs and runs the chosen
//! subcommand on the async runtime.

use std::path::PathBuf;
use std::process::ExitCode;

use argh::FromArgs;

use crate::error::{Error, Result};
use crate::runtime;

/// nodekeeper keeps Kubernetes nodes healthy through maintenance, reboots and upgrades.
#[derive(FromArgs, Debug)]
pub struct Cli {
    /// log at debug level (RUST_LOG overrides)
    #[argh(switch, short = 'v')]
    pub verbose: bool,
    #[argh(subcommand)]
    pub command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Command {
    Run(RunArgs),
    Maintain(MaintainArgs),
    Unmaintain(UnmaintainArgs),
    Drain(DrainArgs),
    Crds(CrdsArgs),
    Manifests(ManifestsArgs),
    HostKubeconfig(HostKubeconfigArgs),
    Version(VersionArgs),
}

/// Run the service: own this machine's node (or, with --all-nodes, every node) and reconcile it.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "run")]
pub struct RunArgs {
    /// the node this agent owns (default: $NODE_NAME, then the host name)
    #[argh(option)]
    pub node: Option<String>,
    /// kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the pod's service account)
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
    /// reconcile every node (one leader-elected replica) instead of one
    #[argh(switch)]
    pub all_nodes: bool,
    /// with --all-nodes: only nodes matching this label selector (e.g. pool=blue)
    #[argh(option)]
    pub node_selector: Option<String>,
    /// seconds a drain may take before status and a Warning event say what blocks it (default 30; it keeps retrying)
    #[argh(option, default = "30")]
    pub drain_timeout: u64,
    /// namespace of the leader lease in --all-nodes mode (default: $POD_NAMESPACE, else kube-system)
    #[argh(option)]
    pub leader_namespace: Option<String>,
    /// where to serve /metrics, /healthz and /readyz: HOST:PORT, :PORT or off (default 127.0.0.1:9477)
    #[argh(option, default = "crate::metrics::DEFAULT_ADDRESS.to_string()")]
    pub metrics_address: String,
}

/// Put a node into maintenance: create its NodeMaintenance (cordon, taint, drain).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "maintain")]
pub struct MaintainArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// why (shown by kubectl get nm -o wide)
    #[argh(option)]
    pub reason: Option<String>,
    /// show live progress until Succeeded (exit 0) or Failed (exit 1)
    #[argh(switch)]
    pub wait: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

/// Take a node out of maintenance: delete its NodeMaintenance (uncordon if nodekeeper cordoned it).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "unmaintain")]
pub struct UnmaintainArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// wait until the maintenance is fully removed
    #[argh(switch)]
    pub wait: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

/// Show what draining a node would do: evicted, deleted, skipped (why) and blocked (by which PDB).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "drain")]
pub struct DrainArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// change nothing, print the plan (required: to drain, use `maintain`)
    #[argh(switch)]
    pub dry_run: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

/// Print every nodekeeper CRD as YAML (pipe to kubectl apply -f -).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "crds")]
pub struct CrdsArgs {}

/// Print or write deployment artifacts (CRDs, RBAC, admission policy, DaemonSet, static pod, systemd unit, k3s folder, Talos extension, image recipe).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "manifests")]
pub struct ManifestsArgs {
    /// what to generate: crds, rbac, admission, daemonset, deployment, k3s, static-pod, systemd, talos, containerfile
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
}

impl ManifestsArgs {
    pub fn options(&self) -> crate::manifests::Options {
        let d = crate::manifests::Options::default();
        crate::manifests::Options {
            image: self.image.clone().unwrap_or(d.image),
            namespace: self.namespace.clone().unwrap_or(d.namespace),
            kubeconfig: self.kubeconfig.clone().unwrap_or(d.kubeconfig),
            log_level: self.log_level.clone().unwrap_or(d.log_level),
            metrics_address: self.metrics_address.clone(),
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
}

/// Print the version.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "version")]
pub struct VersionArgs {}

/// The validated form of `run`'s flags.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// `Some` in node mode; `None` with --all-nodes.
    pub node: Option<String>,
    /// Label selector narrowing --all-nodes.
    pub node_selector: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub drain_timeout: std::time::Duration,
    /// Who we are in events and the leader lease.
    pub identity: String,
    pub leader_namespace: String,
    /// `None` with `--metrics-address off`.
    pub metrics_address: Option<std::net::SocketAddr>,
}

impl RunConfig {
    pub fn from_args(args: RunArgs) -> Result<Self> {
        if args.all_nodes && args.node.is_some() {
            return Err(Error::Invalid(
                "--node and --all-nodes exclude each other".into(),
            ));
        }
        let node = if args.all_nodes {
            None
        } else {
            let n = match args.node {
                Some(n) => n,
                None => default_node_name()?,
            };
            validate_node_name(&n)?;
            Some(n)
        };
        if args.node_selector.is_some() && !args.all_nodes {
            return Err(Error::Invalid(
                "--node-selector only applies with --all-nodes".into(),
            ));
        }
        if args.drain_timeout == 0 {
            return Err(Error::Invalid(
                "--drain-timeout must be at least 1 second".into(),
            ));
        }
        let identity = std::env::var("POD_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| node.clone())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "nodekeeper".into());
        let leader_namespace = args
            .leader_namespace
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "kube-system".into());
        let metrics_address = crate::metrics::parse_address(&args.metrics_address)?;
        Ok(RunConfig {
            metrics_address,
            node,
            node_selector: args.node_selector,
            kubeconfig: args.kubeconfig,
            drain_timeout: std::time::Duration::from_secs(args.drain_timeout),
            identity,
            leader_namespace,
        })
    }
}

/// `$NODE_NAME` (set from the downward API in our manifests), else the host
/// name lower-cased, as the kubelet registers it.
fn default_node_name() -> Result<String> {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.trim().is_empty()
    {
        return Ok(n.trim().to_string());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map_err(Error::io(
            "no --node given, NODE_NAME unset, and the host name is unreadable",
        ))?;
    Ok(host.trim().to_lowercase())
}

/// Is `name` a name a Node can have: a lowercase RFC 1123 subdomain, as
/// the API server validates Node names (and the CRD's CEL rule checks
/// `spec.nodeName`)?
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            // Any label length: Node names are subdomains, not DNS labels.
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Node names are DNS subdomains; refusing others early beats a 404 later.
pub fn validate_node_name(name: &str) -> Result<()> {
    if is_node_name(name) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{name:?} is not a valid node name (lower-case DNS subdomain)"
        )))
    }
}

/// Run the parsed command line; the `ExitCode` is for commands whose success
/// has shades (such as `maintain --wait`).
pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Version(_) => {
            println!("nodekeeper {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            let config = RunConfig::from_args(args)?;
            let shutdown =
                runtime::shutdown_signal().map_err(Error::io("installing signal handlers"))?;
            runtime::block_on(crate::agent::run(config, shutdown))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Crds(_) => {
            let docs: Vec<serde_json::Value> = crate::nodemaintenance::crds()
                .iter()
                .map(serde_json::to_value)
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Invalid(format!("encoding CRDs: {e}")))?;
            print!("{}", crate::yaml::documents(&docs));
            Ok(ExitCode::SUCCESS)
        }
        Command::Manifests(args) => {
            let files = crate::manifests::render(&args.target, &args.options())?;
            match &args.out {
                Some(dir) => {
                    crate::manifests::write(dir, &files)?;
                    for f in &files {
                        eprintln!("wrote {}", dir.join(&f.path).display());
                    }
                }
                None => print!("{}", crate::manifests::to_stdout(&args.target, &files)?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::HostKubeconfig(args) => {
            validate_node_name(&args.node)?;
            if args.hours == 0 {
                return Err(Error::Invalid("--hours must be at least 1".into()));
            }
            runtime::block_on(crate::commands::host_kubeconfig(args))
        }
        Command::Maintain(args) => {
            validate_node_name(&args.node)?;
            runtime::block_on(crate::commands::maintain(args))
        }
        Command::Unmaintain(args) => {
            validate_node_name(&args.node)?;
            runtime::block_on(crate::commands::unmaintain(args))
        }
        Command::Drain(args) => {
            if !args.dry_run {
                return Err(Error::Invalid(format!(
                    "drain only plans (--dry-run); to drain {0} use: nodekeeper maintain {0} --wait",
                    args.node
                )));
            }
            validate_node_name(&args.node)?;
            runtime::block_on(crate::commands::drain_dry_run(args))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_dns_subdomains() {
        for ok in [
            "worker-1",
            "ip-10-0-0-1.ec2.internal",
            "a",
            &"x".repeat(253),
        ] {
            assert!(validate_node_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Worker",
            "-a",
            "a-",
            "a..b",
            "a_b",
            " a",
            &"x".repeat(254),
        ] {
            assert!(validate_node_name(bad).is_err(), "{bad}");
        }
    }
}
