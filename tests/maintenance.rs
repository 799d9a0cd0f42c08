//! NodeMaintenance end to end on the real control plane: agents run as
//! processes (node mode unless stated), and each test checks one behaviour
//! through the API, as `kubectl` would show it.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod, TopologySpreadConstraint, Volume};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::*;
use support::{Agent, TestEnv, block_on, install_crds, kubectl, run_cli, wait_for};

const LONG: Duration = Duration::from_secs(60);

/// A test world: nodes (Ready), CRDs installed, one node-mode agent per node.
struct World {
    env: TestEnv,
    nodes: Vec<String>,
    agents: Vec<Agent>,
}

async fn world(name: &str, nodes: &[&str]) -> World {
    install_crds();
    let mut env = TestEnv::new(name).await;
    let mut names = Vec::new();
    for n in nodes {
        names.push(env.add_node(n).await);
    }
    for n in &names {
        env.wait_node_ready(n).await;
    }
    World {
        env,
        nodes: names,
        agents: Vec::new(),
    }
}

impl World {
    fn start_agents(&mut self) {
        for n in self.nodes.clone() {
            self.agents
                .push(Agent::start(&["run", "--node", &n, "--drain-timeout", "3"]));
        }
    }

    /// One cluster-mode agent for this world's nodes (selected by label),
    /// leader lease in the test's namespace.
    fn start_cluster_agent(&self) -> Agent {
        let selector = format!("{}={}", support::GROUP_LABEL, self.env.id);
        Agent::start(&[
            "run",
            "--all-nodes",
            "--node-selector",
            &selector,
            "--leader-namespace",
            &self.env.ns,
            "--drain-timeout",
            "3",
        ])
    }

    fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.env.client.clone())
    }

    fn node_api(&self) -> Api<Node> {
        Api::all(self.env.client.clone())
    }

    async fn maintain(&self, name: &str, node: &str) -> NodeMaintenance {
        self.maintain_annotated(name, node, &[]).await
    }

    /// A NodeMaintenance carrying these annotations (drain options).
    async fn maintain_annotated(
        &self,
        name: &str,
        node: &str,
        annotations: &[(&str, &str)],
    ) -> NodeMaintenance {
        let mut nm = NodeMaintenance::new(
            name,
            NodeMaintenanceSpec {
                node_name: node.into(),
                reason: Some("test".into()),
            },
        );
        if !annotations.is_empty() {
            nm.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        self.nms()
            .create(&PostParams::default(), &nm)
            .await
            .expect("creating NodeMaintenance")
    }

    async fn wait_phase(&self, name: &str, phase: Phase) -> NodeMaintenance {
        wait_for(
            &format!("NodeMaintenance {name} {phase:?}"),
            LONG,
            || async {
                let nm = self.nms().get_opt(name).await.ok().flatten()?;
                (nm.phase() == Some(phase)).then_some(nm)
            },
        )
        .await
    }

    async fn node(&self, name: &str) -> Node {
        self.node_api().get(name).await.expect("reading node")
    }

    /// Create a Deployment and wait for its pods to run.
    async fn deploy(&self, name: &str, replicas: i32) -> Vec<Pod> {
        let api: Api<Deployment> = Api::namespaced(self.env.client.clone(), &self.env.ns);
        api.create(&PostParams::default(), &self.env.deployment(name, replicas))
            .await
            .expect("create deployment");
        self.wait_running(&format!("app={name}"), replicas as usize)
            .await
    }

    async fn wait_running(&self, selector: &str, n: usize) -> Vec<Pod> {
        self.env.wait_running(selector, n).await
    }

    async fn pdb(&self, name: &str, app: &str, min_available: i32) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.env.client.clone(), &self.env.ns);
        let pdb = self.env.pdb(name, app, min_available);
        api.create(&PostParams::default(), &pdb)
            .await
            .expect("create pdb");
        wait_for("PDB status", LONG, || async {
            let st = api.get(name).await.ok()?.status?;
            (st.observed_generation.is_some() && st.expected_pods.unwrap_or(0) > 0).then_some(())
        })
        .await;
    }

    async fn relax_pdb(&self, name: &str) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.env.client.clone(), &self.env.ns);
        let patch = serde_json::json!({"spec": {"minAvailable": 0}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("relax pdb");
    }

    async fn pods_on(&self, node: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.env.client.clone(), &self.env.ns);
        api.list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .expect("list pods")
            .items
    }

    fn nm_name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.env.id)
    }
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key).cloned())
}

async fn events_for(env: &TestEnv, name: &str, reason: &str) -> usize {
    let api: Api<CoreEvent> = Api::all(env.client.clone());
    let evs = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("list events");
    evs.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(support::event_count)
        .sum()
}

/// Wait until at least `n` events of `reason` exist for `name`, then assert
/// that exactly `n` do. The agent publishes an event after the status write
/// a test waits for, so counting at once would race it.
async fn expect_events(env: &TestEnv, name: &str, reason: &str, n: usize) {
    let seen = wait_for(
        &format!("{n} {reason} event(s) for {name}"),
        LONG,
        || async {
            let count = events_for(env, name, reason).await;
            (count >= n).then_some(count)
        },
    )
    .await;
    assert_eq!(seen, n, "{reason} events for {name}");
}

