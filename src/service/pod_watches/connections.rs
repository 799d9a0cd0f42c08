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
//! the next opens another.
//!
//! The node role keeps HTTP/1.1 for its one pod watch: a 110-pod drain
//! makes several hundred events a second on that watch, and the API
//! server's HTTP/2 write path fell behind and closed it (`service::run`'s
//! `Clients`). A cluster role's drains share the process's evictions in
//! flight, so each node's watch sees a fraction of that.

use std::sync::{Arc, Mutex};

use kube::{Client, Config};

use crate::runtime::lock;
use crate::service::connect::{self, Transport};

/// Watches on one HTTP/2 connection, leaving streams under the server's
/// 100 for the reads that go over it (a node's pods read once, a look's
/// list where the server does not stream).
pub const WATCHES_PER_CONNECTION: usize = 80;

/// Where the next pod watch reads: the first connection, and over HTTP/2
/// more as the watches need them.
pub struct Connections {
    first: Shared,
    /// `None` over HTTP/1.1, where every watch opens a connection of its
    /// own anyway.
    more: Option<More>,
}

/// The connections after the first: built from `config` when needed.
struct More {
    config: Box<Config>,
    open: Mutex<Vec<Shared>>,
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
            more: Some(More {
                config: Box::new(config),
                open: Mutex::default(),
            }),
        })
    }

    /// The client for one read (not a watch): the first connection's.
    pub fn client(&self) -> &Client {
        &self.first.client
    }

    /// A seat for one more watch: on the first connection with room, else
    /// on a new one. Connections after the first whose watches have all
    /// ended are let go here (dropping the client closes its connection).
    pub fn seat(&self) -> Seat {
        let Some(more) = &self.more else {
            return self.first.seat();
        };
        let mut open = lock(&more.open);
        open.retain(|s| s.watches() > 0);
        if self.first.watches() < WATCHES_PER_CONNECTION {
            return self.first.seat();
        }
        if let Some(s) = open.iter().find(|s| s.watches() < WATCHES_PER_CONNECTION) {
            return s.seat();
        }
        match connect::client((*more.config).clone(), Transport::Http2) {
            Ok(client) => {
                let new = Shared::new(client);
                let seat = new.seat();
                open.push(new);
                log::debug!("pod watches: HTTP/2 connection {} opened", open.len() + 1);
                seat
            }
            // The first was built from the same config; should another
            // fail all the same, the watch waits for a stream on the first.
            Err(e) => {
                log::warn!("pod watches: another connection: {e}; sharing the first");
                self.first.seat()
            }
        }
    }

    /// The connections open for watches.
    pub fn count(&self) -> usize {
        1 + self.more.as_ref().map_or(0, |m| lock(&m.open).len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut c = Config::new("https://127.0.0.1:6443".parse().expect("a URL"));
        c.accept_invalid_certs = true;
        c
    }

    /// kube's client needs tokio's reactor, which `Compat` lends.
    #[test]
    fn watches_fill_a_connection_then_open_the_next_and_empty_ones_go() {
        crate::runtime::block_on(async { fill_and_empty() });
    }

    fn fill_and_empty() {
        let c = Connections::shared(config()).expect("connections");
        let mut seats: Vec<Seat> = (0..WATCHES_PER_CONNECTION).map(|_| c.seat()).collect();
        assert_eq!(c.count(), 1);
        seats.push(c.seat());
        assert_eq!(c.count(), 2, "the 81st watch opens a second connection");
        seats.extend((1..WATCHES_PER_CONNECTION).map(|_| c.seat()));
        assert_eq!(c.count(), 2);
        seats.push(c.seat());
        assert_eq!(c.count(), 3);
        // The last two connections' watches end: the next seat finds room
        // on the first and lets both go.
        seats.truncate(WATCHES_PER_CONNECTION - 1);
        drop(c.seat());
        assert_eq!(c.count(), 1);
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
