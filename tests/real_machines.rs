//! Reboots and in-place upgrades of real kubelet nodes that reboot for
//! real: three test machines (`tests/realnode/node.sh up 3 --machine`, how
//! they work: tests/realnode/machine.sh), each a real kubelet + containerd
//! under a PID 1 of its own that `systemctl reboot` ends; the machine boots
//! again with a new boot ID and the same disks, and its kubelet restarts its
//! pods in new containers. nodekeeper runs from the shipped manifests
//! (`manifests --for k3s --reboot`, or the static pod with `--reboot`) on
//! the image `just image` builds; the reboot goes through `nodekeeper
//! host-exec` into the machine's PID 1, as on a host.
//!
//! Every claim is checked independently of nodekeeper's status: the
//! machines' own records (each reboot request and PID-1 exit, timed on the
//! host clock), a watch of the Nodes (cordon, Ready, boot ID), the host's
//! processes and the containers' own marks. Timings of each reboot are
//! printed (`--nocapture`).

use crate::realmachine;
use crate::realnode;
use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use nodekeeper::api::reboot::{RebootPhase, RebootPolicy};
use nodekeeper::api::upgrade::UpgradePlan;
use realmachine::{
    Machine, NodeLog, Seen, first_after, machines, most_unavailable, now_ms, state_at,
};
use realnode::{REAL_NODE_KEY, exclusive, wait_host};
use serde_json::json;
use support::{TestEnv, block_on, wait_for};

/// Where the shipped manifests put the agents.
const NS: &str = "nodekeeper";
/// A wave of reboots on the machines, start to end.
const WAVE: Duration = Duration::from_secs(240);

/// The binary whose manifests are applied (the one the image holds).
fn shipped_bin() -> PathBuf {
    std::env::var_os("NODEKEEPER_IMAGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")))
}

