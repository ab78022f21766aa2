//! Serving client connections on a worker.

use crate::{metrics::WorkerCounters, proxy::WorkerProxy};
use duet_config::Limits;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{convert::Infallible, net::SocketAddr, rc::Rc};
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
    proxy
        .counters()
        .connections
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let counters = proxy.clone();
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
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
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
    } else if error.is_timeout() {
        count(&counters.header_timeout);
        tracing::info!(target: "duet::conn", %peer, reason = %"header_timeout", "closed slow client: {error}");
    } else if error.is_incomplete_message() || error.is_canceled() {
        tracing::debug!(target: "duet::conn", %peer, "connection ended early: {error}");
    } else {
        tracing::debug!(target: "duet::conn", %peer, "connection error: {error}");
    }
}
