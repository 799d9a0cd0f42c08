//! One drain's plan, pure: every pod's fate from kubectl's filters
//! (`drain::fate`), the drain's pod selector, the DrainRules' behaviour and
//! tier (`drain_rules`), Karpenter's do-not-disrupt on a pod
//! (`do_not_disrupt`), and past the deadline the Force escalation. The
//! maintenance decision acts on it; `nodekeeper drain --dry-run` prints it.
//! Written once so the two cannot disagree about a pod.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::do_not_disrupt;
use super::drain::{self, Fate};
use super::drain_rules::{NodeRules, Placement, current_tier};
use super::selector::selector_matches;
use crate::api::drain_rule::{Behavior, DrainRule};
use crate::api::pod::Pod;

/// What a drain reads beyond the node's pods: the DrainRules, and the
/// labels of the namespaces their `namespaceSelector`s need (read only
/// when a rule on the node has one: [`NodeRules::need_namespaces`]).
#[derive(Debug, Default, Clone)]
pub struct RuleBook {
    pub rules: Vec<Arc<DrainRule>>,
    pub namespaces: HashMap<String, BTreeMap<String, String>>,
}

impl RuleBook {
    /// No rules: every drain is kubectl drain's.
    pub fn empty() -> &'static RuleBook {
        static EMPTY: std::sync::OnceLock<RuleBook> = std::sync::OnceLock::new();
        EMPTY.get_or_init(RuleBook::default)
    }
}

/// Could a DrainRule place any of `pods`? Only a pod kubectl's filters
/// leave pending can be (mirror and DaemonSet pods never are), so a node
/// holding only those needs no rule read: the service starts its
/// DrainRule watch at the first drain that does (`service::drain_rules`),
/// and an agent restarted after a reboot, its node holding DaemonSet pods
/// only, never lists them. Asked as no UpgradePlan's drain: a plan's own
/// upgrade Job, which its drain keeps, still counts here — a read too
/// many, never one too few.
pub fn rules_can_apply(pods: &[Arc<Pod>]) -> bool {
    pods.iter().any(|p| drain::fate(p, None).is_pending())
}

/// How this drain treats pods, beside the rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct Drain<'a> {
    /// The UpgradePlan whose NodeMaintenance this is, if it is one (its
    /// own upgrade Job stays: `drain::fate`).
    pub upgrading: Option<&'a str>,
    /// Only pods this selects are drained (kured's `--drain-pod-selector`).
    pub pod_selector: Option<&'a LabelSelector>,
    /// Past the drain deadline with `onTimeout: Force`: the tier draining
    /// now is deleted, PDBs, WaitCompleted and do-not-disrupt
    /// notwithstanding.
    pub force: bool,
    /// For do-not-disrupt durations.
    pub now: Timestamp,
    /// The UIDs of pods no other node can run and whose eviction was
    /// refused, for a drain that leaves those to the machine's shutdown (a
    /// reboot's or upgrade's: `decide::elsewhere`); `None` for every other.
    pub homeless: Option<&'a BTreeSet<String>>,
}

/// Why a pod with nowhere else to go is not evicted.
pub const NOWHERE_ELSE: &str = "no other node can run it and its PodDisruptionBudget refuses the eviction: left for the machine's shutdown";

/// One pod in the plan: its fate, and the rule placement that decided it
/// (`None`: kubectl's filters or the pod selector decided first, or the
/// placement is undecided).
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub pod: Arc<Pod>,
    pub fate: Fate,
    pub placement: Option<Placement>,
}

const FORCED: &str = "drain timeout (onTimeout Force): deleted despite its PDB";
const FORCED_WAITING: &str =
    "drain timeout (onTimeout Force): deleted before it completed (WaitCompleted)";
const FORCED_OPTED_OUT: &str =
    "drain timeout (onTimeout Force): deleted despite karpenter.sh/do-not-disrupt";

/// Every pod's fate in one drain of a node with `node_labels`.
pub fn plan(
    pods: &[Arc<Pod>],
    node_labels: &BTreeMap<String, String>,
    book: &RuleBook,
    how: Drain,
) -> Vec<Planned> {
    let rules = NodeRules::on(&book.rules, node_labels);
    let first: Vec<Planned> = pods
        .iter()
        .map(|pod| placed(pod, &rules, book, how))
        .collect();
    // A pod whose rule is undecided might belong to the lowest tier:
    // nothing is evicted out of order while one is.
    let tier = if first.iter().any(is_undecided) {
        Tier::Undecided
    } else {
        Tier::Lowest(current_tier(
            first
                .iter()
                .filter(|p| p.fate.is_pending())
                .filter_map(|p| p.placement.as_ref()),
        ))
    };
    first
        .into_iter()
        .map(|p| opted_out(tiered(p, tier, how.force), how.now))
        .collect()
}

