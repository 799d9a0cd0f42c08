//! nodekeeper baked into a real OS image (tests/osimage: Debian, systemd as
//! PID 1 under systemd-nspawn, containerd, the kubelet, nodekeeper.service
//! installed as the README's systemd mode says), booted as nodes of the test
//! cluster: the shipped systemd unit runs the node agent under systemd, a
//! RebootPolicy reboots each machine through real `systemctl reboot`
//! (systemd's own shutdown, nspawn's exit 133, a new boot ID), an
//! UpgradePlan upgrades each through the unit's upgrade profile with a real
//! package operation, and the reboot profile's static pod reboots a machine
//! through the same systemd. One machine with its cluster role on it, a
//! one-node cluster for its pods, is rebooted and given back by its agent
//! ([`single_machine`]). nodekeeper comes from its Debian package on os-0
//! and from its systemd system extension, merged at boot, on os-1; a newer
//! package installed on a running machine restarts only the agent
//! ([`package`]).
//!
//! Every claim is checked independently of nodekeeper's status: the
//! machines' own records (boots and exits, host clock), what runs inside
//! (systemctl, dpkg, journalctl), the console, and the API server. Timings
//! of each reboot are printed (`--nocapture`).

use crate::osmachine;
#[allow(dead_code)] // the PID-namespace machines: only the node watch is used here
use crate::realmachine;
use crate::realnode;
use crate::support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use nodekeeper::api::reboot::RebootPolicy;
use nodekeeper::api::upgrade::{UpgradePhase, UpgradePlan};
use osmachine::{LABEL_KEY, OsMachine, machines};
use realmachine::{NodeLog, Seen, first_after, most_unavailable, now_ms};
use serde_json::json;
use support::{GROUP_LABEL, TestEnv, block_on, wait_for};

mod package;
mod single_machine;
mod static_pod;
mod upgrade;

/// A wave of reboots on the machines, start to end.
const WAVE: Duration = Duration::from_secs(240);

/// One test at a time: they share the machines.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The machines in the test's group (`GROUP_LABEL=env.id`) while the
/// guard lives; the label, sentinels and objects of the test removed after.
struct InGroup<'a> {
    env: &'a TestEnv,
    machines: Vec<&'static OsMachine>,
}

impl<'a> InGroup<'a> {
    fn new(env: &'a TestEnv, machines: Vec<&'static OsMachine>) -> InGroup<'a> {
        for m in &machines {
            label(&m.name, Some(&env.id));
        }
        InGroup { env, machines }
    }
}

impl Drop for InGroup<'_> {
    fn drop(&mut self) {
        for kind in ["rebootpolicies.nodekeeper.io", "upgradeplans.nodekeeper.io"] {
            let _ = support::kubectl(
                &[
                    "delete",
                    kind,
                    "-l",
                    &format!("{GROUP_LABEL}={}", self.env.id),
                    "--wait=false",
                ],
                None,
            );
        }
        for m in &self.machines {
            label(&m.name, None);
            let _ = m.exec(&["rm", "-f", "/var/run/reboot-required"]);
            // A failed test leaves its feature's maintenance (a failed
            // upgrade keeps its node by design): the machine's own agent
            // gives the node back once it is deleted.
            for feature in ["reboot", "upgrade"] {
                let _ = support::kubectl(
                    &[
                        "delete",
                        "nodemaintenances.nodemaintenance.medik8s.io",
                        &format!("{feature}-{}", m.name),
                        "--ignore-not-found",
                        "--wait=false",
                    ],
                    None,
                );
            }
        }
    }
}

