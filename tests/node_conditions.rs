//! KEP-5683's Node lifecycle conditions through a maintenance, as an
//! independent watch of the Node sees them: MaintenanceInProgress and
//! DrainInProgress True before any pod goes, DrainInProgress while a PDB
//! blocks, Drained once empty, every one False when the node is given
//! back; the kubelet's Ready never touched. Once with a node agent, once
//! with the cluster role.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use nodekeeper::api::nodemaintenance::*;
use smol::stream::StreamExt;
use support::{Agent, TestEnv, block_on, install_crds, wait_for};

const LONG: Duration = Duration::from_secs(60);

/// The lifecycle conditions of a node, as `type=status/reason`.
fn lifecycle(node: &Node) -> BTreeMap<String, String> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| LIFECYCLE_CONDITIONS.contains(&c.type_.as_str()))
        .map(|c| {
            (
                c.type_.clone(),
                format!("{}/{}", c.status, c.reason.as_deref().unwrap_or_default()),
            )
        })
        .collect()
}

/// One observation of the node by the test's own watch.
#[derive(Debug, Clone)]
struct Seen {
    conditions: BTreeMap<String, String>,
    cordoned: bool,
    ready: bool,
    /// Pods bound to the node at the revision of this observation.
    pods: usize,
}

async fn run(role: &str) {
    install_crds();
    let mut env = TestEnv::new(&format!("kep-{role}")).await;
    // Both pods on a (b comes after them), so a has pods to drain.
    let a = env.add_node("a").await;
    env.wait_node_ready(&a).await;
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    deploys
        .create(&PostParams::default(), &env.deployment("web", 2))
        .await
        .expect("deploy");
    env.wait_running("app=web", 2).await;
    let b = env.add_node("b").await;
    env.wait_node_ready(&b).await;
    // No eviction allowed until the test says so: the drain stays in progress.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.ns);
    pdbs.create(&PostParams::default(), &env.pdb("web", "web", 2))
        .await
        .expect("pdb");

    // The independent watch: every change of node a.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Seen>::new()));
    let watch = {
        let seen = seen.clone();
        let client = env.client.clone();
        let (ns, a) = (env.ns.clone(), a.clone());
        smol::spawn(async_compat::Compat::new(async move {
            let nodes = watcher(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().fields(&format!("metadata.name={a}")),
            );
            let mut nodes = std::pin::pin!(nodes);
            let pods: Api<Pod> = Api::namespaced(client, &ns);
            while let Some(ev) = nodes.next().await {
                let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
                    continue;
                };
                // The pods as they were at this very revision of the node,
                // not as they are by the time this list is sent: the test
                // relaxes the PDB as soon as it sees the drain, and a list
                // sent after that would count evictions that came later.
                let at = kube::api::ListParams::default()
                    .fields(&format!("spec.nodeName={a}"))
                    .at(n.metadata.resource_version.as_deref().unwrap_or("0"))
                    .matching(kube::api::VersionMatch::Exact);
                let on_node = pods
                    .list(&at)
                    .await
                    .map(|l| {
                        l.items
                            .iter()
                            .filter(|p| p.metadata.deletion_timestamp.is_none())
                            .count()
                    })
                    .unwrap_or(usize::MAX);
                let s = Seen {
                    conditions: lifecycle(&n),
                    cordoned: n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
                    ready: n
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True"),
                    pods: on_node,
                };
                if let Ok(mut v) = seen.lock() {
                    v.push(s);
                }
            }
        }))
    };

    let mut agent = if role == "node" {
        Agent::start(&["run", "--node", &a])
    } else {
        support::machines::cluster_role(&env, &[])
    };
    let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
    let name = env.maintain("m", &a, "firmware").await;

    let nodes: Api<Node> = Api::all(env.client.clone());
    let held = "True/AdminRequested".to_string();
    // Blocked by the PDB: in maintenance and draining, not drained.
    let blocked = wait_for("DrainInProgress while the PDB blocks", LONG, || async {
        let c = lifecycle(&nodes.get(&a).await.ok()?);
        (c.get(DRAIN_IN_PROGRESS).map(String::as_str) == Some("True/DrainStarted")).then_some(c)
    })
    .await;
    assert_eq!(blocked.get(MAINTENANCE_IN_PROGRESS), Some(&held));
    assert_eq!(
        blocked.get(DRAINED).map(String::as_str),
        Some("False/DrainStarted")
    );
    let message = nodes
        .get(&a)
        .await
        .expect("node")
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == MAINTENANCE_IN_PROGRESS)
        .and_then(|c| c.message)
        .unwrap_or_default();
    assert_eq!(
        message,
        format!("NodeMaintenance {name} of an administrator holds the node: firmware")
    );

    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"minAvailable": 0}})),
    )
    .await
    .expect("relax pdb");
    wait_for("Drained", LONG, || async {
        let c = lifecycle(&nodes.get(&a).await.ok()?);
        (c.get(DRAINED).map(String::as_str) == Some("True/DrainCompleted")).then_some(())
    })
    .await;
    nms.delete(&name, &DeleteParams::default())
        .await
        .expect("delete nm");
    wait_for("every lifecycle condition False", LONG, || async {
        let n = nodes.get(&a).await.ok()?;
        let c = lifecycle(&n);
        let uncordoned = n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true);
        (uncordoned && c.len() == 3 && c.values().all(|v| v.starts_with("False/"))).then_some(())
    })
    .await;
    // The watch has seen the end too.
    wait_for("the watch to see the end", LONG, || async {
        let seen = seen.lock().ok()?;
        let last = seen.last()?;
        (last.conditions.len() == 3 && last.conditions.values().all(|v| v.starts_with("False/")))
            .then_some(())
    })
    .await;
    agent.signal("TERM");
    assert!(agent.wait_exit(Duration::from_secs(15)).success());
    drop(watch);

    let seen = seen.lock().map(|v| v.clone()).unwrap_or_default();
    let label = |s: &Seen, t: &str| s.conditions.get(t).cloned().unwrap_or_default();
    // Before any pod went, the node said it was in maintenance and draining.
    let first_held = seen
        .iter()
        .position(|s| label(s, MAINTENANCE_IN_PROGRESS) == held)
        .unwrap_or_else(|| panic!("MaintenanceInProgress never seen: {seen:#?}"));
    assert_eq!(
        label(&seen[first_held], DRAIN_IN_PROGRESS),
        "True/DrainStarted",
        "{seen:#?}"
    );
    assert_eq!(
        seen[first_held].pods, 2,
        "published before the drain: {seen:#?}"
    );
    // Drained only once the node was empty, and only while still cordoned.
    for s in seen
        .iter()
        .filter(|s| label(s, DRAINED) == "True/DrainCompleted")
    {
        assert_eq!(s.pods, 0, "Drained with pods on the node: {seen:#?}");
        assert!(s.cordoned, "Drained on an uncordoned node: {seen:#?}");
        assert_eq!(label(s, DRAIN_IN_PROGRESS), "False/DrainCompleted");
    }
    // Never in maintenance on an uncordoned node after it began; the
    // kubelet's Ready untouched throughout.
    for s in &seen[first_held..] {
        assert!(s.ready, "Ready lost: {seen:#?}");
        if label(s, MAINTENANCE_IN_PROGRESS) == held {
            assert!(s.cordoned, "in maintenance but schedulable: {seen:#?}");
        }
    }
    let last = seen.last().expect("observations");
    for t in [MAINTENANCE_IN_PROGRESS, DRAIN_IN_PROGRESS, DRAINED] {
        assert!(
            label(last, t).starts_with("False/"),
            "{t} at the end: {seen:#?}"
        );
    }
    assert!(
        !agent.log_text().contains("forbidden"),
        "{}",
        agent.log_text()
    );
}

