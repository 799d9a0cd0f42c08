//! The monitoring artifacts (image/monitoring, `nodekeeper manifests --for
//! prometheus`) with a real Prometheus and promtool built with the control
//! plane (tests/upstream/build.sh, cached):
//! promtool accepts the rules and lints the live metrics of a node agent
//! and a cluster role clean; a Prometheus scraping them with the shipped
//! rules fires NodekeeperDrainStuck and NodekeeperNodeNotReturned when a
//! drain passes its deadline and a rebooted machine stays away, and
//! resolves each once the cause is gone.

use crate::support;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec};
use serde_json::{Value, json};
use support::machines::*;
use support::{Agent, TestEnv, block_on, free_port, http_get, install_crds, wait_for};

const LONG: Duration = Duration::from_secs(90);

/// The folder holding `prometheus` and `promtool`, built once per run.
fn bin_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/build.sh");
        let out = Command::new(&script)
            .arg("prometheus")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "building Prometheus failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("image/monitoring/rules.yaml")
}

/// promtool with `stdin`; (exit code, stdout, stderr).
fn promtool(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(bin_dir().join("promtool"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool");
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("promtool's stdin");
    }
    let out = child.wait_with_output().expect("promtool");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Wait for /readyz and return the /metrics text of the process on `port`.
fn metrics_of(port: u16) -> String {
    block_on(wait_for("/readyz to answer 200", LONG, || async {
        http_get(port, "/readyz").filter(|(s, _)| s.contains(" 200 "))
    }));
    http_get(port, "/metrics").expect("/metrics").1
}

#[test]
fn promtool_accepts_the_rules_and_lints_the_live_metrics_clean() {
    install_crds();
    let rules = rules_file();
    let (code, out, err) = promtool(&["check", "rules", &rules.to_string_lossy()], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("SUCCESS: 8 rules found"), "{out}");

    let mut env = block_on(TestEnv::new("promlint"));
    let node = block_on(env.add_node("a"));
    block_on(env.wait_node_ready(&node));
    let (agent_port, cluster_port) = (free_port(), free_port());
    let agent_addr = format!("127.0.0.1:{agent_port}");
    let _agent = Agent::start(&["run", "--node", &node, "--metrics-address", &agent_addr]);
    let cluster_addr = format!("127.0.0.1:{cluster_port}");
    let _cluster = cluster_role(&env, &["--metrics-address", &cluster_addr]);
    let agent = metrics_of(agent_port);
    assert!(
        agent.contains(&format!("nodekeeper_ready{{node=\"{node}\"}} 1")),
        "the agent's series name its node:\n{agent}"
    );
    let cluster = block_on(wait_for("the cluster role to lead", LONG, || async {
        let text = http_get(cluster_port, "/metrics")?.1;
        text.contains("nodekeeper_leader 1").then_some(text)
    }));
    for (who, text) in [("node agent", &agent), ("cluster role", &cluster)] {
        let (code, out, err) = promtool(&["check", "metrics"], Some(text));
        assert!(
            code == 0 && err.trim().is_empty(),
            "promtool check metrics on the {who}'s /metrics: exit {code}\n{out}{err}"
        );
    }
}

/// One GET to Prometheus (Go's server keeps connections open and chunks
/// longer bodies): (status line, body).
fn get(port: u16, path: &str) -> Option<(String, String)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.to_string();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some((status, body.to_string()));
    }
    let (mut rest, mut out) = (body, String::new());
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 {
            return Some((status, out));
        }
        out.push_str(after.get(..n)?);
        rest = after.get(n + 2..)?;
    }
}

