//! `just bench-scale`: nodekeeper in a big cluster. A benchmark, not a test:
//! it prints tables and asserts nothing about time or memory.
//!
//! Set-up, on the local control plane: 1000 kwok nodes and 30 pods on each
//! (30 000 pods in 10 namespaces, realistic specs: probes, env, resources,
//! a config map and an emptyDir), created straight onto their nodes over
//! one HTTP/2 connection, 200 requests in flight. kwok runs them.
//!
//! **Cluster role** (`run --all-nodes`, the static binary, an audited
//! identity with the shipped RBAC and the shipped FlowSchema's priority for
//! its lease, so its requests meet the API server's priority and fairness as
//! a ServiceAccount's do): started on the empty cluster, so the resident memory it adds
//! as the nodes and then the pods arrive is what those stores cost; then
//! restarted on the full cluster (start to `/readyz`, requests, memory);
//! then one NodeMaintenance at a time (cordon latency and drain of the
//! node's 30 pods, 3 rounds), then 100 at once (times, memory, the pods it
//! holds meanwhile and after); then a RebootPolicy whose health gate
//! selects 3 000 Deployments (realistic pod templates, no replicas: the
//! gate's cost is the list, not the pods) while one node holds its slot
//! (no agent runs there, so it stays `Rebooting` and the gate is listed
//! every 5 s): requests, CPU and memory over 30 s of it.
//!
//! **Node role**: 100 agents, one process each, on the first 100 nodes, all
//! as one audited identity with the node agent's shipped RBAC (as every
//! DaemonSet pod is one ServiceAccount): start to all ready, API requests
//! over an idle minute (from the API server's audit log, which records only
//! the audited identities and the bench's), memory per
//! agent, what 10 and then 100 NodeMaintenances on other nodes cost the
//! agents (requests, CPU, objects held: an agent watches only its own
//! node's), and the time for every node to be cordoned and drained when 100
//! NodeMaintenances appear at once, with the NodeMaintenance watches
//! reopened meanwhile.
//!
//! Sizes: `NODEKEEPER_SCALE_NODES` (1000), `NODEKEEPER_SCALE_PODS` (per
//! node, 30), `NODEKEEPER_SCALE_AGENTS` (100), `NODEKEEPER_SCALE_IDLE`
//! (seconds of the idle windows, 60). At 5 000 nodes on a 24 GiB machine,
//! start the control plane as `GOMEMLIMIT=9GiB tests/controlplane/cluster.sh
//! up` first: kube-apiserver otherwise grows past what the machine has
//! once 150 000 pods run (tests/README.md, "Scale, as last measured").

#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use nodekeeper::api::reboot::{RebootPolicy, RebootPolicySpec};
use nodekeeper::service::connect::{Transport, connect_with};
use serde_json::json;
use smol::stream::StreamExt;
use support::machines::{annotate, maintenances_on, set_boot};
use support::{
    Agent, GROUP_LABEL, block_on, create_namespace, free_port, http_get, install_crds, rss_kib,
    wait_for,
};

