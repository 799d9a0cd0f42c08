//! The operator's maintenance commands: `maintain` (with a live progress
//! line), `unmaintain`, and `drain --dry-run`. They talk to the API server
//! only; the agents do the work.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::api::pod::Pod;
use argh::FromArgs;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use smol::stream::StreamExt;

use crate::api::drain_rule::DrainRule;
use crate::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use crate::decide::drain::{self, Fate};
use crate::decide::drain_plan;
use crate::error::{Error, Result};
use crate::service::{self, connect};

/// Put a node into maintenance: create its NodeMaintenance (cordon, taint, drain).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "maintain")]
pub struct MaintainArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// why (shown by kubectl get nm -o wide)
    #[argh(option)]
    pub reason: Option<String>,
    /// show live progress until Succeeded (exit 0) or Failed (exit 1)
    #[argh(switch)]
    pub wait: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

/// Take a node out of maintenance: delete its NodeMaintenance (uncordon if nodekeeper cordoned it).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "unmaintain")]
pub struct UnmaintainArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// wait until the maintenance is fully removed
    #[argh(switch)]
    pub wait: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

/// Show what draining a node would do: evicted, deleted, skipped (why) and blocked (by which PDB).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "drain")]
pub struct DrainArgs {
    /// the node
    #[argh(positional)]
    pub node: String,
    /// change nothing, print the plan (required: to drain, use `maintain`)
    #[argh(switch)]
    pub dry_run: bool,
    /// kubeconfig file
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
}

async fn maintenances_of(api: &Api<NodeMaintenance>, node: &str) -> Result<Vec<NodeMaintenance>> {
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing NodeMaintenances"))?;
    Ok(list
        .items
        .into_iter()
        .filter(|m| m.spec.node_name == node)
        .collect())
}

/// `nodekeeper maintain NODE [--reason R] [--wait]`.
pub async fn maintain(args: MaintainArgs) -> Result<ExitCode> {
    let client = connect::connect(args.kubeconfig.as_deref()).await?;
    service::require_crds(&client).await?;
    super::named_node(&client, &args.node).await?;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let existing = maintenances_of(&api, &args.node)
        .await?
        .into_iter()
        .find(|m| !m.is_deleting());
    let name = match existing {
        Some(m) => {
            eprintln!(
                "node {} already has NodeMaintenance {}; following it",
                args.node,
                m.name_any()
            );
            m.name_any()
        }
        None => {
            let nm = NodeMaintenance::new(
                &args.node,
                NodeMaintenanceSpec {
                    node_name: args.node.clone(),
                    reason: args.reason.clone(),
                },
            );
            api.create(&PostParams::default(), &nm)
                .await
                .map_err(Error::kube(format!(
                    "creating NodeMaintenance {}",
                    args.node
                )))?;
            eprintln!("nodemaintenance {} created", args.node);
            args.node.clone()
        }
    };
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    follow(&api, &name, &args.node).await
}