fn kubectl(args: &[&str], stdin: Option<&str>) {
    let out = support::kubectl(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's reboot profile for the k3s folder / DaemonSet:
/// `nodekeeper manifests --for k3s --reboot --out DIR`, applied as written
/// ([`deploy_profile`] with `--upgrade` for the upgrade profile).
/// One change, the test cluster's and not the product's: the cluster
/// role's Deployment is placed on the machines (they carry a test taint,
/// and the cluster's other nodes are kwok's, whose pods do not run). Waits
/// until an agent is Ready on every machine and the cluster role runs.
fn deploy_reboot_profile(env: &TestEnv) {
    deploy_profile(env, "--reboot")
}

fn deploy_profile(env: &TestEnv, profile: &str) {
    let dir = support::scratch().join(format!("k3s-{profile}-{}", env.id));
    let out = Command::new(shipped_bin())
        .args(["manifests", "--for", "k3s", profile, "--out"])
        .arg(&dir)
        .output()
        .expect("running nodekeeper manifests");
    assert!(out.status.success(), "manifests --for k3s {profile} failed");
    kubectl(&["apply", "-R", "-f", &dir.display().to_string()], None);
    let placement = json!({"spec": {"template": {"spec": {
        "nodeSelector": {REAL_NODE_KEY: "true"},
        "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    }}}});
    kubectl(
        &[
            "-n",
            NS,
            "patch",
            "deployment",
            "nodekeeper-cluster",
            "--type",
            "merge",
            "-p",
            &placement.to_string(),
        ],
        None,
    );
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    block_on(wait_for(
        "a Ready agent on every machine and a running cluster role",
        Duration::from_secs(120),
        || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let ready = |p: &&Pod| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            };
            let on = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
            let agents: Vec<String> = list
                .items
                .iter()
                .filter(ready)
                .filter(|p| p.owner_references().iter().any(|o| o.kind == "DaemonSet"))
                .filter_map(on)
                .collect();
            let cluster = list
                .items
                .iter()
                .filter(ready)
                .any(|p| p.name_any().starts_with("nodekeeper-cluster-"));
            (machines().iter().all(|m| agents.contains(&m.name)) && cluster).then_some(())
        },
    ));
}

/// Put each machine back as a test found it: no sentinel, no knobs, on,
/// and no nodekeeper workload left (the real-node tests that may follow
/// want their node to themselves).
struct Tidy;

impl Drop for Tidy {
    fn drop(&mut self) {
        let _ = support::kubectl(
            &[
                "-n",
                NS,
                "delete",
                "daemonset/nodekeeper",
                "deployment/nodekeeper-cluster",
                "--ignore-not-found",
                "--wait=true",
                "--timeout=90s",
            ],
            None,
        );
        for m in machines() {
            m.set("shutdown-delay", None);
            m.set("off", None);
            m.exec(&["rm", "-f", "/var/run/reboot-required"]);
            // A failed test may have stopped the agents mid-reboot, with
            // the machine cordoned: every later test would then time out
            // waiting for it, one failure reported five times. Only then:
            // after a passing test a cordon left behind is a defect the
            // next test's start must find.
            if std::thread::panicking() {
                let _ = support::kubectl(&["uncordon", &m.name], None);
            }
        }
    }
}

/// A test's start: the machines to itself, up, and an env of its own.
fn on_machines(name: &str) -> (std::sync::MutexGuard<'static, ()>, TestEnv, Tidy) {
    let one = exclusive();
    let ms = machines();
    let env = block_on(TestEnv::new(name));
    block_on(wait_for(
        "every machine Ready and uncordoned",
        Duration::from_secs(120),
        || async {
            let api: Api<Node> = Api::all(env.client.clone());
            for m in ms {
                let n = api.get(&m.name).await.ok()?;
                let cordoned = n.spec.and_then(|s| s.unschedulable) == Some(true);
                let ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                (ready && !cordoned).then_some(())?;
            }
            Some(())
        },
    ));
    (one, env, Tidy)
}

/// A RebootPolicy over the machines (named after the test, so the env
/// deletes it), `spec` merged over the selector and a 5 s sentinel look.
fn create_policy(env: &TestEnv, spec: serde_json::Value) {
    let mut full = json!({
        "nodeSelector": {"matchLabels": {REAL_NODE_KEY: "true"}},
        "detect": {"periodSeconds": 5},
        "budget": {"maxUnavailable": 1},
    });
    if let (Some(f), Some(s)) = (full.as_object_mut(), spec.as_object()) {
        for (k, v) in s {
            f.insert(k.clone(), v.clone());
        }
    }
    let p: RebootPolicy = serde_json::from_value(json!({
        "apiVersion": "nodekeeper.io/v1alpha1", "kind": "RebootPolicy",
        "metadata": {"name": env.id}, "spec": full,
    }))
    .expect("a RebootPolicy");
    block_on(Api::<RebootPolicy>::all(env.client.clone()).create(&PostParams::default(), &p))
        .expect("creating the RebootPolicy");
}

/// Wait until the policy says `node` is Done (progress only: what happened
/// is checked on the machines and in the node watch).
fn wait_done(env: &TestEnv, node: &str) {
    let api: Api<RebootPolicy> = Api::all(env.client.clone());
    block_on(wait_for(&format!("{node} Done"), WAVE, || async {
        let p = api.get(&env.id).await.ok()?;
        (p.entry(node)?.phase == RebootPhase::Done).then_some(())
    }));
}

fn needs_reboot(m: &Machine) {
    assert!(
        m.exec(&["touch", "/var/run/reboot-required"]),
        "touching the sentinel in {}",
        m.name
    );
}

/// Each machine's one reboot as the watch and its records saw it: the
/// reboot request and the PID-1 exit inside a cordon of its node, a new
/// boot ID reported and Ready afterwards. Prints the timings; returns the
/// ms of the PID-1 exit.
fn assert_one_reboot(log: &[Seen], m: &Machine, from: u64, boot_before: &str, cause: &str) -> u64 {
    assert_eq!(
        m.count_since("reboot-requested", from),
        1,
        "{}: reboot requests: {:?}",
        m.name,
        m.records_since(from)
    );
    assert_eq!(
        m.count_since("down", from),
        1,
        "{}: PID-1 exits: {:?}",
        m.name,
        m.records_since(from)
    );
    let asked = m.first_since("reboot-requested", from).unwrap_or_default();
    let down = m.first_since("down", from).unwrap_or_default();
    let booted = m.first_since("boot", down).unwrap_or_default();
    for (what, ms) in [("the reboot request", asked), ("the PID-1 exit", down)] {
        assert!(
            state_at(log, &m.name, ms).is_some_and(|s| s.cordoned),
            "{}: {what} at {ms} was not inside a cordon of its node: {log:?}",
            m.name
        );
    }
    // KEP-5683: the node said why it was going away before it went: an
    // event of the watch, still on the old boot, shows the condition. The
    // watch's order is the server's; when an event reaches the watcher can
    // trail the machine's own record of the reboot request by milliseconds
    // (seen: the condition written before the request, seen 6 ms after
    // it), so the two clocks' times are not compared.
    assert!(
        log.iter().any(|s| s.node == m.name
            && s.ms >= from
            && s.boot == boot_before
            && s.lifecycle
                .contains(&format!("MaintenanceInProgress=True/{cause}"))),
        "{}: the node never said MaintenanceInProgress ({cause}) before its reboot (asked at {asked}): {log:?}",
        m.name
    );
    assert!(
        log.iter().any(|s| s.node == m.name
            && s.ms >= from
            && s.lifecycle.contains("Drained=True/DrainCompleted")),
        "{}: never said Drained: {log:?}",
        m.name
    );
    let boot = m.boot_id();
    assert_ne!(boot, boot_before, "{}: the boot ID changed", m.name);
    let reported = first_after(log, &m.name, down, |s| s.boot == boot)
        .unwrap_or_else(|| panic!("{}: the new boot ID never reported: {log:?}", m.name));
    let ready = first_after(log, &m.name, down, |s| s.boot == boot && s.ready);
    let not_ready = first_after(log, &m.name, asked, |s| !s.ready).filter(|s| s.ms < reported.ms);
    eprintln!(
        "machine {}: reboot command -> PID 1 down {} ms, -> booted {} ms, -> new boot ID in the API {} ms, -> Ready {} ms; NotReady seen: {}",
        m.name,
        down - asked,
        booted.saturating_sub(asked),
        reported.ms.saturating_sub(asked),
        ready
            .map(|r| r.ms.saturating_sub(asked))
            .unwrap_or_default(),
        not_ready.map_or("never".to_string(), |s| format!("at +{} ms", s.ms - asked)),
    );
    down
}

/// No machine left cordoned: each uncordoned within 30 s of the end (the
/// policy reports a node done when it gives the node back; its agent then
/// uncordons it).
fn assert_none_cordoned(env: &TestEnv) {
    let api: Api<Node> = Api::all(env.client.clone());
    for m in machines() {
        block_on(wait_for(
            &format!("{} uncordoned", m.name),
            Duration::from_secs(30),
            || async {
                let n = api.get(&m.name).await.ok()?;
                (n.spec.and_then(|s| s.unschedulable) != Some(true)).then_some(())
            },
        ));
    }
}

/// A Deployment of one pod pinned to `node` that marks SIGTERM in `marks`
/// (tests/realnode/pause.c's linger mode) and takes 1 s to stop.
fn pinned_workload(env: &TestEnv, name: &str, node: &str, marks: &std::path::Path) {
    let out = marks.parent().expect("a folder").display().to_string();
    let file = marks
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("marks");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 30,
                "volumes": [{"name": "out", "hostPath": {"path": out, "type": "Directory"}}],
                "containers": [{"name": "main", "image": "localhost/pause:nodekeeper",
                    "imagePullPolicy": "Never", "command": ["/pause"],
                    "args": ["linger", "1", format!("/out/{file}")],
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}}}
    }))
    .expect("a Deployment");
    block_on(
        Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
            .create(&PostParams::default(), &d),
    )
    .expect("creating the workload");
}

/// The Running pods of app `name` on `node`: (uid, start ms).
fn running_pods(env: &TestEnv, name: &str, node: &str) -> Vec<(String, u64)> {
    let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let list = block_on(api.list(&ListParams::default().labels(&format!("app={name}"))))
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.phase.as_deref() == Some("Running")
                    && s.container_statuses
                        .as_ref()
                        .is_some_and(|c| c.iter().all(|c| c.ready))
            })
        })
        .map(|p| {
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .map(|t| t.0.as_millisecond() as u64)
                .unwrap_or_default();
            (p.metadata.uid.unwrap_or_default(), started)
        })
        .collect()
}

