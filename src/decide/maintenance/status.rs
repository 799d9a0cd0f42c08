//! The NodeMaintenance status nodekeeper writes: the first one (Running,
//! pod counts), progress while draining (pending pods, blockers, the
//! Drained condition, the timeout), and the Failed one; conditions keep
//! their transition time unless their status changes.

use std::sync::Arc;
use std::time::Duration;

use crate::api::pod::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{Announce, Snapshot, attempt, drain_deadline};
use crate::api::nodemaintenance::*;
use crate::decide::drain::{self, Fate};
use crate::decide::drain_plan;

pub(super) fn pending_refs(fates: &[(Arc<Pod>, Fate)]) -> Vec<PodReference> {
    let mut refs: Vec<PodReference> = fates
        .iter()
        .filter(|(_, f)| f.is_pending())
        .map(|(p, _)| PodReference {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
        })
        .collect();
    refs.sort();
    refs
}

pub(super) fn initial_status(s: &Snapshot, fates: &[(Arc<Pod>, Fate)]) -> NodeMaintenanceStatus {
    let refs = pending_refs(fates);
    let mut st = NodeMaintenanceStatus {
        phase: Some(Phase::Running),
        drain_progress: Some(0),
        total_pods: Some(s.pods.len() as i32),
        eviction_pods: Some(refs.len() as i32),
        pending_pods: Some(refs.iter().map(|r| r.name.clone()).collect()),
        pending_count: Some(refs.len() as i32),
        pending_pods_refs: Some(refs),
        error_on_lease_count: Some(0),
        ..Default::default()
    };
    set_condition(
        &mut st,
        s.now,
        "Accepted",
        "True",
        "Valid",
        "the node exists and has no other NodeMaintenance",
    );
    // Begin comes after the cordon (`decide`): the first status says so,
    // as the progress after it does. Said "Cordoning" here, the first
    // progress changed a condition's reason and was written at once, not
    // held (`progress_hold`): one more status write in the drain, and the
    // final Succeeded waited for it (`just bench-drain`: 40–50 ms).
    set_condition(
        &mut st,
        s.now,
        "Cordoned",
        "True",
        "Cordoned",
        CORDONED_MESSAGE,
    );
    left_for_shutdown(&mut st, s.now, fates);
    if let Some(pending) = st.pending_count.filter(|n| *n > 0) {
        set_condition(
            &mut st,
            s.now,
            "Drained",
            "False",
            "Draining",
            &draining_message(pending as usize),
        );
    }
    st
}

/// The pods a reboot or upgrade leaves on the node for its shutdown,
/// named in their condition while there are some
/// (`decide::elsewhere`).
fn left_for_shutdown(st: &mut NodeMaintenanceStatus, now: Timestamp, fates: &[(Arc<Pod>, Fate)]) {
    use crate::decide::elsewhere;
    let mut left: Vec<String> = fates
        .iter()
        .filter(|(_, f)| matches!(f, Fate::Skip(why) if why == drain_plan::NOWHERE_ELSE))
        .map(|(p, _)| drain::pod_key(p))
        .collect();
    if left.is_empty() {
        if let Some(c) = st.conditions.as_mut() {
            c.retain(|c| c.type_ != elsewhere::CONDITION);
        }
        return;
    }
    left.sort();
    set_condition(
        st,
        now,
        elsewhere::CONDITION,
        "True",
        elsewhere::REASON,
        &elsewhere::message(&left),
    );
}

const CORDONED_MESSAGE: &str = "the node is cordoned and tainted";

fn draining_message(pending: usize) -> String {
    format!("{pending} pods left to drain")
}

/// At most this many blockers are spelled out in lastError.
const MAX_BLOCKERS_SHOWN: usize = 5;

