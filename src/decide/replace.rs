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
mod lifecycle;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::{Value, json};

pub use lifecycle::{autoscaler_command, joining_nodes as lifecycle_joining, strategy};

use super::disrupt::{self, node_ref, ready};
use super::{Effect, Plan, set_condition};
use crate::api::common::DrainSpec;
use crate::api::constellation::*;
use crate::api::nodemaintenance::{NodeMaintenance, Phase};
pub use ask::Read;

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
    /// The API server's version (`v1.37.1`), if known.
    pub server_version: Option<&'a str>,
    /// Another NodeVersion this role governs is not done (its status says
    /// outdated, or it has none yet). The autoscaler runs only when every
    /// NodeVersion is done: each decides the same value, so none writes
    /// back what another wrote.
    pub others_busy: bool,
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
    // that would only spend provider calls.
    for p in s.pending {
        let Some(pid) = &p.spec.provider_id else {
            continue;
        };
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

/// Every governed node in exactly one class (Constellation's rules, first
/// match wins).
#[derive(Debug, Default)]
pub struct Classes<'a> {
    pub obsolete: Vec<&'a Node>,
    pub awaiting: Vec<&'a Node>,
    pub outdated: Vec<&'a Node>,
    pub donors: Vec<&'a Node>,
    pub heirs: Vec<&'a Node>,
    pub mints: Vec<(&'a Node, &'a PendingNode)>,
    pub up_to_date: Vec<&'a Node>,
    pub invalid: Vec<(&'a Node, String)>,
}

impl Classes<'_> {
    /// Nothing left to replace (Constellation counts awaiting nodes here
    /// but not in the condition; see [`status`]).
    pub fn all_up_to_date(&self, pending: usize) -> bool {
        self.outdated.len()
            + self.heirs.len()
            + self.awaiting.len()
            + self.obsolete.len()
            + self.donors.len()
            + pending
            == 0
    }
}

/// Classify the nodes. Annotations the provider answered this round count
/// as if written (they are, in the same round).
pub fn classify<'a>(s: &'a Snapshot) -> Classes<'a> {
    let mut c = Classes::default();
    let image = s.nv.spec.image.as_deref();
    let components =
        s.nv.spec
            .kubernetes_components_reference
            .as_deref()
            .filter(|r| !r.is_empty());
    for n in s.nodes.iter().map(|n| n.as_ref()) {
        let Some(pid) = provider_id(n) else {
            c.invalid.push((n, "the node has no providerID".into()));
            continue;
        };
        let node_image = match annotation(n, IMAGE_ANNOTATION) {
            Some(i) => i.to_string(),
            None => match s.facts.image_of.get(pid) {
                Some(Ok(i)) => i.clone(),
                Some(Err(e)) => {
                    c.invalid.push((n, e.clone()));
                    continue;
                }
                None => String::new(),
            },
        };
        if annotation(n, SCALING_GROUP_ANNOTATION).is_none()
            && let Some(Err(e)) = s.facts.group_of.get(pid)
        {
            c.invalid.push((n, e.clone()));
            continue;
        }
        let node_components = annotation(n, COMPONENTS_ANNOTATION);
        if annotation(n, OBSOLETE_ANNOTATION) == Some("true") {
            c.obsolete.push(n);
        } else if node_image.is_empty() || (components.is_some() && node_components.is_none()) {
            // nodekeeper compares components only when the NodeVersion
            // names them (Constellation always does): outside
            // Constellation no join service stamps them.
            c.awaiting.push(n);
        } else if !eq(Some(&node_image), image)
            || (components.is_some() && !eq(node_components, components))
        {
            if annotation(n, HEIR_ANNOTATION).is_some() {
                c.donors.push(n);
            } else {
                c.outdated.push(n);
            }
        } else if annotation(n, DONOR_ANNOTATION).is_some() {
            c.heirs.push(n);
        } else if let Some(p) = s.pending.iter().find(|p| {
            p.spec.goal.as_deref() == Some("Join")
                && p.spec.node_name.as_deref() == Some(n.name_any().as_str())
                && state(s, p).as_deref() == Some("Ready")
        }) {
            c.mints.push((n, p));
        } else {
            c.up_to_date.push(n);
        }
    }
    c
}