const NAMESPACES: usize = 10;
const CREATE_IN_FLIGHT: usize = 200;
const CORDON_ROUNDS: usize = 3;
/// NodeMaintenances the cluster role is given at once.
const CLUSTER_BURST: usize = 100;
/// Deployments a health gate selects while a node holds a slot.
const GATED_DEPLOYMENTS: usize = 3000;
/// How long the cluster role is watched while the gate lists them (the
/// gate lists every `service::health::EVERY`, 5 s).
const GATE_WINDOW: Duration = Duration::from_secs(30);
/// How long the agents are watched while NodeMaintenances elsewhere appear.
const ELSEWHERE_WINDOW: Duration = Duration::from_secs(5);

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let bin = std::env::var("NODEKEEPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")));
    let nodes_n = setting("NODEKEEPER_SCALE_NODES", 1000);
    let pods_per_node = setting("NODEKEEPER_SCALE_PODS", 30);
    let agents_n =
        setting("NODEKEEPER_SCALE_AGENTS", 100).min(nodes_n.saturating_sub(CORDON_ROUNDS));
    let idle = Duration::from_secs(setting("NODEKEEPER_SCALE_IDLE", 60) as u64);
    let kubeconfig = support::cluster().to_path_buf();
    let audit = kubeconfig.with_file_name("logs").join("audit.log");
    install_crds();
    block_on(async move {
        let client = connect_with(Some(&kubeconfig), Transport::Http2)
            .await
            .expect("connecting to the test cluster");
        let id = format!("scale-{}", std::process::id() % 100_000);
        let mut out = Report::default();
        out.line(format!(
            "{nodes_n} nodes × {pods_per_node} pods; {agents_n} node agents; binary {}",
            bin.display()
        ));
        create_namespace(&client, &id).await;
        let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("{id}-ns{i}")).collect();
        for ns in &namespaces {
            create_namespace(&client, ns).await;
        }
        let node_names: Vec<String> = (0..nodes_n).map(|i| format!("{id}-n{i:04}")).collect();
        let cleanup = Cleanup {
            client: client.clone(),
            id: id.clone(),
            namespaces: namespaces.iter().cloned().chain([id.clone()]).collect(),
        };

        // The cluster role, started on the empty cluster.
        let selector = format!("{GROUP_LABEL}={id}");
        let cluster_args = |port: u16| -> Vec<String> {
            [
                "run",
                "--all-nodes",
                "--node-selector",
                &selector,
                "--leader-namespace",
                &id,
                "--metrics-address",
                &format!("127.0.0.1:{port}"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        // As users run it: the shipped RBAC and the shipped FlowSchema's
        // priority for its lease, through the API server's priority and
        // fairness (the bench identity is system:masters, which is exempt).
        let port = free_port();
        let args = cluster_args(port);
        let role_args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (role_kubeconfig, role_user) = support::audited_identity_for(&role_args);
        let mut role = start(&bin, &role_kubeconfig, &args);
        wait_ready(&[port], Duration::from_secs(60)).await;
        let base = rss_kib(role.child.id(), "VmRSS");
        println!("cluster role ready on the empty cluster: RSS {}", kib(base));

        // 1000 nodes.
        let t = Instant::now();
        concurrently(node_names.clone(), CREATE_IN_FLIGHT, |name| {
            let (client, id) = (client.clone(), id.clone());
            async move { create_node(&client, &id, &name).await }
        })
        .await;
        let created = t.elapsed();
        support::wait_for_every(
            &format!("{nodes_n} nodes Ready"),
            Duration::from_secs(600),
            Duration::from_secs(1),
            || async { (ready_nodes(&client, &selector).await >= nodes_n).then_some(()) },
        )
        .await;
        let ready = t.elapsed();
        // Every pod of the benchmark is bound by name and its Deployments
        // have no replicas: kube-scheduler has nothing to do but watch
        // 150 000 pods beside the API server (at 5 000 nodes, a core).
        let _scheduler = Paused::process(&kubeconfig.with_file_name("kube-scheduler.pid"));
        wait_watched(port, "nodes", nodes_n).await;
        let with_nodes = rss_kib(role.child.id(), "VmRSS");
        out.setup(format!(
            "{nodes_n} nodes: created in {:.1} s, all Ready after {:.1} s",
            created.as_secs_f64(),
            ready.as_secs_f64()
        ));

        // 30 pods on every node.
        let cpu_before = support::cpu_seconds(role.child.id());
        let t = Instant::now();
        let pods: Vec<(String, String, String)> = node_names
            .iter()
            .enumerate()
            .flat_map(|(i, node)| {
                let namespaces = &namespaces;
                (0..pods_per_node).map(move |p| {
                    let ns = namespaces[(i * pods_per_node + p) % NAMESPACES].clone();
                    (ns, format!("{node}-p{p:02}"), node.clone())
                })
            })
            .collect();
        let total_pods = pods.len();
        concurrently(pods, CREATE_IN_FLIGHT, |(ns, name, node)| {
            let (client, id) = (client.clone(), id.clone());
            async move { create_pod(&client, &id, &ns, &name, &node).await }
        })
        .await;
        let created = t.elapsed();
        let pod_selector = format!("nodekeeper.test/scale={id}");
        // Every 10 s: a list of one pod with a field selector scans the
        // pods in etcd until it finds one (the watch cache would ignore the
        // limit and answer with every pod still waiting), and every 100 ms
        // that scan was most of the API server's CPU while kwok started
        // 150 000 pods (bench-scale at 5 000 nodes).
        support::wait_for_every(
            &format!("{total_pods} pods Running"),
            // kwok starts about 100 pods a second here.
            Duration::from_secs(1200.max(total_pods as u64 / 40)),
            Duration::from_secs(10),
            || async {
                let waiting = Api::<Pod>::all(client.clone())
                    .list(
                        &ListParams::default()
                            .labels(&pod_selector)
                            .fields("status.phase!=Running")
                            .limit(1),
                    )
                    .await
                    .ok()?;
                waiting.items.is_empty().then_some(())
            },
        )
        .await;
        let running = t.elapsed();
        // The cluster role holds only the pods of nodes it drains and of
        // its gates: none here.
        let held_pods = watched(port, "pods").unwrap_or(0);
        let with_pods = rss_kib(role.child.id(), "VmRSS");
        let churn_cpu = support::cpu_seconds(role.child.id()) - cpu_before;
        out.setup(format!(
            "{total_pods} pods: created in {:.1} s, all Running after {:.1} s",
            created.as_secs_f64(),
            running.as_secs_f64()
        ));
        let node_cost = with_nodes.saturating_sub(base);
        let pod_cost = with_pods.saturating_sub(with_nodes);
        out.row("cluster role: RSS on the empty cluster", kib(base));
        out.row(
            &format!("cluster role: + {nodes_n} nodes (node store)"),
            format!(
                "+{} ({:.1} KiB per node)",
                kib(node_cost),
                node_cost as f64 / nodes_n as f64
            ),
        );
        out.row(
            &format!("cluster role: + {total_pods} pods (pods held)"),
            format!(
                "+{} ({:.0} bytes per pod; {held_pods} held)",
                kib(pod_cost),
                pod_cost as f64 * 1024.0 / total_pods as f64
            ),
        );
        out.row(
            "cluster role: CPU while the pods were created and started",
            format!("{churn_cpu:.1} s over {:.0} s", running.as_secs_f64()),
        );
        let (requests, cpu) = idle_window(&audit, role.child.id(), idle).await;
        out.row(
            &format!("cluster role: API requests in {} idle s", idle.as_secs()),
            requests_text(&requests),
        );
        out.row(
            "cluster role: CPU at idle",
            format!("{:.1} % of a core", cpu * 100.0 / idle.as_secs_f64()),
        );
        out.row(
            "cluster role: peak RSS while the cluster grew",
            kib(rss_kib(role.child.id(), "VmHWM")),
        );

        // A restart on the full cluster.
        stop(&mut role);
        let audit_start = mark(&audit);
        let port = free_port();
        let t = Instant::now();
        let mut role = start(&bin, &role_kubeconfig, &cluster_args(port));
        wait_ready(&[port], Duration::from_secs(300)).await;
        let start_to_ready = t.elapsed();
        let requests = audit_verbs_since(&audit, audit_start);
        out.row(
            "cluster role: start to ready on the full cluster",
            format!(
                "{:.2} s, {}",
                start_to_ready.as_secs_f64(),
                requests_text(&requests)
            ),
        );
        out.row(
            "cluster role: RSS when ready / peak while listing",
            format!(
                "{} / {}",
                kib(rss_kib(role.child.id(), "VmRSS")),
                kib(rss_kib(role.child.id(), "VmHWM"))
            ),
        );

        // One maintenance at a time, on nodes the node agents will not own.
        let mut cordons = Vec::new();
        let mut drains = Vec::new();
        for round in 0..CORDON_ROUNDS {
            let node = &node_names[nodes_n - 1 - round];
            let (cordon, drained) = maintain(&client, &format!("{id}-c{round}"), node).await;
            println!(
                "  cluster role, round {}: cordon {:.1} ms, {pods_per_node} pods drained {:.0} ms",
                round + 1,
                ms(cordon),
                ms(drained)
            );
            cordons.push(ms(cordon));
            drains.push(ms(drained));
            undo(&client, &format!("{id}-c{round}"), node).await;
        }
        out.row(
            &format!("cluster role: one NodeMaintenance, cordon (median of {CORDON_ROUNDS})"),
            format!("{:.1} ms", median(cordons)),
        );
        out.row(
            &format!("cluster role: one NodeMaintenance, {pods_per_node} pods drained"),
            format!("{:.0} ms", median(drains)),
        );
        out.row(
            "cluster role: peak RSS after restart and maintenances",
            kib(rss_kib(role.child.id(), "VmHWM")),
        );
        // Concurrent maintenances, on nodes the agents will not own either.
        let burst_n = CLUSTER_BURST.min(nodes_n.saturating_sub(agents_n + CORDON_ROUNDS));
        let burst_nodes: Vec<String> =
            node_names[nodes_n - CORDON_ROUNDS - burst_n..nodes_n - CORDON_ROUNDS].to_vec();
        // The burst's own peak: VmHWM reset first, as for the gate below.
        let _ = std::fs::write(format!("/proc/{}/clear_refs", role.child.id()), "5");
        let before_burst = rss_kib(role.child.id(), "VmRSS");
        let burst_audit = mark(&audit);
        let burst = maintain_all(
            &client,
            &format!("{id}-cr"),
            &burst_nodes,
            &selector,
            || role.log_text(),
        )
        .await;
        out.row(
            &format!("cluster role: {burst_n} NodeMaintenances at once, cordoned p50 / p95 / all"),
            percentiles(&burst.cordoned),
        );
        out.row(
            &format!("cluster role: {burst_n} NodeMaintenances at once, drained p50 / all"),
            format!(
                "{:.2} / {:.2} s",
                median(burst.drained.iter().map(|d| d.as_secs_f64()).collect()),
                burst.drained.iter().max().map_or(0.0, |d| d.as_secs_f64())
            ),
        );
        // A pod watch per drained node; more when the server closed one
        // (it goes on from where it was: the same resourceVersion).
        let asked = support::requests_of(&role_user, burst_audit.offset);
        let pod_watches = asked
            .iter()
            .filter(|r| r.verb == "watch" && r.resource == "pods")
            .count();
        out.row(
            &format!(
                "cluster role: {burst_n} NodeMaintenances at once, API requests / pod watches opened"
            ),
            format!("{} / {pod_watches}", asked.len()),
        );
        let held_during = watched(port, "pods").unwrap_or(0);
        out.row(
            &format!(
                "cluster role: RSS before {burst_n} maintenances / all Succeeded / the burst's peak"
            ),
            format!(
                "{} / {} / {} ({held_during} pods held)",
                kib(before_burst),
                kib(rss_kib(role.child.id(), "VmRSS")),
                kib(rss_kib(role.child.id(), "VmHWM"))
            ),
        );
        concurrently(burst_nodes.clone(), CREATE_IN_FLIGHT, |node| {
            let (client, name) = (client.clone(), format!("{id}-cr-m-{node}"));
            async move { undo(&client, &name, &node).await }
        })
        .await;
        let held_after = watched(port, "pods").unwrap_or(0);
        out.row(
            "cluster role: pods held / RSS after the maintenances were deleted",
            format!("{held_after} / {}", kib(rss_kib(role.child.id(), "VmRSS"))),
        );
        let gated = &node_names[nodes_n - CORDON_ROUNDS - burst_n - 1];
        let gate = GateRun {
            client: &client,
            id: &id,
            namespaces: &namespaces,
            audit: &audit,
            pid: role.child.id(),
        };
        gate.measure(gated, &mut out).await;
        stop(&mut role);

        // 100 node agents.
        let owned: Vec<String> = node_names[..agents_n].to_vec();
        let ports = free_ports(owned.len());
        // One audited identity for all: every DaemonSet pod's token is one
        // user too (one flow for the API server's fairness).
        let (agent_kubeconfig, _) =
            support::audited_identity_for(&["run", "--node", owned[0].as_str()]);
        let t = Instant::now();
        let mut agents: Vec<Agent> = owned
            .iter()
            .zip(&ports)
            .map(|(node, port)| {
                let addr = format!("127.0.0.1:{port}");
                start(
                    &bin,
                    &agent_kubeconfig,
                    &["run", "--node", node, "--metrics-address", &addr].map(String::from),
                )
            })
            .collect();
        wait_ready(&ports, Duration::from_secs(300)).await;
        for a in agents.iter_mut() {
            if let Ok(Some(status)) = a.child.try_wait() {
                panic!("a node agent exited ({status}):\n{}", a.log_text());
            }
        }
        out.row(
            &format!("node role: {agents_n} agents, start to all ready"),
            format!("{:.2} s", t.elapsed().as_secs_f64()),
        );
        let pids: Vec<u32> = agents.iter().map(|a| a.child.id()).collect();
        // /readyz is green once each watch has listed; the watches' own
        // requests and each agent's claim on its node follow within a
        // second. The idle window starts after them (it counted up to 63
        // such requests in its first second at 1000 nodes).
        nodekeeper::runtime::sleep(Duration::from_secs(2)).await;
        let audit_start = mark(&audit);
        let cpu_start: f64 = pids.iter().map(|p| support::cpu_seconds(*p)).sum();
        let idle_start = Instant::now();
        nodekeeper::runtime::sleep(idle).await; // the measurement window itself
        let window = idle_start.elapsed();
        let requests = audit_verbs_since(&audit, audit_start);
        let cpu: f64 = pids.iter().map(|p| support::cpu_seconds(*p)).sum::<f64>() - cpu_start;
        let total: usize = requests.values().sum();
        out.row(
            &format!(
                "node role: API requests in {} idle s, all {agents_n} agents",
                idle.as_secs()
            ),
            format!(
                "{} ({:.3} per second)",
                requests_text(&requests),
                total as f64 / window.as_secs_f64()
            ),
        );
        out.row(
            "node role: CPU at idle, all agents",
            format!("{:.2} % of a core", cpu * 100.0 / window.as_secs_f64()),
        );
        let mut rss: Vec<f64> = pids.iter().map(|p| rss_kib(*p, "VmRSS") as f64).collect();
        rss.sort_by(|a, b| a.total_cmp(b));
        out.row(
            "node role: RSS per agent at idle, median / max",
            format!(
                "{} / {}",
                kib(median(rss.clone()) as u64),
                kib(*rss.last().unwrap_or(&0.0) as u64)
            ),
        );

        // NodeMaintenances elsewhere in the cluster (on nodes no agent
        // runs on): what they cost the agents. A node agent watches only
        // its own node's, so 10 and 100 should cost the same: nothing.
        let elsewhere: Vec<String> = node_names[agents_n..].to_vec();
        for k in [10, 100] {
            let k = k.min(elsewhere.len());
            let audit_start = mark(&audit);
            let cpu_start: f64 = pids.iter().map(|p| support::cpu_seconds(*p)).sum();
            let names: Vec<(String, String)> = elsewhere[..k]
                .iter()
                .map(|n| (format!("{id}-x{k}-{n}"), n.clone()))
                .collect();
            let nms: Api<NodeMaintenance> = Api::all(client.clone());
            for (name, node) in &names {
                nms.create(&PostParams::default(), &maintenance(name, node))
                    .await
                    .expect("creating a NodeMaintenance elsewhere");
            }
            // The window in which the agents would see them.
            nodekeeper::runtime::sleep(ELSEWHERE_WINDOW).await;
            let requests = audit_verbs_since(&audit, audit_start);
            let cpu: f64 = pids.iter().map(|p| support::cpu_seconds(*p)).sum::<f64>() - cpu_start;
            let held = watched(ports[0], "nodemaintenances").unwrap_or(usize::MAX);
            out.row(
                &format!(
                    "node role: {k} NodeMaintenances elsewhere, per agent in {} s",
                    ELSEWHERE_WINDOW.as_secs()
                ),
                format!(
                    "{:.2} requests, {:.1} ms CPU; an agent's store holds {held} NodeMaintenances",
                    requests.values().sum::<usize>() as f64 / agents_n as f64,
                    cpu * 1000.0 / agents_n as f64,
                ),
            );
            for (name, _) in &names {
                let _ = nms.delete(name, &DeleteParams::default()).await;
            }
        }

        // 100 NodeMaintenances at once.
        let audit_start = mark(&audit);
        let burst = maintain_all(&client, &id, &owned, &selector, || {
            agents
                .iter()
                .map(|a| a.log_text())
                .collect::<Vec<_>>()
                .join("")
        })
        .await;
        let requests = audit_verbs_since(&audit, audit_start);
        let restarts =
            support::audit_count_since(&audit, audit_start.offset, "watch", "nodemaintenances");
        out.row(
            &format!("node role: {agents_n} NodeMaintenances at once, cordoned p50 / p95 / all"),
            percentiles(&burst.cordoned),
        );
        out.row(
            "node role: the same, each from its own NodeMaintenance's create, p50 / p95 / all",
            percentiles(&burst.after_own),
        );
        out.row(
            &format!("node role: the last of the {agents_n} creates returned after"),
            format!("{:.0} ms", ms(burst.last_create)),
        );
        out.row(
            &format!(
                "node role: {agents_n} NodeMaintenances at once, drained ({pods_per_node} pods each) p50 / p95 / all"
            ),
            percentiles(&burst.drained),
        );
        out.row(
            "node role: API requests for those maintenances",
            format!(
                "{} ({:.1} per node)",
                requests_text(&requests),
                requests.values().sum::<usize>() as f64 / agents_n as f64
            ),
        );
        out.row(
            "node role: NodeMaintenance watches (re)opened during those maintenances",
            restarts.to_string(),
        );
        let peak = pids.iter().map(|p| rss_kib(*p, "VmHWM")).max().unwrap_or(0);
        out.row("node role: peak RSS of any agent", kib(peak));
        for a in agents.iter_mut() {
            a.kill();
        }
        drop(agents);
        out.print();
        cleanup.run(&node_names).await;
    });
}

/// Tables printed at the end, in the order measured.
#[derive(Default)]
struct Report {
    lines: Vec<String>,
    setup: Vec<String>,
    rows: Vec<(String, String)>,
}

impl Report {
    fn line(&mut self, s: String) {
        println!("{s}");
        self.lines.push(s);
    }
    fn setup(&mut self, s: String) {
        println!("set-up: {s}");
        self.setup.push(s);
    }
    fn row(&mut self, what: &str, value: impl Into<String>) {
        let value = value.into();
        println!("{what}: {value}");
        self.rows.push((what.to_string(), value));
    }
    fn print(&self) {
        println!();
        println!("scale benchmark");
        for l in &self.lines {
            println!("{l}");
        }
        for s in &self.setup {
            println!("set-up: {s}");
        }
        println!(
            "targets: cluster role peak ≤ 48 MiB (¾ of its Deployment's 64 MiB limit); node role idle requests 0 (watches only), RSS ≤ 10 MiB"
        );
        println!("| measure | result |");
        println!("|---|---|");
        for (what, value) in &self.rows {
            println!("| {what} | {value} |");
        }
    }
}

fn kib(k: u64) -> String {
    format!("{:.1} MiB", k as f64 / 1024.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentiles(v: &[Duration]) -> String {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    if ms.is_empty() {
        return "none".into();
    }
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    format!("{:.0} / {:.0} / {:.0} ms", at(0.5), at(0.95), at(1.0))
}

/// `n` distinct free ports: all bound at once, so none is handed out twice
/// (one at a time, the kernel may give the same port again).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound address").port())
        .collect()
}

/// Start one nodekeeper; `NODEKEEPER_BENCH_LOG` sets its log filter (e.g.
/// `nodekeeper=debug` for a timeline; the logs stay in the scratch dir).
fn start(bin: &Path, kubeconfig: &Path, args: &[String]) -> Agent {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let filter = std::env::var("NODEKEEPER_BENCH_LOG").unwrap_or_else(|_| "nodekeeper=warn".into());
    Agent::start_with(bin, kubeconfig, &filter, &args)
}

/// SIGTERM and wait, so the leader lease is released for the next start.
fn stop(agent: &mut Agent) {
    agent.signal("TERM");
    agent.wait_exit(Duration::from_secs(30));
}

async fn wait_ready(ports: &[u16], limit: Duration) {
    wait_for("/readyz to answer 200", limit, || async {
        ports
            .iter()
            .all(|p| http_get(*p, "/readyz").is_some_and(|(s, _)| s.contains(" 200 ")))
            .then_some(())
    })
    .await;
}

/// How many objects of `kind` the agent's store holds (its /metrics).
fn watched(port: u16, kind: &str) -> Option<usize> {
    let prefix = format!("nodekeeper_watched_objects{{kind=\"{kind}\"}} ");
    let (_, body) = http_get(port, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Wait until the agent's store of `kind` holds at least `n` objects.
async fn wait_watched(port: u16, kind: &str, n: usize) {
    let prefix = format!("nodekeeper_watched_objects{{kind=\"{kind}\"}} ");
    wait_for(
        &format!("the agent to hold {n} {kind}"),
        Duration::from_secs(300),
        || async {
            let (_, body) = http_get(port, "/metrics")?;
            let held: usize = body
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())?;
            (held >= n).then_some(())
        },
    )
    .await;
}

/// A place in the audit log: its length and the time then.
#[derive(Clone, Copy)]
struct Mark {
    offset: u64,
    at: k8s_openapi::jiff::Timestamp,
}

fn mark(audit: &Path) -> Mark {
    Mark {
        offset: support::audit_offset_of(audit),
        at: k8s_openapi::jiff::Timestamp::now(),
    }
}

/// Distinct requests by verb that reached the API server since `from`. A
/// watch that started before (and ends within, at the server's 290 s
/// timeout) is not counted; its successor is.
fn audit_verbs_since(audit: &Path, from: Mark) -> BTreeMap<String, usize> {
    let tail = support::audit_text_since(audit, from.offset);
    let mut seen: HashMap<String, String> = HashMap::new();
    for v in tail
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t >= from.at)
        })
    {
        if let (Some(id), Some(verb)) = (v["auditID"].as_str(), v["verb"].as_str()) {
            seen.insert(id.to_string(), verb.to_string());
        }
    }
    let mut by_verb = BTreeMap::new();
    for verb in seen.into_values() {
        *by_verb.entry(verb).or_insert(0) += 1;
    }
    by_verb
}

