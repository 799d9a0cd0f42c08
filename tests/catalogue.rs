//! The catalogue: objects people get wrong, of every kind nodekeeper
//! reads, on a live cluster with a node agent per node and an unscoped
//! cluster role — malformed, hostile (names that would reach a URL),
//! overlapping and dangling ones, beside a few good ones they overlap.
//! Each is either refused by the API server with its field named, or
//! accepted and reported on itself within 30 s. Meanwhile an independent
//! watcher checks that no node is cordoned, tainted or taken by any of
//! them (node c needs a reboot throughout, and every node is behind the
//! UpgradePlans' version), and, with everything in place, every identity's
//! requests are counted from the audit log: at most 0.2/s beyond leases.
//!
//! Its own test binary: an unscoped cluster role acts on every object in
//! the cluster.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::runtime::Latch;
use serde_json::{Value, json};
use smol::stream::StreamExt;
use support::replace::{Cloud, install_constellation_crds};
use support::{
    GROUP_LABEL, TestEnv, audit_offset, audited_agent, block_on, install_crds, kubectl, openshift,
    requests_of,
};

/// How long an accepted object may go unreported.
const REPORTED_WITHIN: Duration = Duration::from_secs(30);
/// How long requests are counted with every object in place.
const IDLE: Duration = Duration::from_secs(60);

#[path = "catalogue/disruptions.rs"]
mod disruptions;
#[path = "catalogue/entries.rs"]
mod entries;
#[path = "catalogue/others.rs"]
mod others;

use entries::*;

/// The catalogue, for a test whose id is `id`, namespace `ns` and nodes
/// `a`, `b`, `c`.
fn catalogue(id: &str, ns: &str, nodes: &[String; 3]) -> Vec<Entry> {
    let w = World { id, ns, nodes };
    let mut all = disruptions::disruptions(&w);
    all.extend(others::others(&w));
    all
}

/// What an independent watcher saw happen to the test's nodes: cordons,
/// taints, and NodeMaintenances nobody in the test created.
#[derive(Default, Debug)]
struct Touched {
    nodes: BTreeSet<String>,
    maintenances: BTreeSet<String>,
}

fn watch_nodes(
    client: kube::Client,
    id: String,
    nodes: Vec<String>,
    ours: BTreeSet<String>,
    stop: Latch,
) -> std::thread::JoinHandle<Touched> {
    std::thread::spawn(move || {
        block_on(async move {
            let seen = Arc::new(Mutex::new(Touched::default()));
            let node_events = watcher(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().labels(&format!("{GROUP_LABEL}={id}")),
            );
            let nm_events = watcher(
                Api::<NodeMaintenance>::all(client),
                watcher::Config::default(),
            );
            let s1 = seen.clone();
            let on_nodes = async move {
                let mut events = std::pin::pin!(node_events);
                while let Some(e) = events.next().await {
                    if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = e {
                        let spec = n.spec.clone().unwrap_or_default();
                        let tainted = spec.taints.unwrap_or_default().iter().any(|t| {
                            t.key != "node.kubernetes.io/not-ready"
                                && t.key != "node.kubernetes.io/unreachable"
                        });
                        if spec.unschedulable == Some(true) || tainted {
                            let mut s = s1.lock().unwrap_or_else(|p| p.into_inner());
                            s.nodes.insert(n.name_any());
                        }
                    }
                }
            };
            let s2 = seen.clone();
            let on_nms = async move {
                let mut events = std::pin::pin!(nm_events);
                while let Some(e) = events.next().await {
                    if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = e
                        && nodes.contains(&m.spec.node_name)
                        && !ours.contains(&m.name_any())
                    {
                        let mut s = s2.lock().unwrap_or_else(|p| p.into_inner());
                        s.maintenances.insert(m.name_any());
                    }
                }
            };
            smol::future::or(smol::future::or(on_nodes, on_nms), async {
                stop.wait().await
            })
            .await;
            std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()))
        })
    })
}

/// Every object of the catalogue's kinds, as JSON, by `kind/name`.
fn objects(ns: &str) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    for (kinds, namespace) in [
        (
            "rebootpolicies,upgradeplans,nodemaintenances,nodeversions,scalinggroups,autoscalingstrategies,joiningnodes",
            None,
        ),
        ("mutexrules,mutextargets,mutexrunconfigs", Some(ns)),
    ] {
        let mut args = vec!["get", kinds, "-o", "json"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let out = kubectl(&args, None);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        for item in list["items"].as_array().into_iter().flatten() {
            let plural = match item["kind"].as_str().unwrap_or_default() {
                "RebootPolicy" => "rebootpolicies",
                "UpgradePlan" => "upgradeplans",
                "NodeMaintenance" => "nodemaintenances",
                "NodeVersion" => "nodeversions",
                "ScalingGroup" => "scalinggroups",
                "AutoscalingStrategy" => "autoscalingstrategies",
                "JoiningNode" => "joiningnodes",
                "MutexRule" => "mutexrules",
                "MutexTarget" => "mutextargets",
                "MutexRunConfig" => "mutexrunconfigs",
                _ => continue,
            };
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            all.insert(format!("{plural}/{name}"), item.clone());
        }
    }
    all
}

