//! The connections pod watches read over.
//!
//! Over HTTP/1.1 a watch is a connection of its own: its TLS session and
//! buffers, about 140 KiB of heap held for as long as the watch lives
//! (heaptrack, `just bench-scale`: hyper's read and header buffers, its
//! dispatch channel, kube's line decoder, rustls' state). A cluster role
//! watches the pods of each node it drains, so a burst of 100
//! maintenances held 100 connections — the largest part of its peak after
//! the node store. Over HTTP/2 a watch is a stream of a shared connection
//! and costs a few KiB; the API server serves at most 100 streams on one
//! connection (kube-apiserver's `--http2-max-streams-per-connection`), so
//! each connection carries at most [`WATCHES_PER_CONNECTION`] watches and
//! the next connection is made ready before they are all taken.
//!
//! The node role keeps HTTP/1.1 for its one pod watch: a 110-pod drain
//! makes several hundred events a second on that watch, and the API
//! server's HTTP/2 write path fell behind and closed it (`service::run`'s
//! `Clients`). A cluster role's drains share the process's evictions in
//! flight, so each node's watch sees a fraction of that.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kube::{Client, Config};

use crate::runtime::lock;
use crate::service::connect::{self, Transport};

/// Watches on one HTTP/2 connection, leaving streams under the server's
/// 100 for the reads that go over it (a node's pods read once, a look's
/// list where the server does not stream).
pub const WATCHES_PER_CONNECTION: usize = 80;

/// The next connection is built once fewer seats than this are free.
/// Building one runs the kubeconfig's credential plugin, if it names one
/// (an `exec` command: a second or more), so it is built ahead, off the
/// executor and outside every lock, never while a watch waits for a seat.
const SPARE_AT: usize = 20;

/// Where the next pod watch reads: the first connection, and over HTTP/2
/// more as the watches need them.
pub struct Connections {
    first: Shared,
    /// `None` over HTTP/1.1, where every watch opens a connection of its
    /// own anyway.
    more: Option<Arc<More>>,
}

/// The connections after the first, built from `config`.
struct More {
    config: Config,
    open: Mutex<Vec<Shared>>,
    /// A build is under way.
    building: AtomicBool,
}

/// One client (over HTTP/2 one connection: each client has a pool of its
/// own) and the seats taken on it: its watch count is the seats' count.
struct Shared {
    client: Client,
    seats: Arc<()>,
}

/// A watch's place on a connection: dropped with the watch.
pub struct Seat {
    pub client: Client,
    _held: Arc<()>,
}

impl Shared {
    fn new(client: Client) -> Shared {
        Shared {
            client,
            seats: Arc::new(()),
        }
    }

    fn watches(&self) -> usize {
        Arc::strong_count(&self.seats) - 1
    }

    fn free(&self) -> usize {
        WATCHES_PER_CONNECTION.saturating_sub(self.watches())
    }

    fn seat(&self) -> Seat {
        Seat {
            client: self.client.clone(),
            _held: self.seats.clone(),
        }
    }
}

impl Connections {
    /// Every watch on `client` (HTTP/1.1).
    pub fn one(client: Client) -> Connections {
        Connections {
            first: Shared::new(client),
            more: None,
        }
    }

    /// HTTP/2 connections built from `config` (the first now, without
    /// talking to the server).
    pub fn shared(config: Config) -> crate::error::Result<Connections> {
        Ok(Connections {
            first: Shared::new(connect::client(config.clone(), Transport::Http2)?),
            more: Some(Arc::new(More {
                config,
                open: Mutex::default(),
                building: AtomicBool::new(false),
            })),
        })
    }

    /// The client for one read (not a watch): the first connection's.
    pub fn client(&self) -> &Client {
        &self.first.client
    }

    /// A seat for one more watch: on the first connection with room. With
    /// none (the spare not built yet, or its build failed) on the one with
    /// the fewest watches: past the server's 100 streams hyper queues the
    /// request until one ends. Connections whose watches have all ended
    /// are let go here but one, the spare (dropping the client closes its
    /// connection).
    pub fn seat(&self) -> Seat {
        let Some(more) = &self.more else {
            return self.first.seat();
        };
        let mut open = lock(&more.open);
        let mut spare = false;
        open.retain(|s| s.watches() > 0 || !std::mem::replace(&mut spare, true));
        let all = || std::iter::once(&self.first).chain(open.iter());
        let seat = match all().find(|s| s.free() > 0) {
            Some(s) => s.seat(),
            None => all()
                .min_by_key(|s| s.watches())
                .unwrap_or(&self.first)
                .seat(),
        };
        if all().map(Shared::free).sum::<usize>() < SPARE_AT {
            more.build_spare();
        }
        seat
    }

