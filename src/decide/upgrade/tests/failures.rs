//! Failures, deadlines and retries: hooks that fail, time out, vanish or
//! are refused; upgrades that fail or never report; reboots that must show
//! a new boot.

use super::*;
use crate::decide::HostAction;

#[test]
fn a_failed_before_hook_fails_the_node_untouched_and_pauses_the_plan_until_the_spec_changes() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.budget.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2);
    let mut w = World::new(
        p,
        vec![
            node("a", "v1", false),
            node("b", "v1", false),
            node("c", "v1", false),
        ],
    );
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::PreHooks);
    assert_eq!(w.phase("b"), UpgradePhase::PreHooks);
    w.finish_job("a", false);
    w.step();
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::Failed);
    assert_eq!(e.reason.as_deref(), Some(FAILED_HOOK));
    let job = e.job.clone().unwrap_or_default();
    assert!(
        e.message.as_deref().unwrap_or_default().contains(&job),
        "{e:?}"
    );
    assert!(
        e.message
            .as_deref()
            .unwrap_or_default()
            .contains("BackoffLimitExceeded")
    );
    assert!(
        w.nms.is_empty(),
        "a before hook runs before the node is touched"
    );
    // b, in flight, goes on; c is not admitted.
    assert_eq!(w.phase("b"), UpgradePhase::PreHooks);
    assert_eq!(w.entry("c").reason.as_deref(), Some(WAIT_FAILURE));
    let paused = w
        .plan
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    assert!(
        paused
            .iter()
            .any(|c| c.type_ == "Paused" && c.status == "True" && c.reason == WAIT_FAILURE)
    );
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed, "not retried by itself");

    // A spec change (a new generation) retries it with new Job names.
    w.plan.metadata.generation = Some(2);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::PreHooks);
    assert_ne!(w.entry("a").job, Some(job));
}

#[test]
fn continue_goes_on_past_a_failed_node_and_ignore_goes_on_past_a_failed_hook() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.on_failure = "Continue".into();
    let mut w = World::new(p, vec![node("a", "v1", false), node("b", "v1", false)]);
    w.step();
    w.finish_job("a", false);
    w.step();
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed);
    assert_eq!(
        w.phase("b"),
        UpgradePhase::PreHooks,
        "Continue: the next node"
    );

    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks.before = vec![hook("notify", "Ignore")];
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    w.finish_job("a", false);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Draining);
    assert!(w.events.contains(&"UpgradeHookFailed"));
}

#[test]
fn a_hook_past_its_deadline_fails_and_a_vanished_job_is_created_again_under_its_name() {
    let mut p = plan();
    p.spec.groups.clear();
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    let key = w.entry("a").job.unwrap_or_default();
    // Recorded but not seen (a crash between status write and create, or a
    // lagging watch): created again, same name.
    w.jobs.clear();
    let fx = w.step();
    assert!(fx.iter().any(|e| matches!(e, Effect::CreateJob { job } if crate::decide::jobs::key_of("ops", job.metadata.name.as_deref().unwrap_or_default()) == key)));
    w.step();
    assert!(w.entry("a").job_seen, "seen once the store shows it");
    w.later(300 + 59);
    assert!(w.step().is_empty());
    w.later(2);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed);
    assert!(
        w.entry("a")
            .message
            .unwrap_or_default()
            .contains("past its deadline")
    );
}

/// where-features-meet.md, finding 12: a person deletes a running hook
/// Job to stop it; it is never created again.
#[test]
fn a_job_deleted_after_it_was_seen_is_a_stop_never_created_again() {
    let mut p = plan();
    p.spec.groups.clear();
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    w.step();
    assert!(w.entry("a").job_seen);
    w.jobs.clear();
    let fx = w.step();
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::CreateJob { .. })),
        "{fx:?}"
    );
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::Failed);
    assert_eq!(
        e.reason.as_deref(),
        Some(crate::decide::upgrade::FAILED_JOB_DELETED)
    );
    assert!(
        e.message
            .unwrap_or_default()
            .contains("deleted before it finished")
    );
    assert!(w.step().is_empty(), "and it stays so");
}

#[test]
fn a_refused_job_fails_the_node_with_the_api_servers_reason() {
    let mut p = plan();
    p.spec.groups.clear();
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    let key = w.entry("a").job.unwrap_or_default();
    w.jobs.clear();
    w.job_errors
        .insert(key, "namespaces \"ops\" not found (404)".into());
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed);
    assert!(
        w.entry("a")
            .message
            .unwrap_or_default()
            .contains("not found")
    );
}

