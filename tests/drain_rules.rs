//! DrainRules on the real control plane, asserted from an independent
//! watch of the pods (never from nodekeeper's status): tiers evicted lowest
//! order first, WaitCompleted pods never evicted and done when they finish,
//! Skip pods left, and rules confined to the nodes they select. The rules
//! are cluster-scoped, so each test's select only its own nodes.

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use nodekeeper::api::drain_rule::{
    Behavior, DrainRule, DrainRuleDrain, DrainRuleNodes, DrainRulePods, DrainRuleSpec,
};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, Phase};
use nodekeeper::runtime::Latch;
use smol::stream::StreamExt;
use support::{Agent, GROUP_LABEL, TestEnv, block_on, install_crds, wait_for};

const LIMIT: Duration = Duration::from_secs(60);

/// The order in which pods of a namespace were first marked for deletion
/// (a deletionTimestamp, or gone), as the API server tells any watcher.
fn watch_removals(
    client: kube::Client,
    ns: String,
    stop: Latch,
) -> (Arc<Mutex<Vec<String>>>, std::thread::JoinHandle<()>) {
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = order.clone();
    let handle = std::thread::spawn(move || {
        block_on(async move {
            let mark = |name: String| {
                let mut o = seen.lock().unwrap_or_else(|p| p.into_inner());
                if !o.contains(&name) {
                    o.push(name);
                }
            };
            let events = watcher(
                Api::<Pod>::namespaced(client, &ns),
                watcher::Config::default(),
            );
            let on_pods = async move {
                let mut events = std::pin::pin!(events);
                while let Some(e) = events.next().await {
                    match e {
                        Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))
                            if p.metadata.deletion_timestamp.is_some() =>
                        {
                            mark(p.name_any())
                        }
                        Ok(watcher::Event::Delete(p)) => mark(p.name_any()),
                        _ => {}
                    }
                }
            };
            smol::future::or(on_pods, async { stop.wait().await }).await;
        })
    });
    (order, handle)
}

/// A DrainRule named `<id>-<suffix>` for pods `app=<app>` on this test's
/// nodes only.
fn rule(
    env: &TestEnv,
    suffix: &str,
    app: &str,
    behavior: Behavior,
    order: Option<i32>,
) -> DrainRule {
    let selector = |pairs: BTreeMap<String, String>| {
        Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(pairs),
                ..Default::default()
            },
        )
    };
    DrainRule {
        metadata: ObjectMeta {
            name: Some(format!("{}-{suffix}", env.id)),
            ..Default::default()
        },
        spec: DrainRuleSpec {
            drain: DrainRuleDrain { behavior, order },
            nodes: Some(vec![DrainRuleNodes {
                selector: selector([(GROUP_LABEL.to_string(), env.id.clone())].into()),
            }]),
            pods: Some(vec![DrainRulePods {
                selector: selector([("app".to_string(), app.to_string())].into()),
                namespace_selector: None,
            }]),
        },
    }
}

/// Tiers go lowest order first (a negative order before the default 0,
/// then 5); a WaitCompleted pod is never evicted and holds the later tier
/// until it finishes, then the drain ends with it still there; a Skip pod
/// stays. Run by the node agent as shipped.
#[test]
fn tiers_go_in_order_and_wait_completed_ends_when_the_pod_finishes() {
    install_crds();
    block_on(async {
        let mut env = TestEnv::new("dr-tiers").await;
        let node = env.add_node("a").await;
        env.wait_node_ready(&node).await;
        for name in ["early", "mid", "late", "batch", "kept"] {
            env.bound_pod(name, &node, |_| {}).await;
        }
        let rules: Api<DrainRule> = Api::all(env.client.clone());
        let created = [
            rule(&env, "a-early", "early", Behavior::Drain, Some(-1)),
            rule(&env, "b-late", "late", Behavior::Drain, Some(5)),
            rule(&env, "c-batch", "batch", Behavior::WaitCompleted, None),
            rule(&env, "d-kept", "kept", Behavior::Skip, None),
        ];
        for r in &created {
            rules
                .create(&PostParams::default(), r)
                .await
                .expect("create DrainRule");
        }
        // The dry run shows the plan the drain will follow: the first tier
        // evicted now, the rest later, each with its rule and order.
        let kc = support::cluster().to_string_lossy().to_string();
        let (ok, plan, err) =
            support::run_cli(&["drain", "--dry-run", &node, "--kubeconfig", &kc], &[]);
        assert!(ok.success(), "{err}");
        let row = |pod: &str| {
            plan.lines()
                .find(|l| l.contains(&format!("{}/{pod} ", env.ns)))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            row("early").starts_with("evict") && row("early").contains("a-early (Drain, order -1)"),
            "{plan}"
        );
        assert!(
            row("late").starts_with("later") && row("late").contains("b-late (Drain, order 5)"),
            "{plan}"
        );
        assert!(
            row("batch").starts_with("later") && row("batch").contains("WaitCompleted"),
            "{plan}"
        );
        assert!(row("kept").starts_with("skip"), "{plan}");
        let stop = Latch::default();
        let (removed, watching) = watch_removals(env.client.clone(), env.ns.clone(), stop.clone());
        let _agent = Agent::start(&["run", "--node", &node]);
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let name = env.maintain("m", &node, "tiers").await;

        // The drain holds at the WaitCompleted pod, saying so, with the
        // order-5 pod waiting behind it.
        let (held, so_far) = wait_for("the drain held by the WaitCompleted pod", LIMIT, || async {
            let st = nms.get(&name).await.ok()?.status?;
            let why = st.last_error?;
            let so_far = removed.lock().unwrap_or_else(|p| p.into_inner()).clone();
            (why.contains("WaitCompleted") && why.contains("order 5") && so_far.len() >= 2)
                .then_some((why, so_far))
        })
        .await;
        assert_eq!(so_far, ["early", "mid"], "removed while held ({held})");

        // The job finishes by itself (as its kubelet would report).
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        pods.patch_status(
            "batch",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect("batch Succeeded");
        wait_for("the maintenance Succeeded", LIMIT, || async {
            let nm = nms.get(&name).await.ok()?;
            (nm.status?.phase == Some(Phase::Succeeded)).then_some(())
        })
        .await;
        stop.open();
        let _ = watching.join();
        let order = removed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(order, ["early", "mid", "late"], "removal order");
        for left in ["batch", "kept"] {
            let pod = pods.get(left).await.expect("still there");
            assert!(
                pod.metadata.deletion_timestamp.is_none(),
                "{left} was removed"
            );
        }
        for r in &created {
            let _ = rules.delete(&r.name_any(), &Default::default()).await;
        }
    });
}
