//! In-place upgrades, pure. Two halves, one per role:
//!
//! - [`decide`] (cluster role, the single writer of admissions): for one
//!   UpgradePlan, the group being upgraded (the first with a node not
//!   finished), then each node along Pending/Waiting → PreHooks → Draining →
//!   Upgrading → Verifying → PostHooks → (Settling →) Done (or Failed), admitting nodes
//!   in group and name order within the windows, gates and budget. As for
//!   reboots, the admission record is the plan's status, written guarded by
//!   its resourceVersion before anything touches the node; each hook Job is
//!   recorded there before it is created, and its name is derived from the
//!   admission, so a repeated create is a 409 and never a second run.
//! - [`node`] (node role): run the upgrade command on the drained node once
//!   per plan, version and boot (recorded on the node before it runs), and
//!   the reboot after it if the plan asks for one.
//!
//! A node that fails after its drain stays in maintenance (cordoned,
//! drained) for a person to look at; with `onFailure: Pause` the plan then
//! admits nothing more until its spec changes (a new generation retries
//! the failed nodes).

mod admit;
pub mod channel;
mod holders;
mod hooks;
pub mod node;
mod report;
mod stages;
pub mod upgrade_job;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::api::node::Node;
use crate::api::pod::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::disrupt::{self, boot_id, owned_by, ready};
use super::maintenance::annotation;
use super::selector::{check_selector, selector_matches};
use super::{Effect, Plan, marking, rollout, window};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::upgrade::*;
pub use holders::{exclusive_with, governing, orphaned_marks, orphans};
pub use hooks::{JobState, Stage, job_name};
use report::{INSECURE_CHANNEL, PLAIN_HTTP, status};
use stages::Decision;

/// Everything one plan's decision reads.
pub struct Snapshot<'a> {
    pub plan: &'a UpgradePlan,
    /// Every node the cluster role sees.
    pub nodes: &'a [Arc<Node>],
    /// Every NodeMaintenance.
    pub maintenances: &'a [Arc<NodeMaintenance>],
    /// Hook Jobs' states, by `namespace/name`.
    pub jobs: &'a HashMap<String, JobState>,
    /// Hook Jobs the API server refused to create, by `namespace/name`:
    /// why (a bad template, a missing namespace).
    pub job_errors: &'a HashMap<String, String>,
    /// The pods bound to a node (for blocking-pod gates).
    pub pods_on: &'a dyn Fn(&str) -> Vec<Arc<Pod>>,
    /// As `reboot::Snapshot::node_pods` and `own_node`.
    pub node_pods: &'a dyn Fn(&str) -> Option<Vec<Arc<Pod>>>,
    pub own_node: &'a dyn Fn(&str) -> super::rollout::OwnNode,
    pub now: Timestamp,
    /// Every UpgradePlan (a node two plans select is the older one's).
    pub plans: &'a [Arc<UpgradePlan>],
    /// Why the plan's last pass failed, if it did (see
    /// [`super::set_failing`]).
    pub failing: Option<&'a str>,
    /// Prometheus's last answer for the URL of the gate, if it has one.
    pub alerts: Option<&'a disrupt::Alerts>,
    /// The health gate's workloads as last listed, if it has one and a
    /// node waits for it.
    pub health: Option<&'a super::health::Health>,
    /// A blocking-pod gate of this object whose pods are not listed yet
    /// (named): admissions wait, nodes already held go on.
    pub gates_unlisted: Option<&'a str>,
    /// How this object's notifications fared (the notifier's count), for
    /// its status; `None`: it has none, the status keeps what it says.
    pub notified: Option<&'a crate::api::common::NotificationStatus>,
    /// What the plan's channel answered last (the resolver's), if it has one.
    pub channel: Option<&'a ChannelStatus>,
}

impl Snapshot<'_> {
    /// The version this decision upgrades to: `spec.version`, or the
    /// channel's newest answer for the spec's URL (empty: none yet).
    pub fn target(&self) -> &str {
        let p = self.plan;
        match (&p.spec.channel, self.channel) {
            (Some(url), Some(c)) if &c.url == url && c.version.is_some() => {
                c.version.as_deref().unwrap_or_default()
            }
            _ => p.target_version(),
        }
    }
}

