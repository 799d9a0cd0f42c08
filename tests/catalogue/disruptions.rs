//! The catalogue's RebootPolicies, UpgradePlans and NodeMaintenances:
//! over three nodes, c needing a reboot and every node behind the plans'
//! version, so anything admitted by mistake would take a node.

use serde_json::{Value, json};

use super::entries::*;

pub fn disruptions(w: &World) -> Vec<Entry> {
    let [a, b, c] = w.nodes;
    let (id, ns) = (w.id, w.ns);
    let sel = |which: &str| w.sel(which);
    let expr = |op: &str, values: Value| w.expr(op, values);
    let closed = World::closed();
    let job = World::job();
    let mut out = Vec::new();
    let mut add = |kind: &'static str, object: Value, expect: Expect| {
        out.push(Entry {
            kind,
            object,
            expect,
        })
    };

    // RebootPolicies. The base selects one node; reading a sentinel file
    // is off so this machine's own files play no part.
    let rp = |slug: &str, which: &str, extra: Value| {
        let mut spec = json!({"nodeSelector": sel(which), "reboot": {"command": ["/bin/true"]},
                              "detect": {"sentinelFile": "", "periodSeconds": 5}});
        merge(&mut spec, extra);
        json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "RebootPolicy",
               "metadata": {"name": format!("{id}-{slug}")}, "spec": spec})
    };
    // The oldest (by name, when created in the same second) over c, its
    // window closed: c waits.
    add(
        "rebootpolicies",
        rp("00-rp-window", "c", json!({"windows": closed})),
        Expect::Reported("c waits for the window", node_reason(c.clone(), "Window")),
    );
    for (slug, extra, field) in [
        (
            "01-rp-op",
            json!({"nodeSelector": {"matchExpressions": [{"key": NODE_KEY, "operator": "Sometimes", "values": ["c"]}]}}),
            "spec.nodeSelector",
        ),
        (
            "02-rp-exists-values",
            json!({"drain": {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["db"]}]}}}),
            "spec.drain.podSelector",
        ),
        (
            "03-rp-notin-empty",
            json!({"gates": {"blockingPods": [{"selector": {"matchExpressions": [{"key": "job", "operator": "NotIn"}]}}]}}),
            "spec.gates.blockingPods[0].selector",
        ),
        (
            "04-rp-day",
            json!({"windows": [{"days": ["Caturday"], "start": "01:00", "end": "02:00"}]}),
            "spec.windows[0].days[0]",
        ),
        (
            "05-rp-start",
            json!({"windows": [{"days": ["Wed"], "start": "7:5", "end": "08:00"}]}),
            "spec.windows[0].start",
        ),
        (
            "06-rp-ontimeout",
            json!({"drain": {"onTimeout": "Panic"}}),
            "spec.drain.onTimeout",
        ),
        (
            "07-rp-tz-path",
            json!({"windows": [{"days": ["Wed"], "start": "01:00", "end": "02:00", "timeZone": "../../etc/passwd"}]}),
            "spec.windows[0].timeZone",
        ),
        (
            "08-rp-relative-file",
            json!({"detect": {"sentinelFile": "var/run/reboot"}}),
            "spec.detect.sentinelFile",
        ),
        (
            "09-rp-no-command",
            json!({"reboot": {"command": []}}),
            "spec.reboot.command",
        ),
        (
            "10-rp-budget",
            json!({"budget": {"maxUnavailable": -2}}),
            "spec.budget.maxUnavailable",
        ),
        (
            "10-rp-period",
            json!({"detect": {"periodSeconds": 1}}),
            "spec.detect.periodSeconds",
        ),
        (
            "10-rp-settle",
            json!({"gates": {"settleSeconds": -5}}),
            "spec.gates.settleSeconds",
        ),
        (
            "10-rp-percent",
            json!({"budget": {"maxUnavailable": "250%"}}),
            "spec.budget.maxUnavailable",
        ),
        (
            "10-rp-window-both",
            json!({"windows": [{"start": "01:00", "end": "02:00", "schedule": "0 1 * * *", "duration": "1h"}]}),
            "spec.windows[0]",
        ),
        (
            "10-rp-window-no-duration",
            json!({"windows": [{"schedule": "0 1 * * *"}]}),
            "spec.windows[0]",
        ),
        (
            "10-rp-blackout",
            json!({"windows": [{"start": "01:00", "end": "02:00", "blackouts": [{"start": "24.12.2026"}]}]}),
            "spec.windows[0].blackouts[0].start",
        ),
        (
            "10-rp-month-day",
            json!({"windows": [{"start": "01:00", "end": "02:00", "daysOfMonth": [0]}]}),
            "spec.windows[0].daysOfMonth[0]",
        ),
    ] {
        add(
            "rebootpolicies",
            rp(slug, "c", extra),
            Expect::Refused(field),
        );
    }
    add(
        "rebootpolicies",
        rp(
            "11-rp-zone",
            "c",
            json!({"windows": [{"days": ["Wed"], "start": "01:00", "end": "02:00", "timeZone": "Pluto/Tombaugh"}]}),
        ),
        Expect::Reported("Valid=False", condition("Valid", "False")),
    );
    add(
        "rebootpolicies",
        rp(
            "11-rp-cron",
            "c",
            json!({"windows": [{"schedule": "61 * * * *", "duration": "1h"}]}),
        ),
        Expect::Reported("Valid=False", condition("Valid", "False")),
    );
    add(
        "rebootpolicies",
        rp("12-rp-nowhere", "nowhere", json!({})),
        Expect::Reported("NodesSelected=False", condition("NodesSelected", "False")),
    );
    let mut overlap = rp("13-rp-overlap", "c", json!({}));
    overlap["spec"]["nodeSelector"] = expr("In", json!(["c"]));
    add(
        "rebootpolicies",
        overlap,
        Expect::Reported(
            "c is the older policy's",
            node_reason(c.clone(), "OtherPolicy"),
        ),
    );
    add(
        "rebootpolicies",
        rp(
            "14-rp-sentinel-missing",
            "a",
            json!({"detect": {"sentinelCommand": ["/opt/no-such-tool/needs-reboot"]}}),
        ),
        Expect::Reported(
            "a's signal unreadable",
            node_reason(a.clone(), "SentinelFailed"),
        ),
    );
    add(
        "rebootpolicies",
        rp(
            "15-rp-sentinel-exit",
            "b",
            json!({"detect": {"sentinelCommand": ["sh", "-c", "exit 42"]}}),
        ),
        Expect::Reported(
            "b's signal unreadable",
            node_reason(b.clone(), "SentinelFailed"),
        ),
    );

    // UpgradePlans: every node reports v1, the plans want v2.
    let up = |slug: &str, which: &str, extra: Value| {
        let mut spec = json!({"nodeSelector": sel(which), "version": "v2",
            "versionFrom": {"source": "Label", "key": VERSION_KEY},
            "strategy": {"command": ["/bin/true"]}});
        merge(&mut spec, extra);
        json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "UpgradePlan",
               "metadata": {"name": format!("{id}-{slug}")}, "spec": spec})
    };
    add(
        "upgradeplans",
        up("00-up-window", "b", json!({"windows": closed})),
        Expect::Reported("b waits for the window", node_reason(b.clone(), "Window")),
    );
    let hook = |extra: Value| {
        let mut h = json!({"name": "smoke", "namespace": ns, "job": job});
        merge(&mut h, extra);
        h
    };
    for (slug, extra, field) in [
        (
            "01-up-no-command",
            json!({"strategy": {"command": []}}),
            "spec.strategy.command",
        ),
        (
            "02-up-source",
            json!({"versionFrom": {"source": "Registry", "key": null}}),
            "spec.versionFrom.source",
        ),
        (
            "03-up-no-key",
            json!({"versionFrom": {"source": "Annotation", "key": null}}),
            "spec.versionFrom",
        ),
        (
            "04-up-onfailure",
            json!({"onFailure": "Abort"}),
            "spec.onFailure",
        ),
        (
            "05-up-groups",
            json!({"groups": [{"name": "g", "nodeSelector": {}}, {"name": "g", "nodeSelector": {}}]}),
            "spec.groups",
        ),
        (
            "06-up-hook-onfailure",
            json!({"hooks": {"after": [hook(json!({"onFailure": "Sometimes"}))]}}),
            "spec.hooks.after[0].onFailure",
        ),
        (
            "07-up-hook-name",
            json!({"hooks": {"before": [hook(json!({"name": "Has Space"}))]}}),
            "spec.hooks.before[0].name",
        ),
        (
            "08-up-hook-namespace",
            json!({"hooks": {"before": [hook(json!({"namespace": "../kube-system"}))]}}),
            "spec.hooks.before[0].namespace",
        ),
        (
            "09-up-type",
            json!({"strategy": {"type": "BlueGreen"}}),
            "spec.strategy.type",
        ),
        ("10-up-version", json!({"version": ""}), "spec.version"),
        (
            "10-up-deadline",
            json!({"deadlines": {"upgradeSeconds": 3}}),
            "spec.deadlines.upgradeSeconds",
        ),
        (
            "10-up-reboot-command",
            json!({"strategy": {"reboot": true, "rebootCommand": []}}),
            "spec.strategy.rebootCommand",
        ),
        (
            "10-up-group-selector",
            json!({"groups": [{"name": "g", "nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}]}),
            "spec.groups[0].nodeSelector",
        ),
    ] {
        add("upgradeplans", up(slug, "b", extra), Expect::Refused(field));
    }
    add(
        "upgradeplans",
        up(
            "11-up-command-missing",
            "a",
            json!({"strategy": {"command": ["/opt/nowhere/os-upgrade", "{version}"]}}),
        ),
        Expect::Reported(
            "a cannot run the command",
            node_reason(a.clone(), "CommandNotRunnable"),
        ),
    );
    add(
        "upgradeplans",
        up("12-up-nowhere", "nowhere", json!({})),
        Expect::Reported("NodesSelected=False", condition("NodesSelected", "False")),
    );
    add(
        "upgradeplans",
        up(
            "13-up-zone",
            "c",
            json!({"windows": [{"days": ["Thu"], "start": "01:00", "end": "02:00", "timeZone": "Gondwana/Central"}]}),
        ),
        Expect::Reported("Valid=False", condition("Valid", "False")),
    );
    add(
        "upgradeplans",
        up("14-up-overlap", "b", json!({})),
        Expect::Reported("b is the older plan's", node_reason(b.clone(), "OtherPlan")),
    );
    add(
        "upgradeplans",
        up(
            "15-up-hook-job",
            "c",
            json!({"hooks": {"before": [hook(json!({"job": {"template": {"spec": {"containers": 7}}}}))]}}),
        ),
        Expect::Reported("Valid=False", condition("Valid", "False")),
    );

    // NodeMaintenances: names the schema refuses, a node that does not
    // exist, drain options that cannot be used.
    let nm = |slug: &str, spec: Value, annotations: Value| {
        json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
               "metadata": {"name": format!("{id}-{slug}"), "annotations": annotations},
               "spec": spec})
    };
    for (slug, spec) in [
        ("nm-upper", json!({"nodeName": "Node_A"})),
        ("nm-traversal", json!({"nodeName": "a/../../b"})),
        ("nm-empty", json!({"nodeName": ""})),
        ("nm-missing", json!({"reason": "no node named"})),
    ] {
        add(
            "nodemaintenances",
            nm(slug, spec, json!({})),
            Expect::Refused("spec.nodeName"),
        );
    }
    for (slug, node, annotations) in [
        ("nm-ghost", format!("{id}-never-was"), json!({})),
        (
            "nm-timeout",
            a.clone(),
            json!({"nodekeeper.io/drain-timeout-seconds": "-30"}),
        ),
        (
            "nm-ontimeout",
            b.clone(),
            json!({"nodekeeper.io/drain-on-timeout": "Detonate"}),
        ),
        (
            "nm-podselector",
            c.clone(),
            json!({"nodekeeper.io/drain-pod-selector": "app in (x"}),
        ),
    ] {
        add(
            "nodemaintenances",
            nm(
                slug,
                json!({"nodeName": node, "reason": "catalogue"}),
                annotations,
            ),
            Expect::Reported("Failed", phase("Failed")),
        );
    }

    out
}