/// The first `term` mark in a linger file (ms).
fn term_mark(marks: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(marks)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("term "))
        .and_then(|v| v.trim().parse().ok())
}

/// kured's contract, for real: the README's reboot profile on three
/// machines, kured's sentinel touched inside two of them, a RebootPolicy
/// with maxUnavailable 1. Each of the two reboots exactly once (its PID 1
/// ends once), one at a time, inside a cordon of its node; comes back with
/// a new boot ID, the sentinel gone with the old boot; a workload pod
/// pinned to it got SIGTERM before its machine went down (its own mark) and
/// runs again after; the third machine is left alone; nothing stays
/// cordoned.
#[test]
fn kureds_contract_reboots_each_machine_once_one_at_a_time() {
    let (_one, env, _tidy) = on_machines("rmkured");
    let ms = machines();
    deploy_reboot_profile(&env);
    let out = support::scratch().join(format!("marks-{}", env.id));
    std::fs::create_dir_all(&out).expect("the marks folder");
    let _ = Command::new("chmod").arg("0777").arg(&out).status();
    let rebooting = [&ms[0], &ms[2]];
    for m in rebooting {
        pinned_workload(&env, &format!("w-{}", m.name), &m.name, &out.join(&m.name));
    }
    let before: Vec<Vec<(String, u64)>> = rebooting
        .iter()
        .map(|m| {
            block_on(wait_for(
                &format!("the workload running on {}", m.name),
                Duration::from_secs(90),
                || async {
                    let p = running_pods(&env, &format!("w-{}", m.name), &m.name);
                    (!p.is_empty()).then_some(p)
                },
            ))
        })
        .collect();
    let boots: Vec<String> = ms.iter().map(Machine::boot_id).collect();
    let log = NodeLog::start(env.client.clone());
    let from = now_ms();

    // Both sentinels before the policy: the agents look when it appears,
    // so both needs reach the first pass and one machine waits its turn.
    for m in rebooting {
        needs_reboot(m);
    }
    create_policy(&env, json!({}));
    for m in rebooting {
        wait_done(&env, &m.name);
    }
    // Progress said done; the facts are the machines' and the watch's.
    for (i, m) in rebooting.iter().enumerate() {
        let name = format!("w-{}", m.name);
        block_on(wait_for(
            &format!("the workload running again on {}", m.name),
            Duration::from_secs(90),
            || async {
                let now = running_pods(&env, &name, &m.name);
                now.iter()
                    .any(|(uid, _)| !before[i].iter().any(|(b, _)| b == uid))
                    .then_some(())
            },
        ));
    }
    let seen = log.finish();
    let (most, which) = most_unavailable(&seen);
    assert!(
        most <= 1,
        "{most} machines unavailable at once: {which:?}; {seen:?}"
    );
    for (i, m) in [(0, &ms[0]), (2, &ms[2])] {
        let down = assert_one_reboot(&seen, m, from, &boots[i], "RebootRequested");
        let term = term_mark(&out.join(&m.name))
            .unwrap_or_else(|| panic!("{}: the workload never got SIGTERM", m.name));
        assert!(
            term < down,
            "{}: SIGTERM reached the workload at {term}, after the machine went down at {down}",
            m.name
        );
        let again = running_pods(&env, &format!("w-{}", m.name), &m.name);
        assert!(
            again.iter().any(|(_, started)| *started > down),
            "{}: no workload container started after the reboot: {again:?}",
            m.name
        );
        eprintln!(
            "machine {}: SIGTERM to the workload {} ms before PID 1 went down; workload running again {} ms after",
            m.name,
            down - term,
            again
                .iter()
                .map(|(_, s)| s.saturating_sub(down))
                .max()
                .unwrap_or_default()
        );
        assert!(
            !m.exec(&["test", "-e", "/var/run/reboot-required"]),
            "{}: the sentinel outlived the reboot",
            m.name
        );
        let end = seen.iter().rev().find(|s| s.node == m.name);
        assert!(
            end.is_some_and(|s| !s.lifecycle.contains("=True/")),
            "{}: a lifecycle condition still True at the end: {end:?}",
            m.name
        );
    }
    // KEP-5683's MaintenancePlanned: the machine that waited said so
    // before its reboot was asked for, and no machine said it after.
    let planned = |m: &Machine| {
        let asked = m.first_since("reboot-requested", from).unwrap_or_default();
        let seen_planned = |s: &&realmachine::Seen| {
            s.node == m.name
                && s.lifecycle
                    .contains("MaintenancePlanned=True/RebootRequested")
        };
        let before = seen.iter().filter(seen_planned).any(|s| s.ms < asked);
        let after = seen.iter().filter(seen_planned).find(|s| s.ms > asked);
        assert!(
            after.is_none(),
            "{}: planned after its reboot request: {after:?}",
            m.name
        );
        before
    };
    let waited = rebooting.iter().filter(|m| planned(m)).count();
    assert!(
        waited >= 1,
        "no machine said MaintenancePlanned while it waited: {seen:?}"
    );
    assert_eq!(
        ms[1].count_since("down", from),
        0,
        "the machine without a sentinel rebooted"
    );
    assert_eq!(ms[1].boot_id(), boots[1]);
    assert_none_cordoned(&env);
}

