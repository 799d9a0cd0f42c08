//! The drain's half of a maintenance decision: what becomes of each pod on
//! the node, and once nothing is due, the progress reported, the owner's
//! `Skip` applied past the deadline, and when to look again.

use super::detach::{self, Detach};
use super::*;

/// What becomes of each pod on the node: the drain's plan
/// (`decide::drain_plan`: kubectl drain's filters, the drain's pod
/// selector, the DrainRules' tiers, and past the deadline the owner's
/// escalation). An UpgradePlan's own upgrade Job stays on the node it
/// upgrades.
pub(super) fn fates(
    s: &Snapshot,
    p: &NodeMaintenance,
    opts: &DrainOptions,
    timed_out: bool,
) -> Vec<(Arc<Pod>, Fate)> {
    let upgrading = (owner_of(p) == Some(crate::api::upgrade::OWNER_KIND))
        .then(|| {
            p.owner_references()
                .iter()
                .find(|o| o.kind == crate::api::upgrade::OWNER_KIND)
                .map(|o| o.name.as_str())
        })
        .flatten();
    let empty = std::collections::BTreeMap::new();
    let node_labels = s
        .node
        .and_then(|n| n.metadata.labels.as_ref())
        .unwrap_or(&empty);
    // Only a pod whose eviction was refused is left: the others are
    // evicted as kured and kubectl drain evict them, a graceful stop now
    // rather than whatever the machine's shutdown does.
    let left: Option<std::collections::BTreeSet<String>> = s
        .homes
        .filter(|_| crate::decide::elsewhere::applies_to(owner_of(p)))
        .map(|h| {
            h.homeless
                .iter()
                .filter(|uid| s.attempts.get(*uid).is_some_and(|a| a.refusals > 0))
                .cloned()
                .collect()
        });
    let how = drain_plan::Drain {
        upgrading,
        pod_selector: opts.pod_selector.as_ref(),
        force: timed_out && opts.on_timeout == Escalation::Force,
        now: s.now,
        homeless: left.as_ref(),
    };
    drain_plan::plan(s.pods, node_labels, s.drain_rules, how)
        .into_iter()
        .map(|planned| (planned.pod, planned.fate))
        .collect()
}

/// Nothing to evict now: the drain's progress written (or held back
/// while it changes fast), `onTimeout: Skip` applied past the deadline, or
/// a wait for the next retry, lease renewal or deadline.
pub(super) fn report_and_wait(
    s: &Snapshot,
    p: &NodeMaintenance,
    fates: &[(Arc<Pod>, Fate)],
    opts: &DrainOptions,
    timed_out: bool,
) -> Step {
    let name = p.name_any();
    let (mut status, mut announce) = progress_status(s, p, fates, opts.timeout);
    let mut detach_wake = None;
    match detach::gate(s, p, &mut status, opts, timed_out) {
        Detach::Open => {}
        Detach::Read => return Step::ReadVolumes { nm: name },
        Detach::Fail(step) => return step,
        Detach::Hold { wake } => {
            announce = None;
            detach_wake = Some(wake);
        }
    }
    // Skip gives the node back undrained: the maintenance fails, which
    // undoes its cordon, and its owner reports why.
    if timed_out && opts.on_timeout == Escalation::Skip && fates.iter().any(|(_, f)| f.is_pending())
    {
        let blockers = status
            .last_error
            .clone()
            .unwrap_or_else(|| "pods still terminating".into());
        return Step::Fail {
            nm: name,
            reason: REASON_DRAIN_TIMEOUT,
            message: format!(
                "drain did not finish within {} s; skipped (onTimeout Skip), the node is given back undrained; blocked by {blockers}",
                opts.timeout.as_secs()
            ),
        };
    }
    let hold = if same_status(p.status.as_ref(), &status) {
        None
    } else {
        match progress_hold(p.status.as_ref(), &status, s.now) {
            Some(until) => Some(until),
            None => {
                return Step::WriteStatus {
                    nm: name,
                    status: Box::new(status),
                    announce,
                };
            }
        }
    };
    // Wake for the next retry or lease renewal, or to write the progress
    // held back; pod events wake us earlier.
    let mut wake: Vec<Timestamp> = fates
        .iter()
        .filter(|(_, f)| f.is_pending())
        .filter_map(|(pod, _)| attempt(s, pod).and_then(|a| a.retry_at))
        // A retry time that has passed belongs to a pod still Terminating
        // (a finalizer, a lost kubelet): nothing is due for it, and waking
        // "now" requeued the node at 0 ms for as long as the pod stayed.
        // Its going is a pod event; the drain deadline is below.
        .filter(|at| *at > s.now)
        .collect();
    wake.extend(s.lease_renew_at);
    wake.extend(hold);
    wake.extend(detach_wake);
    // A drain timeout has to be noticed even if no pod event arrives.
    if let Some(deadline) = drain_deadline(p, opts.timeout)
        && deadline > s.now
        && fates.iter().any(|(_, f)| f.is_pending())
    {
        wake.push(deadline);
    }
    Step::Wait(wake.into_iter().min().map(|t| duration_until(s.now, t)))
}
