//! Deployment artifacts on the real control plane: the checked-in copies are
//! exactly what `nodekeeper manifests` generates; the API server accepts
//! every generated object; the DaemonSet lands one agent on every node,
//! cordoned and tainted ones included; the node agent's RBAC is enough for a
//! maintenance and for nothing else; and the admission policy confines a
//! node-bound or pod-bound agent token to its own Node.

use crate::support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, Phase};
use nodekeeper::deploy::{AGENT_ACCOUNT, CLUSTER_ACCOUNT, Options, TARGETS, render};
use serde_json::json;
use support::{
    Agent, TestEnv, block_on, client_from, client_with_token, host_kubeconfig,
    install_agent_identity, install_crds, kubectl, run_cli, wait_for,
};

const NAMESPACE: &str = "nodekeeper";
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn checked_in_manifests_match_what_the_binary_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (target, _, dir) in TARGETS {
        let Some(dir) = dir else { continue };
        let files = render(target, &Options::default()).expect("render");
        for f in &files {
            let path = root.join(dir).join(&f.path);
            let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                checked_in == f.content,
                "{} is stale; regenerate with: nodekeeper manifests --for {target} --out {dir}",
                path.display()
            );
        }
    }
    // Nothing in the k3s folder that the generator does not write: k3s
    // applies every file there.
    let generated: Vec<String> = render("k3s", &Options::default())
        .expect("render")
        .into_iter()
        .map(|f| f.path)
        .collect();
    let mut folders = vec![root.join("k3s-manifests")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("k3s-manifests/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            let name = path
                .strip_prefix(root.join("k3s-manifests"))
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            assert!(
                generated.contains(&name),
                "k3s-manifests/{name} is not generated; remove it"
            );
        }
    }
}

