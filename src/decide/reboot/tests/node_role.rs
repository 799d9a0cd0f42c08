//! The node role's half: issuing the reboot, marking need, recording failure.
use super::super::node::{Snapshot, decide};
use super::*;
use crate::decide::once_per_boot::{Ask, after_command, issue};
use crate::decide::{HostAction, Outcome};

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
        matches!(&fx[..], [Effect::PatchNode { .. }, Effect::RunHost { action: HostAction::Command(argv), .. }] if argv == &["systemctl", "reboot"])
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
    let n = node("a", "b0");
    let run = issue(&n, &Ask::need(&n, "b0"), HostAction::TalosReboot).remove(1);
    let fx = after_command(
        &run,
        &Outcome::HostRan {
            ok: false,
            output: "no systemd".into(),
        },
    );
    assert!(
        matches!(fx, Some(Effect::PatchNode { patch, .. }) if patch["metadata"]["annotations"][FAILED_ANNOTATION] == format!("{}: no systemd", Ask::need(&n, "b0").key()))
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

#[test]
fn an_unreadable_reboot_signal_is_recorded_once_and_taken_back() {
    let a = node("a", "b0");
    let why = "sentinel command \"/no/such\": /no/such: not found";
    let Some(Effect::PatchNode { patch, .. }) = super::super::node::sentinel_record(&a, Some(why))
    else {
        panic!("not recorded");
    };
    assert_eq!(
        patch["metadata"]["annotations"][SENTINEL_FAILED_ANNOTATION],
        why
    );
    let recorded = annotate(a.clone(), SENTINEL_FAILED_ANNOTATION, why);
    assert!(super::super::node::sentinel_record(&recorded, Some(why)).is_none());
    let Some(Effect::PatchNode { patch, .. }) =
        super::super::node::sentinel_record(&recorded, None)
    else {
        panic!("not taken back");
    };
    assert!(patch["metadata"]["annotations"][SENTINEL_FAILED_ANNOTATION].is_null());
    assert!(super::super::node::sentinel_record(&a, None).is_none());
}

#[test]
fn the_governing_policy_reports_a_node_whose_signal_is_unreadable() {
    let why = "sentinel command \"sleep 3600\": still running after 60 s";
    let a = annotate(no_need(node("a", "b0")), SENTINEL_FAILED_ANNOTATION, why);
    let b = no_need(node("b", "b0"));
    let mut w = World::new(policy(1), vec![a, b]);
    let plan = w.plan();
    let st = status_of(&plan);
    let (phase, msg) = phase_of(&st, "a");
    assert_eq!(phase, RebootPhase::Unknown);
    assert!(msg.contains("still running after 60 s"), "{msg}");
    assert_eq!(
        st.nodes[0].reason.as_deref(),
        Some(crate::decide::reboot::SENTINEL_FAILED)
    );
    assert!(st.nodes.iter().all(|e| e.name != "b"), "{st:?}");
    assert_eq!(st.needing, 0, "not known to need one");
    assert!(created(&plan).is_empty());
    let events = |p: &Plan| {
        p.effects
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Effect::Event {
                        reason: "RebootSignalUnreadable",
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(events(&plan), 2, "on the node and the policy");
    // Reported once, not on every decision.
    w.policy.status = Some(st);
    assert_eq!(events(&w.plan()), 0);
}

/// `reboot.method`: Auto takes Talos's API on a node whose osImage names
/// Talos and the command elsewhere; Command and Talos force the path.
#[test]
fn the_reboot_method_picks_talos_api_or_the_command() {
    let talos = |mut n: Node| {
        if let Some(i) = n.status.as_mut().and_then(|s| s.node_info.as_mut()) {
            i.os_image = "Talos (v1.13.0)".into();
        }
        n
    };
    let reboot_of = |method: &str, n: &Node| {
        let mut p = policy(1);
        p.spec.reboot.method = method.into();
        let policies = [Arc::new(p.clone())];
        let drained = ours(&p, n, "b0", Some(Phase::Succeeded));
        let fx = decide_for(n, &[drained], &policies, None);
        match &fx[..] {
            [Effect::PatchNode { .. }, Effect::RunHost { action, .. }] => action.clone(),
            other => panic!("{method}: {other:?}"),
        }
    };
    let debian = node("a", "b0");
    let systemctl = HostAction::Command(vec!["systemctl".into(), "reboot".into()]);
    assert_eq!(
        reboot_of("Auto", &talos(debian.clone())),
        HostAction::TalosReboot
    );
    assert_eq!(reboot_of("Auto", &debian), systemctl);
    assert_eq!(reboot_of("Command", &talos(debian.clone())), systemctl);
    assert_eq!(reboot_of("Talos", &debian), HostAction::TalosReboot);
    assert_eq!(
        crate::decide::reboot::facts::talos_release(&talos(debian.clone())),
        Some((1, 13))
    );
    assert_eq!(crate::decide::reboot::facts::talos_release(&debian), None);
}

/// The agent gives its node back after the reboot it issued, in the new
/// boot once Ready, with no cluster role needed (a single-node cluster's
/// may be Pending on the cordoned node); not after a boot it did not
/// reboot for, nor before Ready.
#[test]
fn the_agent_gives_its_node_back_after_the_reboot_it_issued() {
    let p = policy(1);
    let policies = [Arc::new(p.clone())];
    let a = node("a", "b0");
    let drained = ours(&p, &a, "b0", Some(Phase::Succeeded));
    // The record the agent wrote before its command, read in the new boot.
    let key = Ask::need(&a, "b0").key();
    let back = annotate(node("a", "b1"), ISSUED_ANNOTATION, &key);
    let fx = decide_for(&back, std::slice::from_ref(&drained), &policies, None);
    assert!(
        matches!(&fx[..], [Effect::DeleteMaintenance { nm, uid }] if nm == &drained.name_any() && uid == "nm-uid-a"),
        "{fx:?}"
    );
    // Not Ready yet: it waits.
    assert!(
        decide_for(
            &not_ready(back.clone()),
            std::slice::from_ref(&drained),
            &policies,
            None
        )
        .is_empty()
    );
    // A new boot without a reboot issued for this need (a crash before
    // the command): the cluster role decides, as before.
    assert!(
        decide_for(
            &node("a", "b1"),
            std::slice::from_ref(&drained),
            &policies,
            None
        )
        .is_empty()
    );
    // An administrator's maintenance is never given back by the agent.
    let mut admin = drained.clone();
    admin.metadata.labels = None;
    assert!(decide_for(&back, &[admin], &policies, None).is_empty());
}