/// Percent-encode a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus on loopback scraping `targets` every second with the
/// shipped rules, evaluated every second; stopped on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(targets: &[String]) -> Prometheus {
        Prometheus::start_with(targets, "groups: []\n")
    }

    /// [`Prometheus::start`] with more rules (a rules file's text).
    fn start_with(targets: &[String], extra_rules: &str) -> Prometheus {
        let dir = support::scratch().join(format!("nk-prometheus-{:x}", support::rand_u64()));
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        std::fs::copy(rules_file(), dir.join("rules.yaml")).expect("rules");
        std::fs::write(dir.join("extra.yaml"), extra_rules).expect("extra rules");
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml", "extra.yaml"],
            "scrape_configs": [{"job_name": "nodekeeper", "static_configs": [{"targets": targets}]}]
        });
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).expect("config");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new(bin_dir().join("prometheus"))
            .current_dir(&dir)
            .args([
                &format!("--config.file={}", dir.join("prometheus.yml").display()),
                &format!("--storage.tsdb.path={}", dir.join("data").display()),
                &format!("--web.listen-address=127.0.0.1:{port}"),
                "--scrape.discovery-reload-interval=1s",
            ])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let p = Prometheus { child, port, dir };
        block_on(wait_for("Prometheus ready", LONG, || async {
            get(p.port, "/-/ready").filter(|(s, _)| s.contains(" 200 "))
        }));
        p
    }

    fn api(&self, path: &str) -> Option<Value> {
        let (status, body) = get(self.port, path)?;
        status
            .contains(" 200 ")
            .then(|| serde_json::from_str(&body).ok())
            .flatten()
    }

    /// The labels of every firing instance of `alert`.
    fn firing(&self, alert: &str) -> Vec<Value> {
        self.api("/api/v1/alerts")
            .and_then(|v| v["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == alert && a["state"] == "firing")
            .map(|a| a["labels"].clone())
            .collect()
    }

    /// The rule's state: inactive, pending or firing.
    fn state(&self, alert: &str) -> Option<String> {
        let v = self.api("/api/v1/rules?type=alert")?;
        v["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .find(|r| r["name"] == alert)
            .and_then(|r| r["state"].as_str().map(str::to_string))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn alerts_fire_and_resolve_in_a_real_prometheus() {
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("alerts").await;
        let names = nodes(&mut env, 3).await;
        let fleet = Fleet::new(env.client.clone(), None);
        (env, names, fleet)
    });
    let (lost, stuck) = (&names[0], &names[2]);
    fleet
        .lost
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(lost.clone());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let cluster = cluster_role(&env, &["--drain-timeout", "2", "--metrics-address", &addr]);
    let prometheus = Prometheus::start(std::slice::from_ref(&addr));
    block_on(wait_for("the cluster role scraped", LONG, || async {
        (prometheus.state("NodekeeperNoLeader").as_deref() == Some("inactive")
            && prometheus
                .api("/api/v1/query?query=nodekeeper_leader")
                .is_some_and(|v| v["data"]["result"][0]["value"][1] == "1"))
        .then_some(())
    }));

    // A drain that cannot finish: one pod pinned to the node, a PDB that
    // allows no eviction, a 2 s drain deadline.
    let began = Instant::now();
    let nm_name = format!("{}-stuck", env.id);
    block_on(async {
        env.blocking_pod_on("pinned", stuck).await;
        Api::<NodeMaintenance>::all(env.client.clone())
            .create(
                &PostParams::default(),
                &NodeMaintenance::new(
                    &nm_name,
                    NodeMaintenanceSpec {
                        node_name: stuck.clone(),
                        reason: Some("alert test".into()),
                    },
                ),
            )
            .await
            .expect("nm");
    });
    let labels = block_on(wait_for("NodekeeperDrainStuck firing", LONG, || async {
        prometheus.firing("NodekeeperDrainStuck").into_iter().next()
    }));
    let fired = began.elapsed();
    assert_eq!(labels["node"], stuck.as_str(), "{labels}");
    assert_eq!(labels["nodemaintenance"], nm_name.as_str(), "{labels}");
    assert_eq!(labels["severity"], "warning");
    let freed = Instant::now();
    block_on(async {
        Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.ns)
            .delete("pinned", &DeleteParams::default())
            .await
            .expect("delete pdb");
    });
    block_on(wait_for("NodekeeperDrainStuck resolved", LONG, || async {
        (prometheus.state("NodekeeperDrainStuck").as_deref() == Some("inactive")).then_some(())
    }));
    let resolved = freed.elapsed();
    block_on(async {
        Api::<NodeMaintenance>::all(env.client.clone())
            .delete(&nm_name, &DeleteParams::default())
            .await
            .expect("delete nm");
        wait_for("the stuck node given back", LONG, || async {
            let node = Api::<Node>::all(env.client.clone()).get(stuck).await.ok()?;
            let gone = Api::<NodeMaintenance>::all(env.client.clone())
                .get_opt(&nm_name)
                .await
                .ok()?
                .is_none();
            (gone && node.spec.and_then(|s| s.unschedulable) != Some(true)).then_some(())
        })
        .await;
    });

    // A machine that does not come back from its reboot.
    let policy = block_on(create_policy(
        &env,
        &fleet,
        json!({"reboot": {"returnTimeoutSeconds": 10}}),
    ));
    block_on(annotate(
        &env.client,
        lost,
        "nodekeeper.io/reboot-needed",
        Some("now"),
    ));
    let asked = Instant::now();
    let seen = std::cell::RefCell::new(Value::Null);
    fleet.serve(&names[..1], LONG, || {
        let first = prometheus
            .firing("NodekeeperNodeNotReturned")
            .into_iter()
            .next()
            .unwrap_or(Value::Null);
        let fired = !first.is_null();
        *seen.borrow_mut() = first;
        fired
    });
    let not_returned = asked.elapsed();
    let labels = seen.into_inner();
    assert_eq!(labels["node"], lost.as_str(), "{labels}");
    assert_eq!(labels["policy"], policy.as_str(), "{labels}");
    assert_eq!(labels["severity"], "critical");
    // Written off: the node is deleted, its slot freed, the alert resolves.
    let deleted = Instant::now();
    block_on(async {
        Api::<Node>::all(env.client.clone())
            .delete(lost, &DeleteParams::default())
            .await
            .expect("deleting the lost node");
    });
    block_on(wait_for(
        "NodekeeperNodeNotReturned resolved",
        LONG,
        || async {
            (prometheus.state("NodekeeperNodeNotReturned").as_deref() == Some("inactive"))
                .then_some(())
        },
    ));
    let written_off = deleted.elapsed();
    // Every panel of the shipped dashboard is a query Prometheus accepts.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("image/monitoring/grafana-dashboard.json"),
        )
        .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    assert!(panels.len() >= 10, "{dashboard}");
    for panel in &panels {
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            let answer = prometheus.api(&format!("/api/v1/query?query={}", encode(expr)));
            assert!(
                answer.as_ref().is_some_and(|a| a["status"] == "success"),
                "panel {}: {expr}: {answer:?}",
                panel["title"]
            );
        }
    }
    eprintln!(
        "alerts: DrainStuck fired {} ms after the NodeMaintenance (2 s deadline), resolved {} ms after the PDB went; NodeNotReturned fired {} ms after the reboot was asked (10 s deadline), resolved {} ms after the node was deleted",
        fired.as_millis(),
        resolved.as_millis(),
        not_returned.as_millis(),
        written_off.as_millis()
    );
    assert!(
        !cluster.log_text().contains("panicked"),
        "{}\n{}",
        cluster.log_text(),
        prometheus.log()
    );
}