/// The uninstall the README gives, `kubectl delete -f k3s-manifests/`,
/// deletes every object of nodekeeper's but not the namespace of the
/// medik8s leases, which medik8s's remediation operators share; the
/// install, `kubectl apply -R -f k3s-manifests/`, creates it. (kubectl's
/// own reading of the folder, as client-side dry runs.)
#[test]
fn uninstalling_the_k3s_folder_leaves_the_shared_lease_namespace() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("k3s-manifests")
        .display()
        .to_string();
    let names = |args: &[&str]| -> String {
        let out = kubectl(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // `create` reads the folder as `apply` does, without comparing with
    // what the cluster holds.
    let install = names(&["create", "-R", "-f", &dir, "--dry-run=client", "-o", "name"]);
    assert!(install.contains("namespace/medik8s-leases"), "{install}");
    assert!(install.contains("daemonset.apps/nodekeeper"), "{install}");
    let uninstall = names(&["delete", "-f", &dir, "--dry-run=client", "-o", "name"]);
    assert!(
        uninstall.contains("daemonset.apps/nodekeeper"),
        "{uninstall}"
    );
    assert!(uninstall.contains("namespace/nodekeeper"), "{uninstall}");
    assert!(
        !uninstall.contains("medik8s-leases"),
        "what `kubectl delete -f k3s-manifests/` reads: {uninstall}"
    );
}

#[test]
fn manifests_cli_prints_writes_and_refuses_in_one_line() {
    let (status, _, err) = run_cli(&["manifests", "--for", "kustomize"], &[]);
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("unknown target \"kustomize\"") && err.contains("helm"),
        "{err}"
    );

    for folder in ["talos", "helm"] {
        let (status, _, err) = run_cli(&["manifests", "--for", folder], &[]);
        assert!(!status.success());
        assert!(err.contains("--out DIR"), "{err}");
    }

    let (status, _, err) = run_cli(
        &["manifests", "--for", "rbac", "--namespace", "Bad_NS"],
        &[],
    );
    assert!(!status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--namespace"), "{err}");

    let dir = support::scratch().join(format!("nk-manifests-{:x}", support::rand_u64()));
    let out = dir.to_string_lossy().to_string();
    let (status, _, err) = run_cli(&["manifests", "--for", "talos", "--out", &out], &[]);
    assert!(status.success(), "{err}");
    assert!(
        dir.join("rootfs/usr/local/etc/containers/nodekeeper.yaml")
            .is_file()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every Kubernetes object we generate, with default and with custom
/// options, passes the API server's own validation (`--dry-run=server`).
#[test]
fn the_api_server_accepts_every_generated_manifest() {
    install_crds();
    install_agent_identity();
    block_on(async {
        let mut env = TestEnv::new("dryrun").await;
        let custom_ns = env.add_namespace("nk").await;
        let custom = [
            "--namespace",
            custom_ns.as_str(),
            "--image",
            "registry.example/nodekeeper:1",
            "--log-level",
            "debug",
            "--metrics-address",
            ":9100",
            "--kubeconfig",
            "/var/lib/nodekeeper/kubeconfig",
        ];
        for target in [
            "crds",
            "rbac",
            "admission",
            "daemonset",
            "deployment",
            "k3s",
            "static-pod",
        ] {
            let reboot: &[&str] = if ["daemonset", "k3s", "static-pod"].contains(&target) {
                &["--reboot"]
            } else if target == "deployment" {
                &["--node-agents"]
            } else {
                &[]
            };
            for extra in [&[][..], &custom[..], reboot] {
                let mut args = vec!["manifests", "--for", target];
                args.extend_from_slice(extra);
                let (status, yaml, err) = run_cli(&args, &[]);
                assert!(status.success(), "{args:?}: {err}");
                let out = kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&yaml));
                assert!(
                    out.status.success(),
                    "{args:?} rejected by the API server: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(stdout.contains("(server dry run)"), "{stdout}");
            }
        }
        drop(env);
    })
}

/// The generated DaemonSet (scoped to this test's nodes) gets one agent pod
/// per node from the real DaemonSet controller, including on a node that is
/// cordoned and carries control-plane and drain taints.
#[test]
fn the_daemonset_runs_one_agent_on_every_node_even_cordoned_and_tainted() {
    block_on(async {
        let mut env = TestEnv::new("ds").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let nodes: Api<Node> = Api::all(env.client.clone());
        nodes
            .patch(
                &b,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true, "taints": [
                    {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    {"key": "medik8s.io/drain", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
                ]}})),
            )
            .await
            .expect("cordon and taint b");

        let opts = Options {
            namespace: env.ns.clone(),
            ..Default::default()
        };
        let mut ds = nodekeeper::deploy::daemonset(&opts);
        // Only this test's nodes: other tests share the cluster.
        ds["spec"]["template"]["spec"]["affinity"] = json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
                "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                      "values": [a.clone(), b.clone()]}]}]}}});
        // The pods' service account, as the rbac target makes it in the
        // agents' namespace: the API server refuses a pod whose account is
        // missing.
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                             "metadata": {"name": AGENT_ACCOUNT, "namespace": env.ns}});
        let out = kubectl(
            &["apply", "-f", "-"],
            Some(&nodekeeper::yaml::documents(&[account, ds])),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let on_nodes = wait_for(
            "an agent pod Running on each node",
            Duration::from_secs(60),
            || async {
                let list = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/name=nodekeeper"))
                    .await
                    .ok()?;
                let running: Vec<String> = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                    .collect();
                (running.len() >= 2).then_some((running, list.items))
            },
        )
        .await;
        let (mut running, all) = on_nodes;
        running.sort();
        assert_eq!(running, vec![a.clone(), b.clone()], "one per node");
        assert_eq!(all.len(), 2, "no extra agent pods");
        let spec = all[0].spec.as_ref().expect("spec");
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert_eq!(spec.service_account_name.as_deref(), Some(AGENT_ACCOUNT));
    })
}

