//! An idle cluster role costs nothing but its lease: one unscoped cluster
//! role with every kind present — two NodeVersions and two
//! AutoscalingStrategies, three overlapping RebootPolicies, two
//! UpgradePlans, a MutexRunConfig, and one invalid object of each kind —
//! is left alone for 60 s while its API requests are counted from the audit
//! log (as an audited identity) and its provider calls from the simulated
//! cloud's own log. Its own test binary: an unscoped cluster role acts on
//! every object in the cluster.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::replace::{Cloud, install_constellation_crds};
use support::{
    GROUP_LABEL, TestEnv, apply, audit_offset, audited_agent, block_on, install_crds, kubectl,
    openshift, requests_of, wait_for,
};

const IDLE: Duration = Duration::from_secs(60);
/// The label the UpgradePlan puts on the nodes it is done with.
const UPGRADED: &str = "nodekeeper.test/upgraded";

#[test]
fn an_idle_cluster_role_with_every_kind_and_bad_objects_makes_only_its_lease_requests() {
    install_crds();
    install_constellation_crds();
    openshift::install();
    let (env, nodes) = block_on(async {
        let mut env = TestEnv::new("idle").await;
        let mut nodes = Vec::new();
        for i in 0..3 {
            let n = env.add_node(&format!("n{i}")).await;
            env.wait_node_ready(&n).await;
            Api::<Node>::all(env.client.clone())
                .patch(
                    &n,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"labels": {"nodekeeper.test/version": "v2"}}}),
                    ),
                )
                .await
                .expect("labelling a node");
            nodes.push(n);
        }
        (env, nodes)
    });
    let id = env.id.clone();
    let ns = env.ns.clone();
    let group = json!({ "matchLabels": { GROUP_LABEL: id } });
    let cloud = Cloud::new(&env, json!([]), 1.0);
    let mut cleanup: Vec<(&str, String)> = Vec::new();
    let mut named = |kind: &'static str, suffix: &str| {
        let name = format!("{id}-{suffix}");
        cleanup.push((kind, name.clone()));
        name
    };
    // Three overlapping RebootPolicies, one with a window in a time zone
    // that does not exist. Two features mark the nodes (where-features-
    // meet.md, findings 2 and 6): the governing policy soft-taints the
    // node that waits for its reboot (paused), and the plan below labels
    // every node it is done with; a settled world writes no node at all.
    let marks = json!({"preferNoScheduleWhileWaiting": true});
    for (suffix, extra) in [
        ("rp-a", marks.clone()),
        (
            "rp-b",
            json!({"budget": {"maxUnavailable": 2}, "preferNoScheduleWhileWaiting": true}),
        ),
        (
            "rp-bad",
            json!({"windows": [{"days": ["Mon"], "start": "01:00", "end": "02:00", "timeZone": "Mars/Olympus"}]}),
        ),
    ] {
        let mut spec = json!({"nodeSelector": group, "reboot": {"command": ["/bin/true"]}});
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        apply(
            &json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "RebootPolicy",
            "metadata": {"name": named("rebootpolicy", suffix)}, "spec": spec}),
        );
    }
    let rp3 = named("rebootpolicy", "rp-c");
    apply(
        &json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "RebootPolicy",
        "metadata": {"name": rp3}, "spec": {"nodeSelector": group, "reboot": {"command": ["/bin/true"]},
                     "preferNoScheduleWhileWaiting": marks["preferNoScheduleWhileWaiting"]}}),
    );
    // The node that waits: its reboot is needed and paused by a person.
    let waiting = nodes[1].clone();
    let patch = json!({"metadata": {"annotations": {
        "nodekeeper.io/reboot-needed": "now", "nodekeeper.io/reboot-paused": "true"}}});
    block_on(Api::<Node>::all(env.client.clone()).patch(
        &waiting,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    ))
    .expect("a reboot needed, paused");
    // Two UpgradePlans (every node already at v2), one invalid.
    apply(
        &json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": named("upgradeplan", "up-a")},
        "spec": {"nodeSelector": group, "version": "v2",
                 "versionFrom": {"source": "Label", "key": "nodekeeper.test/version"},
                 "nodeLabels": {"after": {UPGRADED: "v2"}},
                 "strategy": {"command": ["/bin/true"]}}}),
    );
    apply(
        &json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": named("upgradeplan", "up-bad")},
        "spec": {"nodeSelector": group, "version": "v2",
                 "versionFrom": {"source": "Label", "key": "nodekeeper.test/version"},
                 "windows": [{"days": ["Mon"], "start": "01:00", "end": "02:00", "timeZone": "Nowhere/Atlantis"}],
                 "strategy": {"command": ["/bin/true"]}}}),
    );
    // The mutex operator's kinds: a run whose rule and target exist, and a
    // rule, target and run that are each invalid.
    let job = json!({"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "check"}]}}});
    let mutex = |kind: &str, name: &str, spec: Value| {
        json!({"apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": kind,
               "metadata": {"name": name, "namespace": ns}, "spec": spec})
    };
    apply(&mutex(
        "MutexRule",
        "rule",
        json!({"type": "kubernetes", "jobName": "check",
        "jobNamespace": ns, "jobSpec": job, "cleanupJobSpec": job}),
    ));
    apply(&mutex(
        "MutexRule",
        "rule-bad",
        json!({"type": "kubernetes", "jobName": "",
        "jobNamespace": ns, "jobSpec": job, "cleanupJobSpec": job}),
    ));
    apply(&mutex(
        "MutexTarget",
        "target",
        json!({"machineConfigPools": []}),
    ));
    apply(&mutex(
        "MutexTarget",
        "target-bad",
        json!({"machineConfigPools": ["no-such-pool"]}),
    ));
    apply(&mutex(
        "MutexRunConfig",
        "run",
        json!({"canary": {"name": "no-such-pool"},
        "mutexRules": [{"name": "rule"}], "mutexTargets": [{"name": "target"}]}),
    ));
    apply(&mutex(
        "MutexRunConfig",
        "run-bad",
        json!({"canary": {"name": "no-such-pool"},
        "mutexRules": [{"name": "missing"}], "mutexTargets": [{"name": "target"}]}),
    ));
    // Constellation's kinds: two NodeVersions (one governing the nodes, one
    // nothing), two AutoscalingStrategies (one whose Deployment does not
    // exist, one with no name), a ScalingGroup naming a missing
    // NodeVersion, a JoiningNode for a node that never comes.
    let cs = |kind: &str, name: String, spec: Value| {
        json!({"apiVersion": "update.edgeless.systems/v1alpha1", "kind": kind,
               "metadata": {"name": name, "labels": {GROUP_LABEL: id}}, "spec": spec})
    };
    apply(&cs(
        "NodeVersion",
        named("nodeversion", "nv-a"),
        json!({"image": "img-1", "nodeSelector": group}),
    ));
    apply(&cs(
        "NodeVersion",
        named("nodeversion", "nv-b"),
        json!({"image": "img-1", "nodeSelector": {"matchLabels": {"nodekeeper.test/nowhere": "x"}}}),
    ));
    apply(&cs(
        "AutoscalingStrategy",
        named("autoscalingstrategy", "as-a"),
        json!({"enabled": true, "deploymentName": "no-such-autoscaler", "deploymentNamespace": ns}),
    ));
    apply(&cs(
        "AutoscalingStrategy",
        named("autoscalingstrategy", "as-bad"),
        // Names the schema refuses cannot be stored any more; a strategy
        // whose Deployment's namespace does not exist can.
        json!({"enabled": true, "deploymentName": "autoscaler", "deploymentNamespace": "no-such-namespace"}),
    ));
    apply(&cs(
        "ScalingGroup",
        named("scalinggroup", "sg-bad"),
        json!({"nodeImage": "no-such-nodeversion", "groupId": "g", "autoscalerGroupName": "g",
               "nodeGroupName": "g", "role": "Worker", "min": 1, "max": 2}),
    ));
    apply(&cs(
        "JoiningNode",
        named("joiningnode", "jn-bad"),
        json!({"name": format!("{id}-never"), "componentsreference": "c"}),
    ));
    // A NodeMaintenance that fails at once (an invalid drain option).
    let nm = named("nodemaintenance", "nm-bad");
    apply(
        &json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": nm, "annotations": {"nodekeeper.io/drain-timeout-seconds": "-5"}},
        "spec": {"nodeName": nodes[0], "reason": "idle test"}}),
    );

    let provider = cloud.command.display().to_string();
    let args = [
        "run",
        "--all-nodes",
        // No node agents: the cluster role drains (and fails the bad
        // NodeMaintenance) itself.
        "--leader-namespace",
        &ns,
        "--provider-command",
        &provider,
        "--provider-timeout",
        "3",
    ];
    let (agent, user) = audited_agent(&args, "nodekeeper=debug,warn");
    // Settled: every policy, plan and NodeVersion has its status, and the
    // bad NodeMaintenance failed.
    block_on(async {
        let limit = Duration::from_secs(60);
        for (kind, name) in [
            ("rebootpolicy", rp3.clone()),
            ("upgradeplan", format!("{id}-up-a")),
            ("nodeversion", format!("{id}-nv-a")),
            ("nodeversion", format!("{id}-nv-b")),
            ("mutexrunconfig", "run".to_string()),
        ] {
            wait_for(&format!("{kind} {name} decided"), limit, || async {
                let mut args = vec!["get", kind, name.as_str(), "-o", "jsonpath={.status}"];
                if kind.starts_with("mutex") {
                    args.extend(["-n", ns.as_str()]);
                }
                let out = kubectl(&args, None);
                (out.status.success() && !out.stdout.is_empty()).then_some(())
            })
            .await;
        }
        wait_for("the bad NodeMaintenance Failed", limit, || async {
            let out = kubectl(
                &[
                    "get",
                    "nodemaintenance",
                    &nm,
                    "-o",
                    "jsonpath={.status.phase}",
                ],
                None,
            );
            (String::from_utf8_lossy(&out.stdout) == "Failed").then_some(())
        })
        .await;
        // Both features' marks on the nodes.
        wait_for("the nodes marked by both features", limit, || async {
            let api = Api::<Node>::all(env.client.clone());
            for n in &nodes {
                let node = api.get(n).await.ok()?;
                node.labels().get(UPGRADED).filter(|v| *v == "v2")?;
                let tainted = node
                    .spec
                    .and_then(|s| s.taints)
                    .unwrap_or_default()
                    .iter()
                    .any(|t| t.key == "nodekeeper.io/waiting");
                if tainted != (*n == waiting) {
                    return None;
                }
            }
            Some(())
        })
        .await;
        // Let the first backoffs and the ReconcileFailed events of the bad
        // objects pass (5 s, then 10 s).
        nodekeeper::runtime::sleep(Duration::from_secs(20)).await;
    });
    let from = audit_offset();
    let calls_before = cloud.calls().len();
    let cpu_before = support::cpu_seconds(agent.child.id());
    std::thread::sleep(IDLE);
    let cpu = support::cpu_seconds(agent.child.id()) - cpu_before;
    let (leases, requests): (Vec<_>, Vec<_>) = requests_of(&user, from)
        .into_iter()
        .partition(|r| r.resource == "leases");
    // The count can see this identity: its lease renewals are there.
    assert!(
        leases.len() >= 10,
        "only {} lease requests of {user} in the audit log",
        leases.len()
    );
    // Each renewal is one update of the lease as last written, as
    // client-go's fast path: a read first doubled the renewal's round
    // trips, and under a burst at 5 000 nodes the leader missed its
    // deadline and stepped down.
    let reads: Vec<_> = leases.iter().filter(|r| r.verb != "update").collect();
    assert!(
        reads.is_empty(),
        "lease requests other than renewals while leading: {reads:?}"
    );
    let node_writes: Vec<_> = requests
        .iter()
        .filter(|r| {
            r.resource.starts_with("nodes") && matches!(r.verb.as_str(), "patch" | "update")
        })
        .collect();
    let calls = cloud.calls().len() - calls_before;
    let log = agent.log_text();
    let per_second = requests.len() as f64 / IDLE.as_secs_f64();
    println!(
        "idle cluster role: {} requests beyond its lease in {} s ({per_second:.2}/s), {calls} provider calls, {cpu:.2} CPU seconds ({:.4} cores)",
        requests.len(),
        IDLE.as_secs(),
        cpu / IDLE.as_secs_f64()
    );
    // No busy loop: a spin costs a core; idle is a few lease renewals.
    assert!(
        cpu / IDLE.as_secs_f64() < 0.05,
        "the idle cluster role used {cpu:.2} CPU seconds in {} s",
        IDLE.as_secs()
    );
    assert!(
        per_second <= 0.2,
        "{} requests beyond the lease in {} s: {:#?}\nlog:\n{log}",
        requests.len(),
        IDLE.as_secs(),
        requests
    );
    println!(
        "idle cluster role: {} node writes over {} nodes marked by two features in {} s ({:.2} per node per minute)",
        node_writes.len(),
        nodes.len(),
        IDLE.as_secs(),
        node_writes.len() as f64 / nodes.len() as f64 / (IDLE.as_secs_f64() / 60.0)
    );
    assert!(
        node_writes.is_empty(),
        "a settled world's nodes were written: {node_writes:#?}\nlog:\n{log}"
    );
    assert!(
        calls <= 1,
        "{calls} provider calls in {} s: {:?}",
        IDLE.as_secs(),
        cloud.calls()
    );
    drop(agent);
    for (kind, name) in &cleanup {
        let _ = kubectl(
            &["delete", kind, name, "--ignore-not-found", "--wait=false"],
            None,
        );
    }
}