/// kured's Prometheus gate (`gates.prometheus`): a node needing a reboot
/// waits with reason Alert, naming the alert, while a matching alert fires
/// in a real Prometheus, and is rebooted once the gate ignores it; an https
/// URL is refused by the schema.
#[test]
fn a_prometheus_gate_holds_reboots_while_a_matching_alert_fires() {
    install_crds();
    let prometheus = Prometheus::start_with(
        &[],
        "groups: [{name: test, rules: [{alert: NodekeeperTestAlways, expr: vector(1)}]}]\n",
    );
    block_on(wait_for("the test alert firing", LONG, || async {
        prometheus.firing("NodekeeperTestAlways").into_iter().next()
    }));
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("alertgate").await;
        let names = nodes(&mut env, 2).await;
        let fleet = Fleet::new(env.client.clone(), None);
        (env, names, fleet)
    });
    let a = &names[0];
    let url = format!("http://127.0.0.1:{}", prometheus.port);

    // The schema refuses what nodekeeper cannot ask.
    let refused = block_on(async {
        let mut p = serde_json::to_value(nodekeeper::api::reboot::RebootPolicy::new(
            &format!("{}-https", env.id),
            serde_json::from_value(json!({"gates": {"prometheus": {"url": "https://p:9090"}}}))
                .expect("spec"),
        ))
        .expect("json");
        p["spec"]["nodeSelector"] = json!({"matchLabels": {"none": "none"}});
        let p: nodekeeper::api::reboot::RebootPolicy = serde_json::from_value(p).expect("policy");
        Api::<nodekeeper::api::reboot::RebootPolicy>::all(env.client.clone())
            .create(&PostParams::default(), &p)
            .await
            .expect_err("refused")
            .to_string()
    });
    assert!(
        refused.contains("gates.prometheus.url must be an http:// URL"),
        "{refused}"
    );

    let policy = block_on(create_policy(
        &env,
        &fleet,
        json!({"gates": {"prometheus": {"url": url, "alerts": "NodekeeperTest.*", "firingOnly": true}}}),
    ));
    let _cluster = cluster_role(&env, &[]);
    block_on(annotate(
        &env.client,
        a,
        "nodekeeper.io/reboot-needed",
        Some("now"),
    ));
    let message = block_on(wait_phase(
        &env.client,
        &policy,
        a,
        nodekeeper::api::reboot::RebootPhase::Waiting,
    ));
    // Until Prometheus has answered once, the gate holds the node saying
    // it cannot tell (reason Alert too); under load that can be the first
    // status written, so wait for the one naming the alert.
    let named = "alert NodekeeperTestAlways active in Prometheus";
    let deadline = std::time::Instant::now() + LONG;
    let mut last = String::from("no entry for the node");
    loop {
        let entry = block_on(async {
            let p = Api::<nodekeeper::api::reboot::RebootPolicy>::all(env.client.clone())
                .get(&policy)
                .await
                .ok()?;
            p.status?.nodes.into_iter().find(|e| e.name == *a)
        });
        if let Some(e) = entry {
            let said = e.message.unwrap_or_default();
            if e.reason.as_deref() == Some("Alert") && said.contains(named) {
                break;
            }
            last = format!("{:?}: {said}", e.reason);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node never waited on the alert by name within {LONG:?}; last: {last} (first: {message})"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(fleet.commands(a), 0, "no reboot while the alert fires");

    // The gate ignores it now: the node is admitted and rebooted once.
    block_on(async {
        let patch =
            json!({"spec": {"gates": {"prometheus": {"ignoreAlerts": "NodekeeperTestAlways"}}}});
        Api::<nodekeeper::api::reboot::RebootPolicy>::all(env.client.clone())
            .patch(
                &policy,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .expect("patch the gate");
    });
    fleet.serve(&names[..1], LONG, || {
        block_on(settled(&env.client, &names[..1]))
    });
    assert_eq!(fleet.commands(a), 1);
}
