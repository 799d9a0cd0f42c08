//! The middle test layer: the executor, the interpreter and the
//! per-object containment against a **scripted API server** — a kube
//! `Client` over an in-process tower service that answers each request from
//! a script and records it — in milliseconds. Between the pure decision
//! tests (`decide/`, no I/O) and the real control plane (`tests/`, minutes),
//! this is where "what does one pass send, and what does it do with each
//! answer" is pinned: a lost create read as existing, a 409 ending a plan
//! before it takes a node, a refused give-back backed off, an event that
//! cannot be published undoing nothing.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::node::Node;
use hyper::{Request, Response};
use kube::Client;
use kube::api::DynamicObject;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::context::Context;
use super::failing::Subject;
use super::passes::Kick;
use super::roles::Scope;
use super::stores::{Arrivals, Fresh, Stores, Synced};
use crate::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec};
use crate::api::reboot::RebootPolicy;
use crate::api::upgrade::UpgradePlan;
use crate::decide::{Effect, Plan};
use crate::effects::{Interpreter, events, evict, gate, host, talos};
use crate::error::Error;

/// How the scripted server answers one request.
#[derive(Clone)]
enum Reply {
    /// A status code and a JSON body.
    Json(u16, Value),
    /// The connection drops before an answer: the write may have happened.
    Lost,
}

/// One rule: requests with this method whose path contains `path` get the
/// next reply (the last one repeats).
struct Rule {
    method: &'static str,
    path: String,
    replies: VecDeque<Reply>,
}

/// What the server was asked.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    body: Value,
}

/// The scripted API server: its rules and every request it saw. A request
/// no rule matches is answered 404 (the object does not exist).
#[derive(Default)]
struct Script {
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<Seen>>,
}

impl Script {
    fn on(&self, method: &'static str, path: &str, replies: &[Reply]) {
        crate::runtime::lock(&self.rules).push(Rule {
            method,
            path: path.to_string(),
            replies: replies.iter().cloned().collect(),
        });
    }

    fn answer(&self, method: &str, uri: &str) -> Reply {
        let mut rules = crate::runtime::lock(&self.rules);
        let rule = rules
            .iter_mut()
            .find(|r| r.method == method && uri.contains(&r.path));
        match rule {
            Some(r) if r.replies.len() > 1 => r.replies.pop_front().unwrap_or(Reply::Lost),
            Some(r) => r.replies.front().cloned().unwrap_or(Reply::Lost),
            None => Reply::Json(404, status_body(404, "NotFound")),
        }
    }

    /// The requests seen with `method` whose URI contains `path`.
    fn asked(&self, method: &str, path: &str) -> Vec<Seen> {
        crate::runtime::lock(&self.seen)
            .iter()
            .filter(|s| s.method == method && s.uri.contains(path))
            .cloned()
            .collect()
    }

    fn writes(&self) -> Vec<Seen> {
        crate::runtime::lock(&self.seen)
            .iter()
            .filter(|s| s.method != "GET")
            .cloned()
            .collect()
    }
}

fn status_body(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": format!("scripted {code}"), "reason": reason, "code": code})
}

/// A kube client whose every request goes to `script`.
fn client(script: Arc<Script>) -> Client {
    let service = tower::service_fn(move |req: Request<Body>| {
        let script = script.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let (method, uri) = (parts.method.to_string(), parts.uri.to_string());
            crate::runtime::lock(&script.seen).push(Seen {
                method: method.clone(),
                uri: uri.clone(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            });
            match script.answer(&method, &uri) {
                Reply::Json(code, v) => Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(v.to_string().into_bytes()))
                    .map_err(|e| std::io::Error::other(e.to_string())),
                Reply::Lost => Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection reset (scripted)",
                )),
            }
        }
    });
    Client::new(service, "default")
}

