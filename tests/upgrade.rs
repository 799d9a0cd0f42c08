//! In-place upgrades on the real control plane, with simulated hosts
//! (tests/support/upgrades.rs): the upgrade command records the version,
//! the harness makes the node report it and restarts its agent. Hook Jobs
//! are real Jobs run by the real Job controller (kwok completes their pods
//! at once). Order, budget and "once" claims come from an independent
//! timeline and watcher, never from the plan's status.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use nodekeeper::api::upgrade::{UpgradePhase, UpgradePlan};
use serde_json::json;
use support::machines::{Fleet, LONG, Watcher, cluster_role, maintenances_on};
use support::upgrades::*;
use support::{TestEnv, block_on, install_agent_identity, install_crds, wait_for};

const GROUPS: &str = r#"[
    {"name": "control-plane", "nodeSelector": {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
    {"name": "workers", "nodeSelector": {}}
]"#;

fn all_done(client: &kube::Client, plan_name: &str, names: &[String]) -> bool {
    block_on(async {
        let Ok(p) = Api::<UpgradePlan>::all(client.clone()).get(plan_name).await else {
            return false;
        };
        names
            .iter()
            .all(|n| p.entry(n).is_some_and(|e| e.phase == UpgradePhase::Done))
    })
}

/// Start agents for `names` as the generated node identity.
fn fleet_with_agents(env: &TestEnv, names: &[String]) -> Arc<Fleet> {
    let fleet = Fleet::confined(env.client.clone());
    for n in names {
        fleet.start_agent(n);
    }
    fleet
}

#[test]
fn two_groups_upgrade_in_order_with_hooks_off_the_node_within_the_budget() {
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-groups").await;
        let names = nodes(&mut env, 5, 2).await;
        (env, names)
    });
    let (cps, workers) = names.split_at(2);
    let fleet = fleet_with_agents(&env, &names);
    let watcher = Watcher::start(env.client.clone(), &env.id);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let groups: serde_json::Value = serde_json::from_str(GROUPS).expect("groups");
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({
            "paused": true,
            "groups": groups,
            "budget": {"maxUnavailable": 2, "maxControlPlane": 1},
            "hooks": {
                "before": [hook(&env, "pre", json!({}))],
                "after": [hook(&env, "post", json!({}))],
            },
            "drain": {"timeoutSeconds": 30},
        }),
    ));

    // Paused: every node waits, nothing runs.
    block_on(async {
        for n in &names {
            let msg = wait_phase(&env.client, &plan, n, UpgradePhase::Waiting).await;
            assert!(msg.contains("paused"), "{n}: {msg}");
        }
        assert!(jobs(&env.client, &plan).await.is_empty());
        Api::<UpgradePlan>::all(env.client.clone())
            .patch(
                &plan,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": false}})),
            )
            .await
            .expect("unpausing");
    });
    serve(&fleet, &timeline, &names, Duration::from_secs(180), || {
        all_done(&env.client, &plan, &names)
    });
    // The plan says Done once the NodeMaintenance is deleted; the uncordon
    // that follows reaches the timeline's own watch a moment later.
    block_on(wait_for(
        "every node seen back",
        Duration::from_secs(30),
        || async {
            names
                .iter()
                .all(|n| timeline.last(&format!("up {n}")) > timeline.last(&format!("down {n}")))
                .then_some(())
        },
    ));
    timeline.stop();
    let history = watcher.finish();
    let events = timeline.events();
    let context = format!(
        "timeline: {events:#?}\ncluster role log:\n{}",
        cluster.log_text()
    );

    // The budget, from the independent watcher: two at once at most, and
    // one control-plane node at a time.
    let peak = history.iter().map(|h| h.0).max().unwrap_or(0);
    assert!(peak <= 2, "over budget: {history:?}\n{context}");
    for h in &history {
        let cp_down = cps
            .iter()
            .filter(|c| h.1.split(',').any(|d| d == *c))
            .count();
        assert!(cp_down <= 1, "two control-plane nodes down: {h:?}");
    }
    assert!(
        history.iter().any(|h| h.0 == 2),
        "workers never went two at a time: {history:?}"
    );

    // Per node, strictly in order: before hook, cordon, command, after
    // hook, uncordon.
    for n in &names {
        let at = |what: &str| {
            timeline
                .first(&format!("{what} {n}"))
                .unwrap_or_else(|| panic!("no '{what} {n}'\n{context}"))
        };
        let before = at("job before");
        let down = at("down");
        let command = at("command");
        let after = at("job after");
        let up = timeline
            .last(&format!("up {n}"))
            .unwrap_or_else(|| panic!("{n} never came back\n{context}"));
        assert!(
            before < down && down < command && command < after && after < up,
            "{n}: before {before}, down {down}, command {command}, after {after}, up {up}\n{context}"
        );
        assert_eq!(runs(&fleet, n), ["v2"], "{n}: one upgrade command");
        assert_eq!(timeline.count(&format!("job before {n}")), 1, "{context}");
        assert_eq!(timeline.count(&format!("job after {n}")), 1, "{context}");
    }
    // Groups: no worker is touched before every control-plane node is back.
    let last_cp = cps
        .iter()
        .filter_map(|c| timeline.last(&format!("up {c}")))
        .max()
        .unwrap_or_default();
    for w in workers {
        let first = timeline
            .first(&format!("job before {w}"))
            .unwrap_or_default();
        assert!(first > last_cp, "worker {w} started early\n{context}");
    }

    block_on(async {
        // Every hook Job: the template's env kept and ours appended, kept
        // off its node by affinity; the pods still there (a drain removes
        // finished pods from the nodes it drains) ran elsewhere.
        let all = jobs(&env.client, &plan).await;
        assert_eq!(all.len(), 10, "one Job per node and stage");
        for job in &all {
            let pod = job
                .spec
                .clone()
                .and_then(|s| s.template.spec)
                .unwrap_or_default();
            let env: Vec<(String, String)> = pod.containers[0]
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|e| (e.name, e.value.unwrap_or_default()))
                .collect();
            let target = job
                .labels()
                .get("nodekeeper.io/upgrade-node")
                .cloned()
                .unwrap_or_default();
            assert!(
                env.contains(&("NODE_NAME".into(), target.clone())),
                "{env:?}"
            );
            assert!(
                env.contains(&("FROM_TEMPLATE".into(), "kept".into())),
                "{env:?}"
            );
            assert!(
                env.contains(&("NODEKEEPER_VERSION".into(), "v2".into())),
                "{env:?}"
            );
            let affinity = serde_json::to_string(&pod.affinity).unwrap_or_default();
            assert!(
                affinity.contains("NotIn") && affinity.contains(&target),
                "{affinity}"
            );
        }
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let list = pods
            .list(&ListParams::default().labels("batch.kubernetes.io/job-name"))
            .await
            .expect("hook pods");
        for pod in &list.items {
            let spec = pod.spec.clone().unwrap_or_default();
            let target = spec.containers[0]
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .find(|e| e.name == "NODE_NAME")
                .and_then(|e| e.value);
            assert_ne!(
                spec.node_name,
                target,
                "{}",
                pod.metadata.name.clone().unwrap_or_default()
            );
        }
        let nodes: Api<Node> = Api::all(env.client.clone());
        // Done says the give-back was asked: the NodeMaintenance is gone
        // once its finalizer has uncordoned the node, a moment later (more
        // with kine's store). Bounded, not immediate.
        wait_for("every node given back", Duration::from_secs(30), || async {
            for n in &names {
                let node = nodes.get(n).await.ok()?;
                let cordoned = node.spec.and_then(|s| s.unschedulable) == Some(true);
                if cordoned || maintenances_on(&env.client, n).await != 0 {
                    return None;
                }
            }
            Some(())
        })
        .await;
        let p = plan_of(&env.client, &plan).await;
        let conds = p.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True"),
            "{conds:?}"
        );
    });
    for n in &names {
        support::machines::assert_refused_nothing(&format!("{n}'s agent"), &fleet.agent_log(n));
    }
}

