//! Unit tests of `marking`.

use super::*;
use crate::api::node::NodeSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn node(labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("a".into()),
            resource_version: Some("5".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(taints),
            ..Default::default()
        }),
        status: None,
    }
}

fn marks() -> NodeLabels {
    NodeLabels {
        during: [("example.com/rebooting".to_string(), "true".to_string())].into(),
        after: [("example.com/os".to_string(), "{version}".to_string())].into(),
    }
}

fn patch(e: Option<Effect>) -> Value {
    match e {
        Some(Effect::PatchNode { patch, .. }) => patch,
        other => panic!("expected a patch, got {other:?}"),
    }
}

const ME: &str = "RebootPolicy/p";

/// Apply a patch to a node as the API server's merge patch would.
fn applied(n: &Node, e: Option<Effect>) -> Node {
    let mut v = serde_json::to_value(n).unwrap_or_default();
    crate::decide::reboot::tests::world_tools::merge(&mut v, &patch(e));
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn labels_follow_the_stage_and_are_written_only_when_they_differ() {
    let plain = node(&[], vec![]);
    assert!(labels(&plain, &marks(), Stage::Waiting, "v2", ME).is_none());
    let held = labels(&plain, &marks(), Stage::Held, "v2", ME);
    assert_eq!(
        patch(held.clone())["metadata"]["labels"],
        json!({"example.com/rebooting": "true"})
    );
    let during = applied(&plain, held);
    assert_eq!(owner_of(&during, "example.com/rebooting"), Some(ME));
    assert!(labels(&during, &marks(), Stage::Held, "v2", ME).is_none());
    let done = labels(&during, &marks(), Stage::Done, "v2", ME);
    assert_eq!(
        patch(done.clone())["metadata"]["labels"],
        json!({"example.com/rebooting": null, "example.com/os": "v2"})
    );
    let after = applied(&during, done);
    assert_eq!(owner_of(&after, "example.com/rebooting"), None);
    assert!(labels(&after, &marks(), Stage::Done, "v2", ME).is_none());
    assert_eq!(
        patch(labels(&during, &marks(), Stage::Failed, "v2", ME))["metadata"]["labels"],
        json!({"example.com/rebooting": null})
    );
}

/// where-features-meet.md, finding 2: a RebootPolicy holding a node
/// and an UpgradePlan done with it, one `during` key: the holder owns
/// it, the other leaves it alone; no write at all once it is there.
#[test]
fn two_objects_asking_for_one_key_never_fight_over_it() {
    let plan = "UpgradePlan/u";
    let held = applied(
        &node(&[], vec![]),
        labels(&node(&[], vec![]), &marks(), Stage::Held, "", ME),
    );
    assert!(
        labels(&held, &marks(), Stage::Done, "v2", plan).is_some_and(|e| {
            // Only its own `after` key, never the held one.
            patch(Some(e))["metadata"]["labels"] == json!({"example.com/os": "v2"})
        })
    );
    let both = applied(&held, labels(&held, &marks(), Stage::Done, "v2", plan));
    assert!(labels(&both, &marks(), Stage::Done, "v2", plan).is_none());
    assert!(labels(&both, &marks(), Stage::Held, "", ME).is_none());
    assert_eq!(
        both.labels()
            .get("example.com/rebooting")
            .map(String::as_str),
        Some("true")
    );
}

/// kured's common use of `--pre-reboot-node-labels` and
/// `--post-reboot-node-labels`: one key, flipped (`k=false` before the
/// drain, `k=true` after the uncordon; `cmd/kured/main.go` `drain` and
/// `uncordon`). The same key in `during` and `after` goes from one
/// value to the other in one write, never removed in between.
#[test]
fn one_key_in_during_and_after_flips_as_kureds_labels_do() {
    let m = NodeLabels {
        during: [("example.com/ok".to_string(), "false".to_string())].into(),
        after: [("example.com/ok".to_string(), "true".to_string())].into(),
    };
    let plain = node(&[], vec![]);
    let held = applied(&plain, labels(&plain, &m, Stage::Held, "", ME));
    assert_eq!(
        held.labels().get("example.com/ok").map(String::as_str),
        Some("false")
    );
    let done = labels(&held, &m, Stage::Done, "", ME);
    assert_eq!(
        patch(done.clone())["metadata"]["labels"],
        json!({"example.com/ok": "true"})
    );
    let after = applied(&held, done);
    assert!(labels(&after, &m, Stage::Done, "", ME).is_none());
}

/// Design 2 of the issue: the object that does not own a key it asks
/// for says so (`MarksWithheld`, `MarkOwnedBy`), and stops saying so
/// once the key is free.
#[test]
fn a_withheld_mark_is_said_and_the_saying_goes_with_it() {
    let plain = node(&[], vec![]);
    let held = applied(&plain, labels(&plain, &marks(), Stage::Held, "", ME));
    let m = |owner| Marks {
        labels: Box::leak(Box::new(marks())),
        soft_taint: false,
        feature: "upgrade",
        version: "v2",
        owner,
    };
    let theirs = withheld(&held, &m("UpgradePlan/u"), Stage::Held);
    assert_eq!(
        theirs,
        ["node a: label example.com/rebooting is RebootPolicy/p's"]
    );
    assert!(withheld(&held, &m(ME), Stage::Held).is_empty());
    assert!(withheld(&held, &m("UpgradePlan/u"), Stage::Waiting).is_empty());
    let mut conds = None;
    report(
        &mut conds,
        "2026-11-22T12:00:00Z".parse().unwrap_or_default(),
        &theirs,
    );
    let c = conds
        .as_ref()
        .and_then(|c| c.first())
        .cloned()
        .unwrap_or_else(|| panic!("no condition: {conds:?}"));
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (WITHHELD, "True", "MarkOwnedBy")
    );
    assert!(c.message.contains("RebootPolicy/p's"), "{}", c.message);
    report(
        &mut conds,
        "2026-11-22T12:00:00Z".parse().unwrap_or_default(),
        &[],
    );
    assert_eq!(conds, Some(vec![]));
    let mut none = None;
    report(
        &mut none,
        "2026-11-22T12:00:00Z".parse().unwrap_or_default(),
        &[],
    );
    assert_eq!(none, None, "no conditions written where there were none");
}

