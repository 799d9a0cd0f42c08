//! The mutex flow on hand-built worlds. [`World`] plays the API server and
//! a machine-config operator: it applies status writes, pool and node
//! patches and Jobs, and upgrades nodes that sit in an unpaused pool.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::api::node::Node;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::*;
use crate::decide::Plan;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

fn now() -> Timestamp {
    "2026-11-23T12:00:00Z".parse().unwrap_or_default()
}

fn node(name: &str, version: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [
                    (WORKER_LABEL.to_string(), String::new()),
                    ("pool".to_string(), "workers".to_string()),
                    (VERSION_LABEL.to_string(), version.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ops".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        ..Default::default()
    }
}

fn valid_rule(name: &str, cleanup: bool) -> MutexRule {
    let mut r = MutexRule::new(
        name,
        MutexRuleSpec {
            job_name: format!("{name}-job"),
            job_namespace: "ops".into(),
            job_spec: json!({"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "x", "env": [{"name": "A", "value": "1"}]}]}}}),
            type_: "kubernetes".into(),
            cleanup_job_spec: cleanup.then(
                || json!({"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}),
            ),
        },
    );
    r.metadata = meta(name);
    r.status = Some(MutexRuleStatus {
        conditions: vec![MutexCondition {
            type_: "ValidConfig".into(),
            status: "True".into(),
            ..Default::default()
        }],
    });
    r
}

fn pool(paused: bool, labels: &[(&str, &str)]) -> PoolView {
    PoolView {
        paused,
        node_selector: Some(LabelSelector {
            match_labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            match_expressions: None,
        }),
    }
}

/// The Jobs' states, as the cluster role's untyped store gives them.
fn states(jobs: &HashMap<String, Arc<Job>>) -> HashMap<String, crate::decide::jobs::JobState> {
    jobs.iter()
        .map(|(k, j)| {
            let v = serde_json::to_value(&**j).unwrap_or_default();
            (k.clone(), crate::decide::jobs::state(&v))
        })
        .collect()
}

struct World {
    run: MutexRunConfig,
    rules: Vec<Arc<MutexRule>>,
    targets: Vec<Arc<MutexTarget>>,
    pools: BTreeMap<String, PoolView>,
    cv: ClusterVersionView,
    nodes: Vec<Arc<Node>>,
    jobs: HashMap<String, Arc<Job>>,
    created: Vec<Job>,
    now: Timestamp,
}

impl World {
    fn new(cleanup: bool) -> World {
        let mut canary = pool(false, &[("pool", "workers")]);
        if let Some(s) = canary.node_selector.as_mut() {
            s.match_expressions = Some(vec![LabelSelectorRequirement {
                key: "isCanary".into(),
                operator: "Exists".into(),
                values: None,
            }]);
        }
        let pools = [
            ("workers".to_string(), pool(false, &[("pool", "workers")])),
            ("canary".to_string(), canary),
        ]
        .into();
        let nodes: Vec<Arc<Node>> = ["w1", "w2", "w3"]
            .iter()
            .map(|n| Arc::new(node(n, "4.15.0")))
            .collect();
        let mut t = MutexTarget::new(
            "workers",
            MutexTargetSpec {
                machine_config_pools: vec!["workers".into()],
            },
        );
        t.metadata = meta("workers");
        let mut w = World {
            run: MutexRunConfig::new(
                "run",
                MutexRunConfigSpec {
                    canary: Canary {
                        name: "canary".into(),
                    },
                    mutex_rules: vec![
                        Ref {
                            name: "drain".into(),
                            namespace: None,
                        },
                        Ref {
                            name: "db".into(),
                            namespace: None,
                        },
                    ],
                    mutex_targets: vec![Ref {
                        name: "workers".into(),
                        namespace: None,
                    }],
                    upgrade_timeout_seconds: None,
                },
            ),
            rules: vec![
                Arc::new(valid_rule("drain", cleanup)),
                Arc::new(valid_rule("db", false)),
            ],
            targets: Vec::new(),
            pools,
            cv: ClusterVersionView {
                desired: Some("4.16.2".into()),
                history_state: Some("Completed".into()),
            },
            nodes,
            jobs: HashMap::new(),
            created: Vec::new(),
            now: now(),
        };
        w.run.metadata = meta("run");
        // The target's node list, as the target reconcile gathers it.
        if let Some(Effect::WriteMutexStatus { status, .. }) =
            target(&t, Some(&w.pools), &w.nodes, now())
        {
            t.status = serde_json::from_value(status).ok();
        }
        w.targets = vec![Arc::new(t)];
        w
    }

    fn decide(&self) -> Plan {
        let versions = BTreeMap::new();
        run(&RunSnapshot {
            run: &self.run,
            rules: &self.rules,
            targets: &self.targets,
            pools: Some(&self.pools),
            pool_versions: &versions,
            cluster_version: Some(&self.cv),
            nodes: &self.nodes,
            jobs: &states(&self.jobs),
            job_errors: &HashMap::new(),
            now: self.now,
        })
    }

    fn step(&mut self) -> Vec<Effect> {
        let fx = self.decide().effects;
        for e in &fx {
            match e {
                Effect::WriteMutexStatus { status, .. } => {
                    self.run.status = serde_json::from_value(status.clone()).ok()
                }
                Effect::PatchPool { name, patch } => {
                    let p = self.pools.entry(name.clone()).or_default();
                    if let Some(b) = patch["spec"]["paused"].as_bool() {
                        p.paused = b;
                    }
                    if let Some(e) = patch["spec"]["nodeSelector"].get("matchExpressions") {
                        let sel = p.node_selector.get_or_insert_with(Default::default);
                        sel.match_expressions = serde_json::from_value(e.clone()).ok();
                    }
                }
                Effect::PatchNode { node, patch, .. } => {
                    let labels = patch["metadata"]["labels"]
                        .as_object()
                        .cloned()
                        .unwrap_or_default();
                    self.edit(node, |n| {
                        let l = n.metadata.labels.get_or_insert_with(Default::default);
                        for (k, v) in labels {
                            match v.as_str() {
                                Some(v) => {
                                    l.insert(k, v.into());
                                }
                                None => {
                                    l.remove(&k);
                                }
                            }
                        }
                    });
                }
                Effect::CreateJob { job } => {
                    let key = crate::decide::jobs::key_of(
                        job.metadata.namespace.as_deref().unwrap_or_default(),
                        job.metadata.name.as_deref().unwrap_or_default(),
                    );
                    if !self.jobs.contains_key(&key) {
                        let typed: Job = serde_json::to_value(&**job)
                            .and_then(serde_json::from_value)
                            .unwrap_or_else(|e| panic!("a Job: {e}"));
                        self.created.push(typed.clone());
                        self.jobs.insert(key, Arc::new(typed));
                    }
                }
                _ => {}
            }
        }
        fx
    }

    fn edit(&mut self, name: &str, f: impl FnOnce(&mut Node)) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == name) {
            let mut x = (**n).clone();
            f(&mut x);
            *n = Arc::new(x);
        }
    }

    fn progress(&self) -> RunProgress {
        self.run
            .status
            .as_ref()
            .and_then(|s| s.progress.clone())
            .unwrap_or_default()
    }

    fn cond(&self, t: &str) -> MutexCondition {
        self.run
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t).cloned())
            .unwrap_or_else(|| panic!("no {t}: {:?}", self.run.status))
    }

    fn finish_running_job(&mut self, ok: bool) {
        let key = self
            .progress()
            .job
            .unwrap_or_else(|| panic!("no job in {:?}", self.progress()));
        let mut j = (*self.jobs[&key]).clone();
        j.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: if ok { "Complete" } else { "Failed" }.into(),
                status: "True".into(),
                reason: Some(
                    if ok {
                        "Completed"
                    } else {
                        "BackoffLimitExceeded"
                    }
                    .into(),
                ),
                ..Default::default()
            }]),
            ..Default::default()
        });
        self.jobs.insert(key, Arc::new(j));
    }

    /// The simulated MCO: nodes in an unpaused pool get the desired version.
    fn mco(&mut self) {
        let desired = self.cv.desired.clone().unwrap_or_default();
        let pools = self.pools.clone();
        for n in self.nodes.clone() {
            let in_unpaused = pools.values().any(|p| {
                !p.paused
                    && p.node_selector
                        .as_ref()
                        .is_some_and(|s| crate::decide::selector::selector_matches(s, n.labels()))
            });
            if in_unpaused {
                let d = desired.clone();
                self.edit(&n.name_any(), |x| {
                    x.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert(VERSION_LABEL.into(), d);
                });
            }
        }
    }

    fn version(&self, n: &str) -> String {
        self.nodes
            .iter()
            .find(|x| x.name_any() == n)
            .and_then(|x| x.labels().get(VERSION_LABEL).cloned())
            .unwrap_or_default()
    }
}