/// A PendingNode's CSP state: this round's answer, else its status.
fn state(s: &Snapshot, p: &PendingNode) -> Option<String> {
    let pid = p.spec.provider_id.as_deref()?;
    match s.facts.state_of.get(pid) {
        Some(Ok(st)) => Some(st.clone()),
        _ => p.status.as_ref().and_then(|st| st.csp_state.clone()),
    }
}

fn reference(n: &Node) -> ObjectReference {
    // Without resourceVersion (Constellation's references carry it): the
    // status would otherwise change with every node heartbeat.
    node_ref(n)
}

fn is_control_plane(n: &Node) -> bool {
    n.labels().contains_key(CONTROL_PLANE_LABEL)
}

fn group_of<'a>(s: &'a Snapshot, n: &'a Node) -> Option<String> {
    annotation(n, SCALING_GROUP_ANNOTATION)
        .map(str::to_string)
        .or_else(|| {
            let pid = provider_id(n)?;
            s.facts.group_of.get(pid)?.as_ref().ok().cloned()
        })
        .map(|g| g.to_lowercase())
}

/// Surge requests recorded on the NodeVersion and not yet PendingNodes:
/// `(request id, group id)`.
pub fn surge_requests(nv: &NodeVersion) -> Vec<(String, String)> {
    nv.annotations()
        .get(SURGE_REQUESTS_ANNOTATION)
        .map(|v| {
            v.split(',')
                .filter_map(|r| r.split_once('='))
                .map(|(id, g)| (id.to_string(), g.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn write_requests(nv: &NodeVersion, requests: &[(String, String)]) -> Effect {
    let value = if requests.is_empty() {
        Value::Null
    } else {
        json!(
            requests
                .iter()
                .map(|(i, g)| format!("{i}={g}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    Effect::PatchObject {
        kind: Kind::NodeVersion,
        namespace: None,
        name: nv.name_any(),
        patch: json!({ "metadata": {
            "annotations": { SURGE_REQUESTS_ANNOTATION: value },
            "resourceVersion": nv.resource_version(),
        }}),
        status: false,
        strategic: false,
    }
}

/// Extra nodes a rollout has out now: heirs, awaiting nodes, PendingNodes
/// (joining or leaving) and surge requests not yet PendingNodes.
fn extra(s: &Snapshot, c: &Classes) -> usize {
    let recorded: Vec<String> = surge_requests(s.nv)
        .into_iter()
        .filter(|(id, _)| !s.pending.iter().any(|p| request_of(p) == Some(id.as_str())))
        .map(|(id, _)| id)
        .collect();
    c.heirs.len() + c.awaiting.len() + s.pending.len() + recorded.len()
}

/// The surge request a PendingNode was created for.
fn request_of(p: &PendingNode) -> Option<&str> {
    p.annotations().get(REQUEST_LABEL).map(String::as_str)
}

/// PendingNode annotation: the surge request it records.
pub const REQUEST_LABEL: &str = "nodekeeper.io/surge-request";

/// The status Constellation's CLI reads, from the classes.
pub fn status(
    s: &Snapshot,
    c: &Classes,
    budget: usize,
    message: Option<String>,
) -> NodeVersionStatus {
    let refs = |v: &[&Node]| v.iter().map(|n| reference(n)).collect::<Vec<_>>();
    let old = s.nv.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone();
    conditions.retain(|c| c.type_ == CONDITION_OUTDATED);
    // Constellation leaves awaiting nodes out of this count and donors
    // too; nodekeeper counts both (a rollout with either is not done), so
    // the CLI never calls a half-finished rollout up to date.
    let out = c.outdated.len()
        + c.heirs.len()
        + s.pending.len()
        + c.obsolete.len()
        + c.awaiting.len()
        + c.donors.len();
    if out == 0 {
        set_condition(
            &mut conditions,
            s.now,
            CONDITION_OUTDATED,
            "False",
            "NodeVersionsUpToDate",
            "Node version of every node is up to date",
        );
    } else {
        set_condition(
            &mut conditions,
            s.now,
            CONDITION_OUTDATED,
            "True",
            "NodeVersionsOutOfDate",
            "Some node versions are out of date",
        );
    }
    NodeVersionStatus {
        outdated: refs(&c.outdated),
        up_to_date: refs(&c.up_to_date),
        donors: refs(&c.donors),
        heirs: refs(&c.heirs),
        mints: c.mints.iter().map(|(n, _)| reference(n)).collect(),
        awaiting_annotation: refs(&c.awaiting),
        pending: s
            .pending
            .iter()
            .map(|p| ObjectReference {
                api_version: Some(format!("{GROUP}/v1alpha1")),
                kind: Some("PendingNode".into()),
                name: Some(p.name_any()),
                uid: p.uid(),
                ..Default::default()
            })
            .collect(),
        obsolete: refs(&c.obsolete),
        invalid: c.invalid.iter().map(|(n, _)| reference(n)).collect(),
        budget: budget as i32,
        conditions,
        activeclusterversionupgrade: false,
        message,
    }
}

/// One round: the first batch of writes, or a wait.
pub fn decide(s: &Snapshot) -> Plan {
    // 1. Annotate nodes with what the provider answered.
    let annotate: Vec<Effect> = s
        .nodes
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
            (!add.is_empty()).then(|| Effect::PatchNode {
                node: n.name_any(),
                resource_version: n.resource_version(),
                patch: json!({ "metadata": { "annotations": add } }),
            })
        })
        .collect();
    if !annotate.is_empty() {
        return Plan::steps(annotate);
    }
    // 2. PendingNodes: status, joins past their deadline, leaves.
    if let Some(plan) = lifecycle::pending(s) {
        return plan;
    }
    // 3. ScalingGroups follow the image.
    if let Some(plan) = lifecycle::scaling_groups(s) {
        return plan;
    }

    let c = classify(s);
    let extra = extra(s, &c);
    let surge = if has_outdated_control_planes(&c) {
        1
    } else {
        s.nv.spec.max_surge.max(1) as usize
    };
    let budget = surge.saturating_sub(extra);
    let mut wake: Option<Duration> = Some(LEAVE_POLL).filter(|_| !s.pending.is_empty());
    let (message, overdue_wake) = message(s, &c);
    wake = super::earliest(wake, overdue_wake);
    let status = status(s, &c, budget, message);
    if s.nv.status.as_ref() != Some(&status) {
        return Plan::steps(vec![Effect::WriteObjectStatus {
            kind: Kind::NodeVersion,
            name: s.nv.name_any(),
            resource_version: s.nv.resource_version(),
            status: serde_json::to_value(&status).unwrap_or_default(),
        }]);
    }
    let events = overdue_events(s, &c);

    // Surge requests already recorded as PendingNodes leave the
    // annotation first: pairing deletes the PendingNode, and a request
    // whose record is gone would be asked again.
    let requests = surge_requests(s.nv);
    let open: Vec<(String, String)> = requests
        .iter()
        .filter(|(id, _)| !s.pending.iter().any(|p| request_of(p) == Some(id.as_str())))
        .cloned()
        .collect();
    if open.len() != requests.len() {
        return Plan::steps(vec![write_requests(s.nv, &open)]);
    }

    // 4. The autoscaler is off while anything is being replaced, by this
    // NodeVersion or another: it is on only when all are done.
    let done = c.all_up_to_date(s.pending.len()) && surge_requests(s.nv).is_empty();
    let enabled = done && !s.others_busy;
    let toggles: Vec<Effect> = s
        .strategies
        .iter()
        .filter(|st| st.spec.enabled != enabled)
        .map(|st| Effect::PatchObject {
            kind: Kind::AutoscalingStrategy,
            namespace: None,
            name: st.name_any(),
            patch: json!({ "spec": { "enabled": enabled }, "metadata": { "resourceVersion": st.resource_version() } }),
            status: false,
            strategic: false,
        })
        .collect();
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
    if let Some(plan) = unpair(&c) {
        return plan;
    }
    // 7. Heirs inherit labels; donors are drained once their heir is
    // Ready, then deleted.
    for heir in &c.heirs {
        let Some(donor) = c
            .donors
            .iter()
            .find(|d| annotation(heir, DONOR_ANNOTATION) == Some(d.name_any().as_str()))
        else {
            continue;
        };
        let want = inherited(donor);
        let missing: BTreeMap<&String, &String> = want
            .iter()
            .filter(|(k, v)| heir.labels().get(k.as_str()) != Some(*v))
            .map(|(k, v)| (*k, *v))
            .collect();
        if !missing.is_empty() {
            return Plan::steps(vec![Effect::PatchNode {
                node: heir.name_any(),
                resource_version: heir.resource_version(),
                patch: json!({ "metadata": { "labels": missing } }),
            }])
            .with(events);
        }
        if !ready(heir) {
            continue;
        }
        match retire(s, donor) {
            Retire::Act(fx) => return Plan::steps(fx).with(events),
            Retire::Wait(d) => wake = super::earliest(wake, d),
            Retire::Gone => {}
        }
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
    match surge_step(s, &c, budget) {
        Step::Act(fx) => return Plan::steps(fx).with(events),
        Step::Wait(d) => wake = super::earliest(wake, d),
        Step::Idle => {}
    }
    // 10. Obsolete nodes go.
    for n in &c.obsolete {
        match retire(s, n) {
            Retire::Act(fx) => return Plan::steps(fx).with(events),
            Retire::Wait(d) => wake = super::earliest(wake, d),
            Retire::Gone => {}
        }
    }
    Plan::wait(wake).with(events)
}

impl Plan {
    /// Publish `events` along with this plan's effects (the service sends
    /// each escalation once).
    fn with(mut self, events: Vec<Effect>) -> Plan {
        self.effects.extend(events);
        self
    }
}

fn has_outdated_control_planes(c: &Classes) -> bool {
    c.outdated
        .iter()
        .chain(c.donors.iter())
        .any(|n| is_control_plane(n))
}

/// Labels a heir takes from its donor: all but the reserved
/// `kubernetes.io` and `k8s.io` ones (and their subdomains).
pub fn inherited(n: &Node) -> BTreeMap<&String, &String> {
    n.labels().iter().filter(|(k, _)| !reserved(k)).collect()
}

/// `^(.+\.|)(kubernetes|k8s)\.io(/.*)?$`, by hand.
pub fn reserved(key: &str) -> bool {
    let prefix = key.split_once('/').map_or(key, |(p, _)| p);
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")))
}

fn unset(n: &Node, key: &str) -> Effect {
    Effect::PatchNode {
        node: n.name_any(),
        resource_version: n.resource_version(),
        patch: json!({ "metadata": { "annotations": { key: null } } }),
    }
}

fn set(n: &Node, key: &str, value: &str) -> Effect {
    Effect::PatchNode {
        node: n.name_any(),
        resource_version: n.resource_version(),
        patch: json!({ "metadata": { "annotations": { key: value } } }),
    }
}

fn delete_pending(p: &PendingNode) -> Effect {
    Effect::DeleteObject {
        kind: Kind::PendingNode,
        name: p.name_any(),
        uid: p.uid(),
    }
}

/// Each joined surge node pairs with an outdated node of its scaling group
/// (by name, so the order is deterministic), or is obsolete when none is
/// left. One pair per round.
fn pair(s: &Snapshot, c: &Classes) -> Option<Plan> {
    let (mint, pn) = c.mints.first()?;
    let group = pn
        .spec
        .group_id
        .as_deref()
        .unwrap_or_default()
        .to_lowercase();
    let mut outdated: Vec<&&Node> = c
        .outdated
        .iter()
        .filter(|o| group_of(s, o).as_deref() == Some(group.as_str()))
        .collect();
    outdated.sort_by_key(|o| o.name_any());
    Some(match outdated.first() {
        Some(donor) => Plan::steps(vec![
            set(mint, DONOR_ANNOTATION, &donor.name_any()),
            set(donor, HEIR_ANNOTATION, &mint.name_any()),
            delete_pending(pn),
        ])
        .info(format!(
            "node {} replaces node {}",
            mint.name_any(),
            donor.name_any()
        )),
        None => Plan::steps(vec![
            delete_pending(pn),
            set(mint, OBSOLETE_ANNOTATION, "true"),
        ])
        .info(format!(
            "node {} joined with nothing left to replace in its group: obsolete",
            mint.name_any()
        )),
    })
}

/// Heirs whose donor does not name them back, and donors whose heir does
/// not name them back, lose the annotation.
fn unpair(c: &Classes) -> Option<Plan> {
    let mut fx = Vec::new();
    for d in &c.donors {
        let heir = annotation(d, HEIR_ANNOTATION).unwrap_or_default();
        let named_back = c.heirs.iter().any(|h| {
            h.name_any() == heir && annotation(h, DONOR_ANNOTATION) == Some(d.name_any().as_str())
        });
        if !named_back {
            fx.push(unset(d, HEIR_ANNOTATION));
        }
    }
    (!fx.is_empty()).then(|| Plan::steps(fx))
}

enum Retire {
    Act(Vec<Effect>),
    Wait(Option<Duration>),
    Gone,
}

/// The NodeMaintenance this NodeVersion takes `node` with.
fn maintenance_of<'a>(s: &'a Snapshot, node: &str) -> Option<&'a Arc<NodeMaintenance>> {
    s.maintenances
        .iter()
        .find(|m| m.spec.node_name == node && disrupt::owned_by(m, "NodeVersion", &s.nv.name_any()))
}

/// Take a node out: drain it through a NodeMaintenance, then (control
/// plane: its etcd member removed through the provider) record the Leave,
/// delete the Node and give the maintenance back. The instance is deleted
/// by the Leave's lifecycle, so a crash after the Node is gone still
/// deletes it exactly once.
fn retire(s: &Snapshot, node: &Node) -> Retire {
    let name = node.name_any();
    let Some(nm) = maintenance_of(s, &name) else {
        let owner = disrupt::owner_ref(s.nv, "NodeVersion");
        let drain = DrainSpec {
            timeout_seconds: s.nv.spec.drain_timeout_seconds.clamp(1, 86400) as i32,
            ..Default::default()
        };
        let nm = disrupt::take(
            owner,
            &disrupt::maintenance_name(MAINTENANCE_PREFIX, &name),
            &name,
            &drain,
            disrupt::boot_id(node).unwrap_or_default(),
            REASON.into(),
        );
        return Retire::Act(vec![Effect::CreateMaintenance { nm: Box::new(nm) }]);
    };
    let succeeded = nm.status.as_ref().and_then(|st| st.phase) == Some(Phase::Succeeded);
    if !succeeded {
        return Retire::Wait(drain_deadline(s, nm).map(|t| super::duration_until(s.now, t)));
    }
    let mut fx = Vec::new();
    let key = format!("remove-etcd-member/{name}");
    if is_control_plane(node) {
        if let Some(d) = backing_off(s, &key) {
            return Retire::Wait(Some(d));
        }
        fx.push(Effect::Provider {
            key,
            verb: "remove-etcd-member",
            request: json!({ "nodeName": name, "internalIP": internal_ip(node) }),
        });
    }
    let leave_exists = s
        .pending
        .iter()
        .any(|p| p.name_any() == name && p.spec.goal.as_deref() == Some("Leave"));
    if !leave_exists {
        fx.push(Effect::CreateObject {
            kind: Kind::PendingNode,
            object: leave(s, node),
        });
    }
    fx.push(Effect::DeleteNode {
        name: name.clone(),
        uid: node.uid(),
    });
    if let Some(uid) = nm.uid() {
        fx.push(Effect::DeleteMaintenance {
            nm: nm.name_any(),
            uid,
        });
    }
    if fx.is_empty() {
        Retire::Gone
    } else {
        Retire::Act(fx)
    }
}

fn internal_ip(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .unwrap_or_default()
}

fn plus(now: Timestamp, secs: i64) -> Timestamp {
    now.checked_add(SignedDuration::from_secs(secs))
        .unwrap_or(now)
}

/// A controller owner reference to the NodeVersion, as JSON.
fn owned(s: &Snapshot) -> Value {
    json!([disrupt::owner_ref(s.nv, "NodeVersion")])
}

fn leave(s: &Snapshot, node: &Node) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "PendingNode",
        "metadata": { "name": node.name_any(), "ownerReferences": owned(s) },
        "spec": {
            "providerID": provider_id(node),
            "groupID": annotation(node, SCALING_GROUP_ANNOTATION),
            "nodeName": node.name_any(),
            "goal": "Leave",
            "deadline": plus(s.now, s.nv.spec.leave_timeout_seconds),
        }
    })
}

/// When a drain counts as overdue.
fn drain_deadline(s: &Snapshot, nm: &NodeMaintenance) -> Option<Timestamp> {
    let created = nm.metadata.creation_timestamp.as_ref()?.0;
    Some(plus(created, s.nv.spec.drain_timeout_seconds))
}

/// A key's last failure still backing off: how long is left.
fn backing_off(s: &Snapshot, key: &str) -> Option<Duration> {
    let f = s.failures.get(key)?;
    let until =
        f.at.checked_add(SignedDuration::try_from(PROVIDER_BACKOFF).unwrap_or_default())
            .ok()?;
    (until > s.now).then(|| super::duration_until(s.now, until))
}

enum Step {
    Act(Vec<Effect>),
    Wait(Option<Duration>),
    Idle,
}

/// Surge nodes: a request recorded but not yet a PendingNode is asked of
/// the provider again (same id: the same instance), then recorded; new
/// requests go to the groups with outdated nodes — control-plane groups
/// first and alone while any control plane is outdated, then by name.
fn surge_step(s: &Snapshot, c: &Classes, budget: usize) -> Step {
    let requests = surge_requests(s.nv);
    // (Requests already recorded as PendingNodes were dropped earlier in
    // the round.)
    // Every open request is asked in one round (a failure ends the batch).
    let mut asks = Vec::new();
    let mut wait = None;
    for (id, group) in &requests {
        let key = format!("create-node/{group}");
        match backing_off(s, &key) {
            Some(d) => wait = super::earliest(wait, Some(d)),
            None => asks.push(Effect::Provider {
                key,
                verb: "create-node",
                request: json!({ "groupId": group, "requestId": id }),
            }),
        }
    }
    if !asks.is_empty() {
        return Step::Act(asks);
    }
    if wait.is_some() {
        return Step::Wait(wait);
    }
    if budget == 0 || c.outdated.is_empty() {
        return Step::Idle;
    }
    let cp = has_outdated_control_planes(c);
    let mut needed: BTreeMap<String, usize> = BTreeMap::new();
    for n in &c.outdated {
        if annotation(n, HEIR_ANNOTATION).is_some() {
            continue;
        }
        if let Some(g) = group_of(s, n) {
            *needed.entry(g).or_default() += 1;
        }
    }
    // Joining PendingNodes and requests not yet recorded as one each
    // cover one outdated node.
    let joining = s
        .pending
        .iter()
        .filter(|p| p.spec.goal.as_deref() == Some("Join"))
        .filter_map(|p| p.spec.group_id.clone());
    let asked = requests.iter().map(|(_, g)| g.clone());
    for g in joining.chain(asked) {
        if let Some(n) = needed.get_mut(&g.to_lowercase()) {
            *n = n.saturating_sub(1);
        }
    }
    let mut groups: Vec<&Arc<ScalingGroup>> = following(s)
        .filter(|g| {
            let id = g
                .spec
                .group_id
                .as_deref()
                .unwrap_or_default()
                .to_lowercase();
            needed.get(&id).copied().unwrap_or(0) > 0
        })
        .filter(|g| !cp || g.spec.role.as_deref() == Some("ControlPlane"))
        .collect();
    groups.sort_by_key(|g| (g.spec.role.as_deref() != Some("ControlPlane"), g.name_any()));
    // As many requests as the budget allows, recorded in one write.
    let mut all = requests.clone();
    let mut left = budget;
    for g in groups {
        let id = g.spec.group_id.clone().unwrap_or_default();
        let current = g
            .status
            .as_ref()
            .and_then(|st| st.image_reference.as_deref());
        if !eq(current, s.nv.spec.image.as_deref()) {
            // The group still creates old nodes: wait for its image.
            continue;
        }
        if let Some(d) = backing_off(s, &format!("create-node/{id}")) {
            wait = super::earliest(wait, Some(d));
            continue;
        }
        let want = needed
            .get(&id.to_lowercase())
            .copied()
            .unwrap_or(0)
            .min(left);
        for i in 0..want {
            let request = format!(
                "{:012x}",
                super::disrupt::fnv(
                    format!("{}/{id}/{}/{i}", s.nv.uid().unwrap_or_default(), s.now).as_bytes()
                ) & 0xffff_ffff_ffff
            );
            all.push((request, id.clone()));
        }
        left -= want;
        if left == 0 {
            break;
        }
    }
    if all.len() > requests.len() {
        return Step::Act(vec![write_requests(s.nv, &all)]);
    }
    match wait {
        Some(d) => Step::Wait(Some(d)),
        None => Step::Idle,
    }
}

/// The PendingNode a create-node answer is recorded as.
pub fn joining(s: &Snapshot, request: &str, group: &str, answer: &Value) -> Result<Value, String> {
    let name = ask::field(answer, "create-node", "nodeName")?;
    let pid = ask::field(answer, "create-node", "providerID")?;
    Ok(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "PendingNode",
        "metadata": {
            "name": name,
            "ownerReferences": owned(s),
            "annotations": { REQUEST_LABEL: request },
        },
        "spec": {
            "providerID": pid,
            "groupID": group,
            "nodeName": name,
            "goal": "Join",
            "deadline": plus(s.now, s.nv.spec.join_timeout_seconds),
        }
    }))
}