/// The node agent's container SIGKILLed right after its reboot request
/// (the machine takes 8 s to shut down, as systemd stopping its units; the
/// kubelet restarts the agent meanwhile, in the same boot, beside its own
/// `reboot-issued` record), and again as soon as it runs in the next boot:
/// still exactly one reboot request and one PID-1 exit.
#[test]
fn an_agent_killed_at_the_worst_moment_reboots_its_machine_once() {
    let (_one, env, _tidy) = on_machines("rmkill");
    let m = &machines()[1];
    deploy_reboot_profile(&env);
    let agent = ["/nodekeeper", "run", "--metrics-address :9477"];
    let boot = m.boot_id();
    let log = NodeLog::start(env.client.clone());
    let from = now_ms();
    m.set("shutdown-delay", Some("8"));
    create_policy(&env, json!({}));
    needs_reboot(m);

    wait_host("the agent's reboot request", WAVE, || {
        m.count_since("reboot-requested", from) > 0
    });
    let first = m.processes_with(&agent);
    assert!(!first.is_empty(), "the agent runs in {}", m.name);
    for pid in &first {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let asked = m.first_since("reboot-requested", from).unwrap_or_default();
    let killed = now_ms();
    let mut restarted_in_boot = None;
    wait_host("the machine going down", Duration::from_secs(60), || {
        if restarted_in_boot.is_none()
            && m.processes_with(&agent).iter().any(|p| !first.contains(p))
        {
            restarted_in_boot = Some(now_ms());
        }
        m.count_since("down", from) > 0
    });
    let restarted = restarted_in_boot.unwrap_or_else(|| {
        panic!(
            "the kubelet did not restart the killed agent before the machine went down: {:?}",
            m.records_since(from)
        )
    });
    eprintln!(
        "agent killed {} ms after the reboot request, running again {} ms later, in the same boot",
        killed.saturating_sub(asked),
        restarted - killed
    );

    // The next boot: kill the agent as soon as it runs there, once.
    let mut second = Vec::new();
    wait_host(
        "the agent in the next boot",
        Duration::from_secs(90),
        || {
            m.boot_id() != boot && {
                second = m.processes_with(&agent);
                !second.is_empty()
            }
        },
    );
    for pid in &second {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    wait_host(
        "the agent restarted in the next boot",
        Duration::from_secs(60),
        || m.processes_with(&agent).iter().any(|p| !second.contains(p)),
    );
    wait_done(&env, &m.name);
    let seen = log.finish();
    assert_one_reboot(&seen, m, from, &boot, "RebootRequested");
    assert_none_cordoned(&env);
}

/// A machine that does not come back: held off after its reboot, it
/// misses the 10 s return deadline, and the policy says so (condition,
/// event, metric) while no second machine is admitted; booted later, it
/// completes, and only then is the second taken.
#[test]
fn a_machine_that_does_not_come_back_holds_its_slot_until_it_does() {
    let (_one, env, _tidy) = on_machines("rmoff");
    let ms = machines();
    deploy_reboot_profile(&env);
    let pair = [&ms[0], &ms[2]];
    let boots: Vec<String> = pair.iter().map(|m| m.boot_id()).collect();
    let log = NodeLog::start(env.client.clone());
    let from = now_ms();
    for m in pair {
        m.set("off", Some(""));
    }
    create_policy(&env, json!({"reboot": {"returnTimeoutSeconds": 10}}));
    for m in pair {
        needs_reboot(m);
    }
    wait_host("one of the two machines down", WAVE, || {
        pair.iter().any(|m| m.count_since("down", from) > 0)
    });
    let (a, b, boot_a, boot_b) = if pair[0].count_since("down", from) > 0 {
        (pair[0], pair[1], &boots[0], &boots[1])
    } else {
        (pair[1], pair[0], &boots[1], &boots[0])
    };
    let policies: Api<RebootPolicy> = Api::all(env.client.clone());
    let message = block_on(wait_for(
        "the NodeNotReturned condition",
        Duration::from_secs(90),
        || async {
            let p = policies.get(&env.id).await.ok()?;
            let c = p
                .status?
                .conditions
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "NodeNotReturned" && c.status == "True")?;
            Some(c.message)
        },
    ));
    assert!(
        message.contains(&a.name),
        "the condition names {}: {message}",
        a.name
    );
    block_on(wait_for(
        "the NodeNotReturned event",
        Duration::from_secs(30),
        || async {
            (support::machines::events_for(&env.client, &a.name, "NodeNotReturned").await
                + support::machines::events_for(&env.client, &env.id, "NodeNotReturned").await
                > 0)
            .then_some(())
        },
    ));
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let metric = block_on(wait_for(
        "nodekeeper_reboot_not_returned_total on the cluster role",
        Duration::from_secs(30),
        || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let total: f64 = list
                .items
                .iter()
                .filter(|p| p.name_any().starts_with("nodekeeper-cluster-"))
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .filter_map(|ip| realmachine::http_body(&format!("{ip}:9477"), "/metrics"))
                .flat_map(|body| {
                    body.lines()
                        .filter_map(|l| l.strip_prefix("nodekeeper_reboot_not_returned_total "))
                        .filter_map(|v| v.trim().parse::<f64>().ok())
                        .collect::<Vec<_>>()
                })
                .sum();
            (total >= 1.0).then_some(total)
        },
    ));
    // Held off past its deadline, and b not taken in all that time (the
    // watch decides below, over the whole run).
    let turned_on = now_ms();
    a.set("off", None);
    b.set("off", None);
    wait_done(&env, &a.name);
    wait_done(&env, &b.name);
    let seen = log.finish();
    assert_one_reboot(&seen, a, from, boot_a, "RebootRequested");
    assert_one_reboot(&seen, b, from, boot_b, "RebootRequested");
    let a_back = first_after(&seen, &a.name, turned_on, |s| s.boot != *boot_a && s.ready)
        .map(|s| s.ms)
        .unwrap_or_default();
    let b_taken = first_after(&seen, &b.name, from, |s| s.cordoned)
        .map(|s| s.ms)
        .unwrap_or_default();
    assert!(
        b_taken > a_back,
        "{} was taken at {b_taken}, before {} came back at {a_back}",
        b.name,
        a.name
    );
    eprintln!(
        "{} held off {} ms; NodeNotReturned metric {metric}; {} taken {} ms after {} came back",
        a.name,
        turned_on - a.first_since("down", from).unwrap_or_default(),
        b.name,
        b_taken - a_back,
        a.name
    );
    assert_none_cordoned(&env);
}

