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
//!   is a pause in what the agent sees of its drain (the cluster role
//!   opens one per drained node: one per drain is its normal);
//! - CPU: the nodekeeper processes' user and system time meanwhile, and
//!   the API server's (what the drainer cost it); bytes the drainer's
//!   processes read and wrote (`/proc/PID/io`) — counts that the shared
//!   machine's noise cannot blur as it blurs the wall clock;
//! - where the time that is ours goes: *to first eviction*, from the
//!   drainer's first request on the NodeMaintenance (its finalizer) to its
//!   first eviction, both as the API server received them (audit log): the
//!   finalizer and lease, the cordon, the first status, the node's
//!   conditions; and *Succeeded − last pod gone*: the status write after
//!   the drain, as the benchmark's watches saw both.
//!
//! The maintenance is then deleted, the node uncordoned, and the next run
//! drains the other node, where the pods were recreated. The settings run
//! in rounds, each once per round with processes started for it
//! (`NODEKEEPER_DRAIN_RUNS` rounds, default 5; `NODEKEEPER_DRAIN_ONLY`
//! picks settings by the start of their label), so a slow spell of the
//! shared machine falls on all alike. Each setting in [`SETTINGS`] has its
//! own row: node agents
//! (HTTP/1.1 or HTTP/2, evictions in flight), the cluster role alone (one
//! `run --all-nodes` process scoped to the two nodes, which drains them
//! itself), and first **the floor**: no nodekeeper at all, the benchmark
//! itself cordons the node (before the clock) and sends the 110 evictions
//! at once over one HTTP/2 connection, with no list, no decision and no
//! status, and times the last pod gone. What the API server, the
//! controllers and kwok need for that is the limit; every row is also
//! shown divided by it. Then **the protocol**: the benchmark drains as an
//! NMO-compatible drainer with no decisions would, on the maintenance the
//! other rows get: finalizer and lease, cordon and taint, the first status
//! with the pending pods, every eviction at once, Succeeded once its watch
//! sees the last pod gone (`drain_floors.rs`). What separates a row from
//! the floor and not from the protocol is the protocol's, not the row's.
//!
//! `NODEKEEPER_DRAIN_NMO=PATH` adds medik8s NMO's manager binary (built
//! from its sources, `go build -mod=vendor .`) as a row of its own, run
//! with the benchmark's identity like the others.
//!
//! `NODEKEEPER_DRAIN_SOAK=N` (`just bench-drain-soak`: 100) instead runs N
//! drains with one pair of agents (HTTP/2, 110 in flight) and prints each
//! agent's RSS before its drains: whether memory stays bounded over many.

#[path = "../support/mod.rs"]
mod support;

#[path = "drain_report.rs"]
mod report;

#[path = "drain_floors.rs"]
mod floors;

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

/// Who drains in a setting.
#[derive(Clone, Copy, PartialEq)]
enum Who {
    /// The benchmark itself: cordon, then every eviction at once.
    Floor,
    /// The benchmark itself, as a drainer with no decisions that makes the
    /// writes every NMO-compatible drain makes, one after the other:
    /// finalizer and lease, cordon and taint, the first status with the
    /// pending pods, every eviction at once, Succeeded once its watch sees
    /// the last pod gone.
    Protocol,
    /// A node agent per node (`run --node N`).
    NodeAgents,
    /// One cluster role (`run --all-nodes`) and no agents.
    ClusterRole,
    /// medik8s NMO's manager binary (`NODEKEEPER_DRAIN_NMO`), alone.
    Nmo,
}

impl Who {
    /// The benchmark drains itself: no nodekeeper or NMO process runs.
    fn bench_drains(self) -> bool {
        matches!(self, Who::Floor | Who::Protocol)
    }
}

/// The row of medik8s NMO when `NODEKEEPER_DRAIN_NMO` names its manager
/// binary (built from its sources: `go build -mod=vendor .`).
const NMO: (&str, Who, &[&str]) = ("medik8s NMO (its manager)", Who::Nmo, &[]);

/// The settings compared, each with its own processes.
const SETTINGS: [(&str, Who, &[&str]); 7] = [
    ("floor: 110 evictions at once", Who::Floor, &[]),
    ("floor + the protocol's writes", Who::Protocol, &[]),
    (
        "HTTP/1.1, 32 in flight",
        Who::NodeAgents,
        &["--http1-only", "--evictions-in-flight", "32"],
    ),
    (
        "HTTP/1.1, 110 in flight",
        Who::NodeAgents,
        &["--http1-only", "--evictions-in-flight", "110"],
    ),
    (
        "HTTP/2, 32 in flight",
        Who::NodeAgents,
        &["--evictions-in-flight", "32"],
    ),
    (
        "node role (default)",
        Who::NodeAgents,
        &["--evictions-in-flight", "110"],
    ),
    ("cluster role (default)", Who::ClusterRole, &[]),
];

