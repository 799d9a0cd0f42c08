//! The replacement decisions on hand-built worlds. [`World`] holds the
//! NodeVersion, nodes, PendingNodes, ScalingGroups and NodeMaintenances a
//! decision sees; here are its builders, node classification, the questions
//! asked of the provider and the status; `surge` and `objects` hold the
//! rollout and the other objects' lifecycles.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::api::node::{Node, NodeSpec, NodeStatus};
use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::api::nodemaintenance::{NodeMaintenanceStatus, Phase};

fn now() -> Timestamp {
    "2026-11-22T12:00:00Z".parse().unwrap()
}

fn node(name: &str, group: &str, image: &str, extra: &[(&str, &str)]) -> Arc<Node> {
    let mut ann: BTreeMap<String, String> = [
        (SCALING_GROUP_ANNOTATION.to_string(), group.to_string()),
        (IMAGE_ANNOTATION.to_string(), image.to_string()),
    ]
    .into();
    for (k, v) in extra {
        ann.insert(k.to_string(), v.to_string());
    }
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            annotations: Some(ann),
            labels: Some(
                [
                    ("kubernetes.io/hostname".to_string(), name.to_string()),
                    ("team".to_string(), "a".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("kwok://{name}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip_of(name),
            }]),
            ..Default::default()
        }),
    })
}

/// A node's InternalIP, one per name (what etcd knows its member by).
fn ip_of(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    let [a, b, c, ..] = h.finish().to_le_bytes();
    format!("10.{a}.{b}.{c}")
}

/// [`node`] with the control-plane label.
fn control_plane(name: &str, group: &str, image: &str, extra: &[(&str, &str)]) -> Arc<Node> {
    let mut n = (*node(name, group, image, extra)).clone();
    n.metadata
        .labels
        .get_or_insert_default()
        .insert(CONTROL_PLANE_LABEL.into(), "".into());
    Arc::new(n)
}

fn nv(image: &str, surge: i32) -> NodeVersion {
    let mut v = NodeVersion::new(
        "constellation-version",
        NodeVersionSpec {
            image: Some(image.into()),
            max_surge: surge,
            join_timeout_seconds: 1800,
            leave_timeout_seconds: 60,
            drain_timeout_seconds: 1800,
            ..Default::default()
        },
    );
    v.metadata.uid = Some("nv-uid".into());
    v.metadata.resource_version = Some("7".into());
    v
}

fn group(name: &str, id: &str, role: &str, image: &str) -> Arc<ScalingGroup> {
    let mut g = ScalingGroup::new(
        name,
        ScalingGroupSpec {
            node_image: Some("constellation-version".into()),
            group_id: Some(id.into()),
            role: Some(role.into()),
            ..Default::default()
        },
    );
    g.status = Some(ScalingGroupStatus {
        image_reference: Some(image.into()),
        conditions: vec![],
    });
    Arc::new(g)
}

fn pending(name: &str, group: &str, goal: &str, state: &str) -> Arc<PendingNode> {
    let mut p = PendingNode::new(
        name,
        PendingNodeSpec {
            provider_id: Some(format!("kwok://{name}")),
            group_id: Some(group.into()),
            node_name: Some(name.into()),
            goal: Some(goal.into()),
            deadline: Some(Time("2026-11-22T12:30:00Z".parse().unwrap())),
        },
    );
    p.metadata.uid = Some(format!("pn-{name}"));
    p.status = Some(PendingNodeStatus {
        csp_state: Some(state.into()),
        reached_goal: (goal == "Join" && state == "Ready")
            || (goal == "Leave" && state == "Terminated"),
    });
    Arc::new(p)
}

/// A node's pods as the service would read them (`None`: not read).
type NodePods = Box<dyn Fn(&str) -> Option<Vec<Arc<crate::api::pod::Pod>>> + Sync>;

struct World {
    nv: NodeVersion,
    nodes: Vec<Arc<Node>>,
    pending: Vec<Arc<PendingNode>>,
    groups: Vec<Arc<ScalingGroup>>,
    maintenances: Vec<Arc<NodeMaintenance>>,
    facts: Facts,
    failures: BTreeMap<String, Failure>,
    in_flight: BTreeSet<String>,
    strategies: Vec<Arc<AutoscalingStrategy>>,
    others_busy: bool,
    others_unknown: bool,
    governed_elsewhere: usize,
    held_elsewhere: Vec<String>,
    fields: Reading,
    /// The pods of each node, as the service would read them.
    node_pods: NodePods,
}

impl World {
    fn new(image: &str, surge: i32) -> World {
        World {
            nv: nv(image, surge),
            nodes: vec![],
            pending: vec![],
            groups: vec![],
            maintenances: vec![],
            facts: Facts::default(),
            failures: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            strategies: vec![],
            others_busy: false,
            others_unknown: false,
            governed_elsewhere: 0,
            held_elsewhere: Vec::new(),
            fields: Reading::default(),
            node_pods: Box::new(|_| Some(Vec::new())),
        }
    }

    fn snap(&self) -> Snapshot<'_> {
        Snapshot {
            nv: &self.nv,
            nodes: &self.nodes,
            pending: &self.pending,
            groups: &self.groups,
            strategies: &self.strategies,
            maintenances: &self.maintenances,
            facts: &self.facts,
            failures: &self.failures,
            in_flight: &self.in_flight,
            server_version: None,
            others_busy: self.others_busy,
            others_unknown: self.others_unknown,
            governed_elsewhere: self.governed_elsewhere,
            held_elsewhere: &self.held_elsewhere,
            fields: &self.fields,
            node_pods: &*self.node_pods,
            now: now(),
        }
    }

    /// The status as the decision would write it, stored (so the next
    /// decision goes past the status write).
    fn settle_status(&mut self) {
        let plan = decide(&self.snap());
        if let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() {
            self.nv.status = serde_json::from_value(status.clone()).ok();
        }
    }
}

