//! Unit tests of the generator: every target renders, options flow into
//! the output, bad options name their flag.

use super::*;
use serde_json::json;

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

/// The leader FlowSchema follows the namespace: its subject is the
/// cluster role's ServiceAccount there, and it matches that namespace's
/// leases only (the medik8s node leases stay ordinary work).
#[test]
fn the_leader_flow_schema_names_the_cluster_account_and_its_namespace() {
    let o = Options {
        namespace: "ops".into(),
        ..Options::default()
    };
    let docs = super::workloads::deployment(&o);
    let schema = docs
        .iter()
        .find(|d| d["kind"] == "FlowSchema")
        .cloned()
        .unwrap_or_default();
    assert_eq!(schema["metadata"]["name"], LEADER_FLOW_SCHEMA);
    let rule = &schema["spec"]["rules"][0];
    assert_eq!(
        rule["subjects"],
        json!([{"kind": "ServiceAccount",
                "serviceAccount": {"name": CLUSTER_ACCOUNT, "namespace": "ops"}}])
    );
    assert_eq!(rule["resourceRules"][0]["namespaces"], json!(["ops"]));
    assert_eq!(rule["resourceRules"][0]["resources"], json!(["leases"]));
    assert_eq!(
        schema["spec"]["priorityLevelConfiguration"]["name"],
        "leader-election"
    );
}

