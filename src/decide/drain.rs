//! Drain policy, pure: which pods on a node must go and how, with kubectl
//! drain's semantics as medik8s configures it (Force, DeleteEmptyDirData,
//! IgnoreAllDaemonSets, the pod's own grace period); which PDBs would block
//! an eviction; and when to ask again after the API's answer. No I/O here:
//! `effects/evict.rs` performs what this decides.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::api::pod::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::selector::selector_matches;

/// What draining does with one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Evicted through the eviction API, so PDBs are honoured.
    Evict,
    /// Deleted: it has finished, or the drain's Force escalation.
    Delete(&'static str),
    /// Already terminating; drained once it is gone.
    Terminating,
    /// Waited for but not acted on now, and why: a pod of a later
    /// DrainRule tier, a WaitCompleted pod still running, a pod whose rule
    /// cannot be decided yet (`decide::drain_plan`).
    Held(String),
    /// Left alone, with the reason kubectl (or the DrainRule) gives.
    Skip(Cow<'static, str>),
}

impl Fate {
    /// Does the drain wait for this pod to be gone?
    pub fn is_pending(&self) -> bool {
        !matches!(self, Fate::Skip(_))
    }
}

/// What the API server said to one eviction or deletion.
#[derive(Debug, Clone, PartialEq)]
pub enum Removal {
    /// Accepted; the pod is on its way out.
    Accepted,
    /// Already gone (404) or replaced (UID precondition failed).
    Gone,
    /// Refused; the message names the PDB and the API's cause.
    Refused(String),
}

/// What we remember about a pod we tried to drain (lost on restart, which
/// costs at most one repeated eviction request).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attempt {
    /// Not before this instant.
    pub retry_at: Option<Timestamp>,
    /// Why the last attempt did not remove the pod (one line, API's cause).
    pub error: Option<String>,
    /// How many attempts were refused, for backoff.
    pub refusals: u32,
}

/// How long to back off after the `n`th refusal: 1, 2, 4 then 5 s (kubectl
/// retries a 429 every 5 s; we start faster so a relaxed PDB is noticed soon).
pub fn backoff(refusals: u32) -> Duration {
    Duration::from_secs(match refusals {
        0 | 1 => 1,
        2 => 2,
        3 => 4,
        _ => 5,
    })
}

/// A pod whose eviction was accepted is waited for; we ask again only if it
/// outlives its grace period by this much.
const OUTLIVED_GRACE: i64 = 30;

/// Fold the API's answers into the per-pod attempts: accepted pods are
/// waited for (asked again only long after their grace period), refused
/// ones back off and keep the refusal's message for status.
pub fn record(
    attempts: &mut HashMap<String, Attempt>,
    pods: &[(Arc<Pod>, Fate)],
    removals: &[Removal],
    now: Timestamp,
) {
    for ((pod, _), removal) in pods.iter().zip(removals) {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        match removal {
            Removal::Accepted | Removal::Gone => {
                let grace = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                let retry = now
                    .checked_add(SignedDuration::from_secs(grace.max(0) + OUTLIVED_GRACE))
                    .ok();
                attempts.insert(
                    uid,
                    Attempt {
                        retry_at: retry,
                        error: None,
                        refusals: 0,
                    },
                );
            }
            Removal::Refused(msg) => {
                let a = attempts.entry(uid).or_default();
                a.refusals += 1;
                let wait = SignedDuration::try_from(backoff(a.refusals)).unwrap_or_default();
                a.retry_at = now.checked_add(wait).ok();
                a.error = Some(msg.clone());
            }
        }
    }
}

/// Annotation the kubelet puts on mirror pods of static pods.
pub use crate::api::pod::MIRROR_ANNOTATION;

