//! The catalogue's mutex operator kinds (in the test's namespace) and
//! Constellation's kinds.

use serde_json::{Value, json};

use super::entries::*;
use crate::support::GROUP_LABEL;

pub fn others(w: &World) -> Vec<Entry> {
    let (id, ns) = (w.id, w.ns);
    let sel = |which: &str| w.sel(which);
    let job = World::job();
    let mut out = Vec::new();
    let mut add = |kind: &'static str, object: Value, expect: Expect| {
        out.push(Entry {
            kind,
            object,
            expect,
        })
    };
    // The mutex operator's kinds, in the test's namespace.
    let mutex = |kind: &str, slug: &str, spec: Value| {
        json!({"apiVersion": "openshift-optional.skrzypek.io/v1alpha1", "kind": kind,
               "metadata": {"name": slug, "namespace": ns}, "spec": spec})
    };
    let rule = |extra: Value| {
        let mut spec = json!({"type": "kubernetes", "jobName": "precheck", "jobNamespace": ns,
                              "jobSpec": job, "cleanupJobSpec": job});
        merge(&mut spec, extra);
        spec
    };
    for (slug, extra, field) in [
        ("rule-type", json!({"type": "ansible"}), "spec.type"),
        (
            "rule-job-name",
            json!({"jobName": "Job/One"}),
            "spec.jobName",
        ),
        (
            "rule-job-namespace",
            json!({"jobNamespace": "ns/x"}),
            "spec.jobNamespace",
        ),
    ] {
        add(
            "mutexrules",
            mutex("MutexRule", slug, rule(extra)),
            Expect::Refused(field),
        );
    }
    add(
        "mutextargets",
        mutex(
            "MutexTarget",
            "target-string",
            json!({"machineConfigPools": "workers"}),
        ),
        Expect::Refused("spec.machineConfigPools"),
    );
    add(
        "mutexrules",
        mutex("MutexRule", "rule-ok", rule(json!({}))),
        Expect::Reported("ValidConfig=True", condition("ValidConfig", "True")),
    );
    add(
        "mutexrules",
        mutex("MutexRule", "rule-unnamed", rule(json!({"jobName": ""}))),
        Expect::Reported("ValidConfig=False", condition("ValidConfig", "False")),
    );
    add(
        "mutexrules",
        mutex(
            "MutexRule",
            "rule-not-a-job",
            rule(json!({"jobSpec": {"template": 3}})),
        ),
        Expect::Reported("ValidConfig=False", condition("ValidConfig", "False")),
    );
    add(
        "mutextargets",
        mutex(
            "MutexTarget",
            "target-ok",
            json!({"machineConfigPools": []}),
        ),
        Expect::Reported("ValidConfig=True", condition("ValidConfig", "True")),
    );
    add(
        "mutextargets",
        mutex(
            "MutexTarget",
            "target-no-pool",
            json!({"machineConfigPools": ["no-pool-here"]}),
        ),
        Expect::Reported("ValidConfig=False", condition("ValidConfig", "False")),
    );
    add(
        "mutexrunconfigs",
        mutex(
            "MutexRunConfig",
            "run-absent-rule",
            json!({"mutexRules": [{"name": "absent-rule"}], "mutexTargets": [{"name": "target-ok"}]}),
        ),
        Expect::Reported("a condition False", any_condition_false()),
    );
    add(
        "mutexrunconfigs",
        mutex(
            "MutexRunConfig",
            "run-absent-canary",
            json!({"canary": {"name": "no-such-canary"},
                   "mutexRules": [{"name": "rule-ok"}], "mutexTargets": [{"name": "target-ok"}]}),
        ),
        Expect::Reported("a condition False", any_condition_false()),
    );

    // Constellation's kinds.
    let cs = |kind: &str, slug: &str, spec: Value| {
        json!({"apiVersion": "update.edgeless.systems/v1alpha1", "kind": kind,
               "metadata": {"name": format!("{id}-{slug}"), "labels": {GROUP_LABEL: id}},
               "spec": spec})
    };
    for (kind, plural, slug, spec, field) in [
        (
            "NodeVersion",
            "nodeversions",
            "nv-gt",
            json!({"image": "img-2", "nodeSelector": {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["3"]}]}}),
            "spec.nodeSelector",
        ),
        (
            "NodeVersion",
            "nodeversions",
            "nv-surge",
            json!({"image": "img-2", "maxSurge": 0, "nodeSelector": sel("nowhere")}),
            "spec.maxSurge",
        ),
        (
            "NodeVersion",
            "nodeversions",
            "nv-drain",
            json!({"image": "img-2", "drainTimeoutSeconds": 2, "nodeSelector": sel("nowhere")}),
            "spec.drainTimeoutSeconds",
        ),
        (
            "ScalingGroup",
            "scalinggroups",
            "sg-image-name",
            json!({"nodeImage": "Image:Latest", "groupId": "g1"}),
            "spec.nodeImage",
        ),
        (
            "ScalingGroup",
            "scalinggroups",
            "sg-role",
            json!({"nodeImage": "nv", "groupId": "g1", "role": "Leader"}),
            "spec.role",
        ),
        (
            "PendingNode",
            "pendingnodes",
            "pn-goal",
            json!({"goal": "Wander", "nodeName": "n1"}),
            "spec.goal",
        ),
        (
            "PendingNode",
            "pendingnodes",
            "pn-name",
            json!({"goal": "Join", "nodeName": "n1?watch=1"}),
            "spec.nodeName",
        ),
        (
            "AutoscalingStrategy",
            "autoscalingstrategies",
            "as-traversal",
            json!({"enabled": true, "deploymentName": "ca/../../../api", "deploymentNamespace": "kube-system"}),
            "spec.deploymentName",
        ),
        (
            "AutoscalingStrategy",
            "autoscalingstrategies",
            "as-namespace",
            json!({"enabled": true, "deploymentName": "ca", "deploymentNamespace": "Kube System"}),
            "spec.deploymentNamespace",
        ),
        (
            "JoiningNode",
            "joiningnodes",
            "jn-name",
            json!({"name": "node/../../x", "componentsreference": "c"}),
            "spec.name",
        ),
    ] {
        add(plural, cs(kind, slug, spec), Expect::Refused(field));
    }
    add(
        "nodeversions",
        cs(
            "NodeVersion",
            "nv-nowhere",
            json!({"image": "img-2", "nodeSelector": sel("nowhere")}),
        ),
        Expect::Reported("selects no node", message("selects no node")),
    );
    add(
        "scalinggroups",
        cs(
            "ScalingGroup",
            "sg-dangling",
            json!({"nodeImage": "nodeversion-that-is-not", "groupId": "g-dangling", "role": "Worker"}),
        ),
        Expect::Reported(
            "NodeVersionFound=False",
            condition("NodeVersionFound", "False"),
        ),
    );
    add(
        "autoscalingstrategies",
        cs(
            "AutoscalingStrategy",
            "as-absent",
            json!({"enabled": true, "deploymentName": "cluster-autoscaler-absent", "deploymentNamespace": ns}),
        ),
        Expect::Reported(
            "DeploymentFound=False",
            condition("DeploymentFound", "False"),
        ),
    );
    add(
        "joiningnodes",
        cs(
            "JoiningNode",
            "jn-no-deadline",
            json!({"name": format!("{id}-never-joins"), "componentsreference": "c"}),
        ),
        Expect::Reported(
            "given a deadline",
            Box::new(|v| v["spec"]["deadline"].is_string()),
        ),
    );
    out
}
