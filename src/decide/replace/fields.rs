//! nodekeeper's own NodeVersion fields (`nodeSelector`, `maxSurge`, the
//! three timeouts, `windows`) kept where Constellation's clients cannot
//! take them.
//!
//! Constellation's CLI writes the NodeVersion with a typed client that
//! knows only Constellation's fields: a GET, a new image, a PUT of what it
//! knows. Ours vanish on that PUT (the API server then fills the timeouts'
//! and the surge's defaults), and a pool-scoped NodeVersion would govern
//! every node (where-features-meet.md C1). So the spec stays where a person
//! edits them, and the cluster role records what it last read there in an
//! annotation, which every client keeps. A write that leaves the spec with
//! none of our fields while the record has some is read as such a loss:
//! the recorded fields still govern and the status says so, until the spec
//! carries them again or a person deletes the annotation. A person who
//! changes one field keeps the others in the spec, so the record follows.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use super::*;

/// Where the record is kept.
pub const RECORD_ANNOTATION: &str = ROLLOUT_FIELDS_ANNOTATION;

/// The fields, each `None` at its default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Fields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_surge: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    join_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    leave_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drain_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    windows: Vec<crate::api::common::Window>,
}

impl Fields {
    fn of(spec: &NodeVersionSpec) -> Fields {
        let d = NodeVersionSpec::default_rollout();
        let changed = |v: i64, d: i64| (v != d).then_some(v);
        Fields {
            node_selector: spec.node_selector.clone(),
            max_surge: (spec.max_surge != d.max_surge).then_some(spec.max_surge),
            join_timeout_seconds: changed(spec.join_timeout_seconds, d.join_timeout_seconds),
            leave_timeout_seconds: changed(spec.leave_timeout_seconds, d.leave_timeout_seconds),
            drain_timeout_seconds: changed(spec.drain_timeout_seconds, d.drain_timeout_seconds),
            windows: spec.windows.clone(),
        }
    }

    /// `spec` with these fields (defaults where `None`).
    fn apply(&self, spec: &mut NodeVersionSpec) {
        let d = NodeVersionSpec::default_rollout();
        spec.node_selector = self.node_selector.clone();
        spec.max_surge = self.max_surge.unwrap_or(d.max_surge).clamp(1, 100);
        let within = |v: Option<i64>, d: i64, min: i64| v.unwrap_or(d).clamp(min, 86_400);
        spec.join_timeout_seconds = within(self.join_timeout_seconds, d.join_timeout_seconds, 10);
        spec.leave_timeout_seconds = within(self.leave_timeout_seconds, d.leave_timeout_seconds, 5);
        spec.drain_timeout_seconds =
            within(self.drain_timeout_seconds, d.drain_timeout_seconds, 10);
        spec.windows = self.windows.clone();
    }

    fn names(&self) -> Vec<&'static str> {
        [
            ("nodeSelector", self.node_selector.is_some()),
            ("maxSurge", self.max_surge.is_some()),
            ("joinTimeoutSeconds", self.join_timeout_seconds.is_some()),
            ("leaveTimeoutSeconds", self.leave_timeout_seconds.is_some()),
            ("drainTimeoutSeconds", self.drain_timeout_seconds.is_some()),
            ("windows", !self.windows.is_empty()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect()
    }
}

/// How a NodeVersion's rollout fields are read this round.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// What the status says about them (a loss, an unreadable record).
    pub note: Option<String>,
    /// The record to write first (the spec's fields changed).
    pub record: Option<Effect>,
    /// The record is unreadable and the spec carries none: which nodes
    /// this NodeVersion governs is not known, so it governs none.
    pub hold: bool,
}

/// The NodeVersion as it governs (its spec's rollout fields, or the
/// recorded ones when a write lost them) and how it was read.
pub fn governing(nv: &NodeVersion) -> (NodeVersion, Reading) {
    let spec = Fields::of(&nv.spec);
    let raw = nv.annotations().get(RECORD_ANNOTATION);
    let record = raw.map(|r| serde_json::from_str::<Fields>(r));
    let mut out = nv.clone();
    let mut reading = Reading::default();
    match record {
        Some(Ok(rec)) if spec == Fields::default() && rec != spec => {
            rec.apply(&mut out.spec);
            reading.note = Some(format!(
                "spec lost nodekeeper's {} (a write that did not carry them, as Constellation's CLI writes); the ones recorded in annotation {RECORD_ANNOTATION} still govern: set them again, or delete the annotation to drop them",
                rec.names().join(", ")
            ));
        }
        Some(Ok(rec)) if rec == spec => {}
        Some(Err(e)) if spec == Fields::default() => {
            reading.hold = true;
            reading.note = Some(format!(
                "annotation {RECORD_ANNOTATION} is not nodekeeper's record of the rollout fields ({e}) and the spec carries none, so which nodes this NodeVersion governs is not known: it governs none until the spec names them or the annotation is deleted"
            ));
        }
        None if spec == Fields::default() => {}
        _ => reading.record = Some(record_write(nv, &spec)),
    }
    (out, reading)
}

fn record_write(nv: &NodeVersion, fields: &Fields) -> Effect {
    let value = if *fields == Fields::default() {
        Value::Null
    } else {
        json!(serde_json::to_string(fields).unwrap_or_default())
    };
    super::surge::annotate(nv, RECORD_ANNOTATION, value)
}
