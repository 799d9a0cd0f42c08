//! `maintain --wait` through a kube-apiserver restart: the watch breaks,
//! the command watches again, and it ends with the maintenance's own
//! outcome (exit 0, "in maintenance"). It ended with exit 1 at the first
//! watch error while the maintenance carried on. Its own test binary: the
//! restart would disturb tests running beside it.

use crate::support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::Api;
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use support::{Agent, TestEnv, block_on, install_crds, run_cli, wait_for};

fn restart_apiserver() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/controlplane/cluster.sh");
    let st = Command::new("bash")
        .args([script, "restart-apiserver"])
        .status()
        .expect("running cluster.sh restart-apiserver");
    assert!(st.success(), "kube-apiserver did not come back");
}

#[test]
fn maintain_wait_watches_again_through_an_apiserver_restart() {
    install_crds();
    let (env, node) = block_on(async {
        let mut env = TestEnv::new("mt-restart").await;
        let n = env.add_node("a").await;
        env.wait_node_ready(&n).await;
        (env, n)
    });
    let kc = support::cluster().to_string_lossy().to_string();
    // No agent yet: the maintenance waits, and so does the command.
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["maintain", &node, "--wait", "--kubeconfig", &kc])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting maintain --wait");
    block_on(async {
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        wait_for(
            "the maintenance created",
            Duration::from_secs(30),
            || async {
                nms.list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .any(|m| m.spec.node_name == node)
                    .then_some(())
            },
        )
        .await;
    });
    restart_apiserver();
    assert!(
        child.try_wait().ok().flatten().is_none(),
        "maintain --wait ended at the restart"
    );
    let agent = Agent::start(&["run", "--node", &node]);
    let limit = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(st) = child.try_wait().expect("polling maintain --wait") {
            break st;
        }
        assert!(
            Instant::now() < limit,
            "maintain --wait did not end\nagent:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status.code(), Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("is in maintenance"), "{out}");
    let (st, _, e) = run_cli(&["unmaintain", &node, "--wait", "--kubeconfig", &kc], &[]);
    assert!(st.success(), "{e}");
    drop(agent);
}
