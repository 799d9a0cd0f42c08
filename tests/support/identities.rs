//! The identities tests run nodekeeper as, the way users run it: nodekeeper's
//! CRDs, the shipped node-agent and cluster-role identities, kubeconfigs
//! with their tokens, and the audited users whose every request the API
//! server's audit log records.

use std::path::{Path, PathBuf};

use super::*;

/// Install nodekeeper's CRDs the way the README says (`nodekeeper crds |
/// kubectl apply -f -`), once per test binary, and wait until served.
pub fn install_crds() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let (status, yaml, err) = run_cli(&["crds"], &[]);
        assert!(status.success(), "nodekeeper crds failed: {err}");
        let out = kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&yaml),
        );
        assert!(
            out.status.success(),
            "kubectl apply of the CRDs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/nodemaintenances.nodemaintenance.medik8s.io",
                "crd/rebootpolicies.nodekeeper.io",
                "crd/upgradeplans.nodekeeper.io",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "CRD not established: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Apply the node agent's generated identity (namespaces, ServiceAccount,
/// RBAC) and the own-node admission policy, once per test binary.
pub fn install_agent_identity() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for target in ["rbac", "admission"] {
            let (status, yaml, err) = run_cli(&["manifests", "--for", target], &[]);
            assert!(
                status.success(),
                "nodekeeper manifests --for {target}: {err}"
            );
            let out = kubectl(
                &["apply", "--server-side", "--force-conflicts", "-f", "-"],
                Some(&yaml),
            );
            assert!(
                out.status.success(),
                "kubectl apply of {target} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
}

/// The namespace the generated manifests put nodekeeper's identities in.
pub const NODEKEEPER_NAMESPACE: &str = "nodekeeper";

/// Apply the cluster role's generated identity once per test binary: its
/// ServiceAccount `nodekeeper-cluster`, ClusterRole, bindings and leader
/// Role, from `deploy::deployment` (all of it but the Deployment), beside
/// the node agent's ([`install_agent_identity`]). Rendered as for a user
/// who runs every feature: `--upgrade-jobs` and `--replacement` (the
/// tests of hook Jobs, Job strategies and replacement need their grants;
/// that the default lacks them is `deploy::tests`').
fn install_cluster_identity() {
    static APPLIED: OnceLock<()> = OnceLock::new();
    APPLIED.get_or_init(|| {
        install_agent_identity();
        let every_feature = nodekeeper::deploy::Options {
            upgrade_jobs: true,
            replacement: true,
            ..Default::default()
        };
        let docs: Vec<serde_json::Value> = nodekeeper::deploy::deployment(&every_feature)
            .into_iter()
            .filter(|d| d["kind"] != "Deployment")
            .collect();
        let out = kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&nodekeeper::yaml::documents(&docs)),
        );
        assert!(
            out.status.success(),
            "kubectl apply of the cluster role's identity failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// A kubeconfig with a token of the shipped cluster role's ServiceAccount,
/// as a cluster-role replica runs: its leader Lease in
/// [`NODEKEEPER_NAMESPACE`], where the shipped Role grants it.
pub fn cluster_identity_kubeconfig() -> PathBuf {
    install_cluster_identity();
    let out = kubectl(
        &[
            "create",
            "token",
            nodekeeper::deploy::CLUSTER_ACCOUNT,
            "-n",
            NODEKEEPER_NAMESPACE,
            "--duration",
            "2h",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "a token of {}: {}",
        nodekeeper::deploy::CLUSTER_ACCOUNT,
        String::from_utf8_lossy(&out.stderr)
    );
    kubeconfig_with_token(String::from_utf8_lossy(&out.stdout).trim())
}

/// [`cluster_identity_kubeconfig`] for a cluster role whose leader Lease
/// is in `namespace` (a test's own, so that tests running at once never
/// share a lease): the shipped leader Role's rules, bound there to the
/// shipped ServiceAccount, as an operator who runs a pool's cluster role
/// in a namespace of its own binds it.
pub fn cluster_identity_kubeconfig_in(namespace: &str) -> PathBuf {
    install_cluster_identity();
    if namespace != NODEKEEPER_NAMESPACE {
        let role = nodekeeper::deploy::deployment(&nodekeeper::deploy::Options::default())
            .into_iter()
            .find(|d| d["kind"] == "Role")
            .expect("the deployment target has the leader Role");
        apply(&serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role["metadata"]["name"], "namespace": namespace},
            "rules": role["rules"],
        }));
        apply(&serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role["metadata"]["name"], "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": role["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": nodekeeper::deploy::CLUSTER_ACCOUNT,
                          "namespace": NODEKEEPER_NAMESPACE}],
        }));
    }
    cluster_identity_kubeconfig()
}

/// The kubeconfig a `nodekeeper` started with `args` gets by default: the
/// identity the shipped manifests give it. A node agent (`run --node N`)
/// gets a token of `nodekeeper-agent` bound to its Node (`host-kubeconfig`,
/// confined by the own-node admission policy); a cluster role (`run
/// --all-nodes`) a token of `nodekeeper-cluster`. `None` (the
/// administrator's) for other commands and where `--kubeconfig` is given.
pub fn shipped_identity(args: &[&str]) -> Option<PathBuf> {
    let value = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .and_then(|i| args.get(i + 1).copied())
    };
    if args.first() != Some(&"run") || args.contains(&"--kubeconfig") {
        return None;
    }
    if args.contains(&"--all-nodes") {
        return Some(match value("--leader-namespace") {
            Some(ns) => cluster_identity_kubeconfig_in(ns),
            None => cluster_identity_kubeconfig(),
        });
    }
    let node = value("--node")?;
    install_agent_identity();
    Some(host_kubeconfig(node))
}

