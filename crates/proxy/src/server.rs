//! Serving client connections on a worker.

use crate::{metrics::WorkerCounters, proxy::WorkerProxy, stall::Stall};
use duet_config::Limits;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::atomic::Ordering::Relaxed,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

/// Who is at the other end of a client connection, as its listener saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The peer's address.
    pub address: SocketAddr,
    /// Whether the connection is TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// Whether the peer is one of the listener's `trusted_proxies`, whose forwarding fields are kept.
    pub trusted: bool,
}

/// Serves one client connection until it closes, or until `shutdown` turns true: then the request in
/// progress (if any) finishes, and the connection closes instead of waiting for another.
///
/// `io` is the client connection (TCP, or TLS over TCP).
pub async fn serve_connection<IO>(
    proxy: Rc<WorkerProxy>,
    limits: Limits,
    io: IO,
    client: Client,
    mut shutdown: watch::Receiver<bool>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let counters = proxy.clone();
    let _active = Active::new(counters.counters());
    let service = service_fn(move |request| {
        let proxy = proxy.clone();
        async move { Ok::<_, Infallible>(proxy.handle(request, client).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // The head limit itself (start line and fields, counted as hyper parses them: 431 past it);
        // the read buffer gets room beyond it so the limit, not the buffer, decides.
        .max_header_size(limits.max_request_head)
        .max_buf_size(limits.max_request_head.saturating_mul(2))
        // A client that sends its request and then shuts its side down still gets the response.
        .half_close(true)
        .writev(false)
        .keep_alive(true);
    let io = SendTimeout {
        io,
        stall: Stall::new(limits.send_timeout),
    };
    let connection = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(connection);
    let mut draining = *shutdown.borrow();
    if draining {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    log_connection_error(&error, client.address, counters.counters());
                }
                return;
            }
            changed = shutdown.changed(), if !draining => {
                draining = true;
                if changed.is_err() || *shutdown.borrow() {
                    // Not at once: a request may be on the wire to an idle connection. Responses
                    // during the drain say `Connection: close`; what is still open after the grace
                    // finishes its request (if any) and closes.
                    tokio::select! {
                        result = connection.as_mut() => {
                            if let Err(error) = result {
                                log_connection_error(&error, client.address, counters.counters());
                            }
                            return;
                        }
                        () = tokio::time::sleep(DRAIN_GRACE) => connection.as_mut().graceful_shutdown(),
                    }
                }
            }
        }
    }
}

/// How long a connection may stay open after the drain starts before it is asked to close.
const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts a connection as active (and accepted) while it lives.
struct Active<'a>(&'a WorkerCounters);

impl<'a> Active<'a> {
    fn new(counters: &'a WorkerCounters) -> Self {
        counters.connections.fetch_add(1, Relaxed);
        counters.active.fetch_add(1, Relaxed);
        Self(counters)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}

/// A client connection whose writes may make no progress for at most `limits.send_timeout`: a client
/// that stops reading would otherwise hold its connection, and the backend's (counted as load), forever.
struct SendTimeout<IO> {
    io: IO,
    stall: Stall,
}

impl<IO> SendTimeout<IO> {
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending if self.stall.expired(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {:?}", self.stall.limit()),
            ))),
            Poll::Pending => Poll::Pending,
            ready => {
                self.stall.progressed();
                ready
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for SendTimeout<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SendTimeout<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.check(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.check(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

fn log_connection_error(error: &hyper::Error, peer: SocketAddr, counters: &WorkerCounters) {
    let count = |cell: &std::sync::atomic::AtomicU64| {
        cell.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    if error.is_parse_too_large() {
        count(&counters.head_too_large);
        tracing::info!(target: "duet::conn", %peer, reason = %"head_too_large", "rejected request: {error}");
    } else if error.is_parse() || error.is_parse_status() {
        count(&counters.malformed);
        tracing::info!(target: "duet::conn", %peer, reason = %"malformed", "rejected request: {error}");
    } else if std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<io::Error>())
        .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut)
    {
        count(&counters.send_timeout);
        tracing::info!(target: "duet::conn", %peer, reason = %"send_timeout", "closed a client that stopped reading: {error}");
    } else if error.is_timeout() {
        count(&counters.header_timeout);
        tracing::info!(target: "duet::conn", %peer, reason = %"header_timeout", "closed slow client: {error}");
    } else if error.is_incomplete_message() || error.is_canceled() {
        tracing::debug!(target: "duet::conn", %peer, "connection ended early: {error}");
    } else {
        tracing::debug!(target: "duet::conn", %peer, "connection error: {error}");
    }
}
