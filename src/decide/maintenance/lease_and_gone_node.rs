//! Two rules the maintenance decision leans on: a maintenance whose Node
//! is gone (or never was), and when finishing a maintenance releases the
//! node's lease (medik8s's coordination with remediators).

use super::*;

/// No Node object: new objects fail as NMO's webhook would have refused
/// them; objects whose node went away keep their finalizer until deleted.
/// A running maintenance whose node went away failed; a succeeded one did
/// not (its drain is done: deleting the node after it is how a node is
/// decommissioned or replaced), and its Node owner reference brings its
/// deletion. Once none is left, a lease this process still holds for the
/// node goes, as on a node that exists.
pub(super) fn decide_without_node(s: &Snapshot, nms: &[&NodeMaintenance]) -> Step {
    for nm in nms {
        let name = nm.name_any();
        if nm.is_deleting() {
            if nm.has_finalizer() {
                return Step::Finish {
                    nm: name,
                    release_lease: releases_lease(nm, nms),
                };
            }
            continue;
        }
        match nm.phase() {
            None => {
                let message = if is_node_name(s.node_name) {
                    missing_node_message(s.node_name)
                } else {
                    invalid_name_message(s.node_name)
                };
                return Step::Fail {
                    nm: name,
                    reason: REASON_INVALID_NODE,
                    message,
                };
            }
            Some(Phase::Running) => {
                return Step::Fail {
                    nm: name,
                    reason: REASON_NODE_GONE,
                    message: format!("node {} was deleted during maintenance", s.node_name),
                };
            }
            Some(Phase::Succeeded | Phase::Failed) => {}
        }
    }
    if nms.iter().all(|nm| nm.is_deleting()) && s.lease_renew_at.is_some() {
        return Step::ReleaseLease;
    }
    Step::Wait(None)
}

/// A maintenance that got past its first status held the node's lease.
fn owned_lease(nm: &NodeMaintenance) -> bool {
    matches!(nm.phase(), Some(Phase::Running | Phase::Succeeded))
}

/// Does finishing `nm` release the node's lease? If it held it (past its
/// first status), or if it may have taken it with its finalizer and was
/// deleted before it began, unless another maintenance of the node that
/// took our finalizer goes on (the lease is its). The second case was
/// left to this process's memory of the lease (released once no
/// maintenance is left), lost with a restart: the lease then held the
/// node from medik8s remediators for an hour (found by the maintenance
/// worlds). The release is the holder's only, so asking is harmless.
pub(super) fn releases_lease(nm: &NodeMaintenance, nms: &[&NodeMaintenance]) -> bool {
    owned_lease(nm)
        || (nm.phase().is_none()
            && !nms.iter().any(|o| {
                o.name_any() != nm.name_any()
                    && !o.is_deleting()
                    && o.has_finalizer()
                    && o.phase() != Some(Phase::Failed)
            }))
}