async fn plan_of(client: &kube::Client, name: &str) -> UpgradePlan {
    support::upgrades::plan(client, name).await
}

/// A before hook whose pod can never be scheduled fails at its deadline
/// (the Job's own activeDeadlineSeconds): with `Stop` the node fails
/// untouched, the Job is named in status and the plan pauses; with
/// `Ignore` the node goes on.
#[test]
fn a_failing_before_hook_stops_the_node_and_pauses_the_plan_unless_ignored() {
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-hookfail").await;
        let names = nodes(&mut env, 2, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let stuck = json!({"deadlineSeconds": 3, "job": {"template": {"spec": {
        "nodeSelector": {"nodekeeper.test/nowhere": "true"}}}}});
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({"hooks": {"before": [hook(&env, "gate", stuck.clone())]}}),
    ));
    block_on(async {
        let first = &names[0];
        let msg = wait_phase(&env.client, &plan, first, UpgradePhase::Failed).await;
        let p = plan_of(&env.client, &plan).await;
        let e = p.entry(first).cloned().expect("entry");
        let job = e.job.clone().expect("the failed Job is named");
        assert!(msg.contains(&job), "{msg}");
        assert!(msg.contains("DeadlineExceeded"), "{msg}");
        assert_eq!(e.reason.as_deref(), Some("HookFailed"));
        assert_eq!(e.hook.as_deref(), Some("gate"));
        let second = wait_phase(&env.client, &plan, &names[1], UpgradePhase::Waiting).await;
        assert!(second.contains("paused after node"), "{second}");
        let conds = p.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "Paused" && c.status == "True" && c.reason == "Failure"),
            "{conds:?}"
        );
        // Untouched: never cordoned, no maintenance, no command.
        assert_eq!(maintenances_on(&env.client, first).await, 0);
        assert!(timeline.first(&format!("down {first}")).is_none());
        assert!(runs(&fleet, first).is_empty());
    });

    // Ignore: the same failing hook no longer stops the upgrade. Changing
    // the spec also retries the failed node.
    block_on(async {
        let mut ignore = hook(&env, "gate", stuck);
        ignore["onFailure"] = json!("Ignore");
        Api::<UpgradePlan>::all(env.client.clone())
            .patch(
                &plan,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"hooks": {"before": [ignore]}}})),
            )
            .await
            .expect("patching the plan");
    });
    serve(&fleet, &timeline, &names, Duration::from_secs(120), || {
        all_done(&env.client, &plan, &names)
    });
    timeline.stop();
    for n in &names {
        assert_eq!(runs(&fleet, n), ["v2"], "{n}");
        // One Job for the failed attempt (first node), one for the retry.
        let expected = if n == &names[0] { 2 } else { 1 };
        assert_eq!(
            timeline.count(&format!("job before {n}")),
            expected,
            "{n}: {:#?}\n{}",
            timeline.events(),
            cluster.log_text()
        );
    }
}

