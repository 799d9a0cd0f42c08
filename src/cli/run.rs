//! `nodekeeper run`: its flags, and the validated [`RunConfig`] the service
//! starts from (node role or cluster role, identity, leader namespace,
//! metrics address, default drain deadline).

use std::path::PathBuf;

use argh::FromArgs;

use super::validate_node_name;
use crate::error::{Error, Result};
pub use crate::service::config::RunConfig;

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
    /// how long a drain may take before status and a Warning event say what blocks it: seconds or 90s, 2m, 1h (default 30; it keeps retrying)
    #[argh(option, default = "30", from_str_fn(super::args::parse_seconds))]
    pub drain_timeout: u64,
    /// namespace of the leader lease in --all-nodes mode (default: $POD_NAMESPACE, else kube-system)
    #[argh(option)]
    pub leader_namespace: Option<String>,
    /// name of the leader lease in --all-nodes mode (default nodekeeper-leader; with --node-selector, nodekeeper-leader-HASH of the selector, so pools lead separately)
    #[argh(option)]
    pub leader_lease: Option<String>,
    /// with --all-nodes: node agents run on the nodes, so only admit (reboots) and leave draining and rebooting to them
    #[argh(switch)]
    pub node_agents: bool,
    /// where the host's root file system is, for reboot sentinels (default /; /proc/1/root in the reboot DaemonSet)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub host_root: PathBuf,
    /// run host commands (reboot, sentinel command) in PID 1's mount namespace: for the reboot DaemonSet, which has host PID
    #[argh(switch)]
    pub host_exec: bool,
    /// where reboot and upgrade commands keep their records and results on the host, so that an agent restarted mid-command publishes the result (default /run/nodekeeper/commands)
    #[argh(
        option,
        default = "PathBuf::from(crate::effects::host_run::DEFAULT_RECORDS)"
    )]
    pub command_records: PathBuf,
    /// the socket of Talos's machine API, through which a node agent on Talos reboots and upgrades its node (default /system/run/machined/machine.sock, which the Talos extension mounts)
    #[argh(
        option,
        default = "PathBuf::from(crate::effects::talos::DEFAULT_SOCKET)"
    )]
    pub talos_socket: PathBuf,
    /// log lines as text or json (one JSON object per line: time, level, target, message, node, object); the same as the global --log-format
    #[argh(option)]
    pub log_format: Option<crate::logging::Format>,
    /// talk HTTP/1.1 only to the API server (default: offer HTTP/2 and let the server choose)
    #[argh(switch)]
    pub http1_only: bool,
    /// evictions and deletions a drain keeps in flight at once (default 110 over HTTP/2, 32 over HTTP/1.1)
    #[argh(option)]
    pub evictions_in_flight: Option<usize>,
    /// with --all-nodes: the cloud provider plugin for node replacement (NodeVersion); see README "Node replacement"
    #[argh(option)]
    pub provider_command: Option<PathBuf>,
    /// how long one provider call may take before it is killed: seconds or 90s, 2m, 1h (default 300)
    #[argh(option, default = "300", from_str_fn(super::args::parse_seconds))]
    pub provider_timeout: u64,
    /// where to serve /metrics, /healthz and /readyz: HOST:PORT, :PORT or off (default 127.0.0.1:9477)
    #[argh(
        option,
        default = "crate::service::metrics::DEFAULT_ADDRESS.to_string()"
    )]
    pub metrics_address: String,
    /// serve the validating webhook for NodeMaintenance (NMO's refusals at create time) on HOST:PORT or :PORT, with a certificate nodekeeper generates; see README "Admission"
    #[argh(option)]
    pub admission_address: Option<String>,
    /// with --admission-address, for a webhook reached through a Service (the Deployment): NAMESPACE/NAME, whose DNS names the certificate then carries
    #[argh(option)]
    pub admission_service: Option<String>,
    /// with --admission-address: admit maintenance of a control-plane node even when it would leave fewer than a quorum of the control plane Ready and schedulable
    #[argh(switch)]
    pub admission_skip_quorum_check: bool,
    /// with --admission-address: accept reviews only from clients with a certificate signed by this CA (PEM): the API server's webhook client certificate; needed on any address but loopback
    #[argh(option)]
    pub admission_client_ca: Option<PathBuf>,
    /// with --all-nodes: the Secret (in the leader namespace) whose keys url and, optionally, format, events, template and ca.crt are the notifications of every RebootPolicy and UpgradePlan without its own; see README "Notifications"
    #[argh(option)]
    pub notify_default: Option<String>,
    /// with --all-nodes: how often an UpgradePlan's channel is asked for its version: seconds or 90s, 2m, 1h (default 15m, as system-upgrade-controller)
    #[argh(option, default = "900", from_str_fn(super::args::parse_seconds))]
    pub channel_interval: u64,
}