/// An in-place OS upgrade: an UpgradePlan with `versionFrom: OSImage`
/// whose command writes the new /etc/os-release inside the machine, then
/// `reboot: true`; a before-hook Job per machine that runs on another
/// machine. Each machine upgraded once, one at a time, its hook done
/// before its cordon, verified by the osImage the kubelet reports after
/// the reboot and a new boot ID.
/// The upgrade profile (`manifests --for k3s --upgrade`). Each machine's
/// upgrade command needs what the agent's container does not have: 200 MiB
/// (its limit is 64 MiB) and the host's network namespace (it records the
/// one it ran in). The first machine's agent pod is force-deleted while its
/// command runs (a DaemonSet rollout); the command, the host's own process,
/// runs on, and the agent the DaemonSet starts anew publishes its result
/// (the command ended after the old agent was gone). Each machine is
/// upgraded once: the commands' own marks count the runs.
#[test]
fn an_in_place_os_upgrade_upgrades_each_machine_once() {
    let (_one, env, _tidy) = on_machines("rmupgrade");
    let ms = machines();
    deploy_profile(&env, "--upgrade");
    // Shared with the machines (they share the host's /tmp).
    let marks = support::scratch().join(format!("upgrade-marks-{}", env.id));
    std::fs::create_dir_all(&marks).expect("the marks' folder");
    let marks_dir = marks.display().to_string();
    let boots: Vec<String> = ms.iter().map(Machine::boot_id).collect();
    let log = NodeLog::start(env.client.clone());
    let from = now_ms();
    // A version no earlier run left on these machines (their os-release
    // persists across runs on one host), of fixed width so that no other
    // run's contains it.
    let version = format!("r{from:015}");
    let hook_job = json!({"template": {"spec": {
        "restartPolicy": "Never",
        "nodeSelector": {REAL_NODE_KEY: "true"},
        "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "check", "image": "localhost/nodekeeper:0.1.0",
            "imagePullPolicy": "Never", "args": ["version"]}]}}});
    // {node} and {version} are the plan's; MARKS is this test's folder.
    // The first command to start sleeps 25 s: time to replace its agent.
    let command = r#"m=MARKS; echo "start $(date +%s%3N)" >> $m/{node}.runs