pub use super::rollout::{
    WAIT_AGENT_CHECK, WAIT_COMMAND, WAIT_IN_MAINTENANCE, WAIT_INVALID, WAIT_PAUSED,
};
/// Machine-readable reasons of Waiting and Failed entries.
pub use disrupt::{
    WAIT_ALERT, WAIT_BLOCKING_POD, WAIT_BUDGET, WAIT_GATE, WAIT_NOT_READY, WAIT_WINDOW,
};
pub const WAIT_GROUP: &str = "Group";
pub const WAIT_FAILURE: &str = "Failure";
pub const WAIT_OTHER_PLAN: &str = "OtherPlan";
/// Another exclusive plan has a node admitted.
pub const WAIT_EXCLUSIVE: &str = "Exclusive";
/// `spec.channel` has named no version yet.
pub const WAIT_CHANNEL: &str = "Channel";
/// The upgrade to this version already ran on the node in this boot,
/// under another plan, and did not bring it there.
pub const WAIT_ISSUED: &str = "IssuedThisBoot";
pub const FAILED_HOOK: &str = "HookFailed";
pub const FAILED_DRAIN: &str = "DrainFailed";
pub const FAILED_COMMAND: &str = "CommandFailed";
pub const FAILED_UPGRADE_TIMEOUT: &str = "UpgradeTimeout";
pub const FAILED_VERIFY_TIMEOUT: &str = "VerifyTimeout";
pub const FAILED_INTERRUPTED: &str = "Interrupted";
/// A Job of the plan (hook or upgrade) was deleted before it finished.
pub const FAILED_JOB_DELETED: &str = "JobDeleted";

/// The version a node reports, from where the plan says to look.
pub fn reported_version<'a>(node: &'a Node, from: &VersionFrom) -> Option<&'a str> {
    let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
    match from.source.as_str() {
        "OSImage" => info.map(|i| i.os_image.as_str()),
        "KernelVersion" => info.map(|i| i.kernel_version.as_str()),
        "Label" => node
            .labels()
            .get(from.key.as_deref().unwrap_or_default())
            .map(String::as_str),
        "Annotation" => annotation(node, from.key.as_deref().unwrap_or_default()),
        _ => info.map(|i| i.kubelet_version.as_str()),
    }
    .filter(|v| !v.is_empty())
}

/// Does the node report `version`? Equal, except for the free-text
/// `OSImage` and `KernelVersion`, which contain it.
pub fn at_version(node: &Node, from: &VersionFrom, version: &str) -> bool {
    match (reported_version(node, from), from.source.as_str()) {
        (Some(v), "OSImage" | "KernelVersion") => v.contains(version),
        (Some(v), _) => v == version,
        (None, _) => false,
    }
}

/// What identifies one upgrade command: plan, version, boot and the
/// admission's attempt (the plan's generation when it was admitted). A
/// retry after a failure is a new attempt, so its command runs again
/// (the host-run id and the result carry the token); a repeat of one
/// attempt never does. An entry recorded without an attempt keeps the
/// token it had.
pub fn token(plan: &str, version: &str, boot: &str, attempt: Option<i64>) -> String {
    match attempt {
        Some(a) => format!("{plan}/{version}/{boot}/{a}"),
        None => format!("{plan}/{version}/{boot}"),
    }
}

/// The token of this admission's command as recorded on `node`: the one
/// written before tokens named the attempt (`<plan>/<version>/<boot>`,
/// by a nodekeeper upgraded while the command ran) is this admission's
/// too, so it is attached to, never run again.
pub fn recorded_token(
    node: &Node,
    plan: &str,
    version: &str,
    boot: &str,
    attempt: Option<i64>,
) -> String {
    let legacy = token(plan, version, boot, None);
    if annotation(node, ISSUED_ANNOTATION) == Some(legacy.as_str()) {
        return legacy;
    }
    token(plan, version, boot, attempt)
}

