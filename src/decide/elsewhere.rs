//! Pods with nowhere else to go, pure: whether any other node could run a
//! pod, as far as the scheduler's hard rules go (the node is Ready and not
//! cordoned, its `NoSchedule`/`NoExecute` taints are tolerated, the pod's
//! node selector and required node affinity match it).
//!
//! Why: on a single-node cluster (the k3s and Talos edge), or when every
//! other node is cordoned or tainted for the pod, a PodDisruptionBudget
//! that needs the pod running refuses its eviction for ever (the pod could
//! only become Pending): a reboot or upgrade drain would wait until its
//! deadline for nothing. Such a pod, once its eviction is refused, stays
//! where it is and the machine's shutdown stops it (the kubelet's graceful
//! node shutdown, when its `shutdownGracePeriod` is set); the maintenance
//! names it ([`CONDITION`]). A pod whose eviction is allowed is still
//! evicted, as kured and kubectl drain evict it: a graceful stop now
//! rather than whatever the shutdown does. An administrator's maintenance
//! and a replacement are not changed: NMO's drain waits on every pod, and
//! a replaced node never comes back for its pods.
//!
//! Not weighed: resources, ports, pod (anti-)affinity and topology
//! spread. A pod they would keep off every other node is still evicted,
//! as before; it then waits Pending until the node comes back.

use std::collections::BTreeSet;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::Taint;
use kube::ResourceExt;

use crate::api::pod::{Placement, Pod, Requirement, Toleration};

/// The NodeMaintenance condition naming the pods left on the node for its
/// shutdown (present only while there are some).
pub const CONDITION: &str = "LeftForShutdown";
/// Its reason.
pub const REASON: &str = "NowhereElseToRun";
/// At most this many pods are named in its message.
const NAMED: usize = 5;

/// The owners whose drains leave such pods to the shutdown: the features
/// that power the node off and bring it back.
pub fn applies_to(owner: Option<&str>) -> bool {
    matches!(
        owner,
        Some(crate::api::reboot::OWNER_KIND | crate::api::upgrade::OWNER_KIND)
    )
}

/// What the service found out for a drain: which pods it asked about,
/// and which of those no other node can run (UIDs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Homes {
    pub asked: BTreeSet<String>,
    pub homeless: BTreeSet<String>,
}

impl Homes {
    /// Was `pod` asked about?
    pub fn knows(&self, pod: &Pod) -> bool {
        pod.metadata
            .uid
            .as_ref()
            .is_some_and(|u| self.asked.contains(u))
    }
}

/// The UIDs of `pods` (bound to `own`) that no node of `others` could run.
/// `others` may include `own` (skipped). Stops looking for a pod at the
/// first node that fits it.
pub fn homeless<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    others: &[&Node],
    own: &str,
) -> BTreeSet<String> {
    let others: Vec<&Node> = others
        .iter()
        .copied()
        .filter(|n| n.name_any() != own && open(n))
        .collect();
    pods.into_iter()
        .filter(|pod| !others.iter().any(|n| fits(pod, n)))
        .filter_map(|pod| pod.metadata.uid.clone())
        .collect()
}

/// Ready and not cordoned: a node the scheduler puts pods on at all.
fn open(node: &Node) -> bool {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    !cordoned && super::node_ready(node)
}

/// Could `node` run `pod` (taints, selector, required affinity)?
pub fn fits(pod: &Pod, node: &Node) -> bool {
    placed(pod, node, |_| true)
}

/// Could `node` run `pod` once its passing state clears: a cordon and
/// NotReady are ignored, and so are the taints they bring (the
/// `node.kubernetes.io/` ones the node controller sets from the node's
/// conditions) and a maintenance's drain taint (`medik8s.io/drain`, NMO's
/// and ours: it goes with the maintenance); the pod's selector, required
/// affinity and every other taint still count. Whether a pod is pinned to
/// its node for good. (Counted, the drain taint of a second node under
/// maintenance made a cluster role on a two-node cluster think itself
/// pinned to its own node and take that too.)
pub fn could_ever_run(pod: &Pod, node: &Node) -> bool {
    placed(pod, node, |t| {
        !t.key.starts_with("node.kubernetes.io/")
            && t.key != crate::api::nodemaintenance::DRAIN_TAINT
    })
}

/// [`fits`], counting only the taints `counts` keeps.
fn placed(pod: &Pod, node: &Node, counts: impl Fn(&Taint) -> bool) -> bool {
    static NONE: std::sync::OnceLock<Placement> = std::sync::OnceLock::new();
    let placement = pod
        .spec
        .as_ref()
        .and_then(|s| s.placement.as_deref())
        .unwrap_or_else(|| NONE.get_or_init(Placement::default));
    let labels = node.labels();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| (t.effect == "NoSchedule" || t.effect == "NoExecute") && counts(t))
        .all(|t| placement.tolerations.iter().any(|tol| tolerates(tol, t)))
        && placement
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        && (placement.required_terms.is_empty()
            || placement.required_terms.iter().any(|term| {
                // An empty term matches nothing (the scheduler's rule).
                (!term.match_expressions.is_empty() || !term.match_fields.is_empty())
                    && term
                        .match_expressions
                        .iter()
                        .all(|r| requirement(r, labels.get(&r.key).map(String::as_str)))
                    && term.match_fields.iter().all(|r| {
                        r.key == "metadata.name" && requirement(r, Some(node.name_any().as_str()))
                    })
            }))
}

/// The API's toleration rule (`Toleration.ToleratesTaint`).
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if tol
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = tol.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        // An empty key with Exists tolerates every taint.
        "Exists" => true,
        "Equal" | "" => {
            !key.is_empty()
                && tol.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// One node selector requirement against a label's (or field's) value.
fn requirement(r: &Requirement, value: Option<&str>) -> bool {
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !r.values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(number),
                r.values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// The condition's message: the pods left (the first few named).
pub fn message(pods: &[String]) -> String {
    let mut named = pods
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if pods.len() > NAMED {
        named.push_str(&format!(" and {} more", pods.len() - NAMED));
    }
    format!(
        "no other node can run {} pod{} ({named}) and a PodDisruptionBudget refuses the eviction: not waited for, stopped by the machine's shutdown",
        pods.len(),
        if pods.len() == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests;
