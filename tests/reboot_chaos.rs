//! Crashes at every stage of a reboot, and a kube-apiserver restart in the
//! middle of a wave: everything converges, no node is rebooted twice, the
//! budget holds throughout, nothing is left cordoned.
//!
//! Its own test binary: it restarts the shared kube-apiserver, which tests
//! running beside it would see as errors. Test binaries run one at a time.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, Phase};
use serde_json::json;
use support::machines::*;
use support::{Agent, TestEnv, block_on, install_crds, wait_for};

/// The cluster role, restarted whenever it exits (as its Deployment would
/// be): leadership lost while the API server is away ends the process.
struct Supervised {
    agent: Agent,
    /// The node agents, whose logs a timeout prints.
    fleet: std::sync::Arc<Fleet>,
    args: Vec<String>,
    restarts: u32,
}

impl Supervised {
    fn start(env: &TestEnv, fleet: &std::sync::Arc<Fleet>) -> Supervised {
        // A restarted API server answers 403 until its RBAC cache has
        // synced: refusals are expected around the restart.
        let agent = cluster_role(env, &["--node-agents"]).expect_refusals();
        let args = cluster_role_args(env, &["--node-agents"]);
        Supervised {
            agent,
            fleet: fleet.clone(),
            args,
            restarts: 0,
        }
    }

    fn restart(&mut self) {
        let _ = self.agent.child.kill();
        let _ = self.agent.child.wait();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.agent = Agent::start(&args).expect_refusals();
        self.restarts += 1;
    }

    /// Restart it if it exited on its own.
    fn tend(&mut self) {
        if matches!(self.agent.child.try_wait(), Ok(Some(_))) {
            self.restart();
        }
    }
}

fn restart_apiserver() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/controlplane/cluster.sh");
    let st = std::process::Command::new("bash")
        .args([script, "restart-apiserver"])
        .status()
        .expect("running cluster.sh restart-apiserver");
    assert!(st.success(), "kube-apiserver did not come back");
}

/// Wait (tending the cluster role) until `check` holds.
fn until(cluster: &mut Supervised, what: &str, check: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !check() {
        cluster.tend();
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}\ncluster role log:\n{}\n{}",
            cluster.agent.log_text(),
            cluster.fleet.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn crashes_at_every_stage_and_an_apiserver_restart_converge_without_a_double_reboot() {
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("rb-chaos").await;
        let names = nodes(&mut env, 5).await;
        let fleet = Fleet::new(env.client.clone(), Some(&["--metrics-address", "off"]));
        fleet
            .refusals_expected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for n in &names {
            annotate(&env.client, n, "nodekeeper.io/reboot-needed", Some("now")).await;
        }
        (env, names, fleet)
    });
    let nm = |n: &str| format!("reboot-{n}");
    let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
    let exists = |name: String| block_on(nms.get_opt(&name)).ok().flatten();
    let watcher = Watcher::start(env.client.clone(), &env.id);
    block_on(create_policy(
        &env,
        &fleet,
        json!({"budget": {"maxUnavailable": 1}}),
    ));
    // n1 gets a pod its PodDisruptionBudget will not let go of (though n2
    // could run it: a pod with nowhere else to go would be left to the
    // shutdown): its drain stalls until the budget is removed.
    block_on(env.movable_blocking_pod_on("pinned", &names[1], &names[2]));
    for n in &names[1..] {
        fleet.start_agent(n);
    }
    // n0's agent says it can reboot its node (no node is admitted
    // without that), then goes down before the cluster role starts.
    fleet.start_agent(&names[0]);
    let nodes: Api<Node> = Api::all(env.client.clone());
    let check = "n0's agent's reboot command check";
    block_on(wait_for(check, Duration::from_secs(60), || async {
        let n = nodes.get(&names[0]).await.ok()?;
        n.annotations()
            .get("nodekeeper.io/reboot-command-check")
            .filter(|v| v.ends_with(" ok"))
            .map(|_| ())
    }));
    fleet.kill_agent(&names[0]);
    let mut cluster = Supervised::start(&env, &fleet);

    // Stage "before drain": n0 is admitted while its agent is down; the
    // cluster role dies right after the admission.
    until(&mut cluster, "n0 admitted", || {
        exists(nm(&names[0])).is_some()
    });
    cluster.restart();
    fleet.start_agent(&names[0]);
    until(&mut cluster, "n0's reboot command", || {
        fleet.commands(&names[0]) == 1
    });
    block_on(fleet.reboot(&names[0]));

    // Stage "mid-drain": n1's agent dies while the PDB blocks its drain,
    // and comes back to the same stalled drain.
    // Blocked, as its status says: the pod still to go and the budget's
    // refusal (the first status lists the pod before any eviction).
    until(&mut cluster, "n1's drain blocked", || {
        exists(nm(&names[1])).is_some_and(|m| {
            m.status.is_some_and(|s| {
                s.pending_pods.is_some_and(|p| !p.is_empty())
                    && s.last_error
                        .is_some_and(|e| e.contains("disruption budget"))
            })
        })
    });
    fleet.kill_agent(&names[1]);
    fleet.start_agent(&names[1]);
    block_on(async {
        Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.ns)
            .delete("pinned", &DeleteParams::default())
            .await
            .expect("deleting the PDB");
    });
    until(&mut cluster, "n1's reboot command", || {
        fleet.commands(&names[1]) == 1
    });
    block_on(fleet.reboot(&names[1]));

    // Stage "after the reboot command": n2's agent crashes after running the
    // command, before the machine goes down, and restarts in the same boot.
    // It must not run the command again.
    until(&mut cluster, "n2's reboot command", || {
        fleet.commands(&names[2]) == 1
    });
    fleet.kill_agent(&names[2]);
    fleet.start_agent(&names[2]);
    until(
        &mut cluster,
        "n2's restarted agent to take its reboot step",
        || fleet.current_log(&names[2]).contains("reboot step:"),
    );
    block_on(fleet.reboot(&names[2]));

    // Stage "before verification": the cluster role is down while n3
    // comes back, and verifies it after its restart.
    until(&mut cluster, "n3's reboot command", || {
        fleet.commands(&names[3]) == 1
    });
    let _ = cluster.agent.child.kill();
    let _ = cluster.agent.child.wait();
    block_on(fleet.reboot(&names[3]));
    cluster.restart();

    // The API server restarts while n4 drains.
    until(&mut cluster, "n4 admitted", || {
        exists(nm(&names[4])).is_some()
    });
    restart_apiserver();
    until(&mut cluster, "n4's reboot command", || {
        fleet.commands(&names[4]) >= 1
    });
    block_on(fleet.reboot(&names[4]));

    until(&mut cluster, "every node settled", || {
        block_on(settled(&env.client, &names))
    });
    let history = watcher.finish();
    assert!(
        history.iter().all(|h| h.0 <= 1),
        "more than one node unavailable: {:?}",
        history.iter().filter(|h| h.0 > 1).collect::<Vec<_>>()
    );
    block_on(async {
        for n in &names {
            assert_eq!(fleet.commands(n), 1, "node {n}: reboot command runs");
            assert_eq!(boot_of(&env.client, n).await, format!("boot-1-{n}"), "{n}");
            let leftover = nms.get_opt(&nm(n)).await.ok().flatten();
            assert!(
                leftover.as_ref().is_none_or(|m| m.status.as_ref().and_then(|s| s.phase) != Some(Phase::Running)),
                "{n}: {leftover:?}"
            );
        }
    });
}
