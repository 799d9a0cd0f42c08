//! Malformed NodeMaintenance objects, as users write them by mistake: each
//! is refused by the API server with a message (the CRD's schema and CEL
//! rules), or, where only other objects can tell, accepted and then ended
//! Failed with a message (by the cluster role: an agent sees only its own
//! node's objects). No node is touched, and nothing polls for a bad
//! object.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodekeeper::api::nodemaintenance::{NodeMaintenance, Phase};
use support::{Agent, TestEnv, block_on, install_crds, kubectl, wait_for};

/// What a test node looks like to someone checking it was left alone:
/// everything but what kwok and the node lifecycle controller change on
/// their own (their annotations, the not-ready/unreachable taints while a
/// new node settles).
fn fingerprint(node: &Node) -> String {
    let spec = node.spec.clone().unwrap_or_default();
    let taints: Vec<_> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .filter(|t| {
            t.key != "node.kubernetes.io/not-ready" && t.key != "node.kubernetes.io/unreachable"
        })
        .collect();
    let keep = |m: &Option<BTreeMap<String, String>>| {
        m.clone()
            .unwrap_or_default()
            .into_iter()
            // An agent's claim on its node (nodekeeper.io/agent) is written
            // when it starts, not because of anything the test sends.
            .filter(|(k, _)| {
                !k.starts_with("kwok.x-k8s.io/")
                    && !k.starts_with("node.alpha")
                    && k != "nodekeeper.io/agent"
            })
            .collect::<BTreeMap<_, _>>()
    };
    format!(
        "unschedulable={:?} taints={:?} labels={:?} annotations={:?}",
        spec.unschedulable,
        taints,
        keep(&node.metadata.labels),
        keep(&node.metadata.annotations)
    )
}

/// One NodeMaintenance manifest with `spec` as written (YAML flow style).
fn manifest(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: {name}\n{spec}\n"
    )
}

#[test]
fn malformed_node_maintenances_are_refused_or_failed_with_a_message_and_touch_no_node() {
    block_on(async {
        install_crds();
        let mut env = TestEnv::new("badnm").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let nodes: Api<Node> = Api::all(env.client.clone());
        let before = (
            fingerprint(&nodes.get(&a).await.expect("node a")),
            fingerprint(&nodes.get(&b).await.expect("node b")),
        );
        let agents = [
            Agent::start(&["run", "--node", &a]),
            Agent::start(&["run", "--node", &b]),
            support::machines::cluster_role(&env, &["--node-agents"]),
        ];

        let long = "x".repeat(254);
        let name_rule = "a node name is a lowercase RFC 1123 subdomain";
        // (what is wrong, spec as written, what the refusal must say)
        let refused: Vec<(&str, String, &str)> = vec![
            ("empty name", "spec: {nodeName: ''}".into(), name_rule),
            (
                "leading space",
                format!("spec: {{nodeName: ' {a}'}}"),
                name_rule,
            ),
            (
                "trailing space",
                format!("spec: {{nodeName: '{a} '}}"),
                name_rule,
            ),
            ("upper case", "spec: {nodeName: Node-A}".into(), name_rule),
            ("underscore", "spec: {nodeName: node_a}".into(), name_rule),
            ("leading dash", "spec: {nodeName: -node}".into(), name_rule),
            ("trailing dash", "spec: {nodeName: node-}".into(), name_rule),
            ("empty label", "spec: {nodeName: a..b}".into(), name_rule),
            (
                "trailing dot",
                format!("spec: {{nodeName: '{a}.'}}"),
                name_rule,
            ),
            ("slash", "spec: {nodeName: ns/node}".into(), name_rule),
            // NMO's e2e suite creates this one and looks for its webhook's words.
            (
                "NMO's missing node",
                "spec: {nodeName: doesNotExist}".into(),
                "invalid nodeName, no node with name doesNotExist found",
            ),
            (
                "line break",
                r#"spec: {nodeName: "a\nb"}"#.into(),
                "invalid nodeName, no node with name (with a line break) found",
            ),
            ("non-ASCII", "spec: {nodeName: nodé}".into(), name_rule),
            (
                "too long",
                format!("spec: {{nodeName: {long}}}"),
                "may not be more than 253",
            ),
            (
                "no nodeName",
                "spec: {reason: oops}".into(),
                "nodeName: Required value",
            ),
            ("no spec", "".into(), "spec: Required value"),
            (
                "number as name",
                "spec: {nodeName: 42}".into(),
                "must be of type string",
            ),
            ("null name", "spec: {nodeName: null}".into(), "nodeName"),
            (
                "number as reason",
                format!("spec: {{nodeName: {a}, reason: 5}}"),
                "must be of type string",
            ),
            ("list as spec", "spec: [a]".into(), "must be of type object"),
        ];
        for (i, (what, spec, message)) in refused.iter().enumerate() {
            let name = format!("{}-bad-{i}", env.id);
            let out = kubectl(&["create", "-f", "-"], Some(&manifest(&name, spec)));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{what}: the API server accepted {spec:?}"
            );
            assert!(
                stderr.contains(message),
                "{what}: the refusal of {spec:?} does not say {message:?}: {stderr}"
            );
        }

        // Accepted by the schema, but no such node: Failed, with NMO's message.
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let ghost = format!("{}-no-such-node", env.id);
        let name = format!("{}-ghost", env.id);
        let out = kubectl(
            &["create", "-f", "-"],
            Some(&manifest(&name, &format!("spec: {{nodeName: {ghost}}}"))),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let failed = wait_for(
            "the ghost maintenance to fail",
            Duration::from_secs(60),
            || async {
                let nm = nms.get_opt(&name).await.ok().flatten()?;
                (nm.phase() == Some(Phase::Failed)).then_some(nm)
            },
        )
        .await;
        let msg = failed.status.and_then(|s| s.last_error).unwrap_or_default();
        assert_eq!(
            msg,
            format!("invalid nodeName, no node with name {ghost} found")
        );
        let _ = nms.delete(&name, &Default::default()).await;

        let after = (
            fingerprint(&nodes.get(&a).await.expect("node a")),
            fingerprint(&nodes.get(&b).await.expect("node b")),
        );
        assert_eq!(before, after, "a node was touched");
        // The one object that reached the cluster role was looked up once
        // and failed: nothing polls (a race to write Failed costs at most
        // one retry each).
        for agent in &agents {
            let log = agent.log_text();
            let retries = log
                .lines()
                .filter(|l| {
                    l.contains(&ghost) && (l.contains("retrying") || l.contains("backing off"))
                })
                .count();
            assert!(
                !log.contains("non-empty name") && retries <= 1,
                "an agent retried a bad object:\n{log}"
            );
        }
    })
}
