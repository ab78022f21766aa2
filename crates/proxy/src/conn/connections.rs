//! One worker's client connections: what every connection of the worker shares (the proxy that
//! handles its requests, the parking lot, the count of open tunnels, the drain signal).

use crate::conn::place::Place;
use crate::{
    conn::{
        active::Active,
        http2::{self, Http2Connection},
        io::ClientIo,
        io::Prefixed,
        parking::{Parked, ParkingLot, Resumed},
        serve::{serve, Connection},
        shared::Shared,
    },
    handler::WorkerProxy,
    peer::Client,
};
use bytes::Bytes;
use std::{
    cell::{Cell, OnceCell},
    future::Future,
    rc::Rc,
    sync::atomic::Ordering::Relaxed,
};
use tokio::{
    sync::{watch, Notify},
    time::Instant,
};

/// One worker's client connections. Cheap to clone (a reference count); lives on the worker's thread.
///
/// [`serve`](Self::serve) gives the future that serves one connection; [`run`](Self::run) is the
/// worker's accept loop, which also takes parked connections back when their next request arrives.
#[derive(Clone)]
pub struct Connections(Rc<Shared>);

impl Connections {
    /// The connections of the worker whose requests `proxy` handles. `shutdown` turning true starts
    /// the drain: requests in progress finish, idle connections close.
    pub fn new(proxy: Rc<WorkerProxy>, shutdown: watch::Receiver<bool>) -> Self {
        Self(Rc::new(Shared {
            counters: proxy.counters_handle(),
            proxy,
            shutdown,
            tunnels: Rc::new(()),
            parking: OnceCell::new(),
            parking_made: Notify::new(),
            tasks: Cell::new(0),
            tasks_high: Cell::new(0),
        }))
    }

    /// Serves one client connection until it closes, or until the drain: then the request in progress
    /// (if any) finishes, and the connection closes instead of waiting for another. `permit`, if any,
    /// is the connection's place under `limits.max_connections`, held until it closes.
    ///
    /// A keep-alive connection that has been idle for a moment is **parked**: hyper's state for it
    /// (read and write buffers, parser, timers: most of a connection's memory) is given back, and only
    /// the socket waits for the next request's first byte, for up to `limits.keepalive_timeout`. A
    /// plain TCP connection leaves its task to wait in the worker's parking lot, from which
    /// [`next_resumed`](Self::next_resumed) hands it back; a TLS connection waits in its task. That
    /// byte starts a fresh hyper connection, so `limits.header_read_timeout` times the head from its
    /// first byte, never the idle wait. A connection that has sent no request yet waits for its first
    /// the same way: clients open connections ahead of their requests.
    pub fn serve<IO: ClientIo>(
        &self,
        io: IO,
        client: Client,
        permit: Place,
    ) -> impl Future<Output = ()> {
        self.serve_accepted(io, Bytes::new(), client, permit, self.count_open())
    }

    /// [`serve`](Self::serve) for a connection counted open by `active`; `prefix` is what was read of
    /// it already.
    pub(crate) fn serve_accepted<IO: ClientIo>(
        &self,
        io: IO,
        prefix: Bytes,
        client: Client,
        permit: Place,
        active: Active,
    ) -> impl Future<Output = ()> {
        let io = Prefixed { prefix, io };
        let connection = Connection::new(self.0.clone(), client, Some(io), 0, active, permit);
        serve(connection, self.0.shutdown.clone())
    }

    /// Counts a connection as open (and accepted) for as long as what it returns lives.
    pub(crate) fn count_open(&self) -> Active {
        Active::new(self.0.counters.clone())
    }

    /// Serves a connection that speaks HTTP/2 (negotiated by ALPN, or its first bytes the preface),
    /// accepted (or its first bytes arrived) at `opened`; `prefix` is what was read of it to tell.
    pub(crate) fn serve_http2<IO: ClientIo>(
        &self,
        io: IO,
        prefix: Bytes,
        client: Client,
        permit: Place,
        opened: Instant,
        active: Active,
    ) -> impl Future<Output = ()> {
        http2::serve(Http2Connection {
            shared: self.0.clone(),
            io: Prefixed { prefix, io },
            client,
            opened,
            active,
            permit,
        })
    }