/// Decide one pod's fate. Order as kubectl's filters: deleted, DaemonSet,
/// mirror, then local storage (allowed) and unreplicated (forced).
/// `upgrading`: the UpgradePlan whose NodeMaintenance this drain is, if it
/// is one — only its own upgrade Job's pod for this node stays.
pub fn fate(pod: &Pod, upgrading: Option<&str>) -> Fate {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Fate::Skip(Cow::Borrowed(
            "mirror pod of a static pod (managed by the kubelet)",
        ));
    }
    let controller = meta
        .owner_references
        .as_ref()
        .and_then(|os| os.iter().find(|o| o.controller == Some(true)));
    if controller.is_some_and(|c| c.kind == "DaemonSet") {
        return Fate::Skip(Cow::Borrowed(
            "DaemonSet-managed (ignored, as --ignore-daemonsets)",
        ));
    }
    // The upgrade Job of an UpgradePlan (`strategy.type: Job`) runs on the
    // node its maintenance drained: evicting it would fail the upgrade.
    // Only in that plan's own drain, and only its Job for this node: a
    // label any namespace user can set exempts nothing from anyone else's
    // drain (where-features-meet.md, finding 13).
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if controller.is_some_and(|c| c.kind == "Job")
        && label(crate::api::upgrade::STAGE_LABEL) == Some(crate::api::upgrade::UPGRADE_STAGE)
        && upgrading.is_some_and(|plan| label(crate::api::upgrade::PLAN_LABEL) == Some(plan))
        && on.is_some_and(|n| label(crate::api::upgrade::NODE_LABEL) == Some(n))
    {
        return Fate::Skip(Cow::Borrowed(
            "this UpgradePlan's upgrade Job for this node",
        ));
    }
    if meta.deletion_timestamp.is_some() {
        return Fate::Terminating;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Fate::Delete("finished");
    }
    // A pod with no controller is drained as with `--force` — but through
    // the eviction API like every other pod kubectl drain removes, so a
    // PDB over bare pods holds. Only the Force escalation deletes.
    Fate::Evict
}

/// `namespace/name` for messages.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The PDBs in the pod's namespace that select it.
pub fn pdbs_for<'a>(pod: &Pod, pdbs: &'a [PodDisruptionBudget]) -> Vec<&'a PodDisruptionBudget> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    pdbs.iter()
        .filter(|p| p.metadata.namespace == pod.metadata.namespace)
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| selector_matches(s, labels))
        })
        .collect()
}

