//! Scaling groups from the provider's list: the ScalingGroups nodekeeper
//! creates, updates and (only its own) deletes.

use super::*;

/// Label on the ScalingGroups nodekeeper created from the provider's list
/// (only those are deleted when the provider stops listing their group).
pub const DISCOVERED_LABEL: &str = "nodekeeper.io/discovered";

/// ScalingGroups from a `list-scaling-groups` answer: create the missing
/// (name lowercased, Constellation's defaults: min 1, max 10, following
/// `nv_name`), update a changed nodeGroupName, delete the ones we created
/// whose group is no longer listed.
pub fn discovered_groups(
    answer: &Value,
    existing: &[Arc<ScalingGroup>],
    nv_name: &str,
) -> Vec<Effect> {
    let listed: Vec<&Value> = answer["scalingGroups"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut fx = Vec::new();
    let mut names = Vec::new();
    for g in listed {
        let Some(name) = g["name"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        let name = name.to_lowercase();
        names.push(name.clone());
        let node_group = g["nodeGroupName"].as_str().unwrap_or_default();
        match existing.iter().find(|e| e.name_any() == name) {
            Some(e) => {
                if e.spec.node_group_name.as_deref().unwrap_or_default() != node_group {
                    fx.push(Effect::PatchObject {
                        kind: Kind::ScalingGroup,
                        namespace: None,
                        name: name.clone(),
                        patch: json!({ "spec": { "nodeGroupName": node_group } }),
                        status: false,
                        strategic: false,
                    });
                }
            }
            None => fx.push(Effect::CreateObject {
                kind: Kind::ScalingGroup,
                object: json!({
                    "apiVersion": format!("{GROUP}/v1alpha1"),
                    "kind": "ScalingGroup",
                    "metadata": { "name": name, "labels": { DISCOVERED_LABEL: "true" } },
                    "spec": {
                        "nodeImage": nv_name,
                        "groupId": g["groupId"],
                        "autoscalerGroupName": g["autoscalingGroupName"],
                        "nodeGroupName": node_group,
                        "min": 1,
                        "max": 10,
                        "role": role(g["role"].as_str().unwrap_or_default()),
                    }
                }),
            }),
        }
    }
    for e in existing {
        if e.labels().get(DISCOVERED_LABEL).map(String::as_str) == Some("true")
            && !names.contains(&e.name_any())
        {
            fx.push(Effect::DeleteObject {
                kind: Kind::ScalingGroup,
                name: e.name_any(),
                uid: e.uid(),
            });
        }
    }
    fx
}

/// Constellation's role names: `controlplane`/`control-plane` and `worker`
/// in any case; anything else is a worker.
pub(super) fn role(r: &str) -> &'static str {
    match r.to_lowercase().as_str() {
        "controlplane" | "control-plane" => "ControlPlane",
        _ => "Worker",
    }
}
