//! The opt-in NodeMaintenance webhook on the real API server: the
//! configuration `nodekeeper manifests --for webhook` generates (its URL
//! moved to this test's port), an agent serving `--admission-address` on
//! loopback, and the API server calling it by URL. Checks NMO's refusals
//! with their exact messages as `kubectl create` prints them, the caBundle
//! nodekeeper writes and takes back as it stops, a restart with a new
//! certificate, the bound on connections, and the status fallback when no
//! webhook answers (failurePolicy Ignore).
//!
//! One test: the configuration is cluster-wide, so its phases run in turn.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use nodekeeper::api::nodemaintenance::*;
use nodekeeper::decide::admission::{CONTROL_PLANE_LABEL, OWNERS_ANNOTATION, pem_blocks};
use nodekeeper::service::admission::{CONFIGURATION, MAX_CONNECTIONS, PATH, WEBHOOK};
use support::{Agent, TestEnv, block_on, install_crds, kubectl, run_cli, wait_for};

const LONG: Duration = Duration::from_secs(60);

/// Deletes the configuration when the test ends, however it ends: other
/// test binaries create NodeMaintenances too.
struct Configured(Api<ValidatingWebhookConfiguration>);

impl Drop for Configured {
    fn drop(&mut self) {
        let api = self.0.clone();
        block_on(async move {
            let _ = api.delete(CONFIGURATION, &DeleteParams::default()).await;
        });
    }
}

fn manifest(name: &str, node: &str) -> String {
    format!(
        "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  reason: admission test\n"
    )
}

