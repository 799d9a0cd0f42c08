//! The upgrade Job of `strategy.type: Job`, pure: system-upgrade-
//! controller's way (an upgrade image that replaces the binaries on the
//! host, as k3s's and RKE2's do), run by the cluster role on the drained
//! node. Pinned by `nodeName` (no scheduler: the node is cordoned and
//! tainted), tolerating every taint, privileged with the host's root at
//! `/host` and the host's PID, network and IPC namespaces. One run per
//! node, version and attempt: its name is a hash of them, so a create
//! repeated after a lost answer or a restart is a 409, never a second run,
//! and `backoffLimit: 0` keeps the Job controller from running it again.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DynamicObject, TypeMeta};
use serde_json::{Value, json};

use super::hooks::Attempt;
use crate::api::upgrade::*;
use crate::decide::disrupt::owner_ref;
use crate::decide::jobs::{MANAGED_BY, MANAGED_BY_LABEL};

/// The stage label's value on upgrade Jobs (hooks have `before`/`after`).
pub use crate::api::upgrade::UPGRADE_STAGE as STAGE;
/// A finished upgrade Job is kept this long for inspection.
pub const TTL_SECONDS: i64 = 86400;
/// Where the host's root is mounted in the container (as SUC mounts it).
pub const HOST_MOUNT: &str = "/host";

/// `<plan>-upgrade` cut to 46 characters, then a hash of the plan's UID,
/// the node, the version and the attempt (at most 63 characters).
pub fn name(plan: &UpgradePlan, a: &Attempt) -> String {
    let key = format!(
        "{}|{}|{STAGE}|{}|{}",
        plan.metadata.uid.as_deref().unwrap_or_default(),
        a.node,
        a.version,
        a.attempt
    );
    crate::decide::jobs::name(&format!("{}-upgrade", plan.name_any()), &key)
}

/// `namespace/name` of the upgrade Job, as the Job store keys it.
pub fn key(plan: &UpgradePlan, a: &Attempt) -> Option<String> {
    let job = plan.spec.strategy.job()?;
    Some(crate::decide::jobs::key_of(&job.namespace, &name(plan, a)))
}

/// What the spec's upgrade Job cannot be (beyond the schema): names that
/// go into URLs or objects, checked again for objects stored before it.
pub fn check(plan: &UpgradePlan) -> Vec<String> {
    let Some(job) = plan.spec.strategy.job() else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if !crate::api::common::is_dns_label(&job.namespace) {
        problems.push(format!(
            "strategy.job.namespace {:?} is not a namespace name",
            job.namespace
        ));
    }
    for (i, s) in job.secrets.iter().enumerate() {
        if !crate::api::common::is_node_name(&s.name) {
            problems.push(format!(
                "strategy.job.secrets[{i}].name {:?} is not a Secret name",
                s.name
            ));
        }
    }
    problems
}

