//! A pod as nodekeeper holds it: the metadata, and the few spec and status
//! fields that a drain, a blocking-pod gate and the wait for volumes read. It is
//! deserialized straight from the API's JSON (serde skips everything else),
//! so the rest of a pod never reaches memory.
//!
//! Why not `k8s_openapi`'s `Pod` with the unread parts cleared: that struct
//! is 2.4 KiB before any of its strings (every optional field of the spec
//! and status is inline), and a cluster role holds every pod in the
//! cluster. This one is under 0.5 KiB: with it the cluster role's pod store
//! over 30 000 pods went from 238 MiB to 56 MiB (`just bench-scale`).
//! Reading pods only through this type also keeps the
//! pod spec's large deserializer out of the binary.
//!
//! Evictions still go through `Api<k8s_openapi Pod>::evict` (the answer is a
//! Status, so no pod is deserialized); deletions and watches use this type.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

/// An annotation a drain reads: the kubelet's mark on mirror pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Karpenter's opt-out, on pods and nodes (`decide::do_not_disrupt`).
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// The annotations kept; every other is dropped as the pod is read.
const KEPT_ANNOTATIONS: [&str; 2] = [MIRROR_ANNOTATION, DO_NOT_DISRUPT];

/// The parts of a pod nodekeeper reads. Field names follow the API (and
/// `k8s_openapi`), so code reads `pod.spec.as_ref()?.node_name` either way.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "PodIn")]
pub struct Pod {
    /// Name, namespace, uid, resourceVersion, labels (PDB and gate
    /// selectors), owner references, deletion timestamp, and of the
    /// annotations only [`MIRROR_ANNOTATION`] and Karpenter's
    /// `karpenter.sh/do-not-disrupt`.
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSpec {
    /// The node the pod is bound to (what the node role's watch selects on
    /// and the cluster role groups by).
    pub node_name: Option<String>,
    /// How long an accepted eviction may take before we ask again.
    pub termination_grace_period_seconds: Option<i64>,
    /// The PersistentVolumeClaims it mounts, by name in its namespace (a
    /// generic ephemeral volume's claim is named `<pod>-<volume>`, as the
    /// ephemeral volume controller names it): a pod that stays on a node
    /// keeps these attached, and a reboot does not wait for them
    /// (`decide::volumes`).
    pub claims: Vec<String>,
    /// Where the scheduler may put it: its node selector, its tolerations
    /// of scheduling taints and its required node affinity (`None` when it
    /// has none of them). A reboot leaves a pod no other node can take to
    /// the kubelet's graceful shutdown (`decide::elsewhere`).
    pub placement: Option<Box<Placement>>,
}

/// A pod's scheduling constraints, as far as the question "could another
/// node run it" needs them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Every toleration but the two the DefaultTolerationSeconds admission
    /// plugin adds to every pod (`not-ready` and `unreachable` for 300 s):
    /// a node with those taints is not Ready, and not a place to go anyway.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// `requiredDuringSchedulingIgnoredDuringExecution`'s terms (ORed).
    #[serde(default)]
    pub required_terms: Vec<NodeSelectorTerm>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    pub key: Option<String>,
    pub operator: Option<String>,
    pub value: Option<String>,
    pub effect: Option<String>,
}

/// One term of a required node affinity: its requirements ANDed.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
    #[serde(default)]
    pub match_fields: Vec<Requirement>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PodStatus {
    /// Finished pods (Succeeded, Failed) are deleted, not evicted; they and
    /// pods in phase Unknown do not hold a blocking-pod gate (kured's rule).
    pub phase: Option<String>,
    /// When the kubelet started it: a do-not-disrupt duration counts from
    /// here (`decide::do_not_disrupt`).
    #[serde(rename = "startTime")]
    pub start_time: Option<Time>,
}

