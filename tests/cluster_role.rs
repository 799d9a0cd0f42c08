//! The cluster role's scheduler on the real control plane: cluster-wide
//! passes run on their own triggers (not on every pod event), an object
//! whose decision fails is reported on it while every other object goes on,
//! refused Jobs are not created again, one leader per lease, and a leader
//! that cannot renew stops. Each test is a regression test of a defect the
//! cluster role had (named in its doc comment).

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::reboot::RebootPolicy;
use nodekeeper::api::upgrade::UpgradePlan;
use serde_json::{Value, json};
use support::machines::cluster_role_args;
use support::{
    Agent, Cleanup, GROUP_LABEL, Refusal, TestEnv, block_on, free_port, http_get, install_crds,
    run_cli, wait_for,
};

const LIMIT: Duration = Duration::from_secs(60);

/// A metric's value from the agent's /metrics, summed over its labels.
fn metric(port: u16, name: &str) -> Option<f64> {
    let (status, body) = http_get(port, "/metrics")?;
    if !status.contains("200") {
        return None;
    }
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

async fn events_about(client: &Client, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Create RebootPolicy `<test id>` for the test's nodes (a harmless reboot
/// command), with `extra` merged into its spec; the API to read it back.
async fn create_group_policy(env: &TestEnv, extra: Value) -> Api<RebootPolicy> {
    let mut spec = json!({
        "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
        "reboot": {"command": ["/bin/true"]},
    });
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    let policy = RebootPolicy::new(
        &env.id,
        serde_json::from_value(spec).expect("a policy spec"),
    );
    let policies: Api<RebootPolicy> = Api::all(env.client.clone());
    policies
        .create(&Default::default(), &policy)
        .await
        .expect("creating the policy");
    policies
}

/// Defect: in `run --all-nodes` every node reconcile ran the RebootPolicy
/// pass (and the UpgradePlan and mutex passes), so every pod event anywhere
/// started one. Now pods trigger the scheduler only while a blocking-pod
/// gate reads them.
#[test]
fn pod_events_do_not_start_cluster_passes_without_a_gate_that_reads_pods() {
    install_crds();
    block_on(async {
        let mut env = TestEnv::new("cr-pods").await;
        let a = env.add_node("a").await;
        env.wait_node_ready(&a).await;
        let policies = create_group_policy(&env, json!({})).await;
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let args = cluster_role_args(&env, &["--node-agents", "--metrics-address", &addr]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let agent = Agent::start(&args);
        wait_for("the policy's first status", LIMIT, || async {
            policies.get(&env.id).await.ok()?.status.map(|_| ())
        })
        .await;
        // The leading cluster role exports the cluster-wide gauges.
        assert!(
            metric(port, "nodekeeper_reboot_needed_nodes").is_some(),
            "no cluster-wide gauge from the leader"
        );
        // Let the first passes settle, then count.
        let before = wait_for("a stable pass count", LIMIT, || async {
            let a = metric(port, "nodekeeper_cluster_passes_total")?;
            nodekeeper::runtime::sleep(Duration::from_millis(1500)).await;
            let b = metric(port, "nodekeeper_cluster_passes_total")?;
            (a == b).then_some(b)
        })
        .await;
        // 40 pods on the node: each is created, scheduled, started and
        // Running, several events apiece.
        let pods = env.deployment("churn", 40);
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.client.clone(), &env.ns)
            .create(&Default::default(), &pods)
            .await
            .expect("creating the churn Deployment");
        let pod_api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(env.client.clone(), &env.ns);
        wait_for("40 pods Running", LIMIT, || async {
            let list = pod_api.list(&ListParams::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running >= 40).then_some(())
        })
        .await;
        let after = metric(port, "nodekeeper_cluster_passes_total").unwrap_or(f64::MAX);
        assert!(
            after - before <= 5.0,
            "{} cluster passes for 40 pods' events (before {before}, after {after}); log:\n{}",
            after - before,
            agent.log_text()
        );
    });
}

/// Defect: one failing RebootPolicy (here: its status write refused by an
/// admission policy) aborted every later policy, every UpgradePlan and the
/// mutex pass. Now the failing policy gets a ReconcileFailed event and the
/// others go on.
#[test]
fn a_policy_whose_writes_are_refused_is_reported_and_every_other_object_goes_on() {
    install_crds();
    block_on(async {
        let mut env = TestEnv::new("cr-contain").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let bad = format!("{}-bad", env.id);
        let vap = format!("{}-refuse", env.id);
        let _cleanup = Cleanup(vec![("rebootpolicy", bad.clone())]);
        // An admission policy refuses every status write of the bad policy:
        // a failure only a real API server gives.
        let _refusal = Refusal::install(
            &vap,
            json!([{
                "apiGroups": ["nodekeeper.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["rebootpolicies/status"],
            }]),
            &format!("object.metadata.name != '{bad}'"),
            "status writes of this policy are refused by the test",
        );
        let kc = support::cluster().display().to_string();
        let (status, _, err) = run_cli(&["reboot-required", &a], &[("KUBECONFIG", &kc)]);
        assert!(status.success(), "reboot-required {a}: {err}");
        // The bad policy selects node a too, and is older: it would govern.
        let policies: Api<RebootPolicy> = Api::all(env.client.clone());
        for name in [&bad, &env.id] {
            let p = RebootPolicy::new(
                name,
                serde_json::from_value(json!({
                    "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
                    "reboot": {"command": ["/bin/true"]},
                }))
                .expect("a policy spec"),
            );
            policies
                .create(&Default::default(), &p)
                .await
                .expect("creating a policy");
        }
        let plan = UpgradePlan::new(
            &env.id,
            serde_json::from_value(json!({
                "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
                "version": "v2",
                "versionFrom": {"source": "Label", "key": "nodekeeper.test/version"},
                "strategy": {"command": ["/bin/true"]},
            }))
            .expect("a plan spec"),
        );
        let plans: Api<UpgradePlan> = Api::all(env.client.clone());
        plans
            .create(&Default::default(), &plan)
            .await
            .expect("creating the plan");
        // Wait until the refusal is really in force (admission policies
        // take a moment to load).
        wait_for(
            "the admission policy refusing the bad policy's status",
            LIMIT,
            || async {
                let patch = json!({"status": {"observedGeneration": 1}});
                let r = policies
                    .patch_status(&bad, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                matches!(r, Err(kube::Error::Api(s)) if s.message.contains("refused by the test"))
                    .then_some(())
            },
        )
        .await;
        let args = cluster_role_args(&env, &["--node-agents"]);
        // Its status writes of the bad policy are refused on purpose.
        let agent =
            Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).expect_refusals();
        // Every other object goes on: the good policy and the plan have a
        // status, and the good policy took node a (the bad one cannot).
        wait_for("the plan's status", LIMIT, || async {
            plans.get(&env.id).await.ok()?.status.map(|_| ())
        })
        .await;
        wait_for("the good policy's status", LIMIT, || async {
            policies.get(&env.id).await.ok()?.status.map(|_| ())
        })
        .await;
        // The good policy decides for node a (the older bad one cannot
        // write its admission, so it takes nothing).
        let good = wait_for("the good policy deciding for node a", LIMIT, || async {
            let status = policies.get(&env.id).await.ok()?.status?;
            status.nodes.iter().find(|n| n.name == a).cloned()
        })
        .await;
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let taken: Vec<String> = nms
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.spec.node_name == a)
            .filter_map(|m| m.metadata.name)
            .collect();
        assert!(
            taken.len() <= 1,
            "node a taken more than once: {taken:?} ({good:?})"
        );
        // The failing one is reported on itself, naming the cause.
        let events = wait_for(
            "a ReconcileFailed event on the bad policy",
            LIMIT,
            || async {
                let ev = events_about(&env.client, &bad, "ReconcileFailed").await;
                (!ev.is_empty()).then_some(ev)
            },
        )
        .await;
        assert!(
            events[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("refused by the test")),
            "the event names the cause: {:?}",
            events[0].message
        );
        // And it is retried with backoff, not in a tight loop.
        let log = agent.log_text();
        let failures = log.matches(&format!("RebootPolicy/{bad}:")).count();
        assert!(
            failures <= 3,
            "the bad policy was retried {failures} times within a minute:\n{log}"
        );
    });
}

/// How many requests the API server dispatched under the shipped leader
/// FlowSchema at the `leader-election` priority level: its own counter, not
/// nodekeeper's word.
fn leader_election_dispatches() -> f64 {
    let out = support::kubectl(&["get", "--raw", "/metrics"], None);
    assert!(
        out.status.success(),
        "the API server's /metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = String::from_utf8_lossy(&out.stdout);
    let schema = format!("flow_schema=\"{}\"", nodekeeper::deploy::LEADER_FLOW_SCHEMA);
    body.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
        .filter(|l| l.contains(&schema) && l.contains("priority_level=\"leader-election\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Defect: without POD_NAME the leader identity was the host name, so two
/// cluster roles on one machine both led and both acted.
/// Two cluster roles of one pool elect one leader, and a leader stopped
/// with SIGTERM hands over at once: under the shipped identity
/// (`nodekeeper-cluster`'s token, its Role in the `nodekeeper` namespace).
/// Defect: the hand-over deleted the Lease, a verb the shipped Role does
/// not grant; it was refused with 403 and the standby led only after the
/// lease expired (14.5 s), while the test, run as an administrator, passed.
/// A cluster role of another pool leads beside them (one fixed lease name
/// let one pool silently never run).
#[test]
fn two_cluster_roles_on_one_host_elect_one_leader() {
    install_crds();
    block_on(async {
        let env = TestEnv::new("cr-leader").await;
        let kubeconfig = support::cluster_identity_kubeconfig();
        let bin = std::path::Path::new(env!("CARGO_BIN_EXE_nodekeeper"));
        let pool = |selector: &str| {
            let args = [
                "run",
                "--all-nodes",
                "--node-agents",
                "--node-selector",
                selector,
                "--leader-namespace",
                support::NODEKEEPER_NAMESPACE,
            ];
            Agent::start_with(bin, &kubeconfig, "nodekeeper=debug,warn", &args)
        };
        let selector = format!("{GROUP_LABEL}={}", env.id);
        let lease_name = nodekeeper::cli::run::leader_lease_name(Some(&selector));
        let dispatched_before = leader_election_dispatches();
        let first = pool(&selector);
        wait_for("the first cluster role leading", LIMIT, || async {
            first.log_text().contains("leading as").then_some(())
        })
        .await;
        let second = pool(&selector);
        wait_for("the second cluster role waiting", LIMIT, || async {
            second
                .log_text()
                .contains("waiting for leadership")
                .then_some(())
        })
        .await;
        // Another pool's cluster role leads beside them.
        let other = pool(&format!("{GROUP_LABEL}={}-other", env.id));
        wait_for("the other pool's cluster role leading", LIMIT, || async {
            other.log_text().contains("leading as").then_some(())
        })
        .await;
        // Two renewals of the leader later, the second still waits.
        nodekeeper::runtime::sleep(Duration::from_secs(7)).await;
        assert!(
            !second.log_text().contains("leading as"),
            "both lead:\nfirst:\n{}\nsecond:\n{}",
            first.log_text(),
            second.log_text()
        );
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(env.client.clone(), support::NODEKEEPER_NAMESPACE);
        let mut first = first;
        let stopped_at = k8s_openapi::jiff::Timestamp::now();
        first.signal("TERM");
        let status = first.wait_exit(LIMIT);
        assert!(status.success(), "exit {status:?}:\n{}", first.log_text());
        assert!(
            first.log_text().contains("released lease"),
            "{}",
            first.log_text()
        );
        wait_for("the second cluster role leading", LIMIT, || async {
            second.log_text().contains("leading as").then_some(())
        })
        .await;
        let taken = leases
            .get(&lease_name)
            .await
            .expect("the leader lease")
            .spec
            .and_then(|s| s.acquire_time)
            .expect("an acquire time")
            .0;
        let handover = taken.duration_since(stopped_at);
        eprintln!("hand-over under the shipped RBAC: {handover:#}");
        assert!(
            handover < k8s_openapi::jiff::SignedDuration::from_secs(2),
            "the second took the lease {handover:#} after SIGTERM to the first:\nfirst:\n{}\nsecond:\n{}",
            first.log_text(),
            second.log_text()
        );
        // The renewals went to the API server's leader-election priority
        // level through the shipped FlowSchema, not to workload-low in one
        // flow with the cluster role's evictions.
        let dispatched = leader_election_dispatches() - dispatched_before;
        assert!(
            dispatched >= 3.0,
            "{dispatched} lease requests dispatched under {} at leader-election",
            nodekeeper::deploy::LEADER_FLOW_SCHEMA
        );
        for (who, agent) in [("first", &first), ("second", &second), ("other", &other)] {
            let log = agent.log_text();
            assert!(
                !log.contains("forbidden"),
                "the {who} cluster role was refused something under its shipped identity:\n{log}"
            );
        }
        drop((second, other));
        for selector in [selector.clone(), format!("{GROUP_LABEL}={}-other", env.id)] {
            let name = nodekeeper::cli::run::leader_lease_name(Some(&selector));
            let _ = leases.delete(&name, &Default::default()).await;
        }
    });
}

/// Defect: a leader that could not renew went on for 13 s of its 15 s lease
/// and then let running work go on 10 s more, overlapping a new leader; the
/// loss was reported as an invalid input. Now no effect starts after the
/// 10 s renew deadline, and the process exits saying it lost the lease.
#[test]
fn a_leader_that_cannot_renew_stops_within_its_renew_deadline() {
    install_crds();
    block_on(async {
        let env = TestEnv::new("cr-renew").await;
        let vap = format!("{}-lease", env.id);
        let args = cluster_role_args(&env, &["--node-agents"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Its renewals are refused on purpose.
        let mut agent = Agent::start(&args).expect_refusals();
        wait_for("leading", LIMIT, || async {
            agent.log_text().contains("leading as").then_some(())
        })
        .await;
        // From now on the API server refuses every renewal of this lease.
        let _refusal = Refusal::install(
            &vap,
            json!([{
                "apiGroups": ["coordination.k8s.io"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["leases"],
            }]),
            &format!(
                "!(object.metadata.namespace == '{}' && object.metadata.name == '{}')",
                env.ns,
                nodekeeper::cli::run::leader_lease_name(Some(&format!("{GROUP_LABEL}={}", env.id)))
            ),
            "lease renewals refused by the test",
        );
        let refused = wait_for("a refused renewal", LIMIT, || async {
            agent
                .log_text()
                .contains("refused by the test")
                .then(Instant::now)
        })
        .await;
        let status = agent.wait_exit(Duration::from_secs(30));
        let took = refused.elapsed();
        let log = agent.log_text();
        assert!(!status.success(), "it exited non-zero:\n{log}");
        assert!(
            log.contains("not the leader any more"),
            "the exit names the lost lease:\n{log}"
        );
        assert!(
            took <= Duration::from_secs(25),
            "stopped {took:?} after its first refused renewal:\n{log}"
        );
    });
}

/// The audit entries of `user`'s pod list and watch requests since byte
/// `from`: (audit ID, stage, request URI).
fn pod_reads_of(user: &str, from: u64) -> Vec<(String, String, String)> {
    support::audit_entries(&support::audit_log(), from)
        .into_iter()
        .filter(|v| v["user"]["username"].as_str() == Some(user))
        .filter(|v| matches!(v["verb"].as_str(), Some("list") | Some("watch")))
        .filter(|v| v["objectRef"]["resource"].as_str() == Some("pods"))
        .filter(|v| v["objectRef"]["subresource"].is_null())
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (s("auditID"), s("stage"), s("requestURI"))
        })
        .collect()
}

/// Defect: the cluster role watched every pod of the cluster (55.7 MiB of
/// its 79.5 MiB at 1 000 nodes / 30 000 pods) although it drains only the
/// nodes it admits. Now it reads the pods of a node only while it drains
/// that node, and a gate's pods by the gate's selector; from the audit
/// log: no other pod list or watch, and the node's watch ends once its
/// maintenance is gone.
#[test]
fn the_cluster_role_reads_only_the_pods_of_nodes_it_drains_and_of_its_gates() {
    install_crds();
    let started = support::audit_offset();
    block_on(async {
        let mut env = TestEnv::new("cr-scope").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.client.clone(), &env.ns)
            .create(&Default::default(), &env.deployment("work", 6))
            .await
            .expect("creating the Deployment");
        env.wait_running("app=work", 6).await;
        // A policy with a blocking-pod gate (no node needs a reboot).
        let gate_app = format!("gate-{}", env.id);
        create_group_policy(
            &env,
            json!({"gates": {"blockingPods": [{
                "namespace": env.ns,
                "selector": {"matchLabels": {"app": gate_app}},
            }]}}),
        )
        .await;
        let args = cluster_role_args(&env, &[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (cluster, user) = support::audited_agent(&args, "nodekeeper=debug,warn");
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": format!("{}-a", env.id)},
            "spec": {"nodeName": a, "reason": "scoped pod watches"},
        }))
        .expect("a NodeMaintenance");
        nms.create(&Default::default(), &nm)
            .await
            .expect("creating the NodeMaintenance");
        let name = nm.metadata.name.clone().unwrap_or_default();
        wait_for("the NodeMaintenance Succeeded", LIMIT, || async {
            let m = nms.get(&name).await.ok()?;
            (m.status?.phase? == nodekeeper::api::nodemaintenance::Phase::Succeeded).then_some(())
        })
        .await;
        let on_a = format!("fieldSelector=spec.nodeName%3D{a}");
        let (gate_path, gate) = (
            format!("/api/v1/namespaces/{}/pods?", env.ns),
            format!("labelSelector=app%3D{gate_app}"),
        );
        let watches = |uri_part: &str| {
            pod_reads_of(&user, started)
                .into_iter()
                .filter(|(_, stage, uri)| {
                    stage == "ResponseStarted"
                        && uri.contains("watch=true")
                        && uri.contains(uri_part)
                })
                .map(|(id, _, _)| id)
                .collect::<Vec<_>>()
        };
        assert!(
            !watches(&on_a).is_empty(),
            "no watch of node a's pods: {}",
            cluster.log_text()
        );
        wait_for("the gate's pods watched", LIMIT, || async {
            (!watches("labelSelector=app%3D").is_empty()).then_some(())
        })
        .await;
        nms.delete(&name, &Default::default())
            .await
            .expect("deleting the NodeMaintenance");
        // The watch of a's pods ends (the audit log's ResponseComplete of
        // each watch of them) once nothing on a is ours to drain.
        wait_for("node a's pod watch ended", LIMIT, || async {
            let reads = pod_reads_of(&user, started);
            watches(&on_a)
                .iter()
                .all(|id| {
                    reads
                        .iter()
                        .any(|(i, stage, _)| i == id && stage == "ResponseComplete")
                })
                .then_some(())
        })
        .await;
        for (_, _, uri) in pod_reads_of(&user, started) {
            assert!(
                uri.contains(&on_a) || (uri.starts_with(&gate_path) && uri.contains(&gate)),
                "a pod read beyond node a and the gate: {uri}\n{}",
                cluster.log_text()
            );
        }
    });
}