/// One run's figures.
struct Run {
    cordon: Duration,
    last_pod_gone: Duration,
    drained: Duration,
    requests: usize,
    pod_watches: usize,
    /// CPU time the nodekeeper processes used meanwhile (0 for the floor).
    cpu_ms: f64,
    /// CPU time the API server used meanwhile: what the drainer cost it.
    apiserver_cpu_ms: f64,
    /// Bytes the drainer's processes read and wrote meanwhile (their
    /// `/proc/PID/io` rchar + wchar: the API traffic, and a few log
    /// lines); 0 where the benchmark drains itself.
    bytes: u64,
    /// From the drainer's first request on the NodeMaintenance to its first
    /// eviction, as the API server received them (None for the floor).
    to_first_eviction: Option<Duration>,
}

/// One configuration's figures: per-run figures, idle RSS and the agents'
/// peak RSS (KiB).
struct Measured {
    label: &'static str,
    who: Who,
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
        let nmo = std::env::var_os("NODEKEEPER_DRAIN_NMO").map(PathBuf::from);
        let all: Vec<(&str, Who, &[&str])> = SETTINGS
            .iter()
            .copied()
            .chain(nmo.as_ref().map(|_| NMO))
            .collect();
        let configs: Vec<(&str, Who, &[&str])> = match soak {
            Some(_) => SETTINGS
                .iter()
                .copied()
                .filter(|(l, _, _)| *l == "node role (default)")
                .collect(),
            None => match std::env::var("NODEKEEPER_DRAIN_ONLY") {
                // A subset by label prefix, e.g. "floor,node role,cluster".
                Ok(only) => all
                    .into_iter()
                    .filter(|(l, _, _)| only.split(',').any(|o| l.starts_with(o.trim())))
                    .collect(),
                Err(_) => all,
            },
        };
        let runs = soak.unwrap_or_else(|| {
            std::env::var("NODEKEEPER_DRAIN_RUNS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(RUNS)
        });
        // Per agent, its RSS before each of its drains (KiB).
        let mut curve: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let mut results: Vec<Measured> = configs
            .iter()
            .map(|(label, who, _)| Measured {
                label,
                who: *who,
                rows: Vec::new(),
                idle_rss: 0,
                peak_rss: 0,
            })
            .collect();
        // Rotated: each round runs every setting once (its own processes,
        // started for it), so a slow spell of the shared machine falls on
        // all settings alike; the soak runs all its drains in one pair.
        let schedule: Vec<(usize, usize)> = match soak {
            Some(n) => vec![(0, n)],
            None => (0..runs)
                .flat_map(|_| (0..configs.len()).map(|i| (i, 1)))
                .collect(),
        };
        let mut run = 0;
        let apiserver = apiserver_pid();
        // The floor's own client: the agents' HTTP/2 transport and the
        // benchmark identity, so the audit log counts its requests too.
        let floor_client = nodekeeper::service::connect::connect(Some(&bench_kubeconfig))
            .await
            .expect("a client for the floor");
        for (i, drains) in schedule {
            let (label, who, extra) = configs[i];
            let start = |args: Vec<String>| {
                Command::new(&bin)
                    .args(args)
                    .args(extra)
                    .env("KUBECONFIG", &bench_kubeconfig)
                    .env(
                        "RUST_LOG",
                        std::env::var("NODEKEEPER_BENCH_LOG").unwrap_or("nodekeeper=warn".into()),
                    )
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("starting nodekeeper")
            };
            let run_args = |more: &[&str]| {
                ["run", "--metrics-address", "127.0.0.1:0"]
                    .iter()
                    .chain(more)
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
            };
            let selector = format!("{}={}", support::GROUP_LABEL, env.id);
            let mut agents: Vec<Child> = match who {
                Who::Floor | Who::Protocol => Vec::new(),
                Who::NodeAgents => nodes
                    .iter()
                    .map(|n| start(run_args(&["--node", n])))
                    .collect(),
                // Its own flags: no metrics or probe listeners (their fixed
                // default ports), no leader election; the benchmark's
                // identity like every other row, so its requests count too.
                Who::Nmo => vec![
                    Command::new(nmo.as_ref().expect("NODEKEEPER_DRAIN_NMO"))
                        .env("TMPDIR", nmo_tmp(&env.id))
                        .args([
                            "--metrics-bind-address",
                            "0",
                            "--health-probe-bind-address",
                            "0",
                        ])
                        .env("KUBECONFIG", &bench_kubeconfig)
                        .stdout(Stdio::null())
                        .stderr(if std::env::var_os("NODEKEEPER_BENCH_LOG").is_some() {
                            Stdio::inherit()
                        } else {
                            Stdio::null()
                        })
                        .spawn()
                        .expect("starting NMO's manager"),
                ],
                Who::ClusterRole => vec![start(run_args(&[
                    "--all-nodes",
                    "--node-selector",
                    &selector,
                    "--leader-namespace",
                    &env.ns,
                ]))],
            };
            // Let them list, settle (and lead) before the first measurement.
            if !who.bench_drains() {
                nodekeeper::runtime::sleep(Duration::from_secs(3)).await;
            }
            let idle_rss = agents.first().map_or(0, |a| rss_kib(a.id(), "VmRSS"));
            for _ in 0..drains {
                let node = nodes[run % 2].clone();
                if let Some(a) = agents.get(run % 2) {
                    curve[run % 2].push(rss_kib(a.id(), "VmRSS"));
                }
                let other = nodes[(run + 1) % 2].clone();
                wait_for(
                    "110 running pods on the node to drain",
                    Duration::from_secs(120),
                    || async {
                        (running_on(&client, &namespaces, &node).await == 110).then_some(())
                    },
                )
                .await;
                let cpu_before: f64 = agents.iter().map(|a| cpu_ms(a.id())).sum();
                // The drained node's agent alone (the other one sees the
                // 110 replacement pods arrive on its node).
                let drained_agent = agents.get(run % 2).filter(|_| agents.len() == 2);
                let drained_before = drained_agent.map_or(0.0, |a| cpu_ms(a.id()));
                let io_before: u64 = agents.iter().map(|a| io_bytes(a.id())).sum();
                let apiserver_before = cpu_ms(apiserver);
                let mut row = match who {
                    Who::Floor => floors::floor(&client, &floor_client, &node, &audit_log).await,
                    Who::Protocol => {
                        let drainer = floors::Drainer {
                            client: &floor_client,
                            lease_namespace: &env.ns,
                        };
                        measure(&client, &env.id, run, &node, &audit_log, Some(drainer)).await
                    }
                    _ => measure(&client, &env.id, run, &node, &audit_log, None).await,
                };
                row.cpu_ms = agents.iter().map(|a| cpu_ms(a.id())).sum::<f64>() - cpu_before;
                let drained_cpu = drained_agent.map(|a| cpu_ms(a.id()) - drained_before);
                row.bytes = agents.iter().map(|a| io_bytes(a.id())).sum::<u64>() - io_before;
                row.apiserver_cpu_ms = (cpu_ms(apiserver) - apiserver_before).max(0.0);
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
                match who {
                    Who::Floor => cordon(&Api::all(client.clone()), &node, false).await,
                    Who::Protocol => {
                        floors::protocol_undo(&client, &env.id, run, &node, &env.ns).await
                    }
                    _ => undo(&client, &env.id, run, &node).await,
                }
                println!(
                    "  run {} ({label}): cordon {:>6.1} ms, to first eviction {}, last pod gone {:>7.1} ms, drained {:>7.1} ms, {} API requests, {} pod watches reopened, {:.1} ms CPU{}",
                    run + 1,
                    row.cordon.as_secs_f64() * 1e3,
                    row.to_first_eviction.map_or("–".to_string(), |d| format!(
                        "{:.1} ms",
                        d.as_secs_f64() * 1e3
                    )),
                    row.last_pod_gone.as_secs_f64() * 1e3,
                    row.drained.as_secs_f64() * 1e3,
                    row.requests,
                    row.pod_watches,
                    row.cpu_ms,
                    drained_cpu.map_or(String::new(), |c| format!(
                        " (the drained node's agent {c:.1} ms)"
                    )),
                );
                results[i].rows.push(row);
                run += 1;
            }
            let peak_rss = agents
                .iter()
                .map(|a| rss_kib(a.id(), "VmHWM"))
                .max()
                .unwrap_or(0);
            // Stopped as an operator's restart stops them (SIGTERM): a
            // cluster role hands its Lease over, so the next setting's
            // leads at once instead of after the Lease's 15 s.
            for a in agents.iter_mut() {
                let _ = Command::new("kill")
                    .args(["-TERM", &a.id().to_string()])
                    .status();
                let _ = a.wait();
            }
            let m = &mut results[i];
            m.idle_rss = m.idle_rss.max(idle_rss);
            m.peak_rss = m.peak_rss.max(peak_rss);
        }
        if nmo.is_some() {
            let _ = std::fs::remove_dir_all(nmo_tmp_path(&env.id));
        }
        report::print_table(&results, &bin, runs);
        if soak.is_some() {
            report::print_curve(&curve);
        }
        drop(env);
    });
}