fn label(node: &str, group: Option<&str>) {
    let value = match group {
        Some(g) => format!("{GROUP_LABEL}={g}"),
        None => format!("{GROUP_LABEL}-"),
    };
    let out = support::kubectl(&["label", "node", node, &value, "--overwrite"], None);
    assert!(
        out.status.success() || group.is_none(),
        "labelling {node}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn selector() -> String {
    format!("{LABEL_KEY}=true")
}

async fn node(env: &TestEnv, name: &str) -> Option<Node> {
    Api::<Node>::all(env.client.clone()).get(name).await.ok()
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn boot_of(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

/// When nodekeeper.service logged `words` in the boot before this one
/// (the image keeps its journal): host-clock milliseconds.
fn logged_in_last_boot(m: &OsMachine, words: &str) -> Option<u64> {
    let out = m
        .exec(&[
            "journalctl",
            "-b",
            "-1",
            "-u",
            "nodekeeper",
            "--no-pager",
            "-o",
            "short-unix",
            "--grep",
            words,
        ])
        .1;
    let line = out.lines().rfind(|l| l.contains(words))?;
    let secs: f64 = line.split_whitespace().next()?.parse().ok()?;
    Some((secs * 1000.0) as u64)
}

/// One reboot of a machine, from its records and the node watch.
struct RebootTimes {
    machine: String,
    /// nodekeeper.service logged that it reboots the node.
    asked: Option<u64>,
    down: u64,
    boot: u64,
    ready: Option<u64>,
}

impl RebootTimes {
    fn print(&self) {
        let since = |t: Option<u64>, from: u64| {
            t.map(|t| format!("{} ms", t as i64 - from as i64))
                .unwrap_or_else(|| "?".into())
        };
        println!(
            "{}: `systemctl reboot` asked → nspawn exited 133: {}; → booted again: {}; → Node Ready with the new boot ID: {}",
            self.machine,
            self.asked
                .map(|a| format!("{} ms", self.down as i64 - a as i64))
                .unwrap_or_else(|| "?".into()),
            since(Some(self.boot), self.asked.unwrap_or(self.down)),
            since(self.ready, self.asked.unwrap_or(self.down)),
        );
    }
}

/// Exactly one reboot of `m` since `from`, through systemd's shutdown:
/// one nspawn exit with 133, one new boot whose ID the Node reports.
fn one_real_reboot(m: &OsMachine, from: u64, log: &[Seen], context: &str) -> RebootTimes {
    let downs = m.records_since("down", from);
    let boots = m.records_since("boot", from);
    assert_eq!(
        downs.len(),
        1,
        "{}: one shutdown since the test began: {downs:?}\n{context}",
        m.name
    );
    assert_eq!(
        downs[0].1, "exit=133",
        "{}: nspawn's exit means a reboot",
        m.name
    );
    assert_eq!(boots.len(), 1, "{}: one boot since: {boots:?}", m.name);
    let (boot_ms, boot_id) = boots[0].clone();
    assert_eq!(boot_id, m.boot_id());
    let ready =
        first_after(log, &m.name, downs[0].0, |s| s.ready && s.boot == boot_id).map(|s| s.ms);
    RebootTimes {
        machine: m.name.clone(),
        asked: logged_in_last_boot(m, "rebooting by"),
        down: downs[0].0,
        boot: boot_ms,
        ready,
    }
}

/// Wait until every machine of `ms` booted since `from` is back: Ready
/// with a boot ID other than `before`'s, schedulable, in no maintenance.
fn wait_back(env: &TestEnv, ms: &[&OsMachine], before: &BTreeMap<String, String>, what: &str) {
    block_on(wait_for(what, WAVE, || async {
        let nms = Api::<NodeMaintenance>::all(env.client.clone())
            .list(&ListParams::default())
            .await
            .ok()?;
        for m in ms {
            let n = node(env, &m.name).await?;
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            let held = nms.items.iter().any(|x| x.spec.node_name == m.name);
            if !ready(&n) || cordoned || held || Some(&boot_of(&n)) == before.get(&m.name) {
                return None;
            }
        }
        Some(())
    }));
}

fn boots(env: &TestEnv, ms: &[&OsMachine]) -> BTreeMap<String, String> {
    block_on(async {
        let mut out = BTreeMap::new();
        for m in ms {
            let n = node(env, &m.name).await.expect("the machine's Node");
            out.insert(m.name.clone(), boot_of(&n));
        }
        out
    })
}

/// nodekeeper's image in the machine's containerd (the shipped manifests
/// name it and never pull it).
fn import_image(m: &OsMachine) {
    std::fs::copy(
        realnode::image_archive(),
        m.root.join("var/tmp/nodekeeper.oci.tar"),
    )
    .expect("the image into the machine");
    m.run(&[
        "ctr",
        "-n",
        "k8s.io",
        "images",
        "import",
        "/var/tmp/nodekeeper.oci.tar",
    ]);
}

/// A RebootPolicy (or UpgradePlan) for the group, with a group label of its
/// own so [`InGroup`] removes it.
fn create(env: &TestEnv, kind: &str, spec: serde_json::Value) -> String {
    let name = format!("{}-{}", env.id, kind.to_lowercase());
    let mut spec = spec;
    spec["nodeSelector"] = json!({"matchLabels": {GROUP_LABEL: env.id}});
    support::apply(&json!({
        "apiVersion": "nodekeeper.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "labels": {GROUP_LABEL: env.id}},
        "spec": spec,
    }));
    name
}

/// On both machines — nodekeeper from its Debian package on os-0, from its
/// system extension merged at boot on os-1 — the shipped unit runs the
/// agent: systemd restarts it after a SIGKILL, and it drains its node for a
/// NodeMaintenance and gives it back.
#[test]
fn the_shipped_unit_runs_the_agent_restarts_it_after_sigkill_and_drains_its_node() {
    let _one = exclusive();
    let env = block_on(TestEnv::new("osunit"));
    for (i, m) in machines().iter().enumerate() {
        installed_as_shipped(m);
        restarted_after_sigkill(m);
        drained_and_given_back(&env, m, i);
        support::machines::assert_refused_nothing(&format!("{}'s agent", m.name), &m.journal());
    }
}

/// The unit is the shipped one, from where the machine's install put it,
/// with the machine's drop-in and the reboot profile's.
fn installed_as_shipped(m: &OsMachine) {
    // Read inside: an extension's /usr is merged in the machine only.
    let installed = m.run(&["cat", "/usr/lib/systemd/system/nodekeeper.service"]);
    assert!(
        installed.contains("ExecStart=/usr/bin/nodekeeper run"),
        "{}: {installed}",
        m.name
    );
    let (_, status) = m.exec(&[
        "dpkg-query",
        "-W",
        "-f",
        "${Status} ${Version}",
        "nodekeeper",
    ]);
    if m.install == "package" {
        // dpkg in the image being built; its postinst enabled the unit.
        assert!(status.starts_with("install ok installed "), "{status}");
        assert_eq!(m.unit("UnitFileState"), "enabled");
    } else {
        // No package; systemd-sysext merged the extension at boot, and the
        // extension's wants link started the unit.
        let raw = m.install.strip_prefix("sysext ").expect("sysext NAME");
        let name = raw.trim_end_matches(".raw");
        assert!(!status.contains("ok installed"), "{}: {status}", m.name);
        let merged = m.run(&["systemd-sysext", "status"]);
        assert!(
            merged
                .lines()
                .any(|l| l.starts_with("/usr") && l.contains(name)),
            "{}: /usr merged with {name}:\n{merged}",
            m.name
        );
        let (_, active) = m.exec(&["systemctl", "is-active", "systemd-sysext.service"]);
        assert_eq!(
            active.trim(),
            "active",
            "{}: systemd-sysext.service",
            m.name
        );
        let wanted = m.run(&[
            "systemctl",
            "show",
            "-p",
            "WantedBy",
            "--value",
            "nodekeeper.service",
        ]);
        assert!(wanted.contains("multi-user.target"), "{}: {wanted}", m.name);
    }
    let dropins = m.unit("DropInPaths");
    assert!(
        dropins.contains("10-machine.conf") && dropins.contains("reboot-cap-sys-admin.conf"),
        "{}: the machine's drop-in and the reboot profile's: {dropins}",
        m.name
    );
    assert_eq!(m.unit("ActiveState"), "active", "{}", m.journal());
}

fn restarted_after_sigkill(m: &OsMachine) {
    let first: u32 = m.unit("MainPID").parse().unwrap_or(0);
    assert!(
        first > 0,
        "{}: nodekeeper.service has a main process",
        m.name
    );
    m.run(&["kill", "-KILL", &first.to_string()]);
    let second = block_on(wait_for(
        "systemd restarts nodekeeper after its SIGKILL",
        Duration::from_secs(60),
        || async {
            let pid: u32 = m.unit("MainPID").parse().unwrap_or(0);
            (pid != 0 && pid != first && m.unit("ActiveState") == "active").then_some(pid)
        },
    ));
    assert!(m.unit("NRestarts").parse::<u32>().unwrap_or(0) >= 1);
    println!(
        "{} ({}): nodekeeper {first} killed, systemd started {second}",
        m.name, m.install
    );
}

/// A workload on the machine, then a NodeMaintenance for it: Succeeded
/// with the node cordoned and the pod evicted; deleted, the node given back.
fn drained_and_given_back(env: &TestEnv, m: &OsMachine, i: usize) {
    let app = format!("osload-{i}");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app, "namespace": env.ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": m.name},
                "tolerations": [{"key": LABEL_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "pause", "image": "localhost/pause:nodekeeper", "imagePullPolicy": "Never"}]}}}
    }))
    .expect("a deployment");
    block_on(async {
        Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
            .create(&PostParams::default(), &deployment)
            .await
            .expect("creating the workload");
    });
    let running = block_on(wait_for(
        "the workload runs on the machine",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .ok()?;
            list.items.into_iter().find(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(m.name.as_str())
            })
        },
    ));
    let nm = NodeMaintenance::new(
        &format!("{}-os{i}", env.id),
        NodeMaintenanceSpec {
            node_name: m.name.clone(),
            reason: Some("os image test".into()),
        },
    );
    let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
    block_on(async {
        nms.create(&PostParams::default(), &nm)
            .await
            .expect("creating the NodeMaintenance");
    });
    let name = nm.name_any();
    block_on(wait_for(
        "the maintenance Succeeded",
        Duration::from_secs(90),
        || async {
            let got = nms.get(&name).await.ok()?;
            (got.phase() == Some(Phase::Succeeded)).then_some(())
        },
    ));
    block_on(async {
        let n = node(env, &m.name).await.expect("the Node");
        assert_eq!(n.spec.and_then(|s| s.unschedulable), Some(true), "cordoned");
        let left = pods.get_opt(&running.name_any()).await.ok().flatten();
        assert!(
            left.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
            "the workload's pod was evicted"
        );
        nms.delete(&name, &DeleteParams::default())
            .await
            .expect("ending the maintenance");
        Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
            .delete(&app, &DeleteParams::default())
            .await
            .expect("removing the workload");
    });
    block_on(wait_for(
        "the node given back",
        Duration::from_secs(60),
        || async {
            let n = node(env, &m.name).await?;
            (n.spec.and_then(|s| s.unschedulable) != Some(true)
                && nms.get_opt(&name).await.ok()?.is_none())
            .then_some(())
        },
    ));
}