/// What holds the rollout up, in one line, and when a drain becomes
/// overdue.
fn message(s: &Snapshot, c: &Classes) -> (Option<String>, Option<Duration>) {
    let mut parts: Vec<String> = Vec::new();
    for (n, why) in &c.invalid {
        parts.push(format!("node {}: {why}", n.name_any()));
    }
    for f in s.failures.values() {
        parts.push(f.message.clone());
    }
    let mut wake = None;
    for d in c.donors.iter().chain(c.obsolete.iter()) {
        if let Some(nm) = maintenance_of(s, &d.name_any())
            && nm.status.as_ref().and_then(|st| st.phase) != Some(Phase::Succeeded)
            && let Some(deadline) = drain_deadline(s, nm)
        {
            if s.now >= deadline {
                parts.push(format!(
                    "the drain of node {} is overdue (over {} s); the node is kept until it finishes",
                    d.name_any(),
                    s.nv.spec.drain_timeout_seconds
                ));
            } else {
                wake = super::earliest(wake, Some(super::duration_until(s.now, deadline)));
            }
        }
    }
    for p in s.pending.iter().filter(|p| lifecycle::leave_overdue(s, p)) {
        parts.push(format!(
            "instance {} has not terminated by its deadline; deletion asked again",
            p.spec.provider_id.as_deref().unwrap_or_default()
        ));
    }
    if let (Some(want), Some(have)) = (
        s.nv.spec
            .kubernetes_cluster_version
            .as_deref()
            .filter(|v| !v.is_empty()),
        s.server_version,
    ) && !same_minor_patch(want, have)
    {
        parts.push(format!(
            "kubernetesClusterVersion {want} differs from the API server's {have}: nodekeeper does not run Kubernetes (kubeadm) upgrades; nodes are replaced by image and components only"
        ));
    }
    let msg = (!parts.is_empty()).then(|| parts.join("; "));
    (msg, wake)
}