fn requests_text(by_verb: &BTreeMap<String, usize>) -> String {
    let total: usize = by_verb.values().sum();
    if total == 0 {
        return "0 requests".into();
    }
    let parts: Vec<String> = by_verb.iter().map(|(v, n)| format!("{n} {v}")).collect();
    format!("{total} requests ({})", parts.join(", "))
}

/// Requests and CPU seconds of one process over an idle window.
async fn idle_window(audit: &Path, pid: u32, window: Duration) -> (BTreeMap<String, usize>, f64) {
    let from = mark(audit);
    let cpu = support::cpu_seconds(pid);
    nodekeeper::runtime::sleep(window).await; // the measurement window itself
    (
        audit_verbs_since(audit, from),
        support::cpu_seconds(pid) - cpu,
    )
}

/// Run `make(item)` for every item, `in_flight` at a time.
async fn concurrently<T, F, Fut>(items: Vec<T>, in_flight: usize, make: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(smol::lock::Semaphore::new(in_flight));
    let mut tasks = Vec::with_capacity(items.len());
    for item in items {
        let permit = permits.acquire_arc().await;
        let fut = make(item);
        tasks.push(nodekeeper::runtime::spawn(async move {
            fut.await;
            drop(permit);
        }));
    }
    for t in tasks {
        t.await;
    }
}