/// The wire form: only the metadata fields we keep are read, so managed
/// fields (most of a pod's metadata) are skipped by the parser instead of
/// being built and dropped, which in a cluster role listing 30 000 pods
/// was both CPU and heap fragmentation.
#[derive(Deserialize)]
struct PodIn {
    #[serde(default)]
    metadata: MetaIn,
    spec: Option<PodSpecIn>,
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecIn {
    node_name: Option<String>,
    termination_grace_period_seconds: Option<i64>,
    #[serde(default)]
    volumes: Vec<VolumeIn>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    tolerations: Vec<Toleration>,
    affinity: Option<AffinityIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AffinityIn {
    node_affinity: Option<NodeAffinityIn>,
}

#[derive(Deserialize)]
struct NodeAffinityIn {
    #[serde(rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    required: Option<NodeSelectorIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeSelectorIn {
    #[serde(default)]
    node_selector_terms: Vec<NodeSelectorTerm>,
}

/// The tolerations every pod gets from the DefaultTolerationSeconds
/// admission plugin.
const DEFAULT_TOLERATED: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// Of a volume, only its name and whether a claim stands behind it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeIn {
    #[serde(default)]
    name: String,
    persistent_volume_claim: Option<ClaimIn>,
    ephemeral: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimIn {
    #[serde(default)]
    claim_name: String,
}

impl PodSpecIn {
    fn kept(self, pod: Option<&str>) -> PodSpec {
        let claims = self
            .volumes
            .into_iter()
            .filter_map(|v| match (v.persistent_volume_claim, v.ephemeral, pod) {
                (Some(c), _, _) => Some(c.claim_name),
                (None, Some(_), Some(pod)) => Some(format!("{pod}-{}", v.name)),
                _ => None,
            })
            .filter(|c| !c.is_empty())
            .collect();
        let mut tolerations = self.tolerations;
        tolerations.retain(|t| {
            !(t.effect.as_deref() == Some("NoExecute")
                && t.key
                    .as_deref()
                    .is_some_and(|k| DEFAULT_TOLERATED.contains(&k)))
        });
        let required_terms = self
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required)
            .map(|r| r.node_selector_terms)
            .unwrap_or_default();
        let placement = (!self.node_selector.is_empty()
            || !tolerations.is_empty()
            || !required_terms.is_empty())
        .then(|| {
            Box::new(Placement {
                node_selector: self.node_selector,
                tolerations,
                required_terms,
            })
        });
        PodSpec {
            node_name: self.node_name,
            termination_grace_period_seconds: self.termination_grace_period_seconds,
            claims,
            placement,
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaIn {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    deletion_timestamp: Option<Time>,
}

impl From<PodIn> for Pod {
    fn from(p: PodIn) -> Pod {
        let m = p.metadata;
        let spec = p.spec.map(|spec| spec.kept(m.name.as_deref()));
        let annotations = m.annotations.and_then(|mut a| {
            a.retain(|k, _| KEPT_ANNOTATIONS.contains(&k.as_str()));
            (!a.is_empty()).then_some(a)
        });
        Pod {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                labels: m.labels,
                annotations,
                owner_references: m.owner_references,
                deletion_timestamp: m.deletion_timestamp,
                ..Default::default()
            },
            spec,
            status: p.status,
        }
    }
}

core_v1_kind!(Pod, "Pod", "pods", k8s_openapi::NamespaceResourceScope);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_drain_needs_from_a_full_pod_and_skips_the_rest() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u1",
                "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {"kubernetes.io/config.mirror": "abc", "team": "shop",
                    "karpenter.sh/do-not-disrupt": "1h"},
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web", "uid": "r1", "controller": true}],
            },
            "spec": {
                "nodeName": "n1",
                "terminationGracePeriodSeconds": 45,
                "containers": [{"name": "app", "image": "app:1",
                    "readinessProbe": {"httpGet": {"path": "/", "port": 80}}}],
                "volumes": [{"name": "cache", "emptyDir": {}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "startTime": "2026-11-29T11:00:00Z",
                "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.termination_grace_period_seconds, Some(45));
        assert_eq!(spec.claims, ["web-data", "web-1-scratch"]);
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );
        let meta = &pod.metadata;
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert_eq!(meta.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(
            meta.annotations,
            Some(BTreeMap::from([
                (MIRROR_ANNOTATION.to_string(), "abc".to_string()),
                ("karpenter.sh/do-not-disrupt".to_string(), "1h".to_string())
            ]))
        );
        let started = pod.status.as_ref().and_then(|s| s.start_time.as_ref());
        assert_eq!(
            started.map(|t| t.0.to_string()).as_deref(),
            Some("2026-11-29T11:00:00Z")
        );
        assert_eq!(meta.managed_fields, None);
        assert_eq!(
            meta.owner_references.as_ref().unwrap()[0].kind,
            "ReplicaSet"
        );
        assert!(std::mem::size_of::<Pod>() < 512);
    }
}
