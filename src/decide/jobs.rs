//! Jobs features run for a node (UpgradePlan hooks, the mutex operator's
//! rules), pure: the environment appended to every container, the node
//! affinity that keeps a Job off the node it is about, the label every such
//! Job carries (the cluster role watches Jobs by it), and what a Job's
//! conditions say.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodSpec,
};

/// On every Job nodekeeper creates; the cluster role watches Jobs by it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "nodekeeper";

/// Append `env` to every container and init container of `pod`, and keep
/// the pod off `node`.
pub fn for_node(pod: &mut PodSpec, env: &[(&str, &str)], node: &str) {
    let env: Vec<EnvVar> = env
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.to_string(),
            value: Some(v.to_string()),
            value_from: None,
        })
        .collect();
    let containers = pod.containers.iter_mut();
    for c in containers.chain(pod.init_containers.iter_mut().flatten()) {
        append_env(c, &env);
    }
    keep_off(pod.affinity.get_or_insert_with(Affinity::default), node);
}

/// Append our variables (never replacing the template's list); one the template already sets keeps its value.
fn append_env(c: &mut Container, env: &[EnvVar]) {
    let list = c.env.get_or_insert_with(Vec::new);
    for e in env {
        if !list.iter().any(|x| x.name == e.name) {
            list.push(e.clone());
        }
    }
}

/// Never on the node being upgraded: `kubernetes.io/hostname NotIn [node]`
/// is added to every required term (terms are ORed, so each needs it), or
/// is the one term when there is none. Preferences and pod affinities stay.
fn keep_off(affinity: &mut Affinity, node: &str) {
    let req = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "NotIn".into(),
        values: Some(vec![node.to_string()]),
    };
    let na = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let required = na
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(req.clone());
    }
}

/// What a Job says about itself.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState {
    Running,
    Complete,
    /// Failed: the condition's reason and message.
    Failed(String),
}

pub fn state(job: &Job) -> JobState {
    let conds = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let is = |t: &str| conds.and_then(|cs| cs.iter().find(|c| c.type_ == t && c.status == "True"));
    if is("Complete").is_some() {
        return JobState::Complete;
    }
    match is("Failed") {
        Some(c) => JobState::Failed(
            [c.reason.as_deref(), c.message.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": "),
        ),
        None => JobState::Running,
    }
}