#[test]
fn a_run_pauses_labels_moves_selectors_then_upgrades_node_by_node_and_restores() {
    let mut w = World::new(true);
    w.step(); // status: prepared effects
    w.step(); // observes the world prepared
    w.mco();
    assert!(w.pools["workers"].paused);
    assert_eq!(w.cond("TargetPoolsPaused").status, "True");
    assert_eq!(w.cond("MCPUpdated").status, "True");
    assert_eq!(w.cond("UpgradeReady").status, "True");
    let label = rule_label("drain", "ops");
    assert!(w.nodes.iter().all(|n| n.labels().contains_key(&label)));
    // Nobody upgraded yet: everyone waits in the paused target pool.
    assert!(["w1", "w2", "w3"].iter().all(|n| w.version(n) == "4.15.0"));

    let p = w.progress();
    assert_eq!(p.nodes, ["w1", "w2", "w3"]);
    assert_eq!(p.step, "Jobs");
    // w1's first rule Job: appended env, kept off w1.
    let job = w.created.last().cloned().unwrap_or_default();
    let pod = job.spec.and_then(|s| s.template.spec).unwrap_or_default();
    let env: Vec<String> = pod.containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| format!("{}={}", e.name, e.value.unwrap_or_default()))
        .collect();
    assert_eq!(env, ["A=1", "NODE_NAME=w1", "MUTEX_RULE=drain"]);
    assert!(format!("{:?}", pod.affinity).contains("NotIn"));

    for (i, n) in ["w1", "w2", "w3"].iter().enumerate() {
        assert_eq!(w.progress().current, i as i32);
        // Two rule Jobs in order, then the release.
        w.finish_running_job(true);
        w.step();
        w.finish_running_job(true);
        w.step();
        assert_eq!(w.progress().step, "Upgrading", "{:?}", w.progress());
        assert!(
            !w.nodes
                .iter()
                .find(|x| x.name_any() == *n)
                .is_some_and(|x| x.labels().contains_key(&label))
        );
        assert!(
            w.cond("JobRun")
                .message
                .contains(&format!("Node is {} of 3", i + 1))
        );
        w.mco();
        assert_eq!(w.version(n), "4.16.2");
        // Only the released node moved.
        for other in ["w1", "w2", "w3"].iter().skip(i + 1) {
            assert_eq!(w.version(other), "4.15.0");
        }
        w.step();
        // Cleanup Job for the rule that has one.
        assert_eq!(w.progress().step, "Cleanup");
        assert!(
            w.progress()
                .job
                .is_some_and(|j| j.contains("drain-job-cleanup"))
        );
        w.finish_running_job(true);
        w.step();
    }
    w.step();
    assert_eq!(w.progress().step, "Done", "{:?}", w.progress());
    assert!(!w.pools["workers"].paused);
    let canary = w.pools["canary"]
        .node_selector
        .clone()
        .and_then(|s| s.match_expressions)
        .unwrap_or_default();
    assert_eq!(canary[0].key, "isCanary", "restored as it was");
    assert!(
        w.pools["workers"]
            .node_selector
            .clone()
            .and_then(|s| s.match_expressions)
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(w.cond("UpgradeAvailable").status, "False");
    assert_eq!(
        w.created.len(),
        3 * 3,
        "two rule Jobs and one cleanup Job per node, once each"
    );
    // Nothing more to do.
    w.step();
    assert_eq!(w.progress().step, "Done");
}

