use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
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
            ..Default::default()
        }),
    })
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

struct World {
    nv: NodeVersion,
    nodes: Vec<Arc<Node>>,
    pending: Vec<Arc<PendingNode>>,
    groups: Vec<Arc<ScalingGroup>>,
    maintenances: Vec<Arc<NodeMaintenance>>,
    facts: Facts,
    failures: BTreeMap<String, Failure>,
    strategies: Vec<Arc<AutoscalingStrategy>>,
    others_busy: bool,
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
            strategies: vec![],
            others_busy: false,
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
            server_version: None,
            others_busy: self.others_busy,
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
fn surge_records_its_requests_before_asking_the_provider() {
    let mut w = World::new("img-2", 2);
    w.nodes = vec![
        node("a", "g", "img-1", &[]),
        node("b", "g", "img-1", &[]),
        node("c", "g", "img-1", &[]),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.settle_status();
    // Surge 2: two requests, recorded in one guarded write.
    let plan = decide(&w.snap());
    let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    let reqs = patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION]
        .as_str()
        .unwrap()
        .to_string();
    let ids: Vec<&str> = reqs
        .split(',')
        .map(|r| r.split('=').next().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{reqs}");
    assert_ne!(ids[0], ids[1]);
    assert_eq!(patch["metadata"]["resourceVersion"], "7");
    // Recorded: the next round asks the provider for both, by id.
    w.nv.metadata.annotations =
        Some([(SURGE_REQUESTS_ANNOTATION.to_string(), reqs.clone())].into());
    w.settle_status();
    assert_eq!(w.nv.status.as_ref().unwrap().budget, 0);
    let plan = decide(&w.snap());
    let asked: Vec<&str> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Provider {
                verb: "create-node",
                request,
                ..
            } => request["requestId"].as_str(),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ids);
    // Once a PendingNode records a request, the request leaves the
    // annotation; the other stays.
    let mut p = (*pending("new-1", "g", "Join", "Creating")).clone();
    p.metadata.annotations = Some([(REQUEST_LABEL.to_string(), ids[0].to_string())].into());
    w.pending = vec![Arc::new(p)];
    w.settle_status();
    let plan = decide(&w.snap());
    let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(
        patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION],
        json!(reqs.split(',').nth(1).unwrap())
    );
}

#[test]
fn no_surge_while_the_group_still_has_the_old_image_or_the_budget_is_spent() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("a", "g", "img-1", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-1")];
    w.settle_status();
    assert!(decide(&w.snap()).effects.is_empty());
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.pending = vec![pending("x", "g", "Join", "Creating")];
    w.settle_status();
    assert_eq!(w.nv.status.as_ref().unwrap().budget, 0);
    assert!(decide(&w.snap()).effects.is_empty());
}

#[test]
fn control_planes_go_first_and_alone() {
    let mut w = World::new("img-2", 3);
    let mut cp = (*node("cp", "cpg", "img-1", &[])).clone();
    cp.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(CONTROL_PLANE_LABEL.into(), "".into());
    w.nodes = vec![Arc::new(cp), node("w", "wg", "img-1", &[])];
    w.groups = vec![
        group("a-workers", "wg", "Worker", "img-2"),
        group("z-cp", "cpg", "ControlPlane", "img-2"),
    ];
    w.settle_status();
    assert_eq!(
        w.nv.status.as_ref().unwrap().budget,
        1,
        "surge is 1 for control planes"
    );
    let plan = decide(&w.snap());
    let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert!(
        patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION]
            .as_str()
            .unwrap()
            .ends_with("=cpg")
    );
}

