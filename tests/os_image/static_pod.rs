//! The reboot profile's static pod on an OS-image machine (the packaged
//! unit steps aside): its reboot command reaches systemd as PID 1.

use super::*;

/// The reboot profile's static pod (`manifests --for static-pod --reboot`,
/// installed as the README's static pod recipe says) on a machine whose
/// PID 1 is systemd: its reboot command runs as the host's process
/// (`host-run` into PID 1's namespaces), systemd reboots the machine once,
/// and the static pod runs again after.
#[test]
fn the_reboot_profiles_static_pod_reboots_a_machine_through_systemd_once() {
    let _one = exclusive();
    let env = block_on(TestEnv::new("osstatic"));
    let m = &machines()[1];
    let _group = InGroup::new(&env, vec![m]);
    // One agent per node: the unit steps aside for the static pod, masked
    // (on a system extension's machine its enablement is a link in the
    // extension's read-only /usr, which `disable` cannot remove: the next
    // boot would start it again beside the static pod).
    m.run(&["systemctl", "mask", "--now", "nodekeeper.service"]);
    struct Unit<'a>(&'a OsMachine);
    impl Drop for Unit<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .exec(&["rm", "-f", "/etc/kubernetes/manifests/nodekeeper.yaml"]);
            let _ = self.0.exec(&["systemctl", "unmask", "nodekeeper.service"]);
            let _ = self.0.exec(&["systemctl", "start", "nodekeeper.service"]);
        }
    }
    let _unit = Unit(m);
    // The README's static pod recipe: the image, the kubeconfig readable
    // by the image's user, the manifest into the kubelet's folder.
    import_image(m);
    let host_kc = m.root.join("etc/nodekeeper/kubeconfig");
    let out = Command::new(osmachine::shipped_binary())
        .args(["host-kubeconfig", &m.name, "--group", "65532", "--out"])
        .arg(&host_kc)
        .env("KUBECONFIG", support::cluster())
        .output()
        .expect("running nodekeeper host-kubeconfig");
    assert!(
        out.status.success(),
        "host-kubeconfig: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifests = support::scratch().join(format!("static-{}", env.id));
    let out = Command::new(osmachine::shipped_binary())
        .args([
            "manifests",
            "--for",
            "static-pod",
            "--reboot",
            "--metrics-address",
        ])
        .arg(format!("127.0.0.1:{}", m.metrics_port))
        .arg("--out")
        .arg(&manifests)
        .output()
        .expect("running nodekeeper manifests");
    assert!(
        out.status.success(),
        "manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_dir(&manifests)
        .expect("the manifests")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "yaml"))
        .expect("a static pod manifest");
    let target = m.root.join("etc/kubernetes/manifests");
    std::fs::copy(&yaml, target.join(".nodekeeper.yaml")).expect("the manifest");
    std::fs::rename(
        target.join(".nodekeeper.yaml"),
        target.join("nodekeeper.yaml"),
    )
    .expect("placing it");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "kube-system");
    let mirror = format!("nodekeeper-{}", m.name);
    let agent_running = || async {
        let p = pods.get_opt(&mirror).await.ok()??;
        (p.status?.container_statuses?.iter().any(|c| c.ready)).then_some(())
    };
    block_on(wait_for(
        "the static pod agent is ready",
        Duration::from_secs(90),
        agent_running,
    ));
    let log = NodeLog::start_labelled(env.client.clone(), &selector());
    let before = boots(&env, &[m]);
    let from = now_ms();
    m.run(&["touch", "/var/run/reboot-required"]);
    let cluster = support::machines::cluster_role(&env, &["--node-agents"]);
    create(
        &env,
        "RebootPolicy",
        json!({"detect": {"periodSeconds": 5}}),
    );
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_back(&env, &[m], &before, "the machine rebooted and given back")
    }));
    if waited.is_err() {
        panic!(
            "the reboot did not finish\ncluster role:\n{}\nstatic pod log: {}",
            cluster.log_text(),
            m.exec(&[
                "sh",
                "-c",
                "cat /var/log/pods/kube-system_nodekeeper-*/*/*.log | tail -40"
            ])
            .1
        );
    }
    let back = now_ms();
    block_on(wait_for(
        "the static pod agent runs again",
        Duration::from_secs(90),
        agent_running,
    ));
    let running_again = now_ms();
    let seen = log.finish();
    let downs = m.records_since("down", from);
    assert_eq!(downs.len(), 1, "one reboot: {downs:?}");
    assert_eq!(downs[0].1, "exit=133");
    assert!(
        m.console().contains("systemd-reboot.service"),
        "systemd's own reboot ran"
    );
    let boot = m.records_since("boot", from);
    let ready = first_after(&seen, &m.name, downs[0].0, |s| {
        s.ready && s.boot == m.boot_id()
    })
    .map(|s| s.ms);
    println!(
        "{} (static pod): nspawn exited 133 → booted again {} ms → Node Ready with the new boot {} ms → the agent's pod ready again {} ms (given back at {} ms)",
        m.name,
        boot.first()
            .map(|b| b.0 as i64 - downs[0].0 as i64)
            .unwrap_or(-1),
        ready.map(|r| r as i64 - downs[0].0 as i64).unwrap_or(-1),
        running_again as i64 - downs[0].0 as i64,
        back as i64 - downs[0].0 as i64,
    );
}