#[test]
fn a_failed_job_stops_the_run_with_a_false_condition_until_the_spec_changes() {
    let mut w = World::new(false);
    w.step();
    w.step();
    w.finish_running_job(false);
    w.step();
    let c = w.cond("JobRun");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "JobRunFailed")
    );
    assert!(c.message.contains("BackoffLimitExceeded"));
    assert_eq!(w.progress().step, "Failed");
    assert!(
        w.pools["workers"].paused,
        "pools stay paused, as the original"
    );
    let created = w.created.len();
    w.step();
    assert_eq!(w.created.len(), created, "no retry loop");
    // A spec change retries the node with new Job names.
    w.run.metadata.generation = Some(2);
    w.step();
    assert_eq!(w.progress().step, "Jobs");
    assert_eq!(w.created.len(), created + 1);
}

#[test]
fn a_node_that_never_reports_the_version_fails_at_the_deadline() {
    let mut w = World::new(false);
    w.step();
    w.step();
    w.finish_running_job(true);
    w.step();
    w.finish_running_job(true);
    w.step();
    assert_eq!(w.progress().step, "Upgrading");
    w.now = w
        .now
        .checked_add(SignedDuration::from_secs(5999))
        .unwrap_or(w.now);
    w.step();
    assert_eq!(w.progress().step, "Upgrading");
    w.now = w
        .now
        .checked_add(SignedDuration::from_secs(2))
        .unwrap_or(w.now);
    w.step();
    let c = w.cond("NodeUpgrade");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NodeUpgradeFailed")
    );
}

