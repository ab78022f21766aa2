//! Serving client connections on a worker.

use crate::conn::place::Place;
use crate::{
    conn::{
        active::Active,
        head_timer::{ClientBody, HeadClock, WithClientBody},
        io::{ClientIo, Prefixed, SendTimeout},
        linger::linger,
        parking::Parked,
        recycled::Recycler,
        shared::Shared,
        wakeups::{Armed, Woke},
    },
    exchange::{ConnectionState, InService},
    peer::Client,
    stall::Stall,
    telemetry::metrics::WorkerCounters,
    tunnel::tunnel,
};
use bytes::Bytes;
use duet_config::Limits;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use std::{
    cell::Cell, future::Future, io, net::SocketAddr, pin::Pin, rc::Rc, task::Poll, time::Duration,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::{
    sync::watch,
    time::{Instant, Sleep},
};

/// Turns of hyper, and parking between them, until the connection ends or leaves for the parking lot.
/// Nothing is held across an await but the connection and `shutdown`: every byte of this future counts
/// for every connection parked in its task.
pub(crate) async fn serve<IO: ClientIo>(
    mut connection: Connection<IO>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        // Boxed, and freed before the connection parks: hyper's buffers and parser, the service and this
        // turn's timers are most of a connection's memory; a parked connection keeps none of them.
        let turn = Box::pin(hyper_turn(&mut connection, &mut shutdown));
        if !turn.await || *shutdown.borrow() {
            return;
        }
        if leave_for_the_lot(&mut connection) {
            return;
        }
        if !park(&mut connection, &mut shutdown).await {
            return;
        }
    }
}

/// Hands an idle plain TCP connection (nothing of its next request read yet) to the worker's parking
/// lot; `true` if it left (or was closed on the way), `false` if it parks in its task instead.
fn leave_for_the_lot<IO: ClientIo>(connection: &mut Connection<IO>) -> bool {
    if connection
        .io
        .as_ref()
        .is_none_or(|io| !io.prefix.is_empty())
    {
        return false;
    }
    let connections = connection.connections.clone();
    let Some(lot) = connections.parking_lot() else {
        return false;
    };
    let Some(Prefixed { prefix, io }) = connection.io.take() else {
        return true;
    };
    let stream = match io.into_parkable() {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(target: "duet::conn", peer = %connection.client.address, "closing instead of parking: {error}");
            return true;
        }
        Err(io) => {
            connection.io = Some(Prefixed { prefix, io });
            return false;
        }
    };
    let (Some(active), permit) = (
        connection.active.take(),
        std::mem::take(&mut connection.permit),
    ) else {
        return true;
    };
    let deadline = connection.idle_until();
    tracing::trace!(target: "duet::conn", peer = %connection.client.address, "parked");
    lot.park(
        stream,
        Parked {
            client: connection.client,
            requests: connection.requests,
            active,
            permit,
        },
        deadline,
    );
    true
}

/// What a connection keeps from one turn of hyper to the next.
pub(crate) struct Connection<IO> {
    connections: Rc<Shared>,
    limits: Limits,
    client: Client,
    /// How long a keep-alive connection idles with hyper before it is parked.
    park_after: Duration,
    /// Requests carried so far.
    requests: u64,
    /// The connection itself, between turns.
    io: Option<Prefixed<IO>>,
    /// Counts the connection as open; goes to the parking lot with it.
    active: Option<Active>,
    /// Its place under `limits.max_connections`; goes to the parking lot with it.
    permit: Place,
}

impl<IO> Connection<IO> {
    pub(crate) fn new(
        connections: Rc<Shared>,
        client: Client,
        io: Option<Prefixed<IO>>,
        requests: u64,
        active: Active,
        permit: Place,
    ) -> Self {
        // The limits current when the connection (or its next turn after parking) starts.
        let limits = connections.proxy().limits();
        let park_after = park_after(&limits);
        Self {
            connections,
            limits,
            client,
            park_after,
            requests,
            io,
            active: Some(active),
            permit,
        }
    }

