//! Talos nodes: reboots and upgrades through Talos's machine API. No Talos
//! machine can run here, so machined is a stand-in (tests/talos/machined.py:
//! a real gRPC server, grpcio, serving the method paths and messages of
//! Talos's published proto definitions and answering as machined does).
//! The first test is the client against it alone; the second runs node
//! agents of Talos nodes (kwok nodes whose osImage names Talos, simulated
//! machines of tests/support/machines.rs) through a RebootPolicy and then
//! an UpgradePlan, on a Talos of the new API (1.13) and one of the old.
//! What is asserted comes from the stand-in's own record of the calls it
//! was sent and from the API server, never from nodekeeper's status.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nodekeeper::api::upgrade::{UpgradePhase, UpgradePlan, UpgradePlanSpec};
use nodekeeper::decide::{Effect, HostAction, Outcome};
use nodekeeper::effects::talos::Machined;
use serde_json::{Value, json};
use support::machines::*;
use support::{GROUP_LABEL, TestEnv, block_on, install_agent_identity, install_crds, wait_for};

/// A stand-in machined on a unix socket, killed when dropped.
struct StandIn {
    child: Child,
    socket: PathBuf,
    calls: PathBuf,
    log: PathBuf,
}

impl StandIn {
    /// Serve `socket` as Talos `release`; reboots are lines appended to
    /// `marker`, installs write `os_image`.
    fn start(
        socket: &Path,
        release: &str,
        marker: &Path,
        os_image: &Path,
        extra: &[&str],
    ) -> StandIn {
        let calls = socket.with_extension("calls");
        let log = socket.with_extension("log");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/talos/machined.py");
        let out = std::fs::File::create(&log).expect("creating the stand-in's log");
        let err = out.try_clone().expect("the stand-in's log");
        let child = Command::new("python3")
            .arg(&script)
            .arg("--socket")
            .arg(socket)
            .args(["--release", release])
            .arg("--calls")
            .arg(&calls)
            .arg("--reboot-marker")
            .arg(marker)
            .arg("--next-os-image")
            .arg(os_image)
            .args(extra)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("starting python3 {}: {e}", script.display()));
        let mut s = StandIn {
            child,
            socket: socket.to_path_buf(),
            calls,
            log,
        };
        let ready = Duration::from_secs(30);
        let started = std::time::Instant::now();
        // Serving, not merely bound: the socket file appears at bind, before
        // the server starts (a connect then is refused); it prints its line
        // once started.
        while !s.log_text().contains("machined stand-in") {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!(
                    "the stand-in machined ended ({status}); is grpcio installed (tests/install-prereqs)?\n{}",
                    s.log_text()
                );
            }
            assert!(
                started.elapsed() < ready,
                "the stand-in machined did not open {} within {ready:?}:\n{}",
                s.socket.display(),
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The calls it was sent, in order: method, roles, decoded request.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a call record {l:?}: {e}")))
            .collect()
    }

