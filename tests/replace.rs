//! Rolling node replacement (Constellation's NodeVersion) on the real
//! control plane, with a simulated cloud (tests/kwok-provider) behind the
//! provider protocol. Surge, budget and "once" claims come from an
//! independent watcher and the cloud's own call log, never from the
//! NodeVersion's status. The tests take turns: AutoscalingStrategies are
//! cluster-wide, as in Constellation.

use crate::support;

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodekeeper::api::constellation::*;
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use serde_json::{Value, json};
use support::machines::cluster_role;
use support::replace::*;
use support::{Agent, GROUP_LABEL, TestEnv, apply, block_on, install_crds, kubectl, wait_for};

static TURN: Mutex<()> = Mutex::new(());

const LIMIT: Duration = Duration::from_secs(180);

struct Rollout {
    env: TestEnv,
    cloud: Cloud,
    agent: Option<Agent>,
    /// The nodes before the image change, per group.
    before: Vec<String>,
}

fn group_id(env: &TestEnv, g: &str) -> String {
    format!("{}-{g}", env.id)
}

/// A cluster of `counts` nodes per group (`cp` is the control-plane group)
/// on image img-1, a NodeVersion governing them, an autoscaler Deployment
/// with its AutoscalingStrategy, and the cluster role with the provider.
async fn rollout(name: &str, counts: &[(&str, usize)], surge: i32, components: bool) -> Rollout {
    install_crds();
    install_constellation_crds();
    let env = TestEnv::new(name).await;
    let groups: Vec<Value> = counts
        .iter()
        .map(|(g, _)| {
            json!({
                "groupId": group_id(&env, g),
                "name": group_id(&env, g),
                "role": if *g == "cp" { "ControlPlane" } else { "Worker" },
                "image": "img-1",
            })
        })
        .collect();
    let mut cloud = Cloud::new(&env, json!(groups), 1.0);
    if components {
        cloud.set("components", json!("k8s-components-1"));
    }
    for (g, _) in counts {
        apply(&json!({
            "apiVersion": "update.edgeless.systems/v1alpha1",
            "kind": "ScalingGroup",
            "metadata": { "name": group_id(&env, g), "labels": { GROUP_LABEL: env.id } },
            "spec": {
                "nodeImage": env.id,
                "groupId": group_id(&env, g),
                "autoscalerGroupName": group_id(&env, g),
                "nodeGroupName": group_id(&env, g),
                "autoscaling": *g != "cp",
                "min": 1,
                "max": 10,
                "role": if *g == "cp" { "ControlPlane" } else { "Worker" },
            }
        }));
    }
    let mut before = Vec::new();
    for (g, n) in counts {
        before.extend(cloud.boot(&env, &group_id(&env, g), *n).await);
    }
    // Labels a heir must inherit, and a reserved one it must not.
    let nodes: Api<Node> = Api::all(env.client.clone());
    for n in &before {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": {
                    "team": format!("blue-{n}"),
                    "topology.kubernetes.io/zone": "z1",
                }}})),
            )
            .await
            .expect("labelling a node");
    }
    let mut nv = json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "NodeVersion",
        "metadata": { "name": env.id, "labels": { GROUP_LABEL: env.id } },
        "spec": {
            "image": "img-1",
            "imageVersion": "v1",
            "maxSurge": surge,
            "joinTimeoutSeconds": 10,
            "leaveTimeoutSeconds": 30,
            "nodeSelector": { "matchLabels": { GROUP_LABEL: env.id } },
        }
    });
    if components {
        nv["spec"]["kubernetesComponentsReference"] = json!("k8s-components-1");
    }
    apply(&nv);
    // The autoscaler: its pods never schedule (no node matches).
    let mut dep = env.deployment("autoscaler", 1);
    if let Some(spec) = dep.spec.template.spec.as_mut() {
        spec.node_selector =
            Some([("nodekeeper.test/nowhere".to_string(), "true".to_string())].into());
    }
    Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &dep)
        .await
        .expect("creating the autoscaler Deployment");
    apply(&json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "AutoscalingStrategy",
        "metadata": { "name": env.id, "labels": { GROUP_LABEL: env.id } },
        "spec": {
            "enabled": true,
            "deploymentName": "autoscaler",
            "deploymentNamespace": env.ns,
            "autoscalerExtraArgs": { "logtostderr": "true" },
        }
    }));
    let agent = start_agent(&env, &cloud);
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    let done = smol::future::or(
        async {
            wait_nv(
                &env.client,
                &env.id,
                "every node up to date",
                Duration::from_secs(60),
                |v| {
                    up_to_date(v)
                        && v["status"]["upToDate"].as_array().map(|a| a.len()) == Some(total)
                },
            )
            .await;
            true
        },
        async {
            nodekeeper::runtime::sleep(Duration::from_secs(55)).await;
            false
        },
    )
    .await;
    if !done {
        let out = kubectl(&["get", "nodeversion", &env.id, "-o", "yaml"], None);
        panic!(
            "the NodeVersion never said every node is up to date:\n{}\nagent log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            agent.log_text()
        );
    }
    Rollout {
        env,
        cloud,
        agent: Some(agent),
        before,
    }
}

