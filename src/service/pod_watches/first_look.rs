//! A node's pod watch that starts from the API server's cache: its first
//! list and its watch in one request (`sendInitialEvents`), or a list from
//! the cache and a watch where the server does not stream; looked at again
//! from the cache after any failure, never through a consistent list.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Api;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::runtime::{reflector, watcher};
use smol::stream::StreamExt;

use crate::api::pod::Pod;
use crate::runtime::Latch;

/// How long a look's initial events may take before it is tried again
/// (they wait in the API server's queues when many drains start at once).
const INITIAL_EVENTS: Duration = Duration::from_secs(60);

/// How many nodes' pods are read at once (a look's initial events, a list
/// from the cache), process-wide. The API server's priority and fairness
/// prices such a read by every pod of the cluster, not by the node's 30
/// (up to 10 seats each at 150 000 pods): 100 drains starting at once held
/// every seat of their priority level for 10 s at a time, and the
/// maintenances' own writes behind them (finalizer, lease, cordon) were
/// refused with 429 until the burst failed (`just bench-scale` at 5 000
/// nodes). Queued here instead, each read takes a fraction of a second and
/// the writes go by; the cordon never waits for a look.
pub(crate) static READS: smol::lock::Semaphore = smol::lock::Semaphore::new(READS_AT_ONCE);
const READS_AT_ONCE: usize = 3;

/// A node's first list and its watch in one request: a watch with the
/// cache's current state as its first events (`sendInitialEvents`, from
/// `resourceVersion=0`: the API server's watch cache as it is), ended by a
/// bookmark marked `k8s.io/initial-events-end`. A list and then a watch
/// from its version were two requests per drained node, the one request
/// over the protocol's + 5 in `just bench-drain`. Streaming is on by
/// default from Kubernetes 1.34 (the `WatchList` gate); a server that
/// refuses it gets the list from the cache and a watch from its version,
/// as before ([`STREAMING_REFUSED`]).
///
/// Why from the cache as it is: the cluster role's first eviction on a
/// node waits for this list, and the consistent list every other watch
/// starts with ([`watch_config`]) waits for the pods' cache to catch up
/// with etcd — a progress notification when no pod changed since the last
/// write of any kind: 53 to 89 ms server-side in a 110-pod drain, 71 ms
/// for a list at the NodeMaintenance's own version, which the pods' cache
/// had not reached either. The cache's state may lag etcd by what it has
/// not yet applied; the watch goes on from there, so a pod bound to the
/// node in between is in the store before any deletion the drain caused
/// (events come in resourceVersion order).
///
/// Why not for every watch (`Any`, [`watch_config`]): after an API server
/// restart the cache can answer at a version it cannot watch from, and
/// kube's watcher then relists at that version for ever. Here the watch's
/// first error (410 or any other), or initial events that do not end
/// within `INITIAL_EVENTS`, return (true if the store was listed): the
/// caller looks again from the cache's state, after a backoff, and the
/// new look replaces the store whole; a watch the server ends (its
/// timeout) goes on from where it was. Never a consistent list: with a
/// field selector it reads every pod in the cluster from etcd (150 000 at
/// 5 000 nodes), and 100 drains starting at once, their first looks
/// refused by priority and fairness (429), fell back to 100 of them, which
/// took the API server's answers past 2 s, the leader's lease with them.
pub(super) async fn first_look(
    api: &Api<Pod>,
    config: &watcher::Config,
    writer: &mut reflector::store::Writer<Pod>,
    listed: &Latch,
    on_event: &impl Fn(),
    what: &str,
) -> bool {
    let mut params = WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        bookmarks: true,
        send_initial_events: !STREAMING_REFUSED.load(Ordering::Relaxed),
        ..WatchParams::default()
    };
    let permit = READS.acquire().await;
    let first = match params.send_initial_events {
        true => crate::runtime::timeout(INITIAL_EVENTS, initial_events(api, &params, what))
            .await
            .unwrap_or(Initial::Failed),
        false => Initial::Refused,
    };
    let (pods, mut version, stream) = match first {
        Initial::Streamed(pods, version, stream) => (pods, version, Some(stream)),
        Initial::Refused => {
            STREAMING_REFUSED.store(true, Ordering::Relaxed);
            match list_from_cache(api, config, what).await {
                Some((pods, version)) => (pods, version, None),
                None => return false,
            }
        }
        Initial::Failed => return false,
    };
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in pods {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    drop(permit);
    listed.open();
    on_event();
    params.send_initial_events = false;
    let mut stream = stream;
    loop {
        let mut events = match stream.take() {
            Some(open) => open,
            None => match api.watch(&params, &version).await {
                Ok(s) => s.boxed(),
                Err(e) => {
                    log::debug!("watch of {what} from {version}: {e} (listing again)");
                    return true;
                }
            },
        };
        while let Some(event) = events.next().await {
            let (event, seen) = match event {
                Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => {
                    let seen = pod.metadata.resource_version.clone();
                    (watcher::Event::Apply(pod), seen)
                }
                Ok(WatchEvent::Deleted(pod)) => {
                    let seen = pod.metadata.resource_version.clone();
                    (watcher::Event::Delete(pod), seen)
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    version = b.metadata.resource_version;
                    continue;
                }
                Ok(WatchEvent::Error(status)) => {
                    log::debug!(
                        "watch of {what} from {version}: {} (listing again)",
                        status.message
                    );
                    return true;
                }
                Err(e) => {
                    log::debug!("watch of {what} from {version}: {e} (listing again)");
                    return true;
                }
            };
            writer.apply_watcher_event(&event);
            if let Some(seen) = seen {
                version = seen;
            }
            on_event();
        }
        // The server ended the watch (its timeout): go on from where it was.
    }
}

