//! `just bench-drain`: how fast a node agent cordons and drains a node of 110
//! evictable pods on the local control plane, how much memory it needs, and
//! how many API requests it makes. A benchmark, not a test: it prints a
//! table and asserts nothing about time.
//!
//! Set-up: two kwok nodes A and B, one node-mode agent each (the binary in
//! `NODEKEEPER_BIN`, else the one cargo built), 110 pods from 10 Deployments
//! in 5 namespaces on A. Each run creates a NodeMaintenance for the node that
//! holds the pods and measures, from the moment the create call is sent:
//! - cordon: until a watch sees the Node unschedulable;
//! - last pod gone: until a watch of the node's pods sees the last one
//!   deleted (the drain's own work; Succeeded adds the status write);
//! - drained: until a watch sees the NodeMaintenance Succeeded;
//! - requests: API requests the agents made meanwhile, counted in the API
//!   server's audit log, which records only the agents' identity;
//! - pod watches reopened meanwhile (audit log): the server closes a
//!   node-scoped pod watch whose reader falls behind, and each reopening
//!   is a pause in what the agent sees of its drain.
//!
//! The maintenance is then deleted, the node uncordoned, and the next run
//! drains the other node, where the pods were recreated. Each setting in
//! [`CONFIGS`] (HTTP/1.1 or HTTP/2, evictions in flight) gets its own pair of
//! agents and its own row.
//!
//! `NODEKEEPER_DRAIN_SOAK=N` (`just bench-drain-soak`: 100) instead runs N
//! drains with one pair of agents (HTTP/2, 110 in flight) and prints each
//! agent's RSS before its drains: whether memory stays bounded over many.

#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use smol::stream::StreamExt;
use support::{TestEnv, audit_ids_since, block_on, install_crds, rss_kib, wait_for};

const RUNS: usize = 5;
const NAMESPACES: usize = 5;
const DEPLOYMENTS_PER_NS: usize = 2;
const REPLICAS: i32 = 11; // 5 × 2 × 11 = 110 pods

/// The agent settings compared, each with its own pair of agents.
const CONFIGS: [(&str, &[&str]); 4] = [
    (
        "HTTP/1.1, 32 in flight",
        &["--http1-only", "--evictions-in-flight", "32"],
    ),
    (
        "HTTP/1.1, 110 in flight",
        &["--http1-only", "--evictions-in-flight", "110"],
    ),
    ("HTTP/2, 32 in flight", &["--evictions-in-flight", "32"]),
    ("HTTP/2, 110 in flight", &["--evictions-in-flight", "110"]),
];

/// One run's figures.
struct Run {
    cordon: Duration,
    last_pod_gone: Duration,
    drained: Duration,
    requests: usize,
    pod_watches: usize,
}

/// One configuration's figures: per-run figures, idle RSS and the agents'
/// peak RSS (KiB).
struct Measured {
    label: &'static str,
    rows: Vec<Run>,
    idle_rss: u64,
    peak_rss: u64,
}

