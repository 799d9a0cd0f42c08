//! The opt-in validating webhook for NodeMaintenance (`manifests --for
//! webhook` or `webhook-service`): its ValidatingWebhookConfiguration,
//! whose caBundle nodekeeper fills itself, and the one permission that
//! takes (this named object only). `--admission` adds the serving flag to
//! the static pod, the systemd unit and the Deployment.
//!
//! failurePolicy is Ignore: a webhook that is down (a control-plane node
//! whose nodekeeper is restarting, a Deployment rolling) must not block
//! maintenance, and the status path fails a bad object anyway.

use serde_json::{Value, json};

use super::*;
use crate::service::admission::{CONFIGURATION, DEFAULT_PORT, PATH, WEBHOOK};

/// The Service a Deployment's webhook is reached through.
pub const SERVICE: &str = "nodekeeper-admission";

/// The `run` flags that serve the webhook in each mode.
pub(super) fn loopback_args() -> Vec<String> {
    vec![
        "--admission-address".into(),
        format!("127.0.0.1:{DEFAULT_PORT}"),
    ]
}

pub(super) fn service_args(o: &Options) -> Vec<String> {
    vec![
        "--admission-address".into(),
        format!(":{DEFAULT_PORT}"),
        "--admission-service".into(),
        format!("{}/{SERVICE}", o.namespace),
        "--admission-client-ca".into(),
        format!("{CLIENT_CA_DIR}/{CLIENT_CA_KEY}"),
    ]
}

/// The ConfigMap an operator creates with the CA of the API server's
/// webhook client certificate (key [`CLIENT_CA_KEY`]): through a Service
/// the webhook answers only the API server (see the README's Admission).
pub const CLIENT_CA_CONFIGMAP: &str = "nodekeeper-admission-client-ca";
pub const CLIENT_CA_KEY: &str = "ca.crt";
const CLIENT_CA_DIR: &str = "/etc/nodekeeper/admission-client-ca";

/// The Deployment's volume and mount of [`CLIENT_CA_CONFIGMAP`]. Not
/// optional: a webhook that cannot tell the API server from anyone else
/// does not start (the pod waits for the ConfigMap, and says so).
pub(super) fn client_ca_volume() -> (Value, Value) {
    (
        json!({"name": "admission-client-ca", "configMap": {"name": CLIENT_CA_CONFIGMAP}}),
        json!({"name": "admission-client-ca", "mountPath": CLIENT_CA_DIR, "readOnly": true}),
    )
}

/// The configuration, reaching nodekeeper by URL on loopback (static pod,
/// host service: each API server calls the nodekeeper on its own node) or
/// through the Service (Deployment).
pub fn webhook(o: &Options, through_service: bool) -> Vec<Value> {
    let client_config = if through_service {
        json!({"service": {"namespace": o.namespace, "name": SERVICE, "path": PATH, "port": DEFAULT_PORT}})
    } else {
        json!({"url": format!("https://127.0.0.1:{DEFAULT_PORT}{PATH}")})
    };
    let accounts: Vec<Value> = [AGENT_ACCOUNT, CLUSTER_ACCOUNT]
        .iter()
        .map(|a| json!({"kind": "ServiceAccount", "name": a, "namespace": o.namespace}))
        .collect();
    let mut docs = vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "nodekeeper-admission", "labels": labels()},
               "rules": [{"apiGroups": ["admissionregistration.k8s.io"],
                          "resources": ["validatingwebhookconfigurations"],
                          "resourceNames": [CONFIGURATION],
                          "verbs": ["get", "list", "watch", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "nodekeeper-admission", "labels": labels()},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodekeeper-admission"},
               "subjects": accounts}),
        json!({
          "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
          "metadata": {"name": CONFIGURATION, "labels": labels()},
          "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": client_config,
            "rules": [{"apiGroups": ["nodemaintenance.medik8s.io"], "apiVersions": ["*"],
                       "operations": ["CREATE"], "resources": ["nodemaintenances"], "scope": "Cluster"}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
          }]
        }),
    ];
    if through_service {
        docs.push(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": o.namespace, "labels": labels()},
            "spec": {
              "selector": {"app.kubernetes.io/name": "nodekeeper", "app.kubernetes.io/component": "cluster"},
              "ports": [{"name": "admission", "port": DEFAULT_PORT, "targetPort": DEFAULT_PORT}]
            }}));
    }
    docs
}
