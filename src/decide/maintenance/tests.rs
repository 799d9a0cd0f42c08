//! Unit tests of the decision function: a small world per test, one
//! expected step.

use super::*;

/// Draining: evictable pods, refusals and backoff, the drain timeout,
/// progress writes and success.
mod detach;
mod drain;
/// No Node object: new maintenances refused, running ones failed,
/// finished ones left to go with their Node, the lease released after.
mod node_gone;
mod nowhere;
/// Owners, drain options and escalations; plans and follow-ups.
mod owners;
/// Steps taken before a node's pods are listed.
mod unlisted;
/// Random worlds with faults: never uncordoned while held, always given
/// back.
mod world;
mod world_rules;
use crate::api::node::NodeSpec;
use crate::api::pod::PodStatus;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

const NODE: &str = "n1";

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn node() -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A node that carries maintenance `nm` (cordoned by us unless `admin_cordoned`).
fn maintained(nm: &str, admin_cordoned: bool) -> Node {
    let mut n = node();
    let mut ann: std::collections::BTreeMap<String, String> =
        [(APPLIED_ANNOTATION.to_string(), nm.to_string())].into();
    if !admin_cordoned {
        ann.insert(CORDONED_ANNOTATION.into(), nm.into());
    }
    n.metadata.annotations = Some(ann);
    n.metadata.labels = Some([(EXCLUDE_REMEDIATION_LABEL.to_string(), "true".to_string())].into());
    n.spec = Some(NodeSpec {
        unschedulable: Some(true),
        taints: Some(vec![
            Taint {
                key: UNSCHEDULABLE_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
            Taint {
                key: DRAIN_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
        ]),
        ..Default::default()
    });
    n
}

fn nm(name: &str, created: i64, phase: Option<Phase>) -> NodeMaintenance {
    let mut m = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: NODE.into(),
            reason: None,
        },
    );
    m.metadata.creation_timestamp = Some(Time(ts(created)));
    if phase.is_some() {
        m.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let mut st = NodeMaintenanceStatus {
            phase,
            eviction_pods: Some(2),
            ..Default::default()
        };
        set_condition(&mut st, ts(created), "Cordoned", "True", "Cordoned", "");
        m.status = Some(st);
    }
    m
}

fn deleting(mut m: NodeMaintenance) -> NodeMaintenance {
    m.metadata.deletion_timestamp = Some(Time(ts(100)));
    m
}

