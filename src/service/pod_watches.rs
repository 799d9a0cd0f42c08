//! The pods this process holds: only those it acts on.
//!
//! - **Node role**: one watch of the pods bound to its own node
//!   (`spec.nodeName=<own>`), for the life of the process ([`fixed`]).
//! - **Cluster role**: nothing at start. A node it drains gets a watch of
//!   that node's pods, started by the first reconcile that finds a
//!   NodeMaintenance on it and stopped by the first that finds none
//!   ([`PodWatches::drainable`], [`PodWatches::release`]); each
//!   blocking-pod gate (label selector, optional namespace) gets a watch of
//!   the pods it selects, for as long as a RebootPolicy or UpgradePlan
//!   names it ([`PodWatches::want_gates`]). Its memory then grows with the
//!   nodes in disruption and the pods the gates select, not with the
//!   cluster: at 1 000 nodes / 30 000 pods a watch of every pod cost
//!   55.7 MiB (1.9 KiB a pod) for the few nodes a budget admits; now the
//!   role is 18.8 MiB when ready there (`just bench-scale`).
//!
//! Every watch has its own store (a relist replaces only that store): a
//! gate's is kube's watcher, a drained node's looks from the API server's
//! cache (`pod_watches/first_look.rs`). A node's store is read only once it
//! has listed: a drain must never take "not listed yet" for "no pods"
//! (the steps before it that read no pods, `Step::reads_no_pods`, do not
//! wait for the list: `service::reconcile`).
//! The node role's watch reads over an HTTP/1.1 connection of its own, the
//! cluster role's over HTTP/2 connections shared by up to 80 watches each
//! (`pod_watches/connections.rs` says why); all back off on errors like
//! every other watch.

mod connections;
mod first_look;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::node::Node;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

pub use connections::Connections;
use connections::Seat;
use smol::stream::StreamExt;

use super::passes::Kick;
use super::watch::{WatchBackoff, watch_config};
use crate::api::common::BlockingPods;
use crate::api::pod::Pod;
use crate::runtime::Latch;
pub(crate) use first_look::READS;
use first_look::first_look;

/// How long a reconcile waits for a node's first list before it looks
/// again (the list's end also triggers that reconcile).
const FIRST_LIST: Duration = Duration::from_secs(10);

pub struct PodWatches {
    mode: Mode,
}

enum Mode {
    /// Node role: the own node's pods, watched by `service::run`.
    Fixed(Store<Pod>),
    Scoped(Box<Scoped>),
}

struct Scoped {
    connections: Connections,
    /// A node's pod events reconcile that node.
    reconcile: smol::channel::Sender<ObjectRef<Node>>,
    /// A gate's pod events kick the cluster scheduler.
    kick: Kick,
    nodes: Mutex<HashMap<String, Watched>>,
    gates: Mutex<HashMap<GateKey, Watched>>,
    /// Pods of nodes read once, not watched (`service::node_pods`), and
    /// when: shared by the passes of one burst.
    recent: Mutex<HashMap<String, Read>>,
}

/// When a node's pods were read, and what the read answered.
type Read = (std::time::Instant, Vec<Arc<Pod>>);

/// How long a node's pods read once stay the answer. A plan's every step
/// ends its pass and the next pass decides again: a replacement's burst
/// of passes listed one node's pods six times in 20 ms (bench-replace:
/// 57 requests per replaced node instead of 45). A pod's opt-out set
/// meanwhile is seen by the first read after this; a drain honours it in
/// any case (`decide::drain_plan`).
const RECENT_FOR: Duration = Duration::from_secs(1);

/// A blocking-pod gate's watch: its namespace (all when `None`) and its
/// selector in the API's label-selector syntax.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GateKey {
    pub namespace: Option<String>,
    pub selector: String,
}

impl GateKey {
    /// `None` for a selector the API cannot express (the CRD's validation
    /// refuses those; an older object's decision reports it).
    pub fn of(gate: &BlockingPods) -> Option<GateKey> {
        // Label syntax and the namespace are checked first: a value the
        // API server refuses ("my app") left a watch retrying for ever, and
        // a namespace reaches the URL path.
        if crate::decide::selector::check_gate(gate).is_err() {
            return None;
        }
        let selector = kube::core::Selector::try_from(gate.selector.clone()).ok()?;
        Some(GateKey {
            namespace: gate.namespace.clone().filter(|n| !n.is_empty()),
            selector: selector.to_string(),
        })
    }
}

struct Watched {
    store: Store<Pod>,
    listed: Latch,
    /// When the watch started: a pass waits for the first list of a new
    /// gate only ([`PodWatches::gates_listed`]).
    since: std::time::Instant,
    /// Dropping the task stops the watch.
    _task: smol::Task<()>,
    /// Its place on a connection, given back with it.
    _seat: Seat,
}

use crate::runtime::lock;

/// The node role's pods: `store`, fed by the watch `service::run` builds.
pub fn fixed(store: Store<Pod>) -> PodWatches {
    PodWatches {
        mode: Mode::Fixed(store),
    }
}

