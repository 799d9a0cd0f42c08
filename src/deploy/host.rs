//! The host run modes: the systemd unit and its environment file, the
//! Talos system extension, and the scratch image's Containerfile.

use serde_json::{Value, json};

use super::*;

pub(super) fn systemd_unit(o: &Options) -> String {
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
ExecStart=/usr/local/bin/nodekeeper run --metrics-address {metrics}{admission} $NODEKEEPER_ARGS
# Start-up errors (API server not up yet, node not registered yet) exit
# non-zero with one line in the journal; systemd retries.
Restart=always
RestartSec=5
TimeoutStopSec=30
{sandbox}
[Install]
WantedBy=multi-user.target
",
        kubeconfig = o.kubeconfig,
        rust_log = o.rust_log(),
        metrics = o.host_metrics(),
        admission = if o.admission {
            format!(" {}", super::webhook::loopback_args().join(" "))
        } else {
            String::new()
        },
        sandbox = if o.upgrade {
            UPGRADE_PROFILE.to_string()
        } else {
            sandbox(o.reboot)
        },
    )
}

/// `--upgrade`: host root, said plainly. A package manager writes anywhere,
/// changes owners, loads modules and needs memory beyond any fixed limit;
/// the commands also leave this unit's cgroup (effects::host_run), so that
/// `systemctl restart nodekeeper` does not cut an upgrade short.
const UPGRADE_PROFILE: &str = "\
# --upgrade: upgrade commands need host root (a package manager writes
# anywhere, changes owners, loads modules), so this unit is not sandboxed
# and keeps every capability. Host commands run outside this unit's cgroup
# with their results kept in /run/nodekeeper (RuntimeDirectory).
RuntimeDirectory=nodekeeper
RuntimeDirectoryPreserve=yes
";

/// The sandbox of the maintenance-only and `--reboot` units.
fn sandbox(reboot: bool) -> String {
    format!(
        "\
{capabilities}
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
{records}",
        records = if reboot {
            "# Reboot commands keep their records (effects::host_run) in /run/nodekeeper,\n\
             # kept across restarts of this unit.\n\
             RuntimeDirectory=nodekeeper\n\
             RuntimeDirectoryPreserve=yes\n"
        } else {
            ""
        },
        capabilities = if reboot {
            "# Root to read a root-owned 0600 kubeconfig; with --reboot, CAP_SYS_ADMIN so\n\
             # that systemd accepts `systemctl reboot` from this unit (its D-Bus\n\
             # privilege check) and CAP_SYS_BOOT for a reboot command that calls\n\
             # reboot(2) itself. Nothing else.\n\
             CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYS_BOOT\n\
             AmbientCapabilities="
        } else {
            "# Root only to read a root-owned 0600 kubeconfig; every capability is gone.\n\
             CapabilityBoundingSet=\n\
             AmbientCapabilities="
        },
    )
}

pub(super) fn systemd_env(o: &Options) -> String {
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

pub(super) fn talos_manifest() -> Value {
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

pub(super) fn talos_service(o: &Options) -> Value {
    json!({
      "name": "nodekeeper",
      "depends": [
        // Waits for the ExtensionServiceConfig that carries the kubeconfig.
        {"configuration": true},
        {"network": ["addresses", "connectivity", "hostname", "etcfiles"]},
        // machined's socket, through which the agent reboots and upgrades
        // the node: Talos creates a missing mount source as a directory,
        // so the service waits for the socket first.
        {"path": crate::effects::talos::DEFAULT_SOCKET}
      ],
      "container": {
        "entrypoint": "./nodekeeper",
        "args": ["run", "--kubeconfig", o.kubeconfig, "--metrics-address", o.host_metrics()],
        "environment": [format!("RUST_LOG={}", o.rust_log())],
        "security": {"writeableRootfs": false},
        // As Talos's own installer container mounts it; `ro` still lets
        // the agent connect. From Talos 1.13 machined grants processes of
        // extension services (ext-*) every role on it.
        "mounts": [{
          "source": crate::effects::talos::DEFAULT_SOCKET,
          "destination": crate::effects::talos::DEFAULT_SOCKET,
          "type": "bind",
          "options": ["rbind", "rshared", "ro"]
        }]
      },
      "restart": "always"
    })
}

pub(super) fn talos_service_config(o: &Options) -> Value {
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

pub(super) fn containerfile() -> String {
    format!(
        "\
FROM scratch
COPY nodekeeper /nodekeeper
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER {user}:{user}
ENTRYPOINT [\"/nodekeeper\"]
CMD [\"run\"]
",
        user = super::IMAGE_USER
    )
}