    /// When the connection, idle from now on (it has just been parked, `park_after` after its last
    /// request, or after the start of a turn that read no request), is closed: after what is left of
    /// `limits.keepalive_timeout`. A connection that has sent no request yet is timed the same way:
    /// clients open connections ahead of their requests.
    fn idle_until(&self) -> Instant {
        Instant::now() + (self.limits.keepalive_timeout).saturating_sub(self.park_after)
    }
}

/// How long a connection idles in its task (with hyper, or waiting for its first byte) before it is
/// parked: before hyper's header timer (which also runs while a kept-alive connection waits) could
/// fire.
pub(crate) fn park_after(limits: &Limits) -> Duration {
    PARK_AFTER
        .min(limits.header_read_timeout / 2)
        .min(limits.keepalive_timeout / 2)
}

/// Serves requests with a fresh hyper connection until the connection ends (`false`) or has idled
/// long enough to park (`true`, the connection back in `connection.io`). A connection upgraded by a
/// `101` becomes a tunnel here, and ends with it.
async fn hyper_turn<IO: ClientIo>(
    connection: &mut Connection<IO>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let Some(io) = connection.io.take() else {
        return false;
    };
    // A request already started (pipelined, or the byte that woke a parked connection) is served
    // even when the drain has begun; its response says `Connection: close`.
    let request_waiting = !io.prefix.is_empty();
    let Connection {
        ref connections,
        ref limits,
        client,
        park_after,
        requests,
        ..
    } = *connection;
    let state = Rc::new(ConnectionState {
        requests: Cell::new(requests),
        tls: io.io.tls_session(),
        certificate: io.io.client_certificate(),
        ..ConnectionState::default()
    });
    let head = Rc::new(HeadClock::new(limits.header_read_timeout));
    let service = {
        let (proxy, state, head) = (connections.proxy().clone(), state.clone(), head.clone());
        // Each request's future is made into the slot the one before it left.
        let recycler = Recycler::new();
        service_fn(move |request| {
            // hyper hands over the head that was awaited.
            head.disarm();
            let (proxy, state) = (proxy.clone(), state.clone());
            let future = recycler.recycled(|| proxy.handle(request, client, InService::new(state)));
            WithClientBody::new(future, head.clone())
        })
    };
    let io = TokioIo::new(SendTimeout {
        io,
        stall: Stall::new(limits.send_timeout),
        head: Some(head.clone()),
    });
    let http = server_builder(limits).serve_connection(io, service);
    let turn = Turn {
        state: &state,
        head: &head,
        park_after,
        request_waiting,
        connections,
        client,
    };
    let parts = match drive(http, turn, shutdown).await {
        Finished::Handed(parts) => parts,
        Finished::Done(parts) => {
            // hyper has flushed; close our side properly (a TLS close_notify, a TCP FIN), then read
            // what the client is still sending, so that it can read the answer before the close.
            // Only the socket is kept meanwhile: hyper's read buffer and the service go now.
            let sending = !parts.read_buf.is_empty();
            let mut io = parts.io.into_inner();
            drop((parts.read_buf, parts.service));
            let _ = tokio::time::timeout(DRAIN_GRACE, io.shutdown()).await;
            linger(&mut io, sending, shutdown).await;
            return false;
        }
        Finished::Failed => return false,
    };
    let io = unread(parts);
    let pending = state.tunnel.borrow_mut().take();
    if let Some(pending) = pending {
        let _open = connections.tunnel_opened();
        tunnel(io, pending).await;
        return false;
    }
    connection.requests = state.requests.get();
    connection.io = Some(io);
    true
}

