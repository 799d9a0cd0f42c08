//! Rolling node replacement (Constellation's NodeVersion), pure. A node
//! whose image or Kubernetes components differ from the NodeVersion's is
//! replaced: a surge node is created in its scaling group through the
//! provider (a PendingNode with goal Join), pairs with it once joined (heir
//! and donor annotations), inherits its labels, and once the heir is Ready
//! the donor is drained through a NodeMaintenance, deleted (Node, then the
//! instance, through a PendingNode with goal Leave), and given back.
//!
//! One round of [`decide`] classifies every governed node as Constellation
//! does and returns the first batch of writes in this order: node
//! annotations, PendingNodes, JoiningNodes, ScalingGroups, the NodeVersion
//! status, the autoscaler, pairing, replacing, surge creation, obsolete
//! nodes. Each write is guarded or idempotent and everything a resumed
//! rollout needs is in the API server (annotations, PendingNodes, the surge
//! requests annotation), so a crash between any two converges.
//!
//! Provider answers come in as [`Facts`] (asked by the service for what
//! [`questions`] lists before each round), so this module does no I/O.
//! The lifecycle of the other kinds is in `replace/lifecycle.rs`.

pub mod ask;
mod classify;
mod discovery;
mod fields;
mod groups;
mod lifecycle;
mod retire;
mod shares;
mod surge;
#[cfg(test)]
mod tests;
mod windows;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::{Value, json};

pub use lifecycle::{
    CONDITION_DEPLOYMENT_FOUND, CONDITION_NODE_VERSION_FOUND, JOINING_NODE_DEADLINE_SECONDS,
    autoscaler_command, joining_nodes as lifecycle_joining, strategy, unfollowed_groups,
};

use super::disrupt::{self, node_ref, ready};
use super::{Effect, Plan, set_condition};
use crate::api::common::DrainSpec;
use crate::api::constellation::*;
use crate::api::nodemaintenance::{NodeMaintenance, Phase};
use crate::api::pod::Pod;
pub use ask::Read;
use classify::*;
pub use classify::{Classes, classify, status};
pub use discovery::{DISCOVERED_LABEL, discovered_groups};
pub use fields::{RECORD_ANNOTATION, Reading, governing};
use retire::*;
pub use retire::{inherited, internal_ip, reserved};
pub use shares::{Share, oldest_first, shares};
use surge::*;
pub use surge::{REQUEST_LABEL, joining, surge_requests};

/// Provider answers for this round, keyed as [`questions`] asks them.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// Per providerID: the scaling group id.
    pub group_of: HashMap<String, Result<String, String>>,
    /// Per providerID: the image the instance runs.
    pub image_of: HashMap<String, Result<String, String>>,
    /// Per providerID: the CSP state (Unknown, Creating, Ready, ...).
    pub state_of: HashMap<String, Result<String, String>>,
    /// Per lowercased group id: the image the group creates nodes with.
    pub group_image: HashMap<String, Result<String, String>>,
}

impl Facts {
    /// Record the answer to `read` about `id`.
    pub fn insert(&mut self, read: Read, id: String, answer: Result<String, String>) {
        let map = match read {
            Read::ScalingGroupId => &mut self.group_of,
            Read::NodeImage => &mut self.image_of,
            Read::NodeState => &mut self.state_of,
            Read::ScalingGroupImage => &mut self.group_image,
        };
        map.insert(id, answer);
    }
}

/// A provider write that failed: the message, and when (retried after
/// [`PROVIDER_BACKOFF`], never in a tight loop).
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub message: String,
    pub at: Timestamp,
}

/// How long a failed provider write waits before it is tried again.
pub const PROVIDER_BACKOFF: Duration = Duration::from_secs(10);
/// How often a Leave is looked at while the instance terminates.
pub const LEAVE_POLL: Duration = Duration::from_secs(2);
/// Why a replaced node's NodeMaintenance is created (Constellation's text).
pub const REASON: &str = "node is replaced due to OS image update";
/// Prefix of the NodeMaintenances replacement takes nodes with.
pub const MAINTENANCE_PREFIX: &str = "replace";