/// `nodekeeper host-kubeconfig NODE` against the test cluster, written to a
/// temporary file whose path is returned.
pub fn host_kubeconfig(node: &str) -> PathBuf {
    let admin = cluster().to_string_lossy().to_string();
    let (status, out, err) = run_cli(&["host-kubeconfig", node], &[("KUBECONFIG", &admin)]);
    assert!(status.success(), "host-kubeconfig {node}: {err}");
    let path = scratch().join(format!("nk-host-kubeconfig-{:x}", rand_u64()));
    std::fs::write(&path, out).expect("writing the host kubeconfig");
    path
}

/// An identity whose every API request the audit log records, with the
/// permissions the shipped manifests give `nodekeeper <args>` and no more:
/// its kubeconfig and user name. The cluster's eight audited users hold no
/// group with rights of their own (tests/controlplane/cluster.sh); each call
/// in a test process takes the next and binds it to the shipped ClusterRole
/// of the role `args` run (`run --all-nodes`: the cluster role's and its
/// feature grants, with the
/// leader Role in its `--leader-namespace`; `run --node N`: the node
/// agent's), and to the medik8s lease Role. (A node agent's token is
/// not bound to its Node here, so the own-node admission policy, which
/// matches the agent's ServiceAccount, does not confine it.)
pub fn audited_identity_for(args: &[&str]) -> (PathBuf, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let i = NEXT.fetch_add(1, Ordering::SeqCst) % 8;
    let path = cluster().with_file_name(format!("kubeconfig-audited-{i}"));
    assert!(
        path.is_file(),
        "{} is missing: restart the test cluster (just cluster-down) so cluster.sh writes it",
        path.display()
    );
    let user = format!("nodekeeper-audited-{i}");
    let value = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .and_then(|i| args.get(i + 1).copied())
    };
    install_cluster_identity();
    let (role, other) = if args.contains(&"--all-nodes") {
        (
            nodekeeper::deploy::CLUSTER_ACCOUNT,
            nodekeeper::deploy::AGENT_ACCOUNT,
        )
    } else {
        (
            nodekeeper::deploy::AGENT_ACCOUNT,
            nodekeeper::deploy::CLUSTER_ACCOUNT,
        )
    };
    // A slot bound for the other role in an earlier test: that goes, with
    // the cluster role's feature grants.
    let elevated = nodekeeper::deploy::Elevated::ALL.map(|e| e.role());
    let mut gone = vec![format!("{user}-{other}")];
    if role != nodekeeper::deploy::CLUSTER_ACCOUNT {
        gone.extend(elevated.iter().map(|r| format!("{user}-{r}")));
    }
    for binding in &gone {
        let _ = kubectl(
            &[
                "delete",
                "clusterrolebinding",
                binding,
                "--ignore-not-found",
            ],
            None,
        );
    }
    let subject = serde_json::json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]);
    apply(&serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{user}-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subject,
    }));
    apply(&serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": user, "namespace": nodekeeper::api::nodemaintenance::LEASE_NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodekeeper-medik8s-lease"},
        "subjects": subject,
    }));
    if role == nodekeeper::deploy::CLUSTER_ACCOUNT {
        // Every feature's grants, as install_cluster_identity renders them.
        for r in elevated {
            apply(&serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("{user}-{r}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": r},
                "subjects": subject,
            }));
        }
        let namespace = value("--leader-namespace").unwrap_or(NODEKEEPER_NAMESPACE);
        // The shipped leader Role, in the namespace of the lease.
        cluster_identity_kubeconfig_in(namespace);
        apply(&serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": user, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodekeeper-leader"},
            "subjects": subject,
        }));
        // The shipped FlowSchema's priority for its leases, as for the
        // ServiceAccount: under load a renewal must not queue behind the
        // role's own evictions here either (bench-scale).
        let mut schema = nodekeeper::deploy::deployment(&nodekeeper::deploy::Options::default())
            .into_iter()
            .find(|d| d["kind"] == "FlowSchema")
            .expect("the deployment target has the leader FlowSchema");
        schema["metadata"] = serde_json::json!({"name": format!("{user}-leader-election")});
        let rule = &mut schema["spec"]["rules"][0];
        rule["subjects"] = serde_json::json!([{"kind": "User", "user": {"name": user}}]);
        rule["resourceRules"][0]["namespaces"] = serde_json::json!([namespace]);
        apply(&schema);
    }
    (path, user)
}

/// `nodekeeper <args>` started as an audited user with the shipped
/// permissions ([`audited_identity_for`]), logging at `filter`: the agent
/// and the user its requests are logged under.
pub fn audited_agent(args: &[&str], filter: &str) -> (Agent, String) {
    let (kubeconfig, user) = audited_identity_for(args);
    let bin = Path::new(env!("CARGO_BIN_EXE_nodekeeper"));
    (Agent::start_with(bin, &kubeconfig, filter, args), user)
}
