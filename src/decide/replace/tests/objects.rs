//! The lifecycles of the other objects: PendingNodes that join or leave,
//! JoiningNodes, discovered ScalingGroups and the AutoscalingStrategy.

use super::*;

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

/// The PendingNode step for `p` when the provider calls its instance `state`.
fn step_at(w: &mut World, p: &PendingNode, state: &str) -> Plan {
    w.pending = vec![Arc::new(p.clone())];
    w.facts
        .state_of
        .insert("kwok://old".into(), Ok(state.into()));
    lifecycle::pending(&w.snap()).expect("a step")
}

/// A terminated leave's one round: its status recorded, then deleted.
fn assert_recorded_and_deleted(plan: &Plan) {
    assert!(
        matches!(&plan.effects[..], [
            Effect::WriteObjectStatus { status, .. },
            Effect::DeleteObject { kind: Kind::PendingNode, .. },
        ] if status["reachedGoal"] == true),
        "{plan:?}"
    );
}

/// A leave takes as few rounds as its steps need: a new one asks for the
/// delete before recording its state, and one the provider calls
/// Terminated is recorded and deleted in the same round (each round waits
/// for the watches and the provider's answers).
#[test]
fn a_new_leave_asks_first_and_a_terminated_one_goes_in_one_round() {
    let mut w = World::new("img-2", 1);
    let mut fresh = (*pending("old", "g", "Leave", "Ready")).clone();
    fresh.status = None;
    let plan = step_at(&mut w, &fresh, "Ready");
    assert!(
        matches!(&plan.effects[0], Effect::PatchObject { patch, .. } if patch["metadata"]["annotations"][DELETE_ISSUED_ANNOTATION].is_string()),
        "{plan:?}"
    );
    assert!(
        matches!(
            &plan.effects[1],
            Effect::Provider {
                verb: "delete-node",
                ..
            }
        ),
        "{plan:?}"
    );
    // Asked, and not Terminated yet: now its state is recorded.
    fresh.metadata.annotations =
        Some([(DELETE_ISSUED_ANNOTATION.to_string(), now().to_string())].into());
    let plan = step_at(&mut w, &fresh, "Terminating");
    assert!(
        matches!(&plan.effects[..], [Effect::WriteObjectStatus { status, .. }] if status["cspState"] == "Terminating"),
        "{plan:?}"
    );
    fresh.status = Some(PendingNodeStatus {
        csp_state: Some("Terminating".into()),
        reached_goal: false,
    });
    let plan = step_at(&mut w, &fresh, "Terminated");
    assert_recorded_and_deleted(&plan);
}

/// A delete running in the background: its PendingNode has no step and
/// its state is not asked until the answer comes (it kicks the round);
/// then the leave goes on as before.
#[test]
fn a_leave_whose_delete_is_running_waits_for_its_answer() {
    let mut w = World::new("img-2", 1);
    let mut issued = (*pending("old", "g", "Leave", "Ready")).clone();
    issued.status = None;
    issued.metadata.annotations =
        Some([(DELETE_ISSUED_ANNOTATION.to_string(), now().to_string())].into());
    w.pending = vec![Arc::new(issued.clone())];
    w.in_flight.insert("delete-node/kwok://old".into());
    let asked = |w: &World| {
        questions(&w.snap())
            .into_iter()
            .any(|(r, id)| r == Read::NodeState && id == "kwok://old")
    };
    assert!(!asked(&w), "a running delete's state is not asked");
    assert!(lifecycle::pending(&w.snap()).is_none());
    // Another instance's delete running holds up nothing of this one.
    w.in_flight = ["delete-node/kwok://other".to_string()].into();
    assert!(asked(&w));
    let plan = step_at(&mut w, &issued, "Terminated");
    assert_recorded_and_deleted(&plan);
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
    let fx = strategy(&st, &groups, Some(&d), now());
    assert!(
        matches!(&fx[0], Effect::WriteObjectStatus { status, .. } if *status == json!({"enabled": false, "replicas": 0}))
    );
    assert!(
        matches!(&fx[1], Effect::PatchObject { patch, strategic: true, .. } if patch["spec"]["replicas"] == 1)
    );
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
    // Another without a status yet (just created): not known to be busy or
    // done, so a NodeVersion that is done turns the autoscaler neither off
    // nor on; one that is outdated still turns it off.
    let mut beside_new = World::new("img-2", 1);
    beside_new.strategies = vec![strategy(true)];
    beside_new.others_unknown = true;
    assert_eq!(enabled_by(&mut beside_new), None, "left on");
    beside_new.strategies = vec![strategy(false)];
    assert_eq!(enabled_by(&mut beside_new), None, "left off");
    outdated.strategies = vec![strategy(true)];
    outdated.others_unknown = true;
    assert_eq!(enabled_by(&mut outdated), Some(false));
}