fn main() {
    let bin = std::env::var("NODEKEEPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")));
    let kubeconfig = support::cluster().to_path_buf();
    let bench_kubeconfig = kubeconfig.with_file_name("kubeconfig-bench");
    let audit_log = kubeconfig.with_file_name("logs").join("audit.log");
    install_crds();
    block_on(async move {
        let mut env = TestEnv::new("bench").await;
        let nodes = [env.add_node("a").await, env.add_node("b").await];
        for n in &nodes {
            env.wait_node_ready(n).await;
        }
        let client = env.client.clone();
        let namespaces = make_workload(&mut env, &nodes[0]).await;

        let soak: Option<usize> = std::env::var("NODEKEEPER_DRAIN_SOAK")
            .ok()
            .and_then(|v| v.parse().ok());
        let configs: Vec<(&str, &[&str])> = match soak {
            Some(_) => vec![CONFIGS[3]],
            None => CONFIGS.to_vec(),
        };
        let runs = soak.unwrap_or(RUNS);
        // Per agent, its RSS before each of its drains (KiB).
        let mut curve: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let mut results = Vec::new();
        let mut run = 0;
        for (label, extra) in configs {
            println!("{label}:");
            let mut agents: Vec<Child> = nodes
                .iter()
                .map(|n| {
                    Command::new(&bin)
                        .args(["run", "--node", n, "--metrics-address", "127.0.0.1:0"])
                        .args(extra)
                        .env("KUBECONFIG", &bench_kubeconfig)
                        .env("RUST_LOG", "nodekeeper=warn")
                        .stdout(Stdio::null())
                        .stderr(Stdio::inherit())
                        .spawn()
                        .expect("starting the agent")
                })
                .collect();
            // Let the agents list and settle before the first measurement.
            nodekeeper::runtime::sleep(Duration::from_secs(3)).await;
            let idle_rss = rss_kib(agents[0].id(), "VmRSS");
            let mut rows = Vec::new();
            for _ in 0..runs {
                let node = nodes[run % 2].clone();
                curve[run % 2].push(rss_kib(agents[run % 2].id(), "VmRSS"));
                let other = nodes[(run + 1) % 2].clone();
                wait_for(
                    "110 running pods on the node to drain",
                    Duration::from_secs(120),
                    || async {
                        (running_on(&client, &namespaces, &node).await == 110).then_some(())
                    },
                )
                .await;
                let row = measure(&client, &env.id, run, &node, &audit_log).await;
                // The node stays cordoned until the replacements all run on
                // the other node, which the next run then drains.
                wait_for(
                    "110 replacement pods running on the other node",
                    Duration::from_secs(120),
                    || async {
                        (running_on(&client, &namespaces, &other).await == 110).then_some(())
                    },
                )
                .await;
                undo(&client, &env.id, run, &node).await;
                println!(
                    "  run {}: cordon {:>6.1} ms, last pod gone {:>7.1} ms, drained {:>7.1} ms, {} API requests, {} pod watches reopened",
                    run + 1,
                    row.cordon.as_secs_f64() * 1e3,
                    row.last_pod_gone.as_secs_f64() * 1e3,
                    row.drained.as_secs_f64() * 1e3,
                    row.requests,
                    row.pod_watches,
                );
                rows.push(row);
                run += 1;
            }
            let peak_rss = agents
                .iter()
                .map(|a| rss_kib(a.id(), "VmHWM"))
                .max()
                .unwrap_or(0);
            for a in agents.iter_mut() {
                let _ = a.kill();
                let _ = a.wait();
            }
            results.push(Measured {
                label,
                rows,
                idle_rss,
                peak_rss,
            });
        }
        print_table(&results, &bin, runs);
        if soak.is_some() {
            print_curve(&curve);
        }
        drop(env);
    });
}

/// 10 Deployments × 11 replicas in 5 namespaces, all scheduled onto `node`
/// (the other node is cordoned while they are placed).
async fn make_workload(env: &mut TestEnv, node: &str) -> Vec<String> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let other = nodes
        .list(&ListParams::default().labels(&format!("{}={}", support::GROUP_LABEL, env.id)))
        .await
        .expect("list nodes")
        .items
        .into_iter()
        .map(|n| n.name_any())
        .find(|n| n != node)
        .expect("a second node");
    cordon(&nodes, &other, true).await;
    let mut namespaces = Vec::new();
    for i in 0..NAMESPACES {
        let ns = env.add_namespace(&format!("ns{i}")).await;
        for d in 0..DEPLOYMENTS_PER_NS {
            let mut dep = env.deployment(&format!("app{d}"), REPLICAS);
            dep.metadata.namespace = Some(ns.clone());
            Api::<Deployment>::namespaced(env.client.clone(), &ns)
                .create(&PostParams::default(), &dep)
                .await
                .expect("create deployment");
        }
        namespaces.push(ns);
    }
    let client = env.client.clone();
    wait_for("110 pods running", Duration::from_secs(180), || async {
        (running_on(&client, &namespaces, node).await == 110).then_some(())
    })
    .await;
    cordon(&nodes, &other, false).await;
    namespaces
}

