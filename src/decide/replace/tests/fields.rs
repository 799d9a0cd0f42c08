//! nodekeeper's rollout fields survive a write by Constellation's own
//! client (where-features-meet.md C1): recorded on the NodeVersion, read
//! back when a write lost them, and said so in the status.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn pool(name: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([("pool".to_string(), name.to_string())].into()),
        ..Default::default()
    }
}

/// What Constellation's CLI leaves after its GET and PUT: its own fields,
/// the metadata, and the API server's defaults for ours.
fn written_by_constellation(nv: &NodeVersion, image: &str) -> NodeVersion {
    let mut out = nv.clone();
    out.spec = NodeVersionSpec {
        image: Some(image.into()),
        image_version: nv.spec.image_version.clone(),
        kubernetes_components_reference: nv.spec.kubernetes_components_reference.clone(),
        kubernetes_cluster_version: nv.spec.kubernetes_cluster_version.clone(),
        max_node_budget: nv.spec.max_node_budget,
        ..NodeVersionSpec::default_rollout()
    };
    out
}

/// The record `reading` asks to write, applied as the API server would.
fn recorded(nv: &NodeVersion, reading: &Reading) -> NodeVersion {
    let Some(Effect::PatchObject { patch, .. }) = &reading.record else {
        panic!("no record write: {reading:?}");
    };
    let mut out = nv.clone();
    let value = &patch["metadata"]["annotations"][RECORD_ANNOTATION];
    let annotations = out
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match value.as_str() {
        Some(v) => annotations.insert(RECORD_ANNOTATION.into(), v.into()),
        None => annotations.remove(RECORD_ANNOTATION),
    };
    out
}

/// Nothing to write, nothing to say.
fn quiet(r: &Reading) -> bool {
    r.note.is_none() && r.record.is_none() && !r.hold
}

#[test]
fn a_write_that_drops_the_rollout_fields_leaves_the_pool_and_timeouts_governing() {
    let mut nv = nv("img-1", 2);
    nv.spec.node_selector = Some(pool("gpu"));
    nv.spec.drain_timeout_seconds = 600;
    // First read: the spec's fields are recorded before anything else.
    let (_, reading) = governing(&nv);
    let w = World {
        nv: nv.clone(),
        fields: reading.clone(),
        ..World::new("img-1", 2)
    };
    let plan = decide(&w.snap());
    assert_eq!(
        format!("{:?}", plan.effects),
        format!("{:?}", vec![reading.record.clone().unwrap()])
    );
    let nv = recorded(&nv, &reading);
    // Recorded: nothing more to write, nothing to say.
    assert!(quiet(&governing(&nv).1));
    // Constellation's CLI writes a new image: our fields are gone from
    // the spec, the recorded ones govern, and the status says so.
    let after = written_by_constellation(&nv, "img-2");
    assert_eq!(after.spec.node_selector, None);
    let (gov, reading) = governing(&after);
    assert_eq!(gov.spec.node_selector, Some(pool("gpu")));
    assert_eq!(gov.spec.max_surge, 2);
    assert_eq!(gov.spec.drain_timeout_seconds, 600);
    assert_eq!(gov.spec.image.as_deref(), Some("img-2"));
    assert!(
        reading.record.is_none(),
        "a loss is never recorded over the record"
    );
    let note = reading.note.clone().unwrap_or_default();
    for field in [
        "nodeSelector",
        "maxSurge",
        "drainTimeoutSeconds",
        RECORD_ANNOTATION,
    ] {
        assert!(note.contains(field), "{note}");
    }
    let w = World {
        nv: gov,
        fields: reading,
        ..World::new("img-2", 2)
    };
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() else {
        panic!("no status write: {:?}", plan.effects);
    };
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec lost")
    );
}

#[test]
fn a_person_who_edits_one_field_moves_the_record_and_one_who_deletes_it_drops_them() {
    let mut nv = nv("img-1", 1);
    nv.spec.node_selector = Some(pool("gpu"));
    let nv = recorded(&nv, &governing(&nv).1);
    // A person widens the pool and sets a timeout: the spec governs and
    // the record follows.
    let mut edited = nv.clone();
    edited.spec.node_selector = Some(pool("cpu"));
    edited.spec.join_timeout_seconds = 300;
    let (gov, reading) = governing(&edited);
    assert_eq!(gov.spec.node_selector, Some(pool("cpu")));
    assert!(reading.note.is_none());
    let edited = recorded(&edited, &reading);
    assert!(quiet(&governing(&edited).1));
    // The spec back at the defaults, and the annotation deleted: every
    // node, no record, nothing said.
    let mut plain = written_by_constellation(&edited, "img-1");
    plain.metadata.annotations = None;
    let (gov, reading) = governing(&plain);
    assert_eq!(gov.spec.node_selector, None);
    assert!(quiet(&reading));
}

#[test]
fn an_unreadable_record_with_an_empty_spec_governs_no_node_and_says_why() {
    let mut nv = nv("img-2", 1);
    nv.metadata.annotations =
        Some([(RECORD_ANNOTATION.to_string(), "{not json".to_string())].into());
    let (_, reading) = governing(&nv);
    assert!(reading.hold);
    let w = World {
        nodes: vec![],
        fields: reading,
        ..World::new("img-2", 1)
    };
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() else {
        panic!("no status write: {:?}", plan.effects);
    };
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains("governs none"), "{message}");
    assert!(!message.contains("selects no node"), "{message}");
    // With fields in the spec, the spec governs and the record is rewritten.
    let mut named = nv.clone();
    named.spec.node_selector = Some(pool("gpu"));
    let (gov, reading) = governing(&named);
    assert!(!reading.hold && reading.record.is_some());
    assert_eq!(gov.spec.node_selector, Some(pool("gpu")));
}