/// Someone else takes a node after its admission but before our drain: a
/// person cordons it by hand while its before hook runs. When the hook
/// completes the admission is withdrawn (`Waiting`, `HeldByOther`): no NodeMaintenance ever names the node while
/// the person holds it, their cordon is never lifted by us, and the other
/// node is upgraded meanwhile. Once the person uncordons it, the node is
/// upgraded, once. NodeMaintenances and cordons come from the independent
/// timeline, not from the plan's status.
#[test]
fn a_node_cordoned_by_hand_during_its_before_hook_is_withdrawn_not_taken() {
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-withdraw").await;
        let names = nodes(&mut env, 2, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    // The hook's pod waits for a node labelled `gate-<id>=open`: the test
    // holds the hooks running until it opens the gate.
    let gate = format!("gate-{}", env.id);
    let held = json!({"job": {"template": {"spec": {"nodeSelector": {gate.clone(): "open"}}}}});
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({"budget": {"maxUnavailable": 2}, "hooks": {"before": [hook(&env, "held", held)]}}),
    ));
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    let set = |node: &str, patch: serde_json::Value| {
        block_on(nodes_api.patch(node, &PatchParams::default(), &Patch::Merge(patch)))
            .unwrap_or_else(|e| panic!("patching {node}: {e}"))
    };
    // Both nodes admitted (the budget allows both), each in its before
    // hook with its Job created.
    block_on(async {
        for n in &names {
            wait_phase(&env.client, &plan, n, UpgradePhase::PreHooks).await;
        }
        wait_for("two hook Jobs", LONG, || async {
            (jobs(&env.client, &plan).await.len() == 2).then_some(())
        })
        .await;
    });
    let (taken, other) = (names[0].clone(), names[1].clone());
    // A person cordons the first (`kubectl cordon`); then the hooks
    // complete (each pod runs off its own node; the hook tolerates the
    // cordon).
    set(&taken, json!({"spec": {"unschedulable": true}}));
    timeline.push(format!("person cordons {taken}"));
    for n in &names {
        set(n, json!({"metadata": {"labels": {gate.clone(): "open"}}}));
    }
    let withdrawn = block_on(async {
        let api: Api<UpgradePlan> = Api::all(env.client.clone());
        wait_for(&format!("{taken} withdrawn"), LONG, || async {
            let e = api.get(&plan).await.ok()?.entry(&taken)?.clone();
            (e.phase == UpgradePhase::Waiting && e.reason.as_deref() == Some("HeldByOther"))
                .then(|| e.message.unwrap_or_default())
        })
        .await
    });
    // The withdrawal says "…; the admission is withdrawn"; the passes
    // after it, which find the node held before admitting it, say who
    // holds it only.
    assert!(
        withdrawn.contains("cordoned by someone else"),
        "{withdrawn}"
    );
    // The other node is upgraded meanwhile.
    serve(&fleet, &timeline, &names, Duration::from_secs(120), || {
        block_on(async {
            plan_of(&env.client, &plan)
                .await
                .entry(&other)
                .is_some_and(|e| e.phase == UpgradePhase::Done)
        })
    });
    let context = || format!("{:#?}\n{}", timeline.events(), cluster.log_text());
    // Still the person's: cordoned, with no mark of ours, never a
    // NodeMaintenance, never a command.
    let node = block_on(nodes_api.get(&taken)).expect("reading the node");
    assert_eq!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "{}",
        context()
    );
    assert!(
        !node
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(nodekeeper::api::nodemaintenance::APPLIED_ANNOTATION),
        "{}",
        context()
    );
    assert_eq!(timeline.count(&format!("nm {taken} ")), 0, "{}", context());
    assert!(runs(&fleet, &taken).is_empty(), "{}", context());
    assert_eq!(block_on(maintenances_on(&env.client, &taken)), 0);

    // The person gives it back: now it is upgraded, once.
    set(&taken, json!({"spec": {"unschedulable": null}}));
    timeline.push(format!("person uncordons {taken}"));
    serve(&fleet, &timeline, &names, Duration::from_secs(120), || {
        all_done(&env.client, &plan, &names)
    });
    timeline.stop();
    let given = timeline
        .first(&format!("person uncordons {taken}"))
        .expect("recorded");
    let nm = timeline.first(&format!("nm {taken} ")).expect("its drain");
    assert!(nm > given, "{}", context());
    for n in &names {
        assert_eq!(runs(&fleet, n), ["v2"], "{n}: upgraded once\n{}", context());
    }
}