/// A TMPDIR for NMO's manager, holding the self-signed serving certificate
/// its webhook server will not start without (OLM injects one; the
/// benchmark calls no webhook).
fn nmo_tmp(id: &str) -> PathBuf {
    let tmp = nmo_tmp_path(id);
    let dir = tmp.join("k8s-webhook-server/serving-certs");
    std::fs::create_dir_all(&dir).expect("NMO's certificate folder");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])
        .expect("a self-signed certificate for NMO");
    std::fs::write(dir.join("tls.crt"), cert.cert.pem()).expect("writing tls.crt");
    std::fs::write(dir.join("tls.key"), cert.signing_key.serialize_pem()).expect("writing tls.key");
    tmp
}

fn nmo_tmp_path(id: &str) -> PathBuf {
    std::env::temp_dir().join(format!("nodekeeper-bench-nmo-{id}"))
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
/// With a `drainer`, the benchmark drains it itself ([`floors::protocol`]).
async fn measure(
    client: &Client,
    id: &str,
    run: usize,
    node: &str,
    audit: &std::path::Path,
    drainer: Option<floors::Drainer<'_>>,
) -> Run {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let name = format!("{id}-run{run}");
    let audit_start = support::audit_offset_of(audit);

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
    // The node's pods (name, namespace) before the clock.
    let mut pods: Vec<(String, String)> = Vec::new();
    while let Some(ev) = pod_events.next().await {
        match ev {
            Ok(Event::InitApply(p)) => {
                pods.push((p.name_any(), p.namespace().unwrap_or_default()));
            }
            Ok(Event::InitDone) => break,
            _ => {}
        }
    }
    let mut on_node: std::collections::HashSet<String> =
        pods.iter().map(|(name, _)| name.clone()).collect();
    // The protocol's drainer learns that the last pod is gone from the
    // benchmark's pod watch: the same delivery its own watch would have.
    let (all_gone, on_all_gone) = smol::channel::bounded::<()>(1);

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
                    let _ = all_gone.try_send(());
                    return start.elapsed();
                }
            }
        }
        start.elapsed()
    };
    let drain = async {
        if let Some(d) = drainer {
            floors::protocol(d, &name, node, &pods, on_all_gone).await;
        }
    };
    let (((t_cordon, t_drained), t_gone), ()) = smol::future::zip(
        smol::future::zip(smol::future::zip(cordon, drained), gone),
        drain,
    )
    .await;
    Run {
        cordon: t_cordon,
        last_pod_gone: t_gone,
        drained: t_drained,
        requests: audit_ids_since(audit, audit_start),
        pod_watches: support::audit_count_since(audit, audit_start, "watch", "pods"),
        cpu_ms: 0.0,
        apiserver_cpu_ms: 0.0,
        bytes: 0,
        to_first_eviction: to_first_eviction(audit, audit_start, &name),
    }
}