async fn cordon(nodes: &Api<Node>, name: &str, on: bool) {
    let patch = serde_json::json!({"spec": {"unschedulable": if on { Some(true) } else { None }}});
    nodes
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("cordon");
}

async fn running_on(client: &Client, namespaces: &[String], node: &str) -> usize {
    let mut n = 0;
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await;
        n += list
            .map(|l| {
                l.items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count()
            })
            .unwrap_or(0);
    }
    n
}

/// One maintenance of `node`: (time to cordon, time to Succeeded, requests).
async fn measure(
    client: &Client,
    id: &str,
    run: usize,
    node: &str,
    audit: &std::path::Path,
) -> Run {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let name = format!("{id}-run{run}");
    let audit_start = std::fs::metadata(audit).map(|m| m.len()).unwrap_or(0);

    // Watches first, so no transition can slip past unobserved.
    let node_wc = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut node_events = Box::pin(watcher::watcher(nodes.clone(), node_wc));
    let nm_wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut nm_events = Box::pin(watcher::watcher(nms.clone(), nm_wc));
    let pod_wc = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut pod_events = Box::pin(watcher::watcher(Api::<Pod>::all(client.clone()), pod_wc));
    // Drain each watch's initial list before starting the clock.
    for_init_done(&mut node_events).await;
    for_init_done(&mut nm_events).await;
    let mut on_node = std::collections::HashSet::new();
    while let Some(ev) = pod_events.next().await {
        match ev {
            Ok(Event::InitApply(p)) => {
                on_node.insert(p.name_any());
            }
            Ok(Event::InitDone) => break,
            _ => {}
        }
    }

    let nm = NodeMaintenance::new(
        &name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some("bench".into()),
        },
    );
    let start = Instant::now();
    nms.create(&PostParams::default(), &nm)
        .await
        .expect("create NodeMaintenance");
    let cordon = async {
        while let Some(ev) = node_events.next().await {
            if let Ok(Event::Apply(n)) = ev
                && n.spec.and_then(|s| s.unschedulable) == Some(true)
            {
                return start.elapsed();
            }
        }
        start.elapsed()
    };
    let drained = async {
        while let Some(ev) = nm_events.next().await {
            if let Ok(Event::Apply(m)) = ev
                && m.phase() == Some(Phase::Succeeded)
            {
                return start.elapsed();
            }
        }
        start.elapsed()
    };
    let gone = async {
        while let Some(ev) = pod_events.next().await {
            if let Ok(Event::Delete(p)) = ev {
                on_node.remove(&p.name_any());
                if on_node.is_empty() {
                    return start.elapsed();
                }
            }
        }
        start.elapsed()
    };
    let ((t_cordon, t_drained), t_gone) =
        smol::future::zip(smol::future::zip(cordon, drained), gone).await;
    Run {
        cordon: t_cordon,
        last_pod_gone: t_gone,
        drained: t_drained,
        requests: audit_ids_since(audit, audit_start),
        pod_watches: support::audit_count_since(audit, audit_start, "watch", "pods"),
    }
}

/// Delete the maintenance and wait until the node is uncordoned.
async fn undo(client: &Client, id: &str, run: usize, node: &str) {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let name = format!("{id}-run{run}");
    nms.delete(&name, &DeleteParams::default())
        .await
        .expect("delete NodeMaintenance");
    wait_for(
        "maintenance removed and node uncordoned",
        Duration::from_secs(60),
        || async {
            let gone = nms.get_opt(&name).await.ok()?.is_none();
            let n = nodes.get(node).await.ok()?;
            (gone && n.spec.and_then(|s| s.unschedulable) != Some(true)).then_some(())
        },
    )
    .await;
}