fn start_agent(env: &TestEnv, cloud: &Cloud) -> Agent {
    start_agent_with_timeout(env, cloud, 3)
}

fn start_agent_with_timeout(env: &TestEnv, cloud: &Cloud, seconds: u64) -> Agent {
    let cmd = cloud.command.display().to_string();
    let timeout = seconds.to_string();
    cluster_role(
        env,
        &["--provider-command", &cmd, "--provider-timeout", &timeout],
    )
}

fn up_to_date(v: &Value) -> bool {
    let c = &v["status"]["conditions"];
    c.as_array().map(|a| a.len()) == Some(1)
        && c[0]["type"] == "Outdated"
        && c[0]["status"] == "False"
        && c[0]["reason"] == "NodeVersionsUpToDate"
}

async fn set_image(client: &Client, name: &str, image: &str) {
    let api: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &Kind::NodeVersion.resource());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "image": image } })),
    )
    .await
    .expect("changing the image");
}

/// Wait until every node of the group is new, on `image`, and the
/// NodeVersion says so; returns the new nodes.
async fn wait_replaced(r: &Rollout, image: &str, total: usize) -> Vec<Node> {
    let client = &r.env.client;
    let log = || r.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
    let result = smol::future::or(
        async {
            wait_nv(client, &r.env.id, "the rollout to finish", LIMIT, |v| {
                let fresh = v["status"]["upToDate"].as_array().is_some_and(|a| {
                    a.len() == total && a.iter().all(|n| !r.before.iter().any(|b| n["name"] == *b))
                });
                up_to_date(v) && fresh
            })
            .await;
            Some(())
        },
        async {
            nodekeeper::runtime::sleep(LIMIT - Duration::from_secs(5)).await;
            None
        },
    )
    .await;
    assert!(
        result.is_some(),
        "rollout did not finish; agent log:\n{}",
        log()
    );
    let nodes = group_nodes(client, &r.env).await;
    assert_eq!(
        nodes.len(),
        total,
        "nodes: {:?}",
        nodes.iter().map(|n| n.name_any()).collect::<Vec<_>>()
    );
    for n in &nodes {
        assert!(
            !r.before.contains(&n.name_any()),
            "{} was not replaced",
            n.name_any()
        );
        assert_eq!(
            n.annotations().get(IMAGE_ANNOTATION).map(String::as_str),
            Some(image),
            "{}",
            n.name_any()
        );
        assert!(
            !n.annotations().contains_key(DONOR_ANNOTATION)
                && !n.annotations().contains_key(HEIR_ANNOTATION),
            "{} still paired",
            n.name_any()
        );
    }
    nodes
}

impl Drop for Rollout {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        let (client, env) = (self.env.client.clone(), &self.env);
        block_on(clean_up(&client, env));
    }
}