/// From the drainer's first request on maintenance `nm` to its first
/// eviction, by the API server's clock (when it received each: the audit
/// log's `requestReceivedTimestamp`). The audit log records only the
/// benchmark's identity, which the drainers use.
fn to_first_eviction(audit: &std::path::Path, from: u64, nm: &str) -> Option<Duration> {
    let mut first_nm: Option<k8s_openapi::jiff::Timestamp> = None;
    let mut first_eviction: Option<k8s_openapi::jiff::Timestamp> = None;
    for e in support::audit_entries(audit, from) {
        let Some(at) = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        else {
            continue;
        };
        let what = &e["objectRef"];
        let slot = if what["resource"] == "nodemaintenances" && what["name"] == nm {
            &mut first_nm
        } else if what["subresource"] == "eviction" {
            &mut first_eviction
        } else {
            continue;
        };
        *slot = Some(slot.map_or(at, |t| t.min(at)));
    }
    let span = first_eviction?.duration_since(first_nm?);
    Duration::try_from(span).ok()
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

/// The local control plane's API server process (tests/controlplane
/// writes its PID beside the kubeconfig).
fn apiserver_pid() -> u32 {
    let dir = support::cluster()
        .parent()
        .map(std::path::Path::to_path_buf);
    dir.and_then(|d| std::fs::read_to_string(d.join("kube-apiserver.pid")).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no kube-apiserver.pid beside {}",
                support::cluster().display()
            )
        })
}

/// Bytes a process read and wrote through system calls so far
/// (`/proc/PID/io`: rchar + wchar; sockets included).
fn io_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| *k == "rchar" || *k == "wchar")
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// CPU time of a process so far (all its threads, live and ended), in ms
/// to the nanosecond: its process CPU clock, as `clock_getcpuclockid(3)`
/// names it. /proc's utime and stime count 10 ms ticks, which would blur a
/// drain costing 40–60 ms by a fifth.
fn cpu_ms(pid: u32) -> f64 {
    // MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of the kernel's
    // include/linux/posix-timers.h: what glibc's clock_getcpuclockid builds.
    let clock = ((!(pid as libc::clockid_t)) << 3) | 2;
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(clock, &mut t) };
    assert_eq!(
        rc,
        0,
        "the CPU clock of process {pid}: {}",
        std::io::Error::last_os_error()
    );
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}
