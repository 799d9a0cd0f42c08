//! `just bench-upgrade`: an UpgradePlan over 10 simulated hosts in two
//! groups on the local control plane (tests/support/upgrades.rs). A
//! benchmark, not a test: it prints a table and asserts nothing about time.
//!
//! Set-up: 10 kwok nodes (groups `a` and `b`, five each), a node agent on
//! each and one cluster role (the binary in `NODEKEEPER_BIN`, else the one
//! cargo built), all as the audited bench identity; `maxUnavailable: 2`;
//! one before hook whose pod is held for [`HOOK`] (a scheduling gate the
//! bench removes: kwok would complete it at once); an upgrade that takes
//! [`UPGRADE`] (the harness reports the version that long after the
//! command ran). Measured, from the bench's own watch of NodeMaintenances:
//! - one node's cycle: a plan over one node, from its creation until the
//!   node is given back (its NodeMaintenance deleted); the median of
//!   [`SINGLE_RUNS`];
//! - the plan over all 10: from creation until the last node is given
//!   back, and its ratio to the ideal `(ceil(5/2) + ceil(5/2)) × cycle`;
//! - per-node overhead: the cycle beyond hook + upgrade time;
//! - API requests per node (audit log, bench identity only).

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::upgrade::{UpgradePlan, UpgradePlanSpec};
use serde_json::json;
use smol::stream::StreamExt;
use support::machines::Fleet;
use support::upgrades::{Timeline, VERSION_LABEL, command, nodes, serve_taking};
use support::{Agent, GROUP_LABEL, TestEnv, audit_ids_since, block_on, install_crds, rss_kib};

const NODES: usize = 10;
const BUDGET: usize = 2;
const HOOK: Duration = Duration::from_secs(2);
const UPGRADE: Duration = Duration::from_secs(3);
const SINGLE_RUNS: usize = 3;
const GATE: &str = "nodekeeper.test/bench-hold";

/// NodeMaintenances given back (deleted), with when the watch saw it.
type GivenBack = Arc<Mutex<Vec<(String, Instant)>>>;

fn watch_give_backs(client: Client) -> GivenBack {
    let seen: GivenBack = Arc::default();
    let s2 = seen.clone();
    std::thread::spawn(move || {
        block_on(async move {
            let cfg = watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
            let mut nms = std::pin::pin!(watcher(Api::<NodeMaintenance>::all(client), cfg));
            while let Some(ev) = nms.next().await {
                if let Ok(watcher::Event::Delete(m)) = ev {
                    s2.lock()
                        .unwrap()
                        .push((m.spec.node_name.clone(), Instant::now()));
                }
            }
        })
    });
    seen
}