/// Pod Security Admission levels, as the shipped namespace enforces them:
/// the node agent of the default (maintenance-only) profile and the cluster
/// role's Deployment run in a namespace that enforces `restricted`; the
/// reboot profile (host PID, three capabilities, AppArmor unconfined) is
/// refused under `baseline` and runs under `privileged`, the level its
/// DaemonSet's output gives the namespace.
#[test]
fn each_profile_runs_under_the_pod_security_level_the_readme_names() {
    block_on(async {
        let mut env = TestEnv::new("psa").await;
        let node = env.add_node("a").await;
        env.wait_node_ready(&node).await;
        // (level, reboot profile, upgrade profile, runs)
        for (level, reboot, upgrade, runs) in [
            ("restricted", false, false, true),
            ("baseline", true, false, false),
            ("privileged", true, false, true),
            ("baseline", true, true, false),
            ("privileged", true, true, true),
        ] {
            let suffix = format!("{level}{}", if upgrade { "-upgrade" } else { "" });
            let ns = env.add_namespace(&suffix).await;
            let opts = Options {
                namespace: ns.clone(),
                reboot,
                upgrade,
                ..Default::default()
            };
            // The level the shipped namespace enforces for this profile
            // (`rbac`, raised by the reboot DaemonSet's own output), except
            // where the test asks whether a lower one would do.
            let shipped = render("daemonset", &opts)
                .expect("render")
                .into_iter()
                .chain(
                    render(
                        "rbac",
                        &Options {
                            reboot: false,
                            ..opts.clone()
                        },
                    )
                    .expect("render"),
                )
                .find_map(|f| {
                    f.content
                        .lines()
                        .find_map(|l| {
                            l.trim()
                                .strip_prefix("pod-security.kubernetes.io/enforce: ")
                        })
                        .map(|v| v.trim_matches('"').to_string())
                })
                .expect("the shipped namespace enforces a Pod Security level");
            if runs {
                assert_eq!(shipped, level, "the shipped level of this profile");
            }
            let label = json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}});
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
                Api::all(env.client.clone());
            namespaces
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&label))
                .await
                .expect("labelling the namespace");
            let only_this_node = json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
                    "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                          "values": [node.clone()]}]}]}});
            let mut ds = nodekeeper::deploy::daemonset(&opts);
            ds["spec"]["template"]["spec"]["affinity"] = json!({"nodeAffinity": only_this_node});
            let mut objects = vec![
                json!({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": AGENT_ACCOUNT, "namespace": ns}}),
                ds,
            ];
            if !reboot {
                let mut d = nodekeeper::deploy::deployment(&opts)
                    .into_iter()
                    .find(|d| d["kind"] == "Deployment")
                    .expect("the deployment target has a Deployment");
                d["spec"]["replicas"] = json!(1);
                d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"] = only_this_node;
                objects.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                                    "metadata": {"name": CLUSTER_ACCOUNT, "namespace": ns}}));
                objects.push(d);
            }
            // One pod per workload: the DaemonSet's on the one node, and
            // the Deployment's single replica.
            let wanted = if reboot { 1 } else { 2 };
            let out = kubectl(
                &["apply", "-f", "-"],
                Some(&nodekeeper::yaml::documents(&objects)),
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
            let events: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(env.client.clone(), &ns);
            if runs {
                wait_for(
                    &format!("{wanted} pod(s) running under {level}"),
                    LIMIT,
                    || async {
                        let list = pods.list(&ListParams::default()).await.ok()?;
                        let running = list
                            .items
                            .iter()
                            .filter(|p| {
                                p.status.as_ref().and_then(|s| s.phase.as_deref())
                                    == Some("Running")
                            })
                            .count();
                        (running == wanted).then_some(())
                    },
                )
                .await;
            } else {
                let refusal = wait_for(
                    &format!("the pods refused under {level}"),
                    LIMIT,
                    || async {
                        let list = events.list(&ListParams::default()).await.ok()?;
                        list.items.into_iter().find_map(|e| {
                            let note = e.message.unwrap_or_default();
                            (e.reason.as_deref() == Some("FailedCreate")
                                && note.contains("violates PodSecurity"))
                            .then_some(note)
                        })
                    },
                )
                .await;
                assert!(refusal.contains("hostPID"), "{refusal}");
                let list = pods.list(&ListParams::default()).await.expect("pods");
                assert!(list.items.is_empty(), "no pod was created under {level}");
            }
        }
    })
}