readlink /proc/self/ns/net > $m/{node}.net
x=$(head -c 209715200 /dev/zero | tr '\000' a); echo "${#x}" > $m/{node}.bytes
if mkdir $m/slow 2>/dev/null; then echo {node} > $m/slow/node; sleep 25; fi
printf 'NAME="nodekeeper test machine"\nVERSION_ID={version}\nPRETTY_NAME="nodekeeper test machine {version}"\n' > /etc/os-release
echo "done $(date +%s%3N)" >> $m/{node}.runs"#
        .replace("MARKS", &marks_dir);
    let plan: UpgradePlan = serde_json::from_value(json!({
        "apiVersion": "nodekeeper.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": env.id},
        "spec": {
            "nodeSelector": {"matchLabels": {REAL_NODE_KEY: "true"}},
            "version": version,
            "versionFrom": {"source": "OSImage"},
            "budget": {"maxUnavailable": 1},
            "strategy": {"type": "InPlace", "reboot": true, "command": ["sh", "-c", command]},
            "hooks": {"before": [{"name": "check", "namespace": env.ns, "deadlineSeconds": 120, "job": hook_job}]},
        }
    }))
    .expect("an UpgradePlan");
    block_on(Api::<UpgradePlan>::all(env.client.clone()).create(&PostParams::default(), &plan))
        .expect("creating the UpgradePlan");
    let nodes: Api<Node> = Api::all(env.client.clone());
    // Where each hook Job's pod ran, noted while it exists: a finished pod
    // goes with the drain of the machine it ran on.
    let job_pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let ran_on = std::cell::RefCell::new(std::collections::BTreeMap::<String, String>::new());
    let upgraded = format!("nodekeeper test machine {version}");
    // The first command sleeps: its agent pod goes, force-deleted.
    let slow = marks.join("slow").join("node");
    wait_host("the first upgrade command running", WAVE, || slow.exists());
    let slow_node = std::fs::read_to_string(&slow)
        .unwrap_or_default()
        .trim()
        .to_string();
    let machine = ms
        .iter()
        .find(|m| m.name == slow_node)
        .unwrap_or_else(|| panic!("the slow command's node {slow_node:?} is a machine"));
    let agent_words = ["/nodekeeper", "run", "--metrics-address :9477"];
    let old_agent = machine.processes_with(&agent_words);
    assert!(!old_agent.is_empty(), "the agent runs in {}", machine.name);
    let agents: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let agent_pod = block_on(agents.list(&ListParams::default()))
        .expect("the agent pods")
        .items
        .into_iter()
        .find(|p| {
            p.owner_references().iter().any(|o| o.kind == "DaemonSet")
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&machine.name)
        })
        .expect("an agent pod on the machine");
    kubectl(
        &[
            "-n",
            NS,
            "delete",
            "pod",
            &agent_pod.name_any(),
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    let mut old_gone = 0;
    wait_host("the old agent gone", Duration::from_secs(60), || {
        old_gone = now_ms();
        machine
            .processes_with(&agent_words)
            .iter()
            .all(|p| !old_agent.contains(p))
    });
    block_on(wait_for(
        "every machine on the new version",
        WAVE,
        || async {
            let lp = ListParams::default().labels("batch.kubernetes.io/job-name");
            for p in job_pods
                .list(&lp)
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let job = p.labels().get("batch.kubernetes.io/job-name").cloned();
                if let (Some(job), Some(node)) = (job, p.spec.and_then(|s| s.node_name)) {
                    ran_on.borrow_mut().insert(job, node);
                }
            }
            for m in ms {
                let n = nodes.get(&m.name).await.ok()?;
                let info = n.status?.node_info?;
                (info.os_image == upgraded).then_some(())?;
            }
            Some(())
        },
    ));
    let plans: Api<UpgradePlan> = Api::all(env.client.clone());
    block_on(wait_for(
        "the plan done with every machine",
        WAVE,
        || async {
            let p = plans.get(&env.id).await.ok()?;
            let v = serde_json::to_value(p.status?).ok()?;
            let nodes = v.get("nodes")?.as_array()?.clone();
            (nodes.len() == ms.len()
                && nodes
                    .iter()
                    .all(|n| n.get("phase").and_then(|p| p.as_str()) == Some("Done")))
            .then_some(())
        },
    ));
    let seen = log.finish();
    let (most, which) = most_unavailable(&seen);
    assert!(
        most <= 1,
        "{most} machines unavailable at once: {which:?}; {seen:?}"
    );
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    let jobs = block_on(jobs.list(&ListParams::default()))
        .expect("the hook Jobs")
        .items;
    let ran_on = ran_on.into_inner();
    for (i, m) in ms.iter().enumerate() {
        assert_one_reboot(&seen, m, from, &boots[i], "UpgradeRequested");
        let job = jobs
            .iter()
            .find(|j| j.labels().values().any(|v| v == &m.name))
            .unwrap_or_else(|| panic!("no hook Job for {}", m.name));
        let done = job
            .status
            .as_ref()
            .and_then(|s| s.completion_time.as_ref())
            .map(|t| t.0.as_millisecond() as u64)
            .unwrap_or_else(|| panic!("{}'s hook Job did not complete", m.name));
        let cordoned = first_after(&seen, &m.name, from, |s| s.cordoned)
            .map(|s| s.ms)
            .unwrap_or_default();
        // completionTime has whole seconds.
        assert!(
            done <= cordoned + 999,
            "{}: hook done at {done}, cordoned at {cordoned}",
            m.name
        );
        let node = ran_on.get(&job.name_any());
        assert!(
            node.is_some_and(|n| *n != m.name && ms.iter().any(|x| &x.name == n)),
            "{}'s hook ran on {node:?}: another machine expected ({ran_on:?})",
            m.name
        );
        // The command's own marks: one run, with the host's memory and
        // network.
        let read = |ext: &str| {
            std::fs::read_to_string(marks.join(format!("{}.{ext}", m.name))).unwrap_or_default()
        };
        let runs = read("runs");
        assert_eq!(
            runs.lines().filter(|l| l.starts_with("start ")).count(),
            1,
            "{}: one upgrade command: {runs}",
            m.name
        );
        assert_eq!(
            read("bytes").trim(),
            "209715200",
            "{}: 200 MiB held",
            m.name
        );
        let host_net = std::fs::read_link("/proc/self/ns/net").expect("the host's net namespace");
        assert_eq!(
            read("net").trim(),
            host_net.display().to_string(),
            "{}: the command ran in the host's network namespace",
            m.name
        );
        if m.name == machine.name {
            let done: u64 = runs
                .lines()
                .find_map(|l| l.strip_prefix("done "))
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or_default();
            assert!(
                done > old_gone,
                "{}: the command ended ({done}) after its first agent was gone ({old_gone}): the next agent published its result",
                m.name
            );
            eprintln!(
                "{}: agent replaced mid-upgrade; the command ended {} ms after the old agent was gone",
                m.name,
                done - old_gone
            );
        }
    }
    assert_none_cordoned(&env);
}

