//! The per-worker client toward a `protocol: h2` cluster's backends: for each backend, a few HTTP/2
//! connections (prior knowledge) that each carry many requests at once, owned by the worker's thread.
//!
//! The balancer still sees requests, not connections: every stream is one attempt, picked by P2C and
//! counted as its backend's load until its response ends, exactly as over HTTP/1.1. The pool only
//! decides which connection carries it: the first open one with a free stream slot, or a new one when
//! every connection is full or closing. A connection holds at most [`MAX_STREAMS_PER_CONNECTION`]
//! streams of this worker (RFC 9113 §6.5.2 asks servers to allow at least 100); past that, another
//! connection opens rather than queueing behind the peer's limit.
//!
//! A backend that sends GOAWAY (a graceful restart) lets its streams in flight finish; the connection
//! is never picked again, the next request opens a new one, and a request that the GOAWAY refused
//! (RFC 9113 §8.7: never processed) is sent again on a new connection, not counted as a failure.

use crate::backend::{
    connect::{Connector, H2},
    pool::{dial, Key, UpstreamError},
    request_body::UpstreamBody,
};
use duet_config::{Http2Windows, Timeouts};
use http::{Request, Response};
use hyper::{
    body::Incoming,
    client::conn::http2::{self, SendRequest},
};
use hyper_util::rt::TokioIo;
use rustc_hash::FxBuildHasher;
use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    rc::Rc,
    time::Duration,
};
use tokio::time::Instant;

/// Streams one worker opens on one connection before it opens another.
pub(crate) const MAX_STREAMS_PER_CONNECTION: usize = 100;

/// Requests moved to another connection after finding theirs closed before their stream opened.
const MAX_MOVES: u32 = 3;

/// Runs hyper's per-stream tasks on the worker's thread (the request bodies are not `Send`).
#[derive(Clone, Copy)]
struct LocalSpawn;

impl<F> hyper::rt::Executor<F> for LocalSpawn
where
    F: Future + 'static,
{
    fn execute(&self, future: F) {
        tokio::task::spawn_local(future);
    }
}

/// A worker's HTTP/2 connections toward one cluster's backends. Cheap to clone; not `Send`.
#[derive(Clone)]
pub(crate) struct H2Client {
    pool: Rc<H2Pool>,
}

struct H2Pool {
    connections: RefCell<HashMap<SocketAddr, Vec<Shared>, FxBuildHasher>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    handshake: http2::Builder<LocalSpawn>,
    windows: Http2Windows,
    connector: Connector,
}

/// One connection and the streams this worker has open on it (clones share the counts).
#[derive(Clone)]
struct Shared {
    sender: SendRequest<UpstreamBody>,
    streams: Rc<Cell<usize>>,
    /// Set on the first error seen on it (a GOAWAY among them): never picked again.
    retired: Rc<Cell<bool>>,
    /// When its last stream ended (or it opened).
    idle_since: Rc<Cell<Instant>>,
}

impl Shared {
    fn usable(&self, idle_timeout: Duration) -> bool {
        let idle_too_long =
            self.streams.get() == 0 && self.idle_since.get().elapsed() >= idle_timeout;
        !self.retired.get() && !self.sender.is_closed() && !idle_too_long
    }

    fn slot(&self) -> StreamSlot {
        self.streams.set(self.streams.get() + 1);
        StreamSlot {
            streams: self.streams.clone(),
            idle_since: self.idle_since.clone(),
        }
    }
}

/// One stream's place on its connection, held by the attempt until it settles.
pub(crate) struct StreamSlot {
    streams: Rc<Cell<usize>>,
    idle_since: Rc<Cell<Instant>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let left = self.streams.get().saturating_sub(1);
        self.streams.set(left);
        if left == 0 {
            self.idle_since.set(Instant::now());
        }
    }
}

/// Builds a worker's HTTP/2 client for a cluster's timeouts (`connect`; `idle` closes a connection
/// that carried no stream for that long) and flow-control windows, over plain TCP.
pub(crate) fn h2_client(timeouts: &Timeouts, windows: Http2Windows) -> H2Client {
    h2_client_over(timeouts, windows, Connector::default())
}