/// The cluster role's Deployment as generated: its replicas never share a
/// node (a third of two nodes stays Pending), so draining one node takes
/// one of them at most, and a rollout still completes (one replica at a
/// time: a surge pod would find no node free).
#[test]
fn the_cluster_role_replicas_never_share_a_node_and_roll_one_at_a_time() {
    block_on(async {
        let mut env = TestEnv::new("cr-spread").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let opts = Options {
            namespace: env.ns.clone(),
            ..Default::default()
        };
        let mut deployment = nodekeeper::deploy::deployment(&opts)
            .into_iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("the deployment target has a Deployment");
        deployment["spec"]["replicas"] = json!(3);
        // Only this test's nodes: other tests share the cluster.
        deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"] = json!({
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
                "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                      "values": [a.clone(), b.clone()]}]}]}});
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                             "metadata": {"name": CLUSTER_ACCOUNT, "namespace": env.ns}});
        let out = kubectl(
            &["apply", "-f", "-"],
            Some(&nodekeeper::yaml::documents(&[account, deployment])),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let selector = "app.kubernetes.io/component=cluster";
        // Placement of the pods of the current template: (running nodes,
        // pods the scheduler refused).
        let placed = |hash: Option<String>| {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels(selector))
                    .await
                    .ok()?;
                let mut running = Vec::new();
                let mut refused = 0;
                for p in list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                {
                    let labels = p.metadata.labels.clone().unwrap_or_default();
                    if hash
                        .as_ref()
                        .is_some_and(|h| labels.get("pod-template-hash") != Some(h))
                    {
                        continue;
                    }
                    let status = p.status.as_ref()?;
                    if status.phase.as_deref() == Some("Running") {
                        running.push(p.spec.as_ref()?.node_name.clone()?);
                    } else if status.conditions.iter().flatten().any(|c| {
                        c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                    }) {
                        refused += 1;
                    }
                }
                running.sort();
                Some((running, refused))
            }
        };
        let (running, refused) =
            wait_for("two replicas running, the third refused", LIMIT, || async {
                placed(None).await.filter(|(r, n)| r.len() == 2 && *n == 1)
            })
            .await;
        assert_eq!(running, vec![a.clone(), b.clone()], "one replica per node");
        assert_eq!(refused, 1);

        // Two replicas, then a new template: the rollout replaces them one
        // at a time and ends with one per node.
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .patch(
                "nodekeeper-cluster",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 2, "template": {"metadata": {
                    "annotations": {"nodekeeper.io/test-rollout": "1"}}}}})),
            )
            .await
            .expect("a new template");
        wait_for("the rollout to complete", LIMIT, || async {
            let d = deploys.get("nodekeeper-cluster").await.ok()?;
            let status = d.status?;
            let generation = d.metadata.generation?;
            (status.observed_generation == Some(generation)
                && status.updated_replicas == Some(2)
                && status.available_replicas == Some(2)
                && status.replicas == Some(2))
            .then_some(())
        })
        .await;
        let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
            Api::namespaced(env.client.clone(), &env.ns);
        let hash = rs
            .list(&ListParams::default().labels(selector))
            .await
            .expect("replica sets")
            .items
            .into_iter()
            .find(|r| r.spec.replicas == Some(2))
            .and_then(|r| r.metadata.labels?.get("pod-template-hash").cloned())
            .expect("the new replica set");
        let (running, _) = wait_for("the new replicas on both nodes", LIMIT, || async {
            placed(Some(hash.clone()))
                .await
                .filter(|(r, _)| r.len() == 2)
        })
        .await;
        assert_eq!(running, vec![a, b], "one new replica per node");
    })
}

/// The node agent's identity, used the way host modes use it (a token bound
/// to the Node, from `nodekeeper host-kubeconfig`), carries a maintenance
/// through: nothing it needs is missing from the generated RBAC.
#[test]
fn an_agent_with_only_the_generated_rbac_completes_a_maintenance() {
    install_crds();
    install_agent_identity();
    block_on(async {
        let mut env = TestEnv::new("rbac").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        env.wait_node_ready(&a).await;
        env.wait_node_ready(&b).await;
        let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
        deploys
            .create(&PostParams::default(), &env.deployment("web", 2))
            .await
            .expect("deploy");
        let kubeconfig = host_kubeconfig(&a);
        let path = kubeconfig.to_string_lossy().to_string();
        let mut agent = Agent::start(&["run", "--node", &a, "--kubeconfig", &path]);
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let name = format!("{}-m", env.id);
        let nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: a.clone(),
                reason: None,
            },
        );
        nms.create(&PostParams::default(), &nm)
            .await
            .expect("create nm");
        wait_for(
            "Succeeded under the generated RBAC",
            Duration::from_secs(60),
            || async {
                (nms.get(&name).await.ok()?.phase() == Some(Phase::Succeeded)).then_some(())
            },
        )
        .await;
        nms.delete(&name, &DeleteParams::default())
            .await
            .expect("delete nm");
        wait_for(
            "removed under the generated RBAC",
            Duration::from_secs(60),
            || async { nms.get_opt(&name).await.ok()?.is_none().then_some(()) },
        )
        .await;
        let node = Api::<Node>::all(env.client.clone())
            .get(&a)
            .await
            .expect("node");
        assert_ne!(
            node.spec.and_then(|s| s.unschedulable),
            Some(true),
            "uncordoned again"
        );
        support::machines::assert_refused_nothing("the agent", &agent.log_text());
        agent.signal("TERM");
        assert!(agent.wait_exit(Duration::from_secs(15)).success());
        let _ = std::fs::remove_file(kubeconfig);
    })
}

