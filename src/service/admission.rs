//! The opt-in validating webhook for NodeMaintenance (`run
//! --admission-address`): NMO's refusals at create time, without NMO's
//! certificate pain. nodekeeper generates its own CA and serving
//! certificate at start (in memory: nothing to mount, nothing to leak),
//! writes the CA into its own ValidatingWebhookConfiguration's caBundle
//! (the only object it may modify for this), and replaces both after two
//! thirds of their life.
//!
//! Every serving instance (one per control-plane node for the static pod
//! and host service, whose configuration points at
//! `https://127.0.0.1:PORT`) shares that caBundle: each replaces only its
//! own CA, and expired ones of others go ([`admission::merge_bundle`]).
//! The decisions are in `decide::admission`; this module is the TLS
//! server, the reads a review needs, and the caBundle writer. It needs no
//! store and no leadership, so a standby replica and a starting agent
//! answer as well.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::node::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};
use smol::io::{AsyncReadExt, AsyncWriteExt};
use smol::net::TcpListener;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::decide::admission::{self, Owned};
use crate::error::{Error, Result};

/// Issuing, publishing and rotating the CA and serving certificate.
mod certs;
use certs::{issue, publish, rotate};

/// The ValidatingWebhookConfiguration nodekeeper writes the caBundle of
/// (`nodekeeper manifests --for webhook` creates it).
pub const CONFIGURATION: &str = "nodekeeper";
/// The webhook's name inside it (what `kubectl` names in a refusal).
pub const WEBHOOK: &str = "nodemaintenance.nodekeeper.io";
/// The path the API server posts AdmissionReviews to.
pub const PATH: &str = "/validate-nodemaintenance";
/// The default port (`--admission-address :9443`).
pub const DEFAULT_PORT: u16 = 9443;
/// Bounds on one request.
const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 3 * 1024 * 1024;
const IDLE: Duration = Duration::from_secs(90);
/// Connections served at once; more are closed as they arrive. The API
/// servers keep a few alive each; without a bound, anyone who can reach
/// the port could hold any number (each up to `MAX_BODY` for `IDLE`
/// per read) and make the agent read the cluster for each.
pub const MAX_CONNECTIONS: usize = 64;

/// `run --admission-*`, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub address: SocketAddr,
    /// `--admission-service`: (namespace, name).
    pub service: Option<(String, String)>,
    pub quorum_check: bool,
    /// `--admission-client-ca`: the CAs whose client certificates may ask
    /// for a review (the API server's); `None` on loopback only.
    pub client_ca: Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// Who we are in the caBundle's owner list.
    pub identity: String,
}

impl Config {
    pub fn parse(
        address: &str,
        service: Option<&str>,
        quorum_check: bool,
        client_ca: Option<&std::path::Path>,
        identity: String,
    ) -> Result<Config> {
        let full = if address.starts_with(':') {
            format!("0.0.0.0{address}")
        } else {
            address.to_string()
        };
        let address: SocketAddr = full.parse().map_err(|_| {
            Error::Invalid(format!(
                "--admission-address {address:?} is not HOST:PORT or :PORT (e.g. 127.0.0.1:{DEFAULT_PORT})"
            ))
        })?;
        let service = match service {
            None => None,
            Some(s) => match s.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    Some((ns.to_string(), name.to_string()))
                }
                _ => {
                    return Err(Error::Invalid(format!(
                        "--admission-service {s:?} is not NAMESPACE/NAME"
                    )));
                }
            },
        };
        let client_ca = client_ca.map(read_client_ca).transpose()?;
        // A review reads the cluster on its caller's behalf: anyone who can
        // reach a non-loopback port could make this identity read nodes
        // and maintenances, and learn the answers. Only the API server
        // may ask, proven by its webhook client certificate.
        if client_ca.is_none() && !address.ip().is_loopback() {
            return Err(Error::Invalid(format!(
                "--admission-address {address} is not a loopback address: give --admission-client-ca FILE, the CA of the client certificate the API server presents to webhooks (its AdmissionConfiguration's kubeConfigFile; see the README's Admission), so that only the API server is answered"
            )));
        }
        Ok(Config {
            address,
            service,
            quorum_check,
            client_ca,
            identity,
        })
    }

    /// The names the serving certificate carries: loopback (URL
    /// configurations) and the Service's DNS names, if any.
    fn names(&self) -> Vec<String> {
        let mut names = vec!["localhost".to_string()];
        if let Some((ns, name)) = &self.service {
            names.push(format!("{name}.{ns}.svc"));
            names.push(format!("{name}.{ns}.svc.cluster.local"));
        }
        names
    }
}