#[test]
fn upgrade_failures_and_deadlines_keep_the_node_in_maintenance() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Hooks::default();
    let mut w = World::new(p.clone(), vec![node("a", "v1", false)]);
    w.step();
    w.drained("a");
    w.step();
    w.upgrade_host("a", false);
    w.step();
    let e = w.entry("a");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Failed, Some(FAILED_COMMAND))
    );
    assert!(e.message.unwrap_or_default().contains("disk full"));
    assert_eq!(w.nms.len(), 1, "a half-upgraded node is not given back");

    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    w.drained("a");
    w.step();
    w.later(1799);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading);
    w.later(1);
    w.step();
    assert_eq!(w.entry("a").reason.as_deref(), Some(FAILED_UPGRADE_TIMEOUT));
    assert_eq!(w.nms.len(), 1);
}

#[test]
fn with_a_reboot_the_version_alone_is_not_enough_a_new_boot_is() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Hooks::default();
    p.spec.strategy.reboot = true;
    p.spec.strategy.reboot_command = vec!["reboot-now".into()];
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    w.drained("a");
    w.step();
    w.upgrade_host("a", true);
    w.step();
    assert_eq!(
        w.phase("a"),
        UpgradePhase::Upgrading,
        "same boot: not verified"
    );
    // The agent reboots once the command succeeded, once per boot.
    let fx = w.agent("a");
    assert!(
        matches!(&fx[..], [Effect::PatchNode { .. }, Effect::RunHost { action: HostAction::Command(argv), .. }] if argv == &["reboot-now"])
    );
    w.edit_node("a", |n| {
        n.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                crate::api::reboot::ISSUED_ANNOTATION.into(),
                "boot-a-1".into(),
            );
    });
    assert!(w.agent("a").is_empty());
    w.edit_node("a", |n| {
        if let Some(i) = n.status.as_mut().and_then(|s| s.node_info.as_mut()) {
            i.boot_id = "boot-a-2".into();
        }
    });
    // A new boot runs nothing; with no after hook left, the agent gives
    // the node back itself (`agent_gives_back.rs`).
    assert!(
        matches!(&w.agent("a")[..], [Effect::DeleteMaintenance { .. }]),
        "a new boot runs nothing"
    );
    w.step();
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Done);
}

/// An administrator's NodeMaintenance that ended Failed (invalid drain
/// options) holds nothing: the plan takes the node; a Running one holds it.
#[test]
fn a_failed_maintenance_of_an_administrator_holds_nothing() {
    use crate::api::nodemaintenance::{NodeMaintenanceSpec, NodeMaintenanceStatus, Phase};
    let mut p = plan();
    p.spec.groups.clear();
    let admin = |phase: Phase| {
        let mut m = NodeMaintenance::new(
            "admin-a",
            NodeMaintenanceSpec {
                node_name: "a".into(),
                reason: None,
            },
        );
        m.metadata.uid = Some("uid-admin-a".into());
        m.status = Some(NodeMaintenanceStatus {
            phase: Some(phase),
            ..Default::default()
        });
        Arc::new(m)
    };
    let mut w = World::new(p.clone(), vec![node("a", "v1", false)]);
    w.nms = vec![admin(Phase::Running)];
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Waiting);
    assert_eq!(w.entry("a").reason.as_deref(), Some(WAIT_IN_MAINTENANCE));

    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.nms = vec![admin(Phase::Failed)];
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::PreHooks, "{:?}", w.entry("a"));
}

