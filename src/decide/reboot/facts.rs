//! What the reboot decisions read off nodes and NodeMaintenances, and the
//! objects and patches they write: need and pause markers (ours, the CoreOS
//! reboot operator's, FLUO's/CLUO's), boot IDs and the once-per-boot
//! record, the NodeMaintenance a policy takes a node with. What every
//! disruption feature reads (boot ID, Ready, gates) is in
//! [`crate::decide::disrupt`], re-exported here.

use crate::api::node::Node;
use kube::ResourceExt;
use serde_json::json;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::*;
use crate::decide::HostAction;
use crate::decide::disrupt;
pub use crate::decide::disrupt::{blocking_pod, boot_id, node_ref, ready, unschedulable};
use crate::decide::maintenance::annotation;

/// Does any of the supported signals say the node needs a reboot?
pub fn needs_reboot(node: &Node) -> bool {
    annotation(node, NEEDED_ANNOTATION).is_some()
        || annotation(node, COREOS_NEEDED_ANNOTATION).is_some()
        || [FLUO_PREFIX, CLUO_PREFIX]
            .iter()
            .any(|p| annotation(node, &format!("{p}reboot-needed")) == Some("true"))
}

/// When nodekeeper's own need marker was set, if it holds a time.
pub fn needed_since(node: &Node) -> Option<k8s_openapi::jiff::Timestamp> {
    annotation(node, NEEDED_ANNOTATION)?.parse().ok()
}

/// Was the need on `node` stamped in an earlier boot (its
/// [`NEEDED_BOOT_ANNOTATION`] names another boot), or was a reboot issued
/// for this very need (the node's [`ISSUED_ANNOTATION`], whichever policy
/// wrote it) in an earlier boot? Then a reboot since served it — ours, or
/// one nobody asked for — as kured's sentinel is gone after any reboot; no
/// clock is read. The record is the node's, so a node relabelled from one
/// policy to another after its command failed and its host rebooted anyway
/// is not rebooted for the same need again (found by the random worlds).
/// Only a stamp that is a time names one ask: a hand-written `now` or
/// `true` written again after a reboot is a new need (the reboot
/// benchmark asks every node twice with `now`).
pub fn need_outlived(node: &Node) -> bool {
    let Some(stamp) = annotation(node, NEEDED_ANNOTATION) else {
        return false;
    };
    let earlier = |boot: &str| boot_id(node).is_some_and(|now| now != boot);
    let stamped_earlier = annotation(node, NEEDED_BOOT_ANNOTATION).is_some_and(earlier);
    let one_ask = stamp.parse::<k8s_openapi::jiff::Timestamp>().is_ok();
    let issued_earlier = one_ask
        && annotation(node, ISSUED_ANNOTATION)
            .and_then(|r| r.split_once("@need="))
            .is_some_and(|(boot, need)| need == stamp && earlier(boot));
    stamped_earlier || issued_earlier
}

/// Is the need on `node` one the verified reboot of `entry` (Settling or
/// Done) served? The node rebooted since `entry.boot_id_before`, and the
/// need was stamped before the verification (or carries no time: the
/// CoreOS and FLUO markers, which their agents clear after a reboot). A
/// newer stamp (`reboot-required` after the reboot) is a new need.
///
/// The stamp is compared with the one recorded at admission
/// ([`NodeReboot::need`]), not by time: a need stamped by a clock 30 s
/// ahead of the cluster role's read as newer than the reboot that served
/// it and rebooted the node again (found by the random worlds with skewed
/// clocks).
///
/// A Failed entry counts too once the node has rebooted since: any reboot
/// serves a reboot need (kured reads its sentinel, gone after a reboot),
/// so a command that reported failure while the host went down anyway
/// does not lead to a second reboot.
pub fn stale_need(node: &Node, entry: &NodeReboot) -> bool {
    let served = matches!(
        entry.phase,
        RebootPhase::Settling | RebootPhase::Done | RebootPhase::Failed
    );
    if !served || !needs_reboot(node) {
        return false;
    }
    let rebooted = entry
        .boot_id_before
        .as_deref()
        .is_some_and(|b| boot_id(node).is_some_and(|now| now != b));
    if !rebooted {
        return false;
    }
    // Stamped with its boot: served once the node has booted since.
    if annotation(node, NEEDED_BOOT_ANNOTATION).is_some()
        && annotation(node, NEEDED_ANNOTATION).is_some()
    {
        return need_outlived(node);
    }
    match (annotation(node, NEEDED_ANNOTATION), entry.need.as_deref()) {
        // Markers without a stamp (CoreOS, FLUO): their agents clear them.
        (None, _) => true,
        // The stamp the reboot was admitted on: served. Another: new. A
        // literal (`now`) carries its boot once admitted (see
        // [`stamp_need_boot`]): one without it was written after our clear.
        (Some(now), Some(served)) => now == served && needed_since(node).is_some(),
        // A status written before the need was recorded: by the clocks.
        (Some(_), None) => needed_since(node).is_none_or(|t| t <= entry.since.0),
    }
}

/// A need written without its boot (a hand-written `now` or `true`) tied
/// to the boot it is admitted in, before its NodeMaintenance is created:
/// once the node has booted since, the need is served ([`need_outlived`])
/// and cleared, while the same literal written again after the clear is a
/// new ask (it carries no boot). Without it, a second `now` on a node
/// whose last reboot was Done under the same policy read as the first and
/// was cleared without a reboot.
pub fn stamp_need_boot(node: &Node, boot: &str) -> Option<crate::decide::Effect> {
    annotation(node, NEEDED_ANNOTATION)?;
    if annotation(node, NEEDED_BOOT_ANNOTATION).is_some() {
        return None;
    }
    Some(crate::decide::Effect::PatchNode {
        node: node.name_any(),
        resource_version: None,
        patch: json!({"metadata": {"annotations": {NEEDED_BOOT_ANNOTATION: boot}}}),
    })
}