#[test]
fn an_image_change_replaces_every_worker_one_at_a_time_with_surge_1() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let r = rollout("rp-one", &[("workers", 4)], 1, true).await;
        let client = r.env.client.clone();
        let watch = ReplaceWatcher::start(client.clone(), &r.env, "autoscaler");
        set_image(&client, &r.env.id, "img-2").await;
        let nodes = wait_replaced(&r, "img-2", 4).await;
        // The autoscaler comes back once the rollout is done.
        let deps: Api<Deployment> = Api::namespaced(client.clone(), &r.env.ns);
        wait_for("the autoscaler back at 1 replica", LIMIT, || async {
            let d = deps.get("autoscaler").await.ok()?;
            (d.spec.replicas == Some(1)).then_some(())
        })
        .await;
        let seen = watch.finish();
        let log = r.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
        // Surge 1: never more than one extra node, never more than one
        // node cordoned, and capacity never below the four nodes.
        assert!(seen.max_nodes <= 5, "{seen:?}\n{log}");
        assert!(seen.max_cordoned <= 1, "{seen:?}");
        assert!(seen.min_available >= 4, "{seen:?}");
        // Every donor drained through a NodeMaintenance, deleted once,
        // and no maintenance left behind.
        for old in &r.before {
            assert_eq!(seen.deleted.get(old), Some(&1), "{old}: {seen:?}");
            assert!(
                seen.maintenances
                    .get(old)
                    .is_some_and(|rs| rs.contains(nodekeeper::decide::replace::REASON)),
                "{old} was not drained through a NodeMaintenance: {seen:?}"
            );
        }
        let nms = Api::<NodeMaintenance>::all(client.clone());
        wait_for(
            "no maintenance left behind",
            Duration::from_secs(10),
            || async {
                let l = nms.list(&Default::default()).await.ok()?;
                (!l.items.iter().any(|m| r.before.contains(&m.spec.node_name))).then_some(())
            },
        )
        .await;
        // Each old instance deleted at the cloud exactly once; exactly four
        // surge instances created.
        for old in &r.before {
            let pid = format!("kwok://{old}");
            let n = r
                .cloud
                .calls_of("delete-node")
                .iter()
                .filter(|c| c["providerID"] == pid)
                .count();
            assert_eq!(n, 1, "delete-node calls for {pid}");
        }
        let state = r.cloud.state();
        assert_eq!(
            state["instances"].as_object().map(|o| o.len()),
            Some(8),
            "{state}"
        );
        // Labels carried over, the reserved one not; components stamped
        // through the JoiningNodes.
        let mut teams: Vec<String> = nodes
            .iter()
            .filter_map(|n| n.labels().get("team").cloned())
            .collect();
        teams.sort();
        let mut want: Vec<String> = r.before.iter().map(|b| format!("blue-{b}")).collect();
        want.sort();
        assert_eq!(teams, want);
        for n in &nodes {
            assert!(
                !n.labels().contains_key("topology.kubernetes.io/zone"),
                "{}",
                n.name_any()
            );
            assert_eq!(
                n.annotations()
                    .get(COMPONENTS_ANNOTATION)
                    .map(String::as_str),
                Some("k8s-components-1")
            );
        }
        // The autoscaler was paused during the rollout and its command built.
        assert_eq!(seen.replicas.first(), Some(&1), "{:?}", seen.replicas);
        assert!(
            seen.replicas.contains(&0),
            "never paused: {:?}",
            seen.replicas
        );
        let d = deps.get("autoscaler").await.expect("autoscaler");
        let cmd = d
            .spec
            .template
            .spec
            .map(|s| s.containers[0].command.clone().unwrap_or_default());
        // (Every autoscaled worker group of the cluster is in it, as in
        // Constellation: ours among them.)
        let cmd = cmd.unwrap_or_default();
        assert_eq!(cmd[..2], ["./cluster-autoscaler", "--logtostderr=true"]);
        assert!(
            cmd.contains(&format!("--nodes=1:10:{}", group_id(&r.env, "workers"))),
            "{cmd:?}"
        );
        assert!(cmd[1..].is_sorted(), "{cmd:?}");
        // The scaling group follows the image at the cloud and in status.
        assert_eq!(state["images"][group_id(&r.env, "workers")], "img-2");
        let sg: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &Kind::ScalingGroup.resource());
        let g = sg
            .get(&group_id(&r.env, "workers"))
            .await
            .expect("scaling group");
        assert_eq!(g.data["status"]["imageReference"], "img-2");
        assert_eq!(
            g.data["status"]["conditions"][0]["reason"],
            "ScalingGroupNodeImageUpToDate"
        );
    });
}

#[test]
fn surge_2_replaces_the_control_plane_first_and_survives_a_node_that_never_joins() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let mut r = rollout("rp-two", &[("cp", 1), ("workers", 4)], 2, false).await;
        r.cloud.set("neverJoin", json!(1));
        // Seven nodes at once (two surge nodes beside the five) needs the
        // second surge node requested before the first one's old node is
        // drained and deleted. The second slot opens once the replaced
        // control plane's instance is known gone at the cloud (0.9 s after
        // the first worker's surge request in a run that failed); with a
        // 1 s join, the first worker's old node was drained and deleted
        // sooner there (1.9 s) and the peak was six. With a 3 s join that
        // order is no longer a race.
        r.cloud.set("joinDelay", json!(3.0));
        let client = r.env.client.clone();
        let watch = ReplaceWatcher::start(client.clone(), &r.env, "autoscaler");
        set_image(&client, &r.env.id, "img-2").await;
        let nodes = wait_replaced(&r, "img-2", 5).await;
        let seen = watch.finish();
        let log = r.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
        assert!(seen.max_nodes <= 7, "{seen:?}");
        assert!(
            seen.max_nodes == 7,
            "surge 2 never had two extra nodes: {seen:?}\n{log}"
        );
        assert!(seen.max_cordoned <= 2, "{seen:?}");
        assert!(seen.min_available >= 5, "{seen:?}");
        // The first surge instance never joined: deleted at the cloud, its
        // PendingNode went Leave and away, and the rollout went on.
        let creates = r.cloud.calls_of("create-node");
        let state = r.cloud.state();
        let never: Vec<String> = state["instances"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, i)| i["never"] == true)
            .map(|(pid, _)| pid.clone())
            .collect();
        assert_eq!(never.len(), 1, "{state}");
        assert!(
            r.cloud
                .calls_of("delete-node")
                .iter()
                .any(|c| c["providerID"] == never[0])
        );
        let pending: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &Kind::PendingNode.resource());
        let left = pending
            .list(&Default::default())
            .await
            .expect("pending")
            .items;
        assert!(
            !left
                .iter()
                .any(|p| p.data["spec"]["providerID"] == never[0]),
            "the PendingNode of the instance that never joined is still there"
        );
        // Control plane first: no worker instance was asked for before the
        // cloud answered the control plane's donor's delete (the delete
        // runs in the background of the rounds; a worker's request used
        // to race it to the cloud); and etcd was asked to let the old
        // member go.
        let cp = group_id(&r.env, "cp");
        let calls = r.cloud.calls();
        let cp_old = r
            .before
            .iter()
            .find(|b| b.contains("-cp-"))
            .expect("a cp node");
        let cp_deleted = calls
            .iter()
            .position(|(v, c)| v == "delete-node" && c["providerID"] == format!("kwok://{cp_old}"))
            .expect("the control plane's instance was deleted");
        let first_worker = calls
            .iter()
            .position(|(v, c)| {
                v == "create-node"
                    && c["groupId"] != cp
                    && !c["requestId"].as_str().unwrap_or("").starts_with("init-")
            })
            .expect("worker surge");
        assert!(
            cp_deleted < first_worker,
            "workers before the control plane: {calls:?}"
        );
        let new_cp: Vec<&Node> = nodes
            .iter()
            .filter(|n| n.labels().contains_key(CONTROL_PLANE_LABEL))
            .collect();
        assert_eq!(new_cp.len(), 1);
        // The member is named by the node's InternalIP, as Constellation's
        // etcd client finds it (kwok reports one address for every node:
        // the new control plane's is the old one's). The cluster role's
        // slimmed nodes once lost it, and the request said "".
        let ip = new_cp[0]
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address.clone())
            .expect("kwok reports an InternalIP");
        assert!(
            calls.iter().any(|(v, c)| v == "remove-etcd-member"
                && c["nodeName"] == *cp_old
                && c["internalIP"] == ip.as_str()),
            "{calls:?}"
        );
        assert!(creates.len() >= 5 + 6, "{creates:?}");
        for old in &r.before {
            assert_eq!(seen.deleted.get(old), Some(&1), "{old}: {seen:?}");
        }
    });
}