fn code<T>(r: Result<T, kube::Error>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(e) => panic!("not an API error: {e}"),
    }
}

/// Least privilege: the agent identity is refused what it does not need.
#[test]
fn the_agent_identity_is_refused_everything_it_does_not_need() {
    install_crds();
    install_agent_identity();
    block_on(async {
        let mut env = TestEnv::new("deny").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        let kubeconfig = host_kubeconfig(&a);
        let agent = client_from(&kubeconfig).await;
        let nodes: Api<Node> = Api::all(agent.clone());
        assert_eq!(
            code(nodes.delete(&b, &DeleteParams::default()).await),
            Some(403),
            "delete a Node"
        );
        assert_eq!(
            code(nodes.delete(&a, &DeleteParams::default()).await),
            Some(403),
            "delete its own Node"
        );
        let secrets: Api<Secret> = Api::all(agent.clone());
        assert_eq!(
            code(secrets.list(&ListParams::default()).await),
            Some(403),
            "list Secrets"
        );
        let own_secrets: Api<Secret> = Api::namespaced(agent.clone(), NAMESPACE);
        assert_eq!(
            code(own_secrets.get("anything").await),
            Some(403),
            "get a Secret in its own namespace"
        );
        let pods: Api<Pod> = Api::namespaced(agent.clone(), &env.ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .expect("pod");
        assert_eq!(
            code(pods.create(&PostParams::default(), &pod).await),
            Some(403),
            "create a Pod"
        );
        let deploys: Api<Deployment> = Api::namespaced(agent.clone(), &env.ns);
        assert_eq!(
            code(deploys.list(&ListParams::default()).await),
            Some(403),
            "list Deployments"
        );
        // What it does need is allowed (so the 403s above are not a broken token).
        assert_eq!(code(nodes.get(&a).await), None, "get its node");
        let _ = std::fs::remove_file(kubeconfig);
    })
}

/// A pod `name` on `node` in the agent's namespace, so a token can be bound to it.
async fn agent_pod(client: &Client, name: &str, node: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": AGENT_ACCOUNT,
                 "tolerations": [{"operator": "Exists"}],
                 // What the namespace's restricted level asks of a pod.
                 "containers": [{"name": "nodekeeper", "image": "localhost/nodekeeper:test",
                                 "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                     "allowPrivilegeEscalation": false,
                                     "capabilities": {"drop": ["ALL"]},
                                     "seccompProfile": {"type": "RuntimeDefault"}}}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating an agent pod");
}

fn token(args: &[&str]) -> String {
    let mut all = vec![
        "create",
        "token",
        AGENT_ACCOUNT,
        "-n",
        NAMESPACE,
        "--duration=1h",
    ];
    all.extend_from_slice(args);
    let out = kubectl(&all, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn denial(r: Result<Node, kube::Error>) -> Option<String> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(format!("{} {}", s.code, s.message)),
        Err(e) => Some(e.to_string()),
    }
}

/// The second policy: agent A may delete a RebootPolicy's or an
/// UpgradePlan's NodeMaintenance of node A (its node given back after the
/// reboot or upgrade it ran) and no other.
async fn own_maintenances_only(
    env: &TestEnv,
    (a, b): (&str, &str),
    (as_a, unbound): (&Client, &Client),
) {
    let admin: Api<NodeMaintenance> = Api::all(env.client.clone());
    let create = |name: String, node: &str, owner: Option<&str>| {
        let mut m = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                node_name: node.to_string(),
                reason: None,
            },
        );
        m.metadata.labels = owner.map(|o| {
            [(
                nodekeeper::api::nodemaintenance::OWNER_LABEL.to_string(),
                o.to_string(),
            )]
            .into()
        });
        let admin = admin.clone();
        async move {
            admin
                .create(&PostParams::default(), &m)
                .await
                .expect("creating a NodeMaintenance");
            name
        }
    };
    // The refusals on administrators' NodeMaintenances: a RebootPolicy's
    // without a live policy is an orphan, which any cluster role running
    // beside this test gives back at once.
    let admins_a = create(format!("{}-admin-a", env.id), a, None).await;
    let admins_b = create(format!("{}-admin-b", env.id), b, None).await;
    // Dry runs (admission runs on them too): a delete the policy let
    // through before it was loaded would remove the object.
    let delete = |c: &Client, name: &str, dry_run: bool| {
        let api: Api<NodeMaintenance> = Api::all(c.clone());
        let name = name.to_string();
        let params = DeleteParams {
            dry_run,
            ..Default::default()
        };
        async move {
            match api.delete(&name, &params).await {
                Ok(_) => None,
                Err(kube::Error::Api(s)) => Some(format!("{} {}", s.code, s.message)),
                Err(e) => Some(e.to_string()),
            }
        }
    };
    let other = wait_for(
        "the policy to deny agent A a NodeMaintenance of node B",
        Duration::from_secs(30),
        || delete(as_a, &admins_b, true),
    )
    .await;
    assert!(
        other.contains("403")
            && other.contains(&format!("may not delete a NodeMaintenance of node {b}")),
        "{other}"
    );
    let admins = delete(as_a, &admins_a, true).await.unwrap_or_default();
    assert!(
        admins.contains("403") && admins.contains("only a RebootPolicy's or an UpgradePlan's"),
        "{admins}"
    );
    let unbound = delete(unbound, &admins_a, true).await.unwrap_or_default();
    assert!(
        unbound.contains("403") && unbound.contains("bound to a pod or a node"),
        "{unbound}"
    );
    // Allowed: a RebootPolicy's and an UpgradePlan's on node A, deleted by
    // agent A. A cluster role beside the test may give the orphan back
    // first (404): made again, a few times.
    for (owner, short) in [("RebootPolicy", "reboot"), ("UpgradePlan", "upgrade")] {
        let mut given_back = false;
        for i in 0..5 {
            let name = create(format!("{}-{short}-a{i}", env.id), a, Some(owner)).await;
            match delete(as_a, &name, false).await {
                None => {
                    given_back = true;
                    break;
                }
                Some(e) if e.starts_with("404") => continue,
                Some(e) => panic!("agent A may delete an {owner}'s NodeMaintenance of node A: {e}"),
            }
        }
        assert!(
            given_back,
            "each {owner}'s NodeMaintenance was gone before agent A deleted it"
        );
    }
    for name in [&admins_a, &admins_b] {
        let _ = admin.delete(name, &DeleteParams::default()).await;
    }
}