/// `v1.30.2` vs `v1.30.2+k3s1`: the same release.
fn same_minor_patch(a: &str, b: &str) -> bool {
    let core = |v: &str| {
        v.trim_start_matches('v')
            .split(['+', '-'])
            .next()
            .unwrap_or_default()
            .to_string()
    };
    core(a) == core(b)
}

/// Warning events for escalations (the service publishes each once per
/// object and reason).
fn overdue_events(s: &Snapshot, c: &Classes) -> Vec<Effect> {
    let mut fx = Vec::new();
    for d in c.donors.iter().chain(c.obsolete.iter()) {
        if let Some(nm) = maintenance_of(s, &d.name_any())
            && nm.status.as_ref().and_then(|st| st.phase) != Some(Phase::Succeeded)
            && drain_deadline(s, nm).is_some_and(|t| s.now >= t)
        {
            fx.push(Effect::Event {
                object: node_ref(d),
                warning: true,
                reason: "DrainOverdue",
                note: format!(
                    "not drained within {} s; kept (not deleted) until the drain finishes",
                    s.nv.spec.drain_timeout_seconds
                ),
            });
        }
    }
    fx
}

/// Label on the ScalingGroups nodekeeper created from the provider's list
/// (only those are deleted when the provider stops listing their group).
pub const DISCOVERED_LABEL: &str = "nodekeeper.io/discovered";

