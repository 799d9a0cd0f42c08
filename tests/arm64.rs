//! The arm64 binary (`just build-static-arm64`, a static
//! aarch64-unknown-linux-musl build) run for real on this amd64 machine
//! under qemu-user emulation (Debian's qemu-user-static): as a node agent of
//! the test cluster, with the identity the shipped manifests give it, it
//! drains its node for a NodeMaintenance and gives it back; its `version`
//! and `manifests` agree with the amd64 binary's byte for byte. Emulation
//! proves the instruction set, the static link and the code paths, not an
//! arm64 kernel (README: what was verified and how).
//!
//! Uses `$NODEKEEPER_ARM64_BIN` (`just test` sets it) or else builds it
//! with `tests/build-static arm64` (reused when this machine built it from
//! the same source).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use support::{Agent, TestEnv, block_on, install_crds, scratch, wait_for};

/// How long an emulated agent may take for each step (qemu-user runs it
/// several times slower; the drain itself is the API server's work).
const LIMIT: Duration = Duration::from_secs(120);

fn arm64_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("NODEKEEPER_ARM64_BIN") {
        return PathBuf::from(bin);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("tests/build-static"))
        .arg("arm64")
        .current_dir(root)
        .output()
        .expect("running tests/build-static arm64");
    assert!(
        out.status.success(),
        "tests/build-static arm64 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    root.join(path)
}

/// A script that runs the arm64 binary under qemu-user with its arguments:
/// what `Agent::start_with` starts.
fn emulated(bin: &Path) -> PathBuf {
    let script = scratch().join("nodekeeper-arm64");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec qemu-aarch64-static {} \"$@\"\n",
            bin.display()
        ),
    )
    .expect("writing the qemu wrapper");
    let mut perms = std::fs::metadata(&script)
        .expect("the wrapper")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).expect("making the wrapper executable");
    script
}

fn output(program: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn the_arm64_binary_is_an_aarch64_static_executable_that_agrees_with_amd64() {
    let bin = arm64_binary();
    let file = String::from_utf8_lossy(&output(
        Path::new("file"),
        &["-b", &bin.display().to_string()],
    ))
    .to_string();
    assert!(
        file.contains("ARM aarch64") && file.contains("statically linked"),
        "{file}"
    );
    let size = std::fs::metadata(&bin).map(|m| m.len()).unwrap_or(u64::MAX);
    assert!(
        size <= 8 * 1024 * 1024,
        "{size} bytes: over the 8 MiB budget"
    );
    let arm = emulated(&bin);
    let amd = std::env::var_os("NODEKEEPER_IMAGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")));
    for args in [
        &["version"][..],
        &["manifests", "--for", "k3s"][..],
        &["manifests", "--for", "daemonset", "--upgrade"][..],
        &["crds"][..],
    ] {
        assert!(
            output(&arm, args) == output(&amd, args),
            "`nodekeeper {args:?}` differs between arm64 and amd64"
        );
    }
}

#[test]
fn an_emulated_arm64_agent_drains_its_node_and_gives_it_back() {
    install_crds();
    let arm = emulated(&arm64_binary());
    block_on(async {
        let mut env = TestEnv::new("arm64").await;
        let node = env.add_node("a").await;
        env.wait_node_ready(&node).await;
        Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
            .create(&PostParams::default(), &env.deployment("work", 3))
            .await
            .expect("creating the Deployment");
        env.wait_running("app=work", 3).await;
        let args = ["run", "--node", node.as_str()];
        let identity = support::shipped_identity(&args).expect("the agent's shipped identity");
        let _agent = Agent::start_with(&arm, &identity, "nodekeeper=debug,warn", &args);

        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let name = format!("{}-arm64", env.id);
        let nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: node.clone(),
                reason: Some("arm64".into()),
            },
        );
        nms.create(&PostParams::default(), &nm)
            .await
            .expect("creating the NodeMaintenance");
        let nodes: Api<Node> = Api::all(env.client.clone());
        let cordoned = |want: bool| {
            let (nodes, node) = (nodes.clone(), node.clone());
            async move {
                let n = nodes.get(&node).await.ok()?;
                let unschedulable = n.spec.and_then(|s| s.unschedulable) == Some(true);
                (unschedulable == want).then_some(())
            }
        };
        wait_for("the node cordoned", LIMIT, || cordoned(true)).await;
        wait_for("the NodeMaintenance Succeeded", LIMIT, || async {
            let m = nms.get_opt(&name).await.ok().flatten()?;
            (m.phase() == Some(Phase::Succeeded)).then_some(())
        })
        .await;
        let left: Vec<_> = env
            .pods("app=work")
            .await
            .into_iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                    && p.metadata.deletion_timestamp.is_none()
            })
            .collect();
        assert!(
            left.is_empty(),
            "pods left on the drained node: {}",
            left.len()
        );
        nms.delete(&name, &Default::default())
            .await
            .expect("deleting the NodeMaintenance");
        wait_for("the node given back", LIMIT, || cordoned(false)).await;
        wait_for("the NodeMaintenance gone", LIMIT, || async {
            nms.get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await;
    });
}