/// The ValidatingAdmissionPolicy: a token bound to a pod on node A (what a
/// DaemonSet pod gets) may cordon, taint and annotate node A, and is denied
/// on node B; it may not relabel its own node; a token bound to no pod or
/// node is denied outright.
#[test]
fn the_admission_policy_confines_each_agent_token_to_its_own_node() {
    install_crds();
    install_agent_identity();
    block_on(async {
        let mut env = TestEnv::new("vap").await;
        let a = env.add_node("a").await;
        let b = env.add_node("b").await;
        let (pod_a, pod_b) = (format!("{}-agent-a", env.id), format!("{}-agent-b", env.id));
        agent_pod(&env.client, &pod_a, &a).await;
        agent_pod(&env.client, &pod_b, &b).await;
        let as_a = client_with_token(&token(&[
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod_a}"),
        ]))
        .await;
        let as_b = client_with_token(&token(&[
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod_b}"),
        ]))
        .await;
        let unbound = client_with_token(&token(&[])).await;

        let cordon = json!({"spec": {"unschedulable": true},
                            "metadata": {"annotations": {"nodekeeper.io/cordoned-by-maintenance": "t"}}});
        let patch = |c: &Client, node: &str, body: serde_json::Value| {
            let api: Api<Node> = Api::all(c.clone());
            let node = node.to_string();
            async move {
                api.patch(&node, &PatchParams::default(), &Patch::Merge(body))
                    .await
            }
        };
        // A fresh policy takes a moment to reach the admission chain.
        let cross = wait_for(
            "the policy to deny agent A on node B",
            Duration::from_secs(30),
            || async { denial(patch(&as_a, &b, cordon.clone()).await) },
        )
        .await;
        assert!(
            cross.contains("403")
                && cross.contains(&format!(
                    "nodekeeper agent of node {a} may not modify node {b}"
                )),
            "{cross}"
        );
        assert_eq!(
            denial(patch(&as_a, &a, cordon.clone()).await),
            None,
            "A on A"
        );
        assert_eq!(
            denial(patch(&as_b, &b, cordon.clone()).await),
            None,
            "B on B"
        );
        // The patch below replaces the node's taints: a taint the node
        // controller still holds on the new node (not-ready, until its
        // first Ready) would be removed too, which the policy rightly
        // refuses (it failed so once). Only the cordon's may be there.
        let nodes: Api<Node> = Api::all(env.client.clone());
        wait_for(
            "node A to carry no taint but the cordon's",
            Duration::from_secs(30),
            || async {
                let n = nodes.get(&a).await.ok()?;
                let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
                taints
                    .iter()
                    .all(|t| t.key == "node.kubernetes.io/unschedulable")
                    .then_some(())
            },
        )
        .await;
        let taint = json!({"spec": {"taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]},
                           "metadata": {"labels": {"remediation.medik8s.io/exclude-from-remediation": "true"}}});
        assert_eq!(
            denial(patch(&as_a, &a, taint).await),
            None,
            "taint and label own node"
        );
        // Beyond the two taints a maintenance sets, the spec, finalizers and
        // owner references are not the agent's.
        let foreign_taint = denial(
            patch(
                &as_a,
                &a,
                json!({"spec": {"taints": [
                    {"key": "medik8s.io/drain", "effect": "NoSchedule"},
                    {"key": "example.com/keep-off", "effect": "NoExecute"}]}}),
            )
            .await,
        )
        .unwrap_or_default();
        assert!(
            foreign_taint.contains("403")
                && foreign_taint.contains("may add or remove only the taints"),
            "{foreign_taint}"
        );
        let finalizer = denial(
            patch(
                &as_a,
                &a,
                json!({"metadata": {"finalizers": ["example.com/hold"]}}),
            )
            .await,
        )
        .unwrap_or_default();
        assert!(
            finalizer.contains("403") && finalizer.contains("finalizers or owner references"),
            "{finalizer}"
        );
        let owner = denial(
            patch(
                &as_a,
                &a,
                json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Namespace",
                    "name": "default", "uid": "00000000-0000-0000-0000-000000000000"}]}}),
            )
            .await,
        )
        .unwrap_or_default();
        assert!(
            owner.contains("403") && owner.contains("finalizers or owner references"),
            "{owner}"
        );
        let relabel = denial(
            patch(
                &as_a,
                &a,
                json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            )
            .await,
        )
        .unwrap_or_default();
        assert!(
            relabel.contains("403") && relabel.contains("node-role.kubernetes.io/control-plane"),
            "{relabel}"
        );
        let foreign_annotation = denial(
            patch(
                &as_a,
                &a,
                json!({"metadata": {"annotations": {"example.com/x": "y"}}}),
            )
            .await,
        )
        .unwrap_or_default();
        assert!(foreign_annotation.contains("403"), "{foreign_annotation}");
        // In status, only the lifecycle conditions of its own node.
        let status = |c: &Client, node: &str, body: serde_json::Value| {
            let api: Api<Node> = Api::all(c.clone());
            let node = node.to_string();
            async move {
                api.patch_status(&node, &PatchParams::default(), &Patch::Strategic(body))
                    .await
            }
        };
        let condition = |type_: &str| {
            json!({"status": {"conditions": [{"type": type_, "status": "True", "reason": "Test",
                "message": "NodeMaintenance t", "lastTransitionTime": "2026-01-01T00:00:00Z",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}})
        };
        assert_eq!(
            denial(status(&as_a, &a, condition("DrainInProgress")).await),
            None,
            "a lifecycle condition on its own node"
        );
        let other_node =
            denial(status(&as_a, &b, condition("DrainInProgress")).await).unwrap_or_default();
        assert!(
            other_node.contains("403") && other_node.contains("may not modify node"),
            "{other_node}"
        );
        let ready = denial(status(&as_a, &a, condition("Ready")).await).unwrap_or_default();
        assert!(
            ready.contains("403")
                && ready.contains("only the node lifecycle conditions (KEP-5683), not Ready"),
            "{ready}"
        );
        let capacity =
            denial(status(&as_a, &a, json!({"status": {"capacity": {"pods": "1000"}}})).await)
                .unwrap_or_default();
        assert!(
            capacity.contains("403") && capacity.contains("may not change node status capacity"),
            "{capacity}"
        );
        let no_binding = denial(patch(&unbound, &a, cordon.clone()).await).unwrap_or_default();
        assert!(
            no_binding.contains("403") && no_binding.contains("bound to a pod or a node"),
            "{no_binding}"
        );
        own_maintenances_only(&env, (&a, &b), (&as_a, &unbound)).await;
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), NAMESPACE);
        for p in [&pod_a, &pod_b] {
            let _ = pods
                .delete(p, &DeleteParams::default().grace_period(0))
                .await;
        }
    })
}