/// [`h2_client`] whose connections are made by `connector` (TLS offering only `h2` for a cluster with
/// `tls:`).
pub(crate) fn h2_client_over(
    timeouts: &Timeouts,
    windows: Http2Windows,
    connector: Connector,
) -> H2Client {
    let mut handshake = http2::Builder::new(LocalSpawn);
    handshake
        .timer(hyper_util::rt::TokioTimer::new())
        .initial_stream_window_size(windows.initial_stream_window_size)
        .initial_connection_window_size(windows.initial_connection_window_size);
    // Last: hyper's adaptive window replaces the two sizes.
    if windows.adaptive_window {
        handshake.adaptive_window(true);
    }
    H2Client {
        pool: Rc::new(H2Pool {
            connections: RefCell::default(),
            connect_timeout: timeouts.connect,
            idle_timeout: timeouts.idle,
            handshake,
            windows,
            connector,
        }),
    }
}

impl UpstreamError {
    /// Whether the backend refused the stream without processing it (a GOAWAY that excluded it, or
    /// `REFUSED_STREAM`): RFC 9113 §8.7 lets any request, idempotent or not, be sent again.
    pub(crate) fn refused_by_h2(&self) -> bool {
        let Self::Http { error, .. } = self else {
            return false;
        };
        std::error::Error::source(error)
            .and_then(|e| e.downcast_ref::<h2::Error>())
            .is_some_and(|e| {
                e.is_go_away() && e.is_remote() || e.reason() == Some(h2::Reason::REFUSED_STREAM)
            })
    }
}

impl H2Client {
    /// Sends `request` (absolute URI, version HTTP/2) to `backend` on an open connection with a free
    /// stream slot, or on a new one.
    pub(crate) async fn send(
        &self,
        backend: SocketAddr,
        mut request: Request<UpstreamBody>,
    ) -> Result<(Response<Incoming>, StreamSlot), UpstreamError> {
        let mut closed = 0;
        loop {
            let (mut shared, reused) = match self.pool.take(backend) {
                Some(shared) => (shared, true),
                None => (Box::pin(self.connect(backend)).await?, false),
            };
            let slot = shared.slot();
            let failed = match shared.sender.try_send_request(request).await {
                Ok(response) => return Ok((response, slot)),
                Err(failed) => failed,
            };
            // Whatever failed on it, the connection takes no new stream.
            shared.retired.set(true);
            let mut failed = failed;
            match failed.take_message() {
                // Closed before the stream opened: nothing was sent, the next connection takes it.
                Some(unsent) if closed < MAX_MOVES => {
                    closed += 1;
                    request = unsent;
                }
                // A refused stream's body went with it: the forward stage sends it again from its
                // replayable copy, if it has one.
                _ => {
                    return Err(UpstreamError::Http {
                        error: failed.into_error(),
                        reused,
                    })
                }
            }
        }
    }

    /// A new connection to `backend`, its preface and settings exchanged and its task spawned.
    async fn connect(&self, backend: SocketAddr) -> Result<Shared, UpstreamError> {
        let io = dial(
            &self.pool.connector,
            Key(backend, None),
            H2,
            self.pool.connect_timeout,
        )
        .await?;
        let (sender, connection) = self
            .pool
            .handshake
            .handshake(TokioIo::new(io))
            .await
            .map_err(|error| UpstreamError::Http {
                error,
                reused: false,
            })?;
        tokio::task::spawn_local(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%backend, "upstream h2 connection ended: {error}");
            }
        });
        let shared = Shared {
            sender,
            streams: Rc::default(),
            retired: Rc::default(),
            idle_since: Rc::new(Cell::new(Instant::now())),
        };
        let mut connections = self.pool.connections.borrow_mut();
        connections.entry(backend).or_default().push(shared.clone());
        Ok(shared)
    }

    /// How its connections are made (to keep it across a reload that reads the same TLS files).
    pub(crate) fn connector(&self) -> &Connector {
        &self.pool.connector
    }

    /// The windows its connections give backends (a reload that changes them makes a new client).
    pub(crate) fn windows(&self) -> Http2Windows {
        self.pool.windows
    }

    /// Connections open now, over every backend.
    #[cfg(test)]
    pub(crate) fn open_connections(&self) -> usize {
        self.pool.connections.borrow().values().map(Vec::len).sum()
    }
}

impl H2Pool {
    /// The first open connection to `backend` with a free stream slot. Closed, retired and long-idle
    /// ones are dropped (hyper closes a connection once its last handle and stream are gone).
    fn take(&self, backend: SocketAddr) -> Option<Shared> {
        let mut connections = self.connections.borrow_mut();
        let list = connections.get_mut(&backend)?;
        list.retain(|shared| shared.usable(self.idle_timeout));
        let found = list
            .iter()
            .find(|shared| shared.streams.get() < MAX_STREAMS_PER_CONNECTION)
            .cloned();
        if list.is_empty() {
            connections.remove(&backend);
        }
        found
    }
}
