//! Connecting to the API server: credentials from `--kubeconfig`, then
//! `KUBECONFIG`/`~/.kube/config`, then the pod's service account; and the
//! start-up checks that turn a misconfiguration into one clear line instead
//! of a retry loop (server unreachable, node unknown, CRDs missing).

use std::path::Path;
use std::time::Duration;

use crate::api::node::Node;
use kube::config::KubeConfigOptions;
use kube::{Api, Client, Config};

use crate::error::{Error, Result, first_line, kube_cause};
use crate::runtime::timeout;

/// The image's user and group (the distroless `nonroot` numbers): every
/// pod runs as it, and a static pod's host kubeconfig must be readable by
/// it (the manifests set it; the hint for an unreadable kubeconfig names it).
pub const IMAGE_USER: u32 = 65532;

/// How long to wait for the first answer before calling the server unreachable.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);

/// Which HTTP versions the client offers the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// `h2` and `http/1.1` by ALPN; the server chooses (HTTP/2 with
    /// kube-apiserver).
    #[default]
    Http2,
    /// `http/1.1` only (`run --http1-only`): for a proxy in front of the
    /// API server that mishandles HTTP/2, and for comparing in benchmarks.
    Http1Only,
}

/// Load credentials and prove the server answers, offering HTTP/2.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client> {
    connect_with(kubeconfig, Transport::Http2).await
}

/// For a kubeconfig that exists but cannot be read: who owns it, its mode,
/// and who we are, which is all it takes to see the mismatch.
fn access_hint(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return String::new();
    };
    if std::fs::File::open(path).is_ok() {
        return String::new();
    }
    let me = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let field = |name: &str| {
                s.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.split_whitespace().next().map(str::to_string))
            };
            Some(format!("{}:{}", field("Uid:")?, field("Gid:")?))
        })
        .unwrap_or_else(|| "?".into());
    format!(
        " (the file is {}:{} mode {:04o}, this process runs as {me}; for the static pod: host-kubeconfig NODE --out FILE --group {})",
        meta.uid(),
        meta.gid(),
        meta.mode() & 0o7777,
        IMAGE_USER
    )
}

/// [`connect`] with a chosen transport.
pub async fn connect_with(kubeconfig: Option<&Path>, transport: Transport) -> Result<Client> {
    Ok(connect_reporting(kubeconfig, transport).await?.0)
}

/// [`connect_with`], also saying whether the server chose HTTP/2 — read
/// from the answer to the one `GET /version` that proves it answers, so a
/// start costs no second request to find out.
pub async fn connect_reporting(
    kubeconfig: Option<&Path>,
    transport: Transport,
) -> Result<(Client, bool)> {
    let config = load(kubeconfig).await?;
    let server = config.cluster_url.to_string();
    let client = client(config, transport)?;
    if let Some(http2) = answered_version(&client).await {
        return Ok((client, http2));
    }
    // No answer, or not a 2xx: kube's own call turns it into one clear line
    // (refused credentials, unreachable), and if the server answers now
    // after all, asks once more which protocol it speaks.
    match timeout(REACH_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(info)) => {
            log::debug!("API server {server} is Kubernetes {}", info.git_version);
            let http2 = speaks_http2(&client).await;
            Ok((client, http2))
        }
        Ok(Err(kube::Error::Api(status))) if status.code == 401 || status.code == 403 => {
            Err(Error::NoCredentials(format!(
                "the API server at {server} refused our credentials: {}",
                status.message
            )))
        }
        Ok(Err(e)) => Err(Error::Unreachable {
            server,
            cause: kube_cause(&e),
        }),
        Err(()) => Err(Error::Unreachable {
            server,
            cause: format!("no answer within {} s", REACH_TIMEOUT.as_secs()),
        }),
    }
}

