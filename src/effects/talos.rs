//! Talos's machine API, the way a node agent on Talos reboots and upgrades
//! its node: Talos has no shell, no systemd and no `systemctl`, so where
//! other hosts run a command, nodekeeper calls machined over its unix
//! socket (the extension service mounts it; `run --talos-socket`). One gRPC
//! call per connection, on the HTTP/2 client the binary already has for the
//! API server (hyper), with the wire format of [`super::talos_wire`].
//!
//! The calls and their order (facts: `../shared/compat/talos.md`):
//! - reboot: `MachineService/Reboot`, default mode; machined answers, then
//!   reboots the node.
//! - upgrade on Talos 1.13+: `ImageService/Pull` (the upgrade installs only
//!   an image already in containerd's store), then `LifecycleService/Upgrade`,
//!   which streams the installer's output and ends with its exit code (the
//!   call succeeds either way); it does not reboot, so the reboot follows
//!   as its own step (the upgrade decision's, once per boot like any).
//! - upgrade before 1.13 (the node's osImage says which, so the decision
//!   knows before it acts): the old `MachineService/Upgrade`, not staged;
//!   machined installs and reboots by itself, and no reboot of ours
//!   follows (a second call could race machined's own; a staged upgrade
//!   reboots twice). A Talos that answers `UNIMPLEMENTED` where its osImage
//!   promised the new calls fails the upgrade with that said, rather than
//!   guessing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use smol::future::FutureExt;

use super::talos_wire::{self as wire, Progress, RebootMode};

/// Where machined serves the machine API on a Talos node.
pub const DEFAULT_SOCKET: &str = "/system/run/machined/machine.sock";
/// The role asked for, one per header as machined reads it: `os:admin` is
/// the one the upgrade calls need (and covers Reboot and Pull); from Talos
/// 1.13 machined grants processes of extension services (`ext-*`) every
/// role, before it trusted the header of anyone who reached the socket.
const ROLE: &str = "os:admin";
/// A gRPC answer larger than this is not one of machined's.
const BODY_LIMIT: usize = 4 << 20;

/// A call's answer: its messages, or one line saying why it failed.
type Answer = Result<Vec<Vec<u8>>, String>;

/// The client of one node's machined.
#[derive(Debug, Clone)]
pub struct Machined {
    pub socket: PathBuf,
    /// The actions this agent ran, with their results (see `Ran`).
    ran: Ran,
}

/// How many results [`Ran`] keeps: an agent runs a few actions per boot.
const RAN_KEPT: usize = 16;

/// The results of the actions this agent ran in its life, by the action's
/// id (its once-per-boot token). host-run's records do this for commands
/// on the host; a Talos action has no host record, so when a pass runs an
/// action again because its result's write to the node failed, it is
/// given the result instead of a second Pull and Upgrade. An agent that
/// restarts mid-call starts afresh, which is right: machined cancels a
/// call whose caller went away, and refuses a second upgrade while one
/// runs.
#[derive(Debug, Clone, Default)]
struct Ran(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<RanResult>>>);

/// One action's id and result.
type RanResult = (String, Result<String, String>);

impl Ran {
    fn get(&self, id: &str) -> Option<Result<String, String>> {
        let ran = self.0.lock().ok()?;
        ran.iter().find(|(i, _)| i == id).map(|(_, r)| r.clone())
    }

    fn put(&self, id: &str, result: &Result<String, String>) {
        if let Ok(mut ran) = self.0.lock() {
            if ran.len() >= RAN_KEPT {
                ran.pop_front();
            }
            ran.push_back((id.to_string(), result.clone()));
        }
    }
}

impl Machined {
    /// The client of the machined serving `socket`.
    pub fn new(socket: PathBuf) -> Machined {
        Machined {
            socket,
            ran: Ran::default(),
        }
    }

    /// Run the action `id` once in this agent's life: a second run of the
    /// same id is given the first one's result (see `Ran`).
    pub async fn once<F>(&self, id: &str, action: F) -> Result<String, String>
    where
        F: std::future::Future<Output = Result<String, String>>,
    {
        if let Some(result) = self.ran.get(id) {
            log::info!("Talos action {id} ran before in this agent's life: its result again");
            return result;
        }
        let result = action.await;
        self.ran.put(id, &result);
        result
    }

