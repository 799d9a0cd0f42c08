//! The client's transport against the real API server: HTTP/2 negotiated
//! by ALPN, so watches and every eviction share one multiplexed connection;
//! and HTTP/1.1 still works with a server that does not offer h2.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::client::Body;
use nodekeeper::service::connect;
use support::block_on;

async fn version_of(kubeconfig: &std::path::Path) -> (hyper::Version, u16) {
    let client = match connect::connect(Some(kubeconfig)).await {
        Ok(c) => c,
        Err(e) => panic!("connecting with {}: {e}", kubeconfig.display()),
    };
    let req = hyper::Request::get("/version")
        .body(Body::empty())
        .expect("a request");
    let res = client.send(req).await.expect("GET /version");
    (res.version(), res.status().as_u16())
}

#[test]
fn the_client_speaks_http2_to_the_api_server() {
    let (version, status) = block_on(version_of(support::cluster()));
    assert_eq!(status, 200);
    assert_eq!(version, hyper::Version::HTTP_2, "negotiated {version:?}");
}

/// The agent says which protocol it talks and sizes its drains by it.
#[test]
fn the_agent_drains_over_http2_by_default_and_over_http1_when_told() {
    support::install_crds();
    let mut env = block_on(support::TestEnv::new("h2agent"));
    let node = block_on(env.add_node("a"));
    for (args, says) in [
        (
            vec![],
            "talking HTTP/2 to the API server; up to 110 evictions in flight",
        ),
        (
            vec!["--http1-only"],
            "talking HTTP/1.1 to the API server; up to 32 evictions in flight",
        ),
    ] {
        let mut all = vec!["run", "--node", node.as_str()];
        all.extend(args);
        let agent = support::Agent::start(&all);
        block_on(support::wait_for(
            &format!("the agent to log {says:?}"),
            Duration::from_secs(30),
            || async { agent.log_text().contains(says).then_some(()) },
        ));
    }
}

/// `openssl s_server` offering only http/1.1, answering every request.
struct Http1Server(Child);

impl Drop for Http1Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_client_falls_back_to_http1_when_the_server_offers_no_h2() {
    let dir = support::scratch().join(format!("nk-h1-{:x}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A CA and a leaf for 127.0.0.1 (webpki refuses a CA as the server's
    // own certificate).
    let (ca_key, ca) = (dir.join("ca-key.pem"), dir.join("ca.pem"));
    let (key, csr, cert) = (
        dir.join("key.pem"),
        dir.join("csr.pem"),
        dir.join("cert.pem"),
    );
    let ext = dir.join("ext.cnf");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("writing the extensions");
    let openssl = |args: &[&std::ffi::OsStr]| {
        let ok = Command::new("openssl")
            .args(args)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "openssl {args:?} failed");
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    openssl(&[
        os("req"),
        os("-x509"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-days"),
        os("1"),
        os("-subj"),
        os("/CN=test-ca"),
        os("-keyout"),
        ca_key.as_os_str(),
        os("-out"),
        ca.as_os_str(),
    ]);
    openssl(&[
        os("req"),
        os("-new"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-subj"),
        os("/CN=127.0.0.1"),
        os("-keyout"),
        key.as_os_str(),
        os("-out"),
        csr.as_os_str(),
    ]);
    openssl(&[
        os("x509"),
        os("-req"),
        os("-in"),
        csr.as_os_str(),
        os("-CA"),
        ca.as_os_str(),
        os("-CAkey"),
        ca_key.as_os_str(),
        os("-CAcreateserial"),
        os("-days"),
        os("1"),
        os("-extfile"),
        ext.as_os_str(),
        os("-out"),
        cert.as_os_str(),
    ]);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").port()
    };
    let mut child = Command::new("openssl")
        .args(["s_server", "-www", "-alpn", "http/1.1", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-key")
        .arg(&key)
        .arg("-cert")
        .arg(&cert)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting openssl s_server");
    // It prints ACCEPT once it listens.
    let out = child.stdout.take().expect("s_server stdout");
    let server = Http1Server(child);
    let mut lines = BufReader::new(out).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("ACCEPT"))),
        "openssl s_server did not start"
    );
    let pem = std::fs::read(&ca).expect("reading the CA");
    let kubeconfig = dir.join("kubeconfig");
    let ca = serde_json::to_value(k8s_openapi::ByteString(pem)).expect("base64");
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "h1", "cluster": {"server": format!("https://127.0.0.1:{port}"),
                                                 "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "h1", "user": "u"}}],
        "current-context": "c"
    });
    std::fs::write(&kubeconfig, doc.to_string()).expect("writing the kubeconfig");
    // s_server answers with a status page, not Kubernetes JSON: connect()
    // fails its version check, so send the request on a bare client.
    let client = {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
        let config = block_on(kube::Config::from_custom_kubeconfig(
            kc,
            &kube::config::KubeConfigOptions::default(),
        ))
        .expect("config");
        block_on(async { connect::client(config, connect::Transport::Http2) }).expect("client")
    };
    let (version, status) = block_on(async {
        let req = hyper::Request::get("/")
            .body(Body::empty())
            .expect("a request");
        let res = nodekeeper::runtime::timeout(Duration::from_secs(10), client.send(req))
            .await
            .expect("an answer within 10 s")
            .expect("GET /");
        (res.version(), res.status().as_u16())
    });
    drop(server);
    assert_eq!(status, 200);
    assert!(
        matches!(version, hyper::Version::HTTP_10 | hyper::Version::HTTP_11),
        "negotiated {version:?}"
    );
}
