//! Karpenter's `karpenter.sh/do-not-disrupt: "true"` on an outdated node:
//! no surge node is asked for it, a joined node does not pair with it, a
//! paired donor is not drained, and the Outdated condition names it. On a
//! pod of an outdated node: no surge node is asked for it (its pods read
//! only as far as the budget needs), a joined node pairs with another, or waits
//! unpaired (never obsolete, which would only ask for another), and a
//! paired donor is not drained while it holds.

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
    assert_eq!(
        outdated_says(&w),
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
    assert_eq!(donors_named(&decide(&w.snap())), ["b-old"]);
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

/// Node `node`'s pods, as the service reads them: one pod that opts out.
fn pods_opting_out(node: &'static str) -> NodePods {
    Box::new(move |n: &str| {
        Some(if n == node {
            vec![crate::decide::do_not_disrupt::tests::opted_out_pod(
                "db-0", n, "true", "Running", None,
            )]
        } else {
            Vec::new()
        })
    })
}

fn donors_named(plan: &Plan) -> Vec<String> {
    plan.effects
        .iter()
        .filter_map(|e| match e {
            Effect::PatchNode { node, patch, .. } if node == "new" => {
                patch["metadata"]["annotations"][DONOR_ANNOTATION]
                    .as_str()
                    .map(str::to_string)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_joined_node_pairs_past_a_node_whose_pod_opts_out_or_waits_unpaired() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("a-old", "g", "img-1", &[]),
        node("b-old", "g", "img-1", &[]),
        node("new", "g", "img-2", &[]),
    ];
    w.pending = vec![pending("new", "g", "Join", "Ready")];
    w.node_pods = pods_opting_out("a-old");
    w.settle_status();
    assert_eq!(donors_named(&decide(&w.snap())), ["b-old"]);
    // The only outdated node's pod opts out: the new node waits, neither
    // paired nor obsolete.
    w.nodes.remove(1);
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(donors_named(&plan).is_empty(), "{plan:?}");
    assert!(
        !plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::PatchNode { patch, .. }
            if patch["metadata"]["annotations"].get(OBSOLETE_ANNOTATION).is_some())),
        "called obsolete: {plan:?}"
    );
    // Pods not read yet: the same wait.
    w.node_pods = Box::new(|_| None);
    assert!(donors_named(&decide(&w.snap())).is_empty());
}

#[test]
fn a_paired_donor_is_not_drained_while_its_pod_opts_out() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![
        node("old", "g", "img-1", &[(HEIR_ANNOTATION, "new")]),
        node("new", "g", "img-2", &[(DONOR_ANNOTATION, "old")]),
    ];
    w.node_pods = pods_opting_out("old");
    w.settle_status();
    let drains = |plan: &Plan| {
        plan.effects
            .iter()
            .any(|e| matches!(e, Effect::CreateMaintenance { nm } if nm.spec.node_name == "old"))
    };
    let plan = decide(&w.snap());
    assert!(!drains(&plan), "drained under do-not-disrupt: {plan:?}");
    assert_eq!(
        outdated_says(&w),
        "Some node versions are out of date; not replaced while node old: pod prod/db-0 has karpenter.sh/do-not-disrupt=true"
    );
    // Taken off: the status says so first, then the donor is drained.
    w.node_pods = Box::new(|_| Some(Vec::new()));
    w.settle_status();
    assert_eq!(outdated_says(&w), "Some node versions are out of date");
    assert!(drains(&decide(&w.snap())));
}

/// The Outdated condition's message in the stored status.
fn outdated_says(w: &World) -> String {
    let st = w.nv.status.as_ref().expect("status");
    let c = st.conditions.iter().find(|c| c.type_ == CONDITION_OUTDATED);
    c.map(|c| c.message.clone()).unwrap_or_default()
}

/// The surge requests a plan records, if it records any.
fn requests_recorded(plan: &Plan) -> Vec<String> {
    plan.effects
        .iter()
        .filter_map(|e| match e {
            Effect::PatchObject { patch, .. } => patch["metadata"]["annotations"]
                [SURGE_REQUESTS_ANNOTATION]
                .as_str()
                .map(|r| r.split(',').map(str::to_string).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_node_whose_pod_opts_out_gets_no_surge_node() {
    let mut w = World::new("img-2", 2);
    w.nodes = vec![node("a", "g", "img-1", &[]), node("b", "g", "img-1", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    w.node_pods = pods_opting_out("a");
    w.settle_status();
    let plan = decide(&w.snap());
    assert_eq!(requests_recorded(&plan).len(), 1, "for b only: {plan:?}");
    // Its only outdated node held: nothing asked, looked at again, and
    // the Outdated condition says why.
    w.nodes.remove(1);
    w.settle_status();
    let plan = decide(&w.snap());
    assert!(requests_recorded(&plan).is_empty(), "{plan:?}");
    assert_eq!(
        outdated_says(&w),
        "Some node versions are out of date; not replaced while node a: pod prod/db-0 has karpenter.sh/do-not-disrupt=true"
    );
    assert!(
        matches!(plan.then, crate::decide::Then::Wait(Some(d)) if d <= Duration::from_secs(30)),
        "{plan:?}"
    );
    // Pods not read yet: nothing asked either (the service reads them and
    // decides again).
    w.node_pods = Box::new(|_| None);
    assert!(requests_recorded(&decide(&w.snap())).is_empty());
    // Taken off: the status says so first, then the surge node is asked
    // for.
    w.node_pods = Box::new(|_| Some(Vec::new()));
    w.settle_status();
    assert_eq!(outdated_says(&w), "Some node versions are out of date");
    assert_eq!(requests_recorded(&decide(&w.snap())).len(), 1);
}

#[test]
fn pods_are_read_only_as_far_as_the_budget_needs() {
    let mut w = World::new("img-2", 2);
    w.nodes = (0..20)
        .map(|i| node(&format!("n{i:02}"), "g", "img-1", &[]))
        .collect();
    w.groups = vec![group("workers", "g", "Worker", "img-2")];
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = asked.clone();
    w.node_pods = Box::new(move |n: &str| {
        log.lock().map(|mut l| l.push(n.to_string())).ok();
        Some(if n == "n00" {
            vec![crate::decide::do_not_disrupt::tests::opted_out_pod(
                "db-0", n, "true", "Running", None,
            )]
        } else {
            Vec::new()
        })
    });
    w.settle_status();
    if let Ok(mut l) = asked.lock() {
        l.clear();
    }
    let plan = decide(&w.snap());
    assert_eq!(requests_recorded(&plan).len(), 2, "{plan:?}");
    let asked = asked.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(asked, ["n00", "n01", "n02"], "one held, two free");
}