async fn create_node(client: &Client, id: &str, name: &str) {
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m5.xlarge",
                "topology.kubernetes.io/zone": "zone-a",
                GROUP_LABEL: id,
            },
        },
    }))
    .expect("a node object");
    create(Api::all(client.clone()), &node, &format!("node {name}")).await;
}

/// Create `object`, retried: thousands of creates at once may meet a busy
/// API server. One that exists already (a retry of a create that went
/// through) is done.
async fn create<K>(api: Api<K>, object: &K, what: &str)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for attempt in 0.. {
        match api.create(&PostParams::default(), object).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => return,
            Err(e) if attempt < 5 => {
                eprintln!("creating {what}: {e} (retrying)");
                nodekeeper::runtime::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("creating {what}: {e}"),
        }
    }
}

/// A pod as a Deployment would make it (labels, probes, env, resources, a
/// config map and an emptyDir), bound to `node` directly: the scheduler is
/// not what this benchmark measures, and binding 30 000 pods through it
/// would take most of the run.
async fn create_pod(client: &Client, id: &str, ns: &str, name: &str, node: &str) {
    let mut pod = app_pod(id, ns);
    pod["metadata"]["name"] = name.into();
    pod["metadata"]["namespace"] = ns.into();
    pod["spec"]["nodeName"] = node.into();
    let pod: Pod = serde_json::from_value(pod).expect("a pod object");
    let api = Api::namespaced(client.clone(), ns);
    create(api, &pod, &format!("pod {ns}/{name}")).await;
}

