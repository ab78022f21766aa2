//! The per-worker client toward backends.

use crate::request_body::UpstreamBody;
use duet_config::Timeouts;
use http::{Extensions, Uri};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::{
        connect::{Connected, Connection, HttpConnector},
        Client,
    },
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc,
    },
    task::{Context, Poll},
};
use tokio::net::TcpStream;

/// A pooled HTTP/1.1 client. Each worker builds its own (one per cluster, for the cluster's timeouts):
/// no pool, lock or connection is shared between workers.
pub type UpstreamClient = Client<Connector, UpstreamBody>;

/// Idle connections kept per backend, per worker.
pub(crate) const MAX_IDLE_PER_BACKEND: usize = 64;

/// The most header fields a backend's response may carry.
pub(crate) const MAX_RESPONSE_HEADERS: usize = 256;

/// Builds a worker's client for a cluster's timeouts.
///
/// Pooled connections idle for `timeouts.idle` (default 4 s, below the 5 s keep-alive of Node.js,
/// uvicorn and Apache httpd) are closed, so duet usually closes first. When the backend closes first, a
/// request may meet the close on the wire; an idempotent one is then sent again (the [`Connector`] marks
/// which connections have answered before, which is how such a close is told from a failing backend).
pub fn upstream_client(timeouts: &Timeouts) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeouts.connect));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(timeouts.idle)
        // A burst opens as many connections as it needs; afterwards only this many stay pooled per
        // backend (nginx's `keepalive 64`): an idle pooled connection costs ~10 KiB.
        .pool_max_idle_per_host(MAX_IDLE_PER_BACKEND)
        // Without a pool timer, idle connections are only evicted when a request checks one out.
        .pool_timer(TokioTimer::new())
        // Head and small body in one write: measurably cheaper per request (../shared/design.md).
        .http1_writev(false)
        // Real responses carry more than hyper's default 100 fields (one `Set-Cookie` each); HAProxy
        // allows 101. Past this the response is refused (502), never held against the backend.
        .http1_max_headers(MAX_RESPONSE_HEADERS)
        .build(Connector(connector))
}

/// Connects like [`HttpConnector`], and marks each connection with whether it has answered yet: an
/// error on a connection that has is the keep-alive close race, not a failing backend.
#[derive(Clone, Debug)]
pub struct Connector(HttpConnector);

impl tower::Service<Uri> for Connector {
    type Response = BackendConnection;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<BackendConnection, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            Ok(BackendConnection {
                io: connecting.await?,
                answered: Answered::default(),
            })
        })
    }
}

/// Whether a backend connection has delivered a response head.
#[derive(Clone, Debug, Default)]
pub(crate) struct Answered(Arc<AtomicBool>);

impl Answered {
    /// Notes that a response arrived on the connection it came on (from the response's extensions).
    pub(crate) fn note(extensions: &Extensions) {
        if let Some(answered) = extensions.get::<Self>() {
            answered.0.store(true, Relaxed);
        }
    }
}

/// A connection to a backend.
#[derive(Debug)]
pub struct BackendConnection {
    io: TokioIo<TcpStream>,
    answered: Answered,
}

impl Connection for BackendConnection {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.answered.clone())
    }
}

impl Read for BackendConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for BackendConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Whether an attempt failed because the backend closed a pooled connection that had answered before,
/// with no byte of a response to this request: the HTTP/1.1 keep-alive close race (RFC 9112 §9.3.1),
/// in which a backend closing an idle connection never read the request that met the close.
pub(crate) fn closed_when_reused(error: &hyper_util::client::legacy::Error) -> bool {
    let closed = std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<hyper::Error>())
        .is_some_and(|e| {
            e.is_incomplete_message()
                || std::error::Error::source(e)
                    .and_then(|e| e.downcast_ref::<io::Error>())
                    .is_some_and(|e| {
                        matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                        )
                    })
        });
    if !closed {
        return false;
    }
    let mut extensions = Extensions::new();
    if let Some(connected) = error.connect_info() {
        connected.get_extras(&mut extensions);
    }
    extensions
        .get::<Answered>()
        .is_some_and(|answered| answered.0.load(Relaxed))
}