#[test]
fn deployment_pods_are_evicted_and_recreated_on_other_nodes() {
    block_on(async {
        let mut w = world("evict", &["a"]).await;
        let old = w.deploy("web", 3).await;
        let b = w.env.add_node("b").await;
        w.env.wait_node_ready(&b).await;
        w.nodes.push(b.clone());
        w.start_agents();
        let a = w.nodes[0].clone();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        let nm = w.wait_phase(&name, Phase::Succeeded).await;
        let st = nm.status.clone().unwrap_or_default();
        assert_eq!(st.drain_progress, Some(100));
        assert_eq!(st.pending_pods, Some(vec![]));
        assert!(nm.has_finalizer(), "finalizer {FINALIZER}");
        assert_eq!(
            nm.owner_references().first().map(|o| o.kind.as_str()),
            Some("Node")
        );

        let node = w.node(&a).await;
        assert!(unschedulable(&node), "cordoned");
        // NMO's taints exactly, as its own tests compare them: key and
        // effect, nothing else (no timeAdded, no value).
        let taints = serde_json::to_value(
            node.spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        )
        .expect("taints serialize");
        for key in [UNSCHEDULABLE_TAINT, DRAIN_TAINT] {
            let exact = serde_json::json!({"key": key, "effect": "NoSchedule"});
            assert!(
                taints.as_array().is_some_and(|ts| ts.contains(&exact)),
                "node {a} carries {exact} exactly: {taints}"
            );
        }
        assert_eq!(
            label(&node, EXCLUDE_REMEDIATION_LABEL).as_deref(),
            Some("true")
        );

        let leases: Api<Lease> = Api::namespaced(w.env.client.clone(), LEASE_NAMESPACE);
        let lease = leases
            .get(&lease_name(&a))
            .await
            .expect("the medik8s lease exists");
        let spec = lease.spec.unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some(LEASE_HOLDER));
        assert_eq!(spec.lease_duration_seconds, Some(LEASE_SECONDS));

        let new = w.wait_running("app=web", 3).await;
        for p in &new {
            assert_eq!(
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                Some(b.as_str()),
                "recreated on the other node"
            );
            assert!(old.iter().all(|o| o.uid() != p.uid()));
        }
        expect_events(&w.env, &name, "BeginMaintenance", 1).await;
        expect_events(&w.env, &name, "SucceedMaintenance", 1).await;
    })
}

#[test]
fn daemonset_pods_are_left_alone() {
    block_on(async {
        let mut w = world("ds", &["a"]).await;
        let (selector, template) = w.env.template("agent");
        let ds = DaemonSet {
            metadata: ObjectMeta {
                name: Some("agent".into()),
                ..Default::default()
            },
            spec: DaemonSetSpec {
                selector,
                template,
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<DaemonSet> = Api::namespaced(w.env.client.clone(), &w.env.ns);
        api.create(&PostParams::default(), &ds)
            .await
            .expect("create daemonset");
        let before = w.wait_running("app=agent", 1).await;
        w.start_agents();
        let name = w.nm_name("m");
        w.maintain(&name, &w.nodes[0].clone()).await;
        let nm = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(nm.status.and_then(|s| s.eviction_pods), Some(0));
        let after = w.wait_running("app=agent", 1).await;
        assert_eq!(
            before[0].uid(),
            after[0].uid(),
            "the DaemonSet pod was not touched"
        );
    })
}

/// A pod created directly on the node (no scheduler), as the kubelet does.
async fn bound_pod(w: &World, name: &str, node: &str, f: impl FnOnce(&mut Pod)) -> Pod {
    w.env.bound_pod(name, node, f).await
}

#[test]
fn mirror_pods_are_left_alone() {
    block_on(async {
        let mut w = world("mirror", &["a"]).await;
        let a = w.nodes[0].clone();
        let node = w.node(&a).await;
        let mirror = bound_pod(&w, "static", &a, |p| {
            p.metadata.annotations = Some(
                [(
                    nodekeeper::decide::drain::MIRROR_ANNOTATION.to_string(),
                    "hash".to_string(),
                )]
                .into(),
            );
            p.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: a.clone(),
                uid: node.uid().unwrap_or_default(),
                controller: Some(true),
                ..Default::default()
            }]);
        })
        .await;
        w.start_agents();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        let nm = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(nm.status.and_then(|s| s.total_pods), Some(1));
        let still = w.pods_on(&a).await;
        assert_eq!(still.len(), 1);
        assert_eq!(still[0].uid(), mirror.uid());
        assert!(still[0].metadata.deletion_timestamp.is_none());
    })
}

#[test]
fn a_pod_stuck_terminating_leaves_the_agent_idle() {
    block_on(stuck_terminating_leaves_nodekeeper_idle("stuck", false))
}

#[test]
fn a_pod_stuck_terminating_leaves_the_cluster_role_idle() {
    block_on(stuck_terminating_leaves_nodekeeper_idle("stuck-cr", true))
}