/// A cluster role's context over `script`, its stores holding `nms`.
fn context(script: &Arc<Script>, nms: &[NodeMaintenance], gate: gate::LeaderGate) -> Context {
    let client = client(script.clone());
    let (nodes, _) = reflector::store::<Node>();
    let (maintenances, mut writer) = reflector::store::<NodeMaintenance>();
    for m in nms {
        writer.apply_watcher_event(&watcher::Event::Apply(m.clone()));
    }
    let (policies, _) = reflector::store::<RebootPolicy>();
    let (plans, _) = reflector::store::<UpgradePlan>();
    let jobs = Writer::<DynamicObject>::new(kube::discovery::ApiResource::erase::<
        k8s_openapi::api::batch::v1::Job,
    >(&()))
    .as_reader();
    let (pods, _) = reflector::store();
    let effects = Interpreter {
        client: client.clone(),
        events: events::Events::new(client, "nodekeeper", None),
        evictions: evict::Permits::new(4),
        exec: host::Exec::default(),
        records: PathBuf::from("/nonexistent"),
        talos: talos::Machined::new(PathBuf::from("/nonexistent")),
        provider: None,
        gate,
    };
    Context::new(
        effects,
        Scope::AllNodes { selector: None },
        Stores {
            nodes,
            pods: Arc::new(super::pod_watches::fixed(pods)),
            maintenances,
            policies,
            plans,
            drain_rules: kube::runtime::reflector::store::Writer::<kube::api::DynamicObject>::new(
                kube::api::ApiResource::erase::<crate::api::drain_rule::DrainRule>(&()),
            )
            .as_reader(),
            jobs,
            synced: {
                // No DrainRules: their (empty) list is in.
                let synced = Synced::default();
                synced.drain_rules.listed.open();
                synced
            },
            fresh: Arc::new(Fresh::default()),
            arrivals: Arc::new(Arrivals::default()),
        },
        Duration::from_secs(60),
        false,
        host::HostRoot(PathBuf::from("/")),
        Kick::new().0,
    )
}

fn nm(name: &str, node: &str, uid: &str) -> NodeMaintenance {
    let mut m = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some("scripted".into()),
        },
    );
    m.metadata.uid = Some(uid.into());
    m.metadata.resource_version = Some("1".into());
    m
}

/// The server takes patches of node `name`.
fn patches_of(script: &Script, name: &str) {
    let node = json!({"metadata": {"name": name}});
    script.on(
        "PATCH",
        &format!("/nodes/{name}"),
        &[Reply::Json(200, node)],
    );
}

/// An unguarded label patch of `node`.
fn label(node: &str) -> Effect {
    Effect::PatchNode {
        node: node.into(),
        resource_version: None,
        patch: json!({"metadata": {"labels": {"a": "b"}}}),
    }
}

fn policy_status_write() -> Effect {
    Effect::WritePolicyStatus {
        policy: "wave".into(),
        resource_version: Some("7".into()),
        status: Box::default(),
    }
}

fn event(reason: &'static str) -> Effect {
    Effect::Event {
        object: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        },
        warning: false,
        reason,
        note: "scripted".into(),
    }
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    crate::runtime::block_on(f)
}

#[test]
fn a_409_on_the_status_write_ends_the_plan_before_any_node_is_taken() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "PATCH",
            "/rebootpolicies/wave/status",
            &[Reply::Json(409, status_body(409, "Conflict"))],
        );
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::steps(vec![
            policy_status_write(),
            Effect::CreateMaintenance {
                nm: Box::new(nm("reboot-n1", "n1", "")),
            },
        ]);
        let err = super::executor::execute_plain(&ctx, "RebootPolicy wave", plan).await;
        assert_eq!(err.err().and_then(|e| e.api_code()), Some(409));
        assert!(script.asked("POST", "nodemaintenances").is_empty());
    });
}

#[test]
fn a_create_whose_answer_was_lost_is_read_as_existing() {
    run(async {
        let script = Arc::new(Script::default());
        script.on("POST", "/nodemaintenances", &[Reply::Lost]);
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::steps(vec![Effect::CreateMaintenance {
            nm: Box::new(nm("reboot-n1", "n1", "")),
        }]);
        let err = super::executor::execute_plain(&ctx, "RebootPolicy wave", plan).await;
        assert!(err.is_err_and(|e| e.possibly_applied()));
        // The next decision counts it (budgets, one owner per node).
        let names: Vec<String> = ctx
            .all_maintenances()
            .iter()
            .filter_map(|m| m.metadata.name.clone())
            .collect();
        assert_eq!(names, ["reboot-n1"]);
    });
}

#[test]
fn a_create_refused_by_the_server_is_not_read_as_existing() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "POST",
            "/nodemaintenances",
            &[Reply::Json(403, status_body(403, "Forbidden"))],
        );
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::steps(vec![Effect::CreateMaintenance {
            nm: Box::new(nm("reboot-n1", "n1", "")),
        }]);
        let err = super::executor::execute_plain(&ctx, "RebootPolicy wave", plan).await;
        assert_eq!(err.err().and_then(|e| e.api_code()), Some(403));
        assert!(ctx.all_maintenances().is_empty());
    });
}