/// The notifications' Secrets: the cluster role may `get` those names and
/// nothing else; none named, no Role at all; the default goes to `run`.
#[test]
fn the_cluster_role_reads_only_the_notification_secrets_it_is_given() {
    let plain = super::workloads::deployment(&Options::default());
    assert!(plain.iter().all(|d| d["metadata"]["name"] != NOTIFY_ROLE));
    let o = Options {
        notify_default: Some("ops-slack".into()),
        notify_secrets: vec!["team-hook".into(), "ops-slack".into()],
        ..Options::default()
    };
    let docs = super::workloads::deployment(&o);
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == NOTIFY_ROLE)
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"],
                "resourceNames": ["ops-slack", "team-hook"], "verbs": ["get"]}])
    );
    assert!(docs.iter().any(|d| d["kind"] == "RoleBinding"
        && d["metadata"]["name"] == NOTIFY_ROLE
        && d["subjects"][0]["name"] == CLUSTER_ACCOUNT));
    let args = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .map(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].to_string())
        .unwrap_or_default();
    assert!(args.contains(r#""--notify-default","ops-slack""#), "{args}");
    let bad = Options {
        notify_secrets: vec!["Not A Name".into()],
        ..Options::default()
    };
    assert!(bad.validate().is_err());
}

/// where-features-meet.md finding 9: creating a Job (a pod as any
/// ServiceAccount of a namespace), patching a Deployment's template and
/// deleting a node are granted only when the feature that needs them is
/// rendered, each in a ClusterRole of its own; the k3s folder and the
/// chart's defaults grant none of them.
#[test]
fn what_runs_pods_as_others_or_deletes_nodes_is_granted_only_with_its_feature() {
    let granted = |docs: &[Value], group: &str, resource: &str, verb: &str| {
        docs.iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .any(|r| {
                r["apiGroups"] == json!([group])
                    && r["resources"]
                        .as_array()
                        .is_some_and(|a| a.contains(&json!(resource)))
                    && r["verbs"]
                        .as_array()
                        .is_some_and(|v| v.contains(&json!(verb)))
            })
    };
    let dangerous = [
        ("batch", "jobs", "create"),
        ("apps", "deployments", "patch"),
        ("", "nodes", "delete"),
    ];
    let plain = super::workloads::deployment(&Options::default());
    for (g, r, v) in dangerous {
        assert!(!granted(&plain, g, r, v), "{v} {r} granted by default");
    }
    assert!(granted(&plain, "batch", "jobs", "watch"));
    let jobs = super::workloads::deployment(&Options {
        upgrade_jobs: true,
        ..Options::default()
    });
    assert!(granted(&jobs, "batch", "jobs", "create"));
    assert!(!granted(&jobs, "", "nodes", "delete"));
    assert!(jobs.iter().any(|d| d["kind"] == "ClusterRoleBinding"
        && d["metadata"]["name"] == "nodekeeper-cluster-jobs"
        && d["subjects"][0]["name"] == CLUSTER_ACCOUNT));
    let both = super::workloads::deployment(&Options {
        upgrade_jobs: true,
        replacement: true,
        ..Options::default()
    });
    for (g, r, v) in dangerous {
        assert!(granted(&both, g, r, v), "{v} {r}");
    }
    // The k3s folder as shipped, and the chart: only behind their values.
    let k3s = render("k3s", &Options::default()).expect("k3s");
    assert!(
        k3s.iter()
            .all(|f| !f.content.contains("nodekeeper-cluster-jobs"))
    );
    let chart = render("helm", &Options::default()).expect("helm");
    let cluster = chart
        .iter()
        .find(|f| f.path == "templates/cluster.yaml")
        .map(|f| f.content.clone())
        .unwrap_or_default();
    let jobs_at = cluster.find("\"nodekeeper-cluster-jobs\"").unwrap_or(0);
    let gate = cluster
        .find("{{- if .Values.cluster.upgradeJobs }}")
        .unwrap_or(usize::MAX);
    assert!(gate < jobs_at, "{cluster}");
    let values = chart
        .iter()
        .find(|f| f.path == "values.yaml")
        .map(|f| f.content.clone())
        .unwrap_or_default();
    assert!(values.contains("upgradeJobs: false"), "{values}");
    // The README's table says which switch grants each.
    assert!(
        super::rbac::readme_table().contains("cluster role, only with `manifests --upgrade-jobs`")
    );
}

#[test]
fn options_flow_into_the_manifests() {
    let o = Options {
        image: "registry.example/nk:9".into(),
        namespace: "ops".into(),
        kubeconfig: "/var/lib/nk/kc".into(),
        log_level: "debug".into(),
        metrics_address: Some("127.0.0.1:9999".into()),
        reboot: false,
        upgrade: false,
        node_agents: false,
        admission: false,
        notify_default: None,
        notify_secrets: Vec::new(),
        upgrade_jobs: false,
        replacement: false,
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

#[test]
fn only_reboot_profiles_get_host_pid_and_capabilities() {
    let plain = daemonset(&Options::default());
    let spec = &plain["spec"]["template"]["spec"];
    assert!(spec.get("hostPID").is_none());
    assert_eq!(
        spec["containers"][0]["securityContext"]["runAsNonRoot"],
        true
    );
    let o = Options {
        reboot: true,
        ..Default::default()
    };
    let ds = daemonset(&o);
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], true);
    let c = &spec["containers"][0];
    assert_eq!(
        c["securityContext"]["capabilities"]["add"],
        serde_json::json!(["SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"])
    );
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert!(c["securityContext"].get("privileged").is_none());
    let args = c["args"].to_string();
    assert!(
        args.contains("--host-exec") && args.contains("/proc/1/root"),
        "{args}"
    );
    let pod = static_pod(&o);
    assert_eq!(pod["spec"]["hostPID"], true);
    // The cluster role never gets host access; in the k3s folder it admits
    // beside the node agents.
    let k3s: String = render("k3s", &o)
        .unwrap_or_default()
        .into_iter()
        .map(|f| f.content)
        .collect();
    assert!(k3s.contains("--node-agents"));
    assert_eq!(k3s.matches("hostPID: true").count(), 1, "{k3s}");
    for t in ["talos", "containerfile", "deployment", "crds"] {
        assert!(render(t, &o).is_err(), "{t} refuses --reboot");
    }
}

/// `--upgrade` is the reboot profile made host root, said plainly: a
/// privileged container for the DaemonSet and the static pod, an
/// unsandboxed unit; `--reboot` alone stays at three capabilities, and its
/// unit keeps its sandbox with the records' directory writable.
#[test]
fn the_upgrade_profile_is_host_root_and_the_reboot_profile_is_not() {
    let o = Options {
        reboot: true,
        upgrade: true,
        ..Default::default()
    };
    for pod in [
        daemonset(&o)["spec"]["template"]["spec"].clone(),
        static_pod(&o)["spec"].clone(),
    ] {
        let sc = &pod["containers"][0]["securityContext"];
        assert_eq!(pod["hostPID"], true);
        assert_eq!(sc["privileged"], true, "{sc}");
        assert!(sc.get("capabilities").is_none(), "{sc}");
    }
    let unit = |o: &Options| -> String {
        render("systemd", o)
            .unwrap_or_default()
            .into_iter()
            .map(|f| f.content)
            .collect()
    };
    let upgrade = unit(&o);
    for sandbox in [
        "ProtectSystem",
        "MemoryMax",
        "CapabilityBoundingSet",
        "NoNewPrivileges",
    ] {
        assert!(!upgrade.contains(sandbox), "{sandbox} in {upgrade}");
    }
    assert!(upgrade.contains("RuntimeDirectory=nodekeeper\nRuntimeDirectoryPreserve=yes"));
    let reboot = unit(&Options {
        reboot: true,
        ..Default::default()
    });
    assert!(reboot.contains("ProtectSystem=strict") && reboot.contains("MemoryMax=64M"));
    assert!(reboot.contains("RuntimeDirectory=nodekeeper\nRuntimeDirectoryPreserve=yes"));
    let plain = unit(&Options::default());
    assert!(!plain.contains("RuntimeDirectory"), "{plain}");
}

/// `--admission` serves the webhook where a mode can: loopback for the
/// static pod and systemd (the configuration's URL), a Service for the
/// Deployment, whose DNS name the certificate then carries.
#[test]
fn admission_flows_into_the_serving_modes_and_nowhere_else() {
    let o = Options {
        admission: true,
        ..Options::default()
    };
    let text = |t: &str| -> String {
        render(t, &o)
            .unwrap_or_default()
            .into_iter()
            .map(|f| f.content)
            .collect()
    };
    assert!(
        text("static-pod").contains("- \"--admission-address\"\n        - \"127.0.0.1:9443\""),
        "{}",
        text("static-pod")
    );
    assert!(text("systemd").contains("run --metrics-address 127.0.0.1:9477 --admission-address 127.0.0.1:9443 $NODEKEEPER_ARGS"), "{}", text("systemd"));
    let deployment = text("deployment");
    assert!(
        deployment
            .contains("- \"--admission-service\"\n            - nodekeeper/nodekeeper-admission"),
        "{deployment}"
    );
    assert!(deployment.contains("containerPort: 9443"), "{deployment}");
    // Off loopback it answers only the API server: the CA of its client
    // certificate, from a ConfigMap the operator creates.
    assert!(
        deployment.contains(
            "- \"--admission-client-ca\"\n            - \"/etc/nodekeeper/admission-client-ca/ca.crt\""
        ) && deployment.contains("name: nodekeeper-admission-client-ca"),
        "{deployment}"
    );
    assert!(
        !text("static-pod").contains("--admission-client-ca"),
        "loopback needs none"
    );
    for t in ["daemonset", "k3s", "webhook"] {
        let err = render(t, &o)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--admission applies to"), "{t}: {err}");
    }
    let plain = Options::default();
    let service = render("webhook-service", &plain).unwrap_or_default();
    let yaml: String = service.into_iter().map(|f| f.content).collect();
    for want in [
        "kind: Service",
        "name: nodekeeper-admission",
        "path: \"/validate-nodemaintenance\"",
        "failurePolicy: Ignore",
        "resourceNames:",
    ] {
        assert!(yaml.contains(want), "{want}: {yaml}");
    }
}

/// `kubectl apply -f k3s-manifests/` applies the files in lexical order, so
/// that order must create what later files need: the CRDs first, and every
/// namespace before any object in it.
#[test]
fn k3s_files_sort_in_the_order_they_must_be_applied() {
    let has_line = |text: &str, line: &str| text.lines().any(|l| l.trim() == line);
    let o = Options::default();
    let files = render("k3s", &o).unwrap_or_default();
    let mut sorted: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    sorted.sort_unstable();
    let listed: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(sorted, listed, "file names must sort in the listed order");
    assert!(
        files[0].content.contains("kind: CustomResourceDefinition"),
        "the CRDs come first: {}",
        files[0].path
    );
    // Every namespace is created (its Namespace document) in a file, and
    // in that file before the objects in it, before any later file uses it.
    let docs: Vec<(usize, &str)> = files
        .iter()
        .enumerate()
        .flat_map(|(i, f)| f.content.split("\n---\n").map(move |d| (i, d)))
        .collect();
    for ns in [o.namespace.as_str(), LEASE_NAMESPACE] {
        let created = docs
            .iter()
            .position(|(_, d)| d.contains("kind: Namespace") && has_line(d, &format!("name: {ns}")))
            .unwrap_or_else(|| panic!("no file creates namespace {ns}"));
        let used = docs
            .iter()
            .position(|(_, d)| has_line(d, &format!("namespace: {ns}")))
            .unwrap_or(usize::MAX);
        assert!(
            created < used,
            "namespace {ns} is used before it is created"
        );
    }
    // The shared one lives in a subfolder a plain `kubectl delete -f
    // k3s-manifests/` does not read, and nowhere else.
    let shared: Vec<&str> = files
        .iter()
        .filter(|f| {
            f.content.contains("kind: Namespace")
                && has_line(&f.content, &format!("name: {LEASE_NAMESPACE}"))
        })
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(shared, ["00-shared/medik8s-leases.yaml"]);
    // No identity may create namespaces.
    assert!(
        !GRANTS
            .iter()
            .any(|g| g.resource == "namespaces" && g.verbs.contains(&"create")),
        "no shipped identity creates namespaces"
    );
}

/// Talos's own checks of a system extension's metadata and service
/// (`pkg/machinery/extensions`, as `../shared/compat/talos.md` reads them):
/// what a Talos image build refuses. Empty when both pass.
fn talos_problems(manifest: &serde_json::Value, service: &serde_json::Value) -> Vec<String> {
    let mut problems = Vec::new();
    let text = |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    if manifest["version"] != "v1alpha1" {
        problems.push(format!("manifest version {}", manifest["version"]));
    }
    for field in ["name", "version", "author", "description"] {
        if text(&manifest["metadata"][field]).is_none() {
            problems.push(format!("metadata.{field} missing"));
        }
    }
    // A semver range: constraints of an optional operator and a version
    // (a `v` before a digit ignored), separated by spaces or commas.
    let range =
        text(&manifest["metadata"]["compatibility"]["talos"]["version"]).unwrap_or_default();
    let constraints: Vec<&str> = range.split([' ', ',']).filter(|c| !c.is_empty()).collect();
    let mut i = 0;
    let mut parsed = 0;
    while i < constraints.len() {
        let mut c = constraints[i];
        if [">=", "<=", ">", "<", "=", "~", "^", "!="].contains(&c) {
            i += 1;
            c = constraints.get(i).copied().unwrap_or_default();
        } else {
            c = c.trim_start_matches(['>', '<', '=', '~', '^', '!']);
        }
        let v = c
            .strip_prefix('v')
            .filter(|r| r.starts_with(|ch: char| ch.is_ascii_digit()))
            .unwrap_or(c);
        let parts: Vec<&str> = v.split('.').collect();
        if parts.is_empty() || parts.len() > 3 || parts.iter().any(|p| p.parse::<u64>().is_err()) {
            problems.push(format!(
                "compatibility.talos.version {range:?} is not a semver range"
            ));
        }
        parsed += 1;
        i += 1;
    }
    if parsed == 0 {
        problems.push("compatibility.talos.version missing".into());
    }
    let name = text(&service["name"]).unwrap_or_default();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    {
        problems.push(format!("service name {name:?}"));
    }
    if !["always", "never", "untilSuccess"]
        .contains(&service["restart"].as_str().unwrap_or_default())
    {
        problems.push(format!("restart {}", service["restart"]));
    }
    if text(&service["container"]["entrypoint"]).is_none() {
        problems.push("container.entrypoint empty".into());
    }
    let statuses = ["addresses", "connectivity", "hostname", "etcfiles"];
    for d in service["depends"].as_array().into_iter().flatten() {
        let keys: Vec<&String> = d
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        let ok = match keys.as_slice() {
            [k] if k.as_str() == "service" => text(&d["service"]).is_some(),
            [k] if k.as_str() == "path" => d["path"].as_str().is_some_and(|p| p.starts_with('/')),
            [k] if k.as_str() == "configuration" => d["configuration"].is_boolean(),
            [k] if k.as_str() == "network" => d["network"].as_array().is_some_and(|a| {
                !a.is_empty()
                    && a.iter()
                        .all(|s| statuses.contains(&s.as_str().unwrap_or_default()))
            }),
            _ => false,
        };
        if !ok {
            problems.push(format!("depends entry {d}"));
        }
    }
    problems
}

/// The Talos extension as rendered (the image test checks the shipped
/// files are exactly these, and its rootfs's files) passes Talos's own
/// checks; the checker catches what Talos refuses.
#[test]
fn the_talos_extension_passes_talos_own_checks() {
    let o = Options::default();
    let (manifest, service) = (host::talos_manifest(), host::talos_service(&o));
    assert_eq!(talos_problems(&manifest, &service), Vec::<String>::new());
    let mut bad_manifest = manifest.clone();
    bad_manifest["metadata"]["compatibility"]["talos"]["version"] = serde_json::json!("newest");
    bad_manifest["metadata"]["author"] = serde_json::json!("");
    let mut bad_service = service.clone();
    bad_service["name"] = serde_json::json!("Node Keeper");
    bad_service["restart"] = serde_json::json!("sometimes");
    bad_service["depends"] = serde_json::json!([{"path": "relative"}, {"network": ["wifi"]}, {"service": "cri", "path": "/x"}]);
    assert_eq!(talos_problems(&bad_manifest, &bad_service).len(), 7);
    // What the agent needs on Talos: machined's socket mounted where
    // `run --talos-socket` looks by default, waited for before start.
    let socket = crate::effects::talos::DEFAULT_SOCKET;
    let mounts = service["container"]["mounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        mounts
            .iter()
            .any(|m| m["source"] == socket && m["destination"] == socket && m["type"] == "bind"),
        "machined's socket is mounted: {mounts:?}"
    );
    assert!(
        service["depends"]
            .as_array()
            .is_some_and(|d| d.iter().any(|e| e["path"] == socket)),
        "the service waits for the socket"
    );
}