/// ScalingGroups from a `list-scaling-groups` answer: create the missing
/// (name lowercased, Constellation's defaults: min 1, max 10, following
/// `nv_name`), update a changed nodeGroupName, delete the ones we created
/// whose group is no longer listed.
pub fn discovered_groups(
    answer: &Value,
    existing: &[Arc<ScalingGroup>],
    nv_name: &str,
) -> Vec<Effect> {
    let listed: Vec<&Value> = answer["scalingGroups"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut fx = Vec::new();
    let mut names = Vec::new();
    for g in listed {
        let Some(name) = g["name"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        let name = name.to_lowercase();
        names.push(name.clone());
        let node_group = g["nodeGroupName"].as_str().unwrap_or_default();
        match existing.iter().find(|e| e.name_any() == name) {
            Some(e) => {
                if e.spec.node_group_name.as_deref().unwrap_or_default() != node_group {
                    fx.push(Effect::PatchObject {
                        kind: Kind::ScalingGroup,
                        namespace: None,
                        name: name.clone(),
                        patch: json!({ "spec": { "nodeGroupName": node_group } }),
                        status: false,
                        strategic: false,
                    });
                }
            }
            None => fx.push(Effect::CreateObject {
                kind: Kind::ScalingGroup,
                object: json!({
                    "apiVersion": format!("{GROUP}/v1alpha1"),
                    "kind": "ScalingGroup",
                    "metadata": { "name": name, "labels": { DISCOVERED_LABEL: "true" } },
                    "spec": {
                        "nodeImage": nv_name,
                        "groupId": g["groupId"],
                        "autoscalerGroupName": g["autoscalingGroupName"],
                        "nodeGroupName": node_group,
                        "min": 1,
                        "max": 10,
                        "role": role(g["role"].as_str().unwrap_or_default()),
                    }
                }),
            }),
        }
    }
    for e in existing {
        if e.labels().get(DISCOVERED_LABEL).map(String::as_str) == Some("true")
            && !names.contains(&e.name_any())
        {
            fx.push(Effect::DeleteObject {
                kind: Kind::ScalingGroup,
                name: e.name_any(),
                uid: e.uid(),
            });
        }
    }
    fx
}

/// Constellation's role names: `controlplane`/`control-plane` and `worker`
/// in any case; anything else is a worker.
fn role(r: &str) -> &'static str {
    match r.to_lowercase().as_str() {
        "controlplane" | "control-plane" => "ControlPlane",
        _ => "Worker",
    }
}