#[test]
fn a_create_that_exists_already_is_done_and_the_plan_goes_on() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "POST",
            "/nodemaintenances",
            &[Reply::Json(409, status_body(409, "AlreadyExists"))],
        );
        patches_of(&script, "n1");
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::steps(vec![
            Effect::CreateMaintenance {
                nm: Box::new(nm("reboot-n1", "n1", "")),
            },
            label("n1"),
        ]);
        let done = super::executor::execute_plain(&ctx, "RebootPolicy wave", plan).await;
        assert!(done.is_ok(), "{done:?}");
        assert_eq!(script.asked("PATCH", "/nodes/n1").len(), 1);
    });
}

#[test]
fn a_give_back_deletes_only_the_object_with_that_uid_and_a_gone_one_is_done() {
    run(async {
        let script = Arc::new(Script::default());
        let ctx = context(&script, &[], gate::LeaderGate::always());
        // Unscripted: the server answers 404, already gone.
        let plan = Plan::steps(vec![Effect::DeleteMaintenance {
            nm: "reboot-n1".into(),
            uid: "u-1".into(),
        }]);
        let done = super::executor::execute_plain(&ctx, "give-back", plan).await;
        assert!(done.is_ok(), "{done:?}");
        let deletes = script.asked("DELETE", "/nodemaintenances/reboot-n1");
        assert_eq!(deletes.len(), 1);
        assert_eq!(deletes[0].body["preconditions"]["uid"], "u-1");
    });
}

#[test]
fn a_guarded_node_patch_carries_the_resource_version_it_was_decided_on() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "PATCH",
            "/nodes/n1",
            &[Reply::Json(409, status_body(409, "Conflict"))],
        );
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::steps(vec![Effect::PatchNode {
            node: "n1".into(),
            resource_version: Some("41".into()),
            patch: json!({"spec": {"unschedulable": true}}),
        }]);
        let err = super::executor::execute_plain(&ctx, "node n1", plan).await;
        assert_eq!(err.err().and_then(|e| e.api_code()), Some(409));
        let sent = script.asked("PATCH", "/nodes/n1");
        assert_eq!(sent[0].body["metadata"]["resourceVersion"], "41");
        assert_eq!(sent[0].body["spec"]["unschedulable"], true);
    });
}

#[test]
fn independent_writes_are_all_sent_when_one_fails() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "PATCH",
            "/nodes/n1",
            &[Reply::Json(500, status_body(500, "InternalError"))],
        );
        patches_of(&script, "n2");
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::together(vec![label("n1"), label("n2")]);
        let err = super::executor::execute_plain(&ctx, "clean-up", plan).await;
        assert_eq!(err.err().and_then(|e| e.api_code()), Some(500));
        assert_eq!(script.asked("PATCH", "/nodes/n2").len(), 1);
    });
}

#[test]
fn an_event_that_cannot_be_published_undoes_nothing() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "POST",
            "/events",
            &[Reply::Json(500, status_body(500, "InternalError"))],
        );
        patches_of(&script, "n1");
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let plan = Plan::steps(vec![event("RebootAdmitted"), label("n1")]);
        let done = super::executor::execute_plain(&ctx, "RebootPolicy wave", plan).await;
        assert!(done.is_ok(), "{done:?}");
        assert_eq!(script.asked("POST", "/events").len(), 1);
        assert_eq!(script.asked("PATCH", "/nodes/n1").len(), 1);
    });
}

#[test]
fn no_write_starts_while_the_lease_is_in_doubt() {
    run(async {
        let script = Arc::new(Script::default());
        let ctx = context(&script, &[], gate::LeaderGate::elected());
        let plan = Plan::steps(vec![policy_status_write()]);
        let err = super::executor::execute_plain(&ctx, "RebootPolicy wave", plan).await;
        assert!(err.is_err());
        assert!(script.writes().is_empty(), "{:?}", script.writes());
    });
}

/// The containment's subject for a RebootPolicy named `wave`.
fn wave() -> Subject {
    let mut p = RebootPolicy::new("wave", Default::default());
    p.metadata.uid = Some("p-1".into());
    p.metadata.generation = Some(1);
    Subject::typed(&p)
}

