//! Serving client connections on a worker.

use crate::{
    body::ProxyBody,
    metrics::WorkerCounters,
    proxy::WorkerProxy,
    respond::{tunnel, PendingTunnel},
    stall::Stall,
};
use bytes::Bytes;
use duet_config::Limits;
use http::Response;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{
    cell::{Cell, RefCell},
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::atomic::Ordering::Relaxed,
    task::{Context, Poll},
    time::Duration,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
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

/// What a connection's requests tell the loop that serves it.
#[derive(Default)]
pub(crate) struct ConnectionState {
    /// Requests started on this connection.
    requests: Cell<u64>,
    /// Requests whose response head is not yet out.
    in_service: Cell<u32>,
    /// A `101` went out: the connection becomes a tunnel to this backend once hyper hands it back.
    tunnel: RefCell<Option<PendingTunnel>>,
}

impl ConnectionState {
    pub(crate) fn expect_tunnel(&self, pending: PendingTunnel) {
        *self.tunnel.borrow_mut() = Some(pending);
    }

    /// How many requests this connection has carried (the current one included).
    pub(crate) fn requests(&self) -> u64 {
        self.requests.get()
    }
}

/// Counts a request as in service until its response head is out (or it is cancelled).
struct InService(Rc<ConnectionState>);

impl InService {
    fn new(state: Rc<ConnectionState>) -> Self {
        state.requests.set(state.requests.get() + 1);
        state.in_service.set(state.in_service.get() + 1);
        Self(state)
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        self.0.in_service.set(self.0.in_service.get() - 1);
    }
}

/// Serves one client connection until it closes, or until `shutdown` turns true: then the request in
/// progress (if any) finishes, and the connection closes instead of waiting for another.
///
/// A keep-alive connection that has been idle for a moment is **parked**: hyper's state for it (read
/// and write buffers, parser, timers: most of a connection's memory) is given back, and only the socket
/// waits for the next request's first byte, for up to `limits.keepalive_timeout`. That byte starts a
/// fresh hyper connection, so `limits.header_read_timeout` times the head from its first byte, never the
/// idle wait. `io` is the client connection (TCP, or TLS over TCP).
pub fn serve_connection<IO>(
    proxy: Rc<WorkerProxy>,
    limits: Limits,
    io: IO,
    client: Client,
    mut shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // Park before hyper's header timer (which also runs while a kept-alive connection waits) could fire.
    let park_after = PARK_AFTER
        .min(limits.header_read_timeout / 2)
        .min(limits.keepalive_timeout / 2);
    let mut connection = Connection {
        proxy,
        limits,
        client,
        park_after,
        requests: 0,
        io: Some(Prefixed {
            prefix: Bytes::new(),
            io,
        }),
    };
    // An async block over one struct rather than an async fn, which would keep every argument twice,
    // and nothing held across an await but that struct: a parked connection is this future and its
    // socket, so every byte here counts ten thousand times.
    async move {
        let _active = Active::new(connection.proxy.clone());
        loop {
            // Boxed, and freed before the connection parks: hyper's buffers and parser, the service and
            // this turn's timers are most of a connection's memory; a parked connection keeps none of
            // them.
            let turn = Box::pin(hyper_turn(&mut connection, &mut shutdown));
            if !turn.await || *shutdown.borrow() || !park(&mut connection, &mut shutdown).await {
                return;
            }
        }
    }
}

/// What a connection keeps from one turn of hyper to the next.
struct Connection<IO> {
    proxy: Rc<WorkerProxy>,
    limits: Limits,
    client: Client,
    /// How long a keep-alive connection idles with hyper before it is parked.
    park_after: Duration,
    /// Requests carried so far.
    requests: u64,
    /// The connection itself, between turns.
    io: Option<Prefixed<IO>>,
}

/// Serves requests with a fresh hyper connection until the connection ends (`false`) or has idled
/// long enough to park (`true`, the connection back in `connection.io`). A connection upgraded by a
/// `101` becomes a tunnel here, and ends with it.
async fn hyper_turn<IO>(
    connection: &mut Connection<IO>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(io) = connection.io.take() else {
        return false;
    };
    let Connection {
        ref proxy,
        ref limits,
        client,
        park_after,
        requests,
        ..
    } = *connection;
    let state = Rc::new(ConnectionState {
        requests: Cell::new(requests),
        ..ConnectionState::default()
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
    let service = {
        let (proxy, state) = (proxy.clone(), state.clone());
        service_fn(move |request| {
            let (proxy, state) = (proxy.clone(), state.clone());
            Box::pin(async move {
                let _in_service = InService::new(state.clone());
                Ok::<_, Infallible>(proxy.handle(request, client, &state).await)
            }) as Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>>>>
        })
    };
    let http = builder.serve_connection(
        TokioIo::new(SendTimeout {
            io,
            stall: Stall::new(limits.send_timeout),
        }),
        service,
    );
    let parts = match drive(http, &state, shutdown, park_after, proxy, client).await {
        Finished::Handed(parts) => parts,
        Finished::Done(parts) => {
            // hyper has flushed; close our side properly (a TLS close_notify, a TCP FIN).
            let mut io = parts.io.into_inner();
            let _ = tokio::time::timeout(DRAIN_GRACE, io.shutdown()).await;
            return false;
        }
        Finished::Failed => return false,
    };
    // What hyper read but did not use comes first, then whatever of our prefix it never read. Copied
    // out, and `read_buf` dropped here: even empty, it is a view that keeps hyper's whole read buffer.
    let http1::Parts { io, read_buf, .. } = parts;
    let rest = io.into_inner().io;
    let prefix = if read_buf.is_empty() && rest.prefix.is_empty() {
        Bytes::new()
    } else {
        [read_buf, rest.prefix].concat().into()
    };
    let io = Prefixed {
        prefix,
        io: rest.io,
    };
    let pending = state.tunnel.borrow_mut().take();
    if let Some(pending) = pending {
        let _open = proxy.tunnel_opened();
        tunnel(io, pending).await;
        return false;
    }
    connection.requests = state.requests.get();
    connection.io = Some(io);
    true
}

/// How long a keep-alive connection stays idle with its hyper state before it is parked (at most; less
/// when the header or keep-alive timeouts are shorter).
const PARK_AFTER: Duration = Duration::from_secs(2);

/// How long a connection may stay open after the drain starts before it is asked to close.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// How hyper's turn on a connection ended.
enum Finished<P> {
    /// Idle long enough to park, or upgraded: the connection goes on without hyper.
    Handed(P),
    /// The exchange is over (the client asked to close, or duet is draining): close the connection.
    Done(P),
    /// The connection failed (and was logged).
    Failed,
}

/// Runs hyper over the connection until it is done, fails, has been idle for `park_after`, or a `101`
/// has gone out.
async fn drive<IO, S>(
    mut connection: http1::Connection<TokioIo<SendTimeout<Prefixed<IO>>>, S>,
    state: &ConnectionState,
    shutdown: &mut watch::Receiver<bool>,
    park_after: Duration,
    proxy: &WorkerProxy,
    client: Client,
) -> Finished<http1::Parts<TokioIo<SendTimeout<Prefixed<IO>>>, S>>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody> + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut draining = *shutdown.borrow();
    if draining {
        Pin::new(&mut connection).graceful_shutdown();
    }
    // Whether we asked hyper to stop (to park), as opposed to the client ending the connection.
    let mut parking = false;
    // Idleness is checked twice per `park_after` without reading the clock per request: two quiet
    // checks in a row park the connection, between 1 and 1.5 × `park_after` after its last request.
    let (mut seen, mut quiet) = (state.requests.get(), 0);
    let mut drain_grace = None;
    loop {
        let idle = tokio::time::sleep(park_after / 2);
        tokio::pin!(idle);
        let finished = tokio::select! {
            result = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => Some(result),
            () = &mut idle => None,
            changed = shutdown.changed(), if !draining => {
                draining = true;
                if changed.is_err() || *shutdown.borrow() {
                    // Not at once: a request may be on the wire to an idle connection. Responses during
                    // the drain say `Connection: close`; what is still open after the grace finishes its
                    // request (if any) and closes.
                    drain_grace = Some(Box::pin(tokio::time::sleep(DRAIN_GRACE)));
                }
                continue;
            }
            () = async { if let Some(grace) = drain_grace.as_mut() { grace.await } else { std::future::pending().await } } => {
                drain_grace = None;
                Pin::new(&mut connection).graceful_shutdown();
                continue;
            }
        };
        match finished {
            Some(Ok(())) => {
                let upgraded = state.tunnel.borrow().is_some();
                let parts = connection.into_parts();
                return if (parking && !draining) || upgraded {
                    Finished::Handed(parts)
                } else {
                    Finished::Done(parts)
                };
            }
            Some(Err(error)) => {
                log_connection_error(&error, client.address, proxy.counters());
                return Finished::Failed;
            }
            None => {
                let requests = state.requests.get();
                quiet = if requests == seen && state.in_service.get() == 0 {
                    quiet + 1
                } else {
                    0
                };
                seen = requests;
                if quiet >= 2 && !draining && !parking {
                    parking = true;
                    Pin::new(&mut connection).graceful_shutdown();
                }
            }
        }
    }
}

/// Waits, holding nothing but the socket, for the next request's first byte, for at most what is left
/// of `limits.keepalive_timeout`; `false` when the client closed, the wait ran out, or duet is
/// draining. A connection whose next request has already arrived (pipelined) does not wait.
async fn park<IO: AsyncRead + Unpin>(
    connection: &mut Connection<IO>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let wait = (connection.limits.keepalive_timeout).saturating_sub(connection.park_after);
    let Some(io) = connection.io.as_mut() else {
        return false;
    };
    if !io.prefix.is_empty() {
        return true;
    }
    tracing::trace!(target: "duet::conn", peer = %connection.client.address, "parked");
    let mut byte = [0u8; 1];
    tokio::select! {
        read = io.io.read(&mut byte) => match read {
            Ok(1) => {
                io.prefix = Bytes::copy_from_slice(&byte);
                true
            }
            _ => false,
        },
        () = tokio::time::sleep(wait) => false,
        _ = shutdown.wait_for(|stop| *stop) => false,
    }
}

/// A connection with bytes already read from it in front.
struct Prefixed<IO> {
    prefix: Bytes,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Counts a connection as active (and accepted) while it lives.
struct Active(Rc<WorkerProxy>);

impl Active {
    fn new(proxy: Rc<WorkerProxy>) -> Self {
        let counters = proxy.counters();
        counters.connections.fetch_add(1, Relaxed);
        counters.active.fetch_add(1, Relaxed);
        Self(proxy)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.counters().active.fetch_sub(1, Relaxed);
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
