//! ScalingGroups following their NodeVersion's image, pure: each group's
//! status from the provider's answer, its image set when it differs, and
//! when a failed setting is tried again.

use std::time::Duration;

use kube::ResourceExt;
use serde_json::json;

use super::{Kind, Snapshot, backing_off, eq, following};
use crate::api::constellation::*;
use crate::decide::{Effect, Plan, set_condition};

/// ScalingGroups following the NodeVersion: status from the provider's
/// answer, and the group's image set to the NodeVersion's when it differs.
pub fn scaling_groups(s: &Snapshot) -> Option<Plan> {
    let want = s.nv.spec.image.as_deref().filter(|i| !i.is_empty())?;
    for g in following(s) {
        let Some(id) = g.spec.group_id.as_deref() else {
            continue;
        };
        let Some(Ok(current)) = s.facts.group_image.get(&id.to_lowercase()) else {
            continue;
        };
        let same = eq(Some(current), Some(want));
        let mut status = g.status.clone().unwrap_or_default();
        status.image_reference = Some(current.clone());
        if same {
            set_condition(
                &mut status.conditions,
                s.now,
                CONDITION_OUTDATED,
                "False",
                "ScalingGroupNodeImageUpToDate",
                "Scaling group will use the latest image when creating new nodes",
            );
        } else {
            set_condition(
                &mut status.conditions,
                s.now,
                CONDITION_OUTDATED,
                "True",
                "ScalingGroupNodeImageOutOfDate",
                "Scaling group will not use the latest image when creating new nodes",
            );
        }
        if g.status.as_ref() != Some(&status) {
            return Some(Plan::steps(vec![Effect::WriteObjectStatus {
                kind: Kind::ScalingGroup,
                name: g.name_any(),
                resource_version: g.resource_version(),
                status: serde_json::to_value(&status).unwrap_or_default(),
            }]));
        }
        let key = image_key(id);
        if !same && backing_off(s, &key).is_none() {
            return Some(
                Plan::steps(vec![Effect::Provider {
                    key,
                    verb: "set-scaling-group-image",
                    request: json!({ "groupId": id, "image": want }),
                }])
                .info(format!(
                    "scaling group {}: image set to {want}",
                    g.name_any()
                )),
            );
        }
    }
    None
}

/// The provider write that sets a group's image (its failures and backoff).
fn image_key(group_id: &str) -> String {
    format!("set-scaling-group-image/{}", group_id.to_lowercase())
}

/// When a group's image, whose setting failed and is backing off, is to be
/// set again. [`scaling_groups`] skips such a group until then, and the
/// surge waits for its image: without this wake nothing looked again after
/// the backoff (the provider answers no event), and a rollout whose one
/// `set-scaling-group-image` timed out stalled until something unrelated
/// changed.
pub fn image_retry(s: &Snapshot) -> Option<Duration> {
    let want = s.nv.spec.image.as_deref().filter(|i| !i.is_empty())?;
    following(s)
        .filter_map(|g| {
            let id = g.spec.group_id.as_deref()?;
            let current = s.facts.group_image.get(&id.to_lowercase())?.as_ref().ok()?;
            (!eq(Some(current), Some(want))).then(|| backing_off(s, &image_key(id)))?
        })
        .min()
}