/// The cluster role's pods: none until a drain or a gate asks; a node's
/// pod events go to `reconcile`, a gate's to `kick`.
pub fn scoped(
    connections: Connections,
    reconcile: smol::channel::Sender<ObjectRef<Node>>,
    kick: Kick,
) -> PodWatches {
    PodWatches {
        mode: Mode::Scoped(Box::new(Scoped {
            connections,
            reconcile,
            kick,
            nodes: Mutex::default(),
            gates: Mutex::default(),
            recent: Mutex::default(),
        })),
    }
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Start one watch on `seat`'s connection; `on_event` hears each event
/// after the store has it. With `first_from_cache` the first list is
/// [`first_look`]'s; every other list is a consistent read
/// ([`watch_config`]).
fn start(
    seat: Seat,
    api: impl FnOnce(Client) -> Api<Pod>,
    config: watcher::Config,
    what: String,
    first_from_cache: bool,
    on_event: impl Fn() + Send + Sync + 'static,
) -> Watched {
    let api = api(seat.client.clone());
    let (store, mut writer) = reflector::store::<Pod>();
    let listed = Latch::default();
    let latch = listed.clone();
    let task = crate::runtime::spawn(async move {
        if first_from_cache {
            // Every look from the cache, again after any failure (see
            // `first_look`); never the consistent list below.
            let mut backoff = WatchBackoff::default();
            loop {
                if first_look(&api, &config, &mut writer, &latch, &on_event, &what).await {
                    kube::runtime::utils::Backoff::reset(&mut backoff);
                }
                crate::runtime::sleep(backoff.next().unwrap_or(FIRST_LIST)).await;
            }
        }
        let mut events = std::pin::pin!(
            watcher(api, config)
                .backoff(WatchBackoff::default())
                .reflect(writer)
        );
        while let Some(ev) = events.next().await {
            match ev {
                Ok(ev) => {
                    if matches!(ev, watcher::Event::InitDone) {
                        latch.open();
                    }
                    on_event();
                }
                Err(e) => log::debug!("watch of {what}: {e} (retrying)"),
            }
        }
    });
    Watched {
        store,
        listed,
        since: std::time::Instant::now(),
        _task: task,
        _seat: seat,
    }
}

impl PodWatches {
    /// Every pod on `node` if known now: the node role's store; in the
    /// cluster role the node's own watch (started here if it is not
    /// running; its first list is `first_look`'s) once it has listed.
    /// `None`: not listed yet.
    pub fn drainable_now(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        match self.node_watch(node) {
            Err(fixed) => Some(fixed.state_filter(|p| on_node(p, node))),
            Ok((store, listed)) => listed.is_open().then(|| store.state()),
        }
    }

    /// Every pod on `node` if a cluster role's watch of it has listed;
    /// `None` otherwise (nothing is started) and in the node role.
    pub fn known_on(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        let Mode::Scoped(s) = &self.mode else {
            return None;
        };
        let nodes = lock(&s.nodes);
        let w = nodes.get(node)?;
        w.listed.is_open().then(|| w.store.state())
    }

    /// The pods of `node` read within the last second (`RECENT_FOR`), if
    /// any.
    pub fn recently_read(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        let Mode::Scoped(s) = &self.mode else {
            return None;
        };
        let recent = lock(&s.recent);
        let (at, pods) = recent.get(node)?;
        (at.elapsed() < RECENT_FOR).then(|| pods.clone())
    }

    /// Keep what a read of `node`'s pods answered (older reads go).
    pub fn remember_read(&self, node: &str, pods: &[Arc<Pod>]) {
        let Mode::Scoped(s) = &self.mode else {
            return;
        };
        let mut recent = lock(&s.recent);
        recent.retain(|_, (at, _)| at.elapsed() < RECENT_FOR);
        let now = std::time::Instant::now();
        recent.insert(node.to_string(), (now, pods.to_vec()));
    }

    /// The cluster role's client for pods (`None` in the node role).
    pub fn client(&self) -> Option<&Client> {
        match &self.mode {
            Mode::Scoped(s) => Some(s.connections.client()),
            Mode::Fixed(_) => None,
        }
    }

    /// [`PodWatches::drainable_now`], waiting up to `FIRST_LIST` for the
    /// first list. `None`: still not listed; decide nothing about the
    /// node's pods.
    pub async fn drainable(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        let (store, listed) = match self.node_watch(node) {
            Err(fixed) => return Some(fixed.state_filter(|p| on_node(p, node))),
            Ok(w) => w,
        };
        let waited = smol::future::or(
            async {
                listed.wait().await;
                true
            },
            async {
                crate::runtime::sleep(FIRST_LIST).await;
                false
            },
        )
        .await;
        waited.then(|| store.state())
    }

    /// The cluster role's watch of `node`'s pods (its store and first-list
    /// latch), started if it is not running; the node role's one store as
    /// the error.
    fn node_watch(&self, node: &str) -> Result<(Store<Pod>, Latch), &Store<Pod>> {
        let s = match &self.mode {
            Mode::Fixed(store) => return Err(store),
            Mode::Scoped(s) => s,
        };
        let mut nodes = lock(&s.nodes);
        let w = nodes.entry(node.to_string()).or_insert_with(|| {
            log::debug!("watching the pods on node {node}");
            let tx = s.reconcile.clone();
            let target = ObjectRef::<Node>::new(node);
            start(
                s.connections.seat(),
                Api::all,
                watch_config().fields(&format!("spec.nodeName={node}")),
                format!("pods on node {node}"),
                true,
                move || {
                    let _ = tx.try_send(target.clone());
                },
            )
        });
        Ok((w.store.clone(), w.listed.clone()))
    }

    /// Stop watching `node`'s pods (nothing on it is ours to drain). The
    /// node role's watch stays.
    pub fn release(&self, node: &str) {
        if let Mode::Scoped(s) = &self.mode
            && lock(&s.nodes).remove(node).is_some()
        {
            log::debug!("no longer watching the pods on node {node}");
        }
    }

    /// Watch exactly these gates' pods: start the missing, stop the rest.
    pub fn want_gates(&self, wanted: &BTreeSet<GateKey>) {
        let Mode::Scoped(s) = &self.mode else {
            return;
        };
        let mut gates = lock(&s.gates);
        gates.retain(|k, _| wanted.contains(k));
        for key in wanted {
            if gates.contains_key(key) {
                continue;
            }
            log::debug!("watching the pods of gate {key:?}");
            let namespace = key.namespace.clone();
            let api = move |c| match &namespace {
                Some(ns) => Api::namespaced(c, ns),
                None => Api::all(c),
            };
            let kick = s.kick.clone();
            let w = start(
                s.connections.seat(),
                api,
                watch_config().labels(&key.selector),
                format!("pods of gate {key:?}"),
                false,
                move || kick.kick(),
            );
            gates.insert(key.clone(), w);
        }
    }

    /// The first of `gates` whose pods are not listed yet, named for a
    /// status message (a selector the API cannot express starts no watch:
    /// its object is reported invalid and admits nothing anyway).
    pub fn first_unlisted(&self, gates: &[BlockingPods]) -> Option<String> {
        let Mode::Scoped(s) = &self.mode else {
            return None;
        };
        let watched = lock(&s.gates);
        gates.iter().find_map(|g| {
            let key = GateKey::of(g)?;
            let listed = watched.get(&key).is_some_and(|w| w.listed.is_open());
            (!listed).then(|| match &key.namespace {
                Some(ns) => format!("{:?} in namespace {ns}", key.selector),
                None => format!("{:?}", key.selector),
            })
        })
    }

    /// Have all gates' watches listed? A watch that started less than
    /// `within` ago is waited for until then; an older one that has not
    /// listed (a selector or namespace the server refuses, a forbidden
    /// list) is not waited for again: its objects wait on their own and
    /// say so, and no pass pays `within` for it every time.
    pub async fn gates_listed(&self, within: Duration) -> bool {
        let Mode::Scoped(s) = &self.mode else {
            return true;
        };
        let (mut latches, mut old_unlisted) = (Vec::new(), false);
        let mut wait = Duration::ZERO;
        for w in lock(&s.gates).values() {
            if w.listed.is_open() {
                continue;
            }
            let age = w.since.elapsed();
            if age >= within {
                old_unlisted = true;
            } else {
                wait = wait.max(within - age);
                latches.push(w.listed.clone());
            }
        }
        if latches.is_empty() {
            return !old_unlisted;
        }
        let within = wait;
        smol::future::or(
            async {
                for l in &latches {
                    l.wait().await;
                }
                true
            },
            async {
                crate::runtime::sleep(within).await;
                false
            },
        )
        .await
            && !old_unlisted
    }

    /// The pods on `node` that a gate may read: the node's own watch if it
    /// has one that has listed, else every gate's pods on it.
    pub fn gate_pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        let s = match &self.mode {
            Mode::Fixed(store) => return store.state_filter(|p| on_node(p, node)),
            Mode::Scoped(s) => s,
        };
        if let Some(w) = lock(&s.nodes).get(node)
            && w.listed.is_open()
        {
            return w.store.state();
        }
        let mut seen = HashSet::new();
        let mut pods = Vec::new();
        for w in lock(&s.gates).values() {
            for p in w.store.state_filter(|p| on_node(p, node)) {
                if seen.insert(p.metadata.uid.clone()) {
                    pods.push(p);
                }
            }
        }
        pods
    }

    /// Pods held in memory (`nodekeeper_watched_objects{kind="pods"}`).
    pub fn held(&self) -> usize {
        match &self.mode {
            Mode::Fixed(store) => store.len(),
            Mode::Scoped(s) => {
                let nodes: usize = lock(&s.nodes).values().map(|w| w.store.len()).sum();
                let gates: usize = lock(&s.gates).values().map(|w| w.store.len()).sum();
                nodes + gates
            }
        }
    }
}
