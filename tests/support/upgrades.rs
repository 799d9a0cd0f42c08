//! Simulated upgrades for UpgradePlan tests, and an independent timeline.
//!
//! The plan's upgrade command is a tiny script that appends the version to
//! the node's marker file (`<node>.upgrades`). [`serve`] notices each new
//! line and does what the new OS would: the node reports the version (a
//! label, set by the test as the machine's OS would) and the node agent is
//! restarted (SIGKILL, then a fresh start), as it is when the host's
//! software changes under it.
//!
//! [`Timeline`] watches the plan's hook Jobs, the group's nodes and every
//! NodeMaintenance on its own and records, in order, when each Job appeared
//! (with its stage and node), when a node became unavailable (cordoned or
//! NotReady) and available again, when a NodeMaintenance first named a
//! node (`nm <node> <name>`); the serve loop adds each upgrade command. Ordering and
//! budget claims are asserted from it, never from the plan's status.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::upgrade::{UpgradePhase, UpgradePlan, UpgradePlanSpec};
use nodekeeper::runtime::Latch;
use serde_json::json;
use smol::stream::StreamExt;

use super::machines::{Fleet, LONG, unavailable};
use super::write_order::{Arrived, in_write_order, rv_of};
use super::{GROUP_LABEL, TestEnv, block_on, wait_for};

/// The label a simulated node reports its OS version in.
pub const VERSION_LABEL: &str = "nodekeeper.test/os-version";
pub const CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";

/// The upgrade command: append the version to the node's marker file (the
/// node name and version only ever travel as arguments).
pub fn command(fleet: &Fleet) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo \"$1\" >> \"$0\"".into(),
        fleet.file("{node}.upgrades").display().to_string(),
        "{version}".into(),
    ]
}

/// The versions the upgrade command was run with on `node`, in order.
pub fn runs(fleet: &Fleet, node: &str) -> Vec<String> {
    std::fs::read_to_string(fleet.file(&format!("{node}.upgrades")))
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Set the version a node reports.
pub async fn report_version(client: &Client, node: &str, version: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {VERSION_LABEL: version}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("setting the version of {node}: {e}"));
}

/// Serve upgrade commands until `done`, or panic after `limit`: per new
/// line, the node reports that version and its agent restarts.
pub fn serve(
    fleet: &Arc<Fleet>,
    timeline: &Timeline,
    nodes: &[String],
    limit: Duration,
    done: impl FnMut() -> bool,
) {
    serve_taking(fleet, timeline, nodes, limit, Duration::ZERO, done)
}

/// [`serve`] where each upgrade takes `upgrade` (each on its own thread,
/// so machines upgrade at once as they would).
pub fn serve_taking(
    fleet: &Arc<Fleet>,
    timeline: &Timeline,
    nodes: &[String],
    limit: Duration,
    upgrade: Duration,
    mut done: impl FnMut() -> bool,
) {
    let start = Instant::now();
    let mut threads = Vec::new();
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        for n in nodes {
            let ran = runs(fleet, n);
            let seen = served.entry(n.clone()).or_default();
            while *seen < ran.len() {
                let version = ran[*seen].clone();
                *seen += 1;
                timeline.push(format!("command {n}"));
                let (fleet, n) = (fleet.clone(), n.clone());
                let work = move || {
                    std::thread::sleep(upgrade);
                    fleet.kill_agent(&n);
                    block_on(report_version(&fleet.client, &n, &version));
                    fleet.start_agent(&n);
                };
                if upgrade.is_zero() {
                    work();
                } else {
                    threads.push(std::thread::spawn(work));
                }
            }
        }
        if done() {
            for t in threads {
                t.join().expect("a simulated upgrade panicked");
            }
            return;
        }
        if start.elapsed() >= limit {
            let plans = super::kubectl(&["get", "upgradeplans", "-o", "yaml"], None);
            let jobs = super::kubectl(&["get", "jobs", "-A", "-o", "wide"], None);
            panic!(
                "the upgrades did not finish within {limit:?}\ntimeline: {:#?}\nplans:\n{}\njobs:\n{}",
                timeline.events(),
                String::from_utf8_lossy(&plans.stdout),
                String::from_utf8_lossy(&jobs.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `count` Ready nodes reporting version `v1`, the first `control_planes`
/// of them labelled as control plane.
pub async fn nodes(env: &mut TestEnv, count: usize, control_planes: usize) -> Vec<String> {
    let names = super::machines::nodes(env, count).await;
    for (i, n) in names.iter().enumerate() {
        let mut labels = json!({VERSION_LABEL: "v1"});
        if i < control_planes {
            labels[CONTROL_PLANE] = json!("");
        }
        Api::<Node>::all(env.client.clone())
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .unwrap_or_else(|e| panic!("labelling {n}: {e}"));
    }
    names
}

/// A plan over the test's nodes to version `v2`, reading the version
/// label and upgrading with the fleet's command; `spec` is merged over it.
pub async fn create_plan(env: &TestEnv, fleet: &Fleet, spec: serde_json::Value) -> String {
    let mut full = json!({
        "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id}},
        "version": "v2",
        "versionFrom": {"source": "Label", "key": VERSION_LABEL},
        "strategy": {"command": command(fleet)},
    });
    merge(&mut full, spec);
    let spec: UpgradePlanSpec = serde_json::from_value(full).expect("a plan spec");
    let p = UpgradePlan::new(&env.id, spec);
    Api::<UpgradePlan>::all(env.client.clone())
        .create(&PostParams::default(), &p)
        .await
        .expect("creating the UpgradePlan");
    env.id.clone()
}

/// A hook running a Job in the test's namespace; kwok completes its pod
/// at once. Its pod stays on this test's nodes: on the shared cluster it
/// once landed on another test's node as that went away, failed, and
/// failed the hook (backoffLimit 0). `extra` is merged over the hook.
pub fn hook(env: &TestEnv, name: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut h = json!({
        "name": name,
        "namespace": env.ns,
        "deadlineSeconds": 120,
        "job": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "nodeSelector": {GROUP_LABEL: env.id},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "hook", "image": "registry.invalid/hook:1",
                "env": [{"name": "FROM_TEMPLATE", "value": "kept"}]}]
        }}}
    });
    merge(&mut h, extra);
    h
}