pub(crate) fn pod(name: &str, owner: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            owner_references: Some(vec![OwnerReference {
                kind: owner.into(),
                name: "o".into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

struct World {
    node: Option<Node>,
    nms: Vec<NodeMaintenance>,
    pods: Vec<Arc<Pod>>,
    attempts: HashMap<String, Attempt>,
    lease_renew_at: Option<Timestamp>,
    now: Timestamp,
    conditions_paused: bool,
    /// The node's VolumeAttachments as the service read them (none).
    volumes: Option<crate::decide::volumes::Volumes>,
    /// The UIDs of pods no other node can run (`decide::elsewhere`).
    nowhere: std::collections::BTreeSet<String>,
}

/// The node with the lifecycle conditions of the maintenance it carries
/// already published, as after an earlier round: tests of the drain start
/// past that step (node_conditions' own tests cover it).
fn published(mut node: Node, nms: &[NodeMaintenance]) -> Node {
    let applied = annotation(&node, APPLIED_ANNOTATION).map(str::to_string);
    let Some(m) = nms.iter().find(|m| Some(m.name_any()) == applied) else {
        return node;
    };
    if m.phase().is_none() {
        return node;
    }
    let wanted = node_conditions::while_held(m, owner_of(m));
    if let Some(patch) = node_conditions::patch(&node, &wanted, ts(0)) {
        apply_conditions(&mut node, &patch);
    }
    // Being deleted: withdrawn too, as the round before the uncordon does.
    if m.is_deleting()
        && let Some(patch) =
            node_conditions::patch(&node, &node_conditions::after_release(&node), ts(0))
    {
        apply_conditions(&mut node, &patch);
    }
    node
}

/// Merge a lifecycle-condition patch into a node by type, as the API
/// server's strategic merge does.
pub(crate) fn apply_conditions(node: &mut Node, patch: &serde_json::Value) {
    let status = node.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for c in patch["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Ok(c) = serde_json::from_value::<k8s_openapi::api::core::v1::NodeCondition>(c.clone())
        else {
            continue;
        };
        conditions.retain(|o| o.type_ != c.type_);
        conditions.push(c);
    }
}

impl World {
    fn new(node: Option<Node>, nms: Vec<NodeMaintenance>) -> World {
        World {
            node: node.map(|n| published(n, &nms)),
            nms,
            pods: vec![],
            attempts: HashMap::new(),
            lease_renew_at: Some(ts(3000)),
            now: ts(10),
            conditions_paused: false,
            volumes: Some(crate::decide::volumes::Volumes::Read(Vec::new())),
            nowhere: Default::default(),
        }
    }

    /// Node `n1` in maintenance `m` (cordoned by us), draining one
    /// ReplicaSet pod `a` whose last eviction attempt is `attempt`.
    fn draining(m: NodeMaintenance, attempt: Attempt) -> World {
        let mut w = World::new(Some(maintained("m", false)), vec![m]);
        w.pods = vec![pod("a", "ReplicaSet")];
        w.attempts.insert("uid-a".into(), attempt);
        w
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            node_name: NODE,
            node: self.node.as_ref(),
            maintenances: self.nms.iter().collect(),
            pods: &self.pods,
            drain_rules: RuleBook::empty(),
            attempts: &self.attempts,
            lease_renew_at: self.lease_renew_at,
            now: self.now,
            drain_timeout: Duration::from_secs(30),
            volumes: self.volumes.as_ref(),
            homes: None,
            conditions_paused: self.conditions_paused,
        }
    }

    /// One decision, with the service's answer to [`Step::ReadHomes`]:
    /// the pods in `nowhere` have no other node.
    fn decide(&self) -> Step {
        let step = decide(&self.snapshot());
        let Step::ReadHomes { pods, .. } = &step else {
            return step;
        };
        let homes = crate::decide::elsewhere::Homes {
            asked: pods.iter().cloned().collect(),
            homeless: pods
                .iter()
                .filter(|u| self.nowhere.contains(*u))
                .cloned()
                .collect(),
        };
        decide(&Snapshot {
            homes: Some(&homes),
            ..self.snapshot()
        })
    }
}

#[test]
fn nothing_to_do_without_maintenance() {
    let mut w = World::new(Some(node()), vec![]);
    w.lease_renew_at = None;
    assert_eq!(w.decide(), Step::Wait(None));
}

/// A maintenance deleted while its finalizer and lease were being written
/// leaves no lease behind: without a maintenance, a lease we hold goes.
#[test]
fn a_lease_without_a_maintenance_is_released() {
    let w = World::new(Some(node()), vec![]);
    assert_eq!(w.decide(), Step::ReleaseLease);
    let p = plan(&w.snapshot(), Step::ReleaseLease);
    assert!(
        matches!(p.effects.as_slice(), [Effect::ReleaseLease { node }] if node == NODE),
        "{:?}",
        p.effects
    );
}

/// A maintenance deleted before its first status may have taken the lease
/// with its finalizer: it releases it when it finishes, unless another
/// maintenance of the node that took our finalizer goes on (after a
/// restart this process no longer remembers holding it, and the lease held
/// the node from remediators for an hour). One that failed drops its
/// finalizer without releasing (a duplicate never took it); once no
/// maintenance names the node, a lease we remember holding goes. Another
/// maintenance of the node keeps it.
#[test]
fn the_lease_goes_when_the_last_maintenance_of_the_node_is_gone() {
    for phase in [None, Some(Phase::Failed)] {
        let mut m = deleting(nm("m", 0, phase));
        m.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let mut w = World::new(Some(node()), vec![m.clone()]);
        assert_eq!(
            w.decide(),
            Step::Finish {
                nm: "m".into(),
                release_lease: phase.is_none()
            },
            "{phase:?}"
        );
        // Beside one that goes on, the lease stays.
        let mut going_on = nm("on", 5, Some(Phase::Running));
        going_on.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let w2 = World::new(Some(node()), vec![m, going_on]);
        assert_eq!(
            w2.decide(),
            Step::Finish {
                nm: "m".into(),
                release_lease: false
            },
            "{phase:?}"
        );
        w.nms.clear();
        assert_eq!(w.decide(), Step::ReleaseLease);
        w.nms.push(nm("other", 5, None));
        w.nms[0].metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert_ne!(
            w.decide(),
            Step::ReleaseLease,
            "another maintenance needs it"
        );
    }
}

/// A lease take whose answer was lost (a timeout) may have happened: the
/// memory holds it as due, so with no maintenance left it is released (it
/// stayed ours for its hour when the maintenance was deleted before its
/// finalizer was written).
#[test]
fn a_lease_take_without_an_answer_is_released_once_nothing_needs_it() {
    let mut memory = crate::decide::NodeMemory::default();
    let take = Effect::TakeLease {
        node: NODE.into(),
        node_uid: None,
    };
    memory.unanswered(&take, ts(10));
    assert_eq!(memory.lease_renew_at, Some(ts(10)));
    let mut w = World::new(Some(node()), vec![]);
    w.lease_renew_at = memory.lease_renew_at;
    assert_eq!(w.decide(), Step::ReleaseLease);
    // One we know we hold keeps its renewal time.
    memory.lease_renew_at = Some(ts(500));
    memory.unanswered(&take, ts(20));
    assert_eq!(memory.lease_renew_at, Some(ts(500)));
}

#[test]
fn new_maintenance_gets_the_finalizer_and_the_lease_first() {
    let mut w = World::new(Some(node()), vec![nm("m", 0, None)]);
    w.lease_renew_at = None;
    let step = w.decide();
    assert_eq!(
        step,
        Step::AddFinalizer {
            nm: "m".into(),
            lease: true
        }
    );
    // Two independent writes, one round trip.
    let p = plan(&w.snapshot(), step);
    assert!(p.together);
    assert!(
        matches!(
            p.effects.as_slice(),
            [Effect::SetFinalizers { .. }, Effect::TakeLease { .. }]
        ),
        "{:?}",
        p.effects
    );
    // A lease we hold already is not taken again.
    w.lease_renew_at = Some(ts(3000));
    assert_eq!(
        w.decide(),
        Step::AddFinalizer {
            nm: "m".into(),
            lease: false
        }
    );
}

/// After the finalizer: the lease, the node, and only then the first
/// status (the cordon is what a burst of maintenances waits for).
#[test]
fn then_the_lease_the_node_and_a_beginning_with_pod_counts() {
    let mut m = nm("m", 0, None);
    m.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let mut w = World::new(Some(node()), vec![m]);
    w.pods = vec![
        pod("a", "ReplicaSet"),
        pod("b", "ReplicaSet"),
        pod("ds", "DaemonSet"),
    ];
    w.lease_renew_at = None;
    assert_eq!(w.decide(), Step::AcquireLease { nm: "m".into() });
    w.lease_renew_at = Some(ts(3000));
    assert_eq!(
        w.decide(),
        Step::ApplyToNode {
            nm: "m".into(),
            cordon: true
        }
    );
    w.node = Some(maintained("m", false));
    let Step::Begin { status, .. } = w.decide() else {
        panic!("expected Begin, got {:?}", w.decide())
    };
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.total_pods, Some(3));
    assert_eq!(status.eviction_pods, Some(2));
    assert_eq!(
        status.pending_pods,
        Some(vec!["a".to_string(), "b".to_string()])
    );
}

#[test]
fn lease_is_taken_before_the_node_is_touched() {
    let mut w = World::new(Some(node()), vec![nm("m", 0, Some(Phase::Running))]);
    w.lease_renew_at = None;
    assert_eq!(w.decide(), Step::AcquireLease { nm: "m".into() });
    w.lease_renew_at = Some(ts(5));
    assert_eq!(
        w.decide(),
        Step::AcquireLease { nm: "m".into() },
        "renewal due"
    );
}

#[test]
fn schedulable_node_is_cordoned_and_remembered_as_ours() {
    let w = World::new(Some(node()), vec![nm("m", 0, Some(Phase::Running))]);
    assert_eq!(
        w.decide(),
        Step::ApplyToNode {
            nm: "m".into(),
            cordon: true
        }
    );
}

/// NMO's taints exactly: `{key, effect}`, no value, no timeAdded; tools
/// compare them as such.
#[test]
fn taints_are_written_in_nmos_exact_shape() {
    let w = World::new(Some(node()), vec![nm("m", 0, Some(Phase::Running))]);
    assert_eq!(patched_taints(&w), nmo_taints());
}

/// The taints the decided step's node patch writes.
fn patched_taints(w: &World) -> serde_json::Value {
    let step = w.decide();
    assert!(matches!(step, Step::ApplyToNode { .. }), "{step:?}");
    let plan = plan(&w.snapshot(), step);
    let [Effect::PatchNode { patch, .. }] = plan.effects.as_slice() else {
        panic!("expected one node patch, got {:?}", plan.effects)
    };
    patch["spec"]["taints"].clone()
}

fn nmo_taints() -> serde_json::Value {
    serde_json::json!([
        {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"},
        {"key": DRAIN_TAINT, "effect": "NoSchedule"},
    ])
}

/// A node tainted by an earlier version (with timeAdded) is still ours: it
/// does not conform, and the patch rewrites the taints in NMO's shape
/// without adding a second one.
#[test]
fn our_older_taints_with_time_added_are_rewritten() {
    let mut n = maintained("m", false);
    if let Some(ts_) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        for t in ts_.iter_mut() {
            t.time_added = Some(Time(ts(1)));
        }
    }
    assert!(!node_conforms(&n, "m"));
    let w = World::new(Some(n), vec![nm("m", 0, Some(Phase::Running))]);
    assert_eq!(patched_taints(&w), nmo_taints());
}

#[test]
fn admin_cordoned_node_is_not_claimed_as_ours() {
    let mut n = node();
    n.spec = Some(NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    let w = World::new(Some(n), vec![nm("m", 0, Some(Phase::Running))]);
    assert_eq!(
        w.decide(),
        Step::ApplyToNode {
            nm: "m".into(),
            cordon: false
        }
    );
}

#[test]
fn second_maintenance_for_a_node_fails_as_duplicate() {
    let w = World::new(
        Some(maintained("first", false)),
        vec![nm("first", 0, Some(Phase::Running)), nm("second", 5, None)],
    );
    assert_eq!(
        w.decide(),
        Step::Fail {
            nm: "second".into(),
            reason: REASON_DUPLICATE,
            message: "invalid nodeName, a NodeMaintenance for node n1 already exists".into()
        }
    );
}

fn duplicate(name: &str) -> Step {
    Step::Fail {
        nm: name.into(),
        reason: REASON_DUPLICATE,
        message: duplicate_message(NODE),
    }
}

/// Same second, neither claimed: the one stored first (given first) wins,
/// whatever the names ("b" before "a" here).
#[test]
fn same_second_the_first_stored_wins_not_the_first_name() {
    let w = World::new(Some(node()), vec![nm("b", 0, None), nm("a", 0, None)]);
    assert_eq!(w.decide(), duplicate("a"));
}

/// A recorded claim outranks arrival: the one that got our finalizer first
/// keeps the node even if the other arrived before it.
#[test]
fn a_claimed_maintenance_outranks_an_unclaimed_one_of_the_same_second() {
    let mut claimed = nm("b", 0, None);
    claimed.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let w = World::new(Some(node()), vec![nm("a", 0, None), claimed]);
    assert_eq!(w.decide(), duplicate("a"));
}

/// A maintenance that began never loses, not even to one with an earlier
/// timestamp (a clock step, an object restored from a backup).
#[test]
fn a_begun_maintenance_never_loses_to_a_newcomer() {
    let w = World::new(
        Some(maintained("late", false)),
        vec![nm("early", 0, None), nm("late", 5, Some(Phase::Running))],
    );
    assert_eq!(w.decide(), duplicate("early"));
}

#[test]
fn deleting_a_duplicate_does_not_undo_the_first() {
    let dup = deleting(nm("second", 5, Some(Phase::Failed)));
    let w = World::new(
        Some(maintained("first", false)),
        vec![nm("first", 0, Some(Phase::Running)), dup],
    );
    assert_eq!(
        w.decide(),
        Step::Finish {
            nm: "second".into(),
            release_lease: false
        }
    );
}

#[test]
fn deleting_the_maintenance_uncordons_only_what_we_cordoned() {
    let w = World::new(
        Some(maintained("m", false)),
        vec![deleting(nm("m", 0, Some(Phase::Running)))],
    );
    assert_eq!(
        w.decide(),
        Step::RemoveFromNode {
            nm: "m".into(),
            uncordon: true
        }
    );
    let w = World::new(
        Some(maintained("m", true)),
        vec![deleting(nm("m", 0, Some(Phase::Running)))],
    );
    assert_eq!(
        w.decide(),
        Step::RemoveFromNode {
            nm: "m".into(),
            uncordon: false
        }
    );
}

#[test]
fn a_preempted_maintenance_deleted_while_applied_leaves_the_cordon_to_its_successor() {
    // The feature's maintenance failed as preempted and its owner deleted
    // it while it was still the one on the node; the administrator's has
    // not begun yet. Uncordoning here let pods land for a moment.
    let w = World::new(
        Some(maintained("feature", false)),
        vec![
            deleting(nm("feature", 0, Some(Phase::Failed))),
            nm("admin", 5, None),
        ],
    );
    assert!(
        matches!(w.decide(), Step::Finish { ref nm, .. } if nm == "feature"),
        "{:?}",
        w.decide()
    );
    // Once it is gone, the administrator's is applied over our cordon.
    let w = World::new(
        Some(maintained("feature", false)),
        vec![nm("admin", 5, None)],
    );
    assert!(
        matches!(
            w.decide(),
            Step::AddFinalizer { .. }
                | Step::AcquireLease { .. }
                | Step::ApplyToNode { cordon: true, .. }
        ),
        "{:?}",
        w.decide()
    );
}

#[test]
fn after_undo_the_lease_is_released_and_the_finalizer_dropped() {
    let w = World::new(
        Some(node()),
        vec![deleting(nm("m", 0, Some(Phase::Succeeded)))],
    );
    assert_eq!(
        w.decide(),
        Step::Finish {
            nm: "m".into(),
            release_lease: true
        }
    );
}

#[test]
fn leftover_changes_without_a_live_maintenance_are_undone() {
    let w = World::new(Some(maintained("gone", false)), vec![]);
    assert_eq!(
        w.decide(),
        Step::RemoveFromNode {
            nm: "gone".into(),
            uncordon: true
        }
    );
}

#[test]
fn backoff_grows_to_kubectls_five_seconds() {
    assert_eq!(backoff(1), Duration::from_secs(1));
    assert_eq!(backoff(3), Duration::from_secs(4));
    assert_eq!(backoff(10), Duration::from_secs(5));
}

#[test]
fn a_stored_object_with_an_impossible_node_name_fails_with_a_message_not_a_lookup() {
    for bad in ["", " n1", "N1", "n1_a"] {
        let mut m = nm("m", 0, None);
        m.spec.node_name = bad.into();
        let step = decide(&Snapshot {
            node_name: bad,
            node: None,
            maintenances: vec![&m],
            pods: &[],
            drain_rules: RuleBook::empty(),
            attempts: &HashMap::new(),
            lease_renew_at: None,
            now: ts(10),
            drain_timeout: Duration::from_secs(30),
            volumes: None,
            homes: None,
            conditions_paused: false,
        });
        let Step::Fail {
            reason, message, ..
        } = step
        else {
            panic!("{bad:?}: {step:?}")
        };
        assert_eq!(reason, REASON_INVALID_NODE);
        assert!(
            message.starts_with("invalid nodeName, ") && message.contains("is not a node name"),
            "{message}"
        );
    }
}