#[test]
fn nothing_is_touched_without_the_pool_api_or_with_a_missing_rule_target_or_canary() {
    let w = World::new(false);
    let versions = BTreeMap::new();
    let snap = |pools: Option<&BTreeMap<String, PoolView>>,
                rules: &[Arc<MutexRule>],
                targets: &[Arc<MutexTarget>],
                run: &MutexRunConfig|
     -> Plan { run_plan(run, rules, targets, pools, &versions, &w) };
    let check = |plan: Plan, needle: &str| {
        assert_eq!(plan.effects.len(), 1, "only the status: {:?}", plan.effects);
        let Effect::WriteMutexStatus { status, .. } = &plan.effects[0] else {
            panic!("{:?}", plan.effects)
        };
        let c = &status["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("ConfigValidated"), Some("False"), Some("FetchFailed"))
        );
        assert!(
            c["message"].as_str().unwrap_or_default().contains(needle),
            "{c}"
        );
    };
    check(
        snap(None, &w.rules, &w.targets, &w.run),
        "no MachineConfigPool API",
    );
    check(
        snap(Some(&w.pools), &w.rules[..1], &w.targets, &w.run),
        "MutexRule ops/db not found",
    );
    check(
        snap(Some(&w.pools), &w.rules, &[], &w.run),
        "MutexTarget ops/workers not found",
    );
    let mut r = w.run.clone();
    r.spec.canary.name = "nope".into();
    check(
        snap(Some(&w.pools), &w.rules, &w.targets, &r),
        "canary MachineConfigPool \"nope\" not found",
    );
}

fn run_plan(
    run_config: &MutexRunConfig,
    rules: &[Arc<MutexRule>],
    targets: &[Arc<MutexTarget>],
    pools: Option<&BTreeMap<String, PoolView>>,
    versions: &BTreeMap<String, String>,
    w: &World,
) -> Plan {
    run(&RunSnapshot {
        run: run_config,
        rules,
        targets,
        pools,
        pool_versions: versions,
        cluster_version: Some(&w.cv),
        nodes: &w.nodes,
        jobs: &states(&w.jobs),
        job_errors: &HashMap::new(),
        now: w.now,
    })
}

#[test]
fn rules_and_targets_are_validated_without_side_effects() {
    let mut r = valid_rule("x", false);
    r.status = None;
    r.spec.job_spec = json!({"template": {"spec": {"containers": 3}}});
    let Some(Effect::WriteMutexStatus { status, .. }) = rule(&r, now()) else {
        panic!("expected a status write")
    };
    assert_eq!(status["conditions"][0]["reason"], "InvalidConfig");

    let mut t = MutexTarget::new(
        "t",
        MutexTargetSpec {
            machine_config_pools: vec!["gone".into()],
        },
    );
    t.metadata = meta("t");
    let Some(Effect::WriteMutexStatus { status, .. }) =
        target(&t, Some(&BTreeMap::new()), &[], now())
    else {
        panic!("expected a status write")
    };
    assert_eq!(status["nodes"], json!([]));
    let conds = status["conditions"].as_array().cloned().unwrap_or_default();
    assert!(
        conds.iter().all(|c| c["status"] == "False"),
        "the original wrote True here: {conds:?}"
    );
}

#[test]
fn versions_compare_as_releases() {
    assert!(version_lt("4.15.9", "4.16.0"));
    assert!(version_lt("0.0.0", "4.16.0"));
    assert!(version_lt("4.16.0-rc.1", "4.16.0"));
    assert!(!version_lt("4.16.0", "4.16.0"));
    assert!(!version_lt("4.16.10", "4.16.9"));
}