/// The name of the NodeMaintenance a plan takes `node` with.
pub fn maintenance_name(node: &str) -> String {
    disrupt::maintenance_name("upgrade", node)
}

/// What the schema could not check, `target` the version this decision
/// upgrades to (empty: none yet).
fn problems(p: &UpgradePlan, target: &str) -> Vec<String> {
    let mut problems = Vec::new();
    // The schema checks `spec.version` too; a channel's answer recorded by
    // an older nodekeeper was not checked.
    if !target.is_empty()
        && let Err(why) = super::version::Version::parse(target)
    {
        problems.push(format!("the version to upgrade to: {why}"));
    }
    let selectors = p
        .spec
        .node_selector
        .iter()
        .chain(p.spec.groups.iter().map(|g| &g.node_selector));
    for sel in selectors {
        if let Err(e) = check_selector(sel) {
            problems.push(e);
        }
    }
    problems.extend(disrupt::check_pod_selectors(&p.spec.gates, &p.spec.drain));
    // Checked with the real version: `v1.33.1+k3s1` is no label value.
    let label_version = if target.is_empty() { "v1.0.0" } else { target };
    problems.extend(marking::check(&p.spec.node_labels, label_version));
    problems.extend(hooks::check(p));
    problems.extend(upgrade_job::check(p));
    problems
}

/// One plan's next plan of effects: the new status (written first,
/// guarded), then Jobs and NodeMaintenances to create or delete and
/// events; then when to look again. The pass in order: what the schema
/// could not check, the selected nodes by group, the nodes it holds or has
/// finished, the group being upgraded, admissions, marks, the end.
pub fn decide<'a>(s: &'a Snapshot<'a>) -> Plan {
    let p = s.plan;
    let name = p.name_any();
    let empty = UpgradePlanStatus::default();
    let old = p.status.as_ref().unwrap_or(&empty);
    let mut problems = problems(p, s.target());
    let windows: Vec<window::Parsed> = p
        .spec
        .windows
        .iter()
        .filter_map(|w| window::parse(w).map_err(|e| problems.push(e)).ok())
        .collect();
    let selected = select(s, problems.is_empty());
    let mut d = Decision {
        s,
        name: name.clone(),
        generation: p.metadata.generation.unwrap_or_default(),
        previous: old.nodes.iter().map(|e| (e.name.as_str(), e)).collect(),
        entries: BTreeMap::new(),
        effects: Vec::new(),
        wake: None,
    };
    // Our NodeMaintenances on nodes that are gone: the slot is reclaimed.
    d.effects
        .extend(rollout::reclaim_gone(s.maintenances, s.nodes, |m| {
            owned_by(m, OWNER_KIND, &name)
        }));
    let mut failure_pause: Option<String> = None;
    let mut candidates: Vec<(usize, &Arc<Node>)> = Vec::new();
    for &(g, node) in &selected {
        match follow(&mut d, g, node) {
            Followed::Candidate => candidates.push((g, node)),
            Followed::FailedPausing => {
                failure_pause.get_or_insert(node.name_any());
            }
            Followed::Done => {}
        }
    }
    // A node it holds that left its selector (a person relabelled it):
    // finished, then given back (a failed one stays in maintenance for a
    // person, listed). Dropped from the status, it stayed cordoned by a
    // NodeMaintenance nothing followed.
    for node in held_unselected(&d, &selected) {
        follow_unselected(&mut d, node);
    }
    let current = current_group(&d, &selected);
    let admission = admit::Admission {
        selected: &selected,
        windows: &windows,
        problems: &problems,
        failure_pause: failure_pause.as_deref(),
        current,
    };
    let admitted = admit::admit(&mut d, &admission, candidates);
    finish(d, &selected, &problems, failure_pause, current, &admitted)
}

