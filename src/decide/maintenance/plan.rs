//! From a decided [`Step`] to the [`Plan`] that carries it out: the effects
//! in order, each with its guard, and the line the log shows. Also the
//! follow-up to an outcome ([`after`]). Pure, like the decision.

use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::status::failed_status;
use super::{Announce, Snapshot, Step};
use crate::api::nodemaintenance::*;
use crate::decide::{Effect, Outcome, Plan, Then};

/// Retry after a lease conflict, as NMO's requeue.
pub const LEASE_RETRY: Duration = Duration::from_secs(5);

/// The effects that carry out `step`, with the line the log shows for it.
/// A step about a NodeMaintenance or a node the snapshot no longer holds
/// plans nothing: the next pass decides again.
pub fn plan(s: &Snapshot, step: Step) -> Plan {
    let node = s.node_name;
    let planned = match step {
        Step::Wait(d) => Some(Plan::wait(d)),
        // The service reads the volumes and decides again before planning;
        // planned all the same, it is a short wait, not a stall.
        Step::ReadVolumes { .. } | Step::ReadHomes { .. } => {
            Some(Plan::wait(Some(Duration::from_secs(1))))
        }
        Step::Fail {
            nm,
            reason,
            message,
        } => find(s, &nm).map(|m| fail(s, m, reason, message)),
        Step::AddFinalizer { nm, lease } => find(s, &nm).map(|m| add_finalizer(s, m, lease)),
        Step::Begin { nm, status } => find(s, &nm).map(|m| {
            Plan::steps(vec![
                write_status(m, *status, s.now),
                event(
                    m,
                    false,
                    "BeginMaintenance",
                    format!("Begin a node maintenance of {node}"),
                ),
            ])
            .info(format!(
                "NodeMaintenance {nm}: maintenance of node {node} begins"
            ))
        }),
        Step::AcquireLease { .. } => Some(Plan::steps(vec![take_lease(s)])),
        Step::ApplyToNode { nm, cordon } => s.node.map(|n| apply_to_node(node, n, &nm, cordon)),
        Step::SetConditions { patch } => Some(set_conditions(node, patch)),
        Step::Drain {
            pods, grace_period, ..
        } => Some(Plan::steps(vec![Effect::Drain { pods, grace_period }])),
        Step::WriteStatus {
            nm,
            status,
            announce,
        } => find(s, &nm).map(|m| write_status_announced(s, m, *status, announce)),
        Step::RemoveFromNode { nm, uncordon } => {
            s.node.map(|n| remove_from_node(node, n, &nm, uncordon))
        }
        Step::Finish { nm, release_lease } => find(s, &nm).map(|m| finish(node, m, release_lease)),
        Step::ReleaseLease => Some(
            Plan::steps(vec![Effect::ReleaseLease { node: node.into() }]).info(format!(
                "node {node}: lease released (no maintenance of the node is left)"
            )),
        ),
    };
    planned.unwrap_or_else(|| Plan::wait(None))
}

/// The NodeMaintenance named `nm` among the node's.
fn find<'a>(s: &Snapshot<'a>, nm: &str) -> Option<&'a NodeMaintenance> {
    s.maintenances.iter().copied().find(|m| m.name_any() == nm)
}

fn fail(s: &Snapshot, m: &NodeMaintenance, reason: &'static str, message: String) -> Plan {
    let status = failed_status(m, reason, &message, s.now);
    Plan::steps(vec![
        write_status(m, status, s.now),
        event(m, true, "FailedMaintenance", message.clone()),
    ])
    .warn(format!("NodeMaintenance {}: {message}", m.name_any()))
}

fn add_finalizer(s: &Snapshot, m: &NodeMaintenance, lease: bool) -> Plan {
    let mut finalizers = m.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    // Owned by its Node, like NMO's: a deleted Node takes it along.
    // A feature's owner reference stays beside it (the list is
    // replaced whole, guarded by the resourceVersion).
    let owners = s.node.and_then(|n| {
        let node = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: n.name_any(),
            uid: n.uid()?,
            ..Default::default()
        };
        let mut owners: Vec<OwnerReference> = m
            .owner_references()
            .iter()
            .filter(|o| o.kind != "Node")
            .cloned()
            .collect();
        owners.push(node);
        Some(owners)
    });
    let mut effects = vec![Effect::SetFinalizers {
        nm: m.name_any(),
        resource_version: m.resource_version(),
        finalizers,
        owners,
    }];
    if lease {
        effects.push(take_lease(s));
    }
    Plan::together(effects)
}