#[test]
fn a_node_agent_publishes_the_lifecycle_conditions_of_its_maintenance() {
    block_on(run("node"));
}

#[test]
fn the_cluster_role_publishes_the_lifecycle_conditions_of_a_maintenance() {
    block_on(run("cluster"));
}

/// `MaintenancePlanned`, from the cluster role's pass, as an independent
/// watch of the group's nodes sees it: three nodes need a reboot, one at
/// a time; the ones waiting for their turn say `MaintenancePlanned=True`
/// naming the policy before the maintenance of their reboot begins; a
/// rebooted node says it no more; a paused node stays planned until its
/// policy is deleted, then says `False` too.
#[test]
fn nodes_waiting_for_their_reboot_say_maintenance_planned() {
    use nodekeeper::api::reboot::{RebootPhase, RebootPolicy};
    use support::machines::{
        Fleet, annotate, create_policy, nodes as fleet_nodes, settled, wait_phase,
    };
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("kep-planned").await;
        let names = fleet_nodes(&mut env, 3).await;
        let fleet = Fleet::new(env.client.clone(), None);
        (env, names, fleet)
    });
    let fluo = "flatcar-linux-update.v1.flatcar-linux.net/";
    // Per node, every distinct (MaintenancePlanned, MaintenanceInProgress)
    // it was seen with, in order, as `status/reason|message`.
    type Timeline = BTreeMap<String, Vec<(String, String)>>;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Timeline::new()));
    let watch = {
        let (seen, client, id) = (seen.clone(), env.client.clone(), env.id.clone());
        smol::spawn(async_compat::Compat::new(async move {
            let nodes = watcher(
                Api::<Node>::all(client),
                watcher::Config::default().labels(&format!("{}={id}", support::GROUP_LABEL)),
            );
            let mut nodes = std::pin::pin!(nodes);
            while let Some(ev) = nodes.next().await {
                let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
                    continue;
                };
                let said = |t: &str| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .find(|c| c.type_ == t)
                        .map(|c| {
                            format!(
                                "{}/{}|{}",
                                c.status,
                                c.reason.as_deref().unwrap_or_default(),
                                c.message.as_deref().unwrap_or_default()
                            )
                        })
                        .unwrap_or_default()
                };
                let now = (said(MAINTENANCE_PLANNED), said(MAINTENANCE_IN_PROGRESS));
                if let Ok(mut seen) = seen.lock() {
                    let line = seen
                        .entry(n.metadata.name.clone().unwrap_or_default())
                        .or_default();
                    if line.last() != Some(&now) {
                        line.push(now);
                    }
                }
            }
        }))
    };
    block_on(async {
        for n in &names {
            annotate(
                &env.client,
                n,
                &format!("{fluo}reboot-needed"),
                Some("true"),
            )
            .await;
        }
        annotate(
            &env.client,
            &names[2],
            &format!("{fluo}reboot-paused"),
            Some("true"),
        )
        .await;
    });
    let policy = block_on(create_policy(
        &env,
        &fleet,
        serde_json::json!({"budget": {"maxUnavailable": 1}}),
    ));
    let cluster = support::machines::cluster_role(&env, &[]);
    let rebooted = &names[..2];
    fleet.serve(rebooted, LONG * 2, || {
        block_on(settled(&env.client, rebooted))
    });
    let planned_of = |node: &str| -> Option<String> {
        let n = block_on(Api::<Node>::all(env.client.clone()).get(node)).ok()?;
        n.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == MAINTENANCE_PLANNED)
            .map(|c| {
                format!(
                    "{}/{}|{}",
                    c.status,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default()
                )
            })
    };
    // The paused node waits, planned, naming the policy and why.
    block_on(wait_phase(
        &env.client,
        &policy,
        &names[2],
        RebootPhase::Waiting,
    ));
    let paused = block_on(wait_for("the paused node planned", LONG, || async {
        planned_of(&names[2]).filter(|p| p.starts_with("True/RebootRequested|"))
    }));
    assert_eq!(
        paused,
        format!(
            "True/RebootRequested|NodeMaintenance planned: RebootPolicy {policy} needs a reboot (Waiting: Paused)"
        )
    );
    // Rebooted nodes are planned no more.
    for n in rebooted {
        block_on(wait_for(
            "a rebooted node planned no more",
            LONG,
            || async {
                planned_of(n)
                    .is_none_or(|p| p.starts_with("False/NotPlanned|"))
                    .then_some(())
            },
        ));
    }
    // The policy goes: its paused node is planned no more.
    block_on(
        Api::<RebootPolicy>::all(env.client.clone()).delete(&policy, &DeleteParams::default()),
    )
    .expect("delete policy");
    block_on(wait_for(
        "the paused node planned no more",
        LONG,
        || async { planned_of(&names[2]).filter(|p| p.starts_with("False/NotPlanned|")) },
    ));
    let mut cluster = cluster;
    cluster.signal("TERM");
    assert!(cluster.wait_exit(Duration::from_secs(15)).success());
    drop(watch);

    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    // One node waited for the other's reboot: it was seen planned, naming
    // the policy, before its own maintenance began.
    let waited = rebooted.iter().filter(|n| {
        let line = seen.get(n.as_str()).cloned().unwrap_or_default();
        let planned = line.iter().position(|(p, _)| {
            p.starts_with(&format!(
                "True/RebootRequested|NodeMaintenance planned: RebootPolicy {policy} needs a reboot"
            ))
        });
        let began = line
            .iter()
            .position(|(_, m)| m.starts_with("True/RebootRequested|"));
        matches!((planned, began), (Some(p), Some(b)) if p < b)
    });
    assert!(waited.count() >= 1, "{seen:#?}\n{}", cluster.log_text());
    // Each rebooted node's maintenance was seen, and once it ended the
    // node was never planned again.
    for n in rebooted {
        let line = seen.get(n.as_str()).cloned().unwrap_or_default();
        let ended = line
            .iter()
            .rposition(|(_, m)| m.starts_with("True/RebootRequested|"))
            .unwrap_or_else(|| panic!("{n}'s maintenance never seen: {seen:#?}"));
        assert!(
            line[ended + 1..]
                .iter()
                .all(|(p, _)| !p.starts_with("True/")),
            "{n} planned again after its reboot: {seen:#?}"
        );
    }
    // The paused node never began.
    let line = seen.get(names[2].as_str()).cloned().unwrap_or_default();
    assert!(
        line.iter().all(|(_, m)| !m.starts_with("True/")),
        "{seen:#?}"
    );
    assert!(
        !cluster.log_text().contains("forbidden"),
        "{}",
        cluster.log_text()
    );
}