/// The Job for one node's upgrade to `a.version`.
pub fn job_for(plan: &UpgradePlan, a: &Attempt) -> Option<DynamicObject> {
    let job = plan.spec.strategy.job()?;
    let plan_name = plan.name_any();
    let fill = |s: &String| s.replace("{version}", a.version).replace("{node}", a.node);
    // An image tag cannot hold `+`: written as SUC writes it
    // (`MungeVersion`, `+` → `-`), so `rancher/k3s-upgrade:{version}` at
    // `v1.33.1+k3s1` is the real `…:v1.33.1-k3s1`. SUC's own variable
    // carries its munged `latestVersion` too; ours the version itself.
    let tag = crate::decide::version::image_tag(a.version);
    let image = job
        .image
        .replace("{version}", &tag)
        .replace("{node}", a.node);
    let mut env: Vec<Value> = job
        .env
        .iter()
        .map(|e| json!({"name": e.name, "value": fill(&e.value)}))
        .collect();
    for (k, v) in [
        (ENV_NODE, a.node),
        (ENV_PLAN, plan_name.as_str()),
        (ENV_VERSION, a.version),
        ("SYSTEM_UPGRADE_NODE_NAME", a.node),
        ("SYSTEM_UPGRADE_PLAN_NAME", plan_name.as_str()),
        ("SYSTEM_UPGRADE_PLAN_LATEST_VERSION", tag.as_str()),
    ] {
        if !env.iter().any(|e| e["name"] == k) {
            env.push(json!({"name": k, "value": v}));
        }
    }
    let mut mounts = vec![json!({"name": "host-root", "mountPath": HOST_MOUNT})];
    let mut volumes =
        vec![json!({"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}})];
    for (i, s) in job.secrets.iter().enumerate() {
        let vol = format!("secret-{i}");
        mounts.push(json!({"name": vol, "mountPath": s.path, "readOnly": true}));
        volumes.push(json!({"name": vol, "secret": {"secretName": s.name}}));
    }
    let mut container = json!({
        "name": "upgrade",
        "image": image,
        "env": env,
        "securityContext": {"privileged": true},
        "volumeMounts": mounts,
    });
    if !job.command.is_empty() {
        container["command"] = json!(job.command.iter().map(fill).collect::<Vec<_>>());
    }
    if !job.args.is_empty() {
        container["args"] = json!(job.args.iter().map(fill).collect::<Vec<_>>());
    }
    let mut pod = json!({
        "nodeName": a.node,
        "hostPID": true,
        "hostNetwork": true,
        "hostIPC": true,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "restartPolicy": "Never",
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": volumes,
    });
    if let Some(sa) = &job.service_account_name {
        pod["serviceAccountName"] = json!(sa);
    }
    let labels = [
        (PLAN_LABEL, plan_name.clone()),
        (NODE_LABEL, a.node.to_string()),
        (STAGE_LABEL, STAGE.to_string()),
        (MANAGED_BY_LABEL, MANAGED_BY.to_string()),
    ];
    Some(DynamicObject {
        types: Some(TypeMeta {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
        }),
        metadata: ObjectMeta {
            name: Some(name(plan, a)),
            namespace: Some(job.namespace.clone()),
            labels: Some(labels.map(|(k, v)| (k.to_string(), v)).into()),
            owner_references: Some(vec![owner_ref(plan, OWNER_KIND)]),
            ..Default::default()
        },
        data: json!({"spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": plan.spec.deadlines.upgrade_seconds,
            "ttlSecondsAfterFinished": TTL_SECONDS,
            // The stage label keeps the pod out of the node's drain
            // (`drain::fate`): it runs on the node its maintenance holds.
            "template": {"metadata": {"labels": {PLAN_LABEL: plan_name, NODE_LABEL: a.node, STAGE_LABEL: STAGE}}, "spec": pod},
        }}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> UpgradePlan {
        let spec: UpgradePlanSpec = serde_json::from_value(json!({
            "version": "v1.33.1+k3s1",
            "strategy": {"type": "Job", "job": {
                "namespace": "system-upgrade",
                "image": "rancher/k3s-upgrade:{version}",
                "args": ["upgrade", "--node", "{node}"],
                "env": [{"name": "NODE_NAME", "value": "mine"}],
                "secrets": [{"name": "creds", "path": "/run/creds"}],
            }},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let mut p = UpgradePlan::new("k3s", spec);
        p.metadata.uid = Some("uid-1".into());
        p
    }

    #[test]
    fn the_upgrade_job_is_pinned_privileged_with_the_host_mounted_and_named_once_per_attempt() {
        let p = plan();
        let a = Attempt {
            node: "n1",
            version: "v1.33.1+k3s1",
            attempt: 2,
        };
        let job = job_for(&p, &a).unwrap_or_else(|| panic!("a Job"));
        let spec = &job.data["spec"];
        assert_eq!(spec["backoffLimit"], 0);
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["nodeName"], "n1");
        assert_eq!(pod["hostPID"], true);
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
        let c = &pod["containers"][0];
        // SUC's MungeVersion (pkg/upgrade/plan/plan.go): `+` → `-` in the tag.
        assert_eq!(c["image"], "rancher/k3s-upgrade:v1.33.1-k3s1");
        assert_eq!(c["args"], json!(["upgrade", "--node", "n1"]));
        assert_eq!(c["securityContext"]["privileged"], true);
        assert_eq!(c["volumeMounts"][0]["mountPath"], HOST_MOUNT);
        assert_eq!(pod["volumes"][1]["secret"]["secretName"], "creds");
        let env = c["env"].as_array().cloned().unwrap_or_default();
        let value = |k: &str| {
            env.iter()
                .find(|e| e["name"] == k)
                .map(|e| e["value"].clone())
        };
        // The template's own value wins; SUC's names are set too.
        assert_eq!(value("NODE_NAME"), Some(json!("mine")));
        assert_eq!(
            value("SYSTEM_UPGRADE_PLAN_LATEST_VERSION"),
            Some(json!("v1.33.1-k3s1"))
        );
        assert_eq!(value(ENV_VERSION), Some(json!("v1.33.1+k3s1")));
        // The same attempt, the same name; another attempt or node, another.
        assert_eq!(name(&p, &a), job.metadata.name.clone().unwrap_or_default());
        assert!(name(&p, &a).len() <= 63);
        let again = Attempt { attempt: 3, ..a };
        assert_ne!(name(&p, &again), name(&p, &a));
        assert_eq!(
            key(&p, &a),
            Some(format!("system-upgrade/{}", name(&p, &a)))
        );
        assert!(check(&p).is_empty());
    }
}
