//! `just bench-reboot`: a coordinated reboot wave on the local control plane
//! with simulated machines (tests/support/machines.rs). A benchmark, not a
//! test: it prints a table and asserts nothing about time.
//!
//! Set-up: 20 kwok nodes, a node agent on each and one cluster role (the
//! binary in `NODEKEEPER_BIN`, else the one cargo built), all as the audited
//! bench identity. A simulated reboot keeps the machine down for each of
//! [`DOWNS`] in turn (a row each). Measured, from what a watch of the nodes
//! and NodeMaintenances shows:
//! - one node's cycle: a policy over one node needing a reboot, from the
//!   policy's creation until the node is back (new boot, uncordoned, its
//!   NodeMaintenance gone); the median of [`SINGLE_RUNS`] nodes;
//! - the wave: all 20 nodes, `maxUnavailable: 4`, from the policy's
//!   creation until the last node is back; its ratio to the ideal
//!   `ceil(20/4) × one node's cycle` (target ≤ 1.05);
//! - admission latency: from a node coming back (its slot free) to the
//!   next NodeMaintenance created, p50 and p95 (target ≤ 200 ms);
//! - API requests per node reboot (the agents' and cluster role's, from
//!   the API server's audit log, which records only the bench identity);
//! - the wave's critical path: the chain of reboots its end waited for,
//!   each node's cycle on it and the admission gaps between them, so the
//!   wave's excess over the ideal splits into nodes rebooting side by side
//!   being slower than one alone and admission;
//! - peak RSS of a node agent and of the cluster role (after both rows).

#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::reboot::{RebootPolicy, RebootPolicySpec};
use serde_json::json;
use smol::stream::StreamExt;
use support::machines::{Fleet, annotate, nodes, unavailable};
use support::{Agent, GROUP_LABEL, TestEnv, audit_ids_since, block_on, install_crds, rss_kib};

const NODES: usize = 20;
const BUDGET: usize = 4;
/// Simulated reboot lengths, one row each: a short one shows the fixed
/// costs, a longer one a reboot closer to real machines (which take 30 s to
/// minutes).
const DOWNS: [Duration; 2] = [Duration::from_secs(3), Duration::from_secs(15)];
const SINGLE_RUNS: usize = 3;

/// What the bench's own watch saw, with the time it saw it.
#[derive(Default)]
struct Seen {
    /// When each NodeMaintenance was first seen, and its node (names
    /// repeat: one per node, created again for each reboot).
    created: Vec<(String, String, Instant)>,
    /// Per node: times it became available again (Ready, uncordoned, no
    /// NodeMaintenance) after being unavailable.
    freed: Vec<(String, Instant)>,
    down: BTreeSet<String>,
    nms: BTreeMap<String, String>,
    nodes: BTreeMap<String, bool>,
}

impl Seen {
    fn update(&mut self, at: Instant) {
        for (n, unavailable) in &self.nodes {
            let held = *unavailable || self.nms.values().any(|m| m == n);
            if held {
                self.down.insert(n.clone());
            } else if self.down.remove(n) {
                self.freed.push((n.clone(), at));
            }
        }
    }
}

/// Watch the group's nodes and every NodeMaintenance into `seen`.
fn observe(client: Client, group: String, seen: Arc<Mutex<Seen>>) {
    std::thread::spawn(move || {
        block_on(async move {
            let cfg =
                || watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
            let nodes = watcher(
                Api::<Node>::all(client.clone()),
                cfg().labels(&format!("{GROUP_LABEL}={group}")),
            )
            .filter_map(|e| match e.ok()? {
                watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                    Some((true, n.name_any(), Some(unavailable(&n).to_string())))
                }
                _ => None,
            });
            let nms = watcher(Api::<NodeMaintenance>::all(client), cfg()).filter_map(|e| {
                match e.ok()? {
                    watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                        Some((false, m.name_any(), Some(m.spec.node_name.clone())))
                    }
                    watcher::Event::Delete(m) => Some((false, m.name_any(), None)),
                    _ => None,
                }
            });
            let mut changes = std::pin::pin!(smol::stream::or(nodes, nms));
            while let Some((is_node, name, value)) = changes.next().await {
                let at = Instant::now();
                let mut s = seen.lock().unwrap();
                match (is_node, value) {
                    (true, Some(v)) => {
                        s.nodes.insert(name, v == "true");
                    }
                    (false, Some(node)) => {
                        if !s.nms.contains_key(&name) {
                            s.created.push((name.clone(), node.clone(), at));
                        }
                        s.nms.insert(name, node);
                    }
                    (false, None) => {
                        s.nms.remove(&name);
                    }
                    _ => {}
                }
                s.update(at);
            }
        })
    });
}

async fn policy(env: &TestEnv, fleet: &Fleet, name: &str, labels: serde_json::Value) -> Instant {
    let spec: RebootPolicySpec = serde_json::from_value(json!({
        "nodeSelector": {"matchLabels": labels},
        "budget": {"maxUnavailable": BUDGET},
        "reboot": {"command": fleet.reboot_command()},
        "detect": {"sentinelFile": ""},
    }))
    .expect("a policy spec");
    let start = Instant::now();
    Api::<RebootPolicy>::all(env.client.clone())
        .create(&PostParams::default(), &RebootPolicy::new(name, spec))
        .await
        .expect("creating a RebootPolicy");
    start
}

