//! Volumes before power: which volumes a node must see detached before a
//! feature powers it off (a reboot, an upgrade) or deletes it (a
//! replacement), pure.
//!
//! Pod deletion and volume detach happen one after the other: the kubelet
//! unmounts, then the attach/detach controller takes the volume out of
//! `Node.status.volumesAttached` and asks the CSI driver to detach it,
//! which ends when the node's VolumeAttachment is gone. A node powered off
//! in between leaves the storage system to find out by itself (a
//! multi-attach error for the pod's replacement, minutes of waiting, with
//! some drivers a lost write). Cluster API waits for the same thing before
//! it deletes a Machine's node (`shouldWaitForNodeVolumes` in
//! `core/reconcilers/machine/machine_controller.go`, read at ae7ff047): an
//! attached VolumeAttachment of the node and every `volumesAttached` entry
//! count, except the volumes of pods the drain leaves on the node (their
//! claims), since those stay attached until the node goes down.
//!
//! Here a feature's NodeMaintenance does not say Succeeded until then
//! (`decide::maintenance`), so every feature that waits for the drain waits
//! for this too, inside the drain's deadline and with its escalation.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use kube::ResourceExt;

use crate::api::pod::Pod;

/// The NodeMaintenance condition that says whether the evicted pods'
/// volumes are detached.
pub const CONDITION: &str = "VolumesDetached";
/// Its reason while some are attached.
pub const REASON_ATTACHED: &str = "VolumesAttached";
/// Its reason once the drain's deadline passed with some attached.
pub const REASON_TIMEOUT: &str = "DetachTimeout";
/// Its reason when this identity may not read VolumeAttachments.
pub const REASON_UNREADABLE: &str = "NotReadable";

/// At most this many volumes are named in a status message.
const NAMED: usize = 5;
/// A name from the outside (a CSI driver's volume handle) is cut here.
const NAME_MAX: usize = 120;

/// The owners (NodeMaintenance owner kinds) whose maintenances wait for
/// volumes: those that power the node off or delete it. An administrator's
/// NodeMaintenance says Succeeded once drained, as medik8s NMO's does.
pub fn waits_for_volumes(owner: Option<&str>) -> bool {
    matches!(
        owner,
        Some(crate::api::reboot::OWNER_KIND | crate::api::upgrade::OWNER_KIND | "NodeVersion")
    )
}

/// One VolumeAttachment of the node with `status.attached`, and what its
/// PersistentVolume says (when it was read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attached {
    /// The VolumeAttachment's name.
    pub attachment: String,
    /// `spec.source.persistentVolumeName`.
    pub volume: String,
    /// The PersistentVolume's claim, `namespace/name` (`spec.claimRef`).
    pub claim: Option<String>,
    /// The name the node's `status.volumesAttached` gives it:
    /// `kubernetes.io/csi/<driver>^<volumeHandle>`.
    pub unique: Option<String>,
}

/// What the service could read of a node's attachments.
#[derive(Clone, Debug, PartialEq)]
pub enum Volumes {
    Read(Vec<Attached>),
    /// This identity may not read VolumeAttachments (403): nothing is
    /// waited for, and the condition says so.
    Unreadable(String),
    /// The read failed: the maintenance waits, saying why.
    Failed(String),
}

/// The volumes still attached to `node` that no pod still running on it
/// uses, named for a status message: `claim <ns>/<name>` where the
/// PersistentVolume names its claim, else `volume <pv>`, and the node's own
/// entries that no VolumeAttachment accounts for as they are.
pub fn still_attached(node: &Node, attached: &[Attached], pods: &[Arc<Pod>]) -> Vec<String> {
    let staying: BTreeSet<String> = pods
        .iter()
        .filter(|p| !finished(p))
        .flat_map(|p| {
            let ns = p.namespace().unwrap_or_default();
            p.spec
                .iter()
                .flat_map(|s| s.claims.iter())
                .map(move |c| format!("{ns}/{c}"))
                .collect::<Vec<_>>()
        })
        .collect();
    let accounted: BTreeSet<&str> = attached
        .iter()
        .filter_map(|a| a.unique.as_deref())
        .collect();
    let mut names: Vec<String> = attached
        .iter()
        .filter(|a| a.claim.as_ref().is_none_or(|c| !staying.contains(c)))
        .map(|a| match &a.claim {
            Some(c) => format!("claim {} (volume {})", shown(c), shown(&a.volume)),
            None => format!("volume {}", shown(&a.volume)),
        })
        .collect();
    names.extend(
        node.status
            .iter()
            .flat_map(|s| s.volumes_attached.iter().flatten())
            .filter(|v| !accounted.contains(v.name.as_str()))
            .map(|v| shown(&v.name)),
    );
    names.sort();
    names.dedup();
    names
}