/// The pod every app of the benchmark runs, as its Deployment's template
/// and as the pods bound to nodes.
fn app_pod(id: &str, ns: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "labels": {
                "app.kubernetes.io/name": "app",
                "app.kubernetes.io/instance": ns,
                "pod-template-hash": "5d8f7c9b4",
                "nodekeeper.test/scale": id,
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-11-01T00:00:00Z",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8080",
            },
        },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app",
                "image": "registry.invalid/team/app:1.24.3",
                "args": ["--listen=:8080", "--log-level=info", "--config=/etc/app/config.yaml"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "LOG_FORMAT", "value": "json"},
                ],
                "ports": [{"name": "http", "containerPort": 8080}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 20},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/app"},
                    {"name": "cache", "mountPath": "/cache"},
                ],
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": "app-config"}},
                {"name": "cache", "emptyDir": {}},
            ],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
    })
}

async fn ready_nodes(client: &Client, selector: &str) -> usize {
    // From the watch cache: every node is read either way.
    let Ok(list) = Api::<Node>::all(client.clone())
        .list(&ListParams::default().match_any().labels(selector))
        .await
    else {
        return 0;
    };
    list.items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count()
}

fn maintenance(name: &str, node: &str) -> NodeMaintenance {
    NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some("bench-scale".into()),
        },
    )
}

