//! What a drain reads beside its node's pods: the DrainRules from their
//! store (watched from the first drain that needs them), and — only when
//! a rule on the node selects by namespace labels — the labels of the
//! namespaces of the node's pods. Those are read with one GET per
//! namespace and remembered for a minute, not watched: a node agent
//! watches only what names its node, and a drain needs a handful of
//! namespaces once. A namespace that cannot be read is left out; its
//! pods' placement waits (`decide::drain_plan` holds the drain's tiers and
//! says why) and the read is tried again on the next pass.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::node::Node;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use super::Context;
use crate::api::drain_rule::DrainRule;
use crate::api::pod::Pod;
use crate::decide::drain_plan::RuleBook;
use crate::decide::drain_rules::NodeRules;

/// How long a namespace's labels are taken as read.
const NAMESPACE_TTL: Duration = Duration::from_secs(60);
/// One namespace read's deadline.
const READ_DEADLINE: Duration = Duration::from_secs(10);

/// A namespace's labels.
type Labels = BTreeMap<String, String>;

/// Namespace labels read for drains, by name, with when.
#[derive(Default)]
pub struct NamespaceLabels {
    read: Mutex<HashMap<String, (Instant, Labels)>>,
}

impl NamespaceLabels {
    fn fresh(&self, name: &str) -> Option<BTreeMap<String, String>> {
        let read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        read.get(name)
            .filter(|(at, _)| at.elapsed() < NAMESPACE_TTL)
            .map(|(_, labels)| labels.clone())
    }

    fn remember(&self, name: &str, labels: BTreeMap<String, String>) {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        read.retain(|_, (at, _)| at.elapsed() < NAMESPACE_TTL);
        read.insert(name.to_string(), (Instant::now(), labels));
    }
}

/// How long a drain waits for the DrainRules' first list before it looks
/// again later (saying why).
const LIST_WITHIN: Duration = Duration::from_secs(10);

/// May a drain with `pods` decide now: no rule could place one of them
/// ([`crate::decide::drain_plan::rules_can_apply`]), or the rules are
/// listed? Otherwise their watch is started (if it is not running): the
/// steps that read no pods go ahead meanwhile (`service::reconcile`), so
/// the list's round trip is not in front of the cordon.
pub fn ready_for(ctx: &Context, pods: &[Arc<Pod>]) -> bool {
    let rules = &ctx.synced.drain_rules;
    if !crate::decide::drain_plan::rules_can_apply(pods) || rules.listed.is_open() {
        return true;
    }
    rules.wanted.open();
    false
}

/// [`ready_for`], waiting up to 10 s for the rules' list.
pub async fn listed_for(ctx: &Context, pods: &[Arc<Pod>]) -> bool {
    !crate::decide::drain_plan::rules_can_apply(pods)
        || ctx.synced.drain_rules.listed_within(LIST_WITHIN).await
}

/// The rule book for a drain of `node` with `pods` on it, once they are
/// [`ready_for`] it.
pub async fn rule_book(ctx: &Context, node: Option<&Node>, pods: &[Arc<Pod>]) -> RuleBook {
    // Most reconciles (a node's heartbeat, a node with no maintenance, a
    // node holding DaemonSet pods only) place no pod by a rule.
    if !crate::decide::drain_plan::rules_can_apply(pods) {
        return RuleBook::default();
    }
    let rules = parsed(&ctx.drain_rules.state());
    let empty = BTreeMap::new();
    let node_labels = node
        .and_then(|n| n.metadata.labels.as_ref())
        .unwrap_or(&empty);
    if rules.is_empty() || !NodeRules::on(&rules, node_labels).need_namespaces() {
        return RuleBook {
            rules,
            namespaces: HashMap::new(),
        };
    }
    let names: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.namespace.as_deref())
        .collect();
    let mut namespaces = HashMap::new();
    for name in names {
        let labels = match ctx.namespace_labels.fresh(name) {
            Some(labels) => Some(labels),
            None => read(ctx, name).await,
        };
        if let Some(labels) = labels {
            namespaces.insert(name.to_string(), labels);
        }
    }
    RuleBook { rules, namespaces }
}

/// The rules as DrainRules; one that does not parse (stored before the
/// schema refused it) is left out, said at debug level each time (a
/// warning would repeat on every reconcile).
pub fn parsed(served: &[Arc<kube::api::DynamicObject>]) -> Vec<Arc<DrainRule>> {
    served
        .iter()
        .filter_map(|o| {
            let rule =
                serde_json::to_value(o.as_ref()).and_then(serde_json::from_value::<DrainRule>);
            match rule {
                Ok(r) => Some(Arc::new(r)),
                Err(e) => {
                    log::debug!(
                        "DrainRule {}: left out, it does not parse: {e}",
                        o.metadata.name.as_deref().unwrap_or_default()
                    );
                    None
                }
            }
        })
        .collect()
}

/// One namespace's labels, or `None` (logged) when it cannot be read now.
async fn read(ctx: &Context, name: &str) -> Option<BTreeMap<String, String>> {
    let api: Api<Namespace> = Api::all(ctx.effects.client.clone());
    let got = crate::runtime::timeout(READ_DEADLINE, api.get_metadata(name)).await;
    match got {
        Ok(Ok(ns)) => {
            let labels = ns.metadata.labels.unwrap_or_default();
            ctx.namespace_labels.remember(name, labels.clone());
            Some(labels)
        }
        Ok(Err(e)) => {
            log::warn!("reading the labels of namespace {name} for a DrainRule: {e}");
            None
        }
        Err(()) => {
            log::warn!(
                "reading the labels of namespace {name} for a DrainRule: no answer within {} s",
                READ_DEADLINE.as_secs()
            );
            None
        }
    }
}