#[test]
fn a_node_is_taken_only_once_its_agent_said_the_command_can_run() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Default::default();
    p.spec.budget.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(3);
    let key = node::check_key(&p);
    let mut w = World::new(
        p,
        vec![
            node("a", "v1", false),
            node("b", "v1", false),
            node("c", "v1", false),
        ],
    );
    let say = |w: &mut World, n: &str, value: Option<String>| {
        w.edit_node(n, |x| {
            let a = x.metadata.annotations.get_or_insert_default();
            match value {
                // An agent that has not looked yet, or looked at an older
                // spec of the plan.
                None => a.insert(CHECK_ANNOTATION.into(), "os/0/uid-plan ok".into()),
                Some(v) => a.insert(CHECK_ANNOTATION.into(), v),
            };
        })
    };
    say(&mut w, "a", None);
    say(
        &mut w,
        "b",
        Some(format!("{key} cannot run: /sbin/upgrade: not found")),
    );
    w.step();
    assert_eq!(w.phase("c"), UpgradePhase::Draining, "c was checked");
    let a = w.entry("a");
    assert_eq!(
        (a.phase, a.reason.as_deref()),
        (UpgradePhase::Waiting, Some(WAIT_AGENT_CHECK))
    );
    let b = w.entry("b");
    assert_eq!(
        (b.phase, b.reason.as_deref()),
        (UpgradePhase::Waiting, Some(WAIT_COMMAND))
    );
    assert!(
        b.message
            .as_deref()
            .unwrap_or_default()
            .contains("/sbin/upgrade: not found"),
        "{b:?}"
    );
    assert!(
        !w.nms.iter().any(|m| m.spec.node_name != "c"),
        "only c is taken"
    );
    // Reported once (on the node and the plan), not on every decision.
    let reported = |w: &World| {
        w.events
            .iter()
            .filter(|r| **r == "UpgradeCommandNotRunnable")
            .count()
    };
    assert_eq!(reported(&w), 2);
    w.step();
    assert_eq!(reported(&w), 2);
    // The program installed: the agent says so and the node is taken.
    say(&mut w, "b", Some(format!("{key} ok")));
    w.step();
    assert_eq!(w.phase("b"), UpgradePhase::Draining);
}

#[test]
fn the_agent_checks_its_governing_plans_commands_until_they_can_run() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.strategy.reboot = true;
    let n = node("a", "v1", false);
    let plans = [Arc::new(p.clone())];
    let (key, argvs) = node::to_check(&n, &plans).unwrap_or_else(|| panic!("nothing to check"));
    assert_eq!(key, node::check_key(&p));
    assert_eq!(
        argvs[0],
        HostAction::Command(vec![
            "/sbin/upgrade".into(),
            "--to".into(),
            "v2".into(),
            "a".into()
        ])
    );
    assert_eq!(argvs.len(), 2, "the reboot command too: {argvs:?}");
    let failed: Result<(), String> = Err("/sbin/upgrade: not found".into());
    let Some(Effect::PatchNode { patch, .. }) = node::record_check(&n, &key, &failed) else {
        panic!("no record");
    };
    let value = patch["metadata"]["annotations"][CHECK_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut recorded = n.clone();
    recorded
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(CHECK_ANNOTATION.into(), value);
    assert_eq!(
        node::check_of(&recorded, &p),
        node::Check::NotRunnable("/sbin/upgrade: not found".into())
    );
    // A failed check is looked at again, but the same answer is not
    // written again.
    assert!(node::to_check(&recorded, &plans).is_some());
    assert!(node::record_check(&recorded, &key, &failed).is_none());
    // Runnable: nothing more to check until the spec changes.
    let ok = node::record_check(&recorded, &key, &Ok(()));
    assert!(ok.is_some());
    let mut fine = n.clone();
    fine.metadata
        .annotations
        .get_or_insert_default()
        .insert(CHECK_ANNOTATION.into(), format!("{key} ok"));
    assert!(node::to_check(&fine, &plans).is_none());
    p.metadata.generation = Some(2);
    assert!(node::to_check(&fine, &[Arc::new(p.clone())]).is_some());
    // At the version: nothing to check.
    assert!(node::to_check(&node("a", "v2", false), &plans).is_none());
}

#[test]
fn an_upgrade_another_plan_ran_in_this_boot_is_not_run_again() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Default::default();
    let mut w = World::new(p.clone(), vec![node("a", "v1", false)]);
    // A deleted plan ran the upgrade to v2 in this boot; it failed and the
    // node was given back when that plan went.
    w.edit_node("a", |x| {
        x.metadata
            .annotations
            .get_or_insert_default()
            .insert(ISSUED_ANNOTATION.into(), "gone/v2/boot-a-1".into());
    });
    w.step();
    let e = w.entry("a");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Waiting, Some(WAIT_ISSUED))
    );
    assert!(w.nms.is_empty(), "not taken");
    // What the node role reads too (it runs no second command for this
    // version and boot, whichever plan asks).
    let n = w.node("a");
    assert_eq!(
        node::issued_for(&n, "v2", "boot-a-1").as_deref(),
        Some("gone")
    );
    assert_eq!(node::issued_for(&n, "v3", "boot-a-1"), None);
    assert_eq!(node::issued_for(&n, "v2", "boot-a-2"), None);
    // After a reboot (a new boot ID) it is taken again.
    w.edit_node("a", |x| {
        if let Some(i) = x.status.as_mut().and_then(|s| s.node_info.as_mut()) {
            i.boot_id = "boot-a-2".into();
        }
    });
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Draining);
}