/// SIGKILL the cluster role while a hook runs and while a node upgrades,
/// and every node agent as its command runs (the harness restarts them):
/// no Job runs twice for a stage, no node is upgraded twice.
#[test]
fn sigkill_mid_hook_and_mid_upgrade_repeats_nothing() {
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-chaos").await;
        let names = nodes(&mut env, 3, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let mut cluster = cluster_role(&env, &["--node-agents"]);
    // The hook's pod waits for a node labelled `gate-<id>=open`: the test
    // holds the hook "running" until it opens the gate.
    let gate = format!("gate-{}", env.id);
    let held = json!({"job": {"template": {"spec": {"nodeSelector": {gate.clone(): "open"}}}}});
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({"budget": {"maxUnavailable": 3}, "hooks": {"before": [hook(&env, "held", held)]}}),
    ));
    block_on(async {
        for n in &names {
            wait_phase(&env.client, &plan, n, UpgradePhase::PreHooks).await;
        }
        wait_for("three hook Jobs", Duration::from_secs(30), || async {
            (jobs(&env.client, &plan).await.len() == 3).then_some(())
        })
        .await;
    });
    // Mid-hook: the cluster role dies and comes back.
    cluster.kill();
    cluster = cluster_role(&env, &["--node-agents"]);
    block_on(async {
        // Let the hook pods schedule (each off its own node).
        for n in &names {
            Api::<Node>::all(env.client.clone())
                .patch(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {gate.clone(): "open"}}})),
                )
                .await
                .expect("opening the gate");
        }
    });
    // Mid-upgrade: kill the cluster role once a node is upgrading.
    let mut killed = false;
    serve(&fleet, &timeline, &names, Duration::from_secs(180), || {
        if !killed {
            let upgrading = block_on(async {
                let p = plan_of(&env.client, &plan).await;
                names.iter().any(|n| {
                    p.entry(n)
                        .is_some_and(|e| e.phase == UpgradePhase::Upgrading)
                })
            });
            if upgrading {
                cluster.kill();
                cluster = cluster_role(&env, &["--node-agents"]);
                killed = true;
            }
        }
        all_done(&env.client, &plan, &names)
    });
    timeline.stop();
    assert!(killed, "no node was ever seen upgrading");
    let context = format!("{:#?}\n{}", timeline.events(), cluster.log_text());
    block_on(async {
        assert_eq!(jobs(&env.client, &plan).await.len(), 3, "{context}");
    });
    for n in &names {
        assert_eq!(runs(&fleet, n), ["v2"], "{n}: upgraded once\n{context}");
        assert_eq!(
            timeline.count(&format!("job before {n}")),
            1,
            "{n}\n{context}"
        );
    }
}

/// A plan whose command does not exist on the hosts takes no node: each
/// node's agent finds the program missing before the node is admitted, the
/// plan reports it per node, and nothing is cordoned (watched
/// independently). Once the command is fixed the same nodes upgrade.
#[test]
fn a_command_that_does_not_exist_drains_no_node() {
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-nocmd").await;
        let names = nodes(&mut env, 2, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({"budget": {"maxUnavailable": 2},
               "strategy": {"command": ["/nonexistent/upgrade", "{version}"]}}),
    ));
    block_on(async {
        for n in &names {
            let api: Api<UpgradePlan> = Api::all(env.client.clone());
            let e = wait_for(
                &format!("{n} reported as unable to run the command"),
                LONG,
                || async {
                    let p = api.get(&plan).await.ok()?;
                    p.entry(n)
                        .filter(|e| e.reason.as_deref() == Some("CommandNotRunnable"))
                        .cloned()
                },
            )
            .await;
            assert_eq!(e.phase, UpgradePhase::Waiting);
            let msg = e.message.unwrap_or_default();
            assert!(msg.contains("/nonexistent/upgrade: not found"), "{msg}");
            assert_eq!(maintenances_on(&env.client, n).await, 0, "{n}");
            assert!(
                timeline.first(&format!("down {n}")).is_none(),
                "{n} was taken: {:#?}\n{}",
                timeline.events(),
                cluster.log_text()
            );
        }
        let events = support::kubectl(
            &[
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=UpgradeCommandNotRunnable",
                "-o",
                "name",
            ],
            None,
        );
        assert!(
            !String::from_utf8_lossy(&events.stdout).trim().is_empty(),
            "no UpgradeCommandNotRunnable event"
        );
        Api::<UpgradePlan>::all(env.client.clone())
            .patch(
                &plan,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"strategy": {"command": command(&fleet)}}})),
            )
            .await
            .expect("fixing the plan's command");
    });
    serve(&fleet, &timeline, &names, Duration::from_secs(120), || {
        all_done(&env.client, &plan, &names)
    });
    timeline.stop();
    for n in &names {
        assert_eq!(runs(&fleet, n), ["v2"], "{n}");
    }
}