/// How long `maintain --wait` waits for a first status before it says
/// that no agent seems to be running for the node.
const NO_AGENT_HINT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long `maintain --wait` keeps watching again through errors (an API
/// server restart takes seconds) before it gives up observing: exit 3, the
/// maintenance carrying on without it.
const OBSERVE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `maintain --wait` could not observe the maintenance (it goes on).
pub const EXIT_NOT_OBSERVED: u8 = 3;

/// Print one progress line per change (rewritten in place on a terminal)
/// until the maintenance succeeds or fails.
async fn follow(api: &Api<NodeMaintenance>, name: &str, node: &str) -> Result<ExitCode> {
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    let wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // Backed off and re-listed on errors: a watch broken by an API server
    // restart is watched again (it ended the command with exit 1 while the
    // maintenance carried on).
    let mut events = std::pin::pin!(watcher::watcher(api.clone(), wc).default_backoff());
    let mut failing_since: Option<std::time::Instant> = None;
    // Until an agent writes a status, nothing shows progress; say why once
    // rather than sit at "Pending" in silence.
    let hint_at = std::time::Instant::now() + NO_AGENT_HINT;
    let mut started = false;
    loop {
        let next = if started {
            events.next().await
        } else {
            let left = hint_at.saturating_duration_since(std::time::Instant::now());
            match crate::runtime::timeout(left, events.next()).await {
                Ok(next) => next,
                Err(()) => {
                    if tty {
                        super::args::outln(format_args!(""));
                    }
                    eprintln!(
                        "nodekeeper: no agent has acted on NodeMaintenance {name} after {} s; \
                         is `nodekeeper run` running for node {node}? (still waiting)",
                        NO_AGENT_HINT.as_secs()
                    );
                    started = true;
                    continue;
                }
            }
        };
        let Some(ev) = next else { break };
        let nm = match ev {
            Ok(Event::Apply(nm) | Event::InitApply(nm)) => nm,
            Ok(Event::Delete(_)) => {
                return Err(Error::Invalid(format!(
                    "NodeMaintenance {name} was deleted while waiting"
                )));
            }
            Ok(_) => continue,
            Err(e) => {
                let since = *failing_since.get_or_insert_with(|| {
                    eprintln!("nodekeeper: watching NodeMaintenance {name}: {e} (watching again)");
                    std::time::Instant::now()
                });
                if since.elapsed() >= OBSERVE_LIMIT {
                    if tty {
                        super::args::outln(format_args!(""));
                    }
                    eprintln!(
                        "nodekeeper: could not observe NodeMaintenance {name} for {} s ({e}); \
                         it carries on without this command (kubectl get nm {name})",
                        OBSERVE_LIMIT.as_secs()
                    );
                    return Ok(ExitCode::from(EXIT_NOT_OBSERVED));
                }
                continue;
            }
        };
        if failing_since.take().is_some() {
            eprintln!("nodekeeper: watching NodeMaintenance {name} again");
        }
        started |= nm.phase().is_some();
        let mut line = progress_line(&nm, k8s_openapi::jiff::Timestamp::now());
        if tty
            && let Some(w) = terminal_width()
            && line.chars().count() >= w
        {
            line = line.chars().take(w.saturating_sub(2)).collect::<String>() + "…";
        }
        if line != last {
            let mut out = std::io::stdout().lock();
            if tty {
                let _ = write!(out, "\r\x1b[2K{line}");
            } else {
                let _ = writeln!(out, "{line}");
            }
            let _ = out.flush();
            last = line;
        }
        match nm.phase() {
            Some(Phase::Succeeded) => {
                if tty {
                    super::args::outln(format_args!(""));
                }
                super::args::outln(format_args!(
                    "node {node} is in maintenance: cordoned and drained"
                ));
                return Ok(ExitCode::SUCCESS);
            }
            Some(Phase::Failed) => {
                if tty {
                    super::args::outln(format_args!(""));
                }
                let err = nm
                    .status
                    .as_ref()
                    .and_then(|s| s.last_error.clone())
                    .unwrap_or_default();
                eprintln!("nodekeeper: maintenance of node {node} failed: {err}");
                return Ok(ExitCode::FAILURE);
            }
            _ => {}
        }
    }
    Err(Error::Invalid(format!(
        "the watch on NodeMaintenance {name} ended"
    )))
}

/// "Running  40%  3 pods left  blocked: pod ns/a: ..." in one line.
pub fn progress_line(nm: &NodeMaintenance, now: k8s_openapi::jiff::Timestamp) -> String {
    let st = nm.status.clone().unwrap_or_default();
    let phase = st.phase.map(Phase::as_str).unwrap_or("Pending");
    let pending = st.pending_pods.as_ref().map(Vec::len).unwrap_or(0);
    let noun = if pending == 1 { "pod" } else { "pods" };
    let mut line = format!(
        "{phase:<9} {:>3}%  {pending} {noun} left",
        st.drain_progress.unwrap_or(0)
    );
    if let Some(err) = st.last_error.filter(|e| !e.is_empty()) {
        let (short, pdb) = short_blockers(&err);
        line.push_str("  blocked: ");
        line.push_str(&short);
        if let Some(t) = &nm.metadata.creation_timestamp {
            let secs = now.duration_since(t.0).as_secs().max(0);
            line.push_str(&format!(" (after {}m{:02}s", secs / 60, secs % 60));
            line.push_str(if pdb {
                "; a PodDisruptionBudget allows no eviction now: wait for its pods to be healthy, scale the workload up, or relax the budget)"
            } else {
                ")"
            });
        }
    }
    line
}

/// The blockers of `lastError` as a person reads them: a PDB refusal as
/// `pod ← PDB name: needs N healthy, has M` instead of the API's ~400
/// characters; other causes as they are. Also says whether any is a PDB's.
fn short_blockers(err: &str) -> (String, bool) {
    let (list, more) = match err.rsplit_once("; and ") {
        Some((l, m)) if m.ends_with(" more") => (l, Some(m)),
        _ => (err, None),
    };
    let mut pdb = false;
    let mut parts: Vec<String> = list
        .split("; pod ")
        .enumerate()
        .map(|(i, b)| {
            let b = if i == 0 {
                b.strip_prefix("pod ").unwrap_or(b)
            } else {
                b
            };
            let Some((pod, cause)) = b.split_once(": ") else {
                return b.to_string();
            };
            let numbers = cause.rfind("disruption budget ").and_then(|i| {
                let rest = &cause[i + "disruption budget ".len()..];
                let (name, rest) = rest.split_once(" needs ")?;
                let (need, rest) = rest.split_once(" healthy pods and has ")?;
                let (has, _) = rest.split_once(" currently")?;
                Some(format!(
                    "{pod} ← PDB {name}: needs {need} healthy, has {has}"
                ))
            });
            pdb |= numbers.is_some();
            numbers.unwrap_or_else(|| format!("{pod}: {cause}"))
        })
        .collect();
    if let Some(m) = more {
        parts.push(format!("and {m}"));
    }
    (parts.join("; "), pdb)
}

/// The terminal's width, for `--wait` lines drawn in place (a line longer
/// than the terminal wraps, and `\r` then redraws only its last part).
fn terminal_width() -> Option<usize> {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .ok()
        .map(|w| w.ws_col as usize)
        .filter(|w| *w > 0)
}

/// `nodekeeper unmaintain NODE [--wait]`.
pub async fn unmaintain(args: UnmaintainArgs) -> Result<ExitCode> {
    let client = connect::connect(args.kubeconfig.as_deref()).await?;
    service::require_crds(&client).await?;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let nms = maintenances_of(&api, &args.node).await?;
    if nms.is_empty() {
        return Err(Error::Invalid(format!(
            "node {} has no NodeMaintenance",
            args.node
        )));
    }
    // A feature's NodeMaintenance is that feature's: deleted here, its
    // owner would take the node again within a second, and "out of
    // maintenance" would be false. Name the owner and how to release the
    // node instead, and fail.
    let (owned, nms): (Vec<_>, Vec<_>) = nms
        .into_iter()
        .partition(|nm| crate::decide::maintenance::owner_of(nm).is_some());
    let held: Vec<String> = owned.iter().map(held_by).collect();
    for nm in &nms {
        match api.delete(&nm.name_any(), &DeleteParams::default()).await {
            Ok(_) => eprintln!("nodemaintenance {} deleted", nm.name_any()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::kube(format!(
                    "deleting NodeMaintenance {}",
                    nm.name_any()
                ))(e));
            }
        }
    }
    if args.wait {
        for nm in &nms {
            let uid = nm.uid().unwrap_or_default();
            let cond = kube::runtime::conditions::is_deleted(&uid);
            kube::runtime::wait::await_condition(api.clone(), &nm.name_any(), cond)
                .await
                .map_err(|e| {
                    Error::Invalid(format!(
                        "waiting for NodeMaintenance {} to go: {e}",
                        nm.name_any()
                    ))
                })?;
        }
        if held.is_empty() {
            super::args::outln(format_args!("node {} is out of maintenance", args.node));
        }
    }
    if !held.is_empty() {
        return Err(Error::Invalid(format!(
            "node {} stays in maintenance: {}",
            args.node,
            held.join("; ")
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// Who holds a feature's NodeMaintenance, and how a person releases the
/// node from it.
fn held_by(nm: &NodeMaintenance) -> String {
    let kind = crate::decide::maintenance::owner_of(nm).unwrap_or_default();
    let owner = nm
        .owner_references()
        .iter()
        .find(|o| o.kind == kind)
        .map(|o| o.name.clone())
        .unwrap_or_else(|| "(no owner reference)".into());
    format!(
        "NodeMaintenance {} belongs to {kind} {owner}, which gives the node back when it is done \
         (deleting the {kind} gives back every node it holds now)",
        nm.name_any()
    )
}

/// `nodekeeper drain --dry-run NODE`: the plan, changing nothing.
pub async fn drain_dry_run(args: DrainArgs) -> Result<ExitCode> {
    let client = connect::connect(args.kubeconfig.as_deref()).await?;
    let node = super::named_node(&client, &args.node).await?;
    let pods: Api<Pod> = Api::all(client.clone());
    let pods: Vec<Arc<Pod>> = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", args.node)))
        .await
        .map_err(Error::kube(format!("listing pods on {}", args.node)))?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let pdbs: Api<PodDisruptionBudget> = Api::all(client.clone());
    let pdbs = pdbs
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing PodDisruptionBudgets"))?
        .items;
    let book = rule_book(&client, &node, &pods).await?;
    let labels = node.metadata.labels.unwrap_or_default();
    let how = drain_plan::Drain {
        now: k8s_openapi::jiff::Timestamp::now(),
        ..Default::default()
    };
    let planned = drain_plan::plan(&pods, &labels, &book, how);
    super::args::out(format_args!("{}", plan_table(&args.node, &planned, &pdbs)));
    Ok(ExitCode::SUCCESS)
}

/// The DrainRules, and the labels of the namespaces they select by, for
/// a drain of `node` (as the service reads them, in one go).
async fn rule_book(
    client: &kube::Client,
    node: &crate::api::node::Node,
    pods: &[Arc<Pod>],
) -> Result<drain_plan::RuleBook> {
    let resource = kube::api::ApiResource::erase::<DrainRule>(&());
    let served: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    let served: Vec<Arc<kube::api::DynamicObject>> = served
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing DrainRules"))?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    // Parsed as the service parses them (held dynamic there).
    let rules = crate::service::drain_rules::parsed(&served);
    let empty = std::collections::BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let mut namespaces = std::collections::HashMap::new();
    if crate::decide::drain_rules::NodeRules::on(&rules, labels).need_namespaces() {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let names: std::collections::BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.namespace.as_deref())
            .collect();
        for name in names {
            let ns = api
                .get_metadata(name)
                .await
                .map_err(Error::kube(format!("reading namespace {name}")))?;
            namespaces.insert(name.to_string(), ns.metadata.labels.unwrap_or_default());
        }
    }
    Ok(drain_plan::RuleBook { rules, namespaces })
}

/// The dry-run table, sorted by action then pod: what happens to each pod
/// now, and the DrainRule and tier that decided it.
pub fn plan_table(
    node: &str,
    planned: &[drain_plan::Planned],
    pdbs: &[PodDisruptionBudget],
) -> String {
    let mut rows: Vec<(&str, String, String, String)> = planned
        .iter()
        .map(|p| {
            let key = drain::pod_key(&p.pod);
            let rule = p
                .placement
                .as_ref()
                .map(|pl| format!("{} ({}, order {})", pl.by, pl.behavior.as_str(), pl.order))
                .unwrap_or_else(|| "-".into());
            let (action, detail) = match &p.fate {
                Fate::Evict => match drain::pdb_blocker(&p.pod, pdbs) {
                    Some(b) => ("blocked", b),
                    None => ("evict", String::new()),
                },
                Fate::Delete(why) => ("delete", why.to_string()),
                Fate::Terminating => ("wait", "already terminating".to_string()),
                Fate::Held(why) => ("later", why.clone()),
                Fate::Skip(why) => ("skip", why.to_string()),
            };
            (action, key, rule, detail)
        })
        .collect();
    let order = |a: &str| {
        ["blocked", "evict", "delete", "wait", "later", "skip"]
            .iter()
            .position(|x| *x == a)
            .unwrap_or(9)
    };
    rows.sort_by(|a, b| order(a.0).cmp(&order(b.0)).then_with(|| a.1.cmp(&b.1)));
    let width = rows.iter().map(|r| r.1.len()).max().unwrap_or(3).max(3);
    let rule_width = rows.iter().map(|r| r.2.len()).max().unwrap_or(4).max(4);
    let mut out = format!("drain plan for node {node} (dry run: nothing changed)\n");
    out.push_str(&format!(
        "{:<8} {:<width$} {:<rule_width$} {}\n",
        "ACTION", "POD", "RULE", "DETAIL"
    ));
    for (action, pod, rule, detail) in &rows {
        out.push_str(format!("{action:<8} {pod:<width$} {rule:<rule_width$} {detail}").trim_end());
        out.push('\n');
    }
    let count = |a: &str| rows.iter().filter(|r| r.0 == a).count();
    out.push_str(&format!(
        "{} to evict ({} blocked now), {} to delete, {} terminating, {} later (a DrainRule tier or WaitCompleted), {} skipped\n",
        count("evict") + count("blocked"),
        count("blocked"),
        count("delete"),
        count("wait"),
        count("later"),
        count("skip")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: &str = "Cannot evict pod as it would violate the pod's disruption budget (The disruption budget web-pdb needs 2 healthy pods and has 2 currently)";

    #[test]
    fn a_blocked_drain_reads_as_the_pdb_and_its_numbers() {
        let err = format!(
            "pod shop/web-1: {REFUSED}; pod shop/web-2: {REFUSED}; pod ops/x: the API server is busy; and 4 more"
        );
        let (short, pdb) = short_blockers(&err);
        assert!(pdb);
        assert_eq!(
            short,
            "shop/web-1 ← PDB web-pdb: needs 2 healthy, has 2; shop/web-2 ← PDB web-pdb: needs 2 healthy, has 2; ops/x: the API server is busy; and 4 more"
        );
        let (short, pdb) = short_blockers("pod a/b: connection refused");
        assert_eq!((short.as_str(), pdb), ("a/b: connection refused", false));
    }

    #[test]
    fn the_progress_line_says_how_long_and_what_to_do() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-24T12:02:05Z".parse().unwrap_or_default();
        let mut nm = NodeMaintenance::new(
            "a",
            NodeMaintenanceSpec {
                node_name: "a".into(),
                reason: None,
            },
        );
        nm.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-24T12:00:00Z".parse().unwrap_or_default(),
            ));
        nm.status = Some(crate::api::nodemaintenance::NodeMaintenanceStatus {
            phase: Some(Phase::Running),
            drain_progress: Some(50),
            pending_pods: Some(vec!["web-1".into()]),
            last_error: Some(format!("pod shop/web-1: {REFUSED}")),
            ..Default::default()
        });
        let line = progress_line(&nm, now);
        assert!(line.starts_with("Running    50%  1 pod left  blocked: shop/web-1 ← PDB web-pdb: needs 2 healthy, has 2 (after 2m05s; a PodDisruptionBudget allows no eviction now"), "{line}");
        assert!(!line.contains("Cannot evict"), "{line}");
    }
}
