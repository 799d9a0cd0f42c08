//! Karpenter's `karpenter.sh/do-not-disrupt: "true"` on an outdated node:
//! no surge node is asked for it, a joined node does not pair with it, a
//! paired donor is not drained, and the Outdated condition names it.

use super::*;

const OPTED_OUT: (&str, &str) = (crate::decide::do_not_disrupt::ANNOTATION, "true");

#[test]
fn an_opted_out_node_gets_no_surge_node() {
    let mut w = World::new("img-2", 2);
    w.nodes = vec![
        node("a", "g", "img-1", &[OPTED_OUT]),
        node("b", "g", "img-1", &[]),
    ];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.settle_status();
    let plan = decide(&w.snap());
    let Some(Effect::PatchObject { patch, .. }) = plan.effects.first() else {
        panic!("{plan:?}");
    };
    let reqs = patch["metadata"]["annotations"][SURGE_REQUESTS_ANNOTATION]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        reqs.split(',').count(),
        1,
        "one surge node, for b only: {reqs}"
    );
    let st = w.nv.status.as_ref().expect("status");
    let outdated = st.conditions.iter().find(|c| c.type_ == CONDITION_OUTDATED);
    let msg = outdated.map(|c| c.message.as_str()).unwrap_or_default();
    assert_eq!(
        msg,
        "Some node versions are out of date; not replaced while karpenter.sh/do-not-disrupt is on node a"
    );
}

#[test]
fn a_joined_node_does_not_pair_with_an_opted_out_node() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("a-old", "g", "img-1", &[OPTED_OUT]),
        node("b-old", "g", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.settle_status();
    let plan = decide(&w.snap());
    let donors: Vec<String> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::PatchNode { node, patch, .. } if node == "new" => {
                patch["metadata"]["annotations"][DONOR_ANNOTATION]
                    .as_str()
                    .map(str::to_string)
            }
            _ => None,
        })
        .collect();
    assert_eq!(donors, ["b-old"]);
}

#[test]
fn a_paired_donor_is_not_drained_while_opted_out() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new"), OPTED_OUT]),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        !plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::CreateMaintenance { .. })),
        "drained under do-not-disrupt: {plan:?}"
    );
    // Once it is removed, the donor is drained.
    w.nodes[0] = node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")]);
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::CreateMaintenance { nm } if nm.spec.node_name == "old")),
        "{plan:?}"
    );
}
