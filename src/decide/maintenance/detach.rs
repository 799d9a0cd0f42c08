//! The last check before a feature's maintenance says Succeeded: the
//! evicted pods' volumes are detached from the node (`decide::volumes`),
//! within the drain's deadline and with its escalation. An
//! administrator's maintenance is not held (medik8s NMO's Succeeded means
//! drained).

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::*;
use crate::decide::volumes::{self, Volumes};

/// What the gate makes of a drained maintenance's progress.
pub(super) enum Detach {
    /// Nothing to wait for (or not this maintenance's business): as the
    /// drain said.
    Open,
    /// The volumes are not read yet: the service reads them and decides
    /// again.
    Read,
    /// Volumes attached: `status` is Running with the condition and
    /// lastError naming them; look again at `wake`.
    Hold { wake: Timestamp },
    /// Past the deadline with `onTimeout: Skip`: the maintenance fails.
    Fail(Step),
}

/// Apply the gate to `status` (a drained maintenance's progress, about to
/// say Succeeded).
pub(super) fn gate(
    s: &Snapshot,
    p: &NodeMaintenance,
    status: &mut NodeMaintenanceStatus,
    opts: &DrainOptions,
    timed_out: bool,
) -> Detach {
    let already = p.status.as_ref().and_then(|st| st.phase) == Some(Phase::Succeeded);
    if status.phase != Some(Phase::Succeeded) || already || !volumes::waits_for_volumes(owner_of(p))
    {
        return Detach::Open;
    }
    let (Some(node), Some(read)) = (s.node, s.volumes) else {
        return Detach::Read;
    };
    let attached = match read {
        Volumes::Unreadable(why) => {
            let msg = format!("not checked: {why}");
            set_condition(
                status,
                s.now,
                volumes::CONDITION,
                "Unknown",
                volumes::REASON_UNREADABLE,
                &msg,
            );
            return Detach::Open;
        }
        Volumes::Failed(why) => vec![format!("(the node's volumes could not be read: {why})")],
        Volumes::Read(att) => volumes::still_attached(node, att, s.pods),
    };
    if attached.is_empty() {
        let msg = "no volume of an evicted pod is attached to the node";
        set_condition(status, s.now, volumes::CONDITION, "True", "Detached", msg);
        return Detach::Open;
    }
    let named = volumes::listed(&attached);
    let secs = opts.timeout.as_secs();
    match (timed_out, opts.on_timeout) {
        (true, Escalation::Skip) => Detach::Fail(Step::Fail {
            nm: p.name_any(),
            reason: REASON_DRAIN_TIMEOUT,
            message: format!(
                "volumes not detached within {secs} s of the drain's start; skipped (onTimeout Skip), the node is given back: {named}"
            ),
        }),
        (true, Escalation::Force) => {
            let msg = format!(
                "still attached after the drain's deadline ({secs} s); going on (onTimeout Force): {named}"
            );
            set_condition(
                status,
                s.now,
                volumes::CONDITION,
                "False",
                volumes::REASON_TIMEOUT,
                &msg,
            );
            Detach::Open
        }
        (timed_out, _) => {
            let (reason, msg) = if timed_out {
                (
                    volumes::REASON_TIMEOUT,
                    format!(
                        "still attached after the drain's deadline ({secs} s), waiting (onTimeout Wait): {named}"
                    ),
                )
            } else {
                (
                    volumes::REASON_ATTACHED,
                    format!("waiting for volumes to detach: {named}"),
                )
            };
            set_condition(status, s.now, volumes::CONDITION, "False", reason, &msg);
            status.phase = Some(Phase::Running);
            status.last_error = Some(msg);
            Detach::Hold {
                wake: wake(s, p, opts, timed_out),
            }
        }
    }
}

/// The next look: sooner at first, then every 20 s (nothing we watch says
/// when a VolumeAttachment goes), and at the deadline.
fn wake(s: &Snapshot, p: &NodeMaintenance, opts: &DrainOptions, timed_out: bool) -> Timestamp {
    let since = p
        .condition(volumes::CONDITION)
        .filter(|c| c.status == "False")
        .map_or(s.now, |c| c.last_transition_time.0);
    let waited = Duration::try_from(s.now.duration_since(since)).unwrap_or_default();
    let again = SignedDuration::try_from(volumes::look_again_after(waited)).unwrap_or_default();
    let mut at = s.now.checked_add(again).unwrap_or(s.now);
    if !timed_out
        && let Some(deadline) = drain_deadline(p, opts.timeout)
        && deadline > s.now
    {
        at = at.min(deadline);
    }
    at
}
