//! The life of the kinds around a rollout, pure: PendingNodes (status from
//! the provider, a join past its deadline turned into a leave, a leave
//! driving the instance's deletion), ScalingGroups no NodeVersion follows,
//! AutoscalingStrategies (the autoscaler Deployment's replicas and command)
//! and JoiningNodes (components stamped on the node). The groups a
//! NodeVersion follows are `groups.rs`'.

use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::{Kind, Snapshot, backing_off, delete_key, deleting, plus, state};
use crate::api::constellation::*;
use crate::decide::{Effect, Plan, duration_until, set_condition};

/// PendingNodes: write what the provider says, delete a leave that
/// reached its goal, turn a join past its deadline into a leave, and ask
/// the provider to delete a leaving instance (once, again past the
/// deadline).
///
/// Every PendingNode's step goes in one round (a surge of three joins and
/// three leaves took a round each, every round waiting for the watches):
/// the writes first, in order, then the provider calls, which the service
/// runs at once, then the events. Each node's write still comes before its
/// call (the delete is recorded as issued before it is asked), and a
/// failed call ends nothing but the events after it.
pub fn pending(s: &Snapshot) -> Option<Plan> {
    let plans: Vec<Plan> = s.pending.iter().filter_map(|p| pending_one(s, p)).collect();
    if plans.is_empty() {
        return None;
    }
    let (mut writes, mut calls, mut events, mut notes) = (vec![], vec![], vec![], vec![]);
    let mut level = log::Level::Info;
    for plan in plans {
        for e in plan.effects {
            match e {
                Effect::Provider { .. } => calls.push(e),
                Effect::Event { .. } => events.push(e),
                _ => writes.push(e),
            }
        }
        if let Some((l, line)) = plan.note {
            level = level.min(l);
            notes.push(line);
        }
    }
    writes.extend(calls);
    writes.extend(events);
    let plan = Plan::steps(writes);
    Some(if notes.is_empty() {
        plan
    } else if level == log::Level::Warn {
        plan.warn(notes.join("; "))
    } else {
        plan.info(notes.join("; "))
    })
}