    /// Whether the socket is there (the agent's command check, and what
    /// `reboot.method: Auto` is told by the node agent).
    pub fn reachable(&self) -> Result<(), String> {
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata(&self.socket) {
            Ok(m) if m.file_type().is_socket() => Ok(()),
            Ok(_) => Err(format!(
                "{} is not a socket: is machined's socket mounted into the extension service?",
                self.socket.display()
            )),
            Err(e) => Err(format!(
                "Talos's machine API socket {}: {e} (mount it into the extension service, or set --talos-socket)",
                self.socket.display()
            )),
        }
    }

    /// `MachineService/Reboot`: machined answers, then reboots the node.
    pub async fn reboot(&self, limit: Duration) -> Result<(), String> {
        self.call(
            wire::REBOOT,
            wire::reboot_request(RebootMode::Default),
            limit,
        )
        .await
        .map(drop)
        .map_err(|e| format!("Talos Reboot: {e}"))
    }

    /// Upgrade to `image`. Talos 1.13+ (`legacy` false): pull it
    /// (`ImageService/Pull`), install it (`LifecycleService/Upgrade`, which
    /// does not reboot), and `Ok` carries the installer's last line; the
    /// reboot is the caller's next step. Before 1.13: the old
    /// `MachineService/Upgrade`, after which machined reboots by itself.
    pub async fn upgrade(
        &self,
        image: &str,
        legacy: bool,
        limit: Duration,
    ) -> Result<String, String> {
        let started = std::time::Instant::now();
        let rest = || limit.saturating_sub(started.elapsed());
        if legacy {
            return self
                .call(
                    wire::LEGACY_UPGRADE,
                    wire::legacy_upgrade_request(image),
                    rest(),
                )
                .await
                .map(|_| format!("machined installs {image} and reboots"))
                .map_err(|e| format!("Talos MachineService/Upgrade: {e}"));
        }
        let newer = |e: String| {
            if e.starts_with("UNIMPLEMENTED") {
                format!(
                    "{e}: this Talos has no such service, though its osImage names 1.13 or later"
                )
            } else {
                e
            }
        };
        let pulled = self
            .call(wire::IMAGE_PULL, wire::image_pull_request(image), rest())
            .await
            .map_err(|e| format!("Talos ImageService/Pull of {image}: {}", newer(e)))?;
        let mut name = image.to_string();
        for m in &pulled {
            if let Some(n) =
                wire::pulled_name(m).map_err(|e| format!("Talos ImageService/Pull: {e}"))?
            {
                name = n;
            }
        }
        loop {
            let answer = self
                .call(
                    wire::LIFECYCLE_UPGRADE,
                    wire::lifecycle_upgrade_request(&name),
                    rest(),
                )
                .await;
            // machined runs one install at a time and refuses another
            // meanwhile. The one running is ours from before a restart of
            // this agent (it runs on its caller's call, so it is being
            // cancelled) or a person's talosctl: wait for it rather than
            // fail the node (where-features-meet.md finding 8).
            match answer {
                Err(e) if busy(&e) && rest() > BUSY_POLL => {
                    log::info!("Talos upgrade to {name}: machined is busy ({e}); waiting");
                    crate::runtime::sleep(BUSY_POLL).await;
                }
                Err(e) => {
                    return Err(format!(
                        "Talos LifecycleService/Upgrade to {name}: {}",
                        newer(e)
                    ));
                }
                Ok(messages) => return lifecycle_outcome(&messages),
            }
        }
    }

    /// One gRPC call with one request message, bounded by `limit`.
    async fn call(&self, path: &str, request: Vec<u8>, limit: Duration) -> Answer {
        let socket = self.socket.clone();
        let path = path.to_string();
        let call = async move { call(&socket, &path, request).await };
        call.or(async {
            smol::Timer::after(limit).await;
            Err(format!(
                "DEADLINE_EXCEEDED: no answer in {}s",
                limit.as_secs()
            ))
        })
        .await
    }
}

/// How often a busy machined is asked again.
const BUSY_POLL: Duration = Duration::from_secs(2);

