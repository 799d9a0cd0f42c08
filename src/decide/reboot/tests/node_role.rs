//! The node role's half: issuing the reboot, marking need, recording failure.
use super::super::node::{Snapshot, after_command, decide, issue};
use super::*;
use crate::decide::Outcome;

fn decide_for(
    n: &Node,
    nms: &[NodeMaintenance],
    policies: &[Arc<RebootPolicy>],
    host: Option<bool>,
) -> Vec<Effect> {
    decide(&Snapshot {
        node: n,
        maintenances: nms.iter().collect(),
        policies,
        host_needs: host,
        now: now(),
    })
}

#[test]
fn reboots_only_in_the_recorded_boot_and_only_once() {
    let p = policy(1);
    let policies = [Arc::new(p.clone())];
    let a = node("a", "b0");
    let drained = ours(&p, &a, "b0", Some(Phase::Succeeded));
    let fx = decide_for(&a, std::slice::from_ref(&drained), &policies, None);
    assert!(
        matches!(&fx[..], [Effect::PatchNode { .. }, Effect::RunHost { argv, .. }] if argv == &["systemctl", "reboot"])
    );
    // Still draining: nothing.
    let draining = ours(&p, &a, "b0", Some(Phase::Running));
    assert!(decide_for(&a, &[draining], &policies, None).is_empty());
    // Issued in this boot already: nothing.
    let issued = annotate(a.clone(), ISSUED_ANNOTATION, "b0");
    assert!(decide_for(&issued, std::slice::from_ref(&drained), &policies, None).is_empty());
    // Already a new boot (the record may lag): nothing.
    let rebooted = node("a", "b1");
    assert!(decide_for(&rebooted, std::slice::from_ref(&drained), &policies, None).is_empty());
    // An admin's maintenance: never a reboot.
    let mut admin = drained.clone();
    admin.metadata.labels = None;
    assert!(decide_for(&a, &[admin], &policies, None).is_empty());
}

#[test]
fn the_host_signal_marks_need_once() {
    let a = no_need(node("a", "b0"));
    let fx = decide_for(&a, &[], &[], Some(true));
    assert!(
        matches!(&fx[..], [Effect::PatchNode { patch, .. }] if patch["metadata"]["annotations"][NEEDED_ANNOTATION].is_string())
    );
    assert!(
        decide_for(&node("a", "b0"), &[], &[], Some(true)).is_empty(),
        "already marked"
    );
    assert!(decide_for(&a, &[], &[], Some(false)).is_empty());
}

#[test]
fn a_failed_command_is_recorded_with_its_boot() {
    let run = issue(&node("a", "b0"), "b0", vec![]).remove(1);
    let fx = after_command(
        &run,
        &Outcome::HostRan {
            ok: false,
            output: "no systemd".into(),
        },
    );
    assert!(
        matches!(fx, Some(Effect::PatchNode { patch, .. }) if patch["metadata"]["annotations"][FAILED_ANNOTATION] == "b0: no systemd")
    );
    assert!(
        after_command(
            &run,
            &Outcome::HostRan {
                ok: true,
                output: String::new()
            }
        )
        .is_none()
    );
}