/// The README's table of `run`'s flags: each flag of `run --help` with its
/// text, so the README can say nothing the binary does not (a test keeps
/// the README's copy equal to this).
pub fn readme_flags_table() -> String {
    use argh::FromArgs;
    let help = match RunArgs::from_args(&["run"], &["--help"]) {
        Err(argh::EarlyExit { output, .. }) => output,
        Ok(_) => String::new(),
    };
    let mut rows: Vec<(String, String)> = Vec::new();
    for line in help
        .lines()
        .skip_while(|l| !l.starts_with("Options:"))
        .skip(1)
    {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            break;
        }
        if indent <= 2 && trimmed.starts_with("--") {
            let (flag, text) = trimmed
                .split_once(char::is_whitespace)
                .unwrap_or((trimmed, ""));
            rows.push((flag.to_string(), text.trim().to_string()));
        } else if let Some(last) = rows.last_mut() {
            if !last.1.is_empty() {
                last.1.push(' ');
            }
            last.1.push_str(trimmed);
        }
    }
    let mut out = String::from("| flag | meaning |\n|---|---|\n");
    for (flag, text) in rows.iter().filter(|(f, _)| !f.starts_with("--help")) {
        out.push_str(&format!("| `{flag}` | {} |\n", text.replace('|', "\\|")));
    }
    out
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
        if args.leader_lease.is_some() && !args.all_nodes {
            return Err(Error::Invalid(
                "--leader-lease only applies with --all-nodes".into(),
            ));
        }
        let leader_lease = match args.leader_lease {
            Some(name) if crate::api::common::is_node_name(&name) => name,
            Some(name) => {
                return Err(Error::Invalid(format!(
                    "--leader-lease {name:?} is not a Lease name (lowercase letters, digits, '-' and '.', at most 253)"
                )));
            }
            None => leader_lease_name(args.node_selector.as_deref()),
        };
        if args.node_agents && !args.all_nodes {
            return Err(Error::Invalid(
                "--node-agents only applies with --all-nodes".into(),
            ));
        }
        if !args.host_root.is_absolute() {
            return Err(Error::Invalid(format!(
                "--host-root {} must be an absolute path",
                args.host_root.display()
            )));
        }
        if args.drain_timeout == 0 {
            return Err(Error::Invalid(
                "--drain-timeout must be at least 1 second".into(),
            ));
        }
        let identity = match std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()) {
            Some(pod) => pod,
            None => match &node {
                Some(n) => n.clone(),
                // Two cluster roles on one host must not share a leader
                // identity (both would think they hold the lease): the host
                // name plus a random suffix, as client-go does.
                None => format!("{}_{}", host_name(), random_suffix()),
            },
        };
        let leader_namespace = args
            .leader_namespace
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "kube-system".into());
        let metrics_address = crate::service::metrics::parse_address(&args.metrics_address)?;
        let evictions_in_flight = args.evictions_in_flight;
        if evictions_in_flight.is_some_and(|n| !(1..=1000).contains(&n)) {
            return Err(Error::Invalid(
                "--evictions-in-flight must be between 1 and 1000".into(),
            ));
        }
        if args.provider_command.is_some() && !args.all_nodes {
            return Err(Error::Invalid(
                "--provider-command only applies with --all-nodes (node replacement is the cluster role's)".into(),
            ));
        }
        if args.provider_timeout == 0 {
            return Err(Error::Invalid(
                "--provider-timeout must be at least 1 second".into(),
            ));
        }
        let admission = match &args.admission_address {
            None => {
                if args.admission_service.is_some()
                    || args.admission_skip_quorum_check
                    || args.admission_client_ca.is_some()
                {
                    return Err(Error::Invalid(
                        "--admission-service, --admission-skip-quorum-check and --admission-client-ca only apply with --admission-address".into(),
                    ));
                }
                None
            }
            Some(a) => Some(crate::service::admission::Config::parse(
                a,
                args.admission_service.as_deref(),
                !args.admission_skip_quorum_check,
                args.admission_client_ca.as_deref(),
                identity.clone(),
            )?),
        };
        match &args.notify_default {
            Some(_) if !args.all_nodes => {
                return Err(Error::Invalid(
                    "--notify-default only applies with --all-nodes (the cluster role notifies)"
                        .into(),
                ));
            }
            Some(s) if !crate::api::common::is_node_name(s) => {
                return Err(Error::Invalid(format!(
                    "--notify-default {s:?} is not a Secret name (lowercase letters, digits, '-' and '.', at most 253)"
                )));
            }
            _ => {}
        }
        let provider = args
            .provider_command
            .map(|command| crate::effects::provider::Provider {
                command,
                timeout: std::time::Duration::from_secs(args.provider_timeout),
            });
        if args.channel_interval == 0 {
            return Err(Error::Invalid(
                "--channel-interval must be at least 1 second".into(),
            ));
        }
        Ok(RunConfig {
            channel_interval: std::time::Duration::from_secs(args.channel_interval),
            notify_default: args.notify_default,
            admission,
            provider,
            transport: if args.http1_only {
                crate::service::connect::Transport::Http1Only
            } else {
                crate::service::connect::Transport::Http2
            },
            evictions_in_flight,
            node_agents: args.node_agents,
            host_root: args.host_root,
            command_records: args.command_records,
            talos_socket: args.talos_socket,
            host_exec: if args.host_exec {
                crate::effects::host::Exec::HostNamespace
            } else {
                crate::effects::host::Exec::Direct
            },
            metrics_address,
            node,
            node_selector: args.node_selector,
            kubeconfig: args.kubeconfig,
            drain_timeout: std::time::Duration::from_secs(args.drain_timeout),
            identity,
            leader_namespace,
            leader_lease,
        })
    }
}

/// The leader lease of the default pool: `nodekeeper-leader`.
pub const LEADER_LEASE: &str = "nodekeeper-leader";

/// The leader lease a cluster role takes: [`LEADER_LEASE`], or for a pool
/// (`--node-selector`) one named by a hash of its selector, so cluster
/// roles of different pools in one namespace lead at once (with one fixed
/// name, one pool silently never ran) while replicas of one pool share it.
pub fn leader_lease_name(selector: Option<&str>) -> String {
    match selector.map(str::trim).filter(|s| !s.is_empty()) {
        None => LEADER_LEASE.into(),
        Some(sel) => format!(
            "{LEADER_LEASE}-{:08x}",
            crate::decide::disrupt::fnv(sel.as_bytes()) as u32
        ),
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

/// This machine's host name (for a leader identity), or "nodekeeper".
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "nodekeeper".into())
}

/// Eight random hex digits: the standard library's per-process random hash
/// keys, mixed with the time and process id.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    format!("{:08x}", h.finish() as u32)
}
