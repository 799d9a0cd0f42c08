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

pub mod channel;
mod holders;
mod hooks;
pub mod node;
mod report;
mod stages;
pub mod upgrade_job;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::api::pod::Pod;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::budget::Member;
use super::disrupt::{self, boot_id, owned_by, ready, unschedulable};
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
/// events; then when to look again.
pub fn decide<'a>(s: &'a Snapshot<'a>) -> Plan {
    let p = s.plan;
    let name = p.name_any();
    let now = s.now;
    let generation = p.metadata.generation.unwrap_or_default();
    let empty = UpgradePlanStatus::default();
    let old = p.status.as_ref().unwrap_or(&empty);

    let mut problems = problems(p, s.target());
    let windows: Vec<window::Parsed> = p
        .spec
        .windows
        .iter()
        .filter_map(|w| window::parse(w).map_err(|e| problems.push(e)).ok())
        .collect();
    let valid = problems.is_empty();

    // The selected nodes with their group index, in admission order: group,
    // then name (stable across decisions and restarts).
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
    let group_name = |g: usize| p.spec.groups.get(g).map(|g| g.name.clone());

    let mut d = Decision {
        s,
        name: name.clone(),
        generation,
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

    // 1. Nodes we hold; failed and finished nodes.
    let continue_on_failure = p.spec.on_failure == "Continue";
    let mut failure_pause: Option<String> = None;
    let mut candidates: Vec<(usize, &Arc<Node>)> = Vec::new();
    for &(g, node) in &selected {
        let n = node.name_any();
        let ours = s
            .maintenances
            .iter()
            .find(|m| m.spec.node_name == n && owned_by(m, OWNER_KIND, &name))
            .map(|m| m.as_ref());
        let prev = d.prev(&n);
        let held = prev.is_some_and(|e| e.phase.admitted());
        if held {
            d.follow(node, ours, group_name(g));
            if let Some(e) = d.entries.get(&n)
                && e.phase == UpgradePhase::Failed
                && !continue_on_failure
            {
                failure_pause.get_or_insert(n.clone());
            }
            continue;
        }
        if let Some(e) = prev.filter(|e| e.phase == UpgradePhase::Failed) {
            // The same spec and version: stays failed. A channel's new
            // version is a new attempt, as an edit of `version` is.
            if e.attempt == Some(generation) && e.version.as_deref().is_none_or(|v| v == s.target())
            {
                d.entries.insert(n.clone(), e.clone());
                if !continue_on_failure {
                    failure_pause.get_or_insert(n.clone());
                }
                continue;
            }
            // The spec changed since it failed: a retry, admitted afresh
            // once the failed attempt's NodeMaintenance is gone (below).
        }
        if let Some(m) = ours
            && !at_version(node, &p.spec.version_from, s.target())
        {
            // Ours, yet not held: left by an attempt that failed, or by one
            // that finished and whose give-back was refused, and the target
            // moved on since (an edit, a channel's newer version). Given
            // back first, every pass until it is gone (level-triggered);
            // the node is admitted afresh after that, so the new attempt
            // starts untouched: its before hooks on a node nobody holds,
            // its own drain, its own slot. Taken again at once, it ran its
            // before hooks on a cordoned node and adopted the old, drained
            // NodeMaintenance (a create of its name is a 409).
            if !m.is_deleting() {
                d.give_back(m);
            }
            let msg = format!(
                "the NodeMaintenance {} of an earlier attempt is given back first",
                m.name_any()
            );
            d.set(
                &n,
                UpgradePhase::Waiting,
                group_name(g),
                Some(WAIT_IN_MAINTENANCE),
                msg,
            );
            continue;
        }
        if s.target().is_empty() {
            let c = s.channel.or(old.channel.as_ref());
            let why = c
                .and_then(|c| c.error.clone())
                .unwrap_or_else(|| "not asked yet".into());
            let msg = format!("the channel has named no version yet: {why}");
            d.set(
                &n,
                UpgradePhase::Waiting,
                group_name(g),
                Some(WAIT_CHANNEL),
                msg,
            );
            continue;
        }
        if at_version(node, &p.spec.version_from, s.target()) {
            // Level-triggered give-back: `Done` was written before the
            // give-back ran, and a refused delete left the node cordoned
            // and the group unfinished. Every pass asks again.
            if let Some(m) = ours.filter(|m| !m.is_deleting()) {
                d.give_back(m);
            }
            let msg = format!("at version {}", s.target());
            d.set(&n, UpgradePhase::Done, group_name(g), None, msg);
            // The README lists `version` on every entry; a node found at
            // the version had none.
            if let Some(e) = d.entries.get_mut(&n) {
                e.version = Some(s.target().to_string());
            }
            continue;
        }
        if let Some(other) = governing(node, s.plans).filter(|o| o.name_any() != name) {
            // Two plans over one node would take turns upgrading it to
            // their versions for ever: the older plan has it.
            let msg = format!(
                "also selected by the older UpgradePlan {}, which upgrades it",
                other.name_any()
            );
            d.set(
                &n,
                UpgradePhase::Waiting,
                group_name(g),
                Some(WAIT_OTHER_PLAN),
                msg,
            );
            continue;
        }
        candidates.push((g, node));
    }

    // 2. The group being upgraded: the first with a node not finished.
    // Done means given back too: its NodeMaintenance gone, which happens
    // only after the agent uncordoned it (the finalizer goes last).
    let finished = |e: Option<&NodeUpgrade>| {
        e.is_some_and(|e| {
            (e.phase == UpgradePhase::Done
                && !s
                    .maintenances
                    .iter()
                    .any(|m| m.spec.node_name == e.name && owned_by(m, OWNER_KIND, &name)))
                || (e.phase == UpgradePhase::Failed && continue_on_failure)
        })
    };
    let current = selected
        .iter()
        .find(|(_, n)| !finished(d.entries.get(n.name_any().as_str())))
        .map(|(g, _)| *g);

    // 3. Admit candidates of the current group within limits.
    let mut members: Vec<Member> = selected
        .iter()
        .map(|(_, n)| {
            let nn = n.metadata.name.as_deref().unwrap_or_default();
            Member {
                name: nn,
                labels: n.metadata.labels.as_ref(),
                unavailable: !ready(n)
                    || unschedulable(n)
                    || s.maintenances.iter().any(|m| m.spec.node_name == nn)
                    || d.entries.get(nn).is_some_and(|e| e.phase.admitted()),
            }
        })
        .collect();
    let window_open = window::open(&windows, now);
    if let Some(t) = window::next_change(&windows, now) {
        d.wake_at(t);
    }
    let others_not_ready: Vec<String> = selected
        .iter()
        .filter(|(_, n)| !ready(n))
        .filter(|(_, n)| !candidates.iter().any(|(_, c)| c.name_any() == n.name_any()))
        .map(|(_, n)| n.name_any())
        .filter(|n| !d.entries.get(n).is_some_and(|e| e.phase.admitted()))
        .collect();
    let mut admitted = Vec::new();
    for (g, node) in candidates {
        let n = node.name_any();
        let other_nm = s.maintenances.iter().find(|m| {
            m.spec.node_name == n && !owned_by(m, OWNER_KIND, &name) && disrupt::holds_node(m)
        });
        let wait: Option<(&str, String)> = if !valid {
            Some((
                WAIT_INVALID,
                format!("the plan cannot be used: {}", problems.join("; ")),
            ))
        } else if p.spec.paused {
            Some((WAIT_PAUSED, "the plan is paused".into()))
        } else if let Some(f) = &failure_pause {
            Some((
                WAIT_FAILURE,
                format!(
                    "paused after node {f} failed (onFailure: Pause); change the spec to retry, e.g. pause and unpause the plan"
                ),
            ))
        } else if let Some(other) = exclusive_with(p, s.plans, s.maintenances) {
            Some((
                WAIT_EXCLUSIVE,
                format!("the exclusive UpgradePlan {other} is upgrading a node"),
            ))
        } else if Some(g) != current {
            let waits_for = current.and_then(group_name).unwrap_or_default();
            Some((WAIT_GROUP, format!("waits for group {waits_for} to finish")))
        } else if let Some(m) = other_nm {
            Some((
                WAIT_IN_MAINTENANCE,
                format!("in maintenance (NodeMaintenance {})", m.name_any()),
            ))
        } else if boot_id(node).is_none() {
            Some((
                WAIT_NOT_READY,
                "the node reports no boot ID, so its upgrade could not be tracked".into(),
            ))
        } else if let Some(other) = boot_id(node)
            .and_then(|b| node::issued_for(node, s.target(), b))
            .filter(|o| *o != name)
        {
            // Another plan's attempt in this boot is not repeated: a
            // plan deleted after its upgrade failed gave the node back,
            // and the next plan drained it and ran the command again.
            Some((
                WAIT_ISSUED,
                format!(
                    "the upgrade to {} already ran on it in this boot (UpgradePlan {other}) and it does not report that version; not run again until the node reboots",
                    s.target()
                ),
            ))
        } else if let Some(w) = agent_check(&mut d, node, p) {
            Some(w)
        } else {
            disrupt::wait(&disrupt::Admission {
                what: "upgrade",
                window_open,
                node,
                gates: &p.spec.gates,
                others_not_ready: &others_not_ready,
                pods: &(s.pods_on)(&n),
                budget: &p.spec.budget,
                members: &members,
                alerts: s.alerts,
                unlisted: s.gates_unlisted,
            })
        };
        match wait {
            Some((reason, msg)) => {
                d.set(&n, UpgradePhase::Waiting, group_name(g), Some(reason), msg)
            }
            None => {
                for m in members.iter_mut().filter(|m| m.name == n) {
                    m.unavailable = true;
                }
                d.admit(node, group_name(g));
                admitted.push(n);
            }
        }
    }

    // The plan's marks on its nodes, from each entry's phase. A failed
    // node stays in maintenance (for a person): it keeps the labels of
    // being held.
    let owner = format!("{OWNER_KIND}/{name}");
    let wanted = marking::Marks {
        labels: &p.spec.node_labels,
        soft_taint: p.spec.prefer_no_schedule_while_waiting,
        feature: "upgrade",
        version: s.target(),
        owner: &owner,
    };
    let withheld = if valid {
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
        rollout::mark(&mut d.effects, nodes, &wanted, stage_of)
    } else {
        Vec::new()
    };
    let mut status = status(s, old, d.entries, &problems, failure_pause, current);
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
        plan: name.clone(),
        resource_version: p.resource_version(),
        status: Box::new(status),
    });
    let who = format!("UpgradePlan {name}");
    let said = told.into_iter().chain(insecure_event);
    rollout::end(write, said, d.effects, &who, &admitted, d.wake)
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