/// hyper's HTTP/1.1 server with duet's limits.
fn server_builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        // `limits.header_read_timeout` is duet's to time (`HeadClock`), at `drive`'s idle tick: hyper's
        // timer costs hundreds of instructions per request.
        .header_read_timeout(None)
        // The head limit itself (start line and fields, counted as hyper parses them: 431 past it);
        // the read buffer gets room beyond it so the limit, not the buffer, decides, and no more: the
        // buffer holding a head lives as long as its request (the fields point into it), and one
        // twice the head's size (as it was) made a 64 KiB head cost 128 KiB.
        .max_header_size(limits.max_request_head)
        .max_buf_size(limits.max_request_head.saturating_add(16 * 1024))
        // A client that sends its request and then shuts its side down still gets the response.
        .half_close(true)
        .writev(false)
        .keep_alive(true);
    builder
}

/// The connection hyper handed back, with what hyper read but did not use in front of it, then
/// whatever of our prefix it never read. Copied out, and `read_buf` dropped here: even empty, it is a
/// view that keeps hyper's whole read buffer.
fn unread<IO, S>(parts: http1::Parts<TokioIo<SendTimeout<Prefixed<IO>>>, S>) -> Prefixed<IO> {
    let http1::Parts { io, read_buf, .. } = parts;
    let rest = io.into_inner().io;
    let prefix = if read_buf.is_empty() && rest.prefix.is_empty() {
        Bytes::new()
    } else {
        [read_buf, rest.prefix].concat().into()
    };
    Prefixed {
        prefix,
        io: rest.io,
    }
}

/// What [`drive`] watches on one turn of hyper.
struct Turn<'a> {
    state: &'a ConnectionState,
    /// When the head awaited is due.
    head: &'a HeadClock,
    park_after: Duration,
    request_waiting: bool,
    connections: &'a Shared,
    client: Client,
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
    turn: Turn<'_>,
    shutdown: &mut watch::Receiver<bool>,
) -> Finished<http1::Parts<TokioIo<SendTimeout<Prefixed<IO>>>, S>>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = ClientBody> + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Turn {
        state,
        head,
        park_after,
        request_waiting,
        connections,
        client,
    } = turn;
    let mut draining = *shutdown.borrow();
    if draining && !request_waiting {
        Pin::new(&mut connection).graceful_shutdown();
    }
    // Whether we asked hyper to stop (to park), as opposed to the client ending the connection.
    let (mut parking, mut idleness) = (false, Idleness::new(state));
    // Draining already with a request waiting: it is served, then the connection is asked to close
    // as any other would be during the drain.
    let mut drain_grace =
        (draining && request_waiting).then(|| Box::pin(tokio::time::sleep(DRAIN_GRACE)));
    loop {
        // The tick also cuts a stalled head: its deadline is checked only here.
        let event = next_event(
            &mut connection,
            park_after / 2,
            shutdown,
            (!draining).then_some(&connections.shutdown),
            &mut drain_grace,
        )
        .await;
        match event {
            Event::Finished(Ok(())) => {
                let handed = (parking && !draining) || state.tunnel.borrow().is_some();
                let parts = connection.into_parts();
                return if handed {
                    Finished::Handed(parts)
                } else {
                    Finished::Done(parts)
                };
            }
            Event::Finished(Err(error)) => {
                log_connection_error(&error, client.address, connections.counters());
                return Finished::Failed;
            }
            Event::Tick if head.expired() => {
                log_header_timeout(client.address, connections.counters());
                return Finished::Failed;
            }
            Event::Tick => {
                if idleness.idle_again(state) && !draining && !parking {
                    parking = true;
                    Pin::new(&mut connection).graceful_shutdown();
                }
            }
            Event::Signal(open) => {
                draining = true;
                if !open || *shutdown.borrow() {
                    // Not at once: a request may be on the wire to an idle connection. Responses during
                    // the drain say `Connection: close`; what is still open after the grace finishes its
                    // request (if any) and closes.
                    drain_grace = Some(Box::pin(tokio::time::sleep(DRAIN_GRACE)));
                }
            }
            Event::Grace => {
                drain_grace = None;
                Pin::new(&mut connection).graceful_shutdown();
            }
        }
    }
}