/// Nodes someone else holds outside any NodeMaintenance, as an independent
/// watch sees them: one `kubectl drain --report-node-conditions` drains
/// (cordoned, `DrainInProgress=True` reason `KubectlDrainStarted`), one
/// shutting down (`GracefulNodeShutdownInProgress=True`), one a person
/// cordoned. All need a reboot, the budget allows every node: the free
/// node is rebooted, the held ones wait `HeldByOther` with no
/// NodeMaintenance, are never uncordoned, and the drainer's condition is
/// never rewritten; nodekeeper's own condition (`MaintenancePlanned`,
/// the reboot waiting) sits beside the other writer's. A fifth node has
/// Karpenter's `karpenter.sh/do-not-disrupt: "true"`, a sixth a pod with
/// it: both wait `DoNotDisrupt`, naming the node's or the pod's. Once the
/// person uncordons their node and the annotations are removed, all three
/// are rebooted, and only then.
#[test]
fn nodes_someone_else_holds_are_never_taken_nor_uncordoned() {
    use nodekeeper::api::reboot::{RebootPhase, RebootPolicy};
    use serde_json::json;
    use support::machines::{Fleet, annotate, create_policy, nodes as fleet_nodes, settled};
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("kep-foreign").await;
        let names = fleet_nodes(&mut env, 6).await;
        let fleet = Fleet::new(env.client.clone(), None);
        (env, names, fleet)
    });
    let (kubectl, shutdown, by_hand, free) = (&names[0], &names[1], &names[2], &names[3]);
    let (do_not_disrupt, pod_opted_out) = (&names[4], &names[5]);
    const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
    block_on(env.bound_pod("keep", pod_opted_out, |p| {
        let a = p.metadata.annotations.get_or_insert_default();
        a.insert(DO_NOT_DISRUPT.into(), "true".into());
    }));
    let nodes: Api<Node> = Api::all(env.client.clone());
    let condition = |type_: &str, reason: &str| {
        json!({"status": {"conditions": [{
            "type": type_, "status": "True", "reason": reason,
            "message": "written by another tool", "lastTransitionTime": "2026-11-28T00:00:00Z",
        }]}})
    };
    block_on(async {
        let cordon = json!({"spec": {"unschedulable": true}});
        let pp = PatchParams::default();
        for (n, patch) in [(kubectl, &cordon), (by_hand, &cordon)] {
            nodes
                .patch(n, &pp, &Patch::Merge(patch))
                .await
                .expect("cordon");
        }
        for (n, type_, reason) in [
            (kubectl, DRAIN_IN_PROGRESS, "KubectlDrainStarted"),
            (
                shutdown,
                "GracefulNodeShutdownInProgress",
                "ShutdownInProgress",
            ),
        ] {
            nodes
                .patch_status(n, &pp, &Patch::Strategic(condition(type_, reason)))
                .await
                .expect("write a condition as another tool");
        }
    });
    // The independent watch: every NodeMaintenance named for a node, and
    // every (cordoned, DrainInProgress) a node was seen with.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;
    let seen: Seen = Default::default();
    let watch_nodes = {
        let (seen, client, id) = (seen.clone(), env.client.clone(), env.id.clone());
        smol::spawn(async_compat::Compat::new(async move {
            let wc = watcher::Config::default().labels(&format!("{}={id}", support::GROUP_LABEL));
            let mut events = std::pin::pin!(watcher(Api::<Node>::all(client), wc));
            while let Some(ev) = events.next().await {
                let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
                    continue;
                };
                let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                let drain = lifecycle(&n)
                    .get(DRAIN_IN_PROGRESS)
                    .cloned()
                    .unwrap_or_default();
                let line = format!("cordoned={cordoned} drain={drain}");
                if let Ok(mut seen) = seen.lock() {
                    seen.push((n.metadata.name.clone().unwrap_or_default(), line));
                }
            }
        }))
    };
    let watch_nms = {
        let (seen, client) = (seen.clone(), env.client.clone());
        smol::spawn(async_compat::Compat::new(async move {
            let wc = watcher::Config::default();
            let mut events = std::pin::pin!(watcher(Api::<NodeMaintenance>::all(client), wc));
            while let Some(ev) = events.next().await {
                let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = ev else {
                    continue;
                };
                if let Ok(mut seen) = seen.lock() {
                    seen.push((m.spec.node_name.clone(), "maintenance".into()));
                }
            }
        }))
    };
    let fluo = "flatcar-linux-update.v1.flatcar-linux.net/reboot-needed";
    block_on(async {
        annotate(&env.client, do_not_disrupt, DO_NOT_DISRUPT, Some("true")).await;
        for n in &names {
            annotate(&env.client, n, fluo, Some("true")).await;
        }
    });
    let policy = block_on(create_policy(
        &env,
        &fleet,
        json!({"budget": {"maxUnavailable": "100%"}}),
    ));
    let mut cluster = support::machines::cluster_role(&env, &[]);
    let policies: Api<RebootPolicy> = Api::all(env.client.clone());
    let waits = |node: &str, reason: &str| {
        block_on(wait_for(
            &format!("{node} waiting, reason {reason}"),
            LONG,
            || async {
                let p = policies.get(&policy).await.ok()?;
                let e = p.entry(node)?;
                (e.phase == RebootPhase::Waiting && e.reason.as_deref() == Some(reason))
                    .then(|| e.message.clone().unwrap_or_default())
            },
        ))
    };
    let held_says = |node: &str| waits(node, "HeldByOther");
    fleet.serve(std::slice::from_ref(free), LONG * 2, || {
        block_on(settled(&env.client, std::slice::from_ref(free)))
    });
    assert!(held_says(kubectl).contains("reason KubectlDrainStarted"));
    assert!(held_says(shutdown).contains("shutting down"));
    assert!(held_says(by_hand).contains("cordoned by someone else"));
    let says = waits(do_not_disrupt, "DoNotDisrupt");
    assert!(
        says.contains("karpenter.sh/do-not-disrupt=true on the node"),
        "{says}"
    );
    let says = waits(pod_opted_out, "DoNotDisrupt");
    let pod_says = format!("pod {}/keep has karpenter.sh/do-not-disrupt=true", env.ns);
    assert_eq!(says, pod_says);
    // The person gives their node back and the annotations are removed:
    // now all three are rebooted.
    if let Ok(mut seen) = seen.lock() {
        for n in [do_not_disrupt, pod_opted_out] {
            seen.push((n.clone(), "released".into()));
        }
    }
    block_on(async {
        let uncordon = json!({"spec": {"unschedulable": null}});
        let pp = PatchParams::default();
        nodes
            .patch(by_hand, &pp, &Patch::Merge(&uncordon))
            .await
            .expect("uncordon by hand");
        annotate(&env.client, do_not_disrupt, DO_NOT_DISRUPT, None).await;
        let unmark = json!({"metadata": {"annotations": {DO_NOT_DISRUPT: null}}});
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns)
            .patch("keep", &pp, &Patch::Merge(&unmark))
            .await
            .expect("remove the pod's do-not-disrupt");
    });
    let released = [
        by_hand.clone(),
        do_not_disrupt.clone(),
        pod_opted_out.clone(),
    ];
    fleet.serve(&released, LONG * 2, || {
        block_on(settled(&env.client, &released))
    });
    cluster.signal("TERM");
    assert!(cluster.wait_exit(Duration::from_secs(15)).success());
    drop((watch_nodes, watch_nms));

    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let of = |node: &str| -> Vec<String> {
        seen.iter()
            .filter(|(n, _)| n == node)
            .map(|(_, l)| l.clone())
            .collect()
    };
    for held in [kubectl, shutdown] {
        assert!(
            !of(held).contains(&"maintenance".to_string()),
            "{held} taken: {seen:#?}"
        );
    }
    // Under do-not-disrupt: taken only after the annotation was removed.
    for n in [do_not_disrupt, pod_opted_out] {
        let lines = of(n);
        let released_at = lines.iter().position(|l| l == "released");
        let first_taken = lines.iter().position(|l| l == "maintenance");
        assert!(
            released_at.is_some() && first_taken > released_at,
            "{n}: {lines:#?}"
        );
    }
    assert!(of(free).contains(&"maintenance".to_string()), "{seen:#?}");
    // The drainer's node: cordoned and its condition the drainer's, always.
    let lines = of(kubectl);
    assert!(!lines.is_empty());
    assert!(
        lines
            .iter()
            .all(|l| l == "cordoned=true drain=True/KubectlDrainStarted"),
        "{lines:#?}"
    );
    // The node shutting down: the other writer's condition and
    // nodekeeper's, side by side, each its writer's.
    let n = block_on(nodes.get(shutdown)).expect("get node");
    let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
    let of_type = |t: &str| {
        let c = conditions.iter().find(|c| c.type_ == t);
        c.map(|c| format!("{}/{}", c.status, c.reason.as_deref().unwrap_or_default()))
    };
    let other = of_type("GracefulNodeShutdownInProgress");
    assert_eq!(
        other.as_deref(),
        Some("True/ShutdownInProgress"),
        "{conditions:#?}"
    );
    let ours = of_type(MAINTENANCE_PLANNED);
    assert_eq!(
        ours.as_deref(),
        Some("True/RebootRequested"),
        "{conditions:#?}"
    );
    assert!(
        !cluster.log_text().contains("forbidden"),
        "{}",
        cluster.log_text()
    );
}