/// The nodes the plan selects (none while it is invalid) with their group
/// index, in admission order: group, then name (stable across decisions
/// and restarts). A node in no group is not upgraded.
fn select<'a>(s: &Snapshot<'a>, valid: bool) -> Vec<(usize, &'a Arc<Node>)> {
    let p = s.plan;
    let group_of = |n: &Node| -> Option<usize> {
        if p.spec.groups.is_empty() {
            return Some(0);
        }
        p.spec
            .groups
            .iter()
            .position(|g| selector_matches(&g.node_selector, n.labels()))
    };
    let mut selected: Vec<(usize, &Arc<Node>)> = s
        .nodes
        .iter()
        .filter(|n| match &p.spec.node_selector {
            None => true,
            Some(sel) => valid && selector_matches(sel, n.labels()),
        })
        .filter_map(|n| Some((group_of(n)?, n)))
        .collect();
    selected.sort_by(|a, b| (a.0, &a.1.metadata.name).cmp(&(b.0, &b.1.metadata.name)));
    selected
}

/// The name of group `g`, if the plan has groups.
fn group_name(p: &UpgradePlan, g: usize) -> Option<String> {
    p.spec.groups.get(g).map(|g| g.name.clone())
}

/// What following one selected node found.
enum Followed {
    /// Not held and not finished: it may be admitted.
    Candidate,
    /// Failed, and the plan pauses on a failure (`onFailure: Pause`).
    FailedPausing,
    /// Followed or reported; nothing more this pass.
    Done,
}

/// One selected node: followed to its next step if the plan holds it;
/// else kept failed, given back from an earlier attempt, reported waiting
/// for the channel, found at the version or held by an older plan — or a
/// candidate for admission.
fn follow(d: &mut Decision, g: usize, node: &Arc<Node>) -> Followed {
    let s = d.s;
    let p = s.plan;
    let (n, name, group) = (node.name_any(), d.name.clone(), group_name(p, g));
    let pausing = p.spec.on_failure != "Continue";
    let ours = s
        .maintenances
        .iter()
        .find(|m| m.spec.node_name == n && owned_by(m, OWNER_KIND, &name))
        .map(|m| m.as_ref());
    let prev = d.prev(&n);
    if prev.is_some_and(|e| e.phase.admitted()) {
        d.follow(node, ours, group);
        let failed = d
            .entries
            .get(&n)
            .is_some_and(|e| e.phase == UpgradePhase::Failed);
        return if failed && pausing {
            Followed::FailedPausing
        } else {
            Followed::Done
        };
    }
    if let Some(e) = prev.filter(|e| e.phase == UpgradePhase::Failed) {
        // The same spec and version: stays failed. A channel's new version
        // is a new attempt, as an edit of `version` is; a retry is
        // admitted afresh once the failed attempt's NodeMaintenance is
        // gone (below).
        if e.attempt == Some(d.generation) && e.version.as_deref().is_none_or(|v| v == s.target()) {
            d.entries.insert(n, e.clone());
            return if pausing {
                Followed::FailedPausing
            } else {
                Followed::Done
            };
        }
    }
    let at_target = at_version(node, &p.spec.version_from, s.target());
    if let Some(m) = ours
        && !at_target
    {
        // Ours, yet not held: left by an attempt that failed, or by one
        // that finished and whose give-back was refused, and the target
        // moved on since (an edit, a channel's newer version). Given back
        // first, every pass until it is gone (level-triggered); the node is
        // admitted afresh after that, so the new attempt starts untouched:
        // its before hooks on a node nobody holds, its own drain, its own
        // slot. Taken again at once, it ran its before hooks on a cordoned
        // node and adopted the old, drained NodeMaintenance (a create of
        // its name is a 409).
        if !m.is_deleting() {
            d.give_back(m);
        }
        let msg = format!(
            "the NodeMaintenance {} of an earlier attempt is given back first",
            m.name_any()
        );
        let reason = Some(WAIT_IN_MAINTENANCE);
        d.set(&n, UpgradePhase::Waiting, group, reason, msg);
        return Followed::Done;
    }
    if s.target().is_empty() {
        let old = p.status.as_ref().and_then(|st| st.channel.as_ref());
        let why = s
            .channel
            .or(old)
            .and_then(|c| c.error.clone())
            .unwrap_or_else(|| "not asked yet".into());
        let msg = format!("the channel has named no version yet: {why}");
        d.set(&n, UpgradePhase::Waiting, group, Some(WAIT_CHANNEL), msg);
        return Followed::Done;
    }
    if at_target {
        // Level-triggered give-back: `Done` was written before the
        // give-back ran, and a refused delete left the node cordoned and
        // the group unfinished. Every pass asks again.
        if let Some(m) = ours.filter(|m| !m.is_deleting()) {
            d.give_back(m);
        }
        let msg = format!("at version {}", s.target());
        d.set(&n, UpgradePhase::Done, group, None, msg);
        // The README lists `version` on every entry; a node found at the
        // version had none.
        if let Some(e) = d.entries.get_mut(&n) {
            e.version = Some(s.target().to_string());
        }
        return Followed::Done;
    }
    if let Some(other) = governing(node, s.plans).filter(|o| o.name_any() != name) {
        // Two plans over one node would take turns upgrading it to their
        // versions for ever: the older plan has it.
        let msg = format!(
            "also selected by the older UpgradePlan {}, which upgrades it",
            other.name_any()
        );
        d.set(&n, UpgradePhase::Waiting, group, Some(WAIT_OTHER_PLAN), msg);
        return Followed::Done;
    }
    Followed::Candidate
}

