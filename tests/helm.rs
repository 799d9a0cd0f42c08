//! The Helm chart (image/helm, `nodekeeper manifests --for helm`) with a
//! real helm built with the control plane (tests/upstream/build.sh,
//! cached): lint, template, install, upgrade with changed values and
//! uninstall against the test cluster, each checked through the API.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use support::{TestEnv, block_on, cluster, wait_for};

/// The helm binary, built once per test run (both tests ask for it).
fn helm_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(build_helm).clone()
}

fn build_helm() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/build.sh");
    let out = Command::new(&script)
        .arg("helm")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "building helm failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn chart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("image/helm")
        .to_string_lossy()
        .into_owned()
}

/// helm with the test cluster's kubeconfig; (success, stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm_bin())
        .args(args)
        .env("KUBECONFIG", cluster())
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("nk-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("nk-helm/config"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("nk-helm/data"))
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_chart_lints_and_renders_each_choice() {
    let c = chart();
    let (ok, out, err) = helm(&["lint", "--strict", &c]);
    assert!(ok && out.contains("0 chart(s) failed"), "{out}{err}");
    // The schema refuses a bad value before anything renders.
    let (ok, out, err) = helm(&["lint", "--strict", &c, "--set", "logLevel=loud"]);
    assert!(
        !ok && format!("{out}{err}").contains("logLevel"),
        "{out}{err}"
    );
    let (ok, out, err) = helm(&["lint", &c, "--set", "cluster.replicas=0"]);
    assert!(
        !ok && format!("{out}{err}").contains("replicas"),
        "{out}{err}"
    );

    let template = |sets: &[&str]| {
        let mut args = vec!["template", "nk", c.as_str(), "--namespace", "ops"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let (ok, out, err) = helm(&args);
        assert!(ok, "helm template {sets:?}: {err}");
        out
    };
    let plain = template(&[]);
    assert!(
        !plain.contains("\"hostPID\": true"),
        "no host access by default"
    );
    assert!(
        plain.contains("\"--node-agents\""),
        "cluster role beside agents"
    );
    assert!(plain.contains("system:serviceaccount:ops:nodekeeper-agent"));
    assert!(!plain.contains("ValidatingWebhookConfiguration"));
    let reboot = template(&["nodeAgents.reboot=true"]);
    assert!(reboot.contains("\"hostPID\": true") && reboot.contains("\"--host-exec\""));
    let alone = template(&[
        "nodeAgents.enabled=false",
        "webhook=true",
        "cluster.providerCommand=/provider/aws",
        "cluster.extraArgs={--drain-timeout,10m}",
    ]);
    assert!(!alone.contains("kind\": \"DaemonSet"), "no agents");
    // What runs pods as others or deletes nodes comes only with its
    // feature (where-features-meet.md finding 9).
    assert!(
        !plain.contains("nodekeeper-cluster-jobs")
            && !plain.contains("nodekeeper-cluster-replacement")
    );
    assert!(
        alone.contains("\"nodekeeper-cluster-replacement\"")
            && !alone.contains("nodekeeper-cluster-jobs")
    );
    let jobs = template(&["cluster.upgradeJobs=true"]);
    assert!(
        jobs.contains("\"nodekeeper-cluster-jobs\"")
            && !jobs.contains("nodekeeper-cluster-replacement")
    );
    // The cluster role drains then, so it needs the medik8s lease Role.
    assert!(
        alone.contains("\"name\": \"nodekeeper-medik8s-lease\"")
            && alone.contains("\"kind\": \"Role\""),
        "{alone}"
    );
    assert!(
        !plain.contains("nodekeeper-notify"),
        "no Secret readable by default"
    );
    let notify = template(&[
        "notifications.defaultSecret=ops-slack",
        "notifications.secrets={team-hook,ops-slack}",
    ]);
    assert!(
        notify.contains(r#""resourceNames": ["ops-slack","team-hook"]"#)
            && notify.contains(r#""--notify-default","ops-slack""#),
        "{notify}"
    );
    for out in [&plain, &reboot, &alone, &notify] {
        assert!(!out.contains('@'), "a placeholder left: {out}");
    }
    assert!(!alone.contains("--node-agents"));
    assert!(alone.contains("ValidatingWebhookConfiguration"));
    assert!(
        alone.contains(
            r#""args": ["run","--all-nodes","--metrics-address",":9477","--admission-address",":9443","--admission-service","ops/nodekeeper-admission","--admission-client-ca","/etc/nodekeeper/admission-client-ca/ca.crt","--provider-command","/provider/aws","--drain-timeout","10m"]"#
        ),
        "{alone}"
    );
}

#[test]
fn install_upgrade_and_uninstall_against_the_cluster() {
    block_on(async {
        let mut env = TestEnv::new("helm").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let ns = format!("{}-rel", env.id);
        let group = format!("nodeAgents.nodeSelector.nodekeeper\\.test/group={}", env.id);
        let cluster_group = format!("cluster.nodeSelector.nodekeeper\\.test/group={}", env.id);
        let c = chart();

        // Other tests install the same cluster-wide objects (the agent's
        // ClusterRole, the own-node policy) with kubectl: the chart takes
        // them over, as an adopter's helm would from an earlier install.
        let started = Instant::now();
        let (ok, out, err) = helm(&[
            "install",
            "nk",
            &c,
            "--namespace",
            &ns,
            "--create-namespace",
            "--take-ownership",
            "--force-conflicts",
            "--set",
            &group,
            "--set",
            &cluster_group,
            "--wait",
            "--timeout",
            "120s",
        ]);
        assert!(ok, "helm install: {out}{err}");
        let install = started.elapsed();

        let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
        let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &ns);
        let ds = daemonsets.get("nodekeeper").await.expect("the DaemonSet");
        assert_eq!(
            ds.status
                .as_ref()
                .map(|s| (s.desired_number_scheduled, s.number_ready)),
            Some((2, 2)),
            "one agent on each of the test's two nodes"
        );
        let pod = ds.spec.template.spec.clone().expect("pod spec");
        assert_ne!(pod.host_pid, Some(true), "no host access by default");
        let dep = deployments
            .get("nodekeeper-cluster")
            .await
            .expect("the cluster role");
        assert_eq!(dep.spec.replicas, Some(2));
        let roles: Api<ClusterRole> = Api::all(env.client.clone());
        for r in ["nodekeeper-agent", "nodekeeper-cluster"] {
            let role = roles.get(r).await.expect("ClusterRole");
            assert_eq!(
                role.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("meta.helm.sh/release-namespace")),
                Some(&ns),
                "{r} belongs to the release"
            );
        }

        // Upgrade with changed values: the reboot profile, one replica, debug logs.
        let started = Instant::now();
        let (ok, out, err) = helm(&[
            "upgrade",
            "nk",
            &c,
            "--namespace",
            &ns,
            "--reuse-values",
            "--set",
            "nodeAgents.reboot=true",
            "--set",
            "cluster.replicas=1",
            "--set",
            "logLevel=debug",
            "--wait",
            "--timeout",
            "120s",
        ]);
        assert!(ok, "helm upgrade: {out}{err}");
        let upgrade = started.elapsed();
        let ds = daemonsets.get("nodekeeper").await.expect("the DaemonSet");
        let pod = ds.spec.template.spec.expect("pod spec");
        assert_eq!(pod.host_pid, Some(true), "reboot profile");
        let container = &pod.containers[0];
        assert!(container.args.iter().flatten().any(|a| a == "--host-exec"));
        assert!(
            container
                .env
                .iter()
                .flatten()
                .any(|e| e.name == "RUST_LOG" && e.value.as_deref() == Some("nodekeeper=debug")),
            "{:?}",
            container.env
        );
        let dep = deployments
            .get("nodekeeper-cluster")
            .await
            .expect("the cluster role");
        assert_eq!(dep.spec.replicas, Some(1));

        // Uninstall leaves nothing of the release; the CRDs stay (Helm
        // never deletes what crds/ installed), as the chart's notes say.
        let started = Instant::now();
        let (ok, out, err) = helm(&[
            "uninstall",
            "nk",
            "--namespace",
            &ns,
            "--wait",
            "--timeout",
            "120s",
        ]);
        assert!(ok, "helm uninstall: {out}{err}");
        let uninstall = started.elapsed();
        wait_for(
            "the release's objects gone",
            Duration::from_secs(60),
            || async {
                let gone = daemonsets.get_opt("nodekeeper").await.ok()?.is_none()
                    && deployments
                        .get_opt("nodekeeper-cluster")
                        .await
                        .ok()?
                        .is_none()
                    && roles.get_opt("nodekeeper-agent").await.ok()?.is_none()
                    && roles.get_opt("nodekeeper-cluster").await.ok()?.is_none()
                    && Api::<ServiceAccount>::namespaced(env.client.clone(), &ns)
                        .get_opt("nodekeeper-agent")
                        .await
                        .ok()?
                        .is_none();
                gone.then_some(())
            },
        )
        .await;
        let policies: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
            Api::all(env.client.clone());
        assert!(
            policies
                .get_opt("nodekeeper-own-node")
                .await
                .expect("list")
                .is_none(),
            "the own-node policy removed"
        );
        let (_, listed, _) = helm(&["list", "--namespace", &ns, "--all"]);
        assert!(!listed.contains("nk"), "{listed}");
        eprintln!(
            "helm: install {} ms (--wait, 2 agents, 2 cluster replicas), upgrade {} ms, uninstall {} ms",
            install.as_millis(),
            upgrade.as_millis(),
            uninstall.as_millis()
        );
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
            .delete(&ns, &Default::default())
            .await;
    })
}
