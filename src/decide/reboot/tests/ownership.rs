//! One owner per node among RebootPolicies: of the policies selecting a
//! node, the oldest governs it; the others report `OtherPolicy` with its
//! name and never admit it, not even after its reboot failed in this boot.

use super::*;

/// A policy named `name`, created `minutes` after a fixed time.
fn named(name: &str, minutes: i64) -> RebootPolicy {
    let mut p = policy(1);
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.creation_timestamp = Some(Time(
        now()
            .checked_add(SignedDuration::from_mins(minutes - 600))
            .unwrap_or_default(),
    ));
    p
}

#[test]
fn overlapping_policies_leave_a_node_to_the_oldest() {
    let (a, b, c) = (named("zeta", 0), named("alpha", 5), named("mid", 10));
    let n = node("n1", "boot-1");
    for (me, others) in [(&a, [&b, &c]), (&b, [&a, &c]), (&c, [&a, &b])] {
        let mut w = World::new(me.clone(), vec![n.clone()]);
        w.others = others.iter().map(|p| Arc::new((*p).clone())).collect();
        let plan = w.plan();
        let (phase, msg) = phase_of(&status_of(&plan), "n1");
        if me.name_any() == "zeta" {
            assert_eq!(created(&plan), vec!["n1".to_string()], "the oldest admits");
        } else {
            assert!(created(&plan).is_empty(), "{} admitted too", me.name_any());
            assert_eq!(phase, RebootPhase::Waiting);
            assert!(msg.contains("RebootPolicy zeta"), "{msg}");
            let st = status_of(&plan);
            let e = st.nodes.iter().find(|e| e.name == "n1");
            assert_eq!(e.and_then(|e| e.reason.as_deref()), Some(WAIT_OTHER_POLICY));
        }
    }
}

#[test]
fn a_reboot_that_failed_under_the_governing_policy_is_not_tried_by_another() {
    // zeta governs; its reboot of n1 failed in this boot and it gave the
    // node back (no NodeMaintenance left).
    let failed = entry("n1", RebootPhase::Failed, "boot-1", now());
    let zeta = with_entry(named("zeta", 0), failed);
    let mut w = World::new(named("alpha", 5), vec![node("n1", "boot-1")]);
    w.others = vec![Arc::new(zeta)];
    let plan = w.plan();
    assert!(
        created(&plan).is_empty(),
        "drained again under another policy"
    );
    assert_eq!(phase_of(&status_of(&plan), "n1").0, RebootPhase::Waiting);
}

#[test]
fn a_policy_with_a_broken_selector_governs_nothing() {
    // The older policy's selector cannot be used: it selects no node, so
    // the younger one reboots the node instead of waiting on it for ever.
    let mut broken = named("old", 0);
    broken.spec.node_selector = Some(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "role".into(),
                operator: "Bogus".into(),
                values: None,
            },
        ]),
        ..Default::default()
    });
    let mut w = World::new(named("young", 5), vec![node("n1", "boot-1")]);
    w.others = vec![Arc::new(broken)];
    assert_eq!(created(&w.plan()), vec!["n1".to_string()]);
}

/// `node` with the label `pool`.
fn in_pool(mut n: Node, pool: &str) -> Node {
    n.metadata
        .labels
        .get_or_insert_default()
        .insert("pool".into(), pool.into());
    n
}

/// A policy over `pool=a` only.
fn over_pool_a(p: RebootPolicy) -> RebootPolicy {
    let mut p = p;
    p.spec.node_selector = Some(LabelSelector {
        match_labels: Some([("pool".to_string(), "a".to_string())].into()),
        ..Default::default()
    });
    p
}

/// A node a person relabels out of the policy's selector while it drains
/// is still followed, listed and given back by the policy. (It dropped out
/// of the status and its NodeMaintenance held it cordoned for ever: found
/// by the random worlds once people relabel nodes.)
#[test]
fn a_node_relabelled_out_of_the_selector_mid_reboot_is_followed_to_its_end() {
    let p = over_pool_a(policy(1));
    let draining = entry("n1", RebootPhase::Draining, "boot-1", now());
    let p = with_entry(p, draining);
    let n = in_pool(node("n1", "boot-1"), "b");
    let mut w = World::new(p.clone(), vec![n.clone()]);
    w.nms = vec![Arc::new(ours(&p, &n, "boot-1", Some(Phase::Running)))];
    let plan = w.plan();
    let st = plan
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::WritePolicyStatus { status, .. } => Some((**status).clone()),
            _ => None,
        })
        .unwrap_or_else(|| p.status.clone().unwrap_or_default());
    assert_eq!(phase_of(&st, "n1").0, RebootPhase::Draining, "{st:?}");
    assert!(created(&plan).is_empty(), "never admitted again");
}

/// An admission recorded but not carried out (its create was lost) on a
/// node an older policy selects since a relabel is withdrawn: the node is
/// the older policy's to reboot, never taken by this one.
#[test]
fn an_admission_not_carried_out_is_withdrawn_when_an_older_policy_governs_the_node() {
    let young = with_entry(
        named("young", 5),
        entry("n1", RebootPhase::Draining, "boot-1", now()),
    );
    let older = over_pool_a(named("older", 0));
    let mut w = World::new(young, vec![in_pool(node("n1", "boot-1"), "a")]);
    w.others = vec![Arc::new(older)];
    let plan = w.plan();
    assert!(created(&plan).is_empty(), "taken by the younger policy");
    let st = status_of(&plan);
    let (phase, msg) = phase_of(&st, "n1");
    assert_eq!(phase, RebootPhase::Waiting);
    assert!(msg.contains("RebootPolicy older"), "{msg}");
}

/// A reboot issued for a need in an earlier boot served that need, under
/// whichever policy: a node relabelled from one policy to another after
/// its command failed and its host rebooted anyway is not rebooted again
/// for the same need (its need is cleared instead). Found by the random
/// worlds.
#[test]
fn a_need_whose_reboot_was_issued_in_an_earlier_boot_is_served_under_any_policy() {
    let stamp = "2026-11-23T11:00:00Z";
    let n = annotate(node("n1", "boot-2"), NEEDED_ANNOTATION, stamp);
    let n = annotate(n, ISSUED_ANNOTATION, &format!("boot-1@need={stamp}"));
    assert!(crate::decide::reboot::need_outlived(&n));
    let plan = World::new(policy(1), vec![n.clone()]).plan();
    assert!(
        created(&plan).is_empty(),
        "rebooted again for a served need"
    );
    let cleared = plan.effects.iter().any(|e| {
        matches!(e, Effect::PatchNode { node, patch, .. }
            if node == "n1" && patch["metadata"]["annotations"].get(NEEDED_ANNOTATION).is_some_and(serde_json::Value::is_null))
    });
    assert!(cleared, "{:?}", plan.effects);
    // In the boot the command was issued in, it is not served.
    let same_boot = annotate(node("n1", "boot-1"), NEEDED_ANNOTATION, stamp);
    let same_boot = annotate(
        same_boot,
        ISSUED_ANNOTATION,
        &format!("boot-1@need={stamp}"),
    );
    assert!(!crate::decide::reboot::need_outlived(&same_boot));
    // A literal written again after the reboot is a new ask, not this one.
    let again = annotate(node("n1", "boot-2"), NEEDED_ANNOTATION, "now");
    let again = annotate(again, ISSUED_ANNOTATION, "boot-1@need=now");
    assert!(!crate::decide::reboot::need_outlived(&again));
}
