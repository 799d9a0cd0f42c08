//! The OpenShift node-upgrade mutex operator's flow, served by nodekeeper,
//! on the real control plane with OpenShift's MachineConfigPool and
//! ClusterVersion CRDs (minimal schemas) and a simulated machine-config
//! operator (tests/support/openshift.rs). Its own test binary: the flow
//! runs in an unscoped cluster role, which must not share the cluster with
//! other tests' pool-scoped ones.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodekeeper::api::mutex::*;
use serde_json::json;
use support::openshift::{self, Mco};
use support::{Agent, GROUP_LABEL, TestEnv, block_on, wait_for};

const OLD: &str = "4.15.3";
const NEW: &str = "4.16.2";

async fn create<K>(client: &Client, ns: &str, obj: serde_json::Value)
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let o: K = serde_json::from_value(obj).expect("an object");
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", K::kind(&())));
}

async fn run_status(client: &Client, ns: &str, name: &str) -> MutexRunConfigStatus {
    Api::<MutexRunConfig>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()
        .and_then(|r| r.status)
        .unwrap_or_default()
}

fn cond<'a>(s: &'a MutexRunConfigStatus, t: &str) -> Option<&'a MutexCondition> {
    s.conditions.iter().find(|c| c.type_ == t)
}

/// The flow runs in an unscoped cluster role, which acts on every run
/// config in the cluster: the tests take turns.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn nodes_take_turns_through_the_canary_pool_and_everything_is_restored() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    support::install_crds();
    openshift::install();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("mutex").await;
        let mut names = Vec::new();
        for i in 0..3 {
            names.push(env.add_node(&format!("w{i}")).await);
        }
        for n in &names {
            env.wait_node_ready(n).await;
            Api::<Node>::all(env.client.clone())
                .patch(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"labels": {WORKER_LABEL: "", VERSION_LABEL: OLD}}}),
                    ),
                )
                .await
                .expect("labelling a worker");
        }
        (env, names)
    });
    let (c, ns, id) = (env.client.clone(), env.ns.clone(), env.id.clone());
    let (target_pool, canary) = (format!("{id}-workers"), format!("{id}-canary"));
    let group = json!({GROUP_LABEL: id, WORKER_LABEL: ""});
    // The cluster runs the old version; the MCO upgrades a node a second
    // after a pool first lets it (nodekeeper pauses the target pool well
    // within that once the new version is asked for).
    block_on(openshift::set_cluster_version(&c, OLD));
    let mut mco = Mco::start(c.clone(), &id, Duration::from_secs(1));
    let cluster = Agent::start(&[
        "run",
        "--all-nodes",
        "--node-agents",
        "--leader-namespace",
        &ns,
    ]);
    block_on(async {
        openshift::create_pool(&c, &target_pool, json!({"matchLabels": group})).await;
        openshift::create_pool(
            &c,
            &canary,
            json!({"matchLabels": group, "matchExpressions": [{"key": "isCanary", "operator": "Exists"}]}),
        )
        .await;
        let job = json!({"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.invalid/check:1",
                "env": [{"name": "FROM_TEMPLATE", "value": "kept"}]}]}}});
        create::<MutexRule>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexRule",
            "metadata": {"name": "storage"},
            "spec": {"type": "kubernetes", "jobName": "storage-check", "jobNamespace": ns,
                     "jobSpec": job, "cleanupJobSpec": job}}),
        )
        .await;
        create::<MutexTarget>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexTarget",
            "metadata": {"name": "workers"},
            "spec": {"machineConfigPools": [target_pool]}}),
        )
        .await;
        create::<MutexRunConfig>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexRunConfig",
            "metadata": {"name": "run"},
            "spec": {"canary": {"name": canary}, "mutexRules": [{"name": "storage"}],
                     "mutexTargets": [{"name": "workers"}]}}),
        )
        .await;
        // No upgrade yet: nothing is touched.
        wait_for("the run checked", Duration::from_secs(30), || async {
            let s = run_status(&c, &ns, "run").await;
            cond(&s, "UpgradeAvailable")
                .filter(|c| c.status == "False")
                .map(|_| ())
        })
        .await;
        assert_eq!(
            openshift::pool_spec(&c, &target_pool).await["paused"],
            false
        );
        // The cluster asks for 4.16.2.
        openshift::set_cluster_version(&c, NEW).await;
    });
    let done = block_on(wait_for(
        "the run done",
        Duration::from_secs(120),
        || async {
            let s = run_status(&c, &ns, "run").await;
            s.progress.filter(|p| p.step == "Done")
        },
    ));
    // The run is done once nodekeeper saw the pools restored; give the
    // MCO's own poll a moment to see it too.
    block_on(wait_for(
        "the MCO to see the target pool unpaused",
        Duration::from_secs(10),
        || async {
            let seen = mco.pools_seen.lock().unwrap().clone();
            let last = seen.iter().rev().find(|s| s.0 == target_pool).map(|s| s.1);
            (last == Some(false) && seen.iter().any(|s| s.0 == target_pool && s.1)).then_some(())
        },
    ));
    mco.stop();
    let context = format!(
        "progress: {done:?}\nmco: {:?}\ncluster role log:\n{}",
        mco.upgraded.lock().unwrap(),
        cluster.log_text()
    );

    // Node by node, in order, each only after its Jobs (from the MCO's
    // own record and the Jobs' pods).
    let upgraded: Vec<String> = mco
        .upgraded
        .lock()
        .unwrap()
        .iter()
        .map(|u| u.0.clone())
        .collect();
    assert_eq!(upgraded, names, "{context}");
    // The target pool stayed paused until the end, then unpaused.
    let seen = mco.pools_seen.lock().unwrap().clone();
    let target_states: Vec<bool> = seen
        .iter()
        .filter(|s| s.0 == target_pool)
        .map(|s| s.1)
        .collect();
    assert_eq!(target_states, [false, true, false], "{seen:?}\n{context}");
    block_on(async {
        let nodes: Api<Node> = Api::all(c.clone());
        for n in &names {
            let node = nodes.get(n).await.expect("node");
            let labels = node.metadata.labels.unwrap_or_default();
            assert_eq!(labels.get(VERSION_LABEL).map(String::as_str), Some(NEW));
            assert!(
                !labels.keys().any(|k| k.starts_with(RULE_LABEL_PREFIX)),
                "{n}: {labels:?}"
            );
        }
        let spec = openshift::pool_spec(&c, &target_pool).await;
        assert_eq!(spec["paused"], false);
        assert_eq!(
            spec["nodeSelector"]["matchExpressions"],
            json!([]),
            "{spec}"
        );
        let spec = openshift::pool_spec(&c, &canary).await;
        assert_eq!(
            spec["nodeSelector"]["matchExpressions"],
            json!([{"key": "isCanary", "operator": "Exists"}]),
            "restored as it was: {spec}"
        );
        // One rule Job and one cleanup Job per node, each off its node,
        // the template's env kept and ours appended.
        let jobs = Api::<Job>::namespaced(c.clone(), &ns)
            .list(&ListParams::default())
            .await
            .expect("jobs")
            .items;
        assert_eq!(jobs.len(), 6, "{context}");
        let pods = Api::<Pod>::namespaced(c.clone(), &ns)
            .list(&ListParams::default().labels("batch.kubernetes.io/job-name"))
            .await
            .expect("pods")
            .items;
        for pod in &pods {
            let spec = pod.spec.clone().unwrap_or_default();
            let env: Vec<(String, String)> = spec.containers[0]
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|e| (e.name, e.value.unwrap_or_default()))
                .collect();
            let node = env
                .iter()
                .find(|e| e.0 == "NODE_NAME")
                .map(|e| e.1.clone())
                .expect("NODE_NAME");
            assert!(
                env.contains(&("FROM_TEMPLATE".into(), "kept".into())),
                "{env:?}"
            );
            assert!(
                env.contains(&("MUTEX_RULE".into(), "storage".into())),
                "{env:?}"
            );
            assert_ne!(spec.node_name.as_deref(), Some(node.as_str()));
        }
        let s = run_status(&c, &ns, "run").await;
        for (t, want) in [
            ("ConfigValidated", "True"),
            ("UpgradeChecked", "True"),
            ("JobRun", "True"),
            ("NodeUpgrade", "True"),
            ("UpgradeAvailable", "False"),
        ] {
            assert_eq!(
                cond(&s, t).map(|c| c.status.as_str()),
                Some(want),
                "{t}: {s:?}"
            );
        }
        assert!(cond(&s, "JobRun").is_some_and(|c| c.message.contains("Node is 3 of 3")));
    });

    // Validation: a run naming a missing rule, target or canary pool says
    // which, and touches nothing.
    block_on(async {
        for (name, spec, needle) in [
            (
                "no-rule",
                json!({"canary": {"name": canary}, "mutexRules": [{"name": "nope"}], "mutexTargets": [{"name": "workers"}]}),
                "MutexRule",
            ),
            (
                "no-target",
                json!({"canary": {"name": canary}, "mutexRules": [{"name": "storage"}], "mutexTargets": [{"name": "nope"}]}),
                "MutexTarget",
            ),
            (
                "no-canary",
                json!({"canary": {"name": "nope"}, "mutexRules": [{"name": "storage"}], "mutexTargets": [{"name": "workers"}]}),
                "canary MachineConfigPool",
            ),
        ] {
            create::<MutexRunConfig>(
                &c,
                &ns,
                json!({
                "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexRunConfig",
                "metadata": {"name": name}, "spec": spec}),
            )
            .await;
            let msg = wait_for(name, Duration::from_secs(30), || async {
                let s = run_status(&c, &ns, name).await;
                cond(&s, "ConfigValidated")
                    .filter(|c| c.status == "False" && c.reason == "FetchFailed")
                    .map(|c| c.message.clone())
            })
            .await;
            assert!(
                msg.contains(needle) && msg.contains("not found"),
                "{name}: {msg}"
            );
        }
        create::<MutexTarget>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexTarget",
            "metadata": {"name": "missing-pool"},
            "spec": {"machineConfigPools": ["nope"]}}),
        )
        .await;
        let st = wait_for(
            "the target's conditions",
            Duration::from_secs(30),
            || async {
                Api::<MutexTarget>::namespaced(c.clone(), &ns)
                    .get("missing-pool")
                    .await
                    .ok()
                    .and_then(|t| t.status)
                    .filter(|s| !s.conditions.is_empty())
            },
        )
        .await;
        assert!(st.nodes.is_empty());
        assert!(
            st.conditions
                .iter()
                .all(|c| c.status == "False" && c.reason == "MachineConfigPoolFetchFailed"),
            "{st:?}"
        );
        assert_eq!(
            openshift::pool_spec(&c, &target_pool).await["paused"],
            false
        );
    });
    drop(cluster);
}

