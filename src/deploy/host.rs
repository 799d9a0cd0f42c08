//! The host run modes: the systemd unit and its environment file, the
//! Talos system extension, and the scratch image's Containerfile.

use serde_json::{Value, json};

use super::*;

/// Where `manifests --for systemd` expects the binary (the README's
/// recipe copies it there); a package installs it in `/usr/bin`.
const LOCAL_BIN: &str = "/usr/local/bin/nodekeeper";
/// The packaged binary's path.
const PACKAGED_BIN: &str = "/usr/bin/nodekeeper";

pub(super) fn systemd_unit(o: &Options) -> String {
    unit(o, LOCAL_BIN)
}

fn unit(o: &Options, bin: &str) -> String {
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
ExecStart={bin} run --metrics-address {metrics}{admission} $NODEKEEPER_ARGS
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

/// The sandbox of the maintenance-only and `--reboot` units: each setting,
/// its value, and the value that undoes it (the packaged upgrade profile's
/// drop-in, which must lift exactly what the unit sets).
const SANDBOX: &[(&str, &str, &str)] = &[
    ("NoNewPrivileges", "yes", "no"),
    ("ProtectSystem", "strict", "no"),
    ("ProtectHome", "yes", "no"),
    ("PrivateTmp", "yes", "no"),
    ("PrivateDevices", "yes", "no"),
    ("ProtectKernelTunables", "yes", "no"),
    ("ProtectKernelModules", "yes", "no"),
    ("ProtectKernelLogs", "yes", "no"),
    ("ProtectControlGroups", "yes", "no"),
    ("ProtectClock", "yes", "no"),
    ("ProtectHostname", "yes", "no"),
    ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX", ""),
    ("RestrictNamespaces", "yes", "no"),
    ("RestrictRealtime", "yes", "no"),
    ("RestrictSUIDSGID", "yes", "no"),
    ("LockPersonality", "yes", "no"),
    ("MemoryDenyWriteExecute", "yes", "no"),
    ("SystemCallArchitectures", "native", ""),
    ("SystemCallFilter", "@system-service", ""),
    ("MemoryMax", "64M", "infinity"),
];

/// The reboot profile's capabilities, with why.
const REBOOT_CAPABILITIES: &str = "\
# Root to read a root-owned 0600 kubeconfig; with --reboot, CAP_SYS_ADMIN so
# that systemd accepts `systemctl reboot` from this unit (its D-Bus
# privilege check) and CAP_SYS_BOOT for a reboot command that calls
# reboot(2) itself. Nothing else.
CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYS_BOOT
";

/// Where a reboot's or upgrade's host commands keep their records.
const RECORDS: &str = "\
# Reboot commands keep their records (effects::host_run) in /run/nodekeeper,
# kept across restarts of this unit.
RuntimeDirectory=nodekeeper
RuntimeDirectoryPreserve=yes
";

/// The sandbox of the maintenance-only and `--reboot` units.
fn sandbox(reboot: bool) -> String {
    let mut out = String::from(if reboot {
        REBOOT_CAPABILITIES
    } else {
        "# Root only to read a root-owned 0600 kubeconfig; every capability is gone.\n\
         CapabilityBoundingSet=\n"
    });
    out.push_str("AmbientCapabilities=\n");
    for (key, value, _) in SANDBOX {
        out.push_str(&format!("{key}={value}\n"));
    }
    if reboot {
        out.push_str(RECORDS);
    }
    out
}

/// The files an OS package or system extension installs (`--for
/// package`): the maintenance-only unit running `/usr/bin/nodekeeper`,
/// the reboot and upgrade profiles as drop-ins the operator enables, and
/// the environment file.
pub(super) fn package_files(o: &Options) -> Vec<(String, &'static str, String)> {
    let dropin = |body: String| format!("[Service]\n{body}");
    let mut undo = String::from(
        "# Every capability (\"~\" alone resets the bounding set to the full set).\n\
         CapabilityBoundingSet=~\n",
    );
    for (key, _, value) in SANDBOX {
        undo.push_str(&format!("{key}={value}\n"));
    }
    vec![
        (
            "usr/lib/systemd/system/nodekeeper.service".into(),
            "nodekeeper as a host service, maintenance only (cordon and drain its node).\n\
             # Reboots and upgrades: enable a profile in /usr/share/nodekeeper/systemd (README, Packages)",
            unit(o, PACKAGED_BIN),
        ),
        (
            format!("usr/share/nodekeeper/systemd/{REBOOT_DROPIN}"),
            "The reboot profile as a drop-in: nodekeeper.service may reboot its host,\n\
             # with CAP_SYS_ADMIN (host root in effect). Enable it:\n\
             #   mkdir -p /etc/systemd/system/nodekeeper.service.d\n\
             #   ln -s /usr/share/nodekeeper/systemd/reboot-cap-sys-admin.conf /etc/systemd/system/nodekeeper.service.d/\n\
             #   systemctl daemon-reload && systemctl restart nodekeeper",
            dropin(format!("{REBOOT_CAPABILITIES}{RECORDS}")),
        ),
        (
            format!("usr/share/nodekeeper/systemd/{UPGRADE_DROPIN}"),
            "The upgrade profile as a drop-in: nodekeeper.service runs unsandboxed as\n\
             # host root, every setting of the unit's sandbox lifted, so that UpgradePlan\n\
             # commands (a package manager) can run. Enable it as the reboot profile,\n\
             # with this file's name; it includes what the reboot profile grants.",
            dropin(format!("{UPGRADE_PROFILE}{undo}")),
        ),
        (
            "etc/nodekeeper/nodekeeper.env".into(),
            "Settings for nodekeeper.service (a conffile: kept on upgrade)",
            systemd_env(o),
        ),
    ]
}

/// The drop-ins' file names: what each grants, in its name.
const REBOOT_DROPIN: &str = "reboot-cap-sys-admin.conf";
const UPGRADE_DROPIN: &str = "upgrade-host-root.conf";

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
