//! The HTTP side of `/metrics`, `/healthz` and `/readyz`: a few dozen
//! lines of HTTP/1.0 on smol's TCP listener rather than a web framework or
//! hyper's server. Three fixed GET routes do not justify a dependency tree,
//! and the static binary has under 100 KiB left of its 8 MiB budget.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::runtime::reflector::Store;
use smol::io::{AsyncReadExt, AsyncWriteExt};
use smol::net::{TcpListener, TcpStream};

use super::exposition::render;
use super::{LAST_PROGRESS_MS, READY, Stores, liveness, now_ms};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;
use crate::error::{Error, Result};

/// Bind now (so a taken port is a start-up error, not a silent gap in
/// monitoring) and serve in the background for the life of the process.
pub async fn serve(
    addr: SocketAddr,
    maintenances: Store<NodeMaintenance>,
    policies: Store<RebootPolicy>,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding the metrics address {addr}")))?;
    let bound = listener
        .local_addr()
        .map_err(Error::io("reading the metrics address"))?;
    log::info!("serving /metrics, /healthz and /readyz on http://{bound}");
    crate::runtime::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    let stores = (maintenances.clone(), policies.clone());
                    crate::runtime::spawn(async move {
                        // A client that never finishes its request must not
                        // hold a task forever.
                        let _ =
                            crate::runtime::timeout(Duration::from_secs(10), answer(conn, stores))
                                .await;
                    })
                    .detach();
                }
                Err(e) => {
                    log::warn!("metrics: accept failed: {e}");
                    crate::runtime::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
    .detach();
    Ok(bound)
}

async fn answer(mut conn: TcpStream, stores: Stores) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut chunk).await?;
        if n == 0 || buf.len() > 8192 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, body, kind) = route(method, path, &stores);
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        conn.write_all(body.as_bytes()).await?;
    }
    conn.flush().await
}

const TEXT: &str = "text/plain; charset=utf-8";
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) fn route(
    method: &str,
    path: &str,
    stores: &Stores,
) -> (&'static str, String, &'static str) {
    if method != "GET" && method != "HEAD" {
        return ("405 Method Not Allowed", "only GET\n".into(), TEXT);
    }
    match path {
        "/healthz" | "/livez" => {
            let now = now_ms();
            let verdict = liveness(now, LAST_PROGRESS_MS.load(Ordering::SeqCst))
                .and_then(|()| super::wedged_task(now).map_or(Ok(()), Err));
            match verdict {
                Ok(()) => ("200 OK", "ok\n".into(), TEXT),
                Err(why) => ("503 Service Unavailable", why, TEXT),
            }
        }
        "/readyz" if READY.load(Ordering::SeqCst) => ("200 OK", "ok\n".into(), TEXT),
        "/readyz" => (
            "503 Service Unavailable",
            "waiting for the first list of nodes, pods and NodeMaintenances\n".into(),
            TEXT,
        ),
        "/metrics" => ("200 OK", render(stores), PROMETHEUS),
        _ => (
            "404 Not Found",
            "not found; try /metrics, /healthz or /readyz\n".into(),
            TEXT,
        ),
    }
}
