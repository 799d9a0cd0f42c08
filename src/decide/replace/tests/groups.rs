//! ScalingGroups following the NodeVersion's image (`groups.rs`): a failed
//! image write backs off and is tried again.

use super::*;

/// A group's image whose setting failed is set again after the backoff: the
/// plan wakes then. It did not (no wake at all), and a rollout whose one
/// `set-scaling-group-image` timed out under load stalled for good (the
/// replace suite, `a_node_version_written_back_by_constellations_client…`).
#[test]
fn a_failed_group_image_write_is_retried_after_its_backoff() {
    let mut w = World::new("img-2", 1);
    w.nodes = vec![node("a", "g", "img-1", &[])];
    w.groups = vec![group("workers", "g", "Worker", "img-1")];
    w.facts.group_image.insert("g".into(), Ok("img-1".into()));
    w.failures.insert(
        "set-scaling-group-image/g".into(),
        Failure {
            message: "provider set-scaling-group-image: no answer within 3 s (killed)".into(),
            at: now(),
        },
    );
    // The group's status (outdated) and the NodeVersion's, as written.
    for _ in 0..3 {
        match decide(&w.snap()).effects.first() {
            Some(Effect::WriteObjectStatus {
                kind: Kind::ScalingGroup,
                status,
                ..
            }) => {
                let mut g = (*w.groups[0]).clone();
                g.status = serde_json::from_value(status.clone()).ok();
                w.groups[0] = Arc::new(g);
            }
            Some(Effect::WriteObjectStatus { status, .. }) => {
                w.nv.status = serde_json::from_value(status.clone()).ok();
            }
            _ => break,
        }
    }
    let plan = decide(&w.snap());
    assert!(
        !plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Provider { .. })),
        "{plan:?}"
    );
    assert!(
        matches!(plan.then, crate::decide::Then::Wait(Some(d)) if d <= PROVIDER_BACKOFF),
        "{:?}",
        plan.then
    );
    // Past the backoff, the image is set again.
    w.failures.clear();
    let plan = decide(&w.snap());
    assert!(
        plan.effects.iter().any(|e| matches!(
            e,
            Effect::Provider {
                verb: "set-scaling-group-image",
                ..
            }
        )),
        "{plan:?}"
    );
}