/// What `reboot-required NODE` writes at `stamp` (the person's clock): a
/// new ask — a new need stamp with the boot it was stamped in, the last
/// failure cleared — unless the reboot the current need asked for was
/// issued in this boot and has not failed: then `Err` says it is under
/// way, and nothing is written (asking twice never runs a command twice;
/// asking after a failure runs it again, [`crate::decide::once_per_boot`]).
pub fn ask_again(node: &Node, stamp: &str) -> Result<serde_json::Value, String> {
    use crate::decide::once_per_boot::{Ask, failure_in, issued_in};
    let boot = boot_id(node);
    if let Some(boot) = boot {
        let ask = Ask::need(node, boot);
        if ask.epoch.is_some() && issued_in(node, &ask) && failure_in(node, &ask).is_none() {
            return Err(format!(
                "its reboot was issued in this boot (boot ID {boot}) and has not failed: it is under way"
            ));
        }
    }
    Ok(json!({"metadata": {"annotations": {
        NEEDED_ANNOTATION: stamp,
        NEEDED_BOOT_ANNOTATION: boot,
        FAILED_ANNOTATION: null,
    }}}))
}

/// Is the node held by an administrator (`nodekeeper.io/reboot-paused`, or
/// FLUO's/CLUO's `reboot-paused`, set to "true")?
pub fn paused(node: &Node) -> bool {
    annotation(node, PAUSED_ANNOTATION) == Some("true")
        || [FLUO_PREFIX, CLUO_PREFIX]
            .iter()
            .any(|p| annotation(node, &format!("{p}reboot-paused")) == Some("true"))
}

/// The patch that clears every need marker we honour (FLUO's and CLUO's
/// are set to "false", as their agents do after a reboot).
pub fn clear_need_patch(node: &Node) -> serde_json::Value {
    let mut ann = serde_json::Map::new();
    for key in [
        NEEDED_ANNOTATION,
        NEEDED_BOOT_ANNOTATION,
        COREOS_NEEDED_ANNOTATION,
    ] {
        if annotation(node, key).is_some() {
            ann.insert(key.into(), serde_json::Value::Null);
        }
    }
    let mut labels = serde_json::Map::new();
    for p in [FLUO_PREFIX, CLUO_PREFIX] {
        let key = format!("{p}reboot-needed");
        if annotation(node, &key) == Some("true") {
            ann.insert(key.clone(), json!("false"));
        }
        if node.labels().get(&key).map(String::as_str) == Some("true") {
            labels.insert(key, json!("false"));
        }
    }
    let mut meta = json!({ "annotations": ann });
    if !labels.is_empty() {
        meta["labels"] = serde_json::Value::Object(labels);
    }
    json!({ "metadata": meta })
}

/// Is this NodeMaintenance the one `policy` takes its node with?
pub fn owned_by(nm: &NodeMaintenance, policy: &str) -> bool {
    disrupt::owned_by(nm, OWNER_KIND, policy)
}

/// The name of the NodeMaintenance a policy takes `node` with.
pub fn maintenance_name(node: &str) -> String {
    disrupt::maintenance_name("reboot", node)
}

/// The NodeMaintenance a policy takes a node with: owned by the policy
/// (deleting the policy gives its nodes back), the boot ID recorded, the
/// policy's drain options attached.
pub fn maintenance_for(p: &RebootPolicy, node: &Node, boot: &str) -> NodeMaintenance {
    disrupt::take(
        disrupt::owner_ref(p, OWNER_KIND),
        &maintenance_name(&node.name_any()),
        &node.name_any(),
        &p.spec.drain,
        boot,
        format!("reboot: {}", p.name_any()),
    )
}

/// Expand `{node}` in an argv template. Arguments are never joined into a
/// shell string: a node name cannot inject a command.
pub fn argv(template: &[String], node: &str) -> Vec<String> {
    template.iter().map(|a| a.replace("{node}", node)).collect()
}

/// Whether the kubelet says the node runs Talos (`status.nodeInfo.osImage`
/// is `Talos (v1.x.y)` there): no shell and no systemd, reboots and
/// upgrades through machined's API.
pub fn is_talos(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .is_some_and(|i| i.os_image.starts_with("Talos"))
}

/// The Talos release the node's osImage names (`Talos (v1.12.3)` →
/// (1, 12)), if it is Talos and names one.
pub fn talos_release(node: &Node) -> Option<(u64, u64)> {
    let image = &node.status.as_ref()?.node_info.as_ref()?.os_image;
    let version = image.strip_prefix("Talos")?.split_once("(v")?.1;
    let mut parts = version.split(['.', ')', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// How the node agent reboots `node` under `reboot` (its `method`): through
/// Talos's API, or by running `command` on the host.
pub fn reboot_action(reboot: &RebootSpec, node: &Node) -> HostAction {
    match reboot.method.as_str() {
        "Talos" => HostAction::TalosReboot,
        "Auto" if is_talos(node) => HostAction::TalosReboot,
        _ => HostAction::Command(argv(&reboot.command, &node.name_any())),
    }
}
