//! `nodekeeper run` as a process against the real control plane: it connects,
//! sees its node, stops cleanly on SIGTERM, and turns bad configuration into
//! one clear line and a non-zero exit.

use crate::support;

use std::time::Duration;

use support::{Agent, TestEnv, block_on, free_port, http_get, run_cli, wait_for};

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

/// Two agents for one node (a DaemonSet beside a static pod, say) each
/// drain and reboot it on their own: the one that was there first sees the
/// other's claim on the node and says so in its log and one Event naming
/// the other; the newer one, which cannot tell a live claim from a dead
/// one, says nothing.
#[test]
fn a_second_agent_for_the_same_node_is_reported_by_the_first() {
    use k8s_openapi::api::core::v1::{Event, Node};
    use kube::{Api, ResourceExt, api::ListParams};
    support::install_crds();
    let mut env = block_on(TestEnv::new("twoagents"));
    let node = block_on(env.add_node("a"));
    let nodes: Api<Node> = Api::all(env.client.clone());
    let claim = || async {
        let n = nodes.get(&node).await.ok()?;
        n.annotations().get("nodekeeper.io/agent").cloned()
    };
    let first = Agent::start(&["run", "--node", &node]);
    let first_pid = format!("pid {},", first.child.id());
    block_on(wait_for(
        "the first agent's claim",
        Duration::from_secs(30),
        || async { claim().await.filter(|c| c.contains(&first_pid)) },
    ));
    let second = Agent::start(&["run", "--node", &node]);
    let second_pid = format!("pid {},", second.child.id());
    let events: Api<Event> = Api::all(env.client.clone());
    let lp = ListParams::default().fields(&format!("involvedObject.name={node}"));
    let notes = block_on(wait_for(
        "an AnotherAgent event",
        Duration::from_secs(30),
        || async {
            let list = events.list(&lp).await.ok()?;
            let notes: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("AnotherAgent"))
                .filter_map(|e| e.message)
                .collect();
            (!notes.is_empty()).then_some(notes)
        },
    ));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains(&second_pid) && notes[0].contains(&first_pid),
        "the event names both agents: {}",
        notes[0]
    );
    assert!(
        first
            .log_text()
            .contains("another nodekeeper agent runs for this node"),
        "{}",
        first.log_text()
    );
    assert!(
        !second.log_text().contains("another nodekeeper agent"),
        "{}",
        second.log_text()
    );
    assert!(
        block_on(claim()).is_some_and(|c| c.contains(&second_pid)),
        "not claimed back"
    );
}

#[test]
fn run_with_a_bad_kubeconfig_exits_nonzero_with_one_line() {
    let dir = support::scratch().join(format!("nk-badkc-{:x}", support::rand_u64()));
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
    let dir = support::scratch().join(format!("nk-unreach-{:x}", support::rand_u64()));
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
    // Resources this cluster certainly does not serve stand in for our
    // CRDs, which other tests install: one of a group it does not serve,
    // one missing from a group it serves beside one it has (each group
    // version is asked once, as discovery asks). The answers come from the
    // real API server.
    let client = block_on(support::client());
    let resource = |group: &str, version: &str, kind: &str, plural: &str| kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    };
    let wanted = [
        resource("nodekeeper.invalid", "v1", "Absent", "absents"),
        resource("apps", "v1", "Deployment", "deployments"),
        resource("apps", "v1", "Absent", "absents"),
    ];
    let err = block_on(nodekeeper::service::watch::check_served(&client, &wanted))
        .expect_err("must be missing");
    assert_eq!(
        err.to_string(),
        "CRDs not installed: absents.apps, absents.nodekeeper.invalid (install them with: nodekeeper crds | kubectl apply -f -)"
    );
    let served = block_on(nodekeeper::service::watch::check_served(
        &client,
        &wanted[1..2],
    ));
    assert!(served.is_ok(), "{served:?}");
}

/// `--metrics-address` serves liveness, readiness once the watches have
/// listed, and Prometheus text with the reconcile counter moving; a second
/// agent on the same address fails at start-up with one line.
#[test]
fn run_serves_health_readiness_and_metrics() {
    support::install_crds();
    let mut env = block_on(TestEnv::new("metrics"));
    let node = block_on(env.add_node("a"));
    block_on(env.wait_node_ready(&node));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(&["run", "--node", &node, "--metrics-address", &addr]);
    block_on(wait_for(
        "/readyz to answer 200",
        Duration::from_secs(30),
        || async { http_get(port, "/readyz").filter(|(s, _)| s.contains(" 200 ")) },
    ));
    let (status, body) = http_get(port, "/healthz").expect("healthz");
    assert!(
        status.contains(" 200 ") && body == "ok\n",
        "{status} {body}"
    );
    let (status, body) = http_get(port, "/metrics").expect("metrics");
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.contains("nodekeeper_build_info{version=\""), "{body}");
    assert!(body.contains("nodekeeper_ready 1"), "{body}");
    // The node role's caches hold its own node only.
    assert!(
        body.contains("nodekeeper_watched_objects{kind=\"nodes\"} 1\n"),
        "{body}"
    );
    // Cluster-wide gauges come from the leading cluster role only: a sum
    // over a DaemonSet's agents would count each object once per agent.
    assert!(
        !body.contains("nodekeeper_nodemaintenances{"),
        "a node agent exports the cluster-wide gauges: {body}"
    );
    // Every request is counted: its first list of its own node.
    assert!(
        body.contains(
            "nodekeeper_api_requests_total{verb=\"list\",resource=\"nodes\",code=\"200\"}"
        ),
        "{body}"
    );
    // A node with no maintenance (this one has no pods at all) reads no
    // DrainRule: their watch starts at the first drain that needs it.
    assert!(
        !body.contains("resource=\"drainrules\""),
        "DrainRules read with no drain: {body}"
    );
    // Ready means every watch has listed once; the first reconcile runs
    // after that, so the counter is waited for, not read at once (read at
    // once it was 0 in a loaded gate).
    block_on(wait_for(
        "the first reconcile counted in /metrics",
        Duration::from_secs(30),
        || async {
            let (_, body) = http_get(port, "/metrics")?;
            let counted = body
                .lines()
                .find_map(|l| l.strip_prefix("nodekeeper_reconciles_total "))
                .and_then(|v| v.parse::<u64>().ok())?;
            (counted >= 1).then_some(())
        },
    ));
    let (status, _) = http_get(port, "/nope").expect("404");
    assert!(status.contains(" 404 "), "{status}");

    let (status, _out, err) = run_cli(
        &["run", "--node", &node, "--metrics-address", &addr],
        &[("KUBECONFIG", &support::cluster().to_string_lossy())],
    );
    assert!(!status.success());
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].starts_with(&format!(
            "nodekeeper: error: binding the metrics address {addr}"
        )),
        "{err}"
    );

    agent.signal("TERM");
    assert!(agent.wait_exit(Duration::from_secs(15)).success());
}