#[test]
fn a_node_found_at_the_version_is_done_and_says_which() {
    let mut p = plan();
    p.spec.groups.clear();
    let mut w = World::new(p, vec![node("a", "v2", false)]);
    w.step();
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::Done);
    assert_eq!(e.version.as_deref(), Some("v2"));
}

/// An agent restarted while its upgrade command runs (a DaemonSet rollout)
/// asks for the same command again, by the same id and without a second
/// issue record: the host's record attaches it to the first run
/// (`effects::host_run`), whose result it then publishes. Once a result
/// is recorded, nothing runs.
#[test]
fn an_agent_restarted_mid_upgrade_attaches_to_the_command_by_its_id() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Hooks::default();
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    w.drained("a");
    w.step();
    let fx = w.agent("a");
    let (Effect::PatchNode { patch, .. }, Effect::RunHost { id, .. }) = (&fx[0], &fx[1]) else {
        panic!("expected issue + run, got {fx:?}");
    };
    let (issued, first) = (
        patch["metadata"]["annotations"][ISSUED_ANNOTATION]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        id.clone(),
    );
    assert_eq!(first, issued, "the command's id is its issue record");
    w.edit_node("a", |n| {
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert(ISSUED_ANNOTATION.into(), issued.clone());
    });
    let again = w.agent("a");
    assert!(
        matches!(&again[..], [Effect::RunHost { id, .. }] if *id == first),
        "attach, no second issue: {again:?}"
    );
    w.edit_node("a", |n| {
        n.metadata.annotations.get_or_insert_default().insert(
            RESULT_ANNOTATION.into(),
            format!("{issued} failed: disk full"),
        );
    });
    let after = w.agent("a");
    assert!(after.is_empty(), "a result ends it: {after:?}");
}

/// Type Talos: the agent upgrades through machined's API and reboots
/// through it once the upgrade succeeded; a Talos before 1.13 (its
/// osImage says) gets the old call, which reboots by itself, so no second
/// reboot follows.
#[test]
fn a_talos_plan_upgrades_and_reboots_through_the_api_by_the_nodes_release() {
    for (os, legacy) in [("Talos (v1.13.2)", false), ("Talos (v1.12.0)", true)] {
        let mut p = plan();
        p.spec.groups.clear();
        p.spec.hooks = Hooks::default();
        p.spec.strategy.type_ = "Talos".into();
        p.spec.strategy.command.clear();
        p.spec.strategy.image = Some("factory.example/installer:{version}".into());
        let mut a = node("a", "v1", false);
        if let Some(i) = a.status.as_mut().and_then(|s| s.node_info.as_mut()) {
            i.os_image = os.into();
        }
        let mut w = World::new(p, vec![a]);
        w.step();
        w.drained("a");
        w.step();
        let fx = w.agent("a");
        let image = "factory.example/installer:v2".to_string();
        assert!(
            matches!(&fx[..], [Effect::PatchNode { .. }, Effect::RunHost { action: HostAction::TalosUpgrade { image: i, legacy: l }, .. }] if *i == image && *l == legacy),
            "{os}: {fx:?}"
        );
        w.upgrade_host("a", true);
        let after = w.agent("a");
        if legacy {
            assert!(
                after.is_empty(),
                "{os}: machined reboots by itself: {after:?}"
            );
        } else {
            assert!(
                matches!(
                    &after[..],
                    [
                        Effect::PatchNode { .. },
                        Effect::RunHost {
                            action: HostAction::TalosReboot,
                            ..
                        }
                    ]
                ),
                "{os}: {after:?}"
            );
        }
        // The version alone does not finish it: a new boot must follow.
        w.step();
        assert_eq!(w.phase("a"), UpgradePhase::Upgrading, "{os}");
    }
}