/// A pod held by a finalizer stays Terminating after its eviction. Once
/// its grace + 30 s had passed, the drain requeued the node at 0 ms for as
/// long as the pod stayed: 0.19 cores (debug build) with no log line. The
/// node agent drains, or (`cluster`) the cluster role without agents.
async fn stuck_terminating_leaves_nodekeeper_idle(prefix: &str, cluster: bool) {
    const HOLD: &str = "nodekeeper.test/hold";
    let mut w = world(prefix, &["a"]).await;
    let a = w.nodes[0].clone();
    let pod = bound_pod(&w, "held", &a, |p| {
        p.metadata.finalizers = Some(vec![HOLD.into()]);
        if let Some(spec) = p.spec.as_mut() {
            spec.termination_grace_period_seconds = Some(0);
        }
    })
    .await;
    let (pid, who, _cluster_agent) = if cluster {
        let agent = w.start_cluster_agent();
        (agent.child.id(), "by the cluster role", Some(agent))
    } else {
        w.start_agents();
        (w.agents[0].child.id(), "by the node agent", None)
    };
    let name = w.nm_name("m");
    w.maintain(&name, &a).await;
    let pods: Api<Pod> = Api::namespaced(w.env.client.clone(), &w.env.ns);
    let evicted = wait_for("the pod is Terminating", LONG, || async {
        pods.get_opt(&pod.name_any())
            .await
            .ok()
            .flatten()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    // Past its retry time (grace 0 + 30 s), then 5 s of the process's CPU.
    let since = evicted
        .metadata
        .deletion_timestamp
        .map(|t| t.0)
        .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    let past = since
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(32))
        .unwrap_or(since);
    let wait = past.duration_since(k8s_openapi::jiff::Timestamp::now());
    smol::Timer::after(Duration::try_from(wait).unwrap_or_default()).await;
    let used = support::cores_used(
        pid,
        Duration::from_secs(5),
        &format!("{who} beside a pod stuck Terminating"),
    )
    .await;
    // Let it go before asserting: the namespace's deletion waits on it.
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove the finalizer");
    assert!(
        used < 0.05,
        "{who}: {used:.3} cores beside a pod stuck Terminating"
    );
    w.wait_phase(&name, Phase::Succeeded).await;
}

#[test]
fn unmanaged_pods_are_evicted() {
    block_on(async {
        let mut w = world("unmanaged", &["a"]).await;
        let a = w.nodes[0].clone();
        bound_pod(&w, "lonely", &a, |_| {}).await;
        w.start_agents();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        let nm = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(nm.status.and_then(|s| s.eviction_pods), Some(1));
        assert!(w.pods_on(&a).await.is_empty(), "the unmanaged pod is gone");
    })
}

#[test]
fn emptydir_pods_are_evicted() {
    block_on(async {
        let mut w = world("emptydir", &["a"]).await;
        let api: Api<Deployment> = Api::namespaced(w.env.client.clone(), &w.env.ns);
        let mut d = w.env.deployment("scratch", 1);
        if let Some(spec) = d.spec.template.spec.as_mut() {
            spec.volumes = Some(vec![Volume {
                name: "tmp".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            }]);
        }
        api.create(&PostParams::default(), &d)
            .await
            .expect("create deployment");
        let before = w.wait_running("app=scratch", 1).await;
        w.start_agents();
        let a = w.nodes[0].clone();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        let nm = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(nm.status.and_then(|s| s.eviction_pods), Some(1));
        let api: Api<Pod> = Api::namespaced(w.env.client.clone(), &w.env.ns);
        assert!(
            api.get_opt(&before[0].name_any())
                .await
                .expect("get")
                .is_none_or(|p| p.uid() != before[0].uid())
        );
    })
}

#[test]
fn pdb_blocks_the_drain_names_itself_and_relaxing_it_lets_it_finish() {
    block_on(async {
        let mut w = world("pdb", &["a"]).await;
        w.deploy("db", 2).await;
        w.pdb("db-pdb", "db", 2).await;
        let b = w.env.add_node("b").await;
        w.env.wait_node_ready(&b).await;
        w.nodes.push(b);
        w.start_agents();
        let name = w.nm_name("m");
        w.maintain(&name, &w.nodes[0].clone()).await;
        let blocked = wait_for("lastError naming the PDB", LONG, || async {
            let nm = w.nms().get(&name).await.ok()?;
            let err = nm.status.as_ref()?.last_error.clone()?;
            err.contains("db-pdb").then_some(nm)
        })
        .await;
        assert_eq!(blocked.phase(), Some(Phase::Running));
        let st = blocked.status.clone().unwrap_or_default();
        assert_eq!(st.pending_pods.map(|p| p.len()), Some(2));
        assert!(
            st.last_error
                .unwrap_or_default()
                .contains("disruption budget"),
            "the API's cause is kept"
        );
        // After the drain timeout (3 s here) a condition and a Warning say so.
        wait_for("Drained=False/DrainTimeout", LONG, || async {
            let nm = w.nms().get(&name).await.ok()?;
            let c = nm.condition("Drained")?;
            (c.reason == "DrainTimeout" && c.message.contains("db-pdb")).then_some(())
        })
        .await;
        expect_events(&w.env, &name, "DrainTimeout", 1).await;
        assert_eq!(
            w.nms().get(&name).await.expect("get").phase(),
            Some(Phase::Running)
        );

        w.relax_pdb("db-pdb").await;
        let done = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(done.status.and_then(|s| s.last_error), None);
    })
}

/// A maintenance that took the node's lease and then failed (its drain ran
/// out of time with onTimeout Skip) gives the lease back when it is
/// deleted, as one that succeeded does: before, only a Running or
/// Succeeded maintenance released it, so a failed one left the node held
/// from medik8s remediators for the lease's hour.
#[test]
fn a_failed_maintenance_releases_the_lease_when_deleted() {
    block_on(async {
        let mut w = world("failedlease", &["a"]).await;
        w.deploy("db", 2).await;
        w.pdb("db-pdb", "db", 2).await;
        let b = w.env.add_node("b").await;
        w.env.wait_node_ready(&b).await;
        w.nodes.push(b);
        w.start_agents();
        let a = w.nodes[0].clone();
        let name = w.nm_name("m");
        w.maintain_annotated(
            &name,
            &a,
            &[
                (DRAIN_TIMEOUT_ANNOTATION, "2"),
                (DRAIN_ON_TIMEOUT_ANNOTATION, "Skip"),
            ],
        )
        .await;
        let failed = w.wait_phase(&name, Phase::Failed).await;
        let err = failed.status.and_then(|s| s.last_error).unwrap_or_default();
        assert!(err.contains("skipped"), "{err}");
        let leases: Api<Lease> = Api::namespaced(w.env.client.clone(), LEASE_NAMESPACE);
        assert!(
            leases
                .get_opt(&lease_name(&a))
                .await
                .expect("get lease")
                .is_some(),
            "the failed maintenance took the lease"
        );
        w.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        wait_for("the failed maintenance to be gone", LONG, || async {
            w.nms().get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await;
        wait_for("the lease to be released", LONG, || async {
            leases
                .get_opt(&lease_name(&a))
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
        assert!(!unschedulable(&w.node(&a).await), "given back uncordoned");
    })
}

/// A lease taken beside a new maintenance's finalizer just before a
/// restart, whose maintenance went before the new process looked: the
/// node agent and the cluster role each find it at start and release it;
/// another holder's lease is left alone.
#[test]
fn a_lease_held_from_before_a_restart_with_no_maintenance_is_released_at_start() {
    block_on(async {
        let mut w = world("strandedlease", &["a", "b", "c"]).await;
        let (a, b, c) = (w.nodes[0].clone(), w.nodes[1].clone(), w.nodes[2].clone());
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": LEASE_NAMESPACE}}))
                .expect("a namespace");
        // The manifests create it; a fresh cluster may not have it yet.
        let _ = Api::all(w.env.client.clone())
            .create(&PostParams::default(), &ns)
            .await;
        let leases: Api<Lease> = Api::namespaced(w.env.client.clone(), LEASE_NAMESPACE);
        for (node, holder) in [
            (&a, LEASE_HOLDER),
            (&b, "another-operator"),
            (&c, LEASE_HOLDER),
        ] {
            let lease: Lease = serde_json::from_value(serde_json::json!({
                "metadata": {"name": lease_name(node), "namespace": LEASE_NAMESPACE},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3600,
                         "acquireTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                         "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()},
            }))
            .expect("a lease");
            leases
                .create(&PostParams::default(), &lease)
                .await
                .expect("creating a lease");
        }
        // a: its node agent; c: the cluster role (no agent there).
        w.agents
            .push(Agent::start(&["run", "--node", &a, "--drain-timeout", "3"]));
        let _cluster = w.start_cluster_agent();
        for node in [&a, &c] {
            lease_released(&w.env, node, "the stranded lease released").await;
        }
        let other = leases
            .get(&lease_name(&b))
            .await
            .expect("another holder's lease is left");
        assert_eq!(
            other.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("another-operator")
        );
        for node in [&a, &b, &c] {
            let _ = leases
                .delete(&lease_name(node), &DeleteParams::default())
                .await;
        }
    })
}

#[test]
fn status_counters_follow_the_drain() {
    block_on(async {
        let mut w = world("counters", &["a"]).await;
        w.deploy("web", 2).await;
        w.deploy("db", 2).await;
        w.pdb("db-pdb", "db", 2).await;
        let a = w.nodes[0].clone();
        bound_pod(&w, "lonely", &a, |_| {}).await;
        let b = w.env.add_node("b").await;
        w.env.wait_node_ready(&b).await;
        w.nodes.push(b);
        w.start_agents();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        // web (2) and the lonely pod go; db (2) is held by its PDB.
        let mid = wait_for("2 pending, 60%", LONG, || async {
            let st = w.nms().get(&name).await.ok()?.status?;
            (st.pending_pods.as_ref()?.len() == 2).then_some(st)
        })
        .await;
        assert_eq!(mid.total_pods, Some(5));
        assert_eq!(mid.eviction_pods, Some(5));
        assert_eq!(mid.drain_progress, Some(60));
        let mut refs = mid.pending_pods_refs.unwrap_or_default();
        refs.sort();
        assert!(
            refs.iter()
                .all(|r| r.namespace == w.env.ns && r.name.starts_with("db-")),
            "{refs:?}"
        );
        w.relax_pdb("db-pdb").await;
        let st = w
            .wait_phase(&name, Phase::Succeeded)
            .await
            .status
            .unwrap_or_default();
        assert_eq!(
            (st.total_pods, st.eviction_pods, st.drain_progress),
            (Some(5), Some(5), Some(100))
        );
    })
}

#[test]
fn admin_cordoned_node_stays_cordoned_after_unmaintain() {
    block_on(async {
        let mut w = world("admincordon", &["a"]).await;
        let a = w.nodes[0].clone();
        let patch = serde_json::json!({"spec": {"unschedulable": true}});
        w.node_api()
            .patch(&a, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("admin cordon");
        w.start_agents();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        w.wait_phase(&name, Phase::Succeeded).await;
        w.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete nm");
        wait_for("NodeMaintenance gone", LONG, || async {
            w.nms().get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await;
        let node = w.node(&a).await;
        assert!(unschedulable(&node), "the admin's cordon stays");
        assert!(!taint_keys(&node).contains(&DRAIN_TAINT.to_string()));
        assert_eq!(label(&node, EXCLUDE_REMEDIATION_LABEL), None);
    })
}

#[test]
fn deleting_mid_drain_removes_taints_label_and_cordon() {
    block_on(async {
        let mut w = world("middelete", &["a"]).await;
        w.deploy("db", 1).await;
        w.pdb("db-pdb", "db", 1).await;
        w.start_agents();
        let a = w.nodes[0].clone();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        wait_for("blocked drain", LONG, || async {
            w.nms()
                .get(&name)
                .await
                .ok()?
                .status?
                .last_error?
                .contains("db-pdb")
                .then_some(())
        })
        .await;
        assert!(unschedulable(&w.node(&a).await));
        w.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete nm");
        wait_for("NodeMaintenance gone", LONG, || async {
            w.nms().get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await;
        let node = w.node(&a).await;
        assert!(!unschedulable(&node), "uncordoned");
        let keys = taint_keys(&node);
        assert!(
            !keys.contains(&DRAIN_TAINT.to_string())
                && !keys.contains(&UNSCHEDULABLE_TAINT.to_string()),
            "{keys:?}"
        );
        assert_eq!(label(&node, EXCLUDE_REMEDIATION_LABEL), None);
        let leases: Api<Lease> = Api::namespaced(w.env.client.clone(), LEASE_NAMESPACE);
        assert!(
            leases
                .get_opt(&lease_name(&a))
                .await
                .expect("get lease")
                .is_none(),
            "lease released"
        );
        expect_events(&w.env, &a, "UncordonNode", 1).await;
        expect_events(&w.env, &name, "RemovedMaintenance", 1).await;
    })
}

/// Regression: a NodeMaintenance deleted as the agent got SIGTERM was
/// finished 31 times (31 "removed" log lines, a RemovedMaintenance event
/// with series count 31). Removing the last finalizer deletes the object,
/// and the server answers with the version it deleted, which still lists
/// the finalizer; with its watch stopped by the shutdown, the agent kept
/// seeing that version and finished again. Three rounds, each: delete,
/// SIGTERM at once, clean exit; a new agent finishes what the old one
/// left; exactly one RemovedMaintenance and one "removed" line per object.
#[test]
fn delete_and_sigterm_together_finish_exactly_once() {
    block_on(async {
        let w = world("finishonce", &["a"]).await;
        w.deploy("web", 2).await;
        let a = w.nodes[0].clone();
        for round in 0..3 {
            let mut agent = Agent::start(&["run", "--node", &a, "--drain-timeout", "3"]);
            let name = w.nm_name(&format!("m{round}"));
            w.maintain(&name, &a).await;
            w.wait_phase(&name, Phase::Succeeded).await;
            w.nms()
                .delete(&name, &DeleteParams::default())
                .await
                .expect("delete nm");
            agent.signal("TERM");
            let status = agent.wait_exit(Duration::from_secs(20));
            assert!(status.success(), "round {round}: exit {status}");
            let mut logs = agent.log_text();
            if w.nms().get_opt(&name).await.ok().flatten().is_some() {
                // The shutdown came first: the next agent finishes it.
                let mut next = Agent::start(&["run", "--node", &a, "--drain-timeout", "3"]);
                wait_for("NodeMaintenance gone", LONG, || async {
                    w.nms().get_opt(&name).await.ok()?.is_none().then_some(())
                })
                .await;
                expect_events(&w.env, &name, "RemovedMaintenance", 1).await;
                // The plan's "removed" line is logged once its last effect
                // (the event) is written: stop the agent and read its whole
                // log, never a log it may still be writing.
                next.signal("TERM");
                let status = next.wait_exit(Duration::from_secs(20));
                assert!(status.success(), "round {round}: next agent exit {status}");
                logs.push_str(&next.log_text());
            } else {
                expect_events(&w.env, &name, "RemovedMaintenance", 1).await;
            }
            let removed = logs
                .matches(&format!("NodeMaintenance {name}: removed"))
                .count();
            assert_eq!(
                removed, 1,
                "round {round}: finished {removed} times:\n{logs}"
            );
        }
    })
}

#[test]
fn agent_killed_mid_drain_converges_after_restart() {
    block_on(async {
        let mut w = world("sigkill", &["a", "b"]).await;
        // Pods land on a or b; the maintained node is whichever holds some
        // (with none, the drain would finish before it could be killed).
        let pods = w.deploy("db", 2).await;
        w.pdb("db-pdb", "db", 2).await;
        w.start_agents();
        let a = pods[0]
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("a scheduled pod");
        let idx = w.nodes.iter().position(|n| *n == a).expect("one of ours");
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        // Killed mid-drain, not mid-Begin: its event follows the Running
        // status in one plan, and a kill between the two left the event
        // unsent (the restarted agent, seeing Running, rightly does not
        // begin again; CI once counted 0 events here).
        wait_for("drain underway", LONG, || async {
            let st = w.nms().get(&name).await.ok()?.status?;
            (st.phase == Some(Phase::Running)
                && w.node(&a).await.spec?.unschedulable == Some(true)
                && events_for(&w.env, &name, "BeginMaintenance").await >= 1)
                .then_some(())
        })
        .await;
        w.agents[idx].signal("KILL");
        w.agents[idx].wait_exit(Duration::from_secs(10));
        w.relax_pdb("db-pdb").await;
        w.agents[idx] = Agent::start(&["run", "--node", &a, "--drain-timeout", "3"]);
        let nm = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(nm.status.and_then(|s| s.drain_progress), Some(100));
        assert!(w.pods_on(&a).await.is_empty());
        // No second begin: exactly one, once the events have landed.
        expect_events(&w.env, &name, "BeginMaintenance", 1).await;
        expect_events(&w.env, &name, "SucceedMaintenance", 1).await;
    })
}

/// A node agent sees only its own node's NodeMaintenances: one naming a
/// node that does not exist is the cluster role's (here beside the agents,
/// as the shipped manifests run it), which fails it with NMO's message.
#[test]
fn maintenance_for_a_missing_node_fails() {
    block_on(async {
        let mut w = world("missing", &["a"]).await;
        w.start_agents();
        let _cluster = support::machines::cluster_role(&w.env, &["--node-agents"]);
        let name = w.nm_name("m");
        let ghost = format!("{}-ghost", w.env.id);
        w.maintain(&name, &ghost).await;
        let nm = w.wait_phase(&name, Phase::Failed).await;
        let err = nm
            .status
            .as_ref()
            .and_then(|s| s.last_error.clone())
            .unwrap_or_default();
        assert_eq!(
            err,
            format!("invalid nodeName, no node with name {ghost} found")
        );
        assert!(!nm.has_finalizer(), "nothing to clean up, so no finalizer");
        wait_for("a FailedMaintenance event", LONG, || async {
            (events_for(&w.env, &name, "FailedMaintenance").await >= 1).then_some(())
        })
        .await;
        // Final: it stays Failed and can be deleted right away.
        w.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        wait_for("deleted", LONG, || async {
            w.nms().get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await;
    })
}

#[test]
fn duplicate_maintenance_fails_and_leaves_the_first_alone() {
    block_on(async {
        let mut w = world("dup", &["a"]).await;
        w.start_agents();
        let a = w.nodes[0].clone();
        let first = w.nm_name("first");
        w.maintain(&first, &a).await;
        w.wait_phase(&first, Phase::Succeeded).await;
        let second = w.nm_name("second");
        w.maintain(&second, &a).await;
        let dup = w.wait_phase(&second, Phase::Failed).await;
        assert_eq!(
            dup.status.and_then(|s| s.last_error).unwrap_or_default(),
            format!("invalid nodeName, a NodeMaintenance for node {a} already exists")
        );
        w.nms()
            .delete(&second, &DeleteParams::default())
            .await
            .expect("delete dup");
        wait_for("duplicate gone", LONG, || async {
            w.nms().get_opt(&second).await.ok()?.is_none().then_some(())
        })
        .await;
        let node = w.node(&a).await;
        assert!(
            unschedulable(&node),
            "first maintenance still holds the node"
        );
        assert!(taint_keys(&node).contains(&DRAIN_TAINT.to_string()));
        assert_eq!(
            w.nms().get(&first).await.expect("first").phase(),
            Some(Phase::Succeeded)
        );
    })
}

/// Two NodeMaintenances for one node created back to back (the same
/// second): the one the API server stored first wins, though its name sorts
/// last. Three rounds with the agent running (watch order), one with the
/// agent started after both exist (a list, numbered by resourceVersion).
/// Regression: the name that sorted first won, 3 of 3 probes.
#[test]
fn same_second_maintenances_the_first_stored_wins() {
    block_on(async {
        let w = world("samesec", &["a"]).await;
        let a = w.nodes[0].clone();
        for round in 0..4 {
            let running = round < 3;
            let agent = running.then(|| Agent::start(&["run", "--node", &a]));
            if let Some(agent) = &agent {
                wait_for("the agent to see its node", LONG, || async {
                    agent
                        .log_text()
                        .contains(&format!("node {a}: ready="))
                        .then_some(())
                })
                .await;
            }
            let first = w.nm_name(&format!("z{round}"));
            let second = w.nm_name(&format!("a{round}"));
            let f = w.maintain(&first, &a).await;
            let s = w.maintain(&second, &a).await;
            let agent = agent.unwrap_or_else(|| Agent::start(&["run", "--node", &a]));
            let lost = w.wait_phase(&second, Phase::Failed).await;
            assert_eq!(
                lost.status.and_then(|s| s.last_error).unwrap_or_default(),
                format!("invalid nodeName, a NodeMaintenance for node {a} already exists"),
                "round {round}"
            );
            w.wait_phase(&first, Phase::Succeeded).await;
            // Both are now decided; undo before the next round.
            for name in [&second, &first] {
                w.nms()
                    .delete(name, &DeleteParams::default())
                    .await
                    .expect("delete nm");
            }
            for name in [&second, &first] {
                wait_for("NodeMaintenance gone", LONG, || async {
                    w.nms().get_opt(name).await.ok()?.is_none().then_some(())
                })
                .await;
            }
            drop(agent);
            eprintln!(
                "round {round}: created {:?} and {:?}",
                f.metadata.creation_timestamp.map(|t| t.0.to_string()),
                s.metadata.creation_timestamp.map(|t| t.0.to_string())
            );
        }
    })
}

#[test]
fn node_name_cannot_be_changed() {
    block_on(async {
        let w = world("immutable", &["a"]).await;
        let name = w.nm_name("m");
        w.maintain(&name, &w.nodes[0]).await;
        let patch = serde_json::json!({"spec": {"nodeName": "other"}});
        let err = w
            .nms()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err("must be refused");
        match err {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 422);
                assert!(
                    s.message.contains("updating spec.NodeName isn't allowed"),
                    "{}",
                    s.message
                );
            }
            other => panic!("expected a 422, got {other}"),
        }
        w.nms()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
    })
}

#[test]
fn cluster_mode_drains_two_nodes_at_once() {
    block_on(async {
        let w = world("cluster", &["a", "b", "c"]).await;
        // Pods on every node (two each: a hard spread, so neither a nor b
        // can be empty and drain at once), held by a PDB until we relax it.
        // Cordoned nodes leave the spread (nodeTaintsPolicy Honor), so the
        // evicted pods may all go to c.
        let mut d = w.env.deployment("db", 6);
        if let Some(spec) = d.spec.template.spec.as_mut() {
            spec.topology_spread_constraints = Some(vec![TopologySpreadConstraint {
                max_skew: 1,
                topology_key: "kubernetes.io/hostname".into(),
                when_unsatisfiable: "DoNotSchedule".into(),
                node_taints_policy: Some("Honor".into()),
                label_selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), "db".to_string())].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
        }
        Api::<Deployment>::namespaced(w.env.client.clone(), &w.env.ns)
            .create(&PostParams::default(), &d)
            .await
            .expect("create deployment");
        w.wait_running("app=db", 6).await;
        w.pdb("db-pdb", "db", 6).await;
        let _agent = w.start_cluster_agent();
        let (a, b) = (w.nodes[0].clone(), w.nodes[1].clone());
        let (ma, mb) = (w.nm_name("a"), w.nm_name("b"));
        w.maintain(&ma, &a).await;
        w.maintain(&mb, &b).await;
        // Both are Running and blocked at the same time: neither waits on the other.
        wait_for("both maintenances draining together", LONG, || async {
            let x = w.nms().get(&ma).await.ok()?.status?;
            let y = w.nms().get(&mb).await.ok()?.status?;
            let blocked = |s: &NodeMaintenanceStatus| {
                s.phase == Some(Phase::Running)
                    && s.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("db-pdb"))
            };
            (blocked(&x) && blocked(&y)).then_some(())
        })
        .await;
        w.relax_pdb("db-pdb").await;
        w.wait_phase(&ma, Phase::Succeeded).await;
        w.wait_phase(&mb, Phase::Succeeded).await;
        let pods = w.wait_running("app=db", 6).await;
        assert!(
            pods.iter()
                .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                    == Some(w.nodes[2].as_str()))
        );
    })
}

/// Regression: the mutation cache returned our last write of a Node after
/// the Node was deleted, so in cluster mode the deleted node looked present
/// forever and its garbage-collected NodeMaintenance kept our finalizer.
/// After its Node was deleted: wait until the maintenance `name` is gone
/// (its owner reference) and the node's lease is released.
async fn wait_gone_with_its_lease(w: &World, name: &str, node: &str) {
    wait_for(
        "the maintenance of the deleted node to be gone",
        LONG,
        || async { w.nms().get_opt(name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    lease_released(&w.env, node, "the deleted node's lease to be released").await;
}

/// Wait until `node`'s medik8s lease is gone.
async fn lease_released(env: &TestEnv, node: &str, what: &str) {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), LEASE_NAMESPACE);
    wait_for(what, LONG, || async {
        leases
            .get_opt(&lease_name(node))
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[test]
fn cluster_mode_node_deleted_mid_maintenance_lets_its_maintenance_go_and_releases_the_lease() {
    block_on(async {
        let w = world("nodegone", &["a", "b"]).await;
        w.deploy("db", 2).await;
        w.pdb("db-pdb", "db", 2).await;
        let _agent = w.start_cluster_agent();
        // Maintain the node that holds a pod, so the PDB keeps it draining.
        let pods = w.env.pods("app=db").await;
        let a = pods
            .iter()
            .find_map(|p| p.spec.as_ref()?.node_name.clone())
            .expect("a db pod is bound");
        let name = w.nm_name("a");
        w.maintain(&name, &a).await;
        wait_for("the maintenance to be draining, blocked", LONG, || async {
            let st = w.nms().get(&name).await.ok()?.status?;
            (st.phase == Some(Phase::Running)
                && st
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("db-pdb")))
            .then_some(())
        })
        .await;
        let leases: Api<Lease> = Api::namespaced(w.env.client.clone(), LEASE_NAMESPACE);
        assert!(
            leases
                .get_opt(&lease_name(&a))
                .await
                .ok()
                .flatten()
                .is_some()
        );

        w.node_api()
            .delete(&a, &DeleteParams::background())
            .await
            .expect("deleting the node");
        wait_gone_with_its_lease(&w, &name, &a).await;
    })
}

/// A node deleted after its drain succeeded (a decommission, a replaced
/// node) is no failure: the maintenance goes with its node (owner
/// reference), without a FailedMaintenance warning, and the lease goes too.
/// (The failure came from a reconcile that was running when the node
/// went, as replacement's delete meets the maintenance's last steps: that
/// race is the decision's unit test, and bench-replace's log shows it.)
#[test]
fn cluster_mode_node_deleted_after_its_drain_is_no_failure() {
    block_on(async {
        let w = world("nodedone", &["a", "b"]).await;
        let _agent = w.start_cluster_agent();
        let a = w.nodes[0].clone();
        let name = w.nm_name("a");
        w.maintain(&name, &a).await;
        wait_for("the maintenance to succeed", LONG, || async {
            let st = w.nms().get(&name).await.ok()?.status?;
            (st.phase == Some(Phase::Succeeded)).then_some(())
        })
        .await;
        w.node_api()
            .delete(&a, &DeleteParams::background())
            .await
            .expect("deleting the node");
        wait_gone_with_its_lease(&w, &name, &a).await;
        // Any failure's event is published before the finalizer could go.
        assert_eq!(events_for(&w.env, &name, "FailedMaintenance").await, 0);
    })
}

/// Status is written by server-side apply, which removes only fields its
/// own manager owns. A field another writer set (an older nodekeeper's
/// merge patch, a user's `kubectl patch`) must still be cleared when the
/// status no longer has it, or the agent would write the same status
/// forever.
#[test]
fn a_status_field_another_writer_set_is_cleared_without_a_write_loop() {
    block_on(async {
        let mut w = world("ssa", &["a"]).await;
        w.start_agents();
        let a = w.nodes[0].clone();
        let name = w.nm_name("m");
        w.maintain(&name, &a).await;
        w.wait_phase(&name, Phase::Succeeded).await;
        let injected = serde_json::json!({"status": {"lastError": "set by someone else"}});
        w.nms()
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&injected))
            .await
            .expect("patching status as another writer");
        wait_for("the foreign lastError to be cleared", LONG, || async {
            let st = w.nms().get(&name).await.ok()?.status?;
            (st.last_error.is_none() && st.phase == Some(Phase::Succeeded)).then_some(())
        })
        .await;
        let log = w.agents[0].log_text();
        assert!(!log.contains("still busy after"), "{log}");
    })
}

#[test]
fn medik8s_sample_applies_unchanged_and_kubectl_shows_the_columns() {
    block_on(async {
        let mut w = world("sample", &["a"]).await;
        w.start_agents();
        let name = w.nm_name("sample");
        let sample = format!(
            "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: {name}\nspec:\n  nodeName: {}\n  reason: \"Test node maintenance\"\n",
            w.nodes[0]
        );
        let out = kubectl(&["apply", "-f", "-"], Some(&sample));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        w.wait_phase(&name, Phase::Succeeded).await;
        let out = kubectl(&["get", "nm", &name], None);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let header: Vec<&str> = text
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            header,
            ["NAME", "NODE", "PHASE", "PROGRESS", "AGE"],
            "{text}"
        );
        let row: Vec<&str> = text
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            &row[1..4],
            [w.nodes[0].as_str(), "Succeeded", "100"],
            "{text}"
        );
        let out = kubectl(
            &["delete", "nm", &name, "--wait=true", "--timeout=60s"],
            None,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
}

#[test]
fn maintain_wait_reports_progress_and_exit_code() {
    block_on(async {
        let mut w = world("cli", &["a"]).await;
        w.deploy("web", 2).await;
        let b = w.env.add_node("b").await;
        w.env.wait_node_ready(&b).await;
        w.nodes.push(b);
        w.start_agents();
        let a = w.nodes[0].clone();
        let kc = support::cluster().to_string_lossy().to_string();
        let (plan_status, plan, _) = run_cli(&["drain", "--dry-run", &a, "--kubeconfig", &kc], &[]);
        assert!(plan_status.success());
        assert!(plan.contains("2 to evict (0 blocked now)"), "{plan}");
        let (status, out, err) = run_cli(
            &[
                "maintain",
                &a,
                "--reason",
                "kernel",
                "--wait",
                "--kubeconfig",
                &kc,
            ],
            &[],
        );
        assert!(status.success(), "{out}\n{err}");
        assert!(
            out.contains(&format!("node {a} is in maintenance")),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("Succeeded") && l.contains("100%")),
            "{out}"
        );
        let nm = w.nms().get(&a).await.expect("named after the node");
        assert_eq!(nm.spec.reason.as_deref(), Some("kernel"));
        let (status, _, err) = run_cli(&["unmaintain", &a, "--wait", "--kubeconfig", &kc], &[]);
        assert!(status.success(), "{err}");
        assert!(!unschedulable(&w.node(&a).await));
    })
}

#[test]
fn lease_held_by_another_holder_fails_the_maintenance_after_three_retries() {
    block_on(async {
        let mut w = world("leasefail", &["a"]).await;
        let a = w.nodes[0].clone();
        let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(w.env.client.clone());
        let ns = k8s_openapi::api::core::v1::Namespace {
            metadata: ObjectMeta {
                name: Some(LEASE_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let _ = nss.create(&PostParams::default(), &ns).await;
        let leases: Api<Lease> = Api::namespaced(w.env.client.clone(), LEASE_NAMESPACE);
        let now = k8s_openapi::jiff::Timestamp::now();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(&a)),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some("self-node-remediation".into()),
                lease_duration_seconds: Some(3600),
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    now,
                )),
                ..Default::default()
            }),
        };
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("create foreign lease");
        w.start_agents();
        let kc = support::cluster().to_string_lossy().to_string();
        let (status, _out, err) = run_cli(&["maintain", &a, "--wait", "--kubeconfig", &kc], &[]);
        assert!(!status.success(), "exit code says Failed");
        assert!(
            err.contains("maintenance failed: lease could not be extended after 4 attempts"),
            "{err}"
        );
        let nm = w.nms().get(&a).await.expect("nm");
        assert_eq!(
            nm.status.as_ref().and_then(|s| s.error_on_lease_count),
            Some(4)
        );
        let node = w.node(&a).await;
        assert!(!unschedulable(&node), "a failed maintenance holds nothing");
        assert_eq!(label(&node, EXCLUDE_REMEDIATION_LABEL), None);
        let held = leases
            .get(&lease_name(&a))
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity);
        assert_eq!(
            held.as_deref(),
            Some("self-node-remediation"),
            "the other holder keeps its lease"
        );
        w.nms()
            .delete(&a, &DeleteParams::default())
            .await
            .expect("delete");
        let _ = leases
            .delete(&lease_name(&a), &DeleteParams::default())
            .await;
    })
}

#[test]
fn maintain_wait_says_so_when_no_agent_acts() {
    block_on(async {
        let w = world("noagent", &["a"]).await;
        let a = w.nodes[0].clone();
        let kc = support::cluster().to_string_lossy().to_string();
        // No agent for this node: the CLI must not wait in silence.
        let cli = Agent::start(&["maintain", &a, "--wait", "--kubeconfig", &kc]);
        wait_for("the no-agent hint", LONG, || async {
            cli.log_text()
                .contains("no agent has acted on NodeMaintenance")
                .then_some(())
        })
        .await;
        assert!(
            cli.log_text().contains(&format!("running for node {a}")),
            "{}",
            cli.log_text()
        );
        drop(cli);
        w.nms()
            .delete(&a, &DeleteParams::default())
            .await
            .expect("delete");
    })
}

/// An owner's pod selector drains only the pods it selects (the rest stay
/// on the node) and the maintenance still succeeds; its grace period goes
/// with each eviction.
#[test]
fn an_owners_pod_selector_drains_only_the_selected_pods() {
    block_on(async {
        let mut w = world("podsel", &["a"]).await;
        w.deploy("web", 2).await;
        w.deploy("cache", 2).await;
        let b = w.env.add_node("b").await;
        w.env.wait_node_ready(&b).await;
        w.nodes.push(b);
        w.start_agents();
        let a = w.nodes[0].clone();
        let name = w.nm_name("m");
        w.maintain_annotated(
            &name,
            &a,
            &[
                (
                    DRAIN_POD_SELECTOR_ANNOTATION,
                    r#"{"matchLabels":{"app":"web"}}"#,
                ),
                (DRAIN_GRACE_ANNOTATION, "5"),
            ],
        )
        .await;
        let done = w.wait_phase(&name, Phase::Succeeded).await;
        assert_eq!(done.status.and_then(|s| s.eviction_pods), Some(2));
        let on_a = |selector: &'static str| {
            let (env, a) = (&w.env, a.clone());
            async move {
                env.pods(selector)
                    .await
                    .into_iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&a))
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .count()
            }
        };
        assert_eq!(on_a("app=cache").await, 2, "unselected pods stay");
        assert_eq!(on_a("app=web").await, 0, "selected pods went");
    })
}