fn names(v: &[&Node]) -> Vec<String> {
    v.iter().map(|n| n.name_any()).collect()
}

#[test]
fn every_node_lands_in_exactly_one_class() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("ok", "g", "IMG-2", &[]),
        node("old", "g", "img-1", &[]),
        node("donor", "g", "img-1", &[(HEIR_ANNOTATION, "heir")]),
        node("heir", "g", "img-2", &[(DONOR_ANNOTATION, "donor")]),
        node("gone", "g", "img-2", &[(OBSOLETE_ANNOTATION, "true")]),
        node("mint", "g", "img-2", &[]),
    ];
    let mut bare = (*node("bare", "g", "x", &[])).clone();
    bare.metadata.annotations = None;
    w.nodes.push(Arc::new(bare));
    let mut no_pid = (*node("nopid", "g", "img-2", &[])).clone();
    no_pid.spec = None;
    w.nodes.push(Arc::new(no_pid));
    w.pending = vec![pending("mint", "g", "Join", "Ready")];
    let s = w.snap();
    let c = classify(&s);
    assert_eq!(names(&c.up_to_date), ["ok"]);
    assert_eq!(names(&c.outdated), ["old"]);
    assert_eq!(names(&c.donors), ["donor"]);
    assert_eq!(names(&c.heirs), ["heir"]);
    assert_eq!(names(&c.obsolete), ["gone"]);
    assert_eq!(c.mints.len(), 1);
    assert_eq!(names(&c.awaiting), ["bare"]);
    assert_eq!(c.invalid.len(), 1);
    assert_eq!(c.invalid[0].1, "the node has no providerID");
}

#[test]
fn components_count_only_when_the_node_version_names_them() {
    let mut w = World::new("img", 1);
    w.nodes = vec![node("a", "g", "img", &[])];
    assert_eq!(classify(&w.snap()).up_to_date.len(), 1);
    w.nv.spec.kubernetes_components_reference = Some("k8s-components-2".into());
    assert_eq!(classify(&w.snap()).awaiting.len(), 1);
    w.nodes = vec![node(
        "a",
        "g",
        "img",
        &[(COMPONENTS_ANNOTATION, "k8s-components-1")],
    )];
    assert_eq!(classify(&w.snap()).outdated.len(), 1);
}

#[test]
fn provider_errors_make_a_node_invalid_and_reach_the_status_message() {
    let mut w = World::new("img", 1);
    let mut n = (*node("a", "g", "img", &[])).clone();
    n.metadata.annotations = None;
    w.nodes = vec![Arc::new(n)];
    w.facts.image_of.insert(
        "kwok://a".into(),
        Err("provider node-image: exited with 1: boom".into()),
    );
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(status["invalid"][0]["name"], "a");
    assert_eq!(
        status["message"],
        "node a: provider node-image: exited with 1: boom"
    );
}

#[test]
fn questions_ask_only_what_is_missing() {
    let mut w = World::new("img", 1);
    let mut n = (*node("a", "g", "img", &[])).clone();
    n.metadata.annotations = Some([(IMAGE_ANNOTATION.to_string(), "img".to_string())].into());
    w.nodes = vec![Arc::new(n), node("b", "g", "img", &[])];
    // A joining node's state is asked once its node exists.
    w.pending = vec![
        pending("b", "g", "Join", "Creating"),
        pending("c", "g", "Join", "Creating"),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img")];
    let q: Vec<&str> = questions(&w.snap()).iter().map(|(r, _)| r.verb()).collect();
    assert_eq!(
        q,
        ["scaling-group-id", "node-state", "get-scaling-group-image"]
    );
    // Goal reached and recorded: the status answers until the pairing
    // (Join) or the next round (Leave) deletes it.
    w.pending = vec![
        pending("b", "g", "Join", "Ready"),
        pending("c", "g", "Leave", "Terminated"),
    ];
    let q: Vec<&str> = questions(&w.snap()).iter().map(|(r, _)| r.verb()).collect();
    assert_eq!(q, ["scaling-group-id", "get-scaling-group-image"]);
}

#[test]
fn status_matches_constellation_with_one_outdated_condition() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("a", "g", "img-1", &[]), node("b", "g", "img-2", &[])];
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, kind, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(*kind, Kind::NodeVersion);
    assert_eq!(status["outdated"][0]["name"], "a");
    assert_eq!(status["upToDate"][0]["name"], "b");
    assert_eq!(status["budget"], 1);
    assert_eq!(status["activeclusterversionupgrade"], false);
    let conds = status["conditions"].as_array().unwrap();
    assert_eq!(conds.len(), 1);
    assert_eq!(conds[0]["type"], "Outdated");
    assert_eq!(conds[0]["reason"], "NodeVersionsOutOfDate");
    assert_eq!(conds[0]["message"], "Some node versions are out of date");
}

#[test]
fn reserved_label_keys() {
    for k in [
        "kubernetes.io/hostname",
        "node-role.kubernetes.io/control-plane",
        "topology.kubernetes.io/zone",
        "app.kubernetes.io/name",
        "k8s.io/x",
        "kubernetes.io",
    ] {
        assert!(reserved(k), "{k}");
    }
    for k in [
        "team",
        "example.com/kubernetes.io",
        "kubernetes.io.evil.com/x",
        "mykubernetes.io/x",
    ] {
        assert!(!reserved(k), "{k}");
    }
}

mod control_planes;
mod do_not_disrupt;
mod fields;
mod groups;
mod interrupted;
mod objects;
mod reports;
mod shares;
mod stuck_donors;
mod surge;
mod windows;
mod world;