/// A finished pod's volumes are detached like an evicted pod's (the
/// attach/detach controller lets go of a terminated pod's), so they are
/// waited for.
fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The list for a status message: the first few, and how many more.
pub fn listed(names: &[String]) -> String {
    match names.len() {
        n if n <= NAMED => names.join(", "),
        n => format!("{}, and {} more", names[..NAMED].join(", "), n - NAMED),
    }
}

/// When to look again while volumes are attached (nothing we watch says
/// when a VolumeAttachment goes): a quarter of the time waited so far,
/// from 2 s up to Cluster API's 20 s.
pub fn look_again_after(waited: Duration) -> Duration {
    (waited / 4).clamp(Duration::from_secs(2), Duration::from_secs(20))
}

/// A name from the outside, safe for a status message and a log line:
/// printable, and at most [`NAME_MAX`] characters.
fn shown(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(NAME_MAX)
        .collect();
    if name.chars().count() > NAME_MAX {
        format!("{clean}…")
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::node::NodeStatus;
    use k8s_openapi::api::core::v1::AttachedVolume;

    fn node(entries: &[&str]) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                volumes_attached: Some(
                    entries
                        .iter()
                        .map(|e| AttachedVolume {
                            name: e.to_string(),
                            device_path: String::new(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn attached(pv: &str, claim: Option<&str>) -> Attached {
        Attached {
            attachment: format!("csi-{pv}"),
            volume: pv.into(),
            claim: claim.map(str::to_string),
            unique: Some(format!("kubernetes.io/csi/csi.example^{pv}")),
        }
    }

    fn pod_with_claims(ns: &str, name: &str, claims: &[&str]) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(ns.into());
        p.spec = Some(crate::api::pod::PodSpec {
            node_name: Some("n1".into()),
            claims: claims.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        });
        Arc::new(p)
    }

    #[test]
    fn evicted_pods_volumes_are_waited_for_and_staying_pods_are_not() {
        let n = node(&[
            "kubernetes.io/csi/csi.example^pv-a",
            "kubernetes.io/csi/csi.example^pv-logs",
        ]);
        let att = [
            attached("pv-a", Some("shop/data")),
            attached("pv-logs", Some("kube-system/logs")),
        ];
        // The log shipper (a DaemonSet pod) stays and keeps its claim.
        let pods = [pod_with_claims("kube-system", "shipper-x", &["logs"])];
        assert_eq!(
            still_attached(&n, &att, &pods),
            ["claim shop/data (volume pv-a)"]
        );
        // Once it goes too, both are waited for.
        assert_eq!(still_attached(&n, &att, &[]).len(), 2);
    }

    #[test]
    fn an_entry_the_node_still_lists_counts_until_it_goes_and_a_detaching_attachment_after_it() {
        // The attach/detach controller takes the entry out of the node's
        // status first and detaches after: the attachment alone still counts.
        let att = [attached("pv-a", Some("shop/data"))];
        assert_eq!(still_attached(&node(&[]), &att, &[]).len(), 1);
        // An entry no attachment accounts for (an in-tree volume) counts
        // as it is.
        assert_eq!(
            still_attached(&node(&["kubernetes.io/aws-ebs/vol-1"]), &[], &[]),
            ["kubernetes.io/aws-ebs/vol-1"]
        );
        // A volume whose PersistentVolume was not readable is named by
        // its volume.
        let bare = Attached {
            attachment: "csi-x".into(),
            volume: "pv-x".into(),
            ..Default::default()
        };
        assert_eq!(still_attached(&node(&[]), &[bare], &[]), ["volume pv-x"]);
        assert!(still_attached(&node(&[]), &[], &[]).is_empty());
    }

    #[test]
    fn names_from_outside_are_printable_and_bounded() {
        let long = format!("kubernetes.io/csi/x^{}\n", "h".repeat(300));
        let names = still_attached(&node(&[&long]), &[], &[]);
        assert!(!names[0].contains('\n'));
        assert!(names[0].chars().count() <= NAME_MAX + 1);
        let many: Vec<String> = (0..8).map(|i| format!("v{i}")).collect();
        assert_eq!(listed(&many), "v0, v1, v2, v3, v4, and 3 more");
    }

    #[test]
    fn looks_again_sooner_at_first_and_never_more_often_than_every_two_seconds() {
        assert_eq!(look_again_after(Duration::ZERO), Duration::from_secs(2));
        assert_eq!(
            look_again_after(Duration::from_secs(40)),
            Duration::from_secs(10)
        );
        assert_eq!(
            look_again_after(Duration::from_secs(3600)),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn only_features_that_power_the_node_off_wait() {
        assert!(waits_for_volumes(Some("RebootPolicy")));
        assert!(waits_for_volumes(Some("UpgradePlan")));
        assert!(waits_for_volumes(Some("NodeVersion")));
        assert!(!waits_for_volumes(None));
        assert!(!waits_for_volumes(Some("MachineConfigPool")));
    }
}
