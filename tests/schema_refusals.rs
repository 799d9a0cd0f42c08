//! What the API server refuses by the CRDs' schemas, with the field named
//! (server-side dry runs: nothing is stored, no node is near):
//!
//! - label selectors people get wrong, in every selector of every kind
//!   that has one, as Kubernetes refuses its own (before, `operator: Bogus`
//!   in a pod selector was stored and the policy said it was valid);
//! - names that become part of a request's path (a Deployment's name and
//!   namespace, a hook Job's namespace, node names, a NodeVersion's name): traversal, slashes,
//!   empty and upper-case names (before, `../../../../api/v1/nodes/x` as a
//!   Deployment name was sent as a GET of that path).

use crate::support;

use support::{install_crds, kubectl, replace::install_constellation_crds};

/// `kind` with `spec` (YAML flow style), as a manifest.
fn manifest(api: &str, kind: &str, spec: &str) -> String {
    format!(
        "apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: bad-selector-probe\nspec: {spec}\n"
    )
}

/// The answer of a server-side dry run of `yaml`: (accepted, what it said).
fn dry_run(yaml: &str) -> (bool, String) {
    let out = kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(yaml));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn selectors_that_cannot_be_used_are_refused_in_every_kind_with_the_field_named() {
    install_crds();
    install_constellation_crds();
    const NK: &str = "nodekeeper.io/v1alpha1";
    const CS: &str = "update.edgeless.systems/v1alpha1";
    // Each selector field: (api, kind, the spec with SEL where the selector
    // goes, the field path the refusal must name).
    let fields: Vec<(&str, &str, &str, &str)> = vec![
        (
            NK,
            "RebootPolicy",
            "{nodeSelector: SEL}",
            "spec.nodeSelector",
        ),
        (
            NK,
            "RebootPolicy",
            "{drain: {podSelector: SEL}}",
            "spec.drain.podSelector",
        ),
        (
            NK,
            "RebootPolicy",
            "{gates: {blockingPods: [{selector: SEL}]}}",
            "spec.gates.blockingPods[0].selector",
        ),
        (
            NK,
            "UpgradePlan",
            "{version: v2, strategy: {command: [/bin/true]}, nodeSelector: SEL}",
            "spec.nodeSelector",
        ),
        (
            NK,
            "UpgradePlan",
            "{version: v2, strategy: {command: [/bin/true]}, groups: [{name: g, nodeSelector: SEL}]}",
            "spec.groups[0].nodeSelector",
        ),
        (
            NK,
            "UpgradePlan",
            "{version: v2, strategy: {command: [/bin/true]}, drain: {podSelector: SEL}}",
            "spec.drain.podSelector",
        ),
        (
            NK,
            "UpgradePlan",
            "{version: v2, strategy: {command: [/bin/true]}, gates: {blockingPods: [{selector: SEL}]}}",
            "spec.gates.blockingPods[0].selector",
        ),
        (
            CS,
            "NodeVersion",
            "{nodeSelector: SEL}",
            "spec.nodeSelector",
        ),
        (
            NK,
            "DrainRule",
            "{drain: {behavior: Drain}, pods: [{selector: SEL}]}",
            "spec.pods[0].selector",
        ),
        (
            NK,
            "DrainRule",
            "{drain: {behavior: Drain}, pods: [{namespaceSelector: SEL}]}",
            "spec.pods[0].namespaceSelector",
        ),
        (
            NK,
            "DrainRule",
            "{drain: {behavior: Skip}, nodes: [{selector: SEL}]}",
            "spec.nodes[0].selector",
        ),
    ];
    // (what is wrong, the selector, what the refusal must say)
    let bad: Vec<(&str, &str, &str)> = vec![
        (
            "unknown operator",
            "{matchExpressions: [{key: app, operator: Bogus, values: [a]}]}",
            "Unsupported value: \"Bogus\"",
        ),
        (
            "lower-case operator",
            "{matchExpressions: [{key: app, operator: in, values: [a]}]}",
            "Unsupported value: \"in\"",
        ),
        (
            "In without values",
            "{matchExpressions: [{key: app, operator: In}]}",
            "In and NotIn need values",
        ),
        (
            "NotIn with an empty list",
            "{matchExpressions: [{key: app, operator: NotIn, values: []}]}",
            "In and NotIn need values",
        ),
        (
            "Exists with values",
            "{matchExpressions: [{key: app, operator: Exists, values: [a]}]}",
            "Exists and DoesNotExist take none",
        ),
        (
            "DoesNotExist with values",
            "{matchExpressions: [{key: app, operator: DoesNotExist, values: [a]}]}",
            "Exists and DoesNotExist take none",
        ),
    ];
    let good = "{matchLabels: {tier: web}, matchExpressions: [{key: app, operator: In, values: [a]}, {key: zone, operator: DoesNotExist}]}";
    let mut failures = Vec::new();
    for (api, kind, spec, field) in &fields {
        let (ok, said) = dry_run(&manifest(api, kind, &spec.replace("SEL", good)));
        if !ok {
            failures.push(format!("{kind} {field}: a right selector refused: {said}"));
        }
        for (what, sel, must_say) in &bad {
            let (ok, said) = dry_run(&manifest(api, kind, &spec.replace("SEL", sel)));
            if ok {
                failures.push(format!("{kind} {field}: {what} accepted"));
            } else if !said.contains(&format!("{field}.matchExpressions[0]"))
                || !said.contains(must_say)
            {
                failures.push(format!(
                    "{kind} {field}: {what}: refused without naming the field and why: {said}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn names_that_reach_a_url_are_refused_with_the_field_named() {
    install_crds();
    install_constellation_crds();
    const CS: &str = "update.edgeless.systems/v1alpha1";
    const NK: &str = "nodekeeper.io/v1alpha1";
    // (api, kind, the spec with NAME where the name goes, the field named)
    let fields: Vec<(&str, &str, &str, &str)> = vec![
        (
            NK,
            "UpgradePlan",
            "{version: v2, strategy: {command: [x]}, hooks: {before: [{name: h, namespace: NAME, job: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: x}]}}}}]}}",
            "spec.hooks.before[0].namespace",
        ),
        (
            CS,
            "AutoscalingStrategy",
            "{enabled: true, deploymentName: NAME, deploymentNamespace: kube-system}",
            "spec.deploymentName",
        ),
        (
            CS,
            "AutoscalingStrategy",
            "{enabled: true, deploymentName: autoscaler, deploymentNamespace: NAME}",
            "spec.deploymentNamespace",
        ),
        (
            CS,
            "PendingNode",
            "{goal: Join, nodeName: NAME}",
            "spec.nodeName",
        ),
        (CS, "JoiningNode", "{name: NAME}", "spec.name"),
        (CS, "ScalingGroup", "{nodeImage: NAME}", "spec.nodeImage"),
    ];
    let bad = [
        "'../../../../api/v1/nodes/x'",
        "'a/b'",
        "''",
        "Upper",
        "'-dash'",
        "'x?watch=true'",
    ];
    let mut failures = Vec::new();
    for (api, kind, spec, field) in &fields {
        let (ok, said) = dry_run(&manifest(api, kind, &spec.replace("NAME", "good-name-1")));
        if !ok {
            failures.push(format!("{kind} {field}: a right name refused: {said}"));
        }
        for name in bad {
            let (ok, said) = dry_run(&manifest(api, kind, &spec.replace("NAME", name)));
            if ok {
                failures.push(format!("{kind} {field}: {name} accepted"));
            } else if !said.contains(field) {
                failures.push(format!(
                    "{kind} {field}: {name}: refused without naming the field: {said}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How a node is rebooted and upgraded: each path's required fields, and
/// the words the API server answers with (the rule's message names the
/// field).
#[test]
fn reboot_methods_and_upgrade_strategies_are_refused_with_the_field_named() {
    install_crds();
    const NK: &str = "nodekeeper.io/v1alpha1";
    // (kind, spec, None: accepted, Some: the refusal says this)
    let cases: Vec<(&str, &str, Option<&str>)> = vec![
        ("RebootPolicy", "{reboot: {method: Talos}}", None),
        ("RebootPolicy", "{reboot: {method: Command}}", None),
        (
            "RebootPolicy",
            "{reboot: {method: Ssh}}",
            Some("reboot.method must be Auto, Command or Talos"),
        ),
        (
            "UpgradePlan",
            "{version: v1.13.1, strategy: {type: Talos, image: 'installer:{version}'}}",
            None,
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Talos}}",
            Some("strategy.image is required for type Talos"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: InPlace}}",
            Some("strategy.command needs at least the program"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {command: [x], image: 'installer:1'}}",
            Some("strategy.image is for type Talos only"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Replace, command: [x]}}",
            Some("strategy.type must be InPlace, Talos or Job"),
        ),
        // A fixed version or a channel, exactly one.
        (
            "UpgradePlan",
            "{channel: 'https://update.example/v1-release/channels/stable', strategy: {command: [x]}}",
            None,
        ),
        (
            "UpgradePlan",
            "{version: v2, channel: 'https://update.example/c', strategy: {command: [x]}}",
            Some("exactly one of version and channel"),
        ),
        (
            "UpgradePlan",
            "{strategy: {command: [x]}}",
            Some("exactly one of version and channel"),
        ),
        (
            "UpgradePlan",
            "{channel: 'ftp://update.example/c', strategy: {command: [x]}}",
            Some("channel must be an http:// or https:// URL"),
        ),
        // Type Job (SUC's upgrade container).
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Job, job: {namespace: system-upgrade, image: 'k3s-upgrade:{version}'}}}",
            None,
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Job}}",
            Some("strategy.job is required for type Job"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Job, reboot: true, job: {namespace: s, image: i}}}",
            Some("strategy.reboot is not for type Job"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Job, command: [x], job: {namespace: s, image: i}}}",
            Some("strategy.command is for type InPlace"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {type: Job, job: {namespace: Bad_NS, image: i}}}",
            Some("strategy.job.namespace must be a lowercase RFC 1123 label"),
        ),
        // Notifications: formats, events and template placeholders.
        (
            "RebootPolicy",
            "{notifications: [{urlFrom: {name: ops}, format: Slack, events: [Failed, NotReturned], template: '{node}: {text}'}]}",
            None,
        ),
        (
            "RebootPolicy",
            "{notifications: [{urlFrom: {name: ops}, format: Discord}]}",
            Some("notifications[].format must be Webhook, Slack or Teams"),
        ),
        (
            "UpgradePlan",
            "{version: v2, strategy: {command: [x]}, notifications: [{urlFrom: {name: ops}, events: [Rebooted]}]}",
            Some("notifications[].events may name DrainStarted"),
        ),
        (
            "RebootPolicy",
            "{notifications: [{urlFrom: {name: ops}, template: '{node} {host}'}]}",
            Some("notifications[].template may name only"),
        ),
        (
            "RebootPolicy",
            "{notifications: [{urlFrom: {name: 'Ops/x'}}]}",
            Some("spec.notifications[0].urlFrom.name"),
        ),
    ];
    let mut failures = Vec::new();
    for (kind, spec, refusal) in cases {
        let (ok, said) = dry_run(&manifest(NK, kind, spec));
        match refusal {
            None if !ok => failures.push(format!("{kind} {spec}: refused: {said}")),
            Some(why) if ok => failures.push(format!("{kind} {spec}: accepted, should say {why}")),
            Some(why) if !said.contains(why) => {
                failures.push(format!("{kind} {spec}: refused without {why:?}: {said}"))
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// DrainRules that cannot mean anything, refused as Cluster API refuses
/// MachineDrainRules (its CRD's rules and its webhook's order check), with
/// the field named.
#[test]
fn drain_rules_that_cannot_mean_anything_are_refused_with_the_field_named() {
    install_crds();
    const NK: &str = "nodekeeper.io/v1alpha1";
    let cases: [(&str, &str, &str); 6] = [
        (
            "an order with Skip",
            "{drain: {behavior: Skip, order: 3}}",
            "order can only be set if behavior is Drain",
        ),
        (
            "an order with WaitCompleted",
            "{drain: {behavior: WaitCompleted, order: -1}}",
            "order can only be set if behavior is Drain",
        ),
        (
            "an unknown behavior",
            "{drain: {behavior: Evict}}",
            "spec.drain.behavior: Unsupported value: \"Evict\"",
        ),
        (
            "no drain at all",
            "{pods: [{selector: {matchLabels: {a: b}}}]}",
            "spec.drain: Required value",
        ),
        (
            "an empty entry of pods",
            "{drain: {behavior: Skip}, pods: [{}]}",
            "an entry of pods needs a selector or a namespaceSelector",
        ),
        (
            "the same entry twice",
            "{drain: {behavior: Skip}, pods: [{selector: {matchLabels: {a: b}}}, {selector: {matchLabels: {a: b}}}]}",
            "entries in pods must be unique",
        ),
    ];
    let mut failures = Vec::new();
    let (ok, said) = dry_run(&manifest(
        NK,
        "DrainRule",
        "{drain: {behavior: Drain, order: -5}, pods: [{selector: {matchLabels: {a: b}}}], nodes: [{selector: {matchLabels: {pool: db}}}]}",
    ));
    if !ok {
        failures.push(format!("a right DrainRule refused: {said}"));
    }
    for (what, spec, must_say) in cases {
        let (ok, said) = dry_run(&manifest(NK, "DrainRule", spec));
        if ok {
            failures.push(format!("{what} accepted"));
        } else if !said.contains(must_say) {
            failures.push(format!("{what}: refused without saying why: {said}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