/// The generated unit passes `systemd-analyze verify`: every key known and in
/// its section, every value parsed. ExecStart points at the test build, since
/// the real path does not exist on the test machine.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let files = render("systemd", &Options::default()).expect("render");
    let unit = files
        .iter()
        .find(|f| f.path == "nodekeeper.service")
        .expect("unit");
    let bin = env!("CARGO_BIN_EXE_nodekeeper");
    assert!(
        unit.content
            .contains("ExecStart=/usr/local/bin/nodekeeper run")
    );
    let content = unit.content.replace(
        "ExecStart=/usr/local/bin/nodekeeper",
        &format!("ExecStart={bin}"),
    );
    let dir = support::scratch().join(format!("nk-unit-{:x}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("nodekeeper.service");
    std::fs::write(&path, content).expect("write unit");
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd) must be installed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// host-kubeconfig without the ServiceAccount installed says how to install
/// it, in one line; for an unknown node it says so.
#[test]
fn host_kubeconfig_names_what_is_missing_in_one_line() {
    install_agent_identity();
    let admin = support::cluster().to_string_lossy().to_string();
    let env = [("KUBECONFIG", admin.as_str())];
    let (status, out, err) = run_cli(&["host-kubeconfig", "no-such-node-4711"], &env);
    assert!(!status.success() && out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no-such-node-4711"), "{err}");

    let mut test_env = block_on(TestEnv::new("hostkc"));
    let node = block_on(test_env.add_node("a"));
    let (status, out, err) = run_cli(
        &["host-kubeconfig", &node, "--namespace", "no-such-namespace"],
        &env,
    );
    assert!(!status.success() && out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("ServiceAccount no-such-namespace/nodekeeper-agent not found")
            && err.contains("nodekeeper manifests --for rbac"),
        "{err}"
    );
}

/// `host-kubeconfig --out FILE`: the file is private to its owner (0600),
/// or shared with one group (0640, the static pod's 65532), replaced whole;
/// `--group` without `--out` is refused in one line; an agent reads it.
#[test]
fn host_kubeconfig_writes_a_private_file_for_the_agent_user() {
    use std::os::unix::fs::MetadataExt;
    install_agent_identity();
    let admin = support::cluster().to_string_lossy().to_string();
    let env = [("KUBECONFIG", admin.as_str())];
    let mut test_env = block_on(TestEnv::new("hostkcout"));
    let node = block_on(test_env.add_node("a"));
    let dir = support::scratch().join(format!("nk-hostkc-{:x}", support::rand_u64()));
    let file = dir.join("etc").join("kubeconfig");
    let file_arg = file.to_string_lossy().to_string();

    let (status, out, err) = run_cli(&["host-kubeconfig", &node, "--group", "65532"], &env);
    assert!(!status.success() && out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--group needs --out"), "{err}");

    let (status, out, err) = run_cli(&["host-kubeconfig", &node, "--out", &file_arg], &env);
    assert!(status.success() && out.is_empty(), "{err}");
    assert!(err.contains("mode 0600"), "{err}");
    let meta = std::fs::metadata(&file).expect("written");
    assert_eq!(meta.mode() & 0o777, 0o600);

    let (status, _, err) = run_cli(
        &[
            "host-kubeconfig",
            &node,
            "--out",
            &file_arg,
            "--group",
            "65532",
        ],
        &env,
    );
    assert!(status.success(), "{err}");
    let meta = std::fs::metadata(&file).expect("written");
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o640, 65532), "{err}");
    let leftovers = std::fs::read_dir(file.parent().expect("parent"))
        .expect("listing")
        .count();
    assert_eq!(
        leftovers, 1,
        "a temporary file was left beside the kubeconfig"
    );

    // The file works: the token in it reads the cluster.
    let (status, _, err) = run_cli(&["status", "--kubeconfig", &file_arg], &[]);
    assert!(
        status.success(),
        "status with the written kubeconfig: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