fn apply_to_node(node: &str, n: &Node, nm: &str, cordon: bool) -> Plan {
    // NMO's exact taints: key and effect, no value, no timeAdded
    // (tools compare `{key, effect}` exactly). Ours from earlier
    // versions, which carried timeAdded, are rewritten the same way.
    let mut taints = taints_of(n);
    for t in taints.iter_mut().filter(|t| is_maintenance_taint(t)) {
        t.time_added = None;
    }
    for key in [UNSCHEDULABLE_TAINT, DRAIN_TAINT] {
        if !taints
            .iter()
            .any(|t| t.key == key && t.effect == "NoSchedule")
        {
            taints.push(Taint {
                key: key.into(),
                effect: "NoSchedule".into(),
                time_added: None,
                value: None,
            });
        }
    }
    let mut annotations = json!({ APPLIED_ANNOTATION: nm });
    if cordon {
        annotations[CORDONED_ANNOTATION] = json!(nm);
    }
    let what = if cordon {
        "cordoned"
    } else {
        "already cordoned by someone else; left cordoned"
    };
    Plan::steps(vec![Effect::PatchNode {
        node: node.into(),
        resource_version: n.resource_version(),
        patch: json!({
            "metadata": {
                "labels": { EXCLUDE_REMEDIATION_LABEL: "true" },
                "annotations": annotations,
            },
            "spec": { "unschedulable": true, "taints": taints },
        }),
    }])
    .info(format!(
        "node {node}: {what} and tainted for NodeMaintenance {nm}"
    ))
}

fn set_conditions(node: &str, patch: Value) -> Plan {
    let said: Vec<String> = patch["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default()
            )
        })
        .collect();
    Plan::steps(vec![Effect::PatchNodeStatus {
        node: node.into(),
        patch,
    }])
    .info(format!("node {node}: {}", said.join(" ")))
}

fn write_status_announced(
    s: &Snapshot,
    m: &NodeMaintenance,
    status: NodeMaintenanceStatus,
    announce: Option<Announce>,
) -> Plan {
    let nm = m.name_any();
    let mut effects = vec![write_status(m, status, s.now)];
    match announce {
        Some(Announce::Succeeded) => {
            effects.push(event(
                m,
                false,
                "SucceedMaintenance",
                "Node maintenance was succeeded".into(),
            ));
            Plan::steps(effects).info(format!(
                "NodeMaintenance {nm}: node {} is drained",
                s.node_name
            ))
        }
        Some(Announce::DrainTimeout(msg)) => {
            effects.push(event(m, true, "DrainTimeout", msg.clone()));
            Plan::steps(effects).warn(format!("NodeMaintenance {nm}: {msg}"))
        }
        None => Plan::steps(effects),
    }
}

fn remove_from_node(node: &str, n: &Node, nm: &str, uncordon: bool) -> Plan {
    let mut taints = taints_of(n);
    taints.retain(|t| t.key != DRAIN_TAINT && !(uncordon && t.key == UNSCHEDULABLE_TAINT));
    let mut spec = json!({ "taints": taints });
    if uncordon {
        spec["unschedulable"] = Value::Null;
    }
    let mut effects = vec![Effect::PatchNode {
        node: node.into(),
        resource_version: n.resource_version(),
        patch: json!({
            "metadata": {
                "labels": { EXCLUDE_REMEDIATION_LABEL: null },
                "annotations": { APPLIED_ANNOTATION: null, CORDONED_ANNOTATION: null },
            },
            "spec": spec,
        }),
    }];
    if uncordon {
        effects.push(event(
            n,
            false,
            "UncordonNode",
            format!("Uncordon node {node}"),
        ));
    }
    let how = if uncordon {
        ", uncordoned"
    } else {
        ", left cordoned (not ours)"
    };
    Plan::steps(effects).info(format!("node {node}: maintenance {nm} removed{how}"))
}