/// The certificates of `--admission-client-ca FILE` (PEM, one or more).
fn read_client_ca(
    path: &std::path::Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path)
        .map_err(|e| Error::Invalid(format!("--admission-client-ca {}: {e}", path.display())))?;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Invalid(format!("--admission-client-ca {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Invalid(format!(
            "--admission-client-ca {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// What the server and the caBundle writer share.
struct State {
    config: Config,
    client: Client,
    /// The TLS configuration new connections get.
    serving: Mutex<Arc<rustls::ServerConfig>>,
    /// Our CAs for the caBundle, newest first.
    mine: Mutex<Vec<(String, Owned)>>,
    /// Wakes the caBundle writer when `mine` changed.
    kick: smol::channel::Sender<()>,
}

use crate::runtime::lock;

/// A serving webhook: what [`Webhook::withdraw`] needs at shutdown.
pub struct Webhook {
    state: Arc<State>,
}

impl Webhook {
    /// Take our CAs out of the caBundle as we stop. An instance's CA
    /// otherwise stayed until it expired (30 days), and a Deployment's
    /// replicas are a new identity with every pod, so each rollout left
    /// one more CA behind. A crash still leaves it, for its lifetime.
    pub async fn withdraw(&self) {
        lock(&self.state.mine).clear();
        match crate::runtime::timeout(WITHDRAW_LIMIT, certs::withdraw(&self.state)).await {
            Ok(Ok(true)) => {
                log::info!("admission: our CA is out of the caBundle of {CONFIGURATION}")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => log::warn!(
                "admission: {e}; our CA stays in the caBundle of {CONFIGURATION} until it expires"
            ),
            Err(()) => log::warn!(
                "admission: no answer within {} s; our CA stays in the caBundle of {CONFIGURATION} until it expires",
                WITHDRAW_LIMIT.as_secs()
            ),
        }
    }
}

/// How long a stopping instance tries to take its CA out of the bundle.
const WITHDRAW_LIMIT: Duration = Duration::from_secs(5);

/// Bind now (a taken port is a start-up error), then serve, keep the
/// caBundle and rotate in the background for the life of the process.
pub async fn serve(config: Config, client: Client) -> Result<(SocketAddr, Webhook)> {
    let issued = issue(&config, Timestamp::now())?;
    let listener = TcpListener::bind(config.address)
        .await
        .map_err(Error::io(format!(
            "binding the admission address {}",
            config.address
        )))?;
    let bound = listener
        .local_addr()
        .map_err(Error::io("reading the admission address"))?;
    log::info!(
        "admission: serving the NodeMaintenance webhook on https://{bound}{PATH} (CA valid until {})",
        issued.not_after
    );
    let (kick, kicked) = smol::channel::bounded(1);
    let state = Arc::new(State {
        config,
        client,
        serving: Mutex::new(issued.tls.clone()),
        mine: Mutex::new(vec![(issued.ca_pem.clone(), issued.owned.clone())]),
        kick,
    });
    crate::runtime::spawn(accept(listener, state.clone())).detach();
    crate::runtime::spawn(publish(state.clone(), kicked)).detach();
    crate::runtime::spawn(rotate(state.clone(), issued.not_before, issued.not_after)).detach();
    Ok((bound, Webhook { state }))
}

/// One of [`MAX_CONNECTIONS`], given back when its connection ends.
struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn accept(listener: TcpListener, state: Arc<State>) {
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut warned = false;
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                if open.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= MAX_CONNECTIONS {
                    open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    let level = if warned {
                        log::Level::Debug
                    } else {
                        log::Level::Warn
                    };
                    warned = true;
                    log::log!(
                        level,
                        "admission: {MAX_CONNECTIONS} connections open; closing the one from {peer}"
                    );
                    drop(tcp);
                    continue;
                }
                let slot = Slot(open.clone());
                let state = state.clone();
                crate::runtime::spawn(async move {
                    let _slot = slot;
                    let tls = lock(&state.serving).clone();
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    let handshake = crate::runtime::timeout(
                        Duration::from_secs(10),
                        acceptor.accept(async_compat::Compat::new(tcp)),
                    )
                    .await;
                    match handshake {
                        Ok(Ok(conn)) => {
                            if let Err(e) =
                                connection(async_compat::Compat::new(conn), &state).await
                            {
                                log::debug!("admission: connection from {peer}: {e}");
                            }
                        }
                        Ok(Err(e)) => log::debug!("admission: TLS handshake with {peer}: {e}"),
                        Err(()) => log::debug!("admission: TLS handshake with {peer} timed out"),
                    }
                })
                .detach();
            }
            Err(e) => {
                log::warn!("admission: accept failed: {e}");
                crate::runtime::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One HTTP/1.1 connection: requests in turn (the API server keeps it
/// alive), each answered with a Content-Length.
async fn connection<S>(mut conn: S, state: &State) -> std::io::Result<()>
where
    S: smol::io::AsyncRead + smol::io::AsyncWrite + Unpin,
{
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() > MAX_HEAD {
                return respond(
                    &mut conn,
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    b"",
                )
                .await;
            }
            match crate::runtime::timeout(IDLE, conn.read(&mut chunk)).await {
                Ok(Ok(0)) | Err(()) => return Ok(()),
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(e),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.lines();
        let mut words = lines.next().unwrap_or("").split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let mut length = 0usize;
        let mut close = false;
        for line in lines {
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    length = v.parse().unwrap_or(usize::MAX);
                } else if k == "connection" && v.eq_ignore_ascii_case("close") {
                    close = true;
                } else if k == "transfer-encoding" {
                    // The API server always sends a length; anything else
                    // we cannot frame.
                    return respond(&mut conn, "411 Length Required", "text/plain", b"").await;
                }
            }
        }
        if length > MAX_BODY {
            return respond(&mut conn, "413 Payload Too Large", "text/plain", b"").await;
        }
        while buf.len() < head_end + length {
            match crate::runtime::timeout(IDLE, conn.read(&mut chunk)).await {
                Ok(Ok(0)) | Err(()) => return Ok(()),
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(e),
            }
        }
        let body: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
        let path = path.split('?').next().unwrap_or("");
        if method == "POST" && path == PATH {
            let answer = review(state, &body).await;
            respond(
                &mut conn,
                "200 OK",
                "application/json",
                answer.to_string().as_bytes(),
            )
            .await?;
        } else {
            respond(
                &mut conn,
                "404 Not Found",
                "text/plain",
                format!("not found; POST {PATH}\n").as_bytes(),
            )
            .await?;
        }
        if close {
            return Ok(());
        }
    }
}

async fn respond<S>(conn: &mut S, status: &str, kind: &str, body: &[u8]) -> std::io::Result<()>
where
    S: smol::io::AsyncWrite + Unpin,
{
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body).await?;
    conn.flush().await
}

/// Answer one AdmissionReview. Anything we cannot read or look up is
/// allowed with a warning: the status path still fails a bad object, and a
/// webhook that refuses on its own errors would block every maintenance.
async fn review(state: &State, body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let request = &review["request"];
    let uid = request["uid"].clone();
    let api_version = review["apiVersion"]
        .as_str()
        .unwrap_or("admission.k8s.io/v1")
        .to_string();
    let verdict = if request["operation"] != "CREATE" {
        Ok(Ok(()))
    } else {
        match serde_json::from_value::<NodeMaintenance>(request["object"].clone()) {
            Ok(nm) => decide(state, &nm).await,
            Err(e) => Err(format!("cannot read the NodeMaintenance: {e}")),
        }
    };
    let response = match verdict {
        Ok(Ok(())) => json!({"uid": uid, "allowed": true}),
        Ok(Err(message)) => {
            log::info!(
                "admission: refused NodeMaintenance {}: {message}",
                request["name"].as_str().unwrap_or("?")
            );
            json!({"uid": uid, "allowed": false,
                   "status": {"code": 403, "reason": "Forbidden", "message": message}})
        }
        Err(why) => {
            log::warn!("admission: allowed without checking: {why}");
            json!({"uid": uid, "allowed": true,
                   "warnings": [format!("nodekeeper admitted this without its checks ({why}); a bad object fails in status")]})
        }
    };
    json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response})
}