/// One `GET /version`: whether it was answered over HTTP/2, if it was
/// answered with success within [`REACH_TIMEOUT`].
async fn answered_version(client: &Client) -> Option<bool> {
    let req = hyper::Request::get("/version")
        .body(kube::client::Body::empty())
        .ok()?;
    match timeout(REACH_TIMEOUT, client.send(req)).await {
        Ok(Ok(res)) if res.status().is_success() => Some(res.version() == hyper::Version::HTTP_2),
        _ => None,
    }
}

/// What this process's requests say it is (`User-Agent`, which the API
/// server's audit log records beside each request), as client-go names a
/// program: name/version (os/arch), then the role — so an administrator
/// reading the audit log tells the node agents and the cluster role apart
/// though they may share a service account.
static USER_AGENT: std::sync::OnceLock<hyper::header::HeaderValue> = std::sync::OnceLock::new();

/// Say once, before the first client is built, which role this process
/// runs (`node <name>` or `cluster`); later calls change nothing.
pub fn introduce(role: &str) {
    let full = format!("{} {role}", program());
    if let Ok(value) = hyper::header::HeaderValue::from_str(&full) {
        let _ = USER_AGENT.set(value);
    }
}

fn program() -> String {
    format!(
        "nodekeeper/{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }
    )
}

fn user_agent() -> hyper::header::HeaderValue {
    USER_AGENT
        .get()
        .cloned()
        .or_else(|| hyper::header::HeaderValue::from_str(&program()).ok())
        .unwrap_or(hyper::header::HeaderValue::from_static("nodekeeper"))
}

/// The credentials and settings every client of this process is built
/// from ([`client`]), without talking to the server.
pub async fn load(kubeconfig: Option<&Path>) -> Result<Config> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = super::kubeconfig::read_from(path).map_err(|e| {
                Error::NoCredentials(format!(
                    "cannot read kubeconfig {}: {}{}",
                    path.display(),
                    first_line(&e),
                    access_hint(path)
                ))
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    Error::NoCredentials(format!(
                        "kubeconfig {}: {}",
                        path.display(),
                        first_line(&e.to_string())
                    ))
                })?
        }
        None => super::kubeconfig::infer().await.map_err(|e| {
            Error::NoCredentials(format!(
                "no usable kubeconfig ({}) and not running in a pod",
                first_line(&e)
            ))
        })?,
    };
    config
        .headers
        .push((hyper::header::USER_AGENT, user_agent()));
    // A dead address should fail in seconds, not hang on the OS's SYN retries.
    config.connect_timeout = Some(Duration::from_secs(5));
    // kube retries 429s inside the request (up to 15 times, backing off to
    // minutes). For an eviction a 429 is the PDB's answer, which the drain
    // must see at once to report the blocker and schedule its own retry;
    // other calls are retried by the reconcile loop.
    config.default_retry = false;
    Ok(config)
}

/// Did the API server choose HTTP/2 for `client`'s connection? (One
/// `GET /version`; `false` if it cannot tell.)
pub async fn speaks_http2(client: &Client) -> bool {
    answered_version(client).await.unwrap_or(false)
}

/// hyper's timer on smol's: HTTP/2 keep-alive pings need one.
#[derive(Clone, Copy)]
struct SmolTimer;

/// A smol timer as hyper's `Sleep`.
struct SmolSleep(smol::Timer);

impl std::future::Future for SmolSleep {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl hyper::rt::Sleep for SmolSleep {}

impl hyper::rt::Timer for SmolTimer {
    fn sleep(&self, d: std::time::Duration) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(SmolSleep(smol::Timer::after(d)))
    }

    fn sleep_until(&self, at: std::time::Instant) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(SmolSleep(smol::Timer::at(at)))
    }
}