#[test]
fn the_coordinator_killed_mid_rollout_converges_without_an_extra_node_or_a_second_delete() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let mut r = rollout("rp-kill", &[("workers", 3)], 1, false).await;
        let client = r.env.client.clone();
        let watch = ReplaceWatcher::start(client.clone(), &r.env, "autoscaler");
        set_image(&client, &r.env.id, "img-2").await;
        // Kill it right after it asked the cloud for the first surge node,
        // and again while the first donor is drained.
        let cloud = &r.cloud;
        wait_for("the first surge request", LIMIT, || async {
            cloud
                .calls_of("create-node")
                .iter()
                .any(|c| !c["requestId"].as_str().unwrap_or("").starts_with("init-"))
                .then_some(())
        })
        .await;
        r.agent.as_mut().expect("agent").kill();
        r.agent = Some(start_agent(&r.env, &r.cloud));
        let nms: Api<NodeMaintenance> = Api::all(client.clone());
        let before = r.before.clone();
        wait_for("a donor's NodeMaintenance", LIMIT, || async {
            let l = nms.list(&Default::default()).await.ok()?;
            l.items
                .iter()
                .any(|m| before.contains(&m.spec.node_name))
                .then_some(())
        })
        .await;
        r.agent.as_mut().expect("agent").kill();
        r.agent = Some(start_agent(&r.env, &r.cloud));
        wait_replaced(&r, "img-2", 3).await;
        let seen = watch.finish();
        assert!(seen.max_nodes <= 4, "{seen:?}");
        assert!(seen.max_cordoned <= 1, "{seen:?}");
        // Exactly three surge instances: a repeated ask reused its id.
        let state = r.cloud.state();
        assert_eq!(
            state["instances"].as_object().map(|o| o.len()),
            Some(6),
            "{state}"
        );
        for old in &r.before {
            assert_eq!(seen.deleted.get(old), Some(&1), "{old}: {seen:?}");
            let pid = format!("kwok://{old}");
            let n = r
                .cloud
                .calls_of("delete-node")
                .iter()
                .filter(|c| c["providerID"] == pid)
                .count();
            assert_eq!(n, 1, "delete-node calls for {pid}");
        }
    });
}