/// One PendingNode's step, if it has one.
fn pending_one(s: &Snapshot, p: &PendingNode) -> Option<Plan> {
    // Its delete is running: its answer decides the next step (and kicks
    // the round that takes it); asking the state meanwhile would only
    // spend provider calls and status writes.
    if deleting(s, p) {
        return None;
    }
    {
        let goal = p.spec.goal.as_deref().unwrap_or_default();
        let node = p.spec.node_name.as_deref().unwrap_or_default();
        let node_exists = s.nodes.iter().any(|n| n.name_any() == node);
        let st = state(s, p);
        let reached = match goal {
            "Join" => node_exists && st.as_deref() == Some("Ready"),
            "Leave" => st.as_deref() == Some("Terminated"),
            _ => false,
        };
        let status = PendingNodeStatus {
            csp_state: st.clone().or(Some("Unknown".into())),
            reached_goal: reached,
        };
        let leaving = goal == "Leave" && !node_exists && !reached;
        if p.status.as_ref() != Some(&status) {
            let write = Effect::WriteObjectStatus {
                kind: Kind::PendingNode,
                name: p.name_any(),
                resource_version: p.resource_version(),
                status: serde_json::to_value(&status).unwrap_or_default(),
            };
            // A leave that reached its goal is recorded and deleted in one
            // round (Constellation's reconcile does both); a leave whose
            // delete is still to be asked asks first, and its state is
            // recorded in a later round (it changes with the delete
            // anyway): each round here waits for the watches and the
            // provider's answers.
            if goal == "Leave" && reached {
                return Some(Plan::steps(vec![write, super::delete_pending(p)]));
            }
            if leaving && let Leave::Issue(plan) = leave(s, p, st.as_deref()) {
                return Some(plan);
            }
            return Some(Plan::steps(vec![write]));
        }
        let past = p.spec.deadline.as_ref().is_some_and(|d| s.now >= d.0);
        match goal {
            "Leave" if reached => {
                return Some(Plan::steps(vec![super::delete_pending(p)]));
            }
            "Join" if !reached && past => {
                let pid = p.spec.provider_id.clone().unwrap_or_default();
                return Some(
                    Plan::steps(vec![
                        Effect::PatchObject {
                            kind: Kind::PendingNode,
                            namespace: None,
                            name: p.name_any(),
                            patch: json!({
                                "metadata": {
                                    "annotations": { DELETE_ISSUED_ANNOTATION: s.now.to_string() },
                                    "resourceVersion": p.resource_version(),
                                },
                                "spec": {
                                    "goal": "Leave",
                                    "deadline": plus(s.now, s.nv.spec.leave_timeout_seconds),
                                },
                            }),
                            status: false,
                            strategic: false,
                        },
                        Effect::Provider {
                            key: delete_key(&pid),
                            verb: "delete-node",
                            request: json!({ "providerID": pid }),
                        },
                        Effect::Event {
                            object: nv_ref(s),
                            warning: true,
                            reason: "JoinTimeout",
                            note: format!(
                                "node {node} ({pid}) did not join within {} s: its instance is deleted and the rollout goes on",
                                s.nv.spec.join_timeout_seconds
                            ),
                        },
                    ])
                    .warn(format!(
                        "node {node} did not join by its deadline; deleting instance {pid}"
                    )),
                );
            }
            // A surge node that joined on an image the NodeVersion no
            // longer names (it changed while the node came up) is no heir:
            // it was made to replace a node that now gets a node of the
            // new image, so it is surplus — obsolete, drained and deleted,
            // counted in the surge until it is gone. Kept as a Join, its
            // PendingNode held the surge budget for good and the rollout
            // never moved (where-features-meet.md C3); replaced in turn
            // like an outdated node, as Constellation has it, every such
            // node grew the pool for good (found by the random worlds:
            // three nodes became six after an image change mid-rollout).
            "Join" if reached && joined_outdated(s, node) => {
                let mark = s
                    .nodes
                    .iter()
                    .find(|n| n.name_any() == node)
                    .map(|n| super::retire::set(n, OBSOLETE_ANNOTATION, "true"));
                let mut fx: Vec<Effect> = mark.into_iter().collect();
                fx.push(super::delete_pending(p));
                fx.push(Effect::Event {
                    object: nv_ref(s),
                    warning: false,
                    reason: "JoinedOutdated",
                    note: format!(
                        "surge node {node} joined on an image the NodeVersion no longer names: surplus, it is drained and deleted"
                    ),
                });
                return Some(Plan::steps(fx).info(format!(
                    "surge node {node} joined outdated: obsolete, its PendingNode is deleted"
                )));
            }
            "Leave" if leaving => {
                if let Leave::Issue(plan) = leave(s, p, st.as_deref()) {
                    return Some(plan);
                }
            }
            _ => {}
        }
    }
    None
}

/// Node `name` is annotated with an image or components that are not the
/// NodeVersion's (not yet annotated: awaiting, as `classify` has it).
fn joined_outdated(s: &Snapshot, name: &str) -> bool {
    s.nodes.iter().any(|n| {
        n.name_any() == name
            && n.annotations().get(IMAGE_ANNOTATION).is_some_and(|image| {
                let components = n.annotations().get(COMPONENTS_ANNOTATION);
                (components.is_some() || super::components_wanted(s).is_none())
                    && super::differs(s, Some(image), components.map(String::as_str))
            })
    })
}

/// What a leaving PendingNode whose Node is gone needs of the provider.
enum Leave {
    /// Ask for the instance's deletion (recorded on the PendingNode first).
    Issue(Plan),
    /// Asked already, or refused and backing off.
    Wait,
}