/// Busy loops on every core until dropped: the start-up hang needed a busy
/// machine to show.
struct CpuLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuLoad {
    fn start() -> CpuLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x: u64 = 1;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        }
                        std::hint::black_box(x);
                    }
                })
            })
            .collect();
        CpuLoad { stop, threads }
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Regression: one agent in ~50 started on a busy machine logged that it
/// owns its node, served /metrics, and never reconciled; SIGTERM then never
/// stopped it. Its readiness task and kube-runtime's controller both waited
/// on the node store's single-waker readiness. Many agents start at once
/// under CPU load, in rounds; every one must reconcile its node, report
/// ready, and exit 0 soon after SIGTERM.
#[test]
fn agents_started_together_under_cpu_load_all_reconcile_and_stop_on_sigterm() {
    const ROUNDS: usize = 3;
    const AGENTS: usize = 10;
    support::install_crds();
    let mut env = block_on(TestEnv::new("stress"));
    let mut nodes = Vec::new();
    for i in 0..AGENTS {
        nodes.push(block_on(env.add_node(&format!("n{i}"))));
    }
    for n in &nodes {
        block_on(env.wait_node_ready(n));
    }
    for round in 0..ROUNDS {
        let load = CpuLoad::start();
        let mut agents: Vec<Agent> = nodes
            .iter()
            .map(|n| Agent::start(&["run", "--node", n]))
            .collect();
        for (n, agent) in nodes.iter().zip(&agents) {
            block_on(wait_for(
                &format!("round {round}: the agent of {n} to reconcile its node"),
                Duration::from_secs(60),
                || async {
                    agent
                        .log_text()
                        .contains(&format!("node {n}: ready=True"))
                        .then_some(())
                },
            ));
        }
        drop(load);
        for agent in &agents {
            agent.signal("TERM");
        }
        for (n, agent) in nodes.iter().zip(agents.iter_mut()) {
            let status = agent.wait_exit(Duration::from_secs(20));
            assert!(
                status.success(),
                "round {round}: the agent of {n} exited with {status}; log:\n{}",
                agent.log_text()
            );
        }
    }
}

/// `--log-format json`: every line the agent writes is one JSON object with
/// time, level, target and message, and lines about a node or an object
/// carry it as a field (what a log pipeline indexes by).
#[test]
fn json_logs_are_one_object_per_line_with_the_node_and_object_as_fields() {
    use kube::Api;
    use kube::api::PostParams;
    use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec};
    support::install_crds();
    let mut env = block_on(TestEnv::new("jsonlog"));
    let node = block_on(env.add_node("a"));
    block_on(env.wait_node_ready(&node));
    let agent = Agent::start(&["run", "--node", &node, "--log-format", "json"]);
    let nm = NodeMaintenance::new(
        &format!("{}-json", env.id),
        NodeMaintenanceSpec {
            node_name: node.clone(),
            reason: Some("json logs".into()),
        },
    );
    block_on(async {
        Api::<NodeMaintenance>::all(env.client.clone())
            .create(&PostParams::default(), &nm)
            .await
            .expect("creating the NodeMaintenance");
    });
    let object = format!("NodeMaintenance/{}-json", env.id);
    let lines = block_on(wait_for(
        "JSON lines about the node and the maintenance",
        Duration::from_secs(60),
        || async {
            // Whole lines only: the agent may be writing the last one as
            // it is read (a read once ended inside `{"leve`).
            let text = agent.log_text();
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            let lines: Vec<serde_json::Value> = whole
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    serde_json::from_str(l)
                        .unwrap_or_else(|e| panic!("not one JSON object: {l:?}: {e}"))
                })
                .collect();
            let about_node = lines.iter().any(|l| l["node"] == node.as_str());
            let about_nm = lines.iter().any(|l| l["object"] == object.as_str());
            (about_node && about_nm).then_some(lines)
        },
    ));
    for l in &lines {
        for key in ["time", "level", "target", "message"] {
            assert!(l[key].is_string(), "{key} missing in {l}");
        }
    }
}
