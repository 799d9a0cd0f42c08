//! The single-node edge on an OS-image machine (issue "The drain the field
//! asks for", part 4): one machine holds everything nodekeeper needs — its
//! agent as the shipped systemd unit, the cluster role as the shipped
//! Deployment's pod pinned to it — and a workload that no other node can
//! run, guarded by a PodDisruptionBudget that never allows its eviction.
//! A RebootPolicy reboots it once through systemd; the agent gives the node
//! back after the new boot while the cluster role's pod waits Pending on
//! the cordoned node; the cluster role, scheduled again, records the reboot.
//!
//! What is the test cluster's and not the product's: the cluster role's pod
//! reaches the API server at its address (the machines run no kube-proxy)
//! and is placed on the machine by its name and the machines' taint; the
//! cluster has other nodes, which the pinned pods cannot use, so for both
//! the machine is a one-node cluster.

use super::*;

use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{WatchStreamExt, watcher};
use smol::stream::StreamExt;

/// The shipped Deployment of the cluster role (`manifests --for deployment
/// --node-agents`), one replica, pinned to `m`; deleted when dropped.
struct ClusterPod {
    name: String,
}

impl ClusterPod {
    fn start(env: &TestEnv, m: &OsMachine) -> ClusterPod {
        // The leader Role in the test's namespace, as for every cluster role.
        support::cluster_identity_kubeconfig_in(&env.ns);
        let options = nodekeeper::deploy::Options {
            node_agents: true,
            ..Default::default()
        };
        let mut d = nodekeeper::deploy::deployment(&options)
            .into_iter()
            .find(|o| o["kind"] == "Deployment")
            .expect("the cluster role's Deployment");
        let name = format!("nk-cluster-{}", env.id);
        d["metadata"]["name"] = json!(name);
        d["metadata"]["namespace"] = json!(support::NODEKEEPER_NAMESPACE);
        d["spec"]["replicas"] = json!(1);
        let group = format!("{GROUP_LABEL}={}", env.id);
        let labels =
            json!({"app.kubernetes.io/name": "nodekeeper", "nodekeeper.test/cluster": env.id});
        d["spec"]["selector"] = json!({"matchLabels": labels});
        let pod = &mut d["spec"]["template"];
        pod["metadata"]["labels"] = labels;
        pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": m.name});
        pod["spec"]["tolerations"] =
            json!([{"key": LABEL_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
        let c = &mut pod["spec"]["containers"][0];
        for arg in ["--node-selector", &group, "--leader-namespace", &env.ns] {
            c["args"].as_array_mut().expect("args").push(json!(arg));
        }
        let (host, port) = apiserver_address();
        let env_vars = c["env"].as_array_mut().expect("env");
        env_vars.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": host}));
        env_vars.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": port}));
        import_image(m);
        support::apply(&d);
        ClusterPod { name }
    }

    /// Its pods on the API server: name, node, phase.
    async fn pods(&self, env: &TestEnv) -> Vec<(String, String, String)> {
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), support::NODEKEEPER_NAMESPACE);
        let selector = format!(
            "nodekeeper.test/cluster={}",
            &self.name["nk-cluster-".len()..]
        );
        let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
            return Vec::new();
        };
        list.items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                (
                    p.name_any(),
                    node.unwrap_or_default(),
                    phase.unwrap_or_default(),
                )
            })
            .collect()
    }

    fn logs(&self) -> String {
        let out = support::kubectl(
            &[
                "-n",
                support::NODEKEEPER_NAMESPACE,
                "logs",
                &format!("deployment/{}", self.name),
                "--tail",
                "80",
            ],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for ClusterPod {
    fn drop(&mut self) {
        let _ = support::kubectl(
            &[
                "-n",
                support::NODEKEEPER_NAMESPACE,
                "delete",
                "deployment",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// The API server as a pod on a machine reaches it: its advertised
/// address (in its certificate) and port.
fn apiserver_address() -> (String, String) {
    let host = std::fs::read_to_string(support::cluster().with_file_name("advertise-address"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    assert!(
        !host.is_empty() && !host.starts_with("127."),
        "the API server advertises no address a pod could reach ({host:?}): this host has no route"
    );
    let kubeconfig = std::fs::read_to_string(support::cluster()).expect("the admin kubeconfig");
    let port = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
        .expect("the API server's port in the admin kubeconfig")
        .to_string();
    (host, port)
}

/// A Deployment of one pod only `m` can run, and a PodDisruptionBudget
/// that never lets it be evicted; its running pod's name and UID.
fn pinned_workload(env: &TestEnv, m: &OsMachine) -> (String, String) {
    let labels = json!({"app": "pinned"});
    support::apply(&json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "pinned", "namespace": env.ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": m.name},
                "tolerations": [{"key": LABEL_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "pause", "image": "localhost/pause:nodekeeper", "imagePullPolicy": "Never"}]}}}
    }));
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "pinned", "namespace": env.ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}
    }))
    .expect("a PodDisruptionBudget");
    block_on(async {
        Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.ns)
            .create(&PostParams::default(), &pdb)
            .await
            .expect("creating the PodDisruptionBudget");
    });
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    block_on(wait_for(
        "the pinned pod runs on the machine",
        Duration::from_secs(90),
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=pinned"))
                .await
                .ok()?;
            list.items.into_iter().find_map(|p| {
                let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
                running.then(|| (p.name_any(), p.uid().unwrap_or_default()))
            })
        },
    ))
}

