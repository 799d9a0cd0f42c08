//! What a reboot wave ([`super::reboot`]) and an upgrade plan
//! ([`super::upgrade`]) share: the parts of one rollout skeleton.
//!
//! Both decisions read their object, give back what they hold on nodes
//! that are gone, follow the nodes they hold, admit new ones within the
//! limits, mark the nodes they govern and end the pass with a guarded
//! status write followed by the steps' effects. What the two do the same
//! way is written here once — the reasons both report, the agent's
//! command check, settling after the node came back, the marks, the end
//! of a pass — so a fix to any of it is made once and reaches both (the
//! retry defect of the findings existed in both copies).

use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::budget::Member;
use super::command_check::Check;
use super::disrupt::{self, Alerts};
use super::health::{self, Health};
use super::{Effect, Plan, Then, marking};
use crate::api::common::{Budget, Gates, NotificationStatus};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::pod::Pod;

/// A person paused the node (reboots) or the object (upgrades).
pub const WAIT_PAUSED: &str = "Paused";
/// Another disruption's NodeMaintenance holds the node.
pub const WAIT_IN_MAINTENANCE: &str = "InMaintenance";
/// Someone else holds the node outside any NodeMaintenance: it is shutting
/// down, drained by `kubectl drain`, or cordoned by a person or Talos; or
/// `karpenter.sh/do-not-disrupt` keeps features off it
/// ([`crate::decide::disrupt::foreign_holder`]).
pub use super::disrupt::{WAIT_DO_NOT_DISRUPT, WAIT_HELD_BY_OTHER};
/// The object's spec has a problem the schema could not catch.
pub const WAIT_INVALID: &str = "InvalidSpec";
/// The node's agent has not said yet whether it can run the command.
pub const WAIT_AGENT_CHECK: &str = "AgentCheck";
/// The node's agent cannot run the command (the maintenance-only install,
/// a program missing on the host).
pub const WAIT_COMMAND: &str = "CommandNotRunnable";

/// A node every other limit admits waits for its pods to be read
/// ([`pods_hold`]). It holds a slot for the rest of the decision, so a
/// pass reads a budget's worth of nodes, not every candidate.
pub const WAIT_PODS_UNREAD: &str = "PodsUnread";

/// How soon a node held by what no watch of the cluster role tells is
/// looked at again: a pod's opt-out taken off (the cluster role watches
/// only the pods of nodes it drains), a replica of the cluster role
/// started on another node. Without it such a node waited for an
/// unrelated event (found as a flake: the own node held for ever after
/// the second replica started).
pub const LOOK_AGAIN: Duration = Duration::from_secs(30);

/// Karpenter's do-not-disrupt on the node's pods, checked last before a
/// node is taken (only a node every other limit admits has its pods
/// read): it waits while a pod holds it, naming the pod and until when,
/// or while its pods are not read. `again` is told how soon to look
/// again: when a duration ends, and at most [`LOOK_AGAIN`].
pub fn pods_hold(
    pods: Option<Vec<Arc<Pod>>>,
    now: Timestamp,
    again: impl FnOnce(Duration),
) -> Option<(&'static str, String)> {
    let Some(pods) = pods else {
        again(LOOK_AGAIN);
        let msg = "its pods are not read yet (for karpenter.sh/do-not-disrupt)";
        return Some((WAIT_PODS_UNREAD, msg.into()));
    };
    let hold = super::do_not_disrupt::longest(&pods, now)?;
    again(hold.until.map_or(LOOK_AGAIN, |t| {
        super::duration_until(now, t).min(LOOK_AGAIN)
    }));
    Some((WAIT_DO_NOT_DISRUPT, hold.message()))
}

/// An admission not carried out yet (its NodeMaintenance not created, or
/// the create not seen) is withdrawn when someone else took the node
/// meanwhile (a person's cordon, another drainer, do-not-disrupt on the
/// node) or a pod's do-not-disrupt holds it now (or its pods could not be
/// read): the reason, and a message that says so. Checked again before
/// every create, so an upgrade's before hooks or a failed create do not
/// take a node the admission could not have.
pub fn withdrawn(
    node: &Node,
    pods: Option<Vec<Arc<Pod>>>,
    now: Timestamp,
    again: impl FnOnce(Duration),
) -> Option<(&'static str, String)> {
    let (reason, why) = disrupt::foreign_holder(node).or_else(|| pods_hold(pods, now, again))?;
    Some((reason, format!("{why}; the admission is withdrawn")))
}