/// A pod Karpenter's do-not-disrupt holds is not evicted: it is waited
/// for like a blocked one, until the annotation goes or its duration
/// ends, or the owner's escalation past the drain deadline.
fn opted_out(mut p: Planned, now: Timestamp) -> Planned {
    let Some(hold) = do_not_disrupt::pod_hold(&p.pod, now) else {
        return p;
    };
    p.fate = match p.fate {
        Fate::Evict => Fate::Held(hold.why()),
        Fate::Delete(FORCED) => Fate::Delete(FORCED_OPTED_OUT),
        f => f,
    };
    p
}

/// Which tier drains now.
#[derive(Debug, Clone, Copy)]
enum Tier {
    /// The lowest order still waited for (`None`: none is).
    Lowest(Option<i32>),
    /// Some pod's placement is undecided: no tier acts.
    Undecided,
}

fn is_undecided(p: &Planned) -> bool {
    p.placement.is_none() && matches!(p.fate, Fate::Held(_))
}

/// kubectl's filters and the pod selector, then the rules' placement.
fn placed(pod: &Arc<Pod>, rules: &NodeRules, book: &RuleBook, how: Drain) -> Planned {
    let planned = |fate, placement| Planned {
        pod: pod.clone(),
        fate,
        placement,
    };
    let selected = how
        .pod_selector
        .is_none_or(|sel| selector_matches(sel, pod.labels()));
    let fate = match drain::fate(pod, how.upgrading) {
        _ if !selected => Fate::Skip(Cow::Borrowed("not selected by the drain's pod selector")),
        f => f,
    };
    if !fate.is_pending() {
        return planned(fate, None);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let placement = match rules.place(pod, book.namespaces.get(namespace)) {
        Ok(p) => p,
        Err(_) if fate == Fate::Terminating => return planned(fate, None),
        Err(u) => {
            return planned(
                Fate::Held(format!(
                    "the labels of namespace {} are not read yet (a DrainRule selects by them)",
                    u.namespace
                )),
                None,
            );
        }
    };
    let fate = match placement.behavior {
        Behavior::Skip => Fate::Skip(Cow::Owned(format!("{}: Skip", placement.by))),
        // Its PDB would refuse for ever; one a person opted out of
        // disruption is still waited for.
        Behavior::Drain if fate == Fate::Evict && homeless(pod, how) => {
            Fate::Skip(Cow::Borrowed(NOWHERE_ELSE))
        }
        // Finished by itself: done waiting (Cluster API waits on until the
        // pod is gone, its issue 12920).
        Behavior::WaitCompleted if finished(pod) => Fate::Skip(Cow::Owned(format!(
            "finished ({}: WaitCompleted)",
            placement.by
        ))),
        _ => fate,
    };
    planned(fate, Some(placement))
}

/// The tier draining now acts; later tiers and running WaitCompleted pods
/// are held, with why.
fn tiered(mut p: Planned, tier: Tier, force: bool) -> Planned {
    let Some(placement) = &p.placement else {
        return p;
    };
    if !p.fate.is_pending() || p.fate == Fate::Terminating {
        return p;
    }
    let lowest = match tier {
        Tier::Lowest(lowest) => lowest,
        Tier::Undecided => {
            p.fate = Fate::Held(
                "held while another pod's DrainRule is undecided (its namespace's labels are not read yet)".into(),
            );
            return p;
        }
    };
    let now = lowest.is_some_and(|t| placement.order <= t);
    p.fate = match (placement.behavior, now) {
        (_, false) => Fate::Held(format!(
            "{}: order {}, after the pods of order {}",
            placement.by,
            placement.order,
            lowest.unwrap_or_default()
        )),
        (Behavior::WaitCompleted, true) if force => Fate::Delete(FORCED_WAITING),
        (Behavior::WaitCompleted, true) => Fate::Held(format!(
            "{}: WaitCompleted, waiting for it to finish",
            placement.by
        )),
        (_, true) if force && p.fate == Fate::Evict => Fate::Delete(FORCED),
        (_, true) => p.fate,
    };
    p
}

fn homeless(pod: &Pod, how: Drain) -> bool {
    how.homeless
        .zip(pod.metadata.uid.as_ref())
        .is_some_and(|(set, uid)| set.contains(uid))
        && do_not_disrupt::pod_hold(pod, how.now).is_none()
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests;
