//! Proof that the test control plane is real: each test exercises behaviour
//! that only a live kube-apiserver with its controller-manager, scheduler and
//! kwok provides, and would fail against a mock.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use kube::api::{DeleteParams, EvictParams, PostParams};
use kube::{Api, ResourceExt};
use support::{TestEnv, block_on, wait_for};

const LONG: Duration = Duration::from_secs(60);

fn running(pods: &[Pod]) -> usize {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

#[test]
fn kwok_nodes_become_ready() {
    block_on(async {
        let mut env = TestEnv::new("ready").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
    })
}

#[test]
fn deployment_pods_are_scheduled_and_running_on_kwok_nodes() {
    block_on(async {
        let mut env = TestEnv::new("deploy").await;
        let nodes = [env.add_node("a").await, env.add_node("b").await];
        for n in &nodes {
            env.wait_node_ready(n).await;
        }
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("web", 4))
            .await
            .expect("create deployment");
        let pods = wait_for("4 running web pods", LONG, || async {
            let pods = env.pods("app=web").await;
            (running(&pods) == 4).then_some(pods)
        })
        .await;
        for p in pods {
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            assert!(
                nodes.contains(&node),
                "pod {} landed on {node:?}, not on this test's nodes",
                p.metadata.name.unwrap_or_default()
            );
        }
    })
}

#[test]
fn deleted_replicaset_pod_is_recreated() {
    block_on(async {
        let mut env = TestEnv::new("recreate").await;
        let a = env.add_node("a").await;
        // Ready first: a pod the scheduler found unschedulable (the new
        // node not Ready yet) may wait there for minutes if the event
        // that frees it is missed (once: 60 s with no pod Running).
        env.wait_node_ready(&a).await;
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("web", 2))
            .await
            .expect("create deployment");
        let pods = wait_for("2 running pods", LONG, || async {
            let pods = env.pods("app=web").await;
            (running(&pods) == 2).then_some(pods)
        })
        .await;
        let victim = pods[0].clone();
        assert!(
            victim
                .owner_references()
                .iter()
                .any(|o| o.kind == "ReplicaSet"),
            "a Deployment's pod is owned by a ReplicaSet"
        );
        let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        api.delete(&victim.name_any(), &DeleteParams::default())
            .await
            .expect("delete pod");
        wait_for("a replacement pod Running", LONG, || async {
            let pods = env.pods("app=web").await;
            let replaced = pods.iter().all(|p| p.uid() != victim.uid());
            (replaced && running(&pods) == 2).then_some(())
        })
        .await;
        let rss: Api<ReplicaSet> = Api::namespaced(env.client.clone(), &env.ns);
        assert_eq!(
            rss.list(&Default::default())
                .await
                .expect("list rs")
                .items
                .len(),
            1
        );
    })
}

#[test]
fn pdb_status_is_computed_by_the_controller_manager() {
    block_on(async {
        let mut env = TestEnv::new("pdbstatus").await;
        let a = env.add_node("a").await;
        // Ready first: a pod the scheduler found unschedulable (the new
        // node not Ready yet) may wait there for minutes if the event
        // that frees it is missed (once: 60 s with no pod Running).
        env.wait_node_ready(&a).await;
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("web", 3))
            .await
            .expect("create deployment");
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.ns);
        pdbs.create(&PostParams::default(), &env.pdb("web", "web", 1))
            .await
            .expect("create pdb");
        wait_for(
            "disruptionsAllowed = 2 (3 healthy, minAvailable 1)",
            LONG,
            || async {
                let st = pdbs.get("web").await.ok()?.status?;
                (st.disruptions_allowed == Some(2) && st.current_healthy == Some(3)).then_some(())
            },
        )
        .await;
    })
}

#[test]
fn eviction_that_violates_a_pdb_is_refused_with_429() {
    block_on(async {
        let mut env = TestEnv::new("evict429").await;
        let a = env.add_node("a").await;
        // Ready first: a pod the scheduler found unschedulable (the new
        // node not Ready yet) may wait there for minutes if the event
        // that frees it is missed (once: 60 s with no pod Running).
        env.wait_node_ready(&a).await;
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("db", 2))
            .await
            .expect("create deployment");
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.ns);
        pdbs.create(&PostParams::default(), &env.pdb("db", "db", 2))
            .await
            .expect("create pdb");
        let pods = wait_for("2 running pods and a computed PDB", LONG, || async {
            let pods = env.pods("app=db").await;
            let st = pdbs.get("db").await.ok()?.status?;
            (running(&pods) == 2
                && st.current_healthy == Some(2)
                && st.observed_generation.is_some())
            .then_some(pods)
        })
        .await;
        let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let err = api
            .evict(&pods[0].name_any(), &EvictParams::default())
            .await
            .expect_err("eviction must be refused");
        match err {
            kube::Error::Api(status) => {
                assert_eq!(status.code, 429, "{status:?}");
                assert!(
                    status.message.contains("disruption budget"),
                    "{}",
                    status.message
                );
            }
            other => panic!("expected a 429 from the API server, got {other}"),
        }
        // The type exists so the body matches what kubectl sends.
        let _ = Eviction::default();
    })
}

/// A running pod marked not Ready by someone else (the node lifecycle
/// controller does, for a pod bound to a node it still thinks NotReady)
/// is reported Ready again, as a kubelet's status manager reports it:
/// kwok's own stages never look at a Running pod again (our stage in
/// tests/controlplane/cluster.sh). Without it, pods that landed on a node
/// just back from a simulated reboot stayed not Ready for good.
#[test]
fn a_running_pod_marked_not_ready_is_reported_ready_again() {
    use kube::api::{Patch, PatchParams};
    block_on(async {
        let mut env = TestEnv::new("ready-again").await;
        let node = env.add_node("a").await;
        env.wait_node_ready(&node).await;
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("web", 1))
            .await
            .expect("create deployment");
        let ready = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        let pod = wait_for("a Ready web pod", LONG, || async {
            let pods = env.pods("app=web").await;
            pods.into_iter()
                .find(|p| running(std::slice::from_ref(p)) == 1 && ready(p))
        })
        .await;
        let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        // What MarkPodsNotReady sends (k8s.io/kubernetes
        // pkg/controller/util/node/controller_utils.go).
        let patch = serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "NodeNotReady"},
        ]}});
        let marked = api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .expect("marking the pod not Ready");
        assert!(!ready(&marked), "the mark did not take");
        wait_for("the pod Ready again", LONG, || async {
            let p = api.get(&pod.name_any()).await.ok()?;
            ready(&p).then_some(())
        })
        .await;
    })
}