/// `kubectl create` of a NodeMaintenance: `Ok` or the refusal as printed.
fn create(name: &str, node: &str) -> Result<(), String> {
    let out = kubectl(&["create", "-f", "-"], Some(&manifest(name, node)));
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn refusal(message: &str) -> String {
    format!("admission webhook \"{WEBHOOK}\" denied the request: {message}")
}

async fn ca_bundle(api: &Api<ValidatingWebhookConfiguration>) -> (String, Option<String>) {
    let Ok(c) = api.get(CONFIGURATION).await else {
        return (String::new(), None);
    };
    let bundle = c
        .webhooks
        .unwrap_or_default()
        .first()
        .and_then(|w| w.client_config.ca_bundle.as_ref())
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .unwrap_or_default();
    let owners = c
        .metadata
        .annotations
        .and_then(|a| a.get(OWNERS_ANNOTATION).cloned());
    (bundle, owners)
}

#[test]
fn webhook_refuses_like_nmo_rotates_with_restarts_and_falls_back_to_status() {
    install_crds();
    block_on(async {
        let mut env = TestEnv::new("admission").await;
        let worker = env.add_node("w").await;
        let mut cp = Vec::new();
        for i in 1..=3 {
            cp.push(env.add_node(&format!("cp{i}")).await);
        }
        let nodes: Api<Node> = Api::all(env.client.clone());
        for n in &cp {
            let label = serde_json::json!({"metadata": {"labels": {CONTROL_PLANE_LABEL: ""}}});
            nodes
                .patch(n, &PatchParams::default(), &Patch::Merge(&label))
                .await
                .expect("labelling a control-plane node");
        }
        for n in cp.iter().chain([&worker]) {
            env.wait_node_ready(n).await;
        }

        // The generated configuration, pointed at this test's port.
        let port = support::free_port();
        let (status, yaml, err) = run_cli(&["manifests", "--for", "webhook"], &[]);
        assert!(status.success(), "manifests --for webhook: {err}");
        assert!(
            yaml.contains("https://127.0.0.1:9443/validate-nodemaintenance"),
            "{yaml}"
        );
        assert!(yaml.contains("failurePolicy: Ignore"), "{yaml}");
        let yaml = yaml.replace("127.0.0.1:9443", &format!("127.0.0.1:{port}"));
        let out = kubectl(&["apply", "-f", "-"], Some(&yaml));
        assert!(
            out.status.success(),
            "applying the webhook manifests: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
        let _cleanup = Configured(configs.clone());
        assert_eq!(
            ca_bundle(&configs).await.0,
            "",
            "applied without a caBundle"
        );

        // The API server's webhook client certificate's CA (the test
        // cluster presents one to every webhook: tests/controlplane): only
        // a caller with it is answered.
        let pki = support::cluster()
            .parent()
            .expect("the cluster's folder")
            .join("pki");
        let client_ca = pki.join("webhook-client-ca.crt").display().to_string();
        let address = format!("127.0.0.1:{port}");
        let serve = |node: &str| {
            Agent::start(&[
                "run",
                "--node",
                node,
                "--admission-address",
                &address,
                "--admission-client-ca",
                &client_ca,
            ])
        };
        let mut agent = serve(&worker);
        let (first_bundle, owners) = wait_for("the caBundle written", LONG, || async {
            let (b, o) = ca_bundle(&configs).await;
            (pem_blocks(&b).len() == 1).then_some((b, o))
        })
        .await;
        assert!(
            owners.as_deref().is_some_and(|o| o.contains(&worker)),
            "owner list names the serving agent: {owners:?}"
        );

        // Until the API server has loaded the caBundle, a failed call is
        // ignored: wait, by probing, until the webhook refuses.
        let ghost = format!("{}-ghost", env.id);
        let probe = |round: usize| {
            let name = format!("{}-probe{round}", env.id);
            let ghost = ghost.clone();
            async move {
                let r = create(&name, &ghost);
                let _ = kubectl(
                    &["delete", "nm", &name, "--ignore-not-found", "--wait=false"],
                    None,
                );
                r.err()
            }
        };
        // The first refusal of a fresh probe, once the webhook answers.
        let round = std::cell::Cell::new(0);
        let (round, probe) = (&round, &probe);
        let answered = |what: &'static str| {
            wait_for(what, LONG, move || {
                round.set(round.get() + 1);
                probe(round.get())
            })
        };
        let refused = answered("the webhook to answer").await;

        // 1. No such node.
        assert!(
            refused.contains(&refusal(&format!(
                "invalid nodeName, no node with name {ghost} found"
            ))),
            "{refused}"
        );

        // 2. A second maintenance for one node.
        let first = format!("{}-first", env.id);
        create(&first, &worker).expect("the first NodeMaintenance of the worker is admitted");
        let second = format!("{}-second", env.id);
        let err = create(&second, &worker).expect_err("a second one is refused");
        assert!(
            err.contains(&refusal(&format!(
                "invalid nodeName, a NodeMaintenance for node {worker} already exists"
            ))),
            "{err}"
        );

        // 2a. Only the API server is answered: a review without its
        // client certificate ends at the TLS handshake; with it, answered.
        let post = |cert: bool| {
            let url = format!("https://127.0.0.1:{port}/validate-nodemaintenance");
            let mut args = vec![
                "-sk".to_string(),
                "--max-time".into(),
                "10".into(),
                "-o".into(),
                "/dev/null".into(),
                "-w".into(),
                "%{http_code}".into(),
                "-H".into(),
                "Content-Type: application/json".into(),
                "--data".into(),
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","operation":"DELETE"}}"#.into(),
            ];
            if cert {
                for (flag, file) in [
                    ("--cert", "webhook-client.crt"),
                    ("--key", "webhook-client.key"),
                ] {
                    args.push(flag.into());
                    args.push(pki.join(file).display().to_string());
                }
            }
            args.push(url);
            let out = std::process::Command::new("curl")
                .args(&args)
                .output()
                .expect("running curl");
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        assert_eq!(
            post(true),
            "200",
            "the API server's certificate is answered"
        );
        assert_eq!(post(false), "000", "no client certificate, no answer");

        // 2b. The owner label skips the checks only with a live owner
        // behind it: set by hand (an owner reference to no such policy),
        // the same second maintenance is refused.
        let forged = format!(
            "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: {id}-forged\n  labels:\n    nodekeeper.io/owner: RebootPolicy\n  ownerReferences:\n  - apiVersion: nodekeeper.io/v1alpha1\n    kind: RebootPolicy\n    name: {id}-no-such-policy\n    uid: 00000000-0000-0000-0000-000000000000\nspec:\n  nodeName: {worker}\n  reason: admission test\n",
            id = env.id
        );
        let out = kubectl(&["create", "-f", "-"], Some(&forged));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains(&refusal(&format!(
                    "invalid nodeName, a NodeMaintenance for node {worker} already exists"
                ))),
            "a forged owner label is refused like any second maintenance: {err}"
        );

        // 3. The control plane's quorum: 3 members, cp2 cordoned, so
        // taking cp1 would leave 1 of 3 (a quorum is 2).
        let cordon = serde_json::json!({"spec": {"unschedulable": true}});
        nodes
            .patch(&cp[1], &PatchParams::default(), &Patch::Merge(&cordon))
            .await
            .expect("cordon cp2");
        let cp_nm = format!("{}-cp1", env.id);
        let err = create(&cp_nm, &cp[0]).expect_err("cp1 is refused while cp2 is cordoned");
        assert!(
            err.contains(&refusal(&format!(
                "can not put master/control-plane node into maintenance at this moment, disrupting node {} will violate etcd quorum: 1 of 3 control-plane nodes would stay Ready and schedulable, a quorum needs 2",
                cp[0]
            ))),
            "{err}"
        );
        let uncordon = serde_json::json!({"spec": {"unschedulable": null}});
        nodes
            .patch(&cp[1], &PatchParams::default(), &Patch::Merge(&uncordon))
            .await
            .expect("uncordon cp2");
        create(&cp_nm, &cp[0]).expect("cp1 is admitted once cp2 is back");

        // 4. Stopped, an instance takes its CA out of the bundle (a
        // Deployment's replicas are a new identity with every pod: each
        // rollout left a CA behind for 30 days). A restart brings a new
        // CA, and the webhook works with it.
        agent.signal("TERM");
        let status = agent.wait_exit(Duration::from_secs(20));
        assert!(status.success(), "exit {status}:\n{}", agent.log_text());
        configs
            .get(CONFIGURATION)
            .await
            .expect("the webhook configuration is still there");
        let (withdrawn, owners) = ca_bundle(&configs).await;
        assert!(
            pem_blocks(&withdrawn).is_empty(),
            "the stopped instance's CA is withdrawn: {withdrawn}\n{}",
            agent.log_text()
        );
        assert!(
            !owners.as_deref().is_some_and(|o| o.contains(&worker)),
            "the owner list no longer names the stopped instance: {owners:?}"
        );
        let mut agent = serve(&worker);
        let second_bundle = wait_for("the new CA in the caBundle", LONG, || async {
            let (b, _) = ca_bundle(&configs).await;
            (!b.is_empty() && b != first_bundle).then_some(b)
        })
        .await;
        assert_eq!(
            pem_blocks(&second_bundle).len(),
            1,
            "the old CA is gone: {second_bundle}"
        );
        let refused = answered("the webhook to answer with the new certificate").await;
        assert!(
            refused.contains(&refusal("invalid nodeName, no node with name")),
            "{refused}"
        );

        // 4b. Connections beyond MAX_CONNECTIONS are closed as they come
        // (idle ones, never past the TLS handshake, held each slot for its
        // 10 s), and once they are gone the webhook answers again.
        let held: Vec<std::net::TcpStream> = (0..=MAX_CONNECTIONS)
            .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connecting"))
            .collect();
        let mut last = held
            .last()
            .expect("connections")
            .try_clone()
            .expect("a handle");
        last.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("a read timeout");
        let mut byte = [0u8; 1];
        let read = std::io::Read::read(&mut last, &mut byte);
        assert!(
            matches!(read, Ok(0))
                || read
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "connection {} of {} was not closed at once: {read:?}",
            MAX_CONNECTIONS + 1,
            MAX_CONNECTIONS
        );
        drop((held, last));
        let refused = answered("the webhook to answer after a flood").await;
        assert!(
            refused.contains(&refusal("invalid nodeName, no node with name")),
            "{refused}"
        );

        // 5. No webhook answering: the API server admits (Ignore), and the
        // status path fails the object with the same message (the cluster
        // role's: an agent sees only its own node's objects).
        agent.signal("TERM");
        agent.wait_exit(Duration::from_secs(20));
        let _plain = Agent::start(&["run", "--node", &worker]);
        let _cluster = support::machines::cluster_role(&env, &["--node-agents"]);
        let admitted = format!("{}-fallback", env.id);
        create(&admitted, &ghost).expect("admitted with no webhook answering");
        let nms: Api<NodeMaintenance> = Api::all(env.client.clone());
        let failed = wait_for("the fallback to fail it in status", LONG, || async {
            let nm = nms.get_opt(&admitted).await.ok().flatten()?;
            (nm.phase() == Some(Phase::Failed)).then_some(nm)
        })
        .await;
        assert_eq!(
            failed.status.and_then(|s| s.last_error).as_deref(),
            Some(format!("invalid nodeName, no node with name {ghost} found").as_str())
        );
        assert!(yaml.contains(PATH));
        // Leave nothing behind: the worker's agent finishes what it took.
        for name in [&first, &cp_nm, &admitted] {
            let _ = kubectl(
                &["delete", "nm", name, "--ignore-not-found", "--wait=false"],
                None,
            );
        }
        for name in [&first, &cp_nm, &admitted] {
            wait_for("NodeMaintenance gone", LONG, || async {
                nms.get_opt(name).await.ok()?.is_none().then_some(())
            })
            .await;
        }
    })
}