    fn methods(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| {
                let m = c["method"].as_str().unwrap_or_default();
                m.rsplit_once('.').map(|(_, s)| s).unwrap_or(m).to_string()
            })
            .collect()
    }

    fn client(&self) -> Machined {
        Machined::new(self.socket.clone())
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The client against the stand-in alone: each call's path, role and
/// fields as machined reads them, the streams read to their exit code,
/// machined's refusals reported as one line naming the call and status.
#[test]
fn the_talos_client_speaks_machineds_wire_format() {
    let dir = support::scratch().join(format!("nk-talos-{:x}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("a scratch dir");
    let limit = Duration::from_secs(30);
    let marker = dir.join("reboots");
    let os = dir.join("os-image");

    // Talos 1.13: reboot; upgrade = pull, then install the pulled name.
    let new = StandIn::start(&dir.join("new.sock"), "1.13.0", &marker, &os, &[]);
    let m = new.client();
    m.reachable().expect("the socket is there");
    block_on(m.reboot(limit)).unwrap_or_else(|e| panic!("{e}\n{}", new.log_text()));
    block_on(wait_for("the reboot", limit, || async {
        (lines(&marker) == 1).then_some(())
    }));
    let image = "registry.example/siderolabs/installer:v1.13.1";
    let last = block_on(m.upgrade(image, false, limit))
        .unwrap_or_else(|e| panic!("{e}\n{}", new.log_text()));
    assert_eq!(last, "upgrade complete\n");
    assert_eq!(
        std::fs::read_to_string(&os).unwrap_or_default(),
        "Talos (v1.13.1)"
    );
    let calls = new.calls();
    assert_eq!(
        new.methods(),
        [
            "MachineService/Reboot",
            "ImageService/Pull",
            "LifecycleService/Upgrade"
        ],
        "{calls:#?}"
    );
    for c in &calls {
        assert_eq!(c["roles"], json!(["os:admin"]), "one role per call: {c}");
    }
    assert_eq!(calls[0]["method"], "/machine.MachineService/Reboot");
    assert_eq!(calls[0]["request"]["mode"], 0);
    // talosctl's store for installer images: CRI driver, system namespace.
    let instance = json!({"driver": 1, "namespace": 1});
    assert_eq!(calls[1]["method"], "/machine.ImageService/Pull");
    assert_eq!(
        calls[1]["request"],
        json!({"containerd": instance, "image_ref": image})
    );
    assert_eq!(calls[2]["method"], "/machine.LifecycleService/Upgrade");
    assert_eq!(calls[2]["request"]["containerd"], instance);
    let pinned = calls[2]["request"]["image_name"]
        .as_str()
        .unwrap_or_default();
    assert!(
        pinned.starts_with("registry.example/siderolabs/installer@sha256:"),
        "the pulled name is installed: {pinned}"
    );
    assert_eq!(lines(&marker), 1, "the new upgrade call does not reboot");
    drop(new);

    // An installer that fails: the exit code and its last line, not OK.
    let failing = StandIn::start(
        &dir.join("fail.sock"),
        "1.13.0",
        &marker,
        &os,
        &["--fail-upgrade"],
    );
    let err = block_on(failing.client().upgrade(image, false, limit))
        .expect_err("an exit code of 1 is a failure");
    assert_eq!(err, "Talos upgrade exited 1: error: disk full\n");
    drop(failing);

    // where-features-meet.md finding 8: an agent restarted mid-upgrade
    // asks again. (An install takes 6 s here: the second caller asks well
    // within it, so it meets the first one running even on a loaded
    // machine.) machined cancels an install whose caller went away, and
    // refuses a second while one runs: the ask waits for it, never failing
    // the node, and the installs never overlap.
    let slow = StandIn::start(
        &dir.join("slow.sock"),
        "1.13.0",
        &marker,
        &os,
        &["--install-seconds", "6"],
    );
    let err = block_on(slow.client().upgrade(image, false, Duration::from_secs(1)))
        .expect_err("a caller cut off after 1 s");
    assert!(err.contains("DEADLINE_EXCEEDED"), "{err}");
    block_on(wait_for("the cut-off install cancelled", limit, || async {
        slow.log_text().contains("cancelled").then_some(())
    }));
    let first = {
        let client = slow.client();
        std::thread::spawn(move || block_on(client.upgrade(image, false, limit)))
    };
    block_on(wait_for("the first install under way", limit, || async {
        (slow
            .methods()
            .iter()
            .filter(|m| *m == "LifecycleService/Upgrade")
            .count()
            == 2)
            .then_some(())
    }));
    let second = block_on(slow.client().upgrade(image, false, limit));
    let first = first.join().expect("the first caller's thread");
    assert_eq!(
        first.as_deref(),
        Ok("upgrade complete\n"),
        "{}",
        slow.log_text()
    );
    assert_eq!(
        second.as_deref(),
        Ok("upgrade complete\n"),
        "{}",
        slow.log_text()
    );
    let log = slow.log_text();
    assert_eq!(log.matches("installed ").count(), 2, "{log}");
    let upgrades = slow
        .methods()
        .iter()
        .filter(|m| *m == "LifecycleService/Upgrade")
        .count();
    assert!(
        upgrades >= 4,
        "the second ask was refused while the first ran, then made again: {upgrades} calls\n{log}"
    );
    drop(slow);

    // Talos 1.12: the new services do not exist; the old call installs and
    // reboots by itself, not staged (a staged one reboots twice).
    let old = StandIn::start(&dir.join("old.sock"), "1.12.0", &marker, &os, &[]);
    let err = block_on(old.client().upgrade(image, false, limit))
        .expect_err("no ImageService before 1.13");
    assert!(
        err.starts_with("Talos ImageService/Pull of registry.example/siderolabs/installer:v1.13.1: UNIMPLEMENTED (12)"),
        "{err}"
    );
    let said = block_on(old.client().upgrade(image, true, limit))
        .unwrap_or_else(|e| panic!("{e}\n{}", old.log_text()));
    assert!(said.contains("reboots"), "{said}");
    // (Calls of services it does not have never reach its record.)
    let calls = old.calls();
    assert_eq!(old.methods(), ["MachineService/Upgrade"], "{calls:#?}");
    assert_eq!(calls[0]["method"], "/machine.MachineService/Upgrade");
    assert_eq!(
        calls[0]["request"],
        json!({"image": image, "preserve": true, "stage": false, "force": false, "reboot_mode": 0})
    );
    block_on(wait_for("machined's own reboot", limit, || async {
        (lines(&marker) == 2).then_some(())
    }));
    drop(old);

    // Nothing listening: one line naming the socket.
    let gone = Machined::new(dir.join("gone.sock"));
    let err = block_on(gone.reboot(limit)).expect_err("no machined");
    assert!(err.starts_with("Talos Reboot: UNAVAILABLE: "), "{err}");
    assert!(
        gone.reachable()
            .is_err_and(|e| e.contains("--talos-socket"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Talos action run again with the same id — the pass after a failed
/// write of its result to the node — is given the first run's result: no
/// second Pull and Upgrade, no second Reboot. Another id runs again.
#[test]
fn a_talos_action_run_again_by_its_id_is_not_called_twice() {
    let dir = support::scratch().join(format!("nk-talos-{:x}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("a scratch dir");
    let stand_in = StandIn::start(
        &dir.join("m.sock"),
        "1.13.0",
        &dir.join("reboots"),
        &dir.join("os-image"),
        &[],
    );
    let env = block_on(TestEnv::new("talos-once"));
    let effects = support::interpreter(env.client.clone(), stand_in.client());
    let run = |id: &str, action: HostAction| {
        let e = Effect::RunHost {
            node: "n".into(),
            id: id.into(),
            action,
            record: nodekeeper::decide::HostRecord {
                annotation: "nodekeeper.io/test-result",
                failed: "failed".into(),
                succeeded: None,
            },
            timeout: Duration::from_secs(30),
        };
        match block_on(effects.perform(&e)) {
            Ok(Outcome::HostRan { ok, output }) => assert!(ok, "{output}\n{}", stand_in.log_text()),
            other => panic!("{other:?}"),
        }
    };
    let upgrade = HostAction::TalosUpgrade {
        image: "registry.example/siderolabs/installer:v1.13.1".into(),
        legacy: false,
    };
    run("up-1", upgrade.clone());
    run("up-1", upgrade.clone());
    run("reboot-1", HostAction::TalosReboot);
    run("reboot-1", HostAction::TalosReboot);
    assert_eq!(
        stand_in.methods(),
        [
            "ImageService/Pull",
            "LifecycleService/Upgrade",
            "MachineService/Reboot"
        ]
    );
    run("up-2", upgrade);
    assert_eq!(stand_in.methods().len(), 5, "another id runs again");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A RebootPolicy and then an UpgradePlan on two Talos nodes, one on Talos
/// 1.13 and one on 1.12, with node agents of the shipped node identity:
/// every reboot and upgrade goes through machined (the reboot command is a
/// program that does not exist), within the budget, once each.
#[test]
fn talos_nodes_reboot_and_upgrade_through_machined_once_each() {
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("talos").await;
        let names = nodes(&mut env, 2).await;
        (env, names)
    });
    let fleet = Fleet::new(env.client.clone(), Some(&["--metrics-address", "off"]));
    fleet
        .node_identity
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let releases = ["1.13.0", "1.12.0"];
    let mut machined = Vec::new();
    for (n, release) in names.iter().zip(releases) {
        std::fs::write(fleet.os_image_file(n), format!("Talos (v{release})")).expect("an OS image");
        // The disk's OS is reported from the next boot on.
        block_on(async {
            fleet.power_off_with(n, Some(&format!("boot-0-{n}"))).await;
            fleet.power_on(n).await;
        });
        machined.push(StandIn::start(
            &fleet.talos_socket(n),
            release,
            &fleet.file(&format!("{n}.reboots")),
            &fleet.os_image_file(n),
            &[],
        ));
        fleet.require_reboot(n);
        fleet.start_agent(n);
    }
    block_on(async {
        for (n, release) in names.iter().zip(releases) {
            let os = os_image(&env, n).await;
            assert_eq!(os, format!("Talos (v{release})"), "{n}");
        }
    });
    let watcher = Watcher::start(env.client.clone(), &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let context = |machined: &[StandIn]| {
        let mut s = format!("cluster role:\n{}", cluster.log_text());
        for (n, m) in names.iter().zip(machined) {
            s += &format!(
                "\n{n} agent:\n{}\n{n} machined calls: {:#?}",
                fleet.agent_log(n),
                m.calls()
            );
        }
        s
    };

    // Reboots: `reboot.method` Auto on nodes whose osImage names Talos.
    let policy = block_on(create_policy(
        &env,
        &fleet,
        json!({
            "budget": {"maxUnavailable": 1},
            "reboot": {"command": ["/nonexistent/reboot-by-command"], "remoteCommand": []},
        }),
    ));
    fleet.serve(&names, Duration::from_secs(180), || {
        block_on(settled(&env.client, &names))
    });
    for (n, m) in names.iter().zip(&machined) {
        assert_eq!(
            m.methods(),
            ["MachineService/Reboot"],
            "{n}\n{}",
            context(&machined)
        );
        assert_eq!(m.calls()[0]["roles"], json!(["os:admin"]));
        assert_eq!(fleet.commands(n), 1, "{n} rebooted once");
    }
    block_on(async {
        Api::<nodekeeper::api::reboot::RebootPolicy>::all(env.client.clone())
            .delete(&policy, &DeleteParams::default())
            .await
            .expect("deleting the policy");
    });

    // Upgrades: type Talos to v1.13.1; the 1.13 node pulls, installs and
    // is rebooted by its agent, the 1.12 node gets the old call and
    // machined reboots it itself.
    let version = "v1.13.1";
    let mut spec: UpgradePlanSpec = serde_json::from_value(json!({
        "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
        "version": version,
        "versionFrom": {"source": "OSImage"},
        "strategy": {"type": "Talos", "image": "registry.example/siderolabs/installer:{version}"},
        "budget": {"maxUnavailable": 1},
    }))
    .expect("a plan spec");
    spec.drain.timeout_seconds = 60;
    let plan = format!("{}-up", env.id);
    block_on(async {
        Api::<UpgradePlan>::all(env.client.clone())
            .create(&PostParams::default(), &UpgradePlan::new(&plan, spec))
            .await
            .expect("creating the UpgradePlan");
    });
    let done = || {
        block_on(async {
            let Ok(p) = Api::<UpgradePlan>::all(env.client.clone()).get(&plan).await else {
                return false;
            };
            names
                .iter()
                .all(|n| p.entry(n).is_some_and(|e| e.phase == UpgradePhase::Done))
        })
    };
    fleet.serve(&names, Duration::from_secs(180), done);
    let history = watcher.finish();
    let peak = history.iter().map(|h| h.0).max().unwrap_or(0);
    assert!(
        peak <= 1,
        "over budget: {history:?}\n{}",
        context(&machined)
    );
    block_on(async {
        for n in &names {
            assert_eq!(os_image(&env, n).await, format!("Talos ({version})"), "{n}");
        }
    });
    let image = format!("registry.example/siderolabs/installer:{version}");
    let (new, old) = (&machined[0], &machined[1]);
    assert_eq!(
        new.methods(),
        [
            "MachineService/Reboot",
            "ImageService/Pull",
            "LifecycleService/Upgrade",
            "MachineService/Reboot"
        ],
        "{}",
        context(&machined)
    );
    assert_eq!(new.calls()[1]["request"]["image_ref"], json!(image));
    assert_eq!(
        old.methods(),
        ["MachineService/Reboot", "MachineService/Upgrade"],
        "{}",
        context(&machined)
    );
    assert_eq!(old.calls()[1]["request"]["image"], json!(image));
    assert_eq!(old.calls()[1]["request"]["stage"], json!(false));
    for n in &names {
        assert_eq!(fleet.commands(n), 2, "{n}: rebooted once per feature");
        support::machines::assert_refused_nothing(&format!("{n}'s agent"), &fleet.agent_log(n));
    }
    drop(cluster);
}

async fn os_image(env: &TestEnv, node: &str) -> String {
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .get(node)
        .await
        .ok()
        .and_then(|n| n.status?.node_info.map(|i| i.os_image))
        .unwrap_or_default()
}