/// Two exclusive plans (SUC's `exclusive`) over different nodes: never a
/// node of one in maintenance while a node of the other is, though each
/// plan's budget would take both of its nodes at once. Asserted from the
/// independent timeline of the nodes' availability.
#[test]
fn exclusive_plans_never_upgrade_at_the_same_time() {
    use kube::api::PostParams;
    use nodekeeper::api::upgrade::UpgradePlanSpec;
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-excl").await;
        let names = nodes(&mut env, 4, 0).await;
        (env, names)
    });
    let side = |n: &str| {
        if names[..2].contains(&n.to_string()) {
            "a"
        } else {
            "b"
        }
    };
    block_on(async {
        let nodes: Api<Node> = Api::all(env.client.clone());
        for n in &names {
            let patch = json!({"metadata": {"labels": {"nodekeeper.test/plan": side(n)}}});
            nodes
                .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("labelling a node");
        }
    });
    let fleet = fleet_with_agents(&env, &names);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let plans: Vec<String> = ["a", "b"]
        .iter()
        .map(|s| {
            let spec: UpgradePlanSpec = serde_json::from_value(json!({
                "nodeSelector": {"matchLabels": {support::GROUP_LABEL: env.id, "nodekeeper.test/plan": s}},
                "version": "v2",
                "versionFrom": {"source": "Label", "key": VERSION_LABEL},
                "strategy": {"command": command(&fleet)},
                "budget": {"maxUnavailable": 2},
                "exclusive": true,
            }))
            .expect("a plan spec");
            let name = format!("{}-{s}", env.id);
            block_on(async {
                Api::<UpgradePlan>::all(env.client.clone())
                    .create(&PostParams::default(), &UpgradePlan::new(&name, spec))
                    .await
                    .expect("creating a plan");
            });
            name
        })
        .collect();
    serve(&fleet, &timeline, &names, Duration::from_secs(180), || {
        all_done(&env.client, &plans[0], &names[..2])
            && all_done(&env.client, &plans[1], &names[2..])
    });
    timeline.stop();
    let events = timeline.events();
    let mut down: std::collections::BTreeSet<String> = Default::default();
    let mut together = 0;
    for e in &events {
        if let Some(n) = e.strip_prefix("down ") {
            down.insert(n.to_string());
        } else if let Some(n) = e.strip_prefix("up ") {
            down.remove(n);
        }
        let sides: std::collections::BTreeSet<&str> = down.iter().map(|n| side(n)).collect();
        assert!(
            sides.len() < 2,
            "nodes of both exclusive plans down at once: {down:?}\ntimeline: {events:#?}\ncluster role:\n{}",
            cluster.log_text()
        );
        together = together.max(down.len());
    }
    assert_eq!(
        together, 2,
        "each plan took both its nodes at once: {events:#?}"
    );
    for n in &names {
        assert_eq!(runs(&fleet, n).len(), 1, "{n} upgraded once");
    }
}