/// The first `LeftForShutdown=True` message of NodeMaintenance `name`, as
/// a watch of it sees it (a thread that ends once it has one).
fn left_to_shutdown(env: &TestEnv, name: &str) -> Arc<Mutex<Option<String>>> {
    let seen = Arc::new(Mutex::new(None));
    let (into, client) = (seen.clone(), env.client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    std::thread::spawn(move || {
        block_on(async move {
            let stream = watcher(Api::<NodeMaintenance>::all(client), config).applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(nm)) = stream.next().await {
                let conditions = nm.status.and_then(|s| s.conditions).unwrap_or_default();
                if let Some(c) = conditions
                    .into_iter()
                    .find(|c| c.type_ == "LeftForShutdown" && c.status == "True")
                {
                    if let Ok(mut slot) = into.lock() {
                        *slot = Some(c.message);
                    }
                    return;
                }
            }
        })
    });
    seen
}

#[test]
fn one_machine_with_its_cluster_role_on_it_is_rebooted_once_and_given_back_by_its_agent() {
    let _one = exclusive();
    let env = block_on(TestEnv::new("osalone"));
    let m = &machines()[0];
    let _group = InGroup::new(&env, vec![m]);
    assert_eq!(m.unit("ActiveState"), "active", "{}", m.journal());
    let cluster = ClusterPod::start(&env, m);
    let first = block_on(wait_for(
        "the cluster role's pod runs on the machine",
        Duration::from_secs(90),
        || async {
            cluster
                .pods(&env)
                .await
                .into_iter()
                .find(|(_, node, phase)| *node == m.name && phase == "Running")
                .map(|(name, ..)| name)
        },
    ));
    let (pinned, uid) = pinned_workload(&env, m);

    let log = NodeLog::start_labelled(env.client.clone(), &selector());
    let left = left_to_shutdown(&env, &format!("reboot-{}", m.name));
    let before = boots(&env, &[m]);
    let from = now_ms();
    m.run(&["touch", "/var/run/reboot-required"]);
    let policy = create(
        &env,
        "RebootPolicy",
        json!({"detect": {"periodSeconds": 5}}),
    );
    let context = || {
        format!(
            "cluster role ({:?}):\n{}\n{} journal:\n{}",
            block_on(cluster.pods(&env)),
            cluster.logs(),
            m.name,
            m.journal()
        )
    };
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_back(&env, &[m], &before, "the machine rebooted and given back")
    }));
    if waited.is_err() {
        panic!(
            "the reboot did not finish (left to the shutdown: {:?})\n{}",
            left.lock().ok().and_then(|l| l.clone()),
            context()
        );
    }
    // The drain did not wait on the pinned pod: the maintenance named it
    // as left to the machine's shutdown (seen by the watch, as the
    // maintenance may live only a second after saying so).
    let left = block_on(wait_for(
        "the maintenance named the pod left to the shutdown",
        Duration::from_secs(10),
        || async { left.lock().ok().and_then(|l| l.clone()) },
    ));
    assert!(left.contains(&pinned), "{left}");
    let seen = log.finish();
    one_real_reboot(m, from, &seen, &context()).print();

    // The pinned pod was never evicted: the same object, never deleted,
    // running again after the boot.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let after = block_on(pods.get(&pinned)).expect("the pinned pod after the reboot");
    assert_eq!(after.uid().as_deref(), Some(uid.as_str()));
    assert!(after.metadata.deletion_timestamp.is_none());
    // The cluster role's pod was evicted with the rest and could run again
    // only once the node was given back: its agent gave it back.
    block_on(wait_for(
        "the policy records the reboot (the cluster role, scheduled again)",
        WAVE,
        || async {
            let p = Api::<RebootPolicy>::all(env.client.clone())
                .get(&policy)
                .await
                .ok()?;
            (p.status?.done == 1).then_some(())
        },
    ));
    let now = block_on(cluster.pods(&env));
    assert!(
        !now.iter().any(|(name, ..)| *name == first),
        "the cluster role's first pod was evicted: {now:?}\n{}",
        context()
    );
    assert!(
        now.iter()
            .any(|(_, node, phase)| *node == m.name && phase == "Running"),
        "{now:?}"
    );
    support::machines::assert_refused_nothing("the agent", &m.journal());
}