/// Hold each hook pod for [`HOOK`], then lift its scheduling gate.
fn release_hooks(client: Client, ns: String) {
    std::thread::spawn(move || {
        let mut first_seen: BTreeMap<String, Instant> = BTreeMap::new();
        loop {
            block_on(async {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let list = pods
                    .list(&Default::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                for p in list {
                    let gated = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.scheduling_gates.as_ref())
                        .is_some_and(|g| !g.is_empty());
                    if !gated {
                        continue;
                    }
                    let at = *first_seen.entry(p.name_any()).or_insert_with(Instant::now);
                    if at.elapsed() >= HOOK {
                        let _ = pods
                            .patch(
                                &p.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
                            )
                            .await;
                    }
                }
            });
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

async fn plan(
    env: &TestEnv,
    fleet: &Fleet,
    name: &str,
    version: &str,
    labels: serde_json::Value,
) -> Instant {
    let spec: UpgradePlanSpec = serde_json::from_value(json!({
        "nodeSelector": {"matchLabels": labels},
        "version": version,
        "versionFrom": {"source": "Label", "key": VERSION_LABEL},
        "strategy": {"command": command(fleet)},
        "groups": [
            {"name": "a", "nodeSelector": {"matchLabels": {"bench-group": "a"}}},
            {"name": "b", "nodeSelector": {"matchLabels": {"bench-group": "b"}}}
        ],
        "budget": {"maxUnavailable": BUDGET},
        "hooks": {"before": [{"name": "hold", "namespace": env.ns, "job": {"template": {"spec": {
            "restartPolicy": "Never",
            "schedulingGates": [{"name": GATE}],
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "hook", "image": "registry.invalid/hook:1"}]}}}}]},
    }))
    .expect("a plan spec");
    let start = Instant::now();
    Api::<UpgradePlan>::all(env.client.clone())
        .create(&PostParams::default(), &UpgradePlan::new(name, spec))
        .await
        .expect("creating an UpgradePlan");
    start
}

fn main() {
    let bin = std::env::var("NODEKEEPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")));
    let kubeconfig = support::cluster().to_path_buf();
    let bench_kc = kubeconfig.with_file_name("kubeconfig-bench");
    let audit_log = kubeconfig.with_file_name("logs").join("audit.log");
    install_crds();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("bench-up").await;
        let names = nodes(&mut env, NODES, 0).await;
        for (i, n) in names.iter().enumerate() {
            let g = if i < NODES / 2 { "a" } else { "b" };
            Api::<Node>::all(env.client.clone())
                .patch(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"bench-group": g}}})),
                )
                .await
                .expect("labelling a node");
        }
        (env, names)
    });
    let fleet = Fleet::new_with(
        env.client.clone(),
        Some(&["--metrics-address", "off"]),
        Duration::ZERO,
        Some((bin.clone(), bench_kc.clone(), "nodekeeper=warn".into())),
    );
    for n in &names {
        fleet.start_agent(n);
    }
    let group = format!("{GROUP_LABEL}={}", env.id);
    let cluster = Agent::start_with(
        &bin,
        &bench_kc,
        "nodekeeper=warn",
        &[
            "run",
            "--all-nodes",
            "--node-agents",
            "--node-selector",
            &group,
            "--leader-namespace",
            &env.ns,
            "--metrics-address",
            "off",
        ],
    );
    let given_back = watch_give_backs(env.client.clone());
    release_hooks(env.client.clone(), env.ns.clone());
    let timeline = Timeline::start(env.client.clone(), &env.id, "-");
    let back = |n: &str, after: Instant| {
        given_back
            .lock()
            .unwrap()
            .iter()
            .find(|(m, t)| m == n && *t > after)
            .map(|(_, t)| *t)
    };

    // One node's cycle, alone.
    let mut cycles = Vec::new();
    for (i, n) in names.iter().take(SINGLE_RUNS).enumerate() {
        let name = format!("{}-single-{i}", env.id);
        let start = block_on(plan(
            &env,
            &fleet,
            &name,
            &format!("s{i}"),
            json!({GROUP_LABEL: env.id, "kubernetes.io/hostname": n}),
        ));
        let one = [n.clone()];
        serve_taking(
            &fleet,
            &timeline,
            &one,
            Duration::from_secs(120),
            UPGRADE,
            || back(n, start).is_some(),
        );
        cycles.push(back(n, start).map(|t| t - start).unwrap_or_default());
        // One plan per node at a time: a node two plans select is the
        // older plan's, so this one must go before the next.
        block_on(async {
            let _ = Api::<UpgradePlan>::all(env.client.clone())
                .delete(&name, &Default::default())
                .await;
        });
    }
    cycles.sort();
    let cycle = cycles[cycles.len() / 2];

    // The plan over all ten.
    let audit_start = support::audit_offset_of(&audit_log);
    let name = format!("{}-all", env.id);
    let start = block_on(plan(
        &env,
        &fleet,
        &name,
        "v9",
        json!({GROUP_LABEL: env.id}),
    ));
    serve_taking(
        &fleet,
        &timeline,
        &names,
        Duration::from_secs(600),
        UPGRADE,
        || names.iter().all(|n| back(n, start).is_some()),
    );
    let end = names
        .iter()
        .filter_map(|n| back(n, start))
        .max()
        .unwrap_or(start);
    let requests = audit_ids_since(&audit_log, audit_start);
    let node_rss = names
        .iter()
        .filter_map(|n| fleet.agent_pid(n))
        .map(|p| rss_kib(p, "VmHWM"))
        .max()
        .unwrap_or(0);
    let cluster_rss = rss_kib(cluster.child.id(), "VmHWM");

    let rounds = (NODES / 2).div_ceil(BUDGET) * 2;
    let ideal = cycle * rounds as u32;
    let wave = end - start;
    println!();
    println!(
        "upgrade benchmark: {NODES} nodes in 2 groups, maxUnavailable {BUDGET}, one before hook of {} s, upgrades of {} s",
        HOOK.as_secs(),
        UPGRADE.as_secs()
    );
    println!("binary: {}", bin.display());
    println!("target: plan ≤ 1.05 × ideal ({rounds} × one node's cycle)");
    println!(
        "| one node's cycle | overhead beyond hook + upgrade | ideal plan | plan     | plan ÷ ideal | requests/node |"
    );
    println!(
        "|------------------|--------------------------------|------------|----------|--------------|---------------|"
    );
    println!(
        "| {:>14.2} s | {:>28.2} s | {:>8.2} s | {:>6.2} s | {:>12.3} | {:>13.1} |",
        cycle.as_secs_f64(),
        (cycle.saturating_sub(HOOK + UPGRADE)).as_secs_f64(),
        ideal.as_secs_f64(),
        wave.as_secs_f64(),
        wave.as_secs_f64() / ideal.as_secs_f64(),
        requests as f64 / NODES as f64,
    );
    println!(
        "peak RSS: node agent {:.1} MiB, cluster role {:.1} MiB",
        node_rss as f64 / 1024.0,
        cluster_rss as f64 / 1024.0
    );
    timeline.stop();
    drop(cluster);
    drop(env);
}