/// `strategy.type: Job` (system-upgrade-controller's upgrade container):
/// the cluster role, under its shipped identity, runs one Job per node
/// after its drain, pinned to the node, privileged, with the host's root
/// at /host and SUC's environment; the node agents run nothing. kwok
/// completes the Job's pod (it runs no container); the harness then makes
/// the node report the version, as an upgrade image replacing the k3s
/// binary would. From the independent timeline: each Job created while
/// its node was cordoned, once; the budget held.
#[test]
fn a_container_image_upgrade_runs_once_per_node_as_a_pinned_privileged_job() {
    use k8s_openapi::api::batch::v1::Job;
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-job").await;
        let names = nodes(&mut env, 2, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let watcher = Watcher::start(env.client.clone(), &env.id);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({
            "budget": {"maxUnavailable": 1},
            "strategy": {"type": "Job", "command": [], "job": {
                "namespace": env.ns,
                "image": "registry.invalid/k3s-upgrade:{version}",
                "args": ["upgrade", "--node", "{node}"],
                "env": [{"name": "UPGRADE_CHANNEL", "value": "stable"}],
            }},
        }),
    ));
    // The Jobs' pods as created (kwok deletes a pod it completed).
    let pods_seen: Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Arc::default();
    let stop = nodekeeper::runtime::Latch::default();
    {
        use kube::runtime::watcher;
        use smol::stream::StreamExt;
        let (client, ns, seen, stop) = (
            env.client.clone(),
            env.ns.clone(),
            pods_seen.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            block_on(async move {
                let pods = watcher(Api::<Pod>::namespaced(client, &ns), Default::default());
                let mut pods = std::pin::pin!(pods);
                let run = async {
                    while let Some(ev) = pods.next().await {
                        if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev {
                            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                            if !seen
                                .iter()
                                .any(|s| s["metadata"]["name"] == p.name_any().as_str())
                            {
                                seen.push(serde_json::to_value(&p).unwrap_or_default());
                            }
                        }
                    }
                };
                smol::future::or(run, stop.wait()).await;
            })
        });
    }
    // The harness's part of an upgrade image: once a node's Job succeeded,
    // the node reports the version.
    let mut served: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    while !all_done(&env.client, &plan, &names) {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the upgrades did not finish\ntimeline: {:#?}\ncluster role:\n{}",
            timeline.events(),
            cluster.log_text()
        );
        for job in block_on(jobs(&env.client, &plan)) {
            let node = job
                .labels()
                .get(nodekeeper::api::upgrade::NODE_LABEL)
                .cloned()
                .unwrap_or_default();
            let succeeded = job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0);
            if succeeded > 0 && !served.contains(&node) {
                timeline.push(format!("served {node}"));
                block_on(report_version(&env.client, &node, "v2"));
                served.push(node);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    timeline.stop();
    stop.open();
    let pods_seen = pods_seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let history = watcher.finish();
    let events = timeline.events();
    let context = format!(
        "timeline: {events:#?}\ncluster role:\n{}",
        cluster.log_text()
    );
    let peak = history.iter().map(|h| h.0).max().unwrap_or(0);
    assert!(peak <= 1, "over budget: {history:?}\n{context}");
    let all_jobs: Vec<Job> = block_on(jobs(&env.client, &plan));
    // Never evicted by the node's own maintenance (the node is drained and
    // its pods are the drain's to move, but not this one).
    for j in &all_jobs {
        let st = j.status.clone().unwrap_or_default();
        assert!(
            st.succeeded == Some(1) && st.failed.unwrap_or(0) == 0,
            "{}: {st:?}\n{context}",
            j.name_any()
        );
    }
    for n in &names {
        // One Job, created while the node was drained (down), never a
        // command by the agent.
        let created = timeline.count(&format!("job upgrade {n} "));
        assert_eq!(created, 1, "{n}: {created} upgrade Jobs\n{context}");
        let per_node = all_jobs
            .iter()
            .filter(|j| j.labels().get(nodekeeper::api::upgrade::NODE_LABEL) == Some(n))
            .count();
        assert_eq!(per_node, 1, "{n}\n{context}");
        let down = timeline.first(&format!("down {n}"));
        let job = timeline.first(&format!("job upgrade {n} "));
        assert!(
            down.is_some() && down < job,
            "{n}: Job before the drain\n{context}"
        );
        assert!(runs(&fleet, n).is_empty(), "{n}: the agent ran a command");
    }
    // The pod: pinned, privileged, the host's root and namespaces, SUC's
    // and our environment, the placeholders filled.
    assert_eq!(pods_seen.len(), 2, "{context}");
    for pod in &pods_seen {
        let spec = &pod["spec"];
        let node = spec["nodeName"].as_str().unwrap_or_default();
        assert!(names.iter().any(|n| n == node), "{pod:#}");
        assert_eq!(spec["hostPID"], true, "{pod:#}");
        assert_eq!(spec["hostNetwork"], true, "{pod:#}");
        let c = &spec["containers"][0];
        assert_eq!(c["image"], "registry.invalid/k3s-upgrade:v2", "{pod:#}");
        assert_eq!(c["args"], json!(["upgrade", "--node", node]), "{pod:#}");
        assert_eq!(c["securityContext"]["privileged"], true, "{pod:#}");
        assert!(
            spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["hostPath"]["path"] == "/"),
            "{pod:#}"
        );
        let env_of = |k: &str| {
            c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == k)
                .map(|e| e["value"].clone())
        };
        assert_eq!(env_of("SYSTEM_UPGRADE_NODE_NAME"), Some(json!(node)));
        assert_eq!(
            env_of("SYSTEM_UPGRADE_PLAN_LATEST_VERSION"),
            Some(json!("v2"))
        );
        assert_eq!(env_of("UPGRADE_CHANNEL"), Some(json!("stable")));
    }
}