/// The node this cluster role runs on waits for it (`OwnNode`).
pub const WAIT_OWN_NODE: &str = "OwnNode";

/// Whether a node is the one this cluster role runs on, and if so whether
/// it may take it (`service::node_pods` answers, on demand).
#[derive(Clone, Debug, PartialEq)]
pub enum OwnNode {
    /// Not the node this process runs on (or it runs on none it knows).
    NotOurs,
    /// Ours; not read yet whether a replica runs elsewhere.
    Unknown,
    /// Ours, and a replica runs on another node, or no other node could
    /// ever run one (the cluster has this one node, or the cluster role's
    /// pod is pinned to it).
    Free,
    /// Ours, and nothing would run the cluster role while it is down: why.
    Held(String),
    /// Ours, no other node could ever run the cluster role, and a drain
    /// evicts its pod: it would wait Pending on the cordoned node. Only a
    /// feature whose node agent gives the node back itself (a reboot, an
    /// upgrade the agent finishes alone) may take it; others wait, saying
    /// this.
    Evicted(String),
}

/// A cluster role never takes the node it runs on without a replica of it
/// running on another node to take over, unless no other node could ever
/// run one (a one-node cluster, or the cluster role pinned to this node).
/// If its pod is then evicted by the drain, only a feature whose agent
/// gives the node back itself (`agent_gives_back`: reboots, and upgrades
/// with nothing left for the cluster role,
/// `upgrade::node::agent_gives_back`) may take the node; any other would
/// leave it cordoned with no cluster role to give it back.
/// `again` is told to look again within [`LOOK_AGAIN`] while it holds.
pub fn own_node_hold(
    own: OwnNode,
    agent_gives_back: bool,
    again: impl FnOnce(Duration),
) -> Option<(&'static str, String)> {
    let hold = match own {
        OwnNode::NotOurs | OwnNode::Free => None,
        OwnNode::Evicted(_) if agent_gives_back => None,
        OwnNode::Unknown => Some((
            WAIT_OWN_NODE,
            "nodekeeper's cluster role runs on this node; reading whether a replica runs on another".into(),
        )),
        OwnNode::Held(why) | OwnNode::Evicted(why) => Some((WAIT_OWN_NODE, why)),
    };
    if hold.is_some() {
        again(LOOK_AGAIN);
    }
    hold
}

/// The delete that gives a node back: our NodeMaintenance, guarded by its
/// uid (a NodeMaintenance of that name created since is someone else's).
pub fn give_back(nm: &NodeMaintenance) -> Option<Effect> {
    Some(Effect::DeleteMaintenance {
        nm: nm.name_any(),
        uid: nm.uid()?,
    })
}

/// The owner's NodeMaintenances on nodes that are gone: given back, so
/// their slots are reclaimed.
pub fn reclaim_gone(
    maintenances: &[std::sync::Arc<NodeMaintenance>],
    nodes: &[std::sync::Arc<Node>],
    owned: impl Fn(&NodeMaintenance) -> bool,
) -> Vec<Effect> {
    maintenances
        .iter()
        .filter(|m| owned(m) && !m.is_deleting())
        .filter(|m| !nodes.iter().any(|n| n.name_any() == m.spec.node_name))
        .filter_map(|m| give_back(m))
        .collect()
}

/// Node role: the feature's NodeMaintenances on its own node that have
/// drained it and are not being given back — the only places its
/// command may run.
pub fn drained_by<'m>(
    maintenances: &'m [&'m NodeMaintenance],
    kind: &'m str,
) -> impl Iterator<Item = &'m NodeMaintenance> {
    maintenances.iter().copied().filter(move |m| {
        super::maintenance::owner_of(m) == Some(kind)
            && m.phase() == Some(crate::api::nodemaintenance::Phase::Succeeded)
            && !m.is_deleting()
    })
}

/// `t` plus `secs` seconds (a negative count as none).
pub fn after(t: Timestamp, secs: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_secs(secs.max(0)))
        .unwrap_or(t)
}

/// Why a node waits for its agent's command check, if it does.
#[derive(Debug, PartialEq)]
pub struct AgentWait {
    pub reason: &'static str,
    pub message: String,
    /// Found in this pass (it was not the node's reason before): said
    /// once, as an Event.
    pub news: bool,
}