#[test]
fn a_joined_node_pairs_with_the_first_outdated_node_of_its_group() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("b-old", "g", "img-1", &[]),
        node("a-old", "g", "img-1", &[]),
        node("other", "h", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    let patches: Vec<String> = plan
        .effects
        .iter()
        .map(|e| match e {
            Effect::PatchNode { node, patch, .. } => {
                format!("{node} {}", patch["metadata"]["annotations"])
            }
            Effect::DeleteObject { name, .. } => format!("delete {name}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        patches,
        [
            format!("new {{\"{DONOR_ANNOTATION}\":\"a-old\"}}"),
            format!("a-old {{\"{HEIR_ANNOTATION}\":\"new\"}}"),
            "delete new".to_string(),
        ]
    );
}

#[test]
fn a_joined_node_with_nothing_to_replace_is_obsolete() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("old", "h", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(matches!(&plan.effects[0], Effect::DeleteObject { name, .. } if name == "new"));
    assert!(
        matches!(&plan.effects[1], Effect::PatchNode { node, patch, .. } if node == "new" && patch["metadata"]["annotations"][OBSOLETE_ANNOTATION] == "true")
    );
}

fn nm_for(w: &World, node: &str, phase: Option<Phase>) -> Arc<NodeMaintenance> {
    let mut nm = disrupt::take(
        disrupt::owner_ref(&w.nv, "NodeVersion"),
        &disrupt::maintenance_name(MAINTENANCE_PREFIX, node),
        node,
        &DrainSpec::default(),
        "",
        REASON.into(),
    );
    nm.metadata.uid = Some(format!("nm-{node}"));
    nm.metadata.creation_timestamp = Some(Time(now()));
    nm.status = phase.map(|p| NodeMaintenanceStatus {
        phase: Some(p),
        ..Default::default()
    });
    Arc::new(nm)
}

#[test]
fn a_donor_inherits_labels_then_is_drained_then_deleted_with_a_leave() {
    let mut w = World::new("img-2", 1);
    let mut donor = (*node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")])).clone();
    donor
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("node.kubernetes.io/instance-type".into(), "big".into());
    donor
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "b".into());
    w.nodes = vec![
        Arc::new(donor),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    w.settle_status();
    // Labels first, reserved ones left out.
    let plan = decide(&w.snap());
    let Some(Effect::PatchNode { node, patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(node, "new");
    assert_eq!(patch["metadata"]["labels"], json!({ "team": "b" }));
    let mut heir = (*w.nodes[1]).clone();
    heir.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "b".into());
    w.nodes[1] = Arc::new(heir);
    // Then the drain, through a NodeMaintenance the NodeVersion owns.
    let plan = decide(&w.snap());
    let Some(Effect::CreateMaintenance { nm }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert_eq!(nm.spec.node_name, "old");
    assert_eq!(nm.spec.reason.as_deref(), Some(REASON));
    w.maintenances = vec![nm_for(&w, "old", Some(Phase::Running))];
    assert!(decide(&w.snap()).effects.is_empty());
    // Drained: Leave recorded, Node deleted, maintenance given back.
    w.maintenances = vec![nm_for(&w, "old", Some(Phase::Succeeded))];
    let plan = decide(&w.snap());
    let kinds: Vec<String> = plan
        .effects
        .iter()
        .map(|e| match e {
            Effect::CreateObject { object, .. } => format!(
                "create {} {}",
                object["spec"]["goal"], object["metadata"]["name"]
            ),
            Effect::DeleteNode { name, .. } => format!("delete node {name}"),
            Effect::DeleteMaintenance { nm, .. } => format!("give back {nm}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "create \"Leave\" \"old\"",
            "delete node old",
            "give back replace-old"
        ]
    );
}

#[test]
fn a_control_plane_donor_leaves_etcd_through_the_provider_first() {
    let mut w = World::new("img-2", 1);
    let mut donor = (*node("cp-old", "g", "img-1", &[(HEIR_ANNOTATION, "cp-new")])).clone();
    donor
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(CONTROL_PLANE_LABEL.into(), "".into());
    w.nodes = vec![
        Arc::new(donor),
        node("cp-new", "g", "img-2", &[(DONOR_ANNOTATION, "cp-old")]),
    ];
    w.settle_status();
    w.maintenances = vec![nm_for(&w, "cp-old", Some(Phase::Succeeded))];
    let plan = decide(&w.snap());
    assert!(
        matches!(&plan.effects[0], Effect::Provider { verb: "remove-etcd-member", request, .. } if request["nodeName"] == "cp-old"),
        "{plan:?}"
    );
}

#[test]
fn an_overdue_drain_keeps_the_node_and_says_so() {
    let mut w = World::new("img-2", 1);
    w.nv.spec.drain_timeout_seconds = 60;
    w.nodes = vec![
        node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")]),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    let mut nm = (*nm_for(&w, "old", Some(Phase::Running))).clone();
    nm.metadata.creation_timestamp = Some(Time("2026-11-22T11:50:00Z".parse().unwrap()));
    w.maintenances = vec![Arc::new(nm)];
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("the drain of node old is overdue")
    );
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects.iter().all(|e| matches!(
            e,
            Effect::Event {
                reason: "DrainOverdue",
                ..
            }
        )),
        "{plan:?}"
    );
    assert_eq!(plan.effects.len(), 1);
}

#[test]
fn a_join_past_its_deadline_deletes_the_instance_and_becomes_a_leave() {
    let mut w = World::new("img-2", 1);
    let mut p = (*pending("slow", "g", "Join", "Creating")).clone();
    p.spec.deadline = Some(Time("2026-11-22T11:59:00Z".parse().unwrap()));
    p.status = Some(PendingNodeStatus {
        csp_state: Some("Creating".into()),
        reached_goal: false,
    });
    w.pending = vec![Arc::new(p)];
    let plan = decide(&w.snap());
    assert!(
        matches!(&plan.effects[0], Effect::PatchObject { patch, .. } if patch["spec"]["goal"] == "Leave")
    );
    assert!(
        matches!(&plan.effects[1], Effect::Provider { verb: "delete-node", request, .. } if request["providerID"] == "kwok://slow")
    );
    assert!(matches!(
        &plan.effects[2],
        Effect::Event {
            reason: "JoinTimeout",
            ..
        }
    ));
}

#[test]
fn a_leave_asks_for_the_delete_once_and_is_removed_when_terminated() {
    let mut w = World::new("img-2", 1);
    let p = pending("old", "g", "Leave", "Ready");
    w.pending = vec![p.clone()];
    let plan = decide(&w.snap());
    assert!(matches!(
        &plan.effects[1],
        Effect::Provider {
            verb: "delete-node",
            ..
        }
    ));
    let mut issued = (*p).clone();
    issued.metadata.annotations =
        Some([(DELETE_ISSUED_ANNOTATION.to_string(), now().to_string())].into());
    w.pending = vec![Arc::new(issued.clone())];
    let s = w.snap();
    assert!(lifecycle::pending(&s).is_none(), "asked once");
    issued.status = Some(PendingNodeStatus {
        csp_state: Some("Terminated".into()),
        reached_goal: true,
    });
    w.pending = vec![Arc::new(issued)];
    let s = w.snap();
    let plan = lifecycle::pending(&s).unwrap();
    assert!(matches!(
        &plan.effects[0],
        Effect::DeleteObject {
            kind: Kind::PendingNode,
            ..
        }
    ));
}

#[test]
fn a_failed_provider_write_backs_off() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("a", "g", "img-1", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.nv.metadata.annotations =
        Some([(SURGE_REQUESTS_ANNOTATION.to_string(), "r1=g".to_string())].into());
    w.failures.insert(
        "create-node/g".into(),
        Failure {
            message: "provider create-node: exited with 1: quota".into(),
            at: now(),
        },
    );
    w.settle_status();
    assert!(
        w.nv.status
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("quota")
    );
    let plan = decide(&w.snap());
    assert!(plan.effects.is_empty(), "{plan:?}");
    assert!(matches!(plan.then, crate::decide::Then::Wait(Some(d)) if d <= PROVIDER_BACKOFF));
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

#[test]
fn autoscaler_command_is_sorted_and_skips_control_planes() {
    let st = AutoscalingStrategy::new(
        "autoscalingstrategy",
        AutoscalingStrategySpec {
            enabled: true,
            deployment_name: "ca".into(),
            deployment_namespace: "kube-system".into(),
            autoscaler_extra_args: [("foo".into(), "bar".into()), ("baz".into(), "qux".into())]
                .into(),
        },
    );
    let mut wg = (*group("w", "wg", "Worker", "i")).clone();
    wg.spec.autoscaling = Some(true);
    wg.spec.min = Some(1);
    wg.spec.max = Some(10);
    wg.spec.autoscaler_group_name = Some("worker-group".into());
    let mut cp = (*group("c", "cg", "ControlPlane", "i")).clone();
    cp.spec.autoscaling = Some(true);
    let groups = vec![Arc::new(wg), Arc::new(cp)];
    assert_eq!(
        autoscaler_command(&st, &groups),
        [
            "./cluster-autoscaler",
            "--baz=qux",
            "--foo=bar",
            "--nodes=1:10:worker-group"
        ]
    );
    let d = json!({ "spec": { "replicas": 0, "template": { "spec": { "containers": [{ "name": "ca" }] } } } });
    let fx = strategy(&st, &groups, Some(&d));
    assert!(
        matches!(&fx[0], Effect::WriteObjectStatus { status, .. } if *status == json!({"enabled": false, "replicas": 0}))
    );
    assert!(
        matches!(&fx[1], Effect::PatchObject { patch, strategic: true, .. } if patch["spec"]["replicas"] == 1)
    );
    assert!(strategy(&st, &groups, None).is_empty());
}

#[test]
fn discovered_groups_are_created_lowercased_and_only_ours_deleted() {
    let answer = json!({ "scalingGroups": [
        { "name": "Workers", "groupId": "g1", "nodeGroupName": "w", "autoscalingGroupName": "g1", "role": "worker" },
        { "name": "cp", "groupId": "g0", "nodeGroupName": "c", "autoscalingGroupName": "g0", "role": "control-plane" },
    ]});
    let mut mine = (*group("stale", "g9", "Worker", "i")).clone();
    mine.metadata.labels = Some([(DISCOVERED_LABEL.to_string(), "true".to_string())].into());
    let theirs = group("manual", "g8", "Worker", "i");
    let fx = discovered_groups(&answer, &[Arc::new(mine), theirs], "constellation-version");
    let creates: Vec<(String, String)> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::CreateObject { object, .. } => Some((
                object["metadata"]["name"].as_str()?.to_string(),
                object["spec"]["role"].as_str()?.to_string(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        creates,
        [
            ("workers".to_string(), "Worker".to_string()),
            ("cp".into(), "ControlPlane".into())
        ]
    );
    let deletes: Vec<&str> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteObject { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deletes, ["stale"]);
}

#[test]
fn joining_nodes_stamp_components_then_go() {
    let mut j = JoiningNode::new(
        "n1",
        JoiningNodeSpec {
            name: Some("n1".into()),
            componentsreference: Some("k8s-components-2".into()),
            ..Default::default()
        },
    );
    j.metadata.uid = Some("j".into());
    let mut late = j.clone();
    late.metadata.name = Some("n2".into());
    late.spec.name = Some("n2".into());
    late.spec.deadline = Some(Time("2026-11-22T11:00:00Z".parse().unwrap()));
    let n1 = node("n1", "g", "i", &[]);
    let (fx, _) = lifecycle::joining_nodes(
        &[Arc::new(j), Arc::new(late)],
        &|n| (n == "n1").then(|| n1.clone()),
        now(),
    );
    assert!(
        matches!(&fx[0], Effect::PatchNode { node, patch, .. } if node == "n1" && patch["metadata"]["annotations"][COMPONENTS_ANNOTATION] == "k8s-components-2")
    );
    assert!(matches!(&fx[1], Effect::DeleteObject { name, .. } if name == "n1"));
    assert!(matches!(&fx[2], Effect::DeleteObject { name, .. } if name == "n2"));
}

#[test]
fn a_recorded_pending_node_carries_its_request() {
    let w = World::new("img-2", 1);
    let s = w.snap();
    let pn = joining(
        &s,
        "r1",
        "g",
        &json!({ "nodeName": "n", "providerID": "kwok://n" }),
    )
    .unwrap();
    let dynamic: kube::api::DynamicObject = serde_json::from_value(pn).unwrap();
    let typed: PendingNode =
        serde_json::from_value(serde_json::to_value(&dynamic).unwrap()).unwrap();
    assert_eq!(request_of(&typed), Some("r1"));
}

#[test]
fn a_recorded_request_is_dropped_before_its_pending_node_pairs() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("old", "g", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    let mut p = (*pending("new", "g", "Join", "Ready")).clone();
    p.metadata.annotations = Some([(REQUEST_LABEL.to_string(), "c2".to_string())].into());
    w.pending = vec![Arc::new(p)];
    w.nv.metadata.annotations =
        Some([(SURGE_REQUESTS_ANNOTATION.to_string(), "c2=g".to_string())].into());
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        matches!(&plan.effects[0], Effect::PatchObject { kind: Kind::NodeVersion, patch, .. } if patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION].is_null()),
        "{plan:?}"
    );
}

/// Regression: each NodeVersion set every AutoscalingStrategy to its own
/// "done", so one up to date and one outdated flipped it for ever.
#[test]
fn two_node_versions_agree_on_the_autoscaler_and_it_runs_only_when_both_are_done() {
    let strategy = |enabled: bool| {
        Arc::new(AutoscalingStrategy::new(
            "autoscalingstrategy",
            AutoscalingStrategySpec {
                enabled,
                deployment_name: "ca".into(),
                deployment_namespace: "kube-system".into(),
                autoscaler_extra_args: Default::default(),
            },
        ))
    };
    let enabled_by = |w: &mut World| -> Option<bool> {
        w.settle_status();
        decide(&w.snap()).effects.iter().find_map(|e| match e {
            Effect::PatchObject {
                kind: Kind::AutoscalingStrategy,
                patch,
                ..
            } => patch["spec"]["enabled"].as_bool(),
            _ => None,
        })
    };
    // Outdated: it turns the autoscaler off.
    let mut outdated = World::new("img-2", 1);
    outdated.nodes = vec![node("a", "g", "img-1", &[])];
    outdated.groups = vec![group("workers", "g", "Worker", "img-2")];
    outdated.strategies = vec![strategy(true)];
    assert_eq!(enabled_by(&mut outdated), Some(false));
    // Up to date (it governs nothing), but the other is busy: it leaves
    // the autoscaler off, as the other wrote it.
    let mut done = World::new("img-2", 1);
    done.strategies = vec![strategy(false)];
    done.others_busy = true;
    assert_eq!(enabled_by(&mut done), None, "no write back");
    // Once the other is done too, it turns the autoscaler on.
    done.others_busy = false;
    assert_eq!(enabled_by(&mut done), Some(true));
}
