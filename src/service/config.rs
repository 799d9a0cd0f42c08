//! The service's configuration: what `nodekeeper run` starts from, once
//! its flags are validated (`cli::run` builds it; nothing here parses).

use std::path::PathBuf;

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
    /// The leader lease's name (`cli::run::leader_lease_name`).
    pub leader_lease: String,
    /// `None` with `--metrics-address off`.
    pub metrics_address: Option<std::net::SocketAddr>,
    pub transport: crate::service::connect::Transport,
    /// `None`: chosen by the protocol the API server negotiates.
    pub evictions_in_flight: Option<usize>,
    /// Cluster role: node agents drain and reboot; this process admits.
    pub node_agents: bool,
    pub host_root: PathBuf,
    pub host_exec: crate::effects::host::Exec,
    /// `--command-records`, a path on the host.
    pub command_records: PathBuf,
    /// `--talos-socket`.
    pub talos_socket: PathBuf,
    /// Cluster role: the provider plugin (`--provider-command`).
    pub provider: Option<crate::effects::provider::Provider>,
    /// The validating webhook (`--admission-address`), if served.
    pub admission: Option<crate::service::admission::Config>,
    /// Cluster role: the default notifications' Secret (`--notify-default`).
    pub notify_default: Option<String>,
    /// Cluster role: how often a channel is asked (`--channel-interval`).
    pub channel_interval: std::time::Duration,
}