pub struct Snapshot<'a> {
    pub nv: &'a NodeVersion,
    /// The nodes this NodeVersion governs (its selector applied).
    pub nodes: &'a [Arc<Node>],
    /// PendingNodes this NodeVersion owns.
    pub pending: &'a [Arc<PendingNode>],
    pub groups: &'a [Arc<ScalingGroup>],
    pub strategies: &'a [Arc<AutoscalingStrategy>],
    pub maintenances: &'a [Arc<NodeMaintenance>],
    pub facts: &'a Facts,
    /// Failed provider writes by key (`create-node/<group>`, ...).
    pub failures: &'a BTreeMap<String, Failure>,
    /// Provider writes asked and not answered yet, by key: an instance's
    /// delete runs beside the rounds (a cloud's may take minutes), and
    /// what waits on it waits for its answer, not for a round.
    pub in_flight: &'a BTreeSet<String>,
    /// The API server's version (`v1.37.1`), if known.
    pub server_version: Option<&'a str>,
    /// Another NodeVersion this role governs is not done (its status says
    /// outdated). The autoscaler runs only when every NodeVersion is done:
    /// each decides the same value, so none writes back what another wrote.
    pub others_busy: bool,
    /// Another NodeVersion this role governs has no status yet: whether it
    /// is done is not known, so a NodeVersion that is done leaves the
    /// autoscaler as it is (a new one turns it off itself, in its own pass,
    /// before it replaces anything). Counted as busy, a new NodeVersion
    /// that needed nothing turned the autoscaler off and on again.
    pub others_unknown: bool,
    /// Nodes the selector matches that an older NodeVersion governs (with
    /// `nodes` empty: why this one has none).
    pub governed_elsewhere: usize,
    /// Older NodeVersions that hold (their rollout fields cannot be read)
    /// and keep nodes the selector matches: said in the status.
    pub held_elsewhere: &'a [String],
    /// How the rollout fields were read ([`governing`]).
    pub fields: &'a Reading,
    /// The pods of a node, for Karpenter's do-not-disrupt, or `None`
    /// while they are not read: asked only for the outdated node a new
    /// node is about to pair with, and for a paired one before its drain
    /// (`service::node_pods` reads those asked about and decides again).
    pub node_pods: &'a (dyn Fn(&str) -> Option<Vec<Arc<Pod>>> + Sync),
    pub now: Timestamp,
}

/// Which provider reads a round needs: `(read, id)` (a providerID, or a
/// lowercased group id).
pub fn questions(s: &Snapshot) -> Vec<(Read, String)> {
    let mut q = Vec::new();
    for n in s.nodes {
        let Some(pid) = provider_id(n) else { continue };
        if !n.annotations().contains_key(SCALING_GROUP_ANNOTATION) {
            q.push((Read::ScalingGroupId, pid.to_string()));
        }
        if !n.annotations().contains_key(IMAGE_ANNOTATION) {
            q.push((Read::NodeImage, pid.to_string()));
        }
    }
    // A PendingNode's state matters once its node joined (Join: is it a
    // mint) or is gone (Leave: has the instance terminated); asking before
    // that would only spend provider calls. Once its status records the
    // goal reached, that record answers (as Constellation's NodeVersion
    // controller reads it): the PendingNode is deleted by the pairing or
    // the next round, and each round until then asked again, one call per
    // PendingNode (at maxSurge 3, three of the four rounds between a
    // join and its pairing were spent asking).
    for p in s.pending {
        let Some(pid) = &p.spec.provider_id else {
            continue;
        };
        if p.status.as_ref().is_some_and(|st| st.reached_goal) || deleting(s, p) {
            continue;
        }
        let node = p.spec.node_name.as_deref().unwrap_or_default();
        let exists = s.nodes.iter().any(|n| n.name_any() == node);
        let join = p.spec.goal.as_deref() == Some("Join");
        if join == exists {
            q.push((Read::NodeState, pid.clone()));
        }
    }
    for g in following(s) {
        if let Some(id) = &g.spec.group_id {
            q.push((Read::ScalingGroupImage, id.to_lowercase()));
        }
    }
    q
}

/// The instance's delete was asked and its answer has not come yet: the
/// PendingNode waits for it (its answer kicks the next round).
fn deleting(s: &Snapshot, p: &PendingNode) -> bool {
    p.spec
        .provider_id
        .as_ref()
        .is_some_and(|pid| s.in_flight.contains(&delete_key(pid)))
}

/// The key of an instance's delete (its failures and its call in flight).
fn delete_key(pid: &str) -> String {
    format!("delete-node/{pid}")
}

/// The ScalingGroups that follow this NodeVersion.
fn following<'a>(s: &'a Snapshot) -> impl Iterator<Item = &'a Arc<ScalingGroup>> {
    let name = s.nv.name_any();
    s.groups
        .iter()
        .filter(move |g| g.spec.node_image.as_deref() == Some(name.as_str()))
}