/// where-features-meet.md, finding 6: the owner is gone (or no longer
/// governs the node): its `during` labels and soft taint go, its
/// `after` labels stay, and then nothing more is written.
#[test]
fn marks_of_an_owner_that_no_longer_governs_the_node_are_removed_once() {
    let plain = node(&[], vec![]);
    let waiting = applied(
        &plain,
        waiting_taint(&plain, "reboot", true, Stage::Waiting, ME),
    );
    assert_eq!(owner_of(&waiting, "taint:reboot"), Some(ME));
    let held = applied(&waiting, labels(&waiting, &marks(), Stage::Held, "", ME));
    assert!(
        orphaned(&held, "RebootPolicy", Some(ME)).is_none(),
        "still governs"
    );
    assert!(
        orphaned(&held, "UpgradePlan", None).is_none(),
        "another kind's"
    );
    let gone = orphaned(&held, "RebootPolicy", None);
    let p = patch(gone.clone());
    assert_eq!(
        p["metadata"]["labels"],
        json!({"example.com/rebooting": null})
    );
    assert_eq!(p["spec"]["taints"], json!([]));
    let clean = applied(&held, gone);
    assert!(orphaned(&clean, "RebootPolicy", None).is_none());
    assert!(
        clean
            .annotations()
            .keys()
            .all(|k| !k.starts_with(OWNER_PREFIX))
    );
}

#[test]
fn the_soft_taint_is_there_only_while_the_node_waits_and_keeps_others() {
    let other = Taint {
        key: "dedicated".into(),
        value: Some("db".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let n = node(&[], vec![other.clone()]);
    let p = patch(waiting_taint(&n, "reboot", true, Stage::Waiting, ME));
    assert_eq!(p["spec"]["taints"][0]["key"], "dedicated");
    assert_eq!(p["spec"]["taints"][1]["effect"], "PreferNoSchedule");
    assert!(waiting_taint(&n, "reboot", true, Stage::Held, ME).is_none());
    assert!(waiting_taint(&n, "reboot", false, Stage::Waiting, ME).is_none());
    let t = applied(
        &n,
        Some(Effect::PatchNode {
            node: "a".into(),
            resource_version: None,
            patch: json!({"spec": {"taints": p["spec"]["taints"].clone()}, "metadata": p["metadata"].clone()}),
        }),
    );
    assert!(waiting_taint(&t, "reboot", true, Stage::Waiting, ME).is_none());
    let gone = patch(waiting_taint(&t, "reboot", true, Stage::Held, ME));
    assert_eq!(gone["spec"]["taints"], json!([other]));
}