async fn init_done<K, S>(events: &mut S)
where
    S: smol::stream::Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    while let Some(ev) = events.next().await {
        if matches!(ev, Ok(Event::InitDone)) {
            return;
        }
    }
}

/// One NodeMaintenance: (create to cordoned, create to Succeeded), each
/// seen by a watch opened before the create.
async fn maintain(client: &Client, name: &str, node: &str) -> (Duration, Duration) {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node_events = Box::pin(watcher::watcher(
        nodes,
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    ));
    let mut nm_events = Box::pin(watcher::watcher(
        nms.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    ));
    init_done(&mut node_events).await;
    init_done(&mut nm_events).await;
    let start = Instant::now();
    nms.create(&PostParams::default(), &maintenance(name, node))
        .await
        .expect("creating a NodeMaintenance");
    let cordon = async {
        while let Some(ev) = node_events.next().await {
            if let Ok(Event::Apply(n)) = ev
                && n.spec.and_then(|s| s.unschedulable) == Some(true)
            {
                return start.elapsed();
            }
        }
        panic!("the node watch ended");
    };
    let drained = async {
        while let Some(ev) = nm_events.next().await {
            if let Ok(Event::Apply(m)) = ev
                && m.phase() == Some(Phase::Succeeded)
            {
                return start.elapsed();
            }
        }
        panic!("the NodeMaintenance watch ended");
    };
    let limit = async {
        nodekeeper::runtime::sleep(Duration::from_secs(120)).await;
        panic!("NodeMaintenance {name} not cordoned and Succeeded within 120 s");
    };
    smol::future::or(smol::future::zip(cordon, drained), limit).await
}

/// What 100 NodeMaintenances at once took: each node's cordon from the
/// first create call and from its own object's create returning, when the
/// last create returned, each Succeeded from the first create call.
struct Burst {
    cordoned: Vec<Duration>,
    after_own: Vec<Duration>,
    last_create: Duration,
    drained: Vec<Duration>,
}

/// Delete a maintenance and wait until its node is schedulable again.
async fn undo(client: &Client, name: &str, node: &str) {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    nms.delete(name, &DeleteParams::default())
        .await
        .expect("deleting a NodeMaintenance");
    wait_for(
        "the maintenance removed and its node uncordoned",
        Duration::from_secs(60),
        || async {
            let gone = nms.get_opt(name).await.ok()?.is_none();
            let n = nodes.get(node).await.ok()?;
            (gone && n.spec.and_then(|s| s.unschedulable) != Some(true)).then_some(())
        },
    )
    .await;
}