/// A cloud's instance delete may take minutes; it runs beside the rounds.
/// Two donors leave apart (the second's drain held by a PodDisruptionBudget
/// until the first's delete is asked, and that delete hangs): the second's
/// delete is asked while the first's still runs, not after it was cut off
/// at the provider timeout. Then the cloud answers both: the rollout
/// finishes with each old node and each old instance deleted once (a
/// running delete is never asked again).
#[test]
fn a_hanging_instance_delete_holds_up_no_other_donor() {
    const TIMEOUT: u64 = 20;
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let mut r = rollout("rp-slowdel", &[("workers", 2)], 2, false).await;
        let client = r.env.client.clone();
        r.agent.as_mut().expect("agent").kill();
        r.agent = Some(start_agent_with_timeout(&r.env, &r.cloud, TIMEOUT));
        let (first, second) = (r.before[0].clone(), r.before[1].clone());
        r.env.blocking_pod_on("held", &second).await;
        let watch = ReplaceWatcher::start(client.clone(), &r.env, "autoscaler");
        r.cloud.set("hang", json!(["delete-node"]));
        set_image(&client, &r.env.id, "img-2").await;
        let cloud = &r.cloud;
        let asked = |node: &str| {
            let pid = format!("kwok://{node}");
            cloud
                .calls_of("delete-node")
                .iter()
                .any(|c| c["providerID"] == pid)
        };
        wait_for("the first donor's instance delete asked", LIMIT, || async {
            asked(&first).then_some(())
        })
        .await;
        assert!(!asked(&second), "the second donor's drain is held");
        let out = kubectl(&["delete", "pdb", "held", "-n", &r.env.ns], None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Well inside the first call's timeout: a round blocked on it
        // would ask only after the timeout.
        wait_for(
            "the second donor's delete asked while the first hangs",
            Duration::from_secs(TIMEOUT / 2 + 2),
            || async { asked(&second).then_some(()) },
        )
        .await;
        r.cloud.set("hang", json!([]));
        wait_replaced(&r, "img-2", 2).await;
        let seen = watch.finish();
        let state = r.cloud.state();
        for old in &r.before {
            assert_eq!(seen.deleted.get(old), Some(&1), "{old}: {seen:?}");
            let pid = format!("kwok://{old}");
            assert_eq!(
                state["instances"][&pid]["state"], "Terminated",
                "{pid}: {state}"
            );
            let asked = r
                .cloud
                .calls_of("delete-node")
                .iter()
                .filter(|c| c["providerID"] == pid)
                .count();
            assert_eq!(asked, 1, "delete-node calls for {pid}");
        }
    });
}

#[test]
fn provider_errors_surface_in_status_and_never_hold_up_maintenance() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let mut r = rollout("rp-err", &[("workers", 1)], 1, false).await;
        let client = r.env.client.clone();
        r.cloud.set(
            "fail",
            json!({ "create-node": "simulated: quota exceeded" }),
        );
        set_image(&client, &r.env.id, "img-2").await;
        wait_nv(
            &client,
            &r.env.id,
            "the provider's error in status",
            LIMIT,
            |v| {
                v["status"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("simulated: quota exceeded"))
                    && v["status"]["conditions"][0]["status"] == "True"
            },
        )
        .await;
        // A hanging provider is cut off at its timeout and said so.
        r.cloud.set("fail", json!({}));
        r.cloud.set("hang", json!(["create-node"]));
        wait_nv(
            &client,
            &r.env.id,
            "the provider's timeout in status",
            LIMIT,
            |v| {
                v["status"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("no answer within 3 s"))
            },
        )
        .await;
        // Meanwhile maintenance goes on: a NodeMaintenance cordons at once.
        let node = r.before[0].clone();
        let nm = format!("{}-nm", r.env.id);
        apply(&json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": { "name": nm },
            "spec": { "nodeName": node, "reason": "test" },
        }));
        let nodes: Api<Node> = Api::all(client.clone());
        wait_for(
            "the node cordoned while the provider hangs",
            Duration::from_secs(30),
            || async {
                let n = nodes.get(&node).await.ok()?;
                (n.spec?.unschedulable == Some(true)).then_some(())
            },
        )
        .await;
        let _ = kubectl(&["delete", "nodemaintenance", &nm, "--wait=true"], None);
        // Healed, the rollout finishes.
        r.cloud.set("hang", json!([]));
        wait_replaced(&r, "img-2", 1).await;
        let v = wait_nv(&client, &r.env.id, "the message cleared", LIMIT, |v| {
            v["status"]["message"].is_null()
        })
        .await;
        assert!(up_to_date(&v));
    });
}