/// Gather what the decision reads, fresh from the API server (creates are
/// rare; a consistent read beats a store that may lag by the object just
/// created before this one). `Err`: a read failed.
async fn decide(
    state: &State,
    nm: &NodeMaintenance,
) -> std::result::Result<std::result::Result<(), String>, String> {
    let client = &state.client;
    let node_name = &nm.spec.node_name;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = if crate::api::common::is_node_name(node_name) {
        nodes
            .get_opt(node_name)
            .await
            .map_err(|e| format!("reading node {node_name}: {}", crate::error::kube_cause(&e)))?
    } else {
        None
    };
    // Only the NodeMaintenances the decision reads: this node's, and for
    // the quorum check the other control-plane nodes'.
    let mut existing: Vec<Arc<NodeMaintenance>> = match &node {
        Some(_) => maintenances_on(client, node_name).await?,
        None => Vec::new(),
    };
    let control_plane = match &node {
        Some(n) if state.config.quorum_check && admission::is_control_plane(n) => {
            nodes
                .list(&ListParams::default().labels(admission::CONTROL_PLANE_LABEL))
                .await
                .map_err(|e| {
                    format!(
                        "listing control-plane nodes: {}",
                        crate::error::kube_cause(&e)
                    )
                })?
                .items
        }
        _ => Vec::new(),
    };
    for n in &control_plane {
        let other = kube::ResourceExt::name_any(n);
        if other != *node_name {
            existing.extend(maintenances_on(client, &other).await?);
        }
    }
    let owner_live = match crate::decide::maintenance::owner_of(nm) {
        Some(kind) => owner_is_live(client, nm, kind).await?,
        None => false,
    };
    Ok(admission::review(&admission::Request {
        nm,
        node: node.as_ref(),
        control_plane: &control_plane,
        existing: &existing,
        quorum_check: state.config.quorum_check,
        owner_live,
    }))
}