/// A NodeMaintenance for every node in `owned`, all created at once: per
/// node, (create to cordoned, create to Succeeded), seen by watches opened
/// before the first create. Past its limit it says how far the
/// maintenances got and the end of the drainers' log (`log`).
async fn maintain_all(
    client: &Client,
    id: &str,
    owned: &[String],
    selector: &str,
    log: impl Fn() -> String,
) -> Burst {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let mut node_events = Box::pin(watcher::watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().labels(selector),
    ));
    let mut nm_events = Box::pin(watcher::watcher(nms.clone(), watcher::Config::default()));
    init_done(&mut node_events).await;
    init_done(&mut nm_events).await;
    let wanted: std::collections::HashSet<String> = owned.iter().cloned().collect();
    let name_of = |node: &str| format!("{id}-m-{node}");
    let start = Instant::now();
    let created_at = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
    let creates = concurrently(owned.to_vec(), CREATE_IN_FLIGHT, |node| {
        let (nms, name, created_at) = (nms.clone(), name_of(&node), created_at.clone());
        async move {
            nms.create(&PostParams::default(), &maintenance(&name, &node))
                .await
                .expect("creating a NodeMaintenance");
            if let Ok(mut c) = created_at.lock() {
                c.insert(node, start.elapsed());
            }
        }
    });
    let cordon = async {
        let mut at = HashMap::new();
        while let Some(ev) = node_events.next().await {
            if let Ok(Event::Apply(n)) = ev
                && wanted.contains(&n.name_any())
                && n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
            {
                at.entry(n.name_any()).or_insert_with(|| start.elapsed());
                if at.len() == wanted.len() {
                    return at;
                }
            }
        }
        panic!("the node watch ended");
    };
    // The creates run beside the watches: a cordon may come before the
    // last create returns.
    let cordon = async {
        let (at, ()) = smol::future::zip(cordon, creates).await;
        let created = created_at.lock().map(|c| c.clone()).unwrap_or_default();
        let after_own: Vec<Duration> = at
            .iter()
            .map(|(n, t)| t.saturating_sub(created.get(n).copied().unwrap_or_default()))
            .collect();
        let last_create = created.values().max().copied().unwrap_or_default();
        (at.into_values().collect::<Vec<_>>(), after_own, last_create)
    };
    let drained = async {
        let mut at = HashMap::new();
        while let Some(ev) = nm_events.next().await {
            if let Ok(Event::Apply(m)) = ev
                && wanted.contains(&m.spec.node_name)
                && m.phase() == Some(Phase::Succeeded)
            {
                at.entry(m.name_any()).or_insert_with(|| start.elapsed());
                if at.len() == wanted.len() {
                    return at.into_values().collect::<Vec<_>>();
                }
            }
        }
        panic!("the NodeMaintenance watch ended");
    };
    let limit = async {
        nodekeeper::runtime::sleep(Duration::from_secs(300)).await;
        let mut phases: std::collections::BTreeMap<String, usize> = Default::default();
        for m in nms
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            if m.name_any().starts_with(&format!("{id}-m-")) {
                let phase = m.phase().map_or("no status".into(), |p| format!("{p:?}"));
                *phases.entry(phase).or_default() += 1;
            }
        }
        let log = log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "{} NodeMaintenances not all cordoned and Succeeded within 300 s: {phases:?}; the drainers' last log lines:\n{}",
            owned.len(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    };
    let ((cordoned, after_own, last_create), drained) =
        smol::future::or(smol::future::zip(cordon, drained), limit).await;
    Burst {
        cordoned,
        after_own,
        last_create,
        drained,
    }
}

/// What the benchmark made, deleted at the end. A run that fails half-way
/// leaves it behind; `just cluster-down` drops the cluster's whole state.
/// A control-plane process stopped (SIGSTOP) for the benchmark and
/// continued when this is dropped, also when the benchmark panics.
struct Paused(Option<String>);

