//! Coordinated reboots on the real control plane, with simulated machines
//! (tests/support/machines.rs): the harness performs each reboot the policy
//! asks for, and an independent watcher records how many nodes were
//! unavailable at every change.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::reboot::{RebootPolicy, RebootPolicySpec};
use serde_json::json;
use support::machines::{Fleet, Watcher, boot_of, set_boot};
use support::{Agent, GROUP_LABEL, TestEnv, block_on, install_crds};

/// A policy over the test's nodes: `spec` is merged over the selector and
/// the fleet's reboot command.
async fn create_policy(env: &TestEnv, fleet: &Fleet, spec: serde_json::Value) -> String {
    let mut full = json!({
        "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
        "reboot": {"command": fleet.reboot_command(), "remoteCommand": fleet.reboot_command()},
        "detect": {"periodSeconds": 5},
    });
    merge(&mut full, spec);
    let spec: RebootPolicySpec = serde_json::from_value(full).expect("a policy spec");
    let p = RebootPolicy::new(&env.id, spec);
    Api::<RebootPolicy>::all(env.client.clone())
        .create(&PostParams::default(), &p)
        .await
        .expect("creating the RebootPolicy");
    env.id.clone()
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// `count` Ready nodes with boot IDs `boot-0-<node>`.
async fn nodes(env: &mut TestEnv, count: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..count {
        names.push(env.add_node(&format!("n{i:02}")).await);
    }
    for n in &names {
        env.wait_node_ready(n).await;
        set_boot(&env.client, n, &format!("boot-0-{n}")).await;
    }
    names
}

/// Every node of the group rebooted, schedulable, free of maintenance.
async fn settled(client: &Client, names: &[String]) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    for n in names {
        let Ok(node) = nodes.get(n).await else {
            return false;
        };
        if node.spec.and_then(|s| s.unschedulable) == Some(true)
            || boot_of(client, n).await.starts_with("boot-0-")
        {
            return false;
        }
    }
    let nms = Api::<NodeMaintenance>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    !nms.iter().any(|m| names.contains(&m.spec.node_name))
}

fn cluster_role(env: &TestEnv, extra: &[&str]) -> Agent {
    let selector = format!("{GROUP_LABEL}={}", env.id);
    let mut args = vec![
        "run",
        "--all-nodes",
        "--node-selector",
        &selector,
        "--leader-namespace",
        &env.ns,
    ];
    args.extend(extra);
    Agent::start(&args)
}

#[test]
fn a_wave_of_twelve_never_exceeds_the_budget_and_reboots_each_node_once() {
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("rb-wave").await;
        let names = nodes(&mut env, 12).await;
        let fleet = Fleet::new(env.client.clone(), Some(&["--metrics-address", "off"]));
        for n in &names {
            fleet.require_reboot(n);
        }
        (env, names, fleet)
    });
    let watcher = Watcher::start(env.client.clone(), &env.id);
    block_on(create_policy(
        &env,
        &fleet,
        json!({"budget": {"maxUnavailable": 3}}),
    ));
    for n in &names {
        fleet.start_agent(n);
    }
    let cluster = cluster_role(&env, &["--node-agents"]);
    fleet.serve(&names, Duration::from_secs(180), || {
        block_on(settled(&env.client, &names))
    });
    let history = watcher.finish();
    let peak = history.iter().map(|h| h.0).max().unwrap_or(0);
    assert!(
        peak <= 3,
        "more than 3 nodes unavailable at once: {:?}\ncluster role log:\n{}",
        history.iter().filter(|h| h.0 > 3).collect::<Vec<_>>(),
        cluster.log_text()
    );
    assert!(
        peak >= 2,
        "the wave never ran nodes in parallel: {history:?}"
    );
    block_on(async {
        let nodes: Api<Node> = Api::all(env.client.clone());
        for n in &names {
            assert_eq!(
                fleet.commands(n),
                1,
                "node {n}: the reboot command ran once"
            );
            assert_eq!(boot_of(&env.client, n).await, format!("boot-1-{n}"));
            // The need marker is cleared: nothing asks for a second round.
            let node = nodes.get(n).await.expect("node");
            let ann = node.metadata.annotations.unwrap_or_default();
            assert!(
                !ann.contains_key("nodekeeper.io/reboot-needed"),
                "{n}: {ann:?}"
            );
        }
    });
    drop(cluster);
}