/// Before a node is taken, its agent must have said the object's command
/// can run there: a command that cannot drained the node, then failed
/// and left it in maintenance. `unchecked` is what a node waiting for the
/// answer says; `cannot` words the agent's reason.
pub fn agent_wait(
    check: Check,
    previous_reason: Option<&str>,
    unchecked: &str,
    cannot: impl FnOnce(&str) -> String,
) -> Option<AgentWait> {
    match check {
        Check::Runnable => None,
        Check::Unchecked => Some(AgentWait {
            reason: WAIT_AGENT_CHECK,
            message: unchecked.into(),
            news: false,
        }),
        Check::NotRunnable(why) => Some(AgentWait {
            reason: WAIT_COMMAND,
            message: cannot(&why),
            news: previous_reason != Some(WAIT_COMMAND),
        }),
    }
}

/// A node that came back and was verified, as its object settles it.
pub struct Settling<'a> {
    pub gates: &'a Gates,
    pub node: &'a Node,
    pub health: Option<&'a Health>,
    pub alerts: Option<&'a Alerts>,
    pub now: Timestamp,
    /// When the node started settling.
    pub since: Timestamp,
    /// The reason its entry had.
    pub reason: Option<&'a str>,
    /// Its NodeMaintenance is gone (the node is schedulable again).
    pub given_back: bool,
    /// What was done, as its entry says it ("reboot verified",
    /// "upgraded to v1.2.3").
    pub done: &'a str,
}

/// Where a settling node goes.
#[derive(Debug, PartialEq)]
pub enum Settled {
    /// Done, with a reason when the health gate's timeout let it go.
    Done(Option<&'static str>, String),
    /// Still settling, keeping its slot.
    Settling(Option<&'static str>, String),
    /// Its entry as it was (settling its time out, or its give-back still
    /// running): no status write for nothing.
    Unchanged,
}

/// The verdict on a settling node: it keeps its slot for `settleSeconds`
/// and, with `gates.health`, until the cluster is healthy again or the
/// gate's timeout says otherwise. Also a warning to say (the health
/// timeout, once) and when to look again.
pub fn settle(s: &Settling) -> (Settled, Option<String>, Option<Timestamp>) {
    // `since` is kept to the second (metav1.Time), up to a second before
    // the return: counting a second more never cuts the cooldown short of
    // settleSeconds.
    let settle = s.gates.settle_seconds.max(0) as i64;
    let until = after(s.since, if settle > 0 { settle + 1 } else { 0 });
    let waiting = health::unhealthy(s.gates, s.node, s.health, s.alerts);
    let done = s.done;
    if s.given_back && s.now >= until && waiting.is_empty() {
        return (Settled::Done(None, done.into()), None, None);
    }
    let mut wake = (s.now < until).then_some(until);
    let Some(gate) = s.gates.health.as_ref().filter(|_| !waiting.is_empty()) else {
        return (Settled::Unchanged, None, wake);
    };
    let what = health::summary(&waiting);
    let due = after(s.since, gate.timeout_seconds.max(0) as i64);
    if s.now < due {
        wake = Some(wake.map_or(due, |w| w.min(due)));
        let msg = format!("{done}; waiting for health: {what}");
        return (Settled::Settling(None, msg), None, wake);
    }
    let limit = gate.timeout_seconds;
    let timeout = Some(health::HEALTH_TIMEOUT);
    if gate.on_timeout == "Continue" && s.given_back {
        let msg = format!(
            "{done}; not healthy within {limit} s (gates.health, onTimeout: Continue): {what}"
        );
        return (Settled::Done(timeout, msg.clone()), Some(msg), wake);
    }
    let msg = format!(
        "{done}; not healthy within {limit} s (gates.health); keeps its slot until it is: {what}"
    );
    let first = s.reason != Some(health::HEALTH_TIMEOUT);
    (
        Settled::Settling(timeout, msg.clone()),
        first.then_some(msg),
        wake,
    )
}

/// What one pass admits nodes within, built once and asked for each
/// candidate in admission order: the window, the gates, and the budget
/// over every selected node, which counts each node admitted in this pass
/// at once ([`Admitting::take`]).
pub struct Admitting<'a> {
    /// The feature, as waiting nodes are told (`outside every reboot window`).
    pub what: &'a str,
    pub gates: &'a Gates,
    pub budget: &'a Budget,
    /// Prometheus's last answer, when the object has a Prometheus gate.
    pub alerts: Option<&'a Alerts>,
    /// A blocking-pod gate whose pods are not listed yet (see
    /// [`disrupt::Admission::unlisted`]).
    pub unlisted: Option<&'a str>,
    pub window_open: bool,
    /// Outside every window: when the next one opens, if known.
    pub window_opens: Option<Timestamp>,
    /// Every selected node, as the budget counts it.
    pub members: Vec<Member<'a>>,
    /// Selected nodes that are NotReady and not this object's to wait for
    /// (the `requireReady` gate's others).
    pub others_not_ready: Vec<String>,
}

impl Admitting<'_> {
    /// Why `node` waits, if a window, a gate or the budget holds it.
    pub fn wait(&self, node: &Node, pods: &[Arc<Pod>]) -> Option<(&'static str, String)> {
        disrupt::wait(&disrupt::Admission {
            what: self.what,
            window_open: self.window_open,
            window_opens: self.window_opens,
            node,
            gates: self.gates,
            others_not_ready: &self.others_not_ready,
            pods,
            budget: self.budget,
            members: &self.members,
            alerts: self.alerts,
            unlisted: self.unlisted,
        })
    }

