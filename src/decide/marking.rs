//! Marks a feature leaves on the nodes it works on, pure and level-
//! triggered: labels while it has a node and after it is done with it
//! (`nodeLabels`: kured's `--pre-reboot-node-labels` and
//! `--post-reboot-node-labels`, SUC's `postCompleteLabels`), and a soft
//! taint while a node waits its turn (`preferNoScheduleWhileWaiting`:
//! kured's `--prefer-no-schedule-taint`), so the scheduler moves new pods
//! elsewhere before the node is drained. Each pass compares what a node
//! carries with what its entry's phase wants and writes only a difference;
//! a failed write is simply seen again on the next pass.
//!
//! **A mark has one owner.** Each label key and soft taint a feature
//! writes is recorded on the node as owned by its object
//! (`marks.nodekeeper.io/<hash>: "<Kind>/<name> <role> <mark>"`, as the
//! cordon's owner is recorded): an object never writes or removes a key
//! another object owns — a RebootPolicy and an UpgradePlan with the same
//! `nodeLabels` key no longer fight over it (1 447–2 517 node updates in
//! 20 s, where-features-meet.md finding 2) — and a mark whose owner is
//! gone or no longer governs the node is removed by [`orphaned`], level-
//! triggered like the give-back of its NodeMaintenance (finding 6: the
//! soft taint outlived its deleted policy). `after` labels are a result,
//! not a hold: their record goes with the owner, the label stays.

use std::collections::BTreeMap;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::Taint;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::Effect;
use crate::api::common::NodeLabels;
use crate::decide::maintenance::annotation;

/// The prefix of the annotations that record who owns a mark.
pub const OWNER_PREFIX: &str = "marks.nodekeeper.io/";

/// The annotation recording the owner of `mark` (a label key, or
/// `taint:<feature>`): a hash keeps any label key a valid annotation name.
pub fn owner_key(mark: &str) -> String {
    // FNV-1a, 64 bits: stable across builds and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in mark.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{OWNER_PREFIX}{h:016x}")
}

/// What a record says: owner, role (`during`, `after`, `taint`), mark.
fn record_of(value: &str) -> Option<(&str, &str, &str)> {
    let mut parts = value.splitn(3, ' ');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// The owner of `mark` on `node`, if one is recorded.
pub fn owner_of<'a>(node: &'a Node, mark: &str) -> Option<&'a str> {
    let (owner, _, recorded) = record_of(annotation(node, &owner_key(mark))?)?;
    (recorded == mark).then_some(owner)
}

fn taint_mark(feature: &str) -> String {
    format!("taint:{feature}")
}

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

/// The labels write `node` needs at `stage` for `owner` (`Kind/name`),
/// with the records of what it owns (`None`: it carries them). Keys
/// another object owns are left alone; `{version}` in values is replaced
/// by `version` (UpgradePlan).
pub fn labels(
    node: &Node,
    marks: &NodeLabels,
    stage: Stage,
    version: &str,
    owner: &str,
) -> Option<Effect> {
    if marks.during.is_empty() && marks.after.is_empty() {
        return None;
    }
    let value = |v: &String| v.replace("{version}", version);
    // Per key: the value wanted (None: removed) and the record wanted.
    let mut want: BTreeMap<&str, (Option<String>, Option<String>)> = BTreeMap::new();
    let set = |role: &str, k: &str, v: String| (Some(v), Some(format!("{owner} {role} {k}")));
    match stage {
        Stage::Held => {
            for (k, v) in &marks.during {
                want.insert(k, set("during", k, value(v)));
            }
        }
        Stage::Done => {
            for k in marks.during.keys() {
                want.insert(k, (None, None));
            }
            for (k, v) in &marks.after {
                want.insert(k, set("after", k, value(v)));
            }
        }
        Stage::Failed => {
            for k in marks.during.keys() {
                want.insert(k, (None, None));
            }
        }
        Stage::Untouched | Stage::Waiting => return None,
    }
    let have = node.labels();
    let mut labels = serde_json::Map::new();
    let mut records = serde_json::Map::new();
    for (k, (v, record)) in want {
        // Another object's key: not ours to write or remove.
        if owner_of(node, k).is_some_and(|o| o != owner) {
            continue;
        }
        if have.get(k) != v.as_ref() {
            labels.insert(k.to_string(), json!(v));
        }
        let key = owner_key(k);
        if annotation(node, &key) != record.as_deref() {
            records.insert(key, json!(record));
        }
    }
    if labels.is_empty() && records.is_empty() {
        return None;
    }
    let mut meta = serde_json::Map::new();
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !records.is_empty() {
        meta.insert("annotations".into(), Value::Object(records));
    }
    Some(Effect::PatchNode {
        node: node.name_any(),
        // Keys of the object's own choosing; a merge of the labels and
        // annotations maps loses no one else's.
        resource_version: None,
        patch: json!({ "metadata": meta }),
    })
}

/// The taint write `node` needs: `PreferNoSchedule` `WAITING_TAINT=feature`
/// while it waits (when `wanted`), gone otherwise, with its owner's
/// record. The taints are a list: the write replaces it whole, guarded by
/// the node's resourceVersion.
pub fn waiting_taint(
    node: &Node,
    feature: &str,
    wanted: bool,
    stage: Stage,
    owner: &str,
) -> Option<Effect> {
    let mark = taint_mark(feature);
    if owner_of(node, &mark).is_some_and(|o| o != owner) {
        return None;
    }
    let want = wanted && stage == Stage::Waiting;
    let record = want.then(|| format!("{owner} taint {mark}"));
    let (taints, changed) = taint_list(node, feature, want);
    let key = owner_key(&mark);
    if !changed && annotation(node, &key) == record.as_deref() {
        return None;
    }
    Some(Effect::PatchNode {
        node: node.name_any(),
        resource_version: node.resource_version(),
        patch: json!({
            "metadata": {"annotations": {key: record}},
            "spec": {"taints": taints},
        }),
    })
}

