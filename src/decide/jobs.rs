//! Jobs features run for a node (UpgradePlan hooks, the mutex operator's
//! rules), pure: the environment appended to every container, the node
//! affinity that keeps a Job off the node it is about, the label every such
//! Job carries (the cluster role watches Jobs by it), and what a Job's
//! conditions say.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DynamicObject, TypeMeta};
use serde_json::{Value, json};

/// On every Job nodekeeper creates; the cluster role watches Jobs by it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "nodekeeper";

/// A Job's deterministic name: `prefix` cut to 46 characters (no trailing
/// `-` or `.`), then a hash of `key`, everything that makes the run unique:
/// at most 63 characters, the limit of the `job-name` label the Job
/// controller puts on its pods. A repeated create is a 409, never a second run.
pub fn name(prefix: &str, key: &str) -> String {
    let mut prefix: String = prefix.chars().take(46).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{:016x}", super::disrupt::fnv(key.as_bytes()))
}

/// Is `spec` shaped like a batch/v1 JobSpec? The shape a Job needs and
/// people get wrong: a pod template with named containers, the fields a
/// Job reads of the right kinds, and every level `build` writes into (env
/// lists, the node affinity) of the kind it expects. The API server
/// checks the rest when the Job is created (a refusal is reported on the
/// owner). Parsing into the typed `JobSpec` instead linked the whole pod
/// spec's deserializer, ~150 KiB of an 8 MiB binary, for this check alone.
pub fn check(spec: &Value) -> Result<(), String> {
    fn kind(v: &Value) -> &'static str {
        match v {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "a list",
            Value::Object(_) => "an object",
        }
    }
    let object = |v: &Value, at: &str| {
        if v.is_object() {
            Ok(())
        } else {
            Err(format!("{at}: expected an object, found {}", kind(v)))
        }
    };
    object(spec, "the JobSpec")?;
    for field in [
        "activeDeadlineSeconds",
        "backoffLimit",
        "completions",
        "parallelism",
        "ttlSecondsAfterFinished",
    ] {
        if let Some(v) = spec.get(field).filter(|v| !v.is_null() && !v.is_i64()) {
            return Err(format!("{field}: expected an integer, found {}", kind(v)));
        }
    }
    let template = &spec["template"];
    object(template, "template")?;
    let pod = &template["spec"];
    object(pod, "template.spec")?;
    if let Some(r) = pod.get("restartPolicy").and_then(Value::as_str)
        && r != "Never"
        && r != "OnFailure"
    {
        return Err(format!(
            "template.spec.restartPolicy: a Job's pods restart Never or OnFailure, not {r:?}"
        ));
    }
    for list in ["containers", "initContainers"] {
        let at = format!("template.spec.{list}");
        let items = match pod.get(list) {
            None | Some(Value::Null) if list == "initContainers" => continue,
            Some(Value::Array(items)) if !items.is_empty() || list == "initContainers" => items,
            Some(Value::Array(_)) | None | Some(Value::Null) => {
                return Err(format!("{at}: a Job needs at least one container"));
            }
            Some(v) => return Err(format!("{at}: expected a list, found {}", kind(v))),
        };
        for (i, c) in items.iter().enumerate() {
            object(c, &format!("{at}[{i}]"))?;
            if !c["name"].is_string() {
                return Err(format!("{at}[{i}].name: expected a string"));
            }
            // `image` may be left to a defaulting webhook; `env` we append to.
            if let Some(v) = c.get("env").filter(|v| !v.is_null() && !v.is_array()) {
                return Err(format!("{at}[{i}].env: expected a list, found {}", kind(v)));
            }
        }
    }
    // What `build` adds the keep-off term to: each level an object, the
    // terms a list of objects, each term's expressions a list.
    let mut at = String::from("template.spec");
    let mut v = pod;
    for field in [
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
    ] {
        at = format!("{at}.{field}");
        match v.get(field) {
            None | Some(Value::Null) => return Ok(()),
            Some(next) => {
                object(next, &at)?;
                v = next;
            }
        }
    }
    match v.get("nodeSelectorTerms") {
        None | Some(Value::Null) => {}
        Some(Value::Array(terms)) => {
            for (i, t) in terms.iter().enumerate() {
                object(t, &format!("{at}.nodeSelectorTerms[{i}]"))?;
                if let Some(e) = t
                    .get("matchExpressions")
                    .filter(|e| !e.is_null() && !e.is_array())
                {
                    return Err(format!(
                        "{at}.nodeSelectorTerms[{i}].matchExpressions: expected a list, found {}",
                        kind(e)
                    ));
                }
            }
        }
        Some(other) => {
            return Err(format!(
                "{at}.nodeSelectorTerms: expected a list, found {}",
                kind(other)
            ));
        }
    }
    Ok(())
}

/// A Job for `node` from a JobSpec given as JSON: `env` appended to every
/// container and init container (a variable the template sets keeps its
/// value; the list is never replaced), the pod kept off `node`, the
/// deadline at most `deadline`, and the TTL set if given.
pub struct JobFor<'a> {
    pub namespace: &'a str,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub owner: Option<OwnerReference>,
    pub env: &'a [(&'a str, &'a str)],
    pub node: &'a str,
    pub deadline: Option<i64>,
    pub ttl: Option<i32>,
}