/// `channel`: a release server the test runs answers `302` with the
/// version in its `Location`, as system-upgrade-controller's channels do.
/// The plan's status shows the version it named, the node is upgraded to
/// it (the command's own record says so); when the server names a newer
/// one, the node is upgraded again, to that.
#[test]
fn a_channels_redirect_changes_the_version_the_plan_upgrades_to() {
    use std::io::{Read, Write};
    install_crds();
    install_agent_identity();
    let served = Arc::new(std::sync::Mutex::new("v2".to_string()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    {
        let served = served.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 2048];
                let _ = conn.read(&mut buf);
                let v = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let _ = write!(
                    conn,
                    "HTTP/1.1 302 Found\r\nLocation: https://releases.example/os/releases/tag/{v}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
    }
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-channel").await;
        let names = nodes(&mut env, 1, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let timeline = Timeline::start(env.client.clone(), &env.id, &env.id);
    let cluster = cluster_role(&env, &["--node-agents", "--channel-interval", "1"]);
    // A private channel: its token must reach no log line.
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({"version": "", "channel": format!("http://127.0.0.1:{port}/channels/stable?token=SECRET123")}),
    ));
    let node = names[0].clone();
    let at = |v: &'static str| {
        let (client, plan, node) = (env.client.clone(), plan.clone(), node.clone());
        move || {
            block_on(async {
                let p = Api::<UpgradePlan>::all(client.clone())
                    .get(&plan)
                    .await
                    .ok()?;
                let e = p.entry(&node)?;
                (e.phase == UpgradePhase::Done && e.version.as_deref() == Some(v)).then_some(())
            })
            .is_some()
        }
    };
    serve(
        &fleet,
        &timeline,
        &names,
        Duration::from_secs(120),
        at("v2"),
    );
    let p = block_on(support::upgrades::plan(&env.client, &plan));
    let channel = p.status.and_then(|s| s.channel).unwrap_or_default();
    assert_eq!(channel.version.as_deref(), Some("v2"), "{channel:?}");
    assert!(
        channel.resolved.is_some() && channel.error.is_none(),
        "{channel:?}"
    );
    // The server names a newer version: rolled out like an edit of
    // `version`, without one.
    *served.lock().unwrap_or_else(|e| e.into_inner()) = "v3".into();
    serve(
        &fleet,
        &timeline,
        &names,
        Duration::from_secs(120),
        at("v3"),
    );
    // A hostile (or broken) server names a command, not a version: the
    // answer is refused and reported, the plan keeps v3, and nothing runs
    // (where-features-meet.md, finding 3).
    *served.lock().unwrap_or_else(|e| e.into_inner()) = "v4%3B%20touch%20%2Ftmp%2Fpwned".into();
    let refused = block_on(wait_for("the answer refused", LONG, || async {
        let p = support::upgrades::plan(&env.client, &plan).await;
        let c = p.status?.channel?;
        c.error
            .filter(|e| e.contains("is not a version"))
            .map(|e| (e, c.version))
    }));
    assert_eq!(refused.1.as_deref(), Some("v3"), "{refused:?}");
    assert!(
        refused.0.contains("\"v4; touch /tmp/pwned\""),
        "{refused:?}"
    );
    timeline.stop();
    assert_eq!(
        runs(&fleet, &node),
        vec!["v2".to_string(), "v3".to_string()],
        "cluster role:\n{}",
        cluster.log_text()
    );
    // Questions failed (the refused answer is logged as a warning), and no
    // line named the URL's token (finding 15).
    let log = cluster.log_text();
    assert!(
        log.contains("UpgradePlan channel http://127.0.0.1:"),
        "{log}"
    );
    assert!(!log.contains("SECRET123"), "{log}");
}

/// `channel` behind a proxy (where-features-meet.md, finding 14): where
/// egress goes only through `HTTP_PROXY`, the channel is asked through it
/// as system-upgrade-controller's Go client asks (`ProxyFromEnvironment`:
/// a request in absolute form to the proxy). The channel's host name is
/// one only the proxy can reach (`.invalid` resolves nowhere), so a
/// direct connection cannot answer. Notifications share the same client.
#[test]
fn a_channel_behind_http_proxy_is_asked_through_the_proxy() {
    use kube::api::PostParams;
    use nodekeeper::api::upgrade::UpgradePlanSpec;
    use std::io::{Read, Write};
    install_crds();
    let asked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let proxy = format!("http://{}", listener.local_addr().expect("its address"));
    {
        let asked = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 2048];
                let n = conn.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or_default().to_string();
                let ours = line == "GET http://channel.nodekeeper.invalid/stable HTTP/1.1";
                asked.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                let answer = if ours {
                    "HTTP/1.1 302 Found\r\nLocation: https://releases.example/tag/v7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else {
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                };
                let _ = conn.write_all(answer.as_bytes());
            }
        });
    }
    let env = block_on(TestEnv::new("up-proxy"));
    let args = support::machines::cluster_role_args(&env, &["--channel-interval", "1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Set on the process only; an inherited lower-case setting must not
    // take over (upper case wins, as in Go).
    let cluster = support::Agent::start_with_env(
        &args,
        &[
            ("HTTP_PROXY", proxy.as_str()),
            ("NO_PROXY", ""),
            ("no_proxy", ""),
        ],
    );
    let spec: UpgradePlanSpec = serde_json::from_value(json!({
        "nodeSelector": {"matchLabels": {support::GROUP_LABEL: env.id}},
        "version": "",
        "channel": "http://channel.nodekeeper.invalid/stable",
        "versionFrom": {"source": "Label", "key": VERSION_LABEL},
        "strategy": {"command": ["/bin/true"]},
    }))
    .expect("a plan spec");
    block_on(
        Api::<UpgradePlan>::all(env.client.clone())
            .create(&PostParams::default(), &UpgradePlan::new(&env.id, spec)),
    )
    .expect("creating the UpgradePlan");
    let channel = block_on(wait_for("the channel's answer", LONG, || async {
        let p = support::upgrades::plan(&env.client, &env.id).await;
        p.status?.channel.filter(|c| c.version.is_some())
    }));
    assert_eq!(
        channel.version.as_deref(),
        Some("v7"),
        "{channel:?}\ncluster role:\n{}",
        cluster.log_text()
    );
    let asked = asked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        asked
            .iter()
            .all(|l| l == "GET http://channel.nodekeeper.invalid/stable HTTP/1.1"),
        "the proxy was asked for something else: {asked:?}"
    );
}

