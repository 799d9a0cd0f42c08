//! Marks a feature leaves on the nodes it works on, pure and level-
//! triggered: labels while it has a node and after it is done with it
//! (`nodeLabels`: kured's `--pre-reboot-node-labels` and
//! `--post-reboot-node-labels`, SUC's `postCompleteLabels`), and a soft
//! taint while a node waits its turn (`preferNoScheduleWhileWaiting`:
//! kured's `--prefer-no-schedule-taint`), so the scheduler moves new pods
//! elsewhere before the node is drained. Each pass compares what a node
//! carries with what its entry's phase wants and writes only a difference;
//! a failed write is simply seen again on the next pass.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use serde_json::{Value, json};

use super::Effect;
use crate::api::common::NodeLabels;

/// The soft taint's key; its value names the feature's object.
pub const WAITING_TAINT: &str = "nodekeeper.io/waiting";

/// Where a node stands for the marks: its entry's phase, reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Not (or no longer) wanted by the feature: no labels written, its
    /// soft taint removed.
    Untouched,
    /// Wanted, not taken yet.
    Waiting,
    /// Taken: in maintenance, rebooting or upgrading.
    Held,
    /// Done with, successfully.
    Done,
    /// Given back after a failure.
    Failed,
}

/// Label keys and values checked as the API server checks them, a value's
/// `{version}` filled with the version it will carry (`version`; a
/// RebootPolicy has none): one it refuses would fail every write of the
/// node's marks, so the plan is reported invalid before a node is taken.
/// k3s and RKE2 versions carry `+`, which no label value may.
pub fn check(marks: &NodeLabels, version: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (field, map) in [
        ("nodeLabels.during", &marks.during),
        ("nodeLabels.after", &marks.after),
    ] {
        for (k, v) in map {
            let filled = v.replace("{version}", version);
            if let Err(e) = super::selector::check_label_key(field, k)
                .and_then(|()| super::selector::check_label_value(field, k, &filled))
            {
                problems.push(e);
            }
        }
    }
    problems
}

/// The labels write `node` needs at `stage` (`None`: it carries them).
/// `{version}` in values is replaced by `version` (UpgradePlan).
pub fn labels(node: &Node, marks: &NodeLabels, stage: Stage, version: &str) -> Option<Effect> {
    if marks.during.is_empty() && marks.after.is_empty() {
        return None;
    }
    let value = |v: &String| v.replace("{version}", version);
    let mut want: BTreeMap<&str, Option<String>> = BTreeMap::new();
    match stage {
        Stage::Held => {
            for (k, v) in &marks.during {
                want.insert(k, Some(value(v)));
            }
        }
        Stage::Done => {
            for k in marks.during.keys() {
                want.insert(k, None);
            }
            for (k, v) in &marks.after {
                want.insert(k, Some(value(v)));
            }
        }
        Stage::Failed => {
            for k in marks.during.keys() {
                want.insert(k, None);
            }
        }
        Stage::Untouched | Stage::Waiting => return None,
    }
    let have = node.labels();
    let changes: serde_json::Map<String, Value> = want
        .into_iter()
        .filter(|(k, v)| have.get(*k) != v.as_ref())
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    (!changes.is_empty()).then(|| Effect::PatchNode {
        node: node.name_any(),
        // Keys of the object's own choosing; a merge of the labels map
        // loses no one else's.
        resource_version: None,
        patch: json!({"metadata": {"labels": changes}}),
    })
}

/// The taint write `node` needs: `PreferNoSchedule` `WAITING_TAINT=owner`
/// while it waits (when `wanted`), gone otherwise. The taints are a list:
/// the write replaces it whole, guarded by the node's resourceVersion.
pub fn waiting_taint(node: &Node, owner: &str, wanted: bool, stage: Stage) -> Option<Effect> {
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| t.key == WAITING_TAINT && t.value.as_deref() == Some(owner);
    let has = taints.iter().any(ours);
    let want = wanted && stage == Stage::Waiting;
    if has == want {
        return None;
    }
    let mut next: Vec<Taint> = taints.into_iter().filter(|t| !ours(t)).collect();
    if want {
        next.push(Taint {
            key: WAITING_TAINT.into(),
            value: Some(owner.into()),
            effect: "PreferNoSchedule".into(),
            time_added: None,
        });
    }
    Some(Effect::PatchNode {
        node: node.name_any(),
        resource_version: node.resource_version(),
        patch: json!({"spec": {"taints": next}}),
    })
}

/// What one object asks of the nodes it works on.
pub struct Marks<'a> {
    pub labels: &'a NodeLabels,
    /// `preferNoScheduleWhileWaiting`.
    pub soft_taint: bool,
    /// The feature, the soft taint's value: `reboot` or `upgrade`.
    pub feature: &'a str,
    /// What `{version}` in a label value becomes.
    pub version: &'a str,
}

/// The writes `node` needs at `stage`. The taint's is left to the next
/// pass when the plan already writes that node guarded (a second guarded
/// write in one plan would fail on the first's change).
pub fn marks(effects: &[Effect], node: &Node, m: &Marks, stage: Stage) -> Vec<Effect> {
    let n = node.name_any();
    let busy = effects.iter().any(
        |e| matches!(e, Effect::PatchNode { node, resource_version: Some(_), .. } if *node == n),
    );
    let mut out: Vec<Effect> = labels(node, m.labels, stage, m.version)
        .into_iter()
        .collect();
    if !busy {
        out.extend(waiting_taint(node, m.feature, m.soft_taint, stage));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
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

    #[test]
    fn labels_follow_the_stage_and_are_written_only_when_they_differ() {
        let plain = node(&[], vec![]);
        assert!(labels(&plain, &marks(), Stage::Waiting, "v2").is_none());
        assert_eq!(
            patch(labels(&plain, &marks(), Stage::Held, "v2")),
            json!({"metadata": {"labels": {"example.com/rebooting": "true"}}})
        );
        let during = node(&[("example.com/rebooting", "true")], vec![]);
        assert!(labels(&during, &marks(), Stage::Held, "v2").is_none());
        assert_eq!(
            patch(labels(&during, &marks(), Stage::Done, "v2")),
            json!({"metadata": {"labels": {"example.com/rebooting": null, "example.com/os": "v2"}}})
        );
        let after = node(&[("example.com/os", "v2")], vec![]);
        assert!(labels(&after, &marks(), Stage::Done, "v2").is_none());
        assert_eq!(
            patch(labels(&during, &marks(), Stage::Failed, "v2")),
            json!({"metadata": {"labels": {"example.com/rebooting": null}}})
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
        let p = patch(waiting_taint(&n, "reboot", true, Stage::Waiting));
        assert_eq!(p["spec"]["taints"][0]["key"], "dedicated");
        assert_eq!(p["spec"]["taints"][1]["effect"], "PreferNoSchedule");
        assert!(waiting_taint(&n, "reboot", true, Stage::Held).is_none());
        assert!(waiting_taint(&n, "reboot", false, Stage::Waiting).is_none());
        let tainted: Vec<Taint> =
            serde_json::from_value(p["spec"]["taints"].clone()).unwrap_or_default();
        let t = node(&[], tainted);
        assert!(waiting_taint(&t, "reboot", true, Stage::Waiting).is_none());
        let gone = patch(waiting_taint(&t, "reboot", true, Stage::Held));
        assert_eq!(gone["spec"]["taints"], json!([other]));
    }
}