async fn for_init_done<K, S>(events: &mut S)
where
    S: smol::stream::Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    while let Some(ev) = events.next().await {
        if matches!(ev, Ok(Event::InitDone)) {
            return;
        }
    }
}

/// Each agent's RSS before its 1st, 2nd, … drain, at a few checkpoints,
/// and the growth per drain after the first (least squares).
fn print_curve(curve: &[Vec<u64>; 2]) {
    println!();
    println!("RSS of each agent before its n-th drain (MiB):");
    println!("| drain n | agent A | agent B |");
    println!("|---------|---------|---------|");
    let len = curve[0].len().max(curve[1].len());
    const CHECKPOINTS: [usize; 13] = [1, 2, 3, 5, 10, 15, 20, 30, 40, 50, 75, 100, 150];
    for n in CHECKPOINTS {
        if n <= len {
            let at = |c: &Vec<u64>| {
                c.get(n - 1)
                    .map(|k| format!("{:>7.2}", *k as f64 / 1024.0))
                    .unwrap_or_else(|| "      –".into())
            };
            println!("| {n:>7} | {} | {} |", at(&curve[0]), at(&curve[1]));
        }
    }
    if len > 0 && !CHECKPOINTS.contains(&len) {
        let last = |c: &Vec<u64>| {
            c.last()
                .map(|k| format!("{:>7.2}", *k as f64 / 1024.0))
                .unwrap_or_default()
        };
        println!("| {len:>7} | {} | {} |", last(&curve[0]), last(&curve[1]));
    }
    for (i, c) in curve.iter().enumerate() {
        // From the second drain on: the first one warms caches and pools.
        let pts: Vec<(f64, f64)> = c
            .iter()
            .enumerate()
            .skip(1)
            .map(|(x, y)| (x as f64, *y as f64))
            .collect();
        if pts.len() >= 3 {
            let n = pts.len() as f64;
            let (sx, sy) = pts.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
            let (mx, my) = (sx / n, sy / n);
            let cov: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let var: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
            println!(
                "agent {}: {:+.1} KiB per drain after the first ({} drains)",
                ["A", "B"][i],
                cov / var,
                c.len()
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn print_table(results: &[Measured], bin: &std::path::Path, runs: usize) {
    println!();
    println!(
        "drain benchmark: 110 evictable pods (10 Deployments, {NAMESPACES} namespaces), median of {runs} runs per setting"
    );
    println!("binary: {}", bin.display());
    println!("targets: cordon ≤ 100 ms, Succeeded ≤ 2000 ms, RSS ≤ 10 MiB");
    println!(
        "| setting                | cordon    | last pod gone | Succeeded | idle RSS  | peak RSS  | requests | pod watches reopened |"
    );
    println!(
        "|------------------------|-----------|---------------|-----------|-----------|-----------|----------|----------------------|"
    );
    for m in results {
        let ms = |f: fn(&Run) -> Duration| {
            median(m.rows.iter().map(|r| f(r).as_secs_f64() * 1e3).collect())
        };
        let (cordon, gone, drained) =
            (ms(|r| r.cordon), ms(|r| r.last_pod_gone), ms(|r| r.drained));
        let requests = median(m.rows.iter().map(|r| r.requests as f64).collect());
        let reopened: usize = m.rows.iter().map(|r| r.pod_watches).sum();
        println!(
            "| {:<23} | {cordon:>6.1} ms | {gone:>10.0} ms | {drained:>6.0} ms | {:>5.1} MiB | {:>5.1} MiB | {requests:>8.0} | {reopened:>3} in {} runs |",
            m.label,
            m.idle_rss as f64 / 1024.0,
            m.peak_rss as f64 / 1024.0,
            m.rows.len(),
        );
    }
}