/// Waits for what [`drive`]'s loop acts on next: hyper finishing, the idle tick (`tick` from now), a
/// change of the drain signal (watched while `watch`, the worker's receiver, is given), or the end of
/// the drain's grace; the tick and the signal polled as [`Armed`] says.
async fn next_event<IO, S>(
    connection: &mut http1::Connection<TokioIo<SendTimeout<Prefixed<IO>>>, S>,
    tick: Duration,
    shutdown: &mut watch::Receiver<bool>,
    watch: Option<&watch::Receiver<bool>>,
    drain_grace: &mut Option<Pin<Box<Sleep>>>,
) -> Event
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = ClientBody> + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let idle = tokio::time::sleep(tick);
    tokio::pin!(idle);
    let changed = shutdown.changed();
    tokio::pin!(changed);
    let mut armed = Armed::default();
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = connection.poll_without_shutdown(cx) {
            return Poll::Ready(Event::Finished(result));
        }
        match armed.poll(cx, idle.as_mut(), changed.as_mut(), watch) {
            Poll::Ready(Woke::Timer) => return Poll::Ready(Event::Tick),
            Poll::Ready(Woke::Signal(open)) => return Poll::Ready(Event::Signal(open)),
            Poll::Pending => {}
        }
        if let Some(grace) = drain_grace.as_mut() {
            if grace.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Grace);
            }
        }
        Poll::Pending
    })
    .await
}

enum Event {
    /// hyper is done with the connection.
    Finished(hyper::Result<()>),
    /// The idle tick.
    Tick,
    /// The drain signal changed (`false`: its sender is gone, which drains too).
    Signal(bool),
    /// The drain's grace has run out.
    Grace,
}

/// Idleness, checked twice per `park_after` without reading the clock per request: two quiet checks in
/// a row park the connection, between 1 and 1.5 × `park_after` after its last request.
struct Idleness {
    seen: u64,
    quiet: u32,
}

impl Idleness {
    fn new(state: &ConnectionState) -> Self {
        Self {
            seen: state.requests.get(),
            quiet: 0,
        }
    }

    /// Whether nothing has happened on the connection since the check before last.
    fn idle_again(&mut self, state: &ConnectionState) -> bool {
        let requests = state.requests.get();
        self.quiet = if requests == self.seen && state.in_service.get() == 0 {
            self.quiet + 1
        } else {
            0
        };
        self.seen = requests;
        self.quiet >= 2
    }
}

/// Waits, holding nothing but the socket, for the next request's first byte, for at most what is left
/// of `limits.keepalive_timeout`; `false` when the client closed, the wait ran out, or duet is draining. A
/// connection whose next request has already arrived (pipelined) does not wait.
async fn park<IO: AsyncRead + Unpin>(
    connection: &mut Connection<IO>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let until = connection.idle_until();
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
        () = tokio::time::sleep_until(until) => false,
        _ = shutdown.wait_for(|stop| *stop) => false,
    }
}

pub(crate) fn log_connection_error(
    error: &hyper::Error,
    peer: SocketAddr,
    counters: &WorkerCounters,
) {
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
        log_header_timeout(peer, counters);
    } else if error.is_incomplete_message() || error.is_canceled() {
        tracing::debug!(target: "duet::conn", %peer, "connection ended early: {error}");
    } else {
        tracing::debug!(target: "duet::conn", %peer, "connection error: {error}");
    }
}

/// A client that took longer than `limits.header_read_timeout` over a request head (or to start one on
/// a kept-alive connection) has been cut off.
fn log_header_timeout(peer: SocketAddr, counters: &WorkerCounters) {
    counters
        .header_timeout
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(target: "duet::conn", %peer, reason = %"header_timeout", "closed slow client: read header from client timeout");
}