/// Nodes the plan holds (its NodeMaintenance live on them) that it no
/// longer selects. An admission that has not taken its node yet (before
/// hooks, a create that failed) is dropped, not carried out on a node the
/// plan no longer selects.
fn held_unselected<'a>(d: &Decision<'a>, selected: &[(usize, &Arc<Node>)]) -> Vec<&'a Arc<Node>> {
    let s = d.s;
    // Only nodes with a NodeMaintenance of ours can be held: few, so the
    // cluster's nodes are not compared with the selected ones at scale.
    let held: std::collections::BTreeSet<&str> = s
        .maintenances
        .iter()
        .filter(|m| owned_by(m, OWNER_KIND, &d.name) && !m.is_deleting())
        .map(|m| m.spec.node_name.as_str())
        .collect();
    s.nodes
        .iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|x| held.contains(x)))
        .filter(|n| {
            !selected
                .iter()
                .any(|(_, x)| x.metadata.name == n.metadata.name)
        })
        .collect()
}

/// The plan's live NodeMaintenance on `node`.
fn ours<'a>(s: &Snapshot<'a>, node: &str, plan: &str) -> Option<&'a NodeMaintenance> {
    s.maintenances
        .iter()
        .find(|m| m.spec.node_name == node && owned_by(m, OWNER_KIND, plan) && !m.is_deleting())
        .map(|m| m.as_ref())
}

/// A held node the plan no longer selects: an upgrade under way is
/// followed to its end; a failed node keeps its entry (held for a
/// person); anything else of the plan's on it is given back.
fn follow_unselected(d: &mut Decision, node: &Arc<Node>) {
    let n = node.name_any();
    let ours = ours(d.s, &n, &d.name);
    match d.prev(&n) {
        Some(e) if e.phase.admitted() => {
            let group = e.group.clone();
            d.follow(node, ours, group);
        }
        Some(e) if e.phase == UpgradePhase::Failed => {
            d.entries.insert(n, e.clone());
        }
        prev => {
            if let Some(m) = ours {
                d.give_back(m);
            }
            if let Some(e) = prev {
                d.entries.insert(n, e.clone());
            }
        }
    }
}

/// The group being upgraded: the first with a node not finished. Done
/// means given back too: its NodeMaintenance gone, which happens only
/// after the agent uncordoned it (the finalizer goes last).
fn current_group(d: &Decision, selected: &[(usize, &Arc<Node>)]) -> Option<usize> {
    let s = d.s;
    let continue_on_failure = s.plan.spec.on_failure == "Continue";
    let finished = |e: Option<&NodeUpgrade>| {
        e.is_some_and(|e| {
            (e.phase == UpgradePhase::Done
                && !s
                    .maintenances
                    .iter()
                    .any(|m| m.spec.node_name == e.name && owned_by(m, OWNER_KIND, &d.name)))
                || (e.phase == UpgradePhase::Failed && continue_on_failure)
        })
    };
    selected
        .iter()
        .find(|(_, n)| !finished(d.entries.get(n.name_any().as_str())))
        .map(|(g, _)| *g)
}