/// A RebootPolicy reboots each machine once, one at a time, through the
/// unit's reboot profile: `systemctl reboot` as systemd runs it (units
/// stopped, the reboot target), nspawn's exit 133, a new boot ID from the
/// kernel side; the sentinel (on /run, a tmpfs) gone after.
#[test]
fn a_reboot_policy_reboots_each_machine_through_systemd_once() {
    let _one = exclusive();
    let env = block_on(TestEnv::new("osreboot"));
    let ms: Vec<&OsMachine> = machines().iter().collect();
    let _group = InGroup::new(&env, ms.clone());
    let log = NodeLog::start_labelled(env.client.clone(), &selector());
    let before = boots(&env, &ms);
    let from = now_ms();
    for m in &ms {
        m.run(&["touch", "/var/run/reboot-required"]);
    }
    let cluster = support::machines::cluster_role(&env, &["--node-agents"]);
    let policy = create(
        &env,
        "RebootPolicy",
        json!({"budget": {"maxUnavailable": 1}, "detect": {"periodSeconds": 5}}),
    );
    let context = || {
        let mut s = format!("cluster role:\n{}", cluster.log_text());
        for m in &ms {
            s += &format!("\n{} journal:\n{}", m.name, m.journal());
        }
        s
    };
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_back(&env, &ms, &before, "every machine rebooted and given back")
    }));
    if waited.is_err() {
        panic!("the wave did not finish\n{}", context());
    }
    // The policy marks each node done once back; then nothing else runs.
    block_on(wait_for(
        "the policy records both reboots",
        Duration::from_secs(60),
        || async {
            let p = Api::<RebootPolicy>::all(env.client.clone())
                .get(&policy)
                .await
                .ok()?;
            (p.status?.done == 2).then_some(())
        },
    ));
    let seen = log.finish();
    let (most, which) = most_unavailable(&seen);
    assert!(most <= 1, "over budget: {which:?} at once\n{seen:#?}");
    for m in &ms {
        let times = one_real_reboot(m, from, &seen, &context());
        times.print();
        let console = m.console();
        assert!(
            console.contains("systemd-reboot.service"),
            "{}: systemd's own reboot ran (its console):\n{console}",
            m.name
        );
        let (gone, _) = m.exec(&["test", "-e", "/var/run/reboot-required"]);
        assert!(
            !gone,
            "{}: the sentinel is on /run, gone with the boot",
            m.name
        );
        let n = block_on(node(&env, &m.name)).expect("the Node");
        assert_eq!(
            boot_of(&n),
            m.boot_id(),
            "{}: the Node reports the new boot",
            m.name
        );
    }
}
