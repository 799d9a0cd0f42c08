//! `just bench-replace`: rolling node replacement (a NodeVersion image
//! change) over 10 kwok nodes behind the simulated cloud
//! (tests/kwok-provider) with a fixed join delay. A benchmark, not a test:
//! it prints a table and asserts nothing about time.
//!
//! Measured, by polling the NodeVersion (100 ms steps) and the audit log:
//! - one node's cycle: a cluster of one node, from the image change until
//!   the NodeVersion reports every node new and up to date; the median of
//!   [`SINGLE_RUNS`];
//! - the rollout over 10 nodes with maxSurge 1 and 3, and its ratio to the
//!   ideal `ceil(10 / surge) × cycle`;
//! - API requests per replaced node (audit log, the bench identity only:
//!   the provider's own kubectl is not counted) and the role's peak RSS.

#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use nodekeeper::api::constellation::Kind;
use serde_json::{Value, json};
use support::replace::{Cloud, clean_up, install_constellation_crds, wait_nv};
use support::{
    Agent, GROUP_LABEL, TestEnv, audit_ids_since, block_on, install_crds, kubectl, rss_kib,
};

const NODES: usize = 10;
const JOIN: f64 = 2.0;
const SINGLE_RUNS: usize = 3;

fn apply(obj: Value) {
    let out = kubectl(&["apply", "-f", "-"], Some(&obj.to_string()));
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn patch_nv(client: &Client, name: &str, spec: Value) {
    let api: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &Kind::NodeVersion.resource());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .expect("patching the NodeVersion");
}

/// Change the image; the time until every one of `total` nodes is new.
async fn roll(client: &Client, nv: &str, image: &str, total: usize, spec: Value) -> Duration {
    let before: Vec<Value> = wait_nv(client, nv, "status", Duration::from_secs(30), |v| {
        v["status"]["upToDate"].is_array()
    })
    .await["status"]["upToDate"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut spec = spec;
    spec["image"] = json!(image);
    let start = Instant::now();
    patch_nv(client, nv, spec).await;
    wait_nv(client, nv, "the rollout", Duration::from_secs(600), |v| {
        let c = &v["status"]["conditions"][0];
        c["status"] == "False"
            && v["status"]["upToDate"].as_array().is_some_and(|a| {
                a.len() == total
                    && a.iter()
                        .all(|n| !before.iter().any(|b| b["name"] == n["name"]))
            })
    })
    .await;
    start.elapsed()
}

fn main() {
    let bin = std::env::var("NODEKEEPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")));
    let kubeconfig = support::cluster().to_path_buf();
    let bench_kc = kubeconfig.with_file_name("kubeconfig-bench");
    let audit_log = kubeconfig.with_file_name("logs").join("audit.log");
    install_crds();
    install_constellation_crds();
    let env = block_on(TestEnv::new("bench-rp"));
    let group = format!("{}-workers", env.id);
    let cloud = Cloud::new(
        &env,
        json!([{ "groupId": group, "name": group, "role": "Worker", "image": "img-1" }]),
        JOIN,
    );
    apply(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "ScalingGroup",
        "metadata": { "name": group, "labels": { GROUP_LABEL: env.id } },
        "spec": { "nodeImage": env.id, "groupId": group, "nodeGroupName": group, "role": "Worker" }
    }));
    apply(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "NodeVersion",
        "metadata": { "name": env.id, "labels": { GROUP_LABEL: env.id } },
        "spec": { "image": "img-1", "nodeSelector": { "matchLabels": { GROUP_LABEL: env.id } } }
    }));
    block_on(cloud.boot(&env, &group, 1));
    let cmd = cloud.command.display().to_string();
    let sel = format!("{GROUP_LABEL}={}", env.id);
    // NODEKEEPER_BENCH_LOG: the role's log filter (e.g. nodekeeper=debug
    // for a timeline of the rounds; the log's path is printed at the end).
    let filter = std::env::var("NODEKEEPER_BENCH_LOG").unwrap_or_else(|_| "nodekeeper=warn".into());
    let agent = Agent::start_with(
        &bin,
        &bench_kc,
        &filter,
        &[
            "run",
            "--all-nodes",
            "--node-selector",
            &sel,
            "--leader-namespace",
            &env.ns,
            "--metrics-address",
            "off",
            "--provider-command",
            &cmd,
        ],
    );
    let client = env.client.clone();

    // One node's cycle, alone.
    let mut cycles: Vec<Duration> = (0..SINGLE_RUNS)
        .map(|i| {
            block_on(roll(
                &client,
                &env.id,
                &format!("img-single-{i}"),
                1,
                json!({ "maxSurge": 1 }),
            ))
        })
        .collect();
    cycles.sort();
    let cycle = cycles[cycles.len() / 2];

    // Ten nodes, on the group's current image.
    block_on(async {
        cloud.boot(&env, &group, NODES - 1).await;
        wait_nv(
            &client,
            &env.id,
            "ten nodes up to date",
            Duration::from_secs(120),
            |v| v["status"]["upToDate"].as_array().map(|a| a.len()) == Some(NODES),
        )
        .await;
    });
    let mut rows = Vec::new();
    for surge in [1usize, 3] {
        let audit_start = support::audit_offset_of(&audit_log);
        let took = block_on(roll(
            &client,
            &env.id,
            &format!("img-surge-{surge}"),
            NODES,
            json!({ "maxSurge": surge }),
        ));
        let requests = audit_ids_since(&audit_log, audit_start);
        let ideal = cycle * NODES.div_ceil(surge) as u32;
        rows.push((surge, ideal, took, requests));
    }
    let rss = rss_kib(agent.child.id(), "VmHWM");
    // nodekeeper's own create-node calls: the bench's boots of the
    // initial nodes ask too (request ids `init-…`), and are not counted.
    let creates = cloud
        .calls_of("create-node")
        .iter()
        .filter(|r| {
            !r["requestId"]
                .as_str()
                .is_some_and(|id| id.starts_with("init-"))
        })
        .count();
    let replaced = SINGLE_RUNS + 2 * NODES;

    println!();
    println!(
        "replacement benchmark: {NODES} nodes in one scaling group, join delay {JOIN} s (simulated cloud)"
    );
    println!("binary: {}", bin.display());
    println!(
        "one node's cycle (image change → new node joined, old drained and deleted, status up to date): {:.2} s (median of {SINGLE_RUNS}: {:?})",
        cycle.as_secs_f64(),
        cycles
            .iter()
            .map(|c| format!("{:.2}", c.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    println!("target: rollout ≤ 1.05 × ideal (ceil(nodes / surge) × one node's cycle)");
    println!("| maxSurge | ideal    | rollout  | rollout ÷ ideal | requests/replaced node |");
    println!("|----------|----------|----------|-----------------|------------------------|");
    for (surge, ideal, took, requests) in rows {
        println!(
            "| {surge:>8} | {:>6.2} s | {:>6.2} s | {:>15.3} | {:>22.1} |",
            ideal.as_secs_f64(),
            took.as_secs_f64(),
            took.as_secs_f64() / ideal.as_secs_f64(),
            requests as f64 / NODES as f64
        );
    }
    println!(
        "peak RSS of the cluster role: {:.1} MiB; provider create-node calls: {creates} for {replaced} replaced nodes",
        rss as f64 / 1024.0
    );
    println!("cluster role's log: {}", agent.log.display());
    drop(agent);
    block_on(clean_up(&client, &env));
    drop(cloud);
    drop(env);
}