#[test]
fn every_bad_object_is_refused_or_reported_and_touches_no_node() {
    install_crds();
    install_constellation_crds();
    openshift::install();
    let (env, nodes) = block_on(async {
        let mut env = TestEnv::new("catalogue").await;
        let mut nodes = Vec::new();
        for which in ["a", "b", "c"] {
            let n = env.add_node(which).await;
            env.wait_node_ready(&n).await;
            let mut meta = json!({"labels": {NODE_KEY: which, VERSION_KEY: "v1"}});
            if which == "c" {
                meta["annotations"] = json!({"nodekeeper.io/reboot-needed":
                    k8s_openapi::jiff::Timestamp::now().to_string()});
            }
            Api::<Node>::all(env.client.clone())
                .patch(
                    &n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": meta })),
                )
                .await
                .expect("labelling a node");
            // A boot ID, as a kubelet reports it (reboots are verified
            // against it; without one nothing is admitted at all).
            support::machines::set_boot(&env.client, &n, &format!("boot-{which}-1")).await;
            nodes.push(n);
        }
        (env, nodes)
    });
    let nodes: [String; 3] = [nodes[0].clone(), nodes[1].clone(), nodes[2].clone()];
    let (id, ns) = (env.id.clone(), env.ns.clone());
    let entries = catalogue(&id, &ns, &nodes);
    let kinds: BTreeSet<&str> = entries.iter().map(|e| e.kind).collect();
    assert!(entries.len() >= 60, "{} objects", entries.len());
    assert_eq!(kinds.len(), 11, "every kind: {kinds:?}");

    // The processes, each as its own audited identity.
    let cloud = Cloud::new(&env, json!([]), 1.0);
    let provider = cloud.command.display().to_string();
    let mut users = Vec::new();
    let mut agents = Vec::new();
    let started = audit_offset();
    for n in &nodes {
        let (agent, user) = audited_agent(&["run", "--node", n], "nodekeeper=info,warn");
        agents.push(agent);
        users.push((format!("agent of {n}"), user));
    }
    let args = [
        "run",
        "--all-nodes",
        "--node-agents",
        "--leader-namespace",
        &ns,
        "--provider-command",
        &provider,
        "--provider-timeout",
        "3",
    ];
    let (cluster, user) = audited_agent(&args, "nodekeeper=info,warn");
    users.push(("cluster role".to_string(), user));
    block_on(support::wait_for(
        "the cluster role leading",
        Duration::from_secs(60),
        || async { cluster.log_text().contains("leading as").then_some(()) },
    ));
    // Each agent lists and watches only the NodeMaintenances naming its
    // node (the CRD's selectable spec.nodeName): what the rest of the
    // cluster holds costs it nothing — its start-up check that the CRD is
    // served included (the list its watch makes, of at most one object).
    for ((who, user), n) in users.iter().zip(&nodes) {
        let seen = block_on(support::wait_for(
            &format!("the {who}'s NodeMaintenance watch in the audit log"),
            Duration::from_secs(30),
            || async {
                let r: Vec<_> = requests_of(user, started)
                    .into_iter()
                    .filter(|r| r.resource == "nodemaintenances")
                    .collect();
                r.iter().any(|r| r.verb == "watch").then_some(r)
            },
        ));
        let selector = format!("fieldSelector=spec.nodeName%3D{n}");
        for r in &seen {
            assert!(
                r.uri.contains(&selector),
                "{who}: a NodeMaintenance request without its node's field selector: {r:?}"
            );
        }
    }
    // Every request says which process made it (the audit log's
    // userAgent): the program, its version and platform, and its role.
    let roles = nodes.iter().map(|n| format!(" node {n}"));
    for ((who, user), role) in users.iter().zip(roles.chain([" cluster".to_string()])) {
        let program = format!("nodekeeper/{} (linux/", env!("CARGO_PKG_VERSION"));
        for r in requests_of(user, started) {
            assert!(
                r.user_agent.starts_with(&program) && r.user_agent.ends_with(&role),
                "{who}: a request with User-Agent {:?}, not {program}…){role}: {r:?}",
                r.user_agent
            );
        }
    }

    let ours: BTreeSet<String> = entries
        .iter()
        .filter(|e| e.kind == "nodemaintenances")
        .map(Entry::name)
        .collect();
    let stop = Latch::default();
    let watcher = watch_nodes(
        env.client.clone(),
        id.clone(),
        nodes.to_vec(),
        ours,
        stop.clone(),
    );

    // Create every object; refusals are judged at once.
    let mut failures = Vec::new();
    let mut created: Vec<(usize, Instant)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let out = kubectl(&["create", "-f", "-"], Some(&e.object.to_string()));
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        match (&e.expect, out.status.success()) {
            (Expect::Refused(field), false) if said.contains(field) => {}
            (Expect::Refused(field), false) => failures.push(format!(
                "{}/{}: refused without naming {field}: {said}",
                e.kind,
                e.name()
            )),
            (Expect::Refused(field), true) => failures.push(format!(
                "{}/{}: accepted, though {field} is wrong",
                e.kind,
                e.name()
            )),
            (Expect::Reported(..), true) => created.push((i, Instant::now())),
            (Expect::Reported(..), false) => {
                failures.push(format!("{}/{}: refused: {said}", e.kind, e.name()))
            }
        }
    }
    let refused = entries.len() - created.len();

    // Every accepted object reports itself within its time.
    let mut pending: Vec<(usize, Instant)> = created.clone();
    let mut took: Vec<Duration> = Vec::new();
    let deadline = Instant::now() + REPORTED_WITHIN;
    while !pending.is_empty() && Instant::now() < deadline {
        let now = objects(&ns);
        pending.retain(|(i, at)| {
            let e = &entries[*i];
            let Expect::Reported(_, check) = &e.expect else {
                return false;
            };
            match now.get(&format!("{}/{}", e.kind, e.name())) {
                Some(v) if check(v) => {
                    took.push(at.elapsed());
                    false
                }
                _ => true,
            }
        });
        std::thread::sleep(Duration::from_millis(500));
    }
    let last = objects(&ns);
    for (i, _) in &pending {
        let e = &entries[*i];
        let Expect::Reported(what, _) = &e.expect else {
            continue;
        };
        let key = format!("{}/{}", e.kind, e.name());
        failures.push(format!(
            "{key}: not reported ({what}) within {} s; it shows {}",
            REPORTED_WITHIN.as_secs(),
            last.get(&key)
                .map(|v| v["status"].to_string())
                .unwrap_or_else(|| "nothing (gone)".into())
        ));
    }
    let slowest = took.iter().max().copied().unwrap_or_default();
    // The warnings that go with the new reports.
    let events = kubectl(
        &[
            "get",
            "events",
            "-A",
            "--field-selector",
            "type=Warning",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        None,
    );
    let reasons = String::from_utf8_lossy(&events.stdout).to_string();
    for reason in [
        "RebootSignalUnreadable",
        "UpgradeCommandNotRunnable",
        "NodeVersionNotFound",
        "DeploymentNotFound",
    ] {
        if !reasons.split_whitespace().any(|r| r == reason) {
            failures.push(format!("no {reason} event"));
        }
    }

    // With every object in place: each identity's requests beyond leases.
    let from = audit_offset();
    std::thread::sleep(IDLE);
    let mut rates = Vec::new();
    for (who, user) in &users {
        let requests: Vec<_> = requests_of(user, from)
            .into_iter()
            .filter(|r| r.resource != "leases")
            .collect();
        let rate = requests.len() as f64 / IDLE.as_secs_f64();
        rates.push(format!("{who}: {rate:.2}/s"));
        if rate > 0.2 {
            failures.push(format!(
                "{who} made {} requests in {} s: {:#?}",
                requests.len(),
                IDLE.as_secs(),
                requests
            ));
        }
    }
    // The count can see the cluster role: its lease renewals are there.
    let leases = requests_of(&users[3].1, from)
        .iter()
        .filter(|r| r.resource == "leases")
        .count();
    assert!(
        leases >= 10,
        "only {leases} lease requests in the audit log; the cluster role's log:\n{}",
        cluster.log_text()
    );

    stop.open();
    let touched = watcher.join().expect("the watcher");
    if !touched.nodes.is_empty() || !touched.maintenances.is_empty() {
        failures.push(format!("nodes touched: {touched:?}"));
    }
    println!(
        "catalogue: {} objects over {} kinds, {refused} refused, {} reported (slowest after {:.1} s); {}",
        entries.len(),
        kinds.len(),
        created.len(),
        slowest.as_secs_f64(),
        rates.join(", ")
    );
    let log = cluster.log_text();
    drop(agents);
    drop(cluster);
    for e in &entries {
        let name = e.name();
        let mut args = vec!["delete", e.kind, name.as_str()];
        if e.kind.starts_with("mutex") {
            args.extend(["-n", ns.as_str()]);
        }
        args.extend(["--ignore-not-found", "--wait=false"]);
        let _ = kubectl(&args, None);
    }
    assert!(
        failures.is_empty(),
        "{}\ncluster role's log:\n{log}",
        failures.join("\n")
    );
}
