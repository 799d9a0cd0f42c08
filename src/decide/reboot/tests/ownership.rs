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