pub fn provider_id(n: &Node) -> Option<&str> {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
}

fn eq(a: Option<&str>, b: Option<&str>) -> bool {
    a.unwrap_or_default()
        .eq_ignore_ascii_case(b.unwrap_or_default())
}

fn annotation<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.annotations()
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// One round: the first batch of writes, or a wait.
pub fn decide(s: &Snapshot) -> Plan {
    // 0. The spec's rollout fields changed: recorded before they govern.
    if let Some(record) = &s.fields.record {
        return Plan::steps(vec![record.clone()]);
    }
    // 1. Annotate nodes with what the provider answered.
    let annotate = provider_annotations(s);
    if !annotate.is_empty() {
        return Plan::steps(annotate);
    }
    // Surge requests already recorded as PendingNodes leave the
    // annotation before anything else: pairing deletes the PendingNode, and
    // so does a join on an image no longer named (step 2), and a request
    // whose record is gone would be asked again (asked after step 2, the
    // same instance was recorded and called obsolete over and over: the
    // random worlds' busy loop).
    let requests = surge_requests(s.nv);
    let open: Vec<(String, String)> = requests
        .iter()
        .filter(|(id, _)| !s.pending.iter().any(|p| request_of(p) == Some(id.as_str())))
        .cloned()
        .collect();
    if open.len() != requests.len() {
        return Plan::steps(vec![write_requests(s.nv, &open)]);
    }
    // 2. PendingNodes: status, joins past their deadline, leaves. Such a
    // round waits for its provider calls (an instance delete takes a
    // while), so donors drained meanwhile leave in it too, ahead of the
    // calls: a wave's other donors would otherwise wait a round more.
    if let Some(plan) = lifecycle::pending(s) {
        return before_calls(plan, drained_donors(s, &classify(s)));
    }
    // 3. ScalingGroups follow the image.
    if let Some(plan) = groups::scaling_groups(s) {
        return plan;
    }
    // Our NodeMaintenances on nodes gone (deleted, and the give-back
    // after the delete refused) or no longer governed: given back. Left,
    // each stayed until the NodeVersion went (found by the random worlds).
    let ours = |m: &NodeMaintenance| disrupt::owned_by(m, "NodeVersion", &s.nv.name_any());
    let orphaned = super::rollout::reclaim_gone(s.maintenances, s.nodes, ours);
    if !orphaned.is_empty() {
        return Plan::steps(orphaned);
    }

    let c = classify(s);
    let extra = extra(s, &c);
    let surge = surge_size(s, &c);
    // Outside every window no new surge node: the budget is spent.
    let windows = windows::read(s, &c);
    let budget = if windows.open {
        surge.saturating_sub(extra)
    } else {
        0
    };
    let mut wake: Option<Duration> = Some(LEAVE_POLL).filter(|_| !s.pending.is_empty());
    wake = super::earliest(wake, groups::image_retry(s));
    wake = super::earliest(wake, windows.wake);
    let (message, overdue_wake) = message(s, &c);
    let message = match (message, windows.note) {
        (Some(m), Some(w)) => Some(format!("{w}; {m}")),
        (m, w) => w.or(m),
    };
    wake = super::earliest(wake, overdue_wake);
    let needs = surge_needs(s, &c, budget);
    let status = status(s, &c, budget, message, &needs.held);
    if s.nv.status.as_ref() != Some(&status) {
        return Plan::steps(vec![Effect::WriteObjectStatus {
            kind: Kind::NodeVersion,
            name: s.nv.name_any(),
            resource_version: s.nv.resource_version(),
            status: serde_json::to_value(&status).unwrap_or_default(),
        }]);
    }
    let events = overdue_events(s, &c);

    // 4. The autoscaler: off while anything is being replaced.
    let done = c.all_up_to_date(s.pending.len()) && surge_requests(s.nv).is_empty();
    let toggles = autoscaler_toggles(s, done);
    if !toggles.is_empty() {
        return Plan::steps(toggles);
    }
    if done {
        return Plan::wait(wake).with(events);
    }

    // 5. Pair joined surge nodes with outdated nodes of their group.
    if let Some(plan) = pair(s, &c) {
        return plan;
    }
    // 6. Unpair what lost its partner.
    if let Some(plan) = unpair(s, &c) {
        return plan;
    }
    // 7. Heirs inherit labels; donors are drained, then deleted.
    let fx = inherit_and_retire(s, &c, &mut wake);
    if !fx.is_empty() {
        return Plan::steps(fx).with(events);
    }
    // A heir whose donor is gone has inherited: it is up to date.
    let released: Vec<Effect> = c
        .heirs
        .iter()
        .filter(|h| {
            let d = annotation(h, DONOR_ANNOTATION).unwrap_or_default();
            !s.nodes.iter().any(|n| n.name_any() == d)
        })
        .map(|h| unset(h, DONOR_ANNOTATION))
        .collect();
    if !released.is_empty() {
        return Plan::steps(released).with(events);
    }

    // 8. No new nodes while the autoscaler runs (it would fight the surge).
    if s.strategies
        .iter()
        .any(|st| st.status.as_ref().is_some_and(|x| x.enabled))
    {
        return Plan::wait(wake).with(events);
    }
    // 9. Surge: finish recorded requests, then make new ones.
    match surge_step(s, &c, budget, &needs) {
        Step::Act(fx) => return Plan::steps(fx).with(events),
        Step::Wait(d) => wake = super::earliest(wake, d),
        Step::Idle => {}
    }
    // 10. Obsolete nodes go, all in one round; a drain begins only inside
    // a window (one under way goes on).
    let mut fx = Vec::new();
    for n in &c.obsolete {
        if !windows.open && maintenance_of(s, &n.name_any()).is_none() {
            continue;
        }
        match retire(s, n) {
            Retire::Act(more) => fx.extend(more),
            Retire::Wait(d) => wake = super::earliest(wake, d),
            Retire::Gone => {}
        }
    }
    if !fx.is_empty() {
        return Plan::steps(fx).with(events);
    }
    Plan::wait(wake).with(events)
}