fn finish(node: &str, m: &NodeMaintenance, release_lease: bool) -> Plan {
    let nm = m.name_any();
    let mut effects = Vec::new();
    if release_lease {
        effects.push(Effect::ReleaseLease { node: node.into() });
    }
    effects.push(Effect::SetFinalizers {
        nm: nm.clone(),
        resource_version: m.resource_version(),
        finalizers: m
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect(),
        owners: None,
    });
    if release_lease {
        effects.push(event(
            m,
            false,
            "RemovedMaintenance",
            "Removed a node maintenance".into(),
        ));
        Plan::steps(effects).info(format!("NodeMaintenance {nm}: removed"))
    } else {
        Plan::steps(effects)
    }
}

/// The follow-up an outcome calls for, if any: a lease held by someone else
/// is counted in status (NMO's `errorOnLeaseCount`), and after more than
/// [`MAX_LEASE_ERRORS`] the maintenance fails with NMO's message, touching
/// nothing. Either way the next try is in [`LEASE_RETRY`]. A lease taken
/// beside the finalizer and found held is not followed up: the next
/// decision's [`Step::AcquireLease`] meets it again and counts it.
pub fn after(s: &Snapshot, step: &Step, outcome: &Outcome) -> Option<Plan> {
    let (Step::AcquireLease { nm }, Outcome::LeaseHeldBy(holder)) = (step, outcome) else {
        return None;
    };
    let m = s
        .maintenances
        .iter()
        .copied()
        .find(|m| m.name_any() == *nm)?;
    let count = m
        .status
        .as_ref()
        .and_then(|st| st.error_on_lease_count)
        .unwrap_or(0)
        + 1;
    let mut plan = if count > MAX_LEASE_ERRORS {
        let msg = format!("maintenance failed: lease could not be extended after {count} attempts");
        let mut st = failed_status(m, "LeaseUnavailable", &msg, s.now);
        st.error_on_lease_count = Some(count);
        Plan::steps(vec![
            write_status(m, st, s.now),
            event(m, true, "FailedMaintenance", msg.clone()),
        ])
        .warn(format!("NodeMaintenance {nm}: {msg}"))
    } else {
        let mut st = m.status.clone().unwrap_or_default();
        st.error_on_lease_count = Some(count);
        st.last_error = Some(format!(
            "lease {LEASE_NAMESPACE}/{} is held by {holder:?} (attempt {count})",
            lease_name(s.node_name)
        ));
        Plan::steps(vec![write_status(m, st, s.now)])
    };
    plan.then = Then::Wait(Some(LEASE_RETRY));
    Some(plan)
}

fn take_lease(s: &Snapshot) -> Effect {
    Effect::TakeLease {
        node: s.node_name.into(),
        node_uid: s.node.and_then(|n| n.uid()),
    }
}

fn write_status(m: &NodeMaintenance, mut status: NodeMaintenanceStatus, now: Timestamp) -> Effect {
    status.last_update = Some(Time(now));
    Effect::WriteStatus {
        nm: m.name_any(),
        resource_version: m.resource_version(),
        clear: dropped_keys(m.status.as_ref(), &status),
        status: Box::new(status),
    }
}

/// The status keys `old` has and `new` leaves out (conditions excepted: we
/// always keep them, and the schema does not allow them null).
pub(super) fn dropped_keys(
    old: Option<&NodeMaintenanceStatus>,
    new: &NodeMaintenanceStatus,
) -> Vec<String> {
    let keys = |st: Option<&NodeMaintenanceStatus>| -> Vec<String> {
        match st.map(serde_json::to_value) {
            Some(Ok(Value::Object(map))) => map.keys().cloned().collect(),
            _ => Vec::new(),
        }
    };
    let kept = keys(Some(new));
    keys(old)
        .into_iter()
        .filter(|k| k != "conditions" && !kept.contains(k))
        .collect()
}

fn event(
    obj: &impl Resource<DynamicType = ()>,
    warning: bool,
    reason: &'static str,
    note: String,
) -> Effect {
    Effect::Event {
        object: obj.object_ref(&()),
        warning,
        reason,
        note,
    }
}

/// One of the two NoSchedule taints a maintenance puts on its node.
pub(super) fn is_maintenance_taint(t: &Taint) -> bool {
    (t.key == UNSCHEDULABLE_TAINT || t.key == DRAIN_TAINT) && t.effect == "NoSchedule"
}

fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}