#[test]
fn a_failed_object_is_reported_once_and_backed_off_while_the_others_go_on() {
    run(async {
        let script = Arc::new(Script::default());
        script.on(
            "POST",
            "/events",
            &[Reply::Json(201, json!({"metadata": {"name": "e"}}))],
        );
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let subject = wave();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let decide = |_failing: Option<String>| async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err::<Option<Duration>, _>(Error::Invalid("the webhook refused it".into()))
        };
        let wait = super::contain::contain(&ctx, &subject, decide).await;
        assert!(
            wait.is_some_and(|w| w >= Duration::from_secs(1)),
            "{wait:?}"
        );
        let posted = script.asked("POST", "/events");
        assert_eq!(posted.len(), 1);
        assert_eq!(posted[0].body["reason"], "ReconcileFailed");
        // Asked again at once (a kick): still backing off, not decided.
        let again = super::contain::contain(&ctx, &subject, decide).await;
        assert!(again.is_some());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Another object is decided meanwhile.
        let mut other = RebootPolicy::new("other", Default::default());
        other.metadata.uid = Some("p-2".into());
        let ok = super::contain::contain(&ctx, &Subject::typed(&other), |_| async {
            Ok(Some(Duration::from_secs(30)))
        })
        .await;
        assert_eq!(ok, Some(Duration::from_secs(30)));
    });
}

#[test]
fn a_conflict_is_decided_again_soon_and_publishes_nothing() {
    run(async {
        let script = Arc::new(Script::default());
        let ctx = context(&script, &[], gate::LeaderGate::always());
        let conflict = || async {
            // A 409 the way the interpreter reports one.
            let e = kube::Error::Api(
                serde_json::from_value(status_body(409, "Conflict")).unwrap_or_default(),
            );
            Err::<Option<Duration>, _>(Error::kube("writing RebootPolicy wave".to_string())(e))
        };
        let wait = super::contain::contain(&ctx, &wave(), |_| conflict()).await;
        assert!(wait.is_some_and(|w| w < Duration::from_secs(5)), "{wait:?}");
        assert!(script.asked("POST", "/events").is_empty());
    });
}

#[test]
fn a_gone_owners_node_is_given_back_only_once_the_api_server_says_it_is_gone() {
    run(async {
        let script = Arc::new(Script::default());
        let mut owned = nm("reboot-n1", "n1", "u-1");
        owned.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "nodekeeper.io/v1alpha1".into(),
                kind: "RebootPolicy".into(),
                name: "wave".into(),
                uid: "p-1".into(),
                ..Default::default()
            },
        ]);
        // The store has not seen the policy yet; the API server has it.
        script.on(
            "GET",
            "/rebootpolicies/wave",
            &[
                Reply::Json(
                    200,
                    json!({"apiVersion": "nodekeeper.io/v1alpha1", "kind": "RebootPolicy",
                           "metadata": {"name": "wave", "uid": "p-1"}, "spec": {}}),
                ),
                Reply::Json(404, status_body(404, "NotFound")),
            ],
        );
        let ctx = context(
            &script,
            std::slice::from_ref(&owned),
            gate::LeaderGate::always(),
        );
        let all = ctx.all_maintenances();
        let give_back = || Effect::DeleteMaintenance {
            nm: "reboot-n1".into(),
            uid: "u-1".into(),
        };
        super::contain::give_back::<RebootPolicy>(&ctx, &all, vec![give_back()]).await;
        assert!(script.asked("DELETE", "/nodemaintenances").is_empty());
        // Now it is gone at the API server too.
        super::contain::give_back::<RebootPolicy>(&ctx, &all, vec![give_back()]).await;
        assert_eq!(
            script.asked("DELETE", "/nodemaintenances/reboot-n1").len(),
            1
        );
    });
}

#[test]
fn eviction_requests_are_detected_from_discovery_and_their_absence_is_no_error() {
    run(async {
        let served = Arc::new(Script::default());
        let list = json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "lifecycle.k8s.io/v1alpha1",
            "resources": [{"name": "evictionrequests", "singularName": "evictionrequest",
                "namespaced": true, "kind": "EvictionRequest", "verbs": ["create", "get", "list"]}]});
        served.on(
            "GET",
            "/apis/lifecycle.k8s.io/v1alpha1",
            &[Reply::Json(200, list)],
        );
        let found = super::connect::eviction_requests_served(&client(served.clone())).await;
        assert!(found);
        assert_eq!(crate::runtime::lock(&served.seen).len(), 1, "one request");
        // Not served (the gate off, or before 1.37): a 404, no error.
        let absent = Arc::new(Script::default());
        assert!(!super::connect::eviction_requests_served(&client(absent)).await);
    });
}