/// What the provider answered about each node's instance (its scaling
/// group, its image), annotated where absent.
fn provider_annotations(s: &Snapshot) -> Vec<Effect> {
    s.nodes
        .iter()
        .filter_map(|n| {
            let pid = provider_id(n)?;
            let mut add = serde_json::Map::new();
            if annotation(n, SCALING_GROUP_ANNOTATION).is_none()
                && let Some(Ok(g)) = s.facts.group_of.get(pid)
            {
                add.insert(SCALING_GROUP_ANNOTATION.into(), json!(g));
            }
            if annotation(n, IMAGE_ANNOTATION).is_none()
                && let Some(Ok(i)) = s.facts.image_of.get(pid)
            {
                add.insert(IMAGE_ANNOTATION.into(), json!(i));
            }
            // Unguarded (the architecture map's exception): facts about
            // the instance, set only where absent, in keys only we write.
            // Guarded, the write met the new node's first status updates
            // (kubelet or kwok) and lost a 409 and a round in every wave.
            (!add.is_empty()).then(|| Effect::PatchNode {
                node: n.name_any(),
                resource_version: None,
                patch: json!({ "metadata": { "annotations": add } }),
            })
        })
        .collect()
}

/// How many surge nodes may be out at once: one while a control-plane node
/// is outdated; else Constellation's maxNodeBudget when its CLI set it
/// (where-features-meet.md C2), else ours; at least one, at most 100.
fn surge_size(s: &Snapshot, c: &Classes) -> usize {
    if has_outdated_control_planes(s, c) {
        1
    } else {
        let spec = &s.nv.spec;
        let asked = spec
            .max_node_budget
            .filter(|b| *b > 0)
            .map_or(spec.max_surge.max(1) as usize, |b| b as usize);
        asked.clamp(1, 100)
    }
}

/// The autoscaler is off while anything is being replaced, by this
/// NodeVersion or another: it is on only when all are done (`done`: this
/// one is). The strategies whose `enabled` differs, patched.
fn autoscaler_toggles(s: &Snapshot, done: bool) -> Vec<Effect> {
    let wanted = if !done || s.others_busy {
        Some(false)
    } else if s.others_unknown {
        None
    } else {
        Some(true)
    };
    s
        .strategies
        .iter()
        .filter_map(|st| wanted.filter(|w| st.spec.enabled != *w).map(|w| (st, w)))
        .map(|(st, enabled)| Effect::PatchObject {
            kind: Kind::AutoscalingStrategy,
            namespace: None,
            name: st.name_any(),
            patch: json!({ "spec": { "enabled": enabled }, "metadata": { "resourceVersion": st.resource_version() } }),
            status: false,
            strategic: false,
        })
        .collect()
}