/// machined's refusal while another install or upgrade runs
/// (`internal/app/lifecycle/lifecycle.go`, `Service.Upgrade`).
fn busy(error: &str) -> bool {
    error.starts_with("FAILED_PRECONDITION") && error.contains("already in progress")
}

/// The end of a LifecycleService/Upgrade stream: its exit code decides
/// (the call itself succeeds either way); no exit code is a failure too.
fn lifecycle_outcome(messages: &[Vec<u8>]) -> Result<String, String> {
    let mut last = String::new();
    for m in messages {
        match wire::upgrade_progress(m).map_err(|e| format!("an upgrade progress message: {e}"))? {
            Some(Progress::Message(text)) => {
                log::info!("Talos upgrade: {text}");
                last = text;
            }
            Some(Progress::Exit(0)) => return Ok(last),
            Some(Progress::Exit(code)) => {
                return Err(format!("Talos upgrade exited {code}: {last}"));
            }
            None => {}
        }
    }
    Err(format!(
        "Talos LifecycleService/Upgrade ended without an exit code{}",
        if last.is_empty() {
            String::new()
        } else {
            format!(" after {last:?}")
        }
    ))
}

/// POST the framed request on a fresh HTTP/2 connection to the socket and
/// read the answer's messages and status (trailers, or the headers of a
/// trailers-only answer).
async fn call(socket: &Path, path: &str, request: Vec<u8>) -> Answer {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("UNAVAILABLE: {}: {e}", socket.display()))?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(crate::runtime::SmolExecutor, TokioIo::new(stream))
            .await
            .map_err(|e| format!("UNAVAILABLE: HTTP/2 with machined: {e}"))?;
    let driver = crate::runtime::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("HTTP/2 connection to machined: {e}");
        }
    });
    let req = hyper::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header(wire::ROLE_HEADER, ROLE)
        .body(kube::client::Body::from(wire::frame(&request)))
        .map_err(|e| format!("INTERNAL: a request for {path}: {e}"))?;
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("UNAVAILABLE: {path}: {e}"))?;
    let (parts, body) = res.into_parts();
    if parts.status != hyper::StatusCode::OK {
        return Err(format!("UNKNOWN: HTTP {} from machined", parts.status));
    }
    let (data, trailers) = read_body(body).await?;
    drop(driver);
    let field = |name: &str| {
        trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .or_else(|| parts.headers.get(name))
            .and_then(|v| v.to_str().ok())
    };
    wire::status(field("grpc-status"), field("grpc-message"))?;
    Ok(wire::unframe(&data)?
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect())
}

/// The body's bytes and its trailers.
async fn read_body(mut body: Incoming) -> Result<(Vec<u8>, Option<hyper::HeaderMap>), String> {
    let mut data = Vec::new();
    let mut trailers = None;
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        let frame = frame.map_err(|e| format!("UNAVAILABLE: machined's answer: {e}"))?;
        match frame.into_data() {
            Ok(chunk) => {
                data.extend_from_slice(&chunk);
                if data.len() > BODY_LIMIT {
                    return Err("RESOURCE_EXHAUSTED: machined's answer is over 4 MiB".into());
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    Ok((data, trailers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(inner: &[u8]) -> Vec<u8> {
        [&[0x0a, inner.len() as u8][..], inner].concat()
    }

    #[test]
    fn an_upgrade_stream_is_judged_by_its_exit_code() {
        let text = progress(&[&[0x0a, 4][..], b"done"].concat());
        assert_eq!(
            lifecycle_outcome(&[text.clone(), progress(&[0x10, 0])]),
            Ok("done".into())
        );
        assert_eq!(
            lifecycle_outcome(&[text.clone(), progress(&[0x10, 3])]),
            Err("Talos upgrade exited 3: done".into())
        );
        assert!(lifecycle_outcome(&[text]).is_err_and(|e| e.contains("without an exit code")));
    }

    #[test]
    fn a_missing_socket_is_one_line_naming_the_flag() {
        let m = Machined::new("/nonexistent/machine.sock".into());
        assert!(m.reachable().is_err_and(|e| e.contains("--talos-socket")));
    }
}
