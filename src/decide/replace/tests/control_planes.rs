//! Control planes: replaced first and alone, workers waiting until the old
//! control plane's instance is deleted, and a donor that leaves etcd
//! through the provider before its node goes.

use super::surge::nm_for;
use super::*;

#[test]
fn control_planes_go_first_and_alone() {
    let mut w = World::new("img-2", 3);
    w.nodes = vec![
        control_plane("cp", "cpg", "img-1", &[]),
        node("w", "wg", "img-1", &[]),
    ];
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
fn workers_wait_until_the_old_control_planes_instance_delete_is_answered() {
    // The control plane was replaced: its Node is gone and its Leave asked
    // the cloud to delete the instance. A worker's surge node is asked for
    // only once that delete is answered, whatever maxSurge allows.
    let mut w = World::new("img-2", 2);
    w.nodes = vec![
        control_plane("cp-new", "cpg", "img-2", &[]),
        node("w", "wg", "img-1", &[]),
    ];
    w.groups = vec![
        group("a-workers", "wg", "Worker", "img-2"),
        group("z-cp", "cpg", "ControlPlane", "img-2"),
    ];
    let mut leave = (*pending("cp-old", "CPG", "Leave", "Ready")).clone();
    leave.metadata.annotations =
        Some([(DELETE_ISSUED_ANNOTATION.to_string(), now().to_string())].into());
    w.pending = vec![Arc::new(leave)];
    let key = "delete-node/kwok://cp-old".to_string();
    let asks_for_a_worker = |w: &mut World| {
        w.settle_status();
        decide(&w.snap()).effects.iter().any(|e| {
            matches!(e, Effect::PatchObject { patch, .. }
                if patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION]
                    .as_str()
                    .is_some_and(|r| r.ends_with("=wg")))
        })
    };
    // In flight: workers wait, and the status says the budget is spent.
    w.in_flight.insert(key.clone());
    assert!(!asks_for_a_worker(&mut w));
    assert_eq!(w.nv.status.as_ref().unwrap().budget, 0);
    // Refused (backing off): the instance may still be there; still wait.
    w.in_flight.clear();
    w.failures.insert(
        key.clone(),
        Failure {
            message: "provider delete-node: exited with 1: throttled".into(),
            at: now(),
        },
    );
    assert!(!asks_for_a_worker(&mut w));
    // Answered: the worker's surge node is asked for, the Leave waiting
    // for the instance to terminate taking one of the two slots.
    w.failures.clear();
    assert!(asks_for_a_worker(&mut w));
    assert_eq!(w.nv.status.as_ref().unwrap().budget, 1);
}

#[test]
fn a_control_plane_donor_leaves_etcd_through_the_provider_first() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        control_plane("cp-old", "g", "img-1", &[(HEIR_ANNOTATION, "cp-new")]),
        node("cp-new", "g", "img-2", &[(DONOR_ANNOTATION, "cp-old")]),
    ];
    w.settle_status();
    w.maintenances = vec![nm_for(&w, "cp-old", Some(Phase::Succeeded))];
    let plan = decide(&w.snap());
    assert!(
        matches!(&plan.effects[0], Effect::Provider { verb: "remove-etcd-member", request, .. }
            if request["nodeName"] == "cp-old" && request["internalIP"] == ip_of("cp-old")),
        "{plan:?}"
    );
}

#[test]
fn a_control_plane_without_an_internal_ip_is_kept_and_said() {
    // Constellation finds the etcd member by the node's InternalIP and
    // stops when there is none; an empty address would find no member,
    // which its etcd client answers as removed.
    let mut w = World::new("img-2", 1);
    let mut old = (*control_plane("cp-old", "g", "img-1", &[(HEIR_ANNOTATION, "cp-new")])).clone();
    if let Some(st) = old.status.as_mut() {
        st.addresses = None;
    }
    w.nodes = vec![
        Arc::new(old),
        node("cp-new", "g", "img-2", &[(DONOR_ANNOTATION, "cp-old")]),
    ];
    w.settle_status();
    w.maintenances = vec![nm_for(&w, "cp-old", Some(Phase::Succeeded))];
    let plan = decide(&w.snap());
    assert!(
        !plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Provider { .. } | Effect::DeleteNode { .. })),
        "{plan:?}"
    );
    w.settle_status();
    let message = w.nv.status.as_ref().and_then(|s| s.message.clone());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("control-plane node cp-old reports no InternalIP")),
        "{message:?}"
    );
}
