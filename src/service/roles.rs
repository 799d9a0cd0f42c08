//! The two roles of the one loop. The **node role** (`run --node`, the
//! default) owns one node: it watches that Node and the pods bound to it
//! and does the node-local work. The **cluster role** (`run --all-nodes`,
//! one leader-elected replica) watches every node and is the single writer
//! of cluster-wide decisions: reboot admissions within budgets (and Jobs and
//! replacement, as they arrive); without node agents it also drains every
//! node it selects.
//!
//! Both look after NodeMaintenances that no agent owns (see
//! `decide::foreign`) from one **anchor** node's reconcile: the own node in
//! the node role, the first node by name in the cluster role.

use kube::api::ListParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::watch::watch_config;

use crate::api::node::Node;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::decide::foreign;
use crate::error::Result;

/// Which nodes this process reconciles.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// Node role: exactly this node.
    Node(String),
    /// Cluster role: every node (one leader-elected replica), or only those
    /// matching a label selector.
    AllNodes { selector: Option<String> },
}

impl Scope {
    /// Does our node store hold every node of the cluster, so that absence
    /// from it proves a node does not exist?
    pub fn sees_all_nodes(&self) -> bool {
        matches!(self, Scope::AllNodes { selector: None })
    }

    /// Who we are for jitter: the own node, or the cluster role.
    pub fn agent(&self) -> &str {
        match self {
            Scope::Node(n) => n,
            Scope::AllNodes { .. } => "cluster",
        }
    }
}

/// Does this cluster role handle `policy`? Without `--node-selector`, every
/// policy. With one, only a policy whose nodes provably lie in its pool:
/// its `nodeSelector.matchLabels` hold every `key=value` of the pool's
/// selector. Anything weaker would let two pool-scoped cluster roles write
/// one policy's status from two halves of its nodes.
pub fn handles_policy(scope: &Scope, policy: &crate::api::reboot::RebootPolicy) -> bool {
    handles_selector(scope, policy.spec.node_selector.as_ref())
}

/// [`handles_policy`] for an UpgradePlan.
pub fn handles_plan(scope: &Scope, plan: &crate::api::upgrade::UpgradePlan) -> bool {
    handles_selector(scope, plan.spec.node_selector.as_ref())
}

/// [`handles_policy`] for a NodeVersion (by its nodekeeper selector).
pub fn handles_node_version(
    scope: &Scope,
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> bool {
    handles_selector(scope, selector)
}

fn handles_selector(
    scope: &Scope,
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> bool {
    let Scope::AllNodes {
        selector: Some(pool),
    } = scope
    else {
        return true;
    };
    let Some(terms) = equality_terms(pool) else {
        return false;
    };
    let labels = selector.and_then(|s| s.match_labels.as_ref());
    terms
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// `a=b,c==d` as pairs; `None` for any other kind of term.
pub fn equality_terms(selector: &str) -> Option<Vec<(String, String)>> {
    selector
        .split(',')
        .map(|t| {
            let (k, v) = t.split_once("==").or_else(|| t.split_once('='))?;
            let (k, v) = (k.trim(), v.trim());
            (!k.is_empty() && !k.ends_with('!')).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// What the NodeMaintenance watch lists. The node role watches only the
/// objects naming its node (`fieldSelector=spec.nodeName=<own>`, served
/// where the CRD declares it selectable: Kubernetes ≥ 1.31 and this
/// release's CRDs), so its watch costs the same in a 5-node and a
/// 5 000-node cluster; the cluster role watches every one. Objects naming
/// a node that has no agent are the cluster role's (`decide::foreign`,
/// on its anchor node) or refused by the admission webhook.
///
/// For the node role this is also its start-up check that the CRD is
/// installed (`None`: not served), asked as the list it will watch: a
/// server that refuses the selector (older CRDs or Kubernetes) gets the
/// unfiltered watch and a warning saying what to apply; any other failure
/// stops the start as a failed CRD check does.
pub async fn maintenance_watch(
    client: &kube::Client,
    own: Option<&str>,
) -> Result<Option<watcher::Config>> {
    let Some(own) = own else {
        return Ok(Some(watch_config()));
    };
    let selector = format!("spec.nodeName={own}");
    let api = kube::Api::<NodeMaintenance>::all(client.clone());
    let mine = ListParams::default().fields(&selector).limit(1);
    let what = super::watch::checking_crd("NodeMaintenance");
    let probe = super::connect::patiently(&what, || api.list_metadata(&mine)).await;
    match probe {
        Ok(_) => Ok(Some(watch_config().fields(&selector))),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(kube::Error::Api(e)) if e.code == 400 => {
            log::warn!(
                "the API server does not select NodeMaintenances by spec.nodeName ({}): this agent watches every NodeMaintenance in the cluster. Apply this release's CRDs (`nodekeeper crds | kubectl apply -f -`) on Kubernetes 1.31 or newer",
                e.message
            );
            Ok(Some(watch_config()))
        }
        Err(e) => Err(crate::error::Error::kube(what)(e)),
    }
}

/// The anchor node's name, if there is one yet.
pub fn anchor(scope: &Scope, nodes: &Store<Node>) -> Option<String> {
    match scope {
        Scope::Node(n) => Some(n.clone()),
        // Called by every node reconcile: no name is copied but the one.
        Scope::AllNodes { .. } => nodes
            .state()
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .min()
            .map(str::to_string),
    }
}

/// A NodeMaintenance triggers its node; one whose node is not ours (or does
/// not exist) may need someone to fail or finish it: the anchor node does.
pub fn map_maintenance(
    nm: &NodeMaintenance,
    scope: &Scope,
    nodes: &Store<Node>,
) -> Option<ObjectRef<Node>> {
    let target = &nm.spec.node_name;
    match scope {
        Scope::Node(own) if own == target => Some(ObjectRef::new(own)),
        Scope::Node(own) => foreign::needs_attention(nm).then(|| ObjectRef::new(own)),
        Scope::AllNodes { .. } => {
            if nodes.get(&ObjectRef::new(target)).is_some() {
                Some(ObjectRef::new(target))
            } else if foreign::needs_attention(nm) {
                anchor(scope, nodes).map(|a| ObjectRef::new(&a))
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::reboot::{RebootPolicy, RebootPolicySpec};

    fn policy(labels: &[(&str, &str)]) -> RebootPolicy {
        let mut spec = RebootPolicySpec::default();
        if !labels.is_empty() {
            spec.node_selector = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some(
                        labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..Default::default()
                },
            );
        }
        RebootPolicy::new("p", spec)
    }

    #[test]
    fn a_pool_scoped_cluster_role_handles_only_policies_inside_its_pool() {
        let all = Scope::AllNodes { selector: None };
        let blue = Scope::AllNodes {
            selector: Some("pool=blue".into()),
        };
        assert!(handles_policy(&all, &policy(&[])));
        assert!(handles_policy(
            &blue,
            &policy(&[("pool", "blue"), ("zone", "a")])
        ));
        assert!(!handles_policy(&blue, &policy(&[("pool", "green")])));
        assert!(
            !handles_policy(&blue, &policy(&[])),
            "every node is wider than the pool"
        );
        let set = Scope::AllNodes {
            selector: Some("pool in (blue)".into()),
        };
        assert!(!handles_policy(&set, &policy(&[("pool", "blue")])));
        assert_eq!(equality_terms("a==b, c=d").map(|t| t.len()), Some(2));
        assert_eq!(equality_terms("a!=b"), None);
    }
}
