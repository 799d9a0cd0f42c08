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

/// The rollout fields a NodeVersion governs with, as one comparable value.
type Rollout = (Option<LabelSelector>, i32, i64, i64, i64);

fn rollout(spec: &NodeVersionSpec) -> Rollout {
    (
        spec.node_selector.clone(),
        spec.max_surge,
        spec.join_timeout_seconds,
        spec.leave_timeout_seconds,
        spec.drain_timeout_seconds,
    )
}

/// The record annotation's fields, read by the test itself (JSON, each
/// absent field at its default).
fn record_of(nv: &NodeVersion) -> Option<Rollout> {
    let raw = nv.annotations().get(RECORD_ANNOTATION)?;
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    let d = NodeVersionSpec::default_rollout();
    let int = |k: &str, d: i64| v[k].as_i64().unwrap_or(d);
    Some((
        serde_json::from_value(v["nodeSelector"].clone()).ok(),
        int("maxSurge", d.max_surge.into()) as i32,
        int("joinTimeoutSeconds", d.join_timeout_seconds),
        int("leaveTimeoutSeconds", d.leave_timeout_seconds),
        int("drainTimeoutSeconds", d.drain_timeout_seconds),
    ))
}

/// Random worlds of people and a peer's client around one NodeVersion:
/// a person edits some of nodekeeper's fields (keeping the others, as the
/// README says), clears them all (the defaults, and the annotation
/// deleted), or writes a broken annotation; Constellation's CLI writes a
/// new image back without our fields; the cluster role reads a fresh or a
/// stale copy and writes its record guarded by the resourceVersion, the
/// write refused or answered-lost now and then. Invariants after every
/// pass, on the stored object: a spec that carries our fields governs; a
/// spec that lost them is governed by the stored record and the status
/// says so (never every node, never silently); a broken record with an
/// empty spec holds the NodeVersion; and a fresh pass over an unchanged
/// object writes nothing (no flip-flop).
#[test]
fn random_worlds_of_people_and_constellations_client_keep_the_rollout_fields() {
    use crate::decide::reboot::tests::world_tools::{Rng, replaying, world_seeds};
    let pools = ["gpu", "cpu", "edge"];
    for seed in world_seeds(500) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut rv = 7u64;
        let mut stored = nv("img-0", 1);
        let mut stale = stored.clone();
        // The resourceVersion a fresh pass left with nothing more to write.
        let mut settled: Option<String> = None;
        // The fields the last stored record write carried.
        let mut written: Option<Rollout> = None;
        let mut trace: Vec<String> = Vec::new();
        let mut world = (&mut trace, 0usize);
        replaying(
            seed,
            &mut world,
            |w| w.0,
            12,
            |w| {
                let trace = &mut *w.0;
                for step in 0..60 {
                    let before = stored.clone();
                    let mut bump = |nv: &mut NodeVersion| {
                        rv += 1;
                        nv.metadata.resource_version = Some(rv.to_string());
                    };
                    match rng.below(10) {
                        // A person edits one to three fields, keeping the rest.
                        0 | 1 => {
                            for _ in 0..1 + rng.below(3) {
                                let s = &mut stored.spec;
                                match rng.below(4) {
                                    0 => {
                                        let p = pools[rng.below(3) as usize];
                                        s.node_selector = Some(pool(p));
                                    }
                                    1 => s.max_surge = 1 + rng.below(4) as i32,
                                    2 => s.drain_timeout_seconds = 60 * (1 + rng.below(30) as i64),
                                    _ => s.join_timeout_seconds = 60 * (1 + rng.below(30) as i64),
                                }
                            }
                            bump(&mut stored);
                            trace.push(format!(
                                "{step}: a person edits: {:?}",
                                rollout(&stored.spec)
                            ));
                        }
                        // A person clears them, as the README says: the
                        // defaults, and the record deleted.
                        2 if rng.chance(30) => {
                            let image = stored.spec.image.clone().unwrap_or_default();
                            stored = written_by_constellation(&stored, &image);
                            if let Some(a) = stored.metadata.annotations.as_mut() {
                                a.remove(RECORD_ANNOTATION);
                            }
                            bump(&mut stored);
                            trace.push(format!("{step}: a person clears the fields"));
                            written = None;
                        }
                        // Constellation's CLI: GET, a new image, PUT.
                        3 | 4 => {
                            let image = format!("img-{step}");
                            stored = written_by_constellation(&stored, &image);
                            bump(&mut stored);
                            trace.push(format!("{step}: Constellation writes {image}"));
                        }
                        // Now and then a broken annotation.
                        5 if rng.chance(10) => {
                            stored
                                .metadata
                                .annotations
                                .get_or_insert_with(Default::default)
                                .insert(RECORD_ANNOTATION.into(), "{broken".into());
                            bump(&mut stored);
                            trace.push(format!("{step}: a person breaks the record"));
                        }
                        _ => {}
                    }
                    // The cluster role's pass, on a fresh or a stale copy.
                    let read = if rng.chance(15) {
                        stale.clone()
                    } else {
                        stored.clone()
                    };
                    let (_, reading) = governing(&read);
                    if read.resource_version() == stored.resource_version()
                        && reading.record.is_none()
                    {
                        settled = stored.resource_version();
                    }
                    if let Some(Effect::PatchObject { patch, .. }) = &reading.record {
                        // The API server's guard: the write names the
                        // resourceVersion it read (none: unguarded).
                        let guard = patch["metadata"]["resourceVersion"].as_str();
                        let fresh =
                            guard.is_none_or(|g| Some(g.to_string()) == stored.resource_version());
                        let fault = rng.below(10);
                        if fresh && fault != 0 {
                            stored = recorded(&stored, &reading);
                            bump(&mut stored);
                            settled = stored.resource_version();
                            written = record_of(&stored);
                        }
                        trace.push(format!(
                            "{step}: record write on a {} copy: {}",
                            if fresh { "fresh" } else { "stale" },
                            if !fresh {
                                "refused (409)"
                            } else if fault == 0 {
                                "failed"
                            } else {
                                "stored"
                            }
                        ));
                    }
                    // The invariants, on what is stored now.
                    let (gov, reading) = governing(&stored);
                    let spec = rollout(&stored.spec);
                    let empty = spec == rollout(&NodeVersionSpec::default_rollout());
                    let raw = stored.annotations().get(RECORD_ANNOTATION).cloned();
                    if !empty {
                        assert_eq!(rollout(&gov.spec), spec, "the spec's own fields govern");
                        assert!(!reading.hold && reading.note.is_none(), "{reading:?}");
                    } else if let Some(rec) = record_of(&stored) {
                        assert_eq!(
                            rollout(&gov.spec),
                            rec,
                            "the record governs a spec that lost it"
                        );
                        assert_eq!(
                            Some(&rec),
                            written.as_ref(),
                            "the record is the last one written"
                        );
                        if rec != spec {
                            assert!(reading.note.is_some(), "a loss said nowhere: {rec:?}");
                        }
                    } else if raw.is_some() {
                        assert!(reading.hold && reading.note.is_some(), "{reading:?}");
                    } else {
                        assert!(quiet(&reading), "no fields, no record: {reading:?}");
                    }
                    // Unchanged since a fresh pass stored its record (or had
                    // none to write): nothing more to write.
                    if stored.resource_version() == settled {
                        assert!(reading.record.is_none(), "a write in an unchanged world");
                    }
                    stale = before;
                }
            },
        );
    }
}