    /// The connections open for watches (the tests' view).
    #[cfg(test)]
    fn count(&self) -> usize {
        1 + self.more.as_ref().map_or(0, |m| lock(&m.open).len())
    }
}

impl More {
    /// Build one more connection in the background, unless one is being
    /// built; a failed build is logged and tried again at the next seat.
    fn build_spare(self: &Arc<Self>) {
        if self.building.swap(true, Ordering::AcqRel) {
            return;
        }
        let more = self.clone();
        crate::runtime::spawn(async move {
            let config = more.config.clone();
            // On a thread of its own (a credential plugin blocks), inside
            // `Compat` as kube's client needs.
            let built = smol::unblock(move || {
                crate::runtime::wait_here(async { connect::client(config, Transport::Http2) })
            })
            .await;
            match built {
                Ok(client) => {
                    let mut open = lock(&more.open);
                    open.push(Shared::new(client));
                    log::debug!("pod watches: HTTP/2 connection {} ready", open.len() + 1);
                }
                Err(e) => log::warn!(
                    "pod watches: another connection to the API server: {e}; new watches share those open"
                ),
            }
            more.building.store(false, Ordering::Release);
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config() -> Config {
        let mut c = Config::new("https://127.0.0.1:6443".parse().expect("a URL"));
        c.accept_invalid_certs = true;
        c
    }

    /// Until `c` has `n` connections, at most 10 s.
    async fn connections(c: &Connections, n: usize) {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while c.count() != n {
            assert!(
                std::time::Instant::now() < end,
                "{} connections, not {n}",
                c.count()
            );
            crate::runtime::sleep(Duration::from_millis(5)).await;
        }
    }

    /// kube's client needs tokio's reactor, which `Compat` lends.
    #[test]
    fn the_next_connection_is_ready_before_one_fills_and_empty_ones_go() {
        crate::runtime::block_on(fill_and_empty());
    }

    async fn fill_and_empty() {
        let c = Connections::shared(config()).expect("connections");
        let n = WATCHES_PER_CONNECTION;
        let mut seats: Vec<Seat> = (0..n - SPARE_AT).map(|_| c.seat()).collect();
        assert_eq!(c.count(), 1, "20 free seats: no spare yet");
        seats.push(c.seat());
        connections(&c, 2).await;
        // The first fills; the 81st watch goes to the spare, and the one
        // after that is built once the spare is nearly taken too.
        seats.extend((seats.len()..n + n - SPARE_AT + 1).map(|_| c.seat()));
        connections(&c, 3).await;
        let last = c.seat();
        // Every watch after the first connection's ends: the next seat is
        // on the first and lets all but one empty connection go.
        seats.truncate(n - 1);
        drop(last);
        drop(c.seat());
        assert_eq!(c.count(), 2, "the first and one spare");
    }

    /// Past every connection's mark (no spare built: the build is blocked
    /// here), watches go to the connection with the fewest.
    #[test]
    fn with_no_room_anywhere_the_least_taken_connection_takes_it() {
        crate::runtime::block_on(async {
            let c = Connections::shared(config()).expect("connections");
            if let Some(m) = &c.more {
                m.building.store(true, Ordering::Release);
            }
            let seats: Vec<Seat> = (0..WATCHES_PER_CONNECTION + 5).map(|_| c.seat()).collect();
            assert_eq!(c.count(), 1);
            assert_eq!(c.first.watches(), seats.len());
        });
    }

    #[test]
    fn over_http1_every_watch_takes_the_one_client() {
        crate::runtime::block_on(async { one_for_all() });
    }

    fn one_for_all() {
        let c =
            Connections::one(connect::client(config(), Transport::Http1Only).expect("a client"));
        let seats: Vec<Seat> = (0..200).map(|_| c.seat()).collect();
        assert_eq!(c.count(), 1);
        assert_eq!(seats.len(), 200);
    }
}