    /// Serves a connection taken out of the parking lot, its next request's first byte already read:
    /// as [`serve`](Self::serve) would have, had it never parked. A connection parked before its first
    /// request is told HTTP/1.1 from HTTP/2 first.
    pub fn resume(&self, resumed: Resumed) -> impl Future<Output = ()> {
        let (io, parked) = resumed.into_parts();
        let client = parked.client;
        let io = match io {
            Ok(io) => Some(io),
            Err(error) => {
                tracing::debug!(target: "duet::conn", peer = %client.address, "closing a resumed connection: {error}");
                None
            }
        };
        let (connections, shutdown) = (self.clone(), self.0.shutdown.clone());
        async move {
            match io {
                Some(Prefixed { prefix, io }) if parked.requests == 0 => {
                    let Parked { active, permit, .. } = parked;
                    let first = connections.serve_first(io, prefix, client, permit, active);
                    Box::pin(first).await;
                }
                io => {
                    let Parked {
                        requests,
                        active,
                        permit,
                        ..
                    } = parked;
                    let connection =
                        Connection::new(connections.0, client, io, requests, active, permit);
                    serve(connection, shutdown).await;
                }
            }
        }
    }

    /// Waits until a parked keep-alive connection's next request starts to arrive; serve it with
    /// [`resume`](Self::resume). Parked connections whose client left or whose
    /// `limits.keepalive_timeout` ran out are closed while this waits, so a worker polls it for as long
    /// as it serves. Cancel-safe.
    pub async fn next_resumed(&self) -> Resumed {
        loop {
            match self.0.parking.get() {
                Some(Some(lot)) => return lot.next().await,
                Some(None) => std::future::pending::<()>().await,
                None => self.0.parking_made.notified().await,
            }
        }
    }

    /// At the drain: closes every parked connection, except those whose next request has already
    /// started to arrive, which are returned to be served (with `Connection: close`). Nothing parks
    /// after this.
    pub fn close_parked(&self) -> Vec<Resumed> {
        self.0
            .parking
            .get()
            .and_then(Option::as_ref)
            .map(ParkingLot::close_all)
            .unwrap_or_default()
    }

    /// Upgraded connections (WebSocket tunnels) open now; a drain waits for them.
    pub fn open_tunnels(&self) -> usize {
        Rc::strong_count(&self.0.tunnels) - 1
    }

    /// Notes that a connection arrived while this worker held its share of `limits.max_connections`.
    pub fn note_at_capacity(&self) {
        self.0.counters.at_capacity.fetch_add(1, Relaxed);
    }

    /// Counts a connection closed at accept over its listener's per-client cap: `new`, the cap on
    /// new connections per period, else the cap on open ones.
    pub fn note_client_refused(&self, new: bool) {
        self.0.counters.client_refused[usize::from(new)].fetch_add(1, Relaxed);
    }

    /// Counts client addresses the per-client caps forgot before their allowance refilled.
    pub fn note_clients_forgotten(&self, count: u64) {
        self.0.counters.clients_forgotten.fetch_add(count, Relaxed);
    }

    /// At `limits.max_connections`: closes up to `count` idle keep-alive connections parked in the
    /// lot, the longest idle first, so that new ones get their places. Connections parked in their
    /// tasks (TLS) are not reclaimed. Returns how many were closed.
    pub fn close_oldest_idle(&self, count: u64) -> u64 {
        let Some(Some(lot)) = self.0.parking.get() else {
            return 0;
        };
        let closed = lot.close_oldest(count);
        if closed > 0 {
            self.0.counters.reclaimed.fetch_add(closed, Relaxed);
            tracing::debug!(target: "duet::conn", closed, "at max_connections: closed idle connections to make room");
        }
        closed
    }

    /// The proxy that handles this worker's requests.
    pub fn proxy(&self) -> &Rc<WorkerProxy> {
        &self.0.proxy
    }

    /// Connections served in tasks now (parked ones aside), and the most there were at once since
    /// [`reset_tasks_high`](Self::reset_tasks_high): what tells whether memory a crowd left behind is
    /// worth giving back.
    pub fn tasks(&self) -> (usize, usize) {
        (self.0.tasks.get(), self.0.tasks_high.get())
    }

    /// Starts counting the most connections in tasks at once afresh (after a trim).
    pub fn reset_tasks_high(&self) {
        self.0.tasks_high.set(self.0.tasks.get());
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.0
    }

    /// Notes how many connections are served in tasks now.
    pub(crate) fn note_tasks(&self, tasks: usize) {
        self.0.tasks.set(tasks);
        self.0.tasks_high.set(self.0.tasks_high.get().max(tasks));
    }
}
