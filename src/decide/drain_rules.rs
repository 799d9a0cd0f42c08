//! DrainRules, pure: the behaviour and tier each pod of a drained node gets,
//! and which tier drains now — Cluster API's MachineDrainRule semantics
//! (cluster-api `core/reconcilers/machine/drain/filters.go`,
//! `drainLabelFilter`, `machineDrainRulesFilter`, and `drain.go`,
//! `minDrainOrderOfPodsToDrain`), with the node's labels where Cluster API
//! has the Machine's. kubectl's own filters (DaemonSet, mirror pods) come
//! first and are `drain::fate`'s; what is left is placed here.
//!
//! One difference, on purpose: a WaitCompleted pod that has finished
//! (Succeeded or Failed) is done waiting, where Cluster API keeps waiting
//! for it until it is gone (cluster-api issue 12920).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::drain_rule::{Behavior, CAPI_DRAIN_LABEL, DRAIN_LABEL, DrainRule};
use crate::api::pod::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::selector::selector_matches;

/// What decided a pod's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum By {
    /// A pod label (`nodekeeper.io/drain` or `cluster.x-k8s.io/drain`).
    Label(&'static str),
    /// The first DrainRule, by name, that selects the pod on this node.
    Rule(String),
    /// No label and no rule: Drain, order 0.
    Default,
}

impl std::fmt::Display for By {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            By::Label(key) => write!(f, "pod label {key}"),
            By::Rule(name) => write!(f, "DrainRule {name}"),
            By::Default => f.write_str("no DrainRule"),
        }
    }
}

/// A pod's behaviour and tier in a drain, and what decided them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub behavior: Behavior,
    /// The tier: Drain pods of the lowest order present go first;
    /// WaitCompleted pods are order 0, as in Cluster API.
    pub order: i32,
    pub by: By,
}

impl Placement {
    const DEFAULT: Placement = Placement {
        behavior: Behavior::Drain,
        order: 0,
        by: By::Default,
    };
}

/// A pod's placement cannot be decided yet: a rule tried before the one
/// that may win selects by namespace labels, and the namespace's labels
/// are not known (not read yet). The pod is held, not evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecided {
    pub namespace: String,
}

/// The DrainRules that apply on one node, in the order they are tried
/// (alphabetical by name).
#[derive(Debug, Default)]
pub struct NodeRules<'a> {
    rules: Vec<&'a DrainRule>,
}

impl<'a> NodeRules<'a> {
    /// The rules whose `nodes` select a node with these labels (a rule
    /// without `nodes` applies on every node), sorted by name.
    pub fn on(rules: &'a [Arc<DrainRule>], node_labels: &BTreeMap<String, String>) -> Self {
        let mut rules: Vec<&DrainRule> = rules
            .iter()
            .map(Arc::as_ref)
            .filter(|r| {
                r.spec.nodes.as_ref().is_none_or(|nodes| {
                    nodes
                        .iter()
                        .any(|n| matches(n.selector.as_ref(), node_labels))
                })
            })
            .collect();
        rules.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        NodeRules { rules }
    }

    /// Does any rule here need the labels of a pod's namespace? (Only then
    /// does the caller have to read namespaces.)
    pub fn need_namespaces(&self) -> bool {
        self.rules.iter().any(|r| {
            r.spec
                .pods
                .iter()
                .flatten()
                .any(|p| p.namespace_selector.as_ref().is_some_and(|s| !is_empty(s)))
        })
    }

    /// Where `pod` stands: its label first, then the first rule that
    /// selects it, else Drain at order 0. `namespace_labels` gives the
    /// labels of the pod's namespace when known.
    pub fn place(
        &self,
        pod: &Pod,
        namespace_labels: Option<&BTreeMap<String, String>>,
    ) -> Result<Placement, Undecided> {
        if let Some(p) = by_label(pod) {
            return Ok(p);
        }
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        for rule in &self.rules {
            let Some(pods) = &rule.spec.pods else {
                return Ok(placement(rule));
            };
            let mut unknown = false;
            let selected = pods.iter().any(|term| {
                if !matches(term.selector.as_ref(), labels) {
                    return false;
                }
                match (term.namespace_selector.as_ref(), namespace_labels) {
                    (None, _) => true,
                    (Some(s), _) if is_empty(s) => true,
                    (Some(s), Some(ns)) => selector_matches(s, ns),
                    (Some(_), None) => {
                        unknown = true;
                        false
                    }
                }
            });
            if selected {
                return Ok(placement(rule));
            }
            // This rule might select the pod: no later rule may win before
            // the namespace is known.
            if unknown {
                return Err(Undecided {
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                });
            }
        }
        Ok(Placement::DEFAULT)
    }
}

/// A pod label's placement: `skip` and `wait-completed` in any case, as
/// Cluster API reads its label (`strings.EqualFold`, one `-` dropped);
/// another value is ignored, and the rules decide.
fn by_label(pod: &Pod) -> Option<Placement> {
    let labels = pod.metadata.labels.as_ref()?;
    [DRAIN_LABEL, CAPI_DRAIN_LABEL].into_iter().find_map(|key| {
        let value = labels.get(key)?;
        let behavior = if value.eq_ignore_ascii_case("skip") {
            Behavior::Skip
        } else if value
            .replacen('-', "", 1)
            .eq_ignore_ascii_case("waitcompleted")
        {
            Behavior::WaitCompleted
        } else {
            return None;
        };
        Some(Placement {
            behavior,
            order: 0,
            by: By::Label(key),
        })
    })
}

fn placement(rule: &DrainRule) -> Placement {
    let behavior = rule.spec.drain.behavior;
    Placement {
        behavior,
        // The schema allows an order only with Drain; an object stored
        // before it did still gets WaitCompleted's 0.
        order: match behavior {
            Behavior::Drain => rule.spec.drain.order.unwrap_or(0),
            _ => 0,
        },
        by: By::Rule(rule.metadata.name.clone().unwrap_or_default()),
    }
}

/// Cluster API's `matchesSelector`: not set or empty selects everything.
fn matches(sel: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    sel.is_none_or(|s| selector_matches(s, labels))
}

fn is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && sel.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

/// The tier that drains now: the lowest order among the pods the drain
/// still waits for (Drain pods not yet gone, terminating ones included,
/// and WaitCompleted pods not yet finished), as Cluster API's
/// `minDrainOrderOfPodsToDrain`. `None`: nothing is left to wait for.
pub fn current_tier<'p>(waiting: impl IntoIterator<Item = &'p Placement>) -> Option<i32> {
    waiting
        .into_iter()
        .filter(|p| p.behavior != Behavior::Skip)
        .map(|p| p.order)
        .min()
}

#[cfg(test)]
pub(crate) mod tests;