/// Regressions: (1) each NodeVersion set every AutoscalingStrategy to its
/// own "done", so one outdated and one up to date flipped it for as long as
/// both existed; (2) an AutoscalingStrategy with an empty deploymentName
/// failed every replacement pass, so no rollout moved. Now the autoscaler
/// is off until every NodeVersion is done (it changes at most twice over
/// the rollout) and the rollout finishes beside a strategy that cannot be
/// acted on. The CRD now refuses an empty or malformed deploymentName (see
/// `schema_refusals.rs`), so the stand-in is a strategy whose Deployment's
/// namespace does not exist; the code still refuses a malformed name
/// stored before the schema did, per object.
#[test]
fn two_node_versions_agree_on_the_autoscaler_and_a_bad_strategy_stalls_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let r = rollout("rp-two", &[("workers", 2)], 1, false).await;
        let client = r.env.client.clone();
        let (other, bad) = (format!("{}-other", r.env.id), format!("{}-bad", r.env.id));
        // Up to date: it governs no node.
        apply(&json!({
            "apiVersion": "update.edgeless.systems/v1alpha1",
            "kind": "NodeVersion",
            "metadata": { "name": other, "labels": { GROUP_LABEL: r.env.id } },
            "spec": {
                "image": "img-1",
                // Inside the cluster role's pool (it handles only those),
                // but selecting no node.
                "nodeSelector": { "matchLabels": { GROUP_LABEL: r.env.id, "nodekeeper.test/nowhere": "true" } },
            }
        }));
        apply(&json!({
            "apiVersion": "update.edgeless.systems/v1alpha1",
            "kind": "AutoscalingStrategy",
            "metadata": { "name": bad, "labels": { GROUP_LABEL: r.env.id } },
            "spec": { "enabled": true, "deploymentName": "autoscaler", "deploymentNamespace": "no-such-namespace" }
        }));
        let strategies: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &Kind::AutoscalingStrategy.resource());
        // The other NodeVersion's first status, before the rollout starts:
        // nothing outdated, and it says it selects no node.
        wait_nv(
            &client,
            &other,
            "the other NodeVersion's status",
            LIMIT,
            |v| up_to_date(v) && v["status"]["message"] == "the nodeSelector selects no node",
        )
        .await;
        // The strategy whose Deployment does not exist says so.
        wait_for(
            "the bad strategy reporting its Deployment",
            LIMIT,
            || async {
                let s = strategies.get(&bad).await.ok()?;
                let c = s.data["status"]["conditions"].as_array()?.first()?.clone();
                (c["type"] == "DeploymentFound"
                    && c["status"] == "False"
                    && c["reason"] == "NotFound")
                    .then_some(())
            },
        )
        .await;
        // Every change of the strategy's spec.enabled, polled 20 times a
        // second from here to the end of the rollout.
        let flips = std::sync::Arc::new(std::sync::Mutex::new(Vec::<bool>::new()));
        let stop = nodekeeper::runtime::Latch::default();
        let poll = {
            let (strategies, name, flips, stop) = (
                strategies.clone(),
                r.env.id.clone(),
                flips.clone(),
                stop.clone(),
            );
            nodekeeper::runtime::spawn(async move {
                while !stop.is_open() {
                    if let Ok(s) = strategies.get(&name).await
                        && let Some(e) = s.data["spec"]["enabled"].as_bool()
                    {
                        let mut f = flips.lock().unwrap();
                        if f.last() != Some(&e) {
                            f.push(e);
                        }
                    }
                    nodekeeper::runtime::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        // The poller must have seen the starting state before the rollout
        // starts: once it began late and recorded [false, true]. That state
        // is on: a NodeVersion that is done beside one that just wrote its
        // first status has no reason to turn the autoscaler off (counting
        // the new one busy before its status once did, and this wait
        // timed out on the [false, true] it saw).
        wait_for("the poller's first look", LIMIT, || async {
            (!flips.lock().unwrap().is_empty()).then_some(())
        })
        .await;
        let first = flips.lock().unwrap().first().copied();
        assert_eq!(
            first,
            Some(true),
            "the autoscaler was off before the rollout began\n{}",
            r.agent.as_ref().map(|a| a.log_text()).unwrap_or_default()
        );
        set_image(&client, &r.env.id, "img-2").await;
        wait_replaced(&r, "img-2", 2).await;
        wait_for("the autoscaler enabled again", LIMIT, || async {
            let s = strategies.get(&r.env.id).await.ok()?;
            (s.data["spec"]["enabled"] == true).then_some(())
        })
        .await;
        // The poller records on its own clock: stop it only once it has
        // seen the state just observed, or the last change goes unrecorded.
        wait_for("the poller to see it enabled", LIMIT, || async {
            (flips.lock().unwrap().last() == Some(&true)).then_some(())
        })
        .await;
        stop.open();
        poll.await;
        let seen = flips.lock().unwrap().clone();
        let log = r.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
        assert_eq!(
            seen,
            [true, false, true],
            "the autoscaler changed more than the rollout asks\n{log}"
        );
        let _ = kubectl(&["delete", "nodeversion", &other, "--wait=false"], None);
        let _ = kubectl(
            &["delete", "autoscalingstrategy", &bad, "--wait=false"],
            None,
        );
    });
}

/// A donor whose drain is overdue (a PodDisruptionBudget allows no
/// eviction) is kept and reported, and the cluster role stays idle beside
/// it: it looks again when something changes or a minute later, not in a
/// loop (passes ran back to back once the deadline had passed). Once the
/// budget goes, the rollout finishes.
#[test]
fn an_overdue_donor_drain_is_reported_and_leaves_the_cluster_role_idle() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let r = rollout("rp-overdue", &[("workers", 1)], 1, false).await;
        let client = r.env.client.clone();
        let donor = r.before[0].clone();
        r.env.blocking_pod_on("held", &donor).await;
        Api::<kube::api::DynamicObject>::all_with(client.clone(), &Kind::NodeVersion.resource())
            .patch(
                &r.env.id,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "drainTimeoutSeconds": 10 } })),
            )
            .await
            .expect("a short drain timeout");
        set_image(&client, &r.env.id, "img-2").await;
        wait_nv(
            &client,
            &r.env.id,
            "the donor's drain overdue",
            LIMIT,
            |v| {
                v["status"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("is overdue"))
            },
        )
        .await;
        let agent = r.agent.as_ref().expect("agent");
        let used = support::cores_used(
            agent.child.id(),
            Duration::from_secs(10),
            "by the cluster role beside an overdue donor drain",
        )
        .await;
        assert!(
            used < 0.05,
            "the cluster role used {used:.3} cores beside an overdue drain\n{}",
            agent.log_text()
        );
        let out = kubectl(&["delete", "pdb", "held", "-n", &r.env.ns], None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_replaced(&r, "img-2", 1).await;
        assert!(
            Api::<Node>::all(client.clone())
                .get_opt(&donor)
                .await
                .ok()
                .flatten()
                .is_none(),
            "the donor is gone"
        );
    });
}