/// The node's taints with ours for `feature` there or not, and whether
/// that changed them.
fn taint_list(node: &Node, feature: &str, want: bool) -> (Vec<Taint>, bool) {
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| t.key == WAITING_TAINT && t.value.as_deref() == Some(feature);
    let has = taints.iter().any(ours);
    let mut next: Vec<Taint> = taints.into_iter().filter(|t| !ours(t)).collect();
    if want {
        next.push(Taint {
            key: WAITING_TAINT.into(),
            value: Some(feature.into()),
            effect: "PreferNoSchedule".into(),
            time_added: None,
        });
    }
    (next, has != want)
}

/// The write that removes from `node` the marks recorded for objects of
/// `kind` other than `governing` (the one that governs the node now, if
/// any): their owner is gone or no longer selects the node. `during`
/// labels and soft taints go with their records; an `after` label stays
/// (a result, not a hold), only its record goes. `None` in an unchanged
/// world: nothing is written twice.
pub fn orphaned(node: &Node, kind: &str, governing: Option<&str>) -> Option<Effect> {
    let prefix = format!("{kind}/");
    let mut labels = serde_json::Map::new();
    let mut records = serde_json::Map::new();
    let mut drop_taints: Vec<String> = Vec::new();
    for (key, value) in node.annotations() {
        if !key.starts_with(OWNER_PREFIX) {
            continue;
        }
        let Some((owner, role, mark)) = record_of(value) else {
            continue;
        };
        if !owner.starts_with(&prefix) || Some(owner) == governing {
            continue;
        }
        records.insert(key.clone(), Value::Null);
        match role {
            "during" if node.labels().contains_key(mark) => {
                labels.insert(mark.to_string(), Value::Null);
            }
            "taint" => drop_taints.extend(mark.strip_prefix("taint:").map(str::to_string)),
            _ => {}
        }
    }
    if records.is_empty() {
        return None;
    }
    let mut patch = json!({"metadata": {"annotations": records}});
    if !labels.is_empty() {
        patch["metadata"]["labels"] = Value::Object(labels);
    }
    // One feature per kind, so at most one soft taint to drop.
    let mut guarded = None;
    if let Some(feature) = drop_taints.first() {
        let (taints, changed) = taint_list(node, feature, false);
        if changed {
            patch["spec"] = json!({ "taints": taints });
            guarded = node.resource_version();
        }
    }
    Some(Effect::PatchNode {
        node: node.name_any(),
        // A taint list is replaced whole: guarded then.
        resource_version: guarded,
        patch,
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
    /// The object, `Kind/name`: the owner recorded for its marks.
    pub owner: &'a str,
}

/// The condition type that says which marks another object owns.
pub const WITHHELD: &str = "MarksWithheld";

/// The labels `m` wants on `node` at `stage` that another object owns, and
/// so are not written: "node N: label K is Kind/name's" (where-features-
/// meet.md design 2: the object says so rather than fight).
pub fn withheld(node: &Node, m: &Marks, stage: Stage) -> Vec<String> {
    let keys = match stage {
        Stage::Held => &m.labels.during,
        Stage::Done => &m.labels.after,
        _ => return Vec::new(),
    };
    keys.keys()
        .filter_map(|k| {
            let other = owner_of(node, k).filter(|o| *o != m.owner)?;
            Some(format!("node {}: label {k} is {other}'s", node.name_any()))
        })
        .collect()
}

/// `MarksWithheld=True`, reason `MarkOwnedBy`, naming the first few
/// withheld marks, while there are any; gone once there are none.
pub fn report(
    conds: &mut Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
    now: k8s_openapi::jiff::Timestamp,
    withheld: &[String],
) {
    if withheld.is_empty() {
        if let Some(list) = conds {
            list.retain(|c| c.type_ != WITHHELD);
        }
        return;
    }
    let list = conds.get_or_insert_with(Vec::new);
    let more = withheld.len().saturating_sub(3);
    let mut message = withheld
        .iter()
        .take(3)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if more > 0 {
        message.push_str(&format!("; and {more} more"));
    }
    super::set_condition(
        list,
        now,
        WITHHELD,
        "True",
        "MarkOwnedBy",
        &format!("{message}: not written by this object (one owner per mark)"),
    );
}

/// The writes `node` needs at `stage`. The taint's is left to the next
/// pass when the plan already writes that node guarded (a second guarded
/// write in one plan would fail on the first's change).
pub fn marks(effects: &[Effect], node: &Node, m: &Marks, stage: Stage) -> Vec<Effect> {
    let n = node.name_any();
    let busy = effects.iter().any(
        |e| matches!(e, Effect::PatchNode { node, resource_version: Some(_), .. } if *node == n),
    );
    let mut out: Vec<Effect> = labels(node, m.labels, stage, m.version, m.owner)
        .into_iter()
        .collect();
    if !busy {
        out.extend(waiting_taint(node, m.feature, m.soft_taint, stage, m.owner));
    }
    out
}

#[cfg(test)]
mod tests;