/// How often an idle HTTP/2 connection is pinged, and how long an answer
/// may take. Everything shares one connection: a silently dead one (a load
/// balancer's failover, a NAT timeout) left every watch and write deaf
/// until the 295 s read timeout. client-go pings after 30 s idle too.
const KEEP_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// kube's client stack (base URI, auth, extra headers, timeouts) on a
/// connector that offers `h2` by ALPN and falls back to HTTP/1.1 when the
/// server does not choose it. kube-client 5 offers only `http/1.1`, so every
/// request in flight held a TLS connection of its own; over HTTP/2 one
/// connection multiplexes the watches and every eviction.
pub fn client(config: Config, transport: Transport) -> Result<Client> {
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    let tls_error = |e: kube::Error| Error::NoCredentials(kube_cause(&e));
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    // HTTP/2 writes a request as separate HEADERS and DATA frames; with
    // Nagle's algorithm on, the second waits for the peer's delayed ACK.
    // Measured with `just bench-drain`: a cordon (four sequential writes)
    // took 248 ms over HTTP/2 with Nagle, 28 ms over HTTP/1.1.
    http.set_nodelay(true);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config().map_err(tls_error)?)
        .https_or_http();
    if let Some(name) = config.tls_server_name.clone() {
        let name = name.try_into().map_err(|e| {
            Error::NoCredentials(format!("tls-server-name {:?}: {e}", config.tls_server_name))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = match transport {
        Transport::Http2 => https.enable_http1().enable_http2().wrap_connector(http),
        Transport::Http1Only => https.enable_http1().wrap_connector(http),
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let transport: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(crate::runtime::SmolExecutor)
            .timer(SmolTimer)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .build(connector);
    let service = ServiceBuilder::new()
        .map_response(|res: hyper::Response<hyper::body::Incoming>| res.map(FuseOnError::new))
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(tls_error)?)
        .layer(config.extra_headers_layer().map_err(tls_error)?)
        .layer_fn(super::read_again::ReadAgain)
        .layer_fn(super::requests::Counted)
        .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
        .service(transport);
    Ok(Client::new(service, config.default_namespace))
}

/// A response body that ends after its first error. Over HTTP/2 a body
/// whose connection died (a kube-apiserver restart) reports the error again
/// on every poll, and kube-runtime's watcher, which waits for a failed
/// watch stream to end before it re-watches, polled that one dead stream
/// forever: the loop stopped seeing changes. Over HTTP/1.1 the body ends by
/// itself after an error; this gives HTTP/2 bodies the same shape.
pub struct FuseOnError<B> {
    inner: B,
    failed: bool,
}

impl<B> FuseOnError<B> {
    pub fn new(inner: B) -> Self {
        FuseOnError {
            inner,
            failed: false,
        }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for FuseOnError<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<hyper::body::Frame<B::Data>, B::Error>>> {
        if self.failed {
            return std::task::Poll::Ready(None);
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(Some(Err(_)))) {
            self.failed = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Fail unless the named node exists (each read given 10 s to answer).
pub async fn require_node(client: &Client, name: &str) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let read = || async {
        timeout(REACH_TIMEOUT, nodes.get_opt(name))
            .await
            .unwrap_or_else(|()| Err(no_answer()))
    };
    patiently(&format!("reading node {name}"), read)
        .await
        .map_err(Error::kube(format!("reading node {name}")))?
        .ok_or_else(|| Error::NodeNotFound(name.to_string()))
}

/// How long the start-up checks ask again while the API server answers
/// "not now" before giving up: 429 (priority and fairness; or the watch
/// cache of a resource whose CRD was created a moment ago, "storage is
/// (re)initializing", as when the CRDs and the agents are applied
/// together) and 5xx (a server starting or failing over).
const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// `ask` again, for at most a minute, while the API server answers "not
/// now", waiting what its Retry-After says (1–5 s). Every read is already
/// asked again while a `Retry-After` says so, ten times
/// ([`super::read_again`]); a start-up check is more patient than that —
/// a 5xx without the header too (a server starting or failing over), for
/// a minute — because one failed check ends the start.
pub async fn patiently<T, F>(
    what: &str,
    mut ask: impl FnMut() -> F,
) -> std::result::Result<T, kube::Error>
where
    F: std::future::Future<Output = std::result::Result<T, kube::Error>>,
{
    let deadline = std::time::Instant::now() + STARTUP_PATIENCE;
    loop {
        let answer = ask().await;
        let Err(kube::Error::Api(s)) = &answer else {
            return answer;
        };
        match again_after(what, s, deadline) {
            Some(wait) => smol::Timer::after(wait).await,
            None => return answer,
        };
    }
}

/// How long [`patiently`] waits before asking again after `s`, if it asks
/// again (said in the log); apart from it so each caller's copy of the
/// generic loop stays small.
fn again_after(
    what: &str,
    s: &kube::core::Status,
    deadline: std::time::Instant,
) -> Option<Duration> {
    if !(s.code == 429 || s.code >= 500) || std::time::Instant::now() >= deadline {
        return None;
    }
    let wait = s
        .details
        .as_ref()
        .map_or(1, |d| d.retry_after_seconds)
        .clamp(1, 5);
    log::info!(
        "{what}: the API server answered {} ({}); asking again in {wait} s",
        s.code,
        first_line(&s.message)
    );
    Some(Duration::from_secs(wait.into()))
}

/// A request that got no answer within [`REACH_TIMEOUT`].
fn no_answer() -> kube::Error {
    kube::Error::Service(format!("no answer within {} s", REACH_TIMEOUT.as_secs()).into())
}

/// The node role's client for its own pod watch, HTTP/1.1 only (why:
/// `service::Clients`), proven by reading the node through it: that first
/// answer shows the path works, so it costs no `GET /version` of its own.
pub async fn http1_reading_node(kubeconfig: Option<&Path>, name: &str) -> Result<Client> {
    let client = client(load(kubeconfig).await?, Transport::Http1Only)?;
    require_node(&client, name).await.map(|_| client)
}

/// Whether the API server serves the EvictionRequest API (KEP-4563,
/// `lifecycle.k8s.io/v1alpha1`, alpha behind a gate in 1.37). Detected
/// and said once; nodekeeper does not use it yet: no release ships the
/// controller that turns a request into an eviction, so a drain evicts
/// through the Eviction API as `kubectl drain` does. One discovery
/// request, which every authenticated identity may make.
pub async fn eviction_requests_served(client: &Client) -> bool {
    client
        .list_api_group_resources("lifecycle.k8s.io/v1alpha1")
        .await
        .is_ok_and(|l| l.resources.iter().any(|r| r.name == "evictionrequests"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<u32>) -> kube::Error {
        let mut s = kube::core::Status::failure("storage is (re)initializing", "TooManyRequests")
            .with_code(code);
        s.details = retry_after.and_then(|r| {
            serde_json::from_value(serde_json::json!({ "retryAfterSeconds": r })).ok()
        });
        kube::Error::Api(s.boxed())
    }

    /// A busy answer is asked again after its Retry-After; a definite one
    /// (404: not served, 403: not allowed) is the answer at once.
    #[test]
    fn start_up_checks_ask_again_only_while_the_server_says_not_now() {
        let mut answers = vec![Ok(7), Err(status(503, None)), Err(status(429, Some(1)))];
        let started = std::time::Instant::now();
        let got = crate::runtime::block_on(patiently("test", || {
            let next = answers.pop().unwrap_or(Ok(0));
            async move { next }
        }));
        assert_eq!(got.ok(), Some(7));
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "waited each time"
        );
        for code in [404, 403] {
            let mut asked = 0;
            let got = crate::runtime::block_on(patiently("test", || {
                asked += 1;
                async move { Err::<(), _>(status(code, Some(1))) }
            }));
            assert!(matches!(got, Err(kube::Error::Api(s)) if s.code == code));
            assert_eq!(asked, 1, "{code} asked once");
        }
    }
}