pub(super) fn progress_status(
    s: &Snapshot,
    nm: &NodeMaintenance,
    fates: &[(Arc<Pod>, Fate)],
    timeout: Duration,
) -> (NodeMaintenanceStatus, Option<Announce>) {
    let old = nm.status.clone().unwrap_or_default();
    let mut st = old.clone();
    let refs = pending_refs(fates);
    let eviction = old.eviction_pods.unwrap_or(0).max(0);
    let gone = (eviction - refs.len() as i32).max(0);
    st.drain_progress = Some(match (eviction, refs.is_empty()) {
        (_, true) => 100,
        (0, false) => 0,
        _ => gone * 100 / eviction,
    });
    st.pending_pods = Some(refs.iter().map(|r| r.name.clone()).collect());
    st.pending_count = Some(refs.len() as i32);
    st.pending_pods_refs = Some(refs.clone());

    let blockers: Vec<String> = fates
        .iter()
        .filter(|(_, f)| f.is_pending())
        .filter_map(|(pod, fate)| {
            // Why a pod is held (a later tier, WaitCompleted), else the
            // API's last refusal.
            let why = match fate {
                Fate::Held(why) => Some(why),
                _ => attempt(s, pod).and_then(|a| a.error.as_ref()),
            };
            why.map(|e| format!("pod {}: {e}", drain::pod_key(pod)))
        })
        .collect();
    st.last_error = summarize(&blockers);

    set_condition(
        &mut st,
        s.now,
        "Cordoned",
        "True",
        "Cordoned",
        CORDONED_MESSAGE,
    );
    left_for_shutdown(&mut st, s.now, fates);
    let mut announce = None;
    if refs.is_empty() {
        set_condition(
            &mut st,
            s.now,
            "Drained",
            "True",
            "Drained",
            "no pods left to drain",
        );
        if old.phase != Some(Phase::Succeeded) {
            announce = Some(Announce::Succeeded);
        }
        st.phase = Some(Phase::Succeeded);
    } else {
        let timed_out = drain_deadline(nm, timeout).is_some_and(|d| d <= s.now);
        let (reason, message) = match (&st.last_error, timed_out) {
            (Some(err), true) => (
                "DrainTimeout",
                format!(
                    "drain did not finish within {} s; blocked by {err}",
                    timeout.as_secs()
                ),
            ),
            (Some(err), false) => ("DrainBlocked", format!("blocked by {err}")),
            (None, _) => ("Draining", draining_message(refs.len())),
        };
        let was = nm.condition("Drained").map(|c| c.reason.as_str());
        if reason == "DrainTimeout" && was != Some("DrainTimeout") {
            announce = Some(Announce::DrainTimeout(message.clone()));
        }
        set_condition(&mut st, s.now, "Drained", "False", reason, &message);
        // Pods that appear after Succeeded (e.g. tolerating the taints) are
        // drained too, but a finished maintenance does not go back to Running.
        if st.phase != Some(Phase::Succeeded) {
            st.phase = Some(Phase::Running);
        }
    }
    (st, announce)
}

fn summarize(blockers: &[String]) -> Option<String> {
    match blockers.len() {
        0 => None,
        n if n <= MAX_BLOCKERS_SHOWN => Some(blockers.join("; ")),
        n => Some(format!(
            "{}; and {} more",
            blockers[..MAX_BLOCKERS_SHOWN].join("; "),
            n - MAX_BLOCKERS_SHOWN
        )),
    }
}

/// Set a condition, keeping its transition time unless its status changed.
pub fn set_condition(
    st: &mut NodeMaintenanceStatus,
    now: Timestamp,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    crate::decide::set_condition(
        st.conditions.get_or_insert_with(Vec::new),
        now,
        type_,
        status,
        reason,
        message,
    )
}

/// During a drain, a status change that only moves progress (pods gone; the
/// phase, lastError and every condition's status and reason unchanged)
/// waits until this long after the last write. Each pod's deletion is an
/// event that reconciles the node, so without this a 110-pod drain could
/// write its status once per pod. `lastUpdate` is stored in whole seconds,
/// so progress is written every one to two seconds. Errors, transitions
/// and the final Succeeded are written at once. Two seconds rather than
/// one: a drain that ends within a second or so (110 pods on a healthy
/// cluster) then writes no progress at all, and its Succeeded does not
/// queue behind a progress write the API server serves slowest just then,
/// while the replacement pods are created (`just bench-drain`: 40–50 ms).
/// With one second judged from whole seconds, one such write came a few
/// hundred milliseconds after Begin in half the drains.
pub const PROGRESS_WRITE_EVERY: Duration = Duration::from_secs(2);

/// When a progress-only change may be written, if not now.
pub(super) fn progress_hold(
    old: Option<&NodeMaintenanceStatus>,
    new: &NodeMaintenanceStatus,
    now: Timestamp,
) -> Option<Timestamp> {
    let old = old?;
    let next = old
        .last_update
        .as_ref()?
        .0
        .checked_add(k8s_openapi::jiff::SignedDuration::try_from(PROGRESS_WRITE_EVERY).ok()?)
        .ok()?;
    let reasons = |st: &NodeMaintenanceStatus| -> Vec<(String, String, String)> {
        st.conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    };
    let progress_only = old.phase == Some(Phase::Running)
        && new.phase == old.phase
        && new.last_error == old.last_error
        && reasons(new) == reasons(old);
    (progress_only && next > now).then_some(next)
}

/// Equal but for `lastUpdate`, which we stamp on every write.
pub(super) fn same_status(
    old: Option<&NodeMaintenanceStatus>,
    new: &NodeMaintenanceStatus,
) -> bool {
    let Some(old) = old else { return false };
    let mut a = old.clone();
    a.last_update = None;
    let mut b = new.clone();
    b.last_update = None;
    a == b
}

/// The Failed status: phase, the message in lastError, Accepted=False.
pub(super) fn failed_status(
    m: &NodeMaintenance,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> NodeMaintenanceStatus {
    let mut st = m.status.clone().unwrap_or_default();
    st.phase = Some(Phase::Failed);
    st.last_error = Some(message.into());
    set_condition(&mut st, now, "Accepted", "False", reason, message);
    st
}