/// Ask the provider to delete a leaving instance: once, again past the
/// leave deadline, and again after a refusal's backoff.
fn leave(s: &Snapshot, p: &PendingNode, st: Option<&str>) -> Leave {
    let node = p.spec.node_name.as_deref().unwrap_or_default();
    let pid = p.spec.provider_id.clone().unwrap_or_default();
    let key = delete_key(&pid);
    let issued = p
        .annotations()
        .get(DELETE_ISSUED_ANNOTATION)
        .and_then(|t| t.parse::<Timestamp>().ok());
    let again = issued.is_some_and(|t| s.now >= plus(t, s.nv.spec.leave_timeout_seconds));
    let terminating = st == Some("Terminating");
    // A delete the provider refused is asked again after the backoff, not
    // only at the deadline.
    let refused = s.failures.contains_key(&key);
    if !((issued.is_none() && !terminating) || again || refused) || backing_off(s, &key).is_some() {
        return Leave::Wait;
    }
    let mut fx = vec![
        Effect::PatchObject {
            kind: Kind::PendingNode,
            namespace: None,
            name: p.name_any(),
            patch: json!({ "metadata": {
                "annotations": { DELETE_ISSUED_ANNOTATION: s.now.to_string() },
                "resourceVersion": p.resource_version(),
            }}),
            status: false,
            strategic: false,
        },
        Effect::Provider {
            key,
            verb: "delete-node",
            request: json!({ "providerID": pid }),
        },
    ];
    if again {
        fx.push(Effect::Event {
            object: nv_ref(s),
            warning: true,
            reason: "LeaveOverdue",
            note: format!(
                "instance {pid} of node {node} has not terminated within {} s; deletion asked again",
                s.nv.spec.leave_timeout_seconds
            ),
        });
    }
    Leave::Issue(Plan::steps(fx))
}

/// A leave past its deadline and not terminated.
pub fn leave_overdue(s: &Snapshot, p: &PendingNode) -> bool {
    p.spec.goal.as_deref() == Some("Leave")
        && p.spec.deadline.as_ref().is_some_and(|d| s.now >= d.0)
        && state(s, p).as_deref() != Some("Terminated")
}

fn nv_ref(s: &Snapshot) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(format!("{GROUP}/v1alpha1")),
        kind: Some("NodeVersion".into()),
        name: Some(s.nv.name_any()),
        uid: s.nv.uid(),
        ..Default::default()
    }
}

/// The cluster-autoscaler's command for a strategy and the groups:
/// `./cluster-autoscaler`, then `--k=v` per extra argument and
/// `--nodes=min:max:name` per autoscaled worker group, sorted.
pub fn autoscaler_command(st: &AutoscalingStrategy, groups: &[Arc<ScalingGroup>]) -> Vec<String> {
    let mut args: Vec<String> = st
        .spec
        .autoscaler_extra_args
        .iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect();
    for g in groups {
        if g.spec.autoscaling == Some(true) && g.spec.role.as_deref() != Some("ControlPlane") {
            args.push(format!(
                "--nodes={}:{}:{}",
                g.spec.min.unwrap_or(0),
                g.spec.max.unwrap_or(0),
                g.spec.autoscaler_group_name.as_deref().unwrap_or_default()
            ));
        }
    }
    args.sort();
    let mut cmd = vec!["./cluster-autoscaler".to_string()];
    cmd.extend(args);
    cmd
}