/// Why an eviction of this pod would be refused right now, if it would:
/// the same checks the eviction API makes against PDB status.
pub fn pdb_blocker(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Option<String> {
    let matching = pdbs_for(pod, pdbs);
    match matching.as_slice() {
        [] => None,
        [pdb] => {
            let allowed = pdb
                .status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0);
            (allowed < 1).then(|| {
                format!(
                    "PodDisruptionBudget {} allows no disruption now",
                    pdb.metadata.name.as_deref().unwrap_or_default()
                )
            })
        }
        many => Some(format!(
            "selected by {} PodDisruptionBudgets ({}); the eviction API refuses such pods",
            many.len(),
            many.iter()
                .map(|p| p.metadata.name.as_deref().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    #[test]
    fn refusals_back_off_and_accepted_pods_are_waited_for() {
        let now = Timestamp::UNIX_EPOCH;
        let mut p = pod(Some("ReplicaSet"));
        p.metadata.uid = Some("u".into());
        let pods = vec![(Arc::new(p), Fate::Evict)];
        let mut attempts = HashMap::new();
        record(&mut attempts, &pods, &[Removal::Refused("pdb".into())], now);
        record(&mut attempts, &pods, &[Removal::Refused("pdb".into())], now);
        let a = attempts.get("u").cloned().unwrap_or_default();
        assert_eq!((a.refusals, a.error.as_deref()), (2, Some("pdb")));
        assert_eq!(
            a.retry_at,
            now.checked_add(SignedDuration::from_secs(2)).ok()
        );
        record(&mut attempts, &pods, &[Removal::Accepted], now);
        let a = attempts.get("u").cloned().unwrap_or_default();
        assert_eq!((a.refusals, a.error), (0, None));
        assert_eq!(
            a.retry_at,
            now.checked_add(SignedDuration::from_secs(60)).ok()
        );
    }
    use crate::api::pod::PodStatus;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, OwnerReference, Time,
    };
    use kube::api::ObjectMeta;

    fn pod(owner: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                owner_references: owner.map(|kind| {
                    vec![OwnerReference {
                        kind: kind.into(),
                        name: "o".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn replicated_pods_are_evicted() {
        assert_eq!(fate(&pod(Some("ReplicaSet")), None), Fate::Evict);
        assert_eq!(fate(&pod(Some("StatefulSet")), None), Fate::Evict);
    }

    #[test]
    fn daemonset_pods_are_skipped() {
        assert!(matches!(fate(&pod(Some("DaemonSet")), None), Fate::Skip(_)));
    }

    /// An upgrade Job's pod runs on the node its plan's maintenance
    /// drained; labels alone spare nothing: not on a pod no Job controls,
    /// not in anyone else's drain, not for another plan or node
    /// (where-features-meet.md, finding 13: any namespace user's Job with
    /// the stage label survived every drain).
    #[test]
    fn only_the_plans_own_upgrade_job_for_this_node_stays_in_its_drain() {
        let label = |p: &mut Pod, plan: &str, node: &str| {
            let l = p.metadata.labels.get_or_insert_default();
            l.insert(
                crate::api::upgrade::STAGE_LABEL.into(),
                crate::api::upgrade::UPGRADE_STAGE.into(),
            );
            l.insert(crate::api::upgrade::PLAN_LABEL.into(), plan.into());
            l.insert(crate::api::upgrade::NODE_LABEL.into(), node.into());
            p.spec.get_or_insert_default().node_name = Some("n1".into());
        };
        let mut upgrade = pod(Some("Job"));
        label(&mut upgrade, "k3s", "n1");
        assert!(matches!(fate(&upgrade, Some("k3s")), Fate::Skip(_)));
        assert_eq!(
            fate(&upgrade, None),
            Fate::Evict,
            "an administrator's drain"
        );
        assert_eq!(fate(&upgrade, Some("other")), Fate::Evict, "another plan's");
        let mut elsewhere = pod(Some("Job"));
        label(&mut elsewhere, "k3s", "n2");
        assert_eq!(
            fate(&elsewhere, Some("k3s")),
            Fate::Evict,
            "named for another node"
        );
        let mut bare = pod(None);
        label(&mut bare, "k3s", "n1");
        assert_eq!(fate(&bare, Some("k3s")), Fate::Evict);
        assert_eq!(fate(&pod(Some("Job")), Some("k3s")), Fate::Evict);
    }

    #[test]
    fn mirror_pods_are_skipped_even_without_owner() {
        let mut p = pod(None);
        p.metadata.annotations = Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into());
        assert!(matches!(fate(&p, None), Fate::Skip(_)));
    }

    #[test]
    fn unmanaged_pods_are_evicted_and_finished_ones_deleted() {
        // Evicted, so a PDB over bare pods holds (it was ignored).
        assert_eq!(fate(&pod(None), None), Fate::Evict);
        let mut done = pod(Some("Job"));
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert!(matches!(fate(&done, None), Fate::Delete(_)));
    }

    #[test]
    fn terminating_pods_are_waited_for() {
        let mut p = pod(Some("ReplicaSet"));
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(fate(&p, None), Fate::Terminating);
        assert!(Fate::Terminating.is_pending());
    }

    #[test]
    fn emptydir_pods_are_evicted() {
        // As the API delivers it: the volume is skipped by the slim type,
        // and the drain evicts (medik8s sets DeleteEmptyDirData).
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "o", "uid": "r", "controller": true}]},
            "spec": {"volumes": [{"name": "s", "emptyDir": {}}], "containers": []},
            "status": {"phase": "Running"},
        }))
        .unwrap();
        assert_eq!(fate(&p, None), Fate::Evict);
    }

    fn pdb(name: &str, sel: LabelSelector, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(sel),
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: Some(allowed),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        let expr = |op: &str, vals: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: op.into(),
                values: Some(vals.iter().map(|s| s.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert!(
            selector_matches(&LabelSelector::default(), &labels),
            "empty selects all"
        );
        assert!(selector_matches(&expr("In", &["web", "db"]), &labels));
        assert!(!selector_matches(&expr("NotIn", &["web"]), &labels));
        assert!(selector_matches(&expr("Exists", &[]), &labels));
        assert!(!selector_matches(&expr("DoesNotExist", &[]), &labels));
        let ml = LabelSelector {
            match_labels: Some([("app".to_string(), "db".to_string())].into()),
            ..Default::default()
        };
        assert!(!selector_matches(&ml, &labels));
    }

    #[test]
    fn pdb_blockers_name_the_budget() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            ..Default::default()
        };
        let p = pod(Some("ReplicaSet"));
        assert_eq!(pdb_blocker(&p, &[pdb("web", sel.clone(), 1)]), None);
        let msg = pdb_blocker(&p, &[pdb("web", sel.clone(), 0)]).unwrap_or_default();
        assert!(msg.contains("PodDisruptionBudget web"), "{msg}");
        let two =
            pdb_blocker(&p, &[pdb("a", sel.clone(), 1), pdb("b", sel, 1)]).unwrap_or_default();
        assert!(two.contains("2 PodDisruptionBudgets"), "{two}");
    }
}