/// Type Job: the Job is recorded, then created once after the drain; the
/// agent runs nothing and is asked to check nothing; a lost Job is created
/// again under its name; a failed one fails the node in maintenance; a
/// completed one waits for the version, then the node is verified.
#[test]
fn a_job_upgrade_runs_after_the_drain_and_its_result_decides() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Hooks::default();
    p.spec.strategy = serde_json::from_value(json!({"type": "Job", "job": {
        "namespace": "system-upgrade", "image": "upgrader:{version}"}}))
    .unwrap_or_else(|e| panic!("{e}"));
    let fresh = || {
        let mut w = World::new(p.clone(), vec![node("a", "v1", false)]);
        // No check annotation: type Job needs none from the agent.
        w.nodes = vec![Arc::new(node("a", "v1", false))];
        w
    };
    let mut w = fresh();
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Draining);
    assert!(w.created.is_empty(), "no Job before the drain");
    w.drained("a");
    w.step();
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::Upgrading);
    let key = e.job.clone().unwrap_or_default();
    assert!(key.starts_with("system-upgrade/os-upgrade-"), "{key}");
    assert_eq!(w.created.len(), 1);
    assert!(w.agent("a").is_empty(), "the agent runs nothing");
    assert!(node::to_check(&w.node("a"), &[Arc::new(w.plan.clone())]).is_none());
    // Lost from the store: created again under the same name.
    w.jobs.clear();
    let fx = w.step();
    let again: Vec<_> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::CreateJob { job } => job.metadata.name.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(again.len(), 1);
    assert!(key.ends_with(&again[0]));
    // Complete: the version is awaited, then verified.
    w.finish_job("a", true);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Upgrading);
    w.edit_node("a", |n| {
        n.metadata
            .labels
            .get_or_insert_default()
            .insert(VERSION_LABEL.into(), "v2".into());
    });
    w.step();
    assert!(matches!(
        w.phase("a"),
        UpgradePhase::Verifying | UpgradePhase::Done | UpgradePhase::Settling
    ));
    // The World counts the create after the store lost it; both under one
    // name (a 409 on the API server, never a second run).
    let names: std::collections::BTreeSet<_> =
        w.created.iter().map(|j| j.metadata.name.clone()).collect();
    assert_eq!(names.len(), 1, "one Job per node and version");

    // Failed: the node fails and stays in maintenance.
    let mut w = fresh();
    w.step();
    w.drained("a");
    w.step();
    w.finish_job("a", false);
    w.step();
    let e = w.entry("a");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Failed, Some(FAILED_COMMAND))
    );
    assert!(e.message.unwrap_or_default().contains("backoff limit"));
    assert_eq!(w.nms.len(), 1);
}

/// `channel`: nothing is admitted until it names a version; its answer is
/// the version admitted and recorded; a node that failed is tried again
/// when the channel names a newer one.
#[test]
fn a_channel_names_the_version_and_a_new_one_retries_a_failed_node() {
    let mut p = plan();
    p.spec.groups.clear();
    p.spec.hooks = Hooks::default();
    p.spec.version = String::new();
    p.spec.channel = Some("https://update.example/channels/stable".into());
    let mut w = World::new(p, vec![node("a", "v1", false)]);
    w.step();
    let e = w.entry("a");
    assert_eq!(
        (e.phase, e.reason.as_deref()),
        (UpgradePhase::Waiting, Some(WAIT_CHANNEL))
    );
    // The resolver's answer (as the service puts it in the snapshot) is
    // written to the status; the next pass admits for it.
    let answer = ChannelStatus {
        url: "https://update.example/channels/stable".into(),
        version: Some("v2".into()),
        ..Default::default()
    };
    let status = w.plan.status.clone().unwrap_or_default();
    w.plan.status = Some(UpgradePlanStatus {
        channel: Some(answer.clone()),
        ..status
    });
    assert_eq!(w.plan.target_version(), "v2");
    w.step();
    let e = w.entry("a");
    assert_eq!(e.phase, UpgradePhase::Draining);
    assert_eq!(e.version.as_deref(), Some("v2"));
    w.drained("a");
    w.step();
    w.upgrade_host("a", false);
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed);
    // Same spec, same version: it stays failed.
    w.step();
    assert_eq!(w.phase("a"), UpgradePhase::Failed);
    // The channel names v3: a new attempt (given back, then admitted).
    let status = w.plan.status.clone().unwrap_or_default();
    w.plan.status = Some(UpgradePlanStatus {
        channel: Some(ChannelStatus {
            version: Some("v3".into()),
            ..answer
        }),
        ..status
    });
    w.step();
    w.step();
    let e = w.entry("a");
    assert_ne!(e.phase, UpgradePhase::Failed, "{e:?}");
    assert_eq!(e.version.as_deref(), Some("v3"));
    // Another URL: its answer is not this one's.
    w.plan.spec.channel = Some("https://update.example/channels/latest".into());
    assert_eq!(w.plan.target_version(), "");
}