/// Every uid seen per Job name.
type Uids = Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<String>>>>;

/// The uids of every Job of `plan` ever seen, by name, from a watch of
/// our own: a Job created again under its name shows a second uid.
fn job_uids(client: kube::Client, plan: &str) -> (Uids, nodekeeper::runtime::Latch) {
    use k8s_openapi::api::batch::v1::Job;
    use kube::runtime::watcher;
    use smol::stream::StreamExt;
    let seen: Uids = Arc::default();
    let stop = nodekeeper::runtime::Latch::default();
    let (out, halt, selector) = (
        seen.clone(),
        stop.clone(),
        format!("{}={plan}", nodekeeper::api::upgrade::PLAN_LABEL),
    );
    std::thread::spawn(move || {
        block_on(async move {
            let jobs = watcher(
                Api::<Job>::all(client),
                watcher::Config::default().labels(&selector),
            );
            let mut jobs = std::pin::pin!(jobs);
            let run = async {
                while let Some(ev) = jobs.next().await {
                    if let Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) = ev {
                        let uid = j.uid().unwrap_or_default();
                        let mut seen = seen_lock(&out);
                        let uids = seen.entry(j.name_any()).or_default();
                        if !uids.contains(&uid) {
                            uids.push(uid);
                        }
                    }
                }
            };
            smol::future::or(run, halt.wait()).await;
        })
    });
    (seen, stop)
}

fn seen_lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// where-features-meet.md, findings 4 and 12, on the real control plane.
/// A system-upgrade-controller user's k3s plan: `image:
/// …/k3s-upgrade:{version}` at `v1.33.1+k3s1` gets the image tag as SUC's
/// `MungeVersion` (pkg/upgrade/plan/plan.go) writes it, `v1.33.1-k3s1`
/// (a `+` is no image tag). Then a person deletes the upgrade Job to stop
/// it: the node fails with `JobDeleted` and the Job is never created
/// again (one uid for its name, from a watch of our own).
#[test]
fn a_k3s_version_tags_the_image_as_suc_does_and_a_deleted_upgrade_job_stays_deleted() {
    use k8s_openapi::api::batch::v1::Job;
    install_crds();
    install_agent_identity();
    let (env, names) = block_on(async {
        let mut env = TestEnv::new("up-k3s").await;
        let names = nodes(&mut env, 1, 0).await;
        (env, names)
    });
    let fleet = fleet_with_agents(&env, &names);
    let cluster = cluster_role(&env, &["--node-agents"]);
    let plan = block_on(create_plan(
        &env,
        &fleet,
        json!({
            "version": "v1.33.1+k3s1",
            "versionFrom": {"source": "Annotation", "key": "example.com/k3s-version"},
            "strategy": {"type": "Job", "command": [], "job": {
                "namespace": env.ns,
                "image": "registry.invalid/k3s-upgrade:{version}",
            }},
        }),
    ));
    let (uids, stop) = job_uids(env.client.clone(), &plan);
    let node = names[0].clone();
    let jobs_api: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    let job = block_on(wait_for("the upgrade Job", LONG, || async {
        jobs(&env.client, &plan).await.into_iter().next()
    }));
    let image = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].image.clone().unwrap_or_default())
        .unwrap_or_default();
    assert_eq!(image, "registry.invalid/k3s-upgrade:v1.33.1-k3s1");
    // Seen by the plan (recorded in its status), then deleted by a person.
    block_on(wait_for("the plan has seen its Job", LONG, || async {
        let p = plan_of(&env.client, &plan).await;
        p.entry(&node).is_some_and(|e| e.job_seen).then_some(())
    }));
    let job_name = job.name_any();
    block_on(jobs_api.delete(&job_name, &kube::api::DeleteParams::background()))
        .expect("deleting the upgrade Job");
    let failed = block_on(wait_for(
        "the node failed with JobDeleted",
        LONG,
        || async {
            let p = plan_of(&env.client, &plan).await;
            let e = p.entry(&node)?.clone();
            (e.phase == UpgradePhase::Failed && e.reason.as_deref() == Some("JobDeleted"))
                .then_some(e)
        },
    ));
    assert!(
        failed
            .message
            .unwrap_or_default()
            .contains("deleted before it finished"),
        "cluster role:\n{}",
        cluster.log_text()
    );
    // The decision that failed it was the one that would have created it
    // again; the Job is gone and was created once.
    block_on(wait_for("the Job gone", LONG, || async {
        jobs_api
            .get_opt(&job_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    }));
    stop.open();
    let uids = seen_lock(&uids).clone();
    assert_eq!(
        uids.get(&job_name).map(Vec::len),
        Some(1),
        "{uids:?}\ncluster role:\n{}",
        cluster.log_text()
    );
    assert_eq!(uids.len(), 1, "one Job in all: {uids:?}");
}