/// An AutoscalingStrategy against its Deployment (`None`: not there, so
/// nothing to do): the status it should show, then the Deployment write
/// that makes it run 1 replica (enabled) or 0 with the built command.
pub fn strategy(
    st: &AutoscalingStrategy,
    groups: &[Arc<ScalingGroup>],
    deployment: Option<&Value>,
    now: Timestamp,
) -> Vec<Effect> {
    let old = st.status.clone().unwrap_or_default();
    let write = |status: &AutoscalingStrategyStatus| Effect::WriteObjectStatus {
        kind: Kind::AutoscalingStrategy,
        name: st.name_any(),
        resource_version: st.resource_version(),
        status: serde_json::to_value(status).unwrap_or_default(),
    };
    let Some(d) = deployment else {
        // Nothing to scale: say so on the strategy (it had no status at
        // all), once.
        let msg = format!(
            "Deployment {}/{} does not exist; nothing is scaled until it does",
            st.spec.deployment_namespace, st.spec.deployment_name
        );
        let mut status = AutoscalingStrategyStatus {
            enabled: false,
            replicas: 0,
            conditions: old.conditions.clone(),
        };
        set_condition(
            &mut status.conditions,
            now,
            CONDITION_DEPLOYMENT_FOUND,
            "False",
            "NotFound",
            &msg,
        );
        if st.status.as_ref() == Some(&status) {
            return Vec::new();
        }
        return vec![
            write(&status),
            Effect::Event {
                object: object_ref(st, "AutoscalingStrategy"),
                warning: true,
                reason: "DeploymentNotFound",
                note: msg,
            },
        ];
    };
    let replicas = d["spec"]["replicas"].as_i64();
    let mut conditions = old.conditions.clone();
    conditions.retain(|c| c.type_ != CONDITION_DEPLOYMENT_FOUND);
    let status = AutoscalingStrategyStatus {
        enabled: replicas.unwrap_or(0) > 0,
        replicas: replicas.unwrap_or(0) as i32,
        conditions,
    };
    let mut fx = Vec::new();
    if st.status.as_ref() != Some(&status) {
        fx.push(write(&status));
    }
    let expected = if st.spec.enabled { 1 } else { 0 };
    let command = autoscaler_command(st, groups);
    let current = &d["spec"]["template"]["spec"]["containers"][0]["command"];
    let has_container = d["spec"]["template"]["spec"]["containers"][0].is_object();
    if replicas != Some(expected) || (has_container && *current != json!(command)) {
        let mut spec = json!({ "replicas": expected });
        if has_container {
            // Strategic merge: the container is matched by name, the
            // rest of the pod template stays.
            let container = &d["spec"]["template"]["spec"]["containers"][0]["name"];
            spec["template"] = json!({ "spec": { "containers": [
                { "name": container, "command": command }
            ]}});
        }
        // Guarded by the resourceVersion it was read at: a change since
        // (a person scaling it) is decided on again, not overwritten.
        let guard = json!({ "resourceVersion": d["metadata"]["resourceVersion"] });
        fx.push(Effect::PatchObject {
            kind: Kind::Deployment,
            namespace: Some(st.spec.deployment_namespace.clone()),
            name: st.spec.deployment_name.clone(),
            patch: json!({ "metadata": guard, "spec": spec }),
            status: false,
            strategic: true,
        });
    }
    fx
}

/// How long a JoiningNode waits for its node when it came without a
/// deadline: what Constellation's join service gives one.
pub const JOINING_NODE_DEADLINE_SECONDS: i64 = 48 * 3600;

/// The condition an AutoscalingStrategy reports a missing Deployment with,
/// and a ScalingGroup a missing NodeVersion.
pub const CONDITION_DEPLOYMENT_FOUND: &str = "DeploymentFound";
pub const CONDITION_NODE_VERSION_FOUND: &str = "NodeVersionFound";

/// A reference to one of Constellation's cluster-scoped objects, for an
/// event.
fn object_ref<K: kube::Resource<DynamicType = ()>>(
    o: &K,
    kind: &str,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(format!("{GROUP}/v1alpha1")),
        kind: Some(kind.to_string()),
        name: Some(o.name_any()),
        uid: o.uid(),
        ..Default::default()
    }
}