/// The end of the pass: the plan's marks on its nodes from each entry's
/// phase (a failed node stays in maintenance, for a person: it keeps the
/// marks of being held), the status, what it tells, the steps' effects.
fn finish(
    d: Decision,
    selected: &[(usize, &Arc<Node>)],
    problems: &[String],
    failure_pause: Option<String>,
    current: Option<usize>,
    admitted: &[String],
) -> Plan {
    let (s, name) = (d.s, d.name.as_str());
    let p = s.plan;
    let owner = format!("{OWNER_KIND}/{name}");
    let wanted = marking::Marks {
        labels: &p.spec.node_labels,
        soft_taint: p.spec.prefer_no_schedule_while_waiting,
        feature: "upgrade",
        version: s.target(),
        owner: &owner,
    };
    let mut effects = d.effects;
    let stage_of = |node: &Node| {
        if governing(node, s.plans).is_some_and(|g| g.name_any() != name) {
            return None;
        }
        Some(
            match d.entries.get(node.name_any().as_str()).map(|e| e.phase) {
                None => marking::Stage::Untouched,
                Some(UpgradePhase::Pending | UpgradePhase::Waiting) => marking::Stage::Waiting,
                Some(UpgradePhase::Settling | UpgradePhase::Done) => marking::Stage::Done,
                Some(_) => marking::Stage::Held,
            },
        )
    };
    let nodes = selected.iter().map(|(_, n)| n.as_ref());
    let withheld = rollout::mark(&mut effects, nodes, &wanted, problems.is_empty(), stage_of);
    let empty = UpgradePlanStatus::default();
    let old = p.status.as_ref().unwrap_or(&empty);
    let mut status = status(s, old, d.entries, problems, failure_pause, current);
    marking::report(&mut status.conditions, s.now, &withheld);
    let insecure = |st: Option<&UpgradePlanStatus>| {
        st.and_then(|st| st.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == INSECURE_CHANNEL))
    };
    let newly_insecure = insecure(Some(&status)) && !insecure(p.status.as_ref());
    // After the status write: a failed write is decided again, events too.
    let told = rollout::notification_failed(
        kube::Resource::object_ref(p, &()),
        old.notifications.as_ref(),
        status.notifications.as_ref(),
    );
    let insecure_event = newly_insecure.then(|| Effect::Event {
        object: kube::Resource::object_ref(p, &()),
        warning: true,
        reason: INSECURE_CHANNEL,
        note: PLAIN_HTTP.into(),
    });
    let write = (p.status.as_ref() != Some(&status)).then(|| Effect::WriteUpgradeStatus {
        plan: name.to_string(),
        resource_version: p.resource_version(),
        status: Box::new(status),
    });
    let who = format!("UpgradePlan {name}");
    let said = told.into_iter().chain(insecure_event);
    rollout::end(write, said, effects, &who, admitted, d.wake)
}

/// Before a node is taken: its agent must have said the plan's commands
/// can run there (a missing command drained the node, then failed and left
/// it in maintenance). A command that cannot run is reported on the node
/// and the plan once, when it is found.
fn agent_check(d: &mut Decision, node: &Node, p: &UpgradePlan) -> Option<(&'static str, String)> {
    // Type Job: the cluster role runs the upgrade; the agent runs nothing.
    if p.spec.strategy.job().is_some() {
        return None;
    }
    let n = node.name_any();
    let w = rollout::agent_wait(
        node::check_of(node, p),
        d.prev(&n).and_then(|e| e.reason.as_deref()),
        "waiting for the node's agent to say the plan's commands can run there",
        |why| format!("the node's agent cannot run the plan's command: {why}"),
    )?;
    if w.news {
        d.event(&n, true, "UpgradeCommandNotRunnable", &w.message);
    }
    Some((w.reason, w.message))
}

#[cfg(test)]
mod tests;