/// The static pod with `--reboot` (the README's kubeconfig recipe, as
/// written, then `manifests --for static-pod --reboot` in the kubelet's
/// folder) reboots its own machine once, and runs again after the boot.
#[test]
fn the_static_pod_with_reboot_reboots_its_own_machine_once() {
    let (_one, env, _tidy) = on_machines("rmstatic");
    let m = &machines()[2];
    deploy_reboot_profile(&env);
    // The DaemonSet's agents off the machines: one agent per node.
    kubectl(
        &[
            "-n",
            NS,
            "delete",
            "daemonset",
            "nodekeeper",
            "--wait=true",
            "--timeout=90s",
        ],
        None,
    );
    wait_host("no DaemonSet agent left", Duration::from_secs(60), || {
        machines().iter().all(|x| {
            x.processes_with(&["/nodekeeper", "run", "--metrics-address :9477"])
                .is_empty()
        })
    });
    let _cleanup = StaticPod(m);
    let kubeconfig_line = realnode::readme_recipe("Static pod")
        .into_iter()
        .find(|l| l.contains("host-kubeconfig"))
        .expect("the README's static-pod recipe writes a host kubeconfig");
    let line = kubeconfig_line
        .replacen("nodekeeper ", &format!("{} ", shipped_bin().display()), 1)
        .replace("worker-1", &m.name);
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &line])
        .env("KUBECONFIG", support::cluster())
        .output()
        .expect("running the recipe line");
    assert!(
        out.status.success(),
        "recipe line failed: {line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = Command::new(shipped_bin())
        .args(["manifests", "--for", "static-pod", "--reboot"])
        .output()
        .expect("manifests --for static-pod --reboot");
    assert!(manifest.status.success());
    let tmp = m.manifests.join(".static-pod.yaml.tmp");
    std::fs::write(&tmp, &manifest.stdout).expect("writing the manifest");
    std::fs::rename(&tmp, m.manifests.join("static-pod.yaml")).expect("placing the manifest");
    let agent = ["/nodekeeper", "run", "127.0.0.1:9477"];
    wait_host("the static pod's agent", Duration::from_secs(90), || {
        !m.processes_with(&agent).is_empty()
    });
    let boot = m.boot_id();
    let log = NodeLog::start(env.client.clone());
    let from = now_ms();
    create_policy(
        &env,
        json!({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": m.name}}}),
    );
    needs_reboot(m);
    wait_done(&env, &m.name);
    wait_host(
        "the static pod's agent in the new boot",
        Duration::from_secs(90),
        || m.boot_id() != boot && !m.processes_with(&agent).is_empty(),
    );
    let seen = log.finish();
    assert_one_reboot(&seen, m, from, &boot, "RebootRequested");
    assert_none_cordoned(&env);
}

/// Removes the static pod and the host kubeconfig when dropped.
struct StaticPod<'a>(&'a Machine);

impl Drop for StaticPod<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.manifests.join("static-pod.yaml"));
        let _ = std::fs::remove_file("/etc/nodekeeper/kubeconfig");
        let _ = std::fs::remove_dir("/etc/nodekeeper");
    }
}