/// One row of the table: figures for one reboot length.
struct Row {
    down: Duration,
    cycle: Duration,
    /// One node's cycle alone from its NodeMaintenance's creation.
    nm_cycle: Duration,
    wave: Duration,
    latencies: Vec<f64>,
    requests: usize,
    path: CriticalPath,
}

/// The chain of reboots the wave's end waited for: from the last node
/// back, each node's NodeMaintenance, and the node whose return freed the
/// slot it took. The wave is `first + Σ cycles + Σ gaps`: what it exceeds
/// the ideal by is either cycles slower than one node's alone (nodes
/// rebooting side by side) or admission gaps.
#[derive(Default)]
struct CriticalPath {
    /// From the policy's creation to the chain's first NodeMaintenance.
    first: Duration,
    /// Each node's NodeMaintenance created → node back, in wave order.
    cycles: Vec<Duration>,
    /// A slot freed → the next NodeMaintenance created on the chain.
    gaps: Vec<Duration>,
}

fn critical_path(s: &Seen, start: Instant, end: Instant) -> CriticalPath {
    let mut path = CriticalPath::default();
    let Some((mut node, mut back)) = s
        .freed
        .iter()
        .find(|(_, t)| *t == end)
        .map(|(n, t)| (n.clone(), *t))
    else {
        return path;
    };
    // This node's NodeMaintenance of the wave, the last before it came back.
    while let Some(created) = s
        .created
        .iter()
        .filter(|(_, n, t)| *n == node && *t > start && *t < back)
        .map(|(_, _, t)| *t)
        .max()
    {
        path.cycles.push(back - created);
        // The slot it took: the latest return before its admission.
        match s
            .freed
            .iter()
            .filter(|(_, t)| *t > start && *t <= created)
            .max_by_key(|(_, t)| *t)
        {
            Some((n, t)) => {
                path.gaps.push(created - *t);
                (node, back) = (n.clone(), *t);
            }
            None => {
                path.first = created - start;
                break;
            }
        }
    }
    path.cycles.reverse();
    path.gaps.reverse();
    path
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
        let mut env = TestEnv::new("bench-rb").await;
        let names = nodes(&mut env, NODES).await;
        (env, names)
    });
    let fleet = Fleet::new_with(
        env.client.clone(),
        Some(&["--metrics-address", "off"]),
        DOWNS[0],
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
    let seen = Arc::new(Mutex::new(Seen::default()));
    observe(env.client.clone(), env.id.clone(), seen.clone());
    let back = |n: &str, after: Instant| {
        seen.lock()
            .unwrap()
            .freed
            .iter()
            .find(|(m, t)| m == n && *t > after)
            .map(|(_, t)| *t)
    };

    let downs: Vec<Duration> = match std::env::var("NODEKEEPER_BENCH_DOWNS") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .map(Duration::from_secs)
            .collect(),
        Err(_) => DOWNS.to_vec(),
    };
    let mut rows = Vec::new();
    for (round, down) in downs.into_iter().enumerate() {
        *fleet.down.lock().unwrap() = down;
        // One node's cycle, alone.
        let (mut cycles, mut nm_cycles) = (Vec::new(), Vec::new());
        for (i, n) in names.iter().take(SINGLE_RUNS).enumerate() {
            block_on(annotate(
                &env.client,
                n,
                "nodekeeper.io/reboot-needed",
                Some("now"),
            ));
            let name = format!("{}-single-{round}-{i}", env.id);
            let start = block_on(policy(
                &env,
                &fleet,
                &name,
                json!({GROUP_LABEL: env.id, "kubernetes.io/hostname": n}),
            ));
            let one = [n.clone()];
            fleet.serve(&one, Duration::from_secs(300), || back(n, start).is_some());
            let returned = back(n, start).unwrap_or(start);
            cycles.push(returned - start);
            let created = seen
                .lock()
                .unwrap()
                .created
                .iter()
                .filter(|(_, m, t)| m == n && *t > start)
                .map(|(_, _, t)| *t)
                .min()
                .unwrap_or(start);
            nm_cycles.push(returned.saturating_duration_since(created));
            delete_policy(&env, &name);
        }
        cycles.sort();
        nm_cycles.sort();
        let cycle = cycles[cycles.len() / 2];
        let nm_cycle = nm_cycles[nm_cycles.len() / 2];

        // The wave.
        block_on(async {
            for n in &names {
                annotate(&env.client, n, "nodekeeper.io/reboot-needed", Some("now")).await;
            }
        });
        let audit_start = support::audit_offset_of(&audit_log);
        let name = format!("{}-wave-{round}", env.id);
        let start = block_on(policy(&env, &fleet, &name, json!({GROUP_LABEL: env.id})));
        fleet.serve(&names, Duration::from_secs(900), || {
            names.iter().all(|n| back(n, start).is_some())
        });
        let end = names
            .iter()
            .filter_map(|n| back(n, start))
            .max()
            .unwrap_or(start);
        let requests = audit_ids_since(&audit_log, audit_start);
        if std::env::var("NODEKEEPER_BENCH_DEBUG").is_ok() {
            let s = seen.lock().unwrap();
            for (n, t) in s.freed.iter().filter(|(_, t)| *t > start) {
                eprintln!("freed {n} at +{:.2} s", (*t - start).as_secs_f64());
            }
            for (m, _, t) in s.created.iter().filter(|(_, _, t)| *t > start) {
                eprintln!("created {m} at +{:.2} s", (*t - start).as_secs_f64());
            }
        }
        delete_policy(&env, &name);

        // Admission latency: each NodeMaintenance created after the first
        // BUDGET of the wave, from the latest slot freed before it.
        let s = seen.lock().unwrap();
        let mut created: Vec<Instant> = s
            .created
            .iter()
            .map(|(_, _, t)| *t)
            .filter(|t| *t > start)
            .collect();
        created.sort();
        let path = critical_path(&s, start, end);
        let mut latencies: Vec<f64> = created
            .iter()
            .skip(BUDGET)
            .filter_map(|c| {
                s.freed
                    .iter()
                    .map(|(_, t)| *t)
                    .filter(|t| *t > start && t <= c)
                    .max()
                    .map(|f| (*c - f).as_secs_f64() * 1e3)
            })
            .collect();
        latencies.sort_by(|a, b| a.total_cmp(b));
        rows.push(Row {
            down,
            cycle,
            nm_cycle,
            wave: end - start,
            latencies,
            requests,
            path,
        });
    }
    let node_rss = names
        .iter()
        .filter_map(|n| fleet.agent_pid(n))
        .map(|p| rss_kib(p, "VmHWM"))
        .max()
        .unwrap_or(0);
    let cluster_rss = rss_kib(cluster.child.id(), "VmHWM");
    print_table(&rows, &bin, node_rss, cluster_rss);
    drop(cluster);
    drop(env);
}