    /// `node` is admitted: from now on the budget counts it unavailable.
    pub fn take(&mut self, node: &str) {
        for m in self.members.iter_mut().filter(|m| m.name == node) {
            m.unavailable = true;
        }
    }
}

/// The budget's members: every selected node, unavailable when it is
/// NotReady, cordoned, or `held` says so (a NodeMaintenance on it, or an
/// entry of this object that holds its slot).
pub fn members<'a>(
    selected: impl IntoIterator<Item = &'a Node>,
    held: impl Fn(&str) -> bool,
) -> Vec<Member<'a>> {
    selected
        .into_iter()
        .map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            Member {
                name,
                labels: n.metadata.labels.as_ref(),
                unavailable: !disrupt::ready(n) || disrupt::unschedulable(n) || held(name),
            }
        })
        .collect()
}

/// Selected nodes that are NotReady, other than the candidates and the
/// nodes `own` says this object holds: what `requireReady` waits for.
pub fn others_not_ready<'a>(
    selected: impl IntoIterator<Item = &'a Node>,
    candidates: &[&str],
    own: impl Fn(&str) -> bool,
) -> Vec<String> {
    selected
        .into_iter()
        .filter(|n| !disrupt::ready(n))
        .map(|n| n.name_any())
        .filter(|n| !candidates.contains(&n.as_str()) && !own(n))
        .collect()
}

/// The object's marks on the nodes it selects, from each node's stage
/// (`None`: another object governs the node and marks it); none while the
/// object is invalid (`valid` false). Returns what it could not mark
/// because another object owns the key, for [`marking::report`].
pub fn mark<'n>(
    effects: &mut Vec<Effect>,
    nodes: impl IntoIterator<Item = &'n Node>,
    wanted: &marking::Marks,
    valid: bool,
    stage_of: impl Fn(&Node) -> Option<marking::Stage>,
) -> Vec<String> {
    let mut withheld = Vec::new();
    if !valid {
        return withheld;
    }
    for node in nodes {
        let Some(stage) = stage_of(node) else {
            continue;
        };
        let marks = marking::marks(effects, node, wanted, stage);
        effects.extend(marks);
        withheld.extend(marking::withheld(node, wanted, stage));
    }
    withheld
}

/// A Warning event on the object when its notifications' last failure is
/// new (the status keeps the line; the event reaches `kubectl describe`).
pub fn notification_failed(
    object: ObjectReference,
    old: Option<&NotificationStatus>,
    new: Option<&NotificationStatus>,
) -> Option<Effect> {
    let new = new?;
    let why = new.last_failure.as_ref()?;
    if old.is_some_and(|o| o.last_failure_time == new.last_failure_time) {
        return None;
    }
    Some(Effect::Event {
        object,
        warning: true,
        reason: "NotificationFailed",
        note: format!("notification not delivered: {why}"),
    })
}

/// The end of a pass: the status write (first, guarded; `None` when the
/// status is as stored), what it says once written (a failed write is
/// decided again, and so are these), then the steps' effects; the log
/// line names the nodes admitted.
pub fn end(
    status_write: Option<Effect>,
    said: impl IntoIterator<Item = Effect>,
    steps: Vec<Effect>,
    who: &str,
    admitted: &[String],
    wake: Option<Duration>,
) -> Plan {
    let mut effects: Vec<Effect> = status_write.into_iter().collect();
    effects.extend(said);
    effects.extend(steps);
    let note = (!admitted.is_empty()).then(|| {
        (
            log::Level::Info,
            format!("{who}: admitted {}", admitted.join(", ")),
        )
    });
    Plan {
        effects,
        together: false,
        then: Then::Wait(wake),
        note,
    }
}

#[cfg(test)]
mod tests;