impl Paused {
    fn process(pid_file: &Path) -> Paused {
        let pid = std::fs::read_to_string(pid_file).map(|s| s.trim().to_string());
        match pid {
            Ok(pid) if signal("-STOP", &pid) => {
                println!("kube-scheduler (pid {pid}) paused for the benchmark");
                Paused(Some(pid))
            }
            _ => {
                println!(
                    "kube-scheduler not paused (no pid in {})",
                    pid_file.display()
                );
                Paused(None)
            }
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if let Some(pid) = &self.0 {
            signal("-CONT", pid);
        }
    }
}

fn signal(which: &str, pid: &str) -> bool {
    std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .is_ok_and(|s| s.success())
}

struct Cleanup {
    client: Client,
    id: String,
    namespaces: Vec<String>,
}

impl Cleanup {
    async fn run(&self, nodes: &[String]) {
        let nms: Api<NodeMaintenance> = Api::all(self.client.clone());
        if let Ok(list) = nms.list(&ListParams::default()).await {
            for m in list.items {
                if m.name_any().starts_with(&self.id) {
                    let _ = nms.delete(&m.name_any(), &DeleteParams::default()).await;
                }
            }
        }
        for ns in &self.namespaces {
            let _ = Api::<Namespace>::all(self.client.clone())
                .delete(ns, &DeleteParams::background())
                .await;
        }
        concurrently(nodes.to_vec(), CREATE_IN_FLIGHT, |n| {
            let client = self.client.clone();
            async move {
                let _ = Api::<Node>::all(client)
                    .delete(&n, &DeleteParams::background())
                    .await;
            }
        })
        .await;
        println!("cleaning up: waiting for the namespaces to go");
        let client = self.client.clone();
        wait_for(
            "the benchmark's namespaces deleted",
            Duration::from_secs(900.max(nodes.len() as u64)),
            || async {
                for ns in &self.namespaces {
                    if Api::<Namespace>::all(client.clone())
                        .get_opt(ns)
                        .await
                        .ok()?
                        .is_some()
                    {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
    }
}

/// The health gate's row: a RebootPolicy whose gate selects
/// [`GATED_DEPLOYMENTS`] Deployments while one node of it holds its slot.
struct GateRun<'a> {
    client: &'a Client,
    id: &'a str,
    namespaces: &'a [String],
    audit: &'a Path,
    /// The cluster role's process.
    pid: u32,
}

impl GateRun<'_> {
    async fn measure(&self, node: &str, out: &mut Report) {
        let t = Instant::now();
        let (client, id, namespaces) = (self.client, self.id, self.namespaces);
        concurrently((0..GATED_DEPLOYMENTS).collect(), CREATE_IN_FLIGHT, |i| {
            let (client, id) = (client.clone(), id.to_string());
            let ns = namespaces[i % namespaces.len()].clone();
            async move { create_deployment(&client, &id, &ns, i).await }
        })
        .await;
        out.setup(format!(
            "{GATED_DEPLOYMENTS} Deployments for the health gate: created in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        let policy = format!("{id}-gate");
        self.hold_a_slot(&policy, node).await;

        // The window: the peak is reset first (writing 5 to clear_refs
        // resets VmHWM), so the peak read after it is the window's own.
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5");
        let before = rss_kib(self.pid, "VmRSS");
        let from = mark(self.audit);
        let cpu = support::cpu_seconds(self.pid);
        nodekeeper::runtime::sleep(GATE_WINDOW).await; // the measurement window itself
        let cpu = support::cpu_seconds(self.pid) - cpu;
        let lists = support::audit_count_since(self.audit, from.offset, "list", "deployments");
        let requests = audit_verbs_since(self.audit, from);
        let what = format!(
            "cluster role: health gate over {GATED_DEPLOYMENTS} Deployments, a node holding its slot, {} s",
            GATE_WINDOW.as_secs()
        );
        out.row(
            &format!("{what}: requests ({lists} Deployment list pages)"),
            requests_text(&requests),
        );
        out.row(
            &format!("{what}: CPU"),
            format!(
                "{:.2} s ({:.1} % of a core)",
                cpu,
                cpu * 100.0 / GATE_WINDOW.as_secs_f64()
            ),
        );
        out.row(
            &format!("{what}: RSS before / peak in the window"),
            format!("{} / {}", kib(before), kib(rss_kib(self.pid, "VmHWM"))),
        );
        self.give_back(&policy, node).await;
    }

    /// A policy over `node` alone, gated on the Deployments, and a reboot
    /// asked of the node; no agent runs there to reboot it, so once
    /// admitted it holds its slot (`Draining`, then `Rebooting`) for as
    /// long as the policy stands.
    async fn hold_a_slot(&self, policy: &str, node: &str) {
        let (client, id) = (self.client, self.id);
        Api::<Node>::all(client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"nodekeeper.test/gated": id}}})),
            )
            .await
            .expect("labelling the gated node");
        let spec: RebootPolicySpec = serde_json::from_value(json!({
            // The pool's label too: a cluster role scoped by
            // `--node-selector` handles only policies that name its pool.
            "nodeSelector": {"matchLabels": {GROUP_LABEL: id, "nodekeeper.test/gated": id}},
            "budget": {"maxUnavailable": 1},
            "reboot": {"command": ["/bin/true"]},
            "detect": {"sentinelFile": ""},
            "gates": {"health": {"workloads": [
                {"selector": {"matchLabels": {"nodekeeper.test/gate": id}}}
            ]}},
        }))
        .expect("a policy spec");
        let created = Api::<RebootPolicy>::all(client.clone())
            .create(&PostParams::default(), &RebootPolicy::new(policy, spec))
            .await
            .expect("creating the gated RebootPolicy");
        // What the node's agent would say after looking at its host: the
        // reboot command runs there (the cluster role admits only then).
        let check = format!("{} ok", nodekeeper::decide::command_check::key(&created));
        annotate(
            client,
            node,
            nodekeeper::api::reboot::CHECK_ANNOTATION,
            Some(&check),
        )
        .await;
        // A reboot is verified by the boot ID, which kwok's nodes lack.
        set_boot(client, node, &format!("{node}-boot-1")).await;
        annotate(client, node, "nodekeeper.io/reboot-needed", Some("now")).await;
        wait_for(
            "the gated node holding its slot",
            Duration::from_secs(120),
            || async {
                let p = Api::<RebootPolicy>::all(client.clone())
                    .get(policy)
                    .await
                    .ok()?;
                let status = p.status?;
                let entry = status.nodes.iter().find(|e| e.name == node)?;
                entry.phase.holds_slot().then_some(())
            },
        )
        .await;
    }

    /// Delete the policy (its finalizer is the cluster role's, which gives
    /// the node back) and wait until nothing holds the node.
    async fn give_back(&self, policy: &str, node: &str) {
        let client = self.client;
        let _ = Api::<RebootPolicy>::all(client.clone())
            .delete(policy, &DeleteParams::default())
            .await;
        wait_for(
            "the gated node given back",
            Duration::from_secs(120),
            || async {
                let gone = Api::<RebootPolicy>::all(client.clone())
                    .get_opt(policy)
                    .await
                    .ok()?
                    .is_none();
                (gone && maintenances_on(client, node).await == 0).then_some(())
            },
        )
        .await;
        annotate(client, node, "nodekeeper.io/reboot-needed", None).await;
    }
}

/// A Deployment the health gate selects: the benchmark's app template, no
/// replicas (the gate's cost is its list, not pods).
async fn create_deployment(client: &Client, id: &str, ns: &str, i: usize) {
    let app = format!("app-{i:04}");
    let mut template = app_pod(id, ns);
    template["metadata"]["labels"] =
        json!({"app.kubernetes.io/name": app, "app.kubernetes.io/instance": ns});
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{id}-{app}"),
            "namespace": ns,
            "labels": {"nodekeeper.test/gate": id, "app.kubernetes.io/name": app},
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "template": template,
        },
    }))
    .expect("a Deployment object");
    let api = Api::namespaced(client.clone(), ns);
    create(api, &deployment, &format!("Deployment {ns}/{app}")).await;
}