fn delete_policy(env: &TestEnv, name: &str) {
    block_on(async {
        let _ = Api::<RebootPolicy>::all(env.client.clone())
            .delete(name, &DeleteParams::default())
            .await;
    });
}

fn print_table(rows: &[Row], bin: &std::path::Path, node_rss: u64, cluster_rss: u64) {
    let rounds = NODES.div_ceil(BUDGET) as u32;
    println!();
    println!(
        "reboot benchmark: {NODES} nodes, maxUnavailable {BUDGET}, one row per simulated reboot length"
    );
    println!("binary: {}", bin.display());
    println!(
        "targets: wave ≤ 1.05 × ideal ({rounds} × one node's cycle), admission latency ≤ 200 ms"
    );
    println!(
        "| down | one node's cycle | ideal wave | wave     | wave ÷ ideal | admission p50 | p95      | requests/reboot |"
    );
    println!(
        "|------|------------------|------------|----------|--------------|---------------|----------|-----------------|"
    );
    for r in rows {
        let pct = |p: f64| {
            r.latencies
                .get(((r.latencies.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let ideal = r.cycle * rounds;
        println!(
            "| {:>3} s | {:>14.2} s | {:>8.2} s | {:>6.2} s | {:>12.3} | {:>10.1} ms | {:>5.1} ms | {:>15.1} |",
            r.down.as_secs(),
            r.cycle.as_secs_f64(),
            ideal.as_secs_f64(),
            r.wave.as_secs_f64(),
            r.wave.as_secs_f64() / ideal.as_secs_f64(),
            pct(0.5),
            pct(0.95),
            r.requests as f64 / NODES as f64,
        );
    }
    println!();
    println!(
        "the wave's critical path (the chain of reboots its end waited for; wave = first admission + cycles + gaps):"
    );
    println!(
        "| down | first admission | cycles on the path | Σ cycles − {rounds} × one node's alone | gaps on the path (Σ) |"
    );
    println!(
        "|------|-----------------|--------------------|-------------------|----------------------|"
    );
    for r in rows {
        let p = &r.path;
        let secs = |v: &[Duration]| {
            v.iter()
                .map(|d| format!("{:.2}", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let cycles: Duration = p.cycles.iter().sum();
        let gaps: Duration = p.gaps.iter().sum();
        println!(
            "| {:>3} s | {:>13.0} ms | {} s | {:+.2} s | {} s ({:.2} s) |",
            r.down.as_secs(),
            p.first.as_secs_f64() * 1e3,
            secs(&p.cycles),
            cycles.as_secs_f64() - (r.nm_cycle * rounds).as_secs_f64(),
            secs(&p.gaps),
            gaps.as_secs_f64(),
        );
    }
    println!(
        "peak RSS: node agent {:.1} MiB, cluster role {:.1} MiB",
        node_rss as f64 / 1024.0,
        cluster_rss as f64 / 1024.0
    );
}