/// Whether `nm`'s owner reference of `kind` (its owner label's value)
/// names a live object: one of nodekeeper's owner kinds at the version it
/// writes, a valid name, the same uid, not being deleted. Anything else
/// (a label set by hand) gets the administrator's checks.
async fn owner_is_live(
    client: &kube::Client,
    nm: &NodeMaintenance,
    kind: &str,
) -> std::result::Result<bool, String> {
    use kube::ResourceExt;
    let Some(owner) = nm.owner_references().iter().find(|o| o.kind == kind) else {
        return Ok(false);
    };
    if !crate::api::common::is_node_name(&owner.name) {
        return Ok(false);
    }
    async fn get<K>(client: &kube::Client, name: &str) -> kube::Result<Option<(String, bool)>>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Ok(Api::<K>::all(client.clone()).get_opt(name).await?.map(|o| {
            let meta = o.meta();
            (
                meta.uid.clone().unwrap_or_default(),
                meta.deletion_timestamp.is_some(),
            )
        }))
    }
    let (api_version, name) = (owner.api_version.as_str(), owner.name.as_str());
    let found = match (api_version, kind) {
        ("nodekeeper.io/v1alpha1", crate::api::reboot::OWNER_KIND) => {
            get::<crate::api::reboot::RebootPolicy>(client, name).await
        }
        ("nodekeeper.io/v1alpha1", crate::api::upgrade::OWNER_KIND) => {
            get::<crate::api::upgrade::UpgradePlan>(client, name).await
        }
        ("update.edgeless.systems/v1alpha1", "NodeVersion") => {
            get::<crate::api::constellation::NodeVersion>(client, name).await
        }
        _ => return Ok(false),
    };
    match found {
        Ok(Some((uid, deleting))) => Ok(uid == owner.uid && !deleting),
        Ok(None) => Ok(false),
        // Not served here, or this identity may not read it: no owner
        // vouches for the label, so the checks apply.
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => Ok(false),
        Err(e) => Err(format!(
            "reading the owner {kind} {name}: {}",
            crate::error::kube_cause(&e)
        )),
    }
}

/// The NodeMaintenances naming `node` (a node's name, so a safe field
/// selector), selected by the API server where the CRD declares
/// `spec.nodeName` selectable; a server that refuses the selector (older
/// CRDs or Kubernetes) is asked for all of them.
async fn maintenances_on(
    client: &kube::Client,
    node: &str,
) -> std::result::Result<Vec<Arc<NodeMaintenance>>, String> {
    let api = Api::<NodeMaintenance>::all(client.clone());
    let listed = match api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 400 => api.list(&ListParams::default()).await,
        other => other,
    };
    Ok(listed
        .map_err(|e| format!("listing NodeMaintenances: {}", crate::error::kube_cause(&e)))?
        .items
        .into_iter()
        .filter(|m| m.spec.node_name == node)
        .map(Arc::new)
        .collect())
}

#[cfg(test)]
mod tests;