/// A provider read that failed is asked again on its own once its error
/// may no longer be reused (10 s), not only when something else in the
/// world changes. On stop 63's gate a `get-scaling-group-image` that timed
/// out on a loaded machine left a rollout waiting for the next 15-minute
/// listing of scaling groups: the round skipped the group it could not
/// read and nothing woke it again. Here the cloud's API fails that read
/// while the image changes, then recovers without anything else moving.
#[test]
fn a_failed_provider_read_is_asked_again_without_a_change_of_the_world() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let mut r = rollout("rp-reask", &[("workers", 1)], 1, false).await;
        let client = r.env.client.clone();
        const DOWN: &str = "the cloud's API is down for a moment";
        r.cloud
            .set("fail", json!({ "get-scaling-group-image": DOWN }));
        set_image(&client, &r.env.id, "img-2").await;
        let log = || r.agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
        wait_for("the failed read", LIMIT, || async {
            log().contains(DOWN).then_some(())
        })
        .await;
        r.cloud.set("fail", json!({}));
        wait_replaced(&r, "img-2", 1).await;
    });
}

/// where-features-meet.md C1: `constellation upgrade apply` writes the
/// NodeVersion with a typed client that knows only Constellation's fields
/// (a GET, a new image, a PUT), so the spec loses nodekeeper's
/// `nodeSelector`, surge and timeouts. The pool's cluster role (scoped by
/// `--node-selector`) then no longer handled it at all: the new image was
/// never rolled out, and an unscoped role would have governed every node.
/// Now the fields read before are kept in an annotation (which that client
/// keeps), still govern, and the status says what was lost.
#[test]
fn a_node_version_written_back_by_constellations_client_keeps_its_pool_and_says_so() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let r = rollout("rp-cli", &[("workers", 2)], 1, false).await;
        let client = r.env.client.clone();
        let api: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &Kind::NodeVersion.resource());
        wait_nv(
            &client,
            &r.env.id,
            "the rollout fields recorded",
            LIMIT,
            |v| v["metadata"]["annotations"][ROLLOUT_FIELDS_ANNOTATION].is_string(),
        )
        .await;
        // The CLI's write: Constellation's spec fields only, a new image.
        let mut written = api.get(&r.env.id).await.expect("reading the NodeVersion");
        let known = [
            "image",
            "imageVersion",
            "kubernetesComponentsReference",
            "kubernetesClusterVersion",
            "maxNodeBudget",
        ];
        let mut spec: serde_json::Map<String, Value> = known
            .iter()
            .filter_map(|k| Some((k.to_string(), written.data["spec"].get(*k)?.clone())))
            .collect();
        spec.insert("image".into(), json!("img-2"));
        written.data["spec"] = Value::Object(spec);
        api.replace(&r.env.id, &PostParams::default(), &written)
            .await
            .expect("writing the NodeVersion as Constellation's CLI does");
        let stored = api.get(&r.env.id).await.expect("reading the NodeVersion");
        assert!(
            stored.data["spec"]["nodeSelector"].is_null()
                && stored.data["spec"]["joinTimeoutSeconds"] == 1800,
            "the write did not lose the fields: {}",
            stored.data["spec"]
        );
        wait_replaced(&r, "img-2", 2).await;
        let v = api
            .get(&r.env.id)
            .await
            .expect("reading the NodeVersion")
            .data;
        let message = v["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(
                "spec lost nodekeeper's nodeSelector, joinTimeoutSeconds, leaveTimeoutSeconds"
            ) && message.contains(ROLLOUT_FIELDS_ANNOTATION),
            "{message}"
        );
        // The pool's two nodes, each once: one surge node per old node.
        let mut asked: Vec<String> = r
            .cloud
            .calls_of("create-node")
            .iter()
            .filter_map(|c| c["requestId"].as_str().map(str::to_string))
            .filter(|id| !id.starts_with("init-"))
            .collect();
        asked.dedup();
        assert_eq!(asked.len(), 2, "surge requests: {asked:?}");
    });
}

