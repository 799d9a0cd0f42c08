//! The operator's view and the reboot request: `status` (every node and
//! what nodekeeper is doing to it: maintenance, reboot, upgrade — the first
//! command to run) and
//! `reboot-required NODE [--clear]`. They talk to the API server only.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use argh::FromArgs;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use smol::stream::StreamExt;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::*;
use crate::api::upgrade::UpgradePlan;
use crate::decide::reboot::{self, node::governing};
use crate::error::{Error, Result};
use crate::service::connect;

/// Show every node and what nodekeeper is doing to it: maintenance, reboot and upgrade phase, since when, what it waits for.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "status")]
pub struct StatusArgs {
    /// keep the table up to date as things change (Ctrl-C to stop)
    #[argh(switch)]
    pub watch: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

/// Mark a node as needing a reboot (or, with --clear, not); a RebootPolicy selecting it schedules the reboot.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "reboot-required")]
pub struct RebootRequiredArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// withdraw the request instead
    #[argh(switch)]
    pub clear: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

pub async fn reboot_required(args: RebootRequiredArgs) -> Result<ExitCode> {
    let client = connect::connect(args.kubeconfig.as_deref()).await?;
    crate::service::require_crds(&client).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = super::named_node(&client, &args.node).await?;
    let n = &args.node;
    let patch = if args.clear {
        // Every need marker we honour goes, so the node is not rebooted
        // for a request another tool made either.
        reboot::clear_need_patch(&node)
    } else {
        // A fresh request is a new ask: it also retries a node whose
        // reboot failed in this boot. Asked again while its reboot is
        // under way, nothing is written.
        match reboot::ask_again(&node, &Timestamp::now().to_string()) {
            Ok(patch) => patch,
            Err(why) => {
                super::args::outln(format_args!("node {n}: {why}; nothing to do"));
                return Ok(ExitCode::SUCCESS);
            }
        }
    };
    nodes
        .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("marking node {n}")))?;
    if args.clear {
        // Say what changed ("no reboot requested" read as if there had
        // been none).
        if crate::decide::reboot::needs_reboot(&node) {
            super::args::outln(format_args!(
                "node {n}: reboot request withdrawn (a reboot admitted but not yet issued is given back)"
            ));
        } else {
            super::args::outln(format_args!(
                "node {n}: had no reboot request; nothing to withdraw"
            ));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let policies: Api<RebootPolicy> = Api::all(client);
    let policies: Vec<Arc<RebootPolicy>> = policies
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing RebootPolicies"))?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    match governing(&node, &policies) {
        Some(p) => super::args::outln(format_args!(
            "node {n}: reboot requested; RebootPolicy {} schedules it (nodekeeper status shows progress)",
            p.name_any()
        )),
        None => super::args::outln(format_args!(
            "node {n}: reboot requested, but no RebootPolicy selects this node, so nothing will reboot it yet"
        )),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn status(args: StatusArgs) -> Result<ExitCode> {
    let client = connect::connect(args.kubeconfig.as_deref()).await?;
    crate::service::require_crds(&client).await?;
    if !args.watch {
        let (nodes, nms, policies, plans) = list_all(&client).await?;
        let world = World {
            nodes: &nodes,
            nms: &nms,
            policies: &policies,
            plans: &plans,
        };
        super::args::out(format_args!("{}", render(&world, Timestamp::now())));
        return Ok(ExitCode::SUCCESS);
    }
    watch(client).await
}

async fn list_all(
    client: &Client,
) -> Result<(
    Vec<Arc<Node>>,
    Vec<Arc<NodeMaintenance>>,
    Vec<Arc<RebootPolicy>>,
    Vec<Arc<UpgradePlan>>,
)> {
    let lp = ListParams::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing nodes"))?;
    let nms = Api::<NodeMaintenance>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing NodeMaintenances"))?;
    let policies = Api::<RebootPolicy>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing RebootPolicies"))?;
    let plans = Api::<UpgradePlan>::all(client.clone())
        .list(&lp)
        .await
        .map_err(Error::kube("listing UpgradePlans"))?;
    fn arc<T>(v: Vec<T>) -> Vec<Arc<T>> {
        v.into_iter().map(Arc::new).collect()
    }
    Ok((
        arc(nodes.items),
        arc(nms.items),
        arc(policies.items),
        arc(plans.items),
    ))
}

/// Re-draw on every change (at most every 200 ms), from watches.
async fn watch(client: Client) -> Result<ExitCode> {
    let (nodes, nw) = reflector::store::<Node>();
    let (nms, mw) = reflector::store::<NodeMaintenance>();
    let (policies, pw) = reflector::store::<RebootPolicy>();
    let (plans, uw) = reflector::store::<UpgradePlan>();
    let cfg = || watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
    // Each change says which watch it came from and whether that watch
    // has its first full list: nothing is drawn before all four have
    // (the first frames showed nodes without their maintenances).
    fn listed<K>(
        i: usize,
    ) -> impl FnMut(std::result::Result<watcher::Event<K>, watcher::Error>) -> (usize, bool) {
        move |e| (i, matches!(e, Ok(watcher::Event::InitDone)))
    }
    let n = watcher(Api::<Node>::all(client.clone()), cfg())
        .reflect(nw)
        .map(listed(0));
    let m = watcher(Api::<NodeMaintenance>::all(client.clone()), cfg())
        .reflect(mw)
        .map(listed(1));
    let p = watcher(Api::<RebootPolicy>::all(client.clone()), cfg())
        .reflect(pw)
        .map(listed(2));
    let u = watcher(Api::<UpgradePlan>::all(client), cfg())
        .reflect(uw)
        .map(listed(3));
    let mut changes = std::pin::pin!(smol::stream::or(
        smol::stream::or(n, m),
        smol::stream::or(p, u)
    ));
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    let mut ready = [false; 4];
    while let Some((i, done)) = changes.next().await {
        ready[i] |= done;
        if !ready.iter().all(|r| *r) {
            continue;
        }
        // Let a burst of changes settle into one frame.
        crate::runtime::sleep(Duration::from_millis(200)).await;
        let (n, m, p, u) = (nodes.state(), nms.state(), policies.state(), plans.state());
        let world = World {
            nodes: &n,
            nms: &m,
            policies: &p,
            plans: &u,
        };
        let table = render(&world, Timestamp::now());
        if table != last {
            if tty {
                super::args::out(format_args!("\x1b[2J\x1b[H{table}"));
            } else {
                super::args::out(format_args!("--- {}\n{table}", Timestamp::now()));
            }
            last = table;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What the table is drawn from.
pub struct World<'a> {
    pub nodes: &'a [Arc<Node>],
    pub nms: &'a [Arc<NodeMaintenance>],
    pub policies: &'a [Arc<RebootPolicy>],
    pub plans: &'a [Arc<UpgradePlan>],
}

/// One line per node: readiness, cordon, its maintenance, its reboot, its
/// upgrade, since when, and what it waits for (the upgrade's, when it is
/// admitted or nothing reboots the node).
pub fn render(w: &World, now: Timestamp) -> String {
    let (nodes, nms, policies) = (w.nodes, w.nms, w.policies);
    let mut rows = vec![[
        "NODE".to_string(),
        "READY".into(),
        "SCHEDULING".into(),
        "MAINTENANCE".into(),
        "REBOOT".into(),
        "UPGRADE".into(),
        "SINCE".into(),
        "NOTE".into(),
    ]];
    let mut sorted: Vec<&Arc<Node>> = nodes.iter().collect();
    sorted.sort_by_key(|n| n.name_any());
    for node in sorted {
        let name = node.name_any();
        let nm = nms.iter().find(|m| m.spec.node_name == name);
        let maintenance = nm.map_or("-".to_string(), |m| {
            let phase = m.phase().map_or("Pending", |p| p.as_str());
            match m.status.as_ref().and_then(|s| s.drain_progress) {
                Some(p) if m.phase() == Some(crate::api::nodemaintenance::Phase::Running) => {
                    format!("{} {phase} {p}%", m.name_any())
                }
                _ => format!("{} {phase}", m.name_any()),
            }
        });
        let policy = governing(node, policies);
        let entry = policy.and_then(|p| p.entry(&name).map(|e| (p, e)));
        // SINCE and NOTE say what is happening now: a verified reboot is
        // history (its "reboot verified" stayed in NOTE for good), and a
        // maintenance no feature is driving speaks for itself.
        let (reboot, mut since, mut note) = match entry {
            Some((p, e)) if e.phase == crate::api::reboot::RebootPhase::Done => (
                format!("{}: {}", p.name_any(), e.phase.as_str()),
                "-".into(),
                String::new(),
            ),
            Some((p, e)) => (
                format!("{}: {}", p.name_any(), e.phase.as_str()),
                age(now, e.since.0),
                e.message.clone().unwrap_or_default(),
            ),
            None if reboot::needs_reboot(node) => (
                "needed".into(),
                "-".into(),
                if policy.is_none() {
                    "no RebootPolicy selects this node".into()
                } else {
                    String::new()
                },
            ),
            None => ("-".into(), "-".into(), String::new()),
        };
        let plan = crate::decide::upgrade::governing(node, w.plans);
        let upgrade_entry = plan.and_then(|p| p.entry(&name).map(|e| (p, e)));
        let upgrade = upgrade_entry.map_or("-".to_string(), |(p, e)| {
            format!("{}: {}", p.name_any(), e.phase.as_str())
        });
        if let Some((_, e)) = upgrade_entry
            && (e.phase.admitted()
                || (entry.is_none() && e.phase != crate::api::upgrade::UpgradePhase::Done))
        {
            since = age(now, e.since.0);
            note = e.message.clone().unwrap_or_default();
        }
        let feature_holds = entry.is_some_and(|(_, e)| e.phase.admitted())
            || upgrade_entry.is_some_and(|(_, e)| e.phase.admitted());
        if let Some(m) = nm
            && !feature_holds
        {
            if let Some(t) = &m.metadata.creation_timestamp {
                since = age(now, t.0);
            }
            note = m
                .status
                .as_ref()
                .and_then(|s| s.last_error.clone())
                .or_else(|| m.spec.reason.clone())
                .unwrap_or_default();
        } else if note.is_empty()
            && let Some(err) = nm.and_then(|m| m.status.as_ref()?.last_error.clone())
        {
            note = err;
        }
        rows.push([
            name,
            if reboot::ready(node) {
                "Ready"
            } else {
                "NotReady"
            }
            .into(),
            if reboot::unschedulable(node) {
                "cordoned"
            } else {
                "schedulable"
            }
            .into(),
            maintenance,
            reboot,
            upgrade,
            since,
            note,
        ]);
    }
    let mut widths = [0usize; 8];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `5s`, `3m`, `2h`, `4d`, like kubectl's AGE.
fn age(now: Timestamp, t: Timestamp) -> String {
    let s = now.as_second().saturating_sub(t.as_second()).max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    #[test]
    fn the_table_shows_each_node_with_its_maintenance_and_reboot() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap_or_default();
        let node = |name: &str, need: bool| {
            Arc::new(Node {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    annotations: need
                        .then(|| [(NEEDED_ANNOTATION.to_string(), "x".to_string())].into()),
                    ..Default::default()
                },
                ..Default::default()
            })
        };
        let mut p = RebootPolicy::new("weekly", RebootPolicySpec::default());
        p.status = Some(RebootPolicyStatus {
            nodes: vec![NodeReboot {
                name: "a".into(),
                phase: RebootPhase::Waiting,
                since: Time(
                    now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(300))
                        .unwrap_or(now),
                ),
                boot_id_before: None,
                need: None,
                message: Some("outside every reboot window".into()),
                reason: Some("Window".into()),
            }],
            ..Default::default()
        });
        let (nodes, policies) = ([node("b", false), node("a", true)], [Arc::new(p)]);
        let table = render(
            &World {
                nodes: &nodes,
                nms: &[],
                policies: &policies,
                plans: &[],
            },
            now,
        );
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("NODE"), "{table}");
        assert!(lines[1].starts_with("a "), "sorted by name: {table}");
        assert!(lines[1].contains("weekly: Waiting") && lines[1].contains("5m"));
        assert!(lines[1].ends_with("outside every reboot window"));
        assert!(
            lines[2].contains("NotReady") && lines[2].contains(" - "),
            "{table}"
        );
        let orphan = render(
            &World {
                nodes: &[node("c", true)],
                nms: &[],
                policies: &[],
                plans: &[],
            },
            now,
        );
        assert!(orphan.contains("needed") && orphan.contains("no RebootPolicy selects"));
    }

    #[test]
    fn an_admitted_upgrade_shows_its_phase_and_what_it_does() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap_or_default();
        let node = Arc::new(Node {
            metadata: ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let mut plan: UpgradePlan = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodekeeper.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": "os"},
            "spec": {"version": "v2", "strategy": {"command": ["up"]}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        plan.status = Some(crate::api::upgrade::UpgradePlanStatus {
            nodes: vec![crate::api::upgrade::NodeUpgrade {
                name: "a".into(),
                phase: crate::api::upgrade::UpgradePhase::PreHooks,
                since: Time(now),
                group: None,
                version: Some("v2".into()),
                attempt: Some(1),
                boot_id_before: None,
                hook: Some("backup".into()),
                job: None,
                job_seen: false,
                maintenance_gone_at: None,
                message: Some("before hook backup: running Job ops/x".into()),
                reason: None,
            }],
            ..Default::default()
        });
        let table = render(
            &World {
                nodes: &[node],
                nms: &[],
                policies: &[],
                plans: &[Arc::new(plan)],
            },
            now,
        );
        let line = table.lines().nth(1).unwrap_or_default();
        assert!(line.contains("os: PreHooks"), "{table}");
        assert!(
            line.ends_with("before hook backup: running Job ops/x"),
            "{table}"
        );
    }

    /// A person's maintenance on a node whose reboot was verified earlier:
    /// SINCE is the maintenance's age and NOTE its reason, not "-" and the
    /// stale "reboot verified".
    #[test]
    fn a_maintenance_shows_its_own_age_and_note_over_a_finished_reboot() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap_or_default();
        let earlier = |s: i64| {
            Time(
                now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                    .unwrap_or(now),
            )
        };
        let node = Arc::new(Node {
            metadata: ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let mut p = RebootPolicy::new("weekly", RebootPolicySpec::default());
        p.status = Some(RebootPolicyStatus {
            nodes: vec![NodeReboot {
                name: "a".into(),
                phase: RebootPhase::Done,
                since: earlier(7200),
                boot_id_before: None,
                need: None,
                message: Some("reboot verified".into()),
                reason: None,
            }],
            ..Default::default()
        });
        let mut nm = NodeMaintenance::new(
            "kernel-a",
            crate::api::nodemaintenance::NodeMaintenanceSpec {
                node_name: "a".into(),
                reason: Some("swap the disk".into()),
            },
        );
        nm.metadata.creation_timestamp = Some(earlier(180));
        let table = render(
            &World {
                nodes: &[node],
                nms: &[Arc::new(nm)],
                policies: &[Arc::new(p)],
                plans: &[],
            },
            now,
        );
        let line = table.lines().nth(1).unwrap_or_default();
        assert!(line.contains("weekly: Done"), "{table}");
        assert!(line.contains(" 3m "), "SINCE is the maintenance's: {table}");
        assert!(line.ends_with("swap the disk"), "{table}");
        assert!(!line.contains("reboot verified"), "{table}");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap_or_default();
        let ago = |s: i64| {
            now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .unwrap_or(now)
        };
        assert_eq!(age(now, ago(5)), "5s");
        assert_eq!(age(now, ago(600)), "10m");
        assert_eq!(age(now, ago(3 * 3600)), "3h");
        assert_eq!(age(now, ago(3 * 86400)), "3d");
    }
}
