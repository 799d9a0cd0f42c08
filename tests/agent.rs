//! `nodekeeper run` as a process against the real control plane: it connects,
//! sees its node, stops cleanly on SIGTERM, and turns bad configuration into
//! one clear line and a non-zero exit.

mod support;

use std::time::Duration;

use support::{Agent, TestEnv, block_on, run_cli, wait_for};

#[test]
fn run_sees_its_node_and_exits_zero_on_sigterm() {
    support::install_crds();
    let mut env = block_on(TestEnv::new("agent"));
    let node = block_on(env.add_node("a"));
    block_on(env.wait_node_ready(&node));
    let mut agent = Agent::start(&["run", "--node", &node]);
    block_on(wait_for(
        "the agent to log its node as Ready",
        Duration::from_secs(30),
        || async {
            agent
                .log_text()
                .contains(&format!("node {node}: ready=True"))
                .then_some(())
        },
    ));
    agent.signal("TERM");
    let status = agent.wait_exit(Duration::from_secs(15));
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        agent.log_text()
    );
    assert!(agent.log_text().contains("stopped"), "{}", agent.log_text());
}

#[test]
fn run_with_a_bad_kubeconfig_exits_nonzero_with_one_line() {
    let dir = std::env::temp_dir().join(format!("nk-badkc-{:x}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let bad = dir.join("kubeconfig");
    std::fs::write(&bad, "this: is: not: a kubeconfig").expect("write");
    let (status, _out, err) = run_cli(
        &[
            "run",
            "--node",
            "x",
            "--kubeconfig",
            bad.to_str().unwrap_or_default(),
        ],
        &[],
    );
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "one line, got:\n{err}");
    assert!(
        err.starts_with("nodekeeper: error: no Kubernetes credentials"),
        "{err}"
    );
    assert!(
        err.contains(bad.to_str().unwrap_or_default()),
        "names the file: {err}"
    );
}

#[test]
fn run_without_any_kubeconfig_exits_nonzero_with_one_line() {
    let (status, _out, err) = run_cli(
        &["run", "--node", "x"],
        &[
            ("KUBECONFIG", "/nonexistent/kubeconfig"),
            ("HOME", "/nonexistent"),
            ("KUBERNETES_SERVICE_HOST", ""),
        ],
    );
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "one line, got:\n{err}");
    assert!(err.contains("no Kubernetes credentials"), "{err}");
}

#[test]
fn run_against_an_unreachable_server_exits_nonzero_with_one_line() {
    let dir = std::env::temp_dir().join(format!("nk-unreach-{:x}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let kc = dir.join("kubeconfig");
    // Port 1 on loopback: nothing listens there, the connection is refused.
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .expect("write");
    let (status, _out, err) = run_cli(
        &[
            "run",
            "--node",
            "x",
            "--kubeconfig",
            kc.to_str().unwrap_or_default(),
        ],
        &[],
    );
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "one line, got:\n{err}");
    assert!(
        err.contains("cannot reach the Kubernetes API server at https://127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn run_for_an_unknown_node_exits_nonzero_with_one_line() {
    let kc = support::cluster().to_str().unwrap_or_default().to_string();
    let (status, _out, err) = run_cli(
        &["run", "--node", "no-such-node-4711", "--kubeconfig", &kc],
        &[],
    );
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "one line, got:\n{err}");
    assert!(
        err.contains("node \"no-such-node-4711\" does not exist"),
        "{err}"
    );
}

#[test]
fn missing_crds_are_named_with_the_install_hint() {
    // A resource this cluster certainly does not serve stands in for our CRDs,
    // which other tests install; the 404 comes from the real API server.
    let client = block_on(support::client());
    let absent = kube::api::ApiResource {
        group: "nodekeeper.invalid".into(),
        version: "v1".into(),
        api_version: "nodekeeper.invalid/v1".into(),
        kind: "Absent".into(),
        plural: "absents".into(),
    };
    let err =
        block_on(nodekeeper::agent::check_served(&client, &[absent])).expect_err("must be missing");
    assert_eq!(
        err.to_string(),
        "CRDs not installed: absents.nodekeeper.invalid (install them with: nodekeeper crds | kubectl apply -f -)"
    );
}