pub fn build(spec: &Value, j: JobFor) -> Option<DynamicObject> {
    check(spec).ok()?;
    let mut spec = spec.clone();
    if let Some(d) = j.deadline {
        let own = spec["activeDeadlineSeconds"].as_i64();
        spec["activeDeadlineSeconds"] = json!(own.map_or(d, |o| o.min(d)));
    }
    if let Some(t) = j.ttl {
        spec["ttlSecondsAfterFinished"] = json!(t);
    }
    let pod = &mut spec["template"]["spec"];
    for list in ["containers", "initContainers"] {
        if let Some(cs) = pod[list].as_array_mut() {
            for c in cs {
                append_env(c, j.env);
            }
        }
    }
    keep_off(pod, j.node);
    Some(DynamicObject {
        types: Some(TypeMeta {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
        }),
        metadata: ObjectMeta {
            name: Some(j.name),
            namespace: Some(j.namespace.to_string()),
            labels: Some(j.labels),
            owner_references: j.owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: json!({ "spec": spec }),
    })
}

/// Append our variables; one the template already sets keeps its value.
fn append_env(container: &mut Value, env: &[(&str, &str)]) {
    if !container["env"].is_array() {
        container["env"] = json!([]);
    }
    if let Some(list) = container["env"].as_array_mut() {
        for (k, v) in env {
            if !list.iter().any(|x| x["name"] == *k) {
                list.push(json!({"name": k, "value": v}));
            }
        }
    }
}

/// Never on the node it is about: `kubernetes.io/hostname NotIn [node]` is
/// added to every required term (terms are ORed, so each needs it), or is
/// the one term when there is none. Preferences and pod affinities stay.
fn keep_off(pod: &mut Value, node: &str) {
    // `check` refused every other shape; indexing a JSON value that is not
    // an object panics, so each level is made one first all the same.
    fn object_at<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
        if !v.is_object() {
            *v = json!({});
        }
        let slot = &mut v[key];
        if !slot.is_object() {
            *slot = json!({});
        }
        slot
    }
    let req = json!({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]});
    let required = object_at(
        object_at(object_at(pod, "affinity"), "nodeAffinity"),
        "requiredDuringSchedulingIgnoredDuringExecution",
    );
    let terms = &mut required["nodeSelectorTerms"];
    if terms.as_array().is_none_or(|t| t.is_empty()) {
        *terms = json!([{}]);
    }
    for term in terms.as_array_mut().into_iter().flatten() {
        if !term.is_object() {
            *term = json!({});
        }
        if !term["matchExpressions"].is_array() {
            term["matchExpressions"] = json!([]);
        }
        if let Some(exprs) = term["matchExpressions"].as_array_mut() {
            exprs.push(req.clone());
        }
    }
}

/// The `namespace/name` key of a Job we create.
pub fn key(job: &DynamicObject) -> String {
    key_of(
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// A Job's key from its namespace and name: `namespace/name`.
pub fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// What a Job says about itself.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState {
    Running,
    Complete,
    /// Failed: the condition's reason and message.
    Failed(String),
}

/// A Job's state from its `status.conditions` (the object as JSON: the
/// cluster role keeps Jobs untyped, labels and conditions only).
pub fn state(job: &Value) -> JobState {
    let conds = job["status"]["conditions"].as_array();
    let is =
        |t: &str| conds.and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"));
    if is("Complete").is_some() {
        return JobState::Complete;
    }
    match is("Failed") {
        Some(c) => JobState::Failed(
            [c["reason"].as_str(), c["message"].as_str()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": "),
        ),
        None => JobState::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde_json::json;

    #[test]
    fn a_job_spec_is_checked_for_the_shape_a_job_needs() {
        let good = json!({"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "i", "args": ["x"]}]}}});
        assert_eq!(check(&good), Ok(()));
        for (bad, says) in [
            (
                json!({"template": 3}),
                "template: expected an object, found a number",
            ),
            (
                json!({"template": {"spec": {"containers": 7}}}),
                "template.spec.containers: expected a list, found a number",
            ),
            (
                json!({"template": {"spec": {"containers": []}}}),
                "a Job needs at least one container",
            ),
            (
                json!({"template": {"spec": {"containers": [{"image": "i"}]}}}),
                "template.spec.containers[0].name: expected a string",
            ),
            (
                json!({"template": {"spec": {"containers": [{"name": "c", "image": "i"}],
                    "affinity": "anywhere"}}}),
                "template.spec.affinity: expected an object, found a string",
            ),
            (
                json!({"template": {"spec": {"containers": [{"name": "c", "image": "i"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [1]}}}}}}),
                "nodeSelectorTerms[0]: expected an object, found a number",
            ),
            (
                json!({"template": {"spec": {"restartPolicy": "Always",
                    "containers": [{"name": "c", "image": "i"}]}}}),
                "restart Never or OnFailure, not \"Always\"",
            ),
            (
                json!({"backoffLimit": "3", "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}),
                "backoffLimit: expected an integer, found a string",
            ),
            (json!([1]), "the JobSpec: expected an object, found a list"),
        ] {
            let err = check(&bad).expect_err("refused");
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