/// ScalingGroups no NodeVersion governs because the one their `nodeImage`
/// names does not exist: reported on the group (`NodeVersionFound=False`,
/// an event), the condition dropped once it exists. (They were reported
/// nowhere: no NodeVersion's pass looks at them.)
pub fn unfollowed_groups(
    groups: &[Arc<ScalingGroup>],
    versions: &[String],
    now: Timestamp,
) -> Vec<Effect> {
    let mut fx = Vec::new();
    for g in groups {
        let wanted = g.spec.node_image.as_deref().unwrap_or_default();
        let mut status = g.status.clone().unwrap_or_default();
        let mut event = None;
        if versions.iter().any(|v| v == wanted) {
            status
                .conditions
                .retain(|c| c.type_ != CONDITION_NODE_VERSION_FOUND);
        } else {
            let msg = if wanted.is_empty() {
                "spec.nodeImage names no NodeVersion: the group's image is not kept and no node is created in it".to_string()
            } else {
                format!(
                    "spec.nodeImage names NodeVersion {wanted}, which does not exist: the group's image is not kept and no node is created in it"
                )
            };
            let was = status
                .conditions
                .iter()
                .any(|c| c.type_ == CONDITION_NODE_VERSION_FOUND && c.message == msg);
            set_condition(
                &mut status.conditions,
                now,
                CONDITION_NODE_VERSION_FOUND,
                "False",
                "NotFound",
                &msg,
            );
            if !was {
                event = Some(msg);
            }
        }
        if g.status.clone().unwrap_or_default() == status {
            continue;
        }
        fx.push(Effect::WriteObjectStatus {
            kind: Kind::ScalingGroup,
            name: g.name_any(),
            resource_version: g.resource_version(),
            status: serde_json::to_value(&status).unwrap_or_default(),
        });
        if let Some(note) = event {
            fx.push(Effect::Event {
                object: object_ref(g.as_ref(), "ScalingGroup"),
                warning: true,
                reason: "NodeVersionNotFound",
                note,
            });
        }
    }
    fx
}

/// JoiningNodes: stamp the components on the node, then delete the
/// JoiningNode; one whose node has not come by its deadline is deleted.
/// Returns the effects and when to look again.
pub fn joining_nodes(
    joining: &[Arc<JoiningNode>],
    node: &dyn Fn(&str) -> Option<Arc<Node>>,
    now: Timestamp,
) -> (Vec<Effect>, Option<Duration>) {
    let mut fx = Vec::new();
    let mut wake = None;
    for j in joining {
        let name = j.spec.name.as_deref().unwrap_or_default();
        let components = j.spec.componentsreference.as_deref().unwrap_or_default();
        let delete = Effect::DeleteObject {
            kind: Kind::JoiningNode,
            name: j.name_any(),
            uid: j.uid(),
        };
        match node(name) {
            Some(n) => {
                if n.annotations()
                    .get(COMPONENTS_ANNOTATION)
                    .map(String::as_str)
                    != Some(components)
                {
                    fx.push(Effect::PatchNode {
                        node: name.to_string(),
                        resource_version: n.resource_version(),
                        patch: json!({ "metadata": { "annotations": { COMPONENTS_ANNOTATION: components } } }),
                    });
                }
                fx.push(delete);
            }
            None => match &j.spec.deadline {
                Some(d) if now >= d.0 => fx.push(delete),
                Some(d) => wake = crate::decide::earliest(wake, Some(duration_until(now, d.0))),
                // Without a deadline it stayed for ever: give it the one
                // Constellation's join service gives (48 h from its
                // creation), visibly, in its spec.
                None => {
                    let created = j.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
                    let deadline = super::plus(created, JOINING_NODE_DEADLINE_SECONDS);
                    fx.push(Effect::PatchObject {
                        kind: Kind::JoiningNode,
                        namespace: None,
                        name: j.name_any(),
                        patch: json!({ "spec": { "deadline": deadline.to_string() } }),
                        status: false,
                        strategic: false,
                    });
                }
            },
        }
    }
    (fx, wake)
}