/// A NodeVersion's `windows` on the real control plane: a new image while
/// every window is closed starts nothing (the status's budget is 0 and its
/// message names the next opening; no surge node asked of the cloud);
/// once the window is edited to one open now, the rollout runs.
#[test]
fn outside_every_window_no_replacement_starts_until_one_opens() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let r = rollout("rp-window", &[("workers", 1)], 1, false).await;
        let client = r.env.client.clone();
        let api: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &Kind::NodeVersion.resource());
        // Tomorrow only (UTC), for an hour: closed now, whatever the time.
        let tomorrow = k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(24))
            .expect("tomorrow")
            .strftime("%a")
            .to_string()
            .to_lowercase();
        let closed = json!({"spec": {"image": "img-2",
            "windows": [{"days": [tomorrow], "start": "00:00", "end": "01:00"}]}});
        api.patch(&r.env.id, &PatchParams::default(), &Patch::Merge(&closed))
            .await
            .expect("a new image and a closed window");
        let v = wait_nv(
            &client,
            &r.env.id,
            "the closed window in the status",
            LIMIT,
            |v| {
                v["status"]["message"].as_str().is_some_and(|m| {
                    m.contains("outside every replacement window; the next opens at")
                })
            },
        )
        .await;
        assert_eq!(v["status"]["budget"], 0, "{}", v["status"]);
        let asked = surged(&r.cloud);
        assert!(
            asked.is_empty(),
            "a surge node outside the window: {asked:?}"
        );
        // Every day, the whole day: open now.
        let open = json!({"spec": {"windows": [{"start": "00:00", "end": "00:00"}]}});
        api.patch(&r.env.id, &PatchParams::default(), &Patch::Merge(&open))
            .await
            .expect("opening the window");
        wait_replaced(&r, "img-2", 1).await;
    });
}

/// Surge requests the cluster role asked the cloud for (not the test
/// cluster's first nodes).
fn surged(cloud: &Cloud) -> Vec<Value> {
    cloud
        .calls_of("create-node")
        .into_iter()
        .filter(|c| {
            !c["requestId"]
                .as_str()
                .unwrap_or_default()
                .starts_with("init-")
        })
        .collect()
}

/// Karpenter's `karpenter.sh/do-not-disrupt` on a pod of one of two
/// workers, surge 2: only the other worker gets a surge node and is
/// replaced (the cloud's own call log says how many were asked for, not
/// the status), the Outdated condition names the pod; once the pod is
/// deleted the held worker is replaced too.
#[test]
fn a_worker_whose_pod_opts_out_gets_no_surge_node_until_the_pod_goes() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let r = rollout("rp-dnd", &[("workers", 2)], 2, false).await;
        let client = r.env.client.clone();
        let (held, free) = (r.before[0].clone(), r.before[1].clone());
        r.env
            .bound_pod("keep", &held, |p| {
                let a = p.metadata.annotations.get_or_insert_default();
                a.insert("karpenter.sh/do-not-disrupt".into(), "true".into());
            })
            .await;
        set_image(&client, &r.env.id, "img-2").await;
        let nodes: Api<Node> = Api::all(client.clone());
        wait_for("the free worker replaced", LIMIT, || async {
            let gone = nodes.get_opt(&free).await.ok()?.is_none();
            let heirs = group_nodes(&client, &r.env).await;
            let up = heirs.iter().any(|n| {
                !r.before.contains(&n.name_any())
                    && n.annotations().get(IMAGE_ANNOTATION).map(String::as_str) == Some("img-2")
            });
            (gone && up).then_some(())
        })
        .await;
        let asked = surged(&r.cloud);
        assert_eq!(
            asked.len(),
            1,
            "a surge node for the held worker: {asked:?}"
        );
        // What a person reads: the Outdated condition names the pod.
        let says = format!(
            "not replaced while node {held}: pod {}/keep has karpenter.sh/do-not-disrupt=true",
            r.env.ns
        );
        wait_nv(&client, &r.env.id, "the hold in the status", LIMIT, |v| {
            v["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == "Outdated"
                        && c["message"].as_str().is_some_and(|m| m.contains(&says))
                })
        })
        .await;
        assert!(
            nodes.get_opt(&held).await.ok().flatten().is_some(),
            "the held worker was taken"
        );
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &r.env.ns);
        pods.delete("keep", &Default::default())
            .await
            .expect("deleting the pod");
        wait_replaced(&r, "img-2", 2).await;
        assert_eq!(surged(&r.cloud).len(), 2, "{:?}", surged(&r.cloud));
    });
}