/// Regression: refusals were pruned unless an UpgradePlan's status named
/// their Job, so a rule Job the API server refused (its namespace does not
/// exist) was created again on every pass instead of failing the run.
/// Counted from the audit log: asked for once, and the run fails.
#[test]
fn a_rule_job_the_api_server_refuses_fails_the_run_and_is_asked_for_once() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    support::install_crds();
    openshift::install();
    let env = block_on(async {
        let mut env = TestEnv::new("mutex-refused").await;
        let n = env.add_node("w0").await;
        env.wait_node_ready(&n).await;
        Api::<Node>::all(env.client.clone())
            .patch(
                &n,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {WORKER_LABEL: "", VERSION_LABEL: OLD}}}),
                ),
            )
            .await
            .expect("labelling a worker");
        env
    });
    let (c, ns, id) = (env.client.clone(), env.ns.clone(), env.id.clone());
    let (target_pool, canary) = (format!("{id}-workers"), format!("{id}-canary"));
    let group = json!({GROUP_LABEL: id, WORKER_LABEL: ""});
    block_on(openshift::set_cluster_version(&c, OLD));
    let args = [
        "run",
        "--all-nodes",
        "--node-agents",
        "--leader-namespace",
        &ns,
    ];
    let from = support::audit_offset();
    let (cluster, user) = support::audited_agent(&args, "nodekeeper=debug,warn");
    block_on(async {
        openshift::create_pool(&c, &target_pool, json!({"matchLabels": group})).await;
        openshift::create_pool(
            &c,
            &canary,
            json!({"matchLabels": group, "matchExpressions": [{"key": "isCanary", "operator": "Exists"}]}),
        )
        .await;
        let job = json!({"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "registry.invalid/check:1"}]}}});
        create::<MutexRule>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexRule",
            "metadata": {"name": "storage"},
            "spec": {"type": "kubernetes", "jobName": "storage-check",
                     "jobNamespace": format!("{id}-missing"),
                     "jobSpec": job, "cleanupJobSpec": job}}),
        )
        .await;
        create::<MutexTarget>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexTarget",
            "metadata": {"name": "workers"},
            "spec": {"machineConfigPools": [target_pool]}}),
        )
        .await;
        create::<MutexRunConfig>(
            &c,
            &ns,
            json!({
            "apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": "MutexRunConfig",
            "metadata": {"name": "run"},
            "spec": {"canary": {"name": canary}, "mutexRules": [{"name": "storage"}],
                     "mutexTargets": [{"name": "workers"}]}}),
        )
        .await;
        wait_for("the run checked", Duration::from_secs(30), || async {
            let s = run_status(&c, &ns, "run").await;
            cond(&s, "UpgradeAvailable").map(|_| ())
        })
        .await;
        openshift::set_cluster_version(&c, NEW).await;
        let msg = wait_for(
            "the run failing its Job",
            Duration::from_secs(60),
            || async {
                let s = run_status(&c, &ns, "run").await;
                cond(&s, "JobRun")
                    .filter(|c| c.status == "False")
                    .map(|c| c.message.clone())
            },
        )
        .await;
        assert!(msg.contains("could not be created"), "{msg}");
        // Passes go on (the pools, the run's own writes); none asks again.
        nodekeeper::runtime::sleep(Duration::from_secs(5)).await;
    });
    let creates = support::requests_of(&user, from)
        .into_iter()
        .filter(|r| r.verb == "create" && r.resource == "jobs")
        .count();
    assert_eq!(
        creates,
        1,
        "the refused Job was asked for {creates} times; cluster role log:\n{}",
        cluster.log_text()
    );
    block_on(openshift::set_cluster_version(&c, OLD));
    drop(cluster);
}