/// A watch's events, boxed so the initial ones and the rest share a stream.
type PodEvents = smol::stream::Boxed<kube::Result<WatchEvent<Pod>>>;

/// Set when an API server refused `sendInitialEvents` (the `WatchList`
/// gate is off by default in 1.30, 1.31 and 1.33): every later node's first
/// look is a list from the cache and a watch, as before streaming.
static STREAMING_REFUSED: AtomicBool = AtomicBool::new(false);

/// How a watch with initial events went.
enum Initial {
    /// The pods, the version of the bookmark that ended them, the watch
    /// still open.
    Streamed(Vec<Pod>, String, PodEvents),
    /// The server does not stream: it refused the parameter (400, 422), or
    /// ignored it and sent a bookmark without the end mark.
    Refused,
    /// The watch failed or ended first.
    Failed,
}

/// Open a watch with initial events (`params`) at the cache's state and
/// read them up to the bookmark that ends them.
async fn initial_events(api: &Api<Pod>, params: &WatchParams, what: &str) -> Initial {
    let mut events = match api.watch(params, "0").await {
        Ok(s) => s.boxed(),
        Err(kube::Error::Api(status)) if status.code == 400 || status.code == 422 => {
            // The server's message ("sendInitialEvents is forbidden
            // unless the WatchList feature gate is enabled") reads like an
            // RBAC refusal, which it is not: say what it means.
            log::debug!(
                "watch of {what}: the API server does not stream lists ({} {}); a list and a watch instead",
                status.code,
                status.reason
            );
            return Initial::Refused;
        }
        Err(e) => {
            log::debug!("watch of {what} with initial events: {e}");
            return Initial::Failed;
        }
    };
    let mut pods = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => pods.push(pod),
            Ok(WatchEvent::Bookmark(b)) => {
                let end = b.metadata.annotations.get(INITIAL_EVENTS_END);
                return match end.map(String::as_str) == Some("true") {
                    true => Initial::Streamed(pods, b.metadata.resource_version, events),
                    false => Initial::Refused,
                };
            }
            Ok(WatchEvent::Deleted(_)) => return Initial::Failed,
            Ok(WatchEvent::Error(status)) => {
                log::debug!("watch of {what} with initial events: {}", status.message);
                return Initial::Failed;
            }
            Err(e) => {
                log::debug!("watch of {what} with initial events: {e}");
                return Initial::Failed;
            }
        }
    }
    Initial::Failed
}

/// A list of the pods from the API server's watch cache as it is
/// (`resourceVersion=0`) and its version, for a server that does not
/// stream; `None` when it fails.
async fn list_from_cache(
    api: &Api<Pod>,
    config: &watcher::Config,
    what: &str,
) -> Option<(Vec<Pod>, String)> {
    let params = ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        resource_version: Some("0".to_string()),
        version_match: Some(VersionMatch::NotOlderThan),
        ..ListParams::default()
    };
    match api.list(&params).await {
        Ok(list) => Some((list.items, list.metadata.resource_version?)),
        Err(e) => {
            log::debug!("first list of {what} from the cache: {e} (a consistent list instead)");
            None
        }
    }
}

/// The annotation of the bookmark that ends a watch's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
