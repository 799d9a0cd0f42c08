//! Objects that name what is not there, reported on themselves: a
//! NodeVersion that selects no node, a ScalingGroup whose NodeVersion does
//! not exist, an AutoscalingStrategy whose Deployment does not exist, a
//! JoiningNode that came without a deadline.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn message_of(w: &World) -> (Option<String>, String) {
    let plan = decide(&w.snap());
    let Some(Effect::WriteObjectStatus { status, .. }) = plan.effects.first() else {
        panic!("no status write: {:?}", plan.effects);
    };
    let st: NodeVersionStatus = serde_json::from_value(status.clone()).unwrap();
    let outdated = st
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_OUTDATED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    (st.message, outdated)
}

#[test]
fn a_node_version_that_governs_no_node_says_why() {
    let mut w = World::new("img-2", 1);
    w.nv.spec.node_selector = Some(LabelSelector {
        match_labels: Some([("pool".to_string(), "none".to_string())].into()),
        ..Default::default()
    });
    let (msg, outdated) = message_of(&w);
    assert_eq!(msg.as_deref(), Some("the nodeSelector selects no node"));
    assert!(outdated.contains("No node is selected"), "{outdated}");
    // Its nodes are an older NodeVersion's.
    let mut elsewhere = World::new("img-2", 1);
    elsewhere.governed_elsewhere = 3;
    let (msg, _) = message_of(&elsewhere);
    assert_eq!(
        msg.as_deref(),
        Some("every node it selects (3) is governed by an older NodeVersion")
    );
    // Or kept by an older one whose rollout fields cannot be read.
    let mut kept = World::new("img-2", 1);
    kept.governed_elsewhere = 3;
    kept.held_elsewhere = vec!["pool-a".into()];
    let (msg, _) = message_of(&kept);
    assert_eq!(
        msg.as_deref(),
        Some(
            "nodes it selects are kept by NodeVersion pool-a, whose rollout fields cannot be read (its status says why): they are left alone until they can"
        )
    );
    // With nodes, nothing of the kind.
    let mut fine = World::new("img-2", 1);
    fine.nodes = vec![node("a", "g", "img-2", &[])];
    let (msg, outdated) = message_of(&fine);
    assert_eq!(msg, None);
    assert_eq!(outdated, "Node version of every node is up to date");
}

#[test]
fn a_scaling_group_whose_node_version_is_missing_is_reported_once_and_cleared() {
    let mut g = (*group("workers", "g", "Worker", "img-1")).clone();
    g.spec.node_image = Some("no-such-version".into());
    let fx = unfollowed_groups(
        &[Arc::new(g.clone())],
        &["constellation-version".into()],
        now(),
    );
    let Some(Effect::WriteObjectStatus { status, .. }) = fx.first() else {
        panic!("no status write: {fx:?}");
    };
    assert!(
        matches!(&fx[1], Effect::Event { reason: "NodeVersionNotFound", warning: true, note, .. } if note.contains("no-such-version"))
    );
    g.status = serde_json::from_value(status.clone()).unwrap();
    let c = &g.status.as_ref().unwrap().conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (CONDITION_NODE_VERSION_FOUND, "False", "NotFound")
    );
    // Said once.
    let versions = ["constellation-version".to_string()];
    assert!(unfollowed_groups(&[Arc::new(g.clone())], &versions, now()).is_empty());
    // The NodeVersion created: the condition goes, without an event.
    let fx = unfollowed_groups(&[Arc::new(g.clone())], &["no-such-version".into()], now());
    let [Effect::WriteObjectStatus { status, .. }] = &fx[..] else {
        panic!("{fx:?}");
    };
    let st: ScalingGroupStatus = serde_json::from_value(status.clone()).unwrap();
    assert!(st.conditions.is_empty(), "{st:?}");
    assert_eq!(
        st.image_reference.as_deref(),
        Some("img-1"),
        "the rest kept"
    );
    // A group that follows an existing NodeVersion: nothing to say.
    let fine = group("cp", "c", "ControlPlane", "img-1");
    assert!(unfollowed_groups(&[fine], &versions, now()).is_empty());
}

#[test]
fn a_strategy_whose_deployment_is_missing_says_so_once() {
    let mut st = AutoscalingStrategy::new(
        "autoscaler",
        AutoscalingStrategySpec {
            enabled: true,
            deployment_name: "ca".into(),
            deployment_namespace: "kube-system".into(),
            autoscaler_extra_args: Default::default(),
        },
    );
    let fx = strategy(&st, &[], None, now());
    let [
        Effect::WriteObjectStatus { status, .. },
        Effect::Event { reason, note, .. },
    ] = &fx[..]
    else {
        panic!("{fx:?}");
    };
    assert_eq!(*reason, "DeploymentNotFound");
    assert!(note.contains("kube-system/ca does not exist"), "{note}");
    st.status = serde_json::from_value(status.clone()).unwrap();
    let c = &st.status.as_ref().unwrap().conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str()),
        (CONDITION_DEPLOYMENT_FOUND, "False")
    );
    assert!(strategy(&st, &[], None, now()).is_empty(), "said once");
    // The Deployment appears: the condition goes, it is scaled.
    let d = json!({"metadata": {"resourceVersion": "5"}, "spec": {"replicas": 0,
        "template": {"spec": {"containers": [{"name": "ca", "command": []}]}}}});
    let fx = strategy(&st, &[], Some(&d), now());
    let Some(Effect::WriteObjectStatus { status, .. }) = fx.first() else {
        panic!("{fx:?}");
    };
    let written: AutoscalingStrategyStatus = serde_json::from_value(status.clone()).unwrap();
    assert!(written.conditions.is_empty());
    assert!(
        fx.iter().any(
            |e| matches!(e, Effect::PatchObject { patch, .. } if patch["spec"]["replicas"] == 1)
        )
    );
}

#[test]
fn a_joining_node_without_a_deadline_is_given_the_join_services() {
    let mut j = JoiningNode::new(
        "n9",
        JoiningNodeSpec {
            name: Some("n9".into()),
            componentsreference: Some("c".into()),
            ..Default::default()
        },
    );
    j.metadata.creation_timestamp = Some(Time("2026-11-22T10:00:00Z".parse().unwrap()));
    let (fx, _) = lifecycle::joining_nodes(&[Arc::new(j)], &|_| None, now());
    let [
        Effect::PatchObject {
            kind: Kind::JoiningNode,
            name,
            patch,
            ..
        },
    ] = &fx[..]
    else {
        panic!("{fx:?}");
    };
    assert_eq!(name, "n9");
    assert_eq!(patch["spec"]["deadline"], "2026-11-24T10:00:00Z");
}
