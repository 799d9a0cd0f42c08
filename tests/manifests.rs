//! Deployment artifacts: the checked-in copies are exactly what
//! `nodekeeper manifests` generates, and the RBAC they grant is enough for an
//! agent to carry a maintenance through on the real control plane.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nodekeeper::manifests::{NAMESPACE, SERVICE_ACCOUNT, TARGETS};
use nodekeeper::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use support::{Agent, TestEnv, block_on, install_crds, kubectl, run_cli, wait_for};

#[test]
fn checked_in_manifests_match_what_the_binary_generates() {
    for (target, path) in TARGETS {
        let (status, generated, err) = run_cli(&["manifests", "--for", target], &[]);
        assert!(status.success(), "{target}: {err}");
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{path} is stale; regenerate it with: nodekeeper manifests --for {target} > {path}"
        );
    }
}

#[test]
fn unknown_manifest_target_is_one_clear_line() {
    let (status, _, err) = run_cli(&["manifests", "--for", "helm"], &[]);
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("unknown target \"helm\"") && err.contains("k3s"),
        "{err}"
    );
}

#[test]
fn an_agent_with_only_the_generated_rbac_completes_a_maintenance() {
    install_crds();
    // Everything but the DaemonSet itself, whose pods would land on every
    // test's nodes.
    let objects: Vec<serde_json::Value> = nodekeeper::manifests::cluster_objects()
        .into_iter()
        .filter(|o| o["kind"] != "DaemonSet")
        .collect();
    let out = kubectl(
        &["apply", "-f", "-"],
        Some(&nodekeeper::yaml::documents(&objects)),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = kubectl(
        &[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            NAMESPACE,
            "--duration=1h",
        ],
        None,
    );
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    let token = String::from_utf8_lossy(&token.stdout).trim().to_string();

    // The admin kubeconfig with the ServiceAccount's token instead.
    let admin = std::fs::read_to_string(support::cluster()).expect("kubeconfig");
    let sa_config: String = admin
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                format!("    token: {token}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = std::env::temp_dir().join(format!("nk-sa-kubeconfig-{:x}", support::rand_u64()));
    std::fs::write(&path, sa_config).expect("write kubeconfig");

    block_on(async {
        let mut env = TestEnv::new("rbac").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("web", 2))
            .await
            .expect("deploy");
        let path = path.to_string_lossy().to_string();
        let mut agent = Agent::start(&["run", "--node", &a, "--kubeconfig", &path]);
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let name = format!("{}-m", env.id);
        let nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: a.clone(),
                reason: None,
            },
        );
        nms.create(&PostParams::default(), &nm)
            .await
            .expect("create nm");
        wait_for(
            "Succeeded under the generated RBAC",
            Duration::from_secs(60),
            || async {
                (nms.get(&name).await.ok()?.phase() == Some(Phase::Succeeded)).then_some(())
            },
        )
        .await;
        nms.delete(&name, &DeleteParams::default())
            .await
            .expect("delete nm");
        wait_for(
            "removed under the generated RBAC",
            Duration::from_secs(60),
            || async { nms.get_opt(&name).await.ok()?.is_none().then_some(()) },
        )
        .await;
        let log = agent.log_text();
        assert!(
            !log.contains("forbidden"),
            "the agent hit a permission it lacks:\n{log}"
        );
        agent.signal("TERM");
        assert!(agent.wait_exit(Duration::from_secs(15)).success());
    })
}