/// Heirs inherit labels; donors are drained once their heir is Ready, then
/// deleted. Every pair moves in the same round (each heir's labels go
/// before its donor's drain, in order within the batch).
fn inherit_and_retire(s: &Snapshot, c: &Classes, wake: &mut Option<Duration>) -> Vec<Effect> {
    let mut fx = Vec::new();
    for (heir, donor) in pairs(c) {
        let want = inherited(donor);
        let missing: BTreeMap<&String, &String> = want
            .iter()
            .filter(|(k, v)| heir.labels().get(k.as_str()) != Some(*v))
            .map(|(k, v)| (*k, *v))
            .collect();
        if !missing.is_empty() {
            fx.push(Effect::PatchNode {
                node: heir.name_any(),
                resource_version: heir.resource_version(),
                patch: json!({ "metadata": { "labels": missing } }),
            });
        }
        if !ready(heir) {
            continue;
        }
        match retire(s, donor) {
            Retire::Act(more) => fx.extend(more),
            Retire::Wait(d) => *wake = super::earliest(*wake, d),
            Retire::Gone => {}
        }
    }
    fx
}

/// The leaves, node and maintenance deletes of donors ready to go now:
/// drained, their heir Ready with every inherited label, and nothing to
/// ask the provider first (a control plane leaves etcd first, in its own
/// round). What step 7 would do for them, without what it would do first.
fn drained_donors(s: &Snapshot, c: &Classes) -> Vec<Effect> {
    let mut fx = Vec::new();
    for (heir, donor) in pairs(c) {
        let labelled = inherited(donor)
            .iter()
            .all(|(k, v)| heir.labels().get(k.as_str()) == Some(*v));
        if !labelled || !ready(heir) || is_control_plane(donor) {
            continue;
        }
        if let Retire::Act(more) = retire(s, donor)
            && more.iter().any(|e| matches!(e, Effect::DeleteNode { .. }))
            && !more.iter().any(|e| matches!(e, Effect::Provider { .. }))
        {
            fx.extend(more);
        }
    }
    fx
}

/// Each heir with its donor (an heir whose donor is gone has none).
fn pairs<'a>(c: &'a Classes<'a>) -> impl Iterator<Item = (&'a Node, &'a Node)> + 'a {
    c.heirs.iter().filter_map(|heir| {
        let donor = c
            .donors
            .iter()
            .find(|d| annotation(heir, DONOR_ANNOTATION) == Some(d.name_any().as_str()))?;
        Some((*heir, *donor))
    })
}

/// `plan` with `writes` put in front of its first provider call.
fn before_calls(mut plan: Plan, writes: Vec<Effect>) -> Plan {
    let at = plan
        .effects
        .iter()
        .position(|e| matches!(e, Effect::Provider { .. }))
        .unwrap_or(plan.effects.len());
    plan.effects.splice(at..at, writes);
    plan
}

impl Plan {
    /// Publish `events` along with this plan's effects (the service sends
    /// each escalation once).
    fn with(mut self, events: Vec<Effect>) -> Plan {
        self.effects.extend(events);
        self
    }
}

/// A control plane is still being replaced: outdated, a donor, or gone
/// from Kubernetes with its instance's delete not yet answered (never
/// asked, in flight, or refused). Workers wait for all three: the control
/// plane's old instance is asked away before a worker's new one is asked
/// for (Constellation, whose surge of 1 is taken by the control plane's
/// Leave, never asks for a worker before the control plane's instance is
/// terminated; a larger maxSurge keeps that order at the cloud).
fn has_outdated_control_planes(s: &Snapshot, c: &Classes) -> bool {
    c.outdated
        .iter()
        .chain(c.donors.iter())
        .any(|n| is_control_plane(n))
        || s.pending
            .iter()
            .any(|p| control_plane_leave_unanswered(s, p))
}

/// `p` leaves a control-plane group and its instance's delete has not
/// been answered yet.
fn control_plane_leave_unanswered(s: &Snapshot, p: &PendingNode) -> bool {
    let (Some("Leave"), Some(group), Some(pid)) = (
        p.spec.goal.as_deref(),
        p.spec.group_id.as_deref(),
        p.spec.provider_id.as_deref(),
    ) else {
        return false;
    };
    let control_plane = s.groups.iter().any(|g| {
        g.spec.role.as_deref() == Some("ControlPlane")
            && g.spec
                .group_id
                .as_deref()
                .is_some_and(|id| id.eq_ignore_ascii_case(group))
    });
    let asked = p.annotations().contains_key(DELETE_ISSUED_ANNOTATION);
    let key = delete_key(pid);
    control_plane && (!asked || s.in_flight.contains(&key) || s.failures.contains_key(&key))
}