pub fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// Wait until the plan reports `node` in `phase`; its entry's message.
pub async fn wait_phase(client: &Client, plan: &str, node: &str, phase: UpgradePhase) -> String {
    let api: Api<UpgradePlan> = Api::all(client.clone());
    wait_for(&format!("{node} {phase:?} in {plan}"), LONG, || async {
        let p = api.get(plan).await.ok()?;
        let e = p.entry(node)?;
        (e.phase == phase).then(|| e.message.clone().unwrap_or_default())
    })
    .await
}

pub async fn plan(client: &Client, name: &str) -> UpgradePlan {
    Api::<UpgradePlan>::all(client.clone())
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading UpgradePlan {name}: {e}"))
}

/// The hook Jobs of a plan.
pub async fn jobs(client: &Client, plan: &str) -> Vec<Job> {
    Api::<Job>::all(client.clone())
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("{}={plan}", nodekeeper::api::upgrade::PLAN_LABEL)),
        )
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// What happened, in the order of the writes (the two watches run apart:
/// see [`super::write_order`]); what the serve loop saw goes after every
/// write that reached the timeline before it.
#[derive(Clone)]
pub struct Timeline {
    events: Arc<Mutex<Arrived<String>>>,
    stop: Latch,
}

impl Timeline {
    /// Watch the plan's Jobs and the group's nodes.
    pub fn start(client: Client, group: &str, plan: &str) -> Timeline {
        let t = Timeline {
            events: Arc::default(),
            stop: Latch::default(),
        };
        let (me, group, plan) = (t.clone(), group.to_string(), plan.to_string());
        std::thread::spawn(move || {
            block_on(async move {
                let cfg =
                    watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
                let jobs = watcher(
                    Api::<Job>::all(client.clone()),
                    cfg.clone()
                        .labels(&format!("{}={plan}", nodekeeper::api::upgrade::PLAN_LABEL)),
                )
                .filter_map(|e| match e.ok()? {
                    watcher::Event::Apply(j) | watcher::Event::InitApply(j) => {
                        let l = j.labels();
                        let rv = rv_of(&j);
                        Some((
                            rv,
                            format!(
                                "job {} {} {}",
                                l.get(nodekeeper::api::upgrade::STAGE_LABEL)?,
                                l.get(nodekeeper::api::upgrade::NODE_LABEL)?,
                                j.name_any()
                            ),
                        ))
                    }
                    _ => None,
                });
                let nodes = watcher(
                    Api::<Node>::all(client.clone()),
                    cfg.clone().labels(&format!("{GROUP_LABEL}={group}")),
                )
                .filter_map(|e| match e.ok()? {
                    watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                        let state = if unavailable(&n) { "down" } else { "up" };
                        Some((rv_of(&n), format!("{state} {}", n.name_any())))
                    }
                    _ => None,
                });
                let nms = watcher(Api::<NodeMaintenance>::all(client), cfg).filter_map(|e| match e
                    .ok(
                )? {
                    watcher::Event::Apply(m) | watcher::Event::InitApply(m) => Some((
                        rv_of(&m),
                        format!("nm {} {}", m.spec.node_name, m.name_any()),
                    )),
                    _ => None,
                });
                let nodes = smol::stream::or(nodes, nms);
                let mut all = std::pin::pin!(smol::stream::or(jobs, nodes));
                let mut last: BTreeMap<String, String> = BTreeMap::new();
                let run = async {
                    while let Some((rv, ev)) = all.next().await {
                        // Jobs and maintenances once each; node states on
                        // change only.
                        let (key, state) = match ev.split_once(' ') {
                            Some(("job" | "nm", rest)) => (ev.clone(), rest.to_string()),
                            Some((state, node)) => (node.to_string(), state.to_string()),
                            None => continue,
                        };
                        if last.get(&key) != Some(&state) {
                            last.insert(key, state);
                            me.events.lock().unwrap().push((rv, ev));
                        }
                    }
                };
                smol::future::or(run, me.stop.wait()).await;
            })
        });
        t
    }

    /// Record what the test saw happen now (it has no resourceVersion).
    pub fn push(&self, event: String) {
        self.events.lock().unwrap().push((None, event));
    }

    /// Everything so far, in the order of the writes.
    pub fn events(&self) -> Vec<String> {
        let arrived = self.events.lock().unwrap().clone();
        in_write_order(arrived)
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    /// Index of the first event starting with `prefix`.
    pub fn first(&self, prefix: &str) -> Option<usize> {
        self.events().iter().position(|e| e.starts_with(prefix))
    }

    /// Index of the last event starting with `prefix`.
    pub fn last(&self, prefix: &str) -> Option<usize> {
        self.events().iter().rposition(|e| e.starts_with(prefix))
    }

    pub fn count(&self, prefix: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .count()
    }

    pub fn stop(&self) {
        self.stop.open();
    }
}
