//! The once-per-boot record of a host command (a reboot, an upgrade):
//! before the command runs, the boot it is issued in is written on the
//! node, guarded by the resourceVersion, so that of two writers only one
//! runs it and no crash runs it twice in one boot; after it, a failure is
//! recorded on the node with that boot as its prefix. Pure: the effects
//! and the reads of those annotations.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde_json::json;

use crate::api::reboot::{FAILED_ANNOTATION, ISSUED_ANNOTATION};
use crate::decide::maintenance::annotation;
use crate::decide::{Effect, HostAction, HostRecord, Outcome};

/// How long a reboot command may run: `systemctl reboot` returns once the
/// shutdown is queued.
pub const REBOOT_COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Was a reboot issued in `boot`?
pub fn issued_in(node: &Node, boot: &str) -> bool {
    annotation(node, ISSUED_ANNOTATION) == Some(boot)
}

/// The failure of a reboot command in `boot`, if one was recorded.
pub fn failure_in<'a>(node: &'a Node, boot: &str) -> Option<&'a str> {
    annotation(node, FAILED_ANNOTATION)?
        .strip_prefix(boot)?
        .strip_prefix(": ")
}

/// Issue a reboot in `boot`: first record it on the node, guarded by the
/// resourceVersion (of two writers only one succeeds, and a failed write
/// stops the plan before the command), then run the action: on this host
/// (a command or Talos's API), or from here (the cluster role's
/// `reboot.remoteCommand`).
pub fn issue(node: &Node, boot: &str, action: HostAction) -> Vec<Effect> {
    let n = node.name_any();
    vec![
        Effect::PatchNode {
            node: n.clone(),
            resource_version: node.resource_version(),
            patch: json!({"metadata": {"annotations": {ISSUED_ANNOTATION: boot}}}),
        },
        Effect::RunHost {
            id: format!("reboot/{n}/{boot}"),
            node: n,
            action,
            record: HostRecord {
                annotation: FAILED_ANNOTATION,
                failed: format!("{boot}: "),
                succeeded: None,
            },
            timeout: REBOOT_COMMAND_TIMEOUT,
        },
    ]
}

/// After a host command: its result is recorded on the node as the effect
/// says (a failed reboot: the policy gives the node back and reports it;
/// a reboot that succeeded needs nothing — the node goes down and comes
/// back with a new boot ID).
pub fn after_command(effect: &Effect, outcome: &Outcome) -> Option<Effect> {
    let (Effect::RunHost { node, record, .. }, Outcome::HostRan { ok, output }) = (effect, outcome)
    else {
        return None;
    };
    let value = match (ok, &record.succeeded) {
        (false, _) => format!("{}{output}", record.failed),
        (true, Some(v)) => v.clone(),
        (true, None) => return None,
    };
    Some(Effect::PatchNode {
        node: node.clone(),
        // One key of our own; nothing to lose in a concurrent change.
        resource_version: None,
        patch: json!({"metadata": {"annotations": {record.annotation: value}}}),
    })
}
