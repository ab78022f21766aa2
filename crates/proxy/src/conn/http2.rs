//! HTTP/2 client connections: negotiated by ALPN on TLS listeners, or spoken with prior knowledge (the
//! connection preface) on plain ones. Each stream is one request through the same stages as an
//! HTTP/1.1 request, sent to its cluster's backends over HTTP/1.1, or over HTTP/2 for a `protocol: h2`
//! cluster.
//!
//! An h2 connection is never parked: its streams are tasks of their own on the worker's thread (hyper
//! spawns them through [`StreamExec`], which resets a stream whose client takes none of its response
//! for `limits.send_timeout`), and it closes with a GOAWAY once idle for
//! `limits.keepalive_timeout` (or if no request arrives within `limits.header_read_timeout` of the
//! accept), or when the drain starts; streams in progress finish first. A client that lets the GOAWAY
//! go unanswered (its PING never acknowledged) is closed `limits.header_read_timeout` after it, once
//! no stream is open: every state of a connection has a deadline.

use crate::conn::place::Place;
use crate::{
    attempt::body::ProxyBody,
    conn::{
        active::Active,
        io::{ClientIo, Prefixed, SendTimeout},
        recycled::Recycler,
        serve::log_connection_error,
        shared::Shared,
        stream_watch::{StreamExec, StreamWatch, Waiting},
        wakeups::{Armed, Woke},
    },
    exchange::{ConnectionState, InService},
    peer::Client,
    stall::Stall,
};
use bytes::Bytes;
use duet_config::Limits;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use hyper::{server::conn::http2, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    convert::Infallible,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};
use tokio::{
    io::AsyncReadExt,
    net::TcpStream,
    time::{timeout_at, Instant},
};

/// What a client speaking HTTP/2 with prior knowledge sends first (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a plain connection's first bytes say it speaks.
pub(crate) enum Sniffed {
    /// HTTP/1.1 (anything that is not the HTTP/2 preface), with whatever had to be read to tell.
    Http1(Bytes),
    /// HTTP/2 with prior knowledge, with whatever of the preface had to be read to tell.
    Http2(Bytes),
    /// The client closed, or sent nothing before `until`.
    Closed,
}

/// Tells HTTP/2 with prior knowledge from HTTP/1.1 by the first bytes of a plain connection, `read`
/// being those already read from it, waiting for the rest until `until`. The bytes are peeked, not
/// read, unless the preface arrives in pieces: an HTTP/1.1 connection costs one more system call and
/// no allocation.
pub(crate) async fn sniff(stream: &mut TcpStream, read: Bytes, until: Instant) -> Sniffed {
    let mut seen = [0u8; PREFACE.len()];
    let had = read.len().min(PREFACE.len());
    seen[..had].copy_from_slice(&read[..had]);
    if seen[..had] != PREFACE[..had] {
        return Sniffed::Http1(read);
    }
    if had == PREFACE.len() {
        return Sniffed::Http2(read);
    }
    let peeked = match timeout_at(until, stream.peek(&mut seen[had..])).await {
        Ok(Ok(0) | Err(_)) | Err(_) => return Sniffed::Closed,
        Ok(Ok(n)) => had + n,
    };
    if seen[..peeked] != PREFACE[..peeked] {
        return Sniffed::Http1(read);
    }
    if peeked == PREFACE.len() {
        return Sniffed::Http2(read);
    }
    // A prefix of the preface: read it, and what follows, until it is whole or differs.
    let mut have = had;
    while have < PREFACE.len() {
        match timeout_at(until, stream.read(&mut seen[have..])).await {
            Ok(Ok(0) | Err(_)) | Err(_) => return Sniffed::Closed,
            Ok(Ok(n)) => have += n,
        }
        if seen[..have] != PREFACE[..have] {
            return Sniffed::Http1(Bytes::copy_from_slice(&seen[..have]));
        }
    }
    Sniffed::Http2(Bytes::copy_from_slice(&seen))
}

/// A connection to serve over HTTP/2, and what it holds while open.
pub(crate) struct Http2Connection<IO> {
    pub(crate) shared: Rc<Shared>,
    pub(crate) io: Prefixed<IO>,
    pub(crate) client: Client,
    /// When it was accepted (TLS) or its first bytes arrived (plain): its first request is due
    /// `limits.header_read_timeout` after that.
    pub(crate) opened: Instant,
    pub(crate) active: Active,
    pub(crate) permit: Place,
}

/// Serves an HTTP/2 connection until the client closes it, it idles out, or the drain's GOAWAY has
/// let its streams finish.
///
/// It is idle while no request has started since the last check and no stream is open. Once the
/// GOAWAY is out, the close is timed too: a client that never answers its PING (or never sends a byte
/// at all) would otherwise hold the connection, and its place under `limits.max_connections`, for
/// good. Open streams finish under their own bounds first.
pub(crate) async fn serve<IO: ClientIo>(connection: Http2Connection<IO>) {
    let Http2Connection {
        shared,
        io,
        client,
        opened,
        active,
        permit,
    } = connection;
    let _held = (active, permit);
    let limits = shared.proxy().limits();
    let state = Rc::new(ConnectionState {
        tls: io.io.tls_session(),
        certificate: io.io.client_certificate(),
        ..ConnectionState::default()
    });
    let open = Rc::new(Cell::new(0usize));
    let watch = Rc::new(StreamWatch::new(
        limits.send_timeout,
        shared.counters.clone(),
        client.address,
    ));
    let service = stream_service(&shared, client, &state, &open, &watch);
    let io = TokioIo::new(SendTimeout {
        io,
        stall: Stall::new(limits.send_timeout),
        // HTTP/2 has no head to time between requests: its streams carry their own.
        head: None,
    });
    let connection = server_builder(&limits, StreamExec(watch)).serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut shutdown = shared.shutdown.clone();
    let close_within = limits.header_read_timeout;
    let mut closing = false;
    let mut seen = 0;
    let check = tokio::time::sleep_until(opened + limits.header_read_timeout);
    let mut check = std::pin::pin!(check);
    if *shutdown.borrow() {
        connection.as_mut().graceful_shutdown();
        closing = true;
        check.as_mut().reset(Instant::now() + close_within);
    }
    loop {
        let watch = (!closing).then_some(&shared.shutdown);
        match next_event(connection.as_mut(), check.as_mut(), &mut shutdown, watch).await {
            Event::Finished(result) => {
                if let Err(error) = result {
                    log_connection_error(&error, client.address, shared.counters());
                }
                return;
            }
            Event::Tick => {
                let requests = state.requests.get();
                if closing && open.get() == 0 {
                    tracing::debug!(target: "duet::conn", peer = %client.address, "closing an h2 connection whose client let its GOAWAY go unanswered");
                    return;
                }
                if requests == seen && open.get() == 0 && !closing {
                    tracing::trace!(target: "duet::conn", peer = %client.address, "idle h2 connection: GOAWAY");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                seen = requests;
                let next = if closing {
                    close_within
                } else {
                    limits.keepalive_timeout
                };
                check.as_mut().reset(Instant::now() + next);
            }
            Event::Signal(sender_alive) => {
                if !sender_alive || *shutdown.borrow() {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                    check.as_mut().reset(Instant::now() + close_within);
                }
            }
        }
    }
}

/// What woke [`serve`]'s loop.
enum Event {
    /// hyper is done with the connection.
    Finished(hyper::Result<()>),
    /// The idle (or closing) check is due.
    Tick,
    /// The drain signal changed (`false`: its sender is gone, which drains too).
    Signal(bool),
}

/// Waits for what [`serve`]'s loop acts on next: hyper finishing, the `check` timer, or a change of the
/// drain signal (watched while `watch`, the worker's receiver, is given); the timer and the signal
/// polled as [`Armed`] says, as the HTTP/1.1 connection's loop does.
async fn next_event<C: Future<Output = hyper::Result<()>>>(
    mut connection: Pin<&mut C>,
    mut check: Pin<&mut tokio::time::Sleep>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    watch: Option<&tokio::sync::watch::Receiver<bool>>,
) -> Event {
    let changed = shutdown.changed();
    let mut changed = std::pin::pin!(changed);
    let mut armed = Armed::default();
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = connection.as_mut().poll(cx) {
            return Poll::Ready(Event::Finished(result));
        }
        armed
            .poll(cx, check.as_mut(), changed.as_mut(), watch)
            .map(|woke| match woke {
                Woke::Timer => Event::Tick,
                Woke::Signal(sender_alive) => Event::Signal(sender_alive),
            })
    })
    .await
}

/// The spare slots a connection keeps for its streams' futures: enough for the streams that end
/// between two new ones at the default 100 streams a connection, 3 KB each.
const SPARE_STREAM_SLOTS: usize = 8;

/// The service hyper calls for each stream: the proxy's, its response body counting the stream as
/// open and watched by the stream's task ([`StreamWatch`]). Each stream's future is made in a slot a
/// finished stream left ([`Recycler`]), not boxed anew and copied into its box.
fn stream_service(
    shared: &Shared,
    client: Client,
    state: &Rc<ConnectionState>,
    open: &Rc<Cell<usize>>,
    watch: &Rc<StreamWatch>,
) -> impl hyper::service::HttpService<hyper::body::Incoming, ResBody = StreamBody, Error = Infallible>
{
    let (proxy, state, open) = (shared.proxy().clone(), state.clone(), open.clone());
    let watch = watch.clone();
    let recycler = Recycler::keeping(SPARE_STREAM_SLOTS);
    service_fn(move |request| {
        let stream = OpenStream::new(&open);
        let waiting = Rc::new(Waiting::default());
        watch.expect(waiting.clone());
        let (proxy, state) = (proxy.clone(), state.clone());
        let handled = recycler.recycled(|| proxy.handle(request, client, InService::new(state)));
        StreamResponse {
            handled,
            body: Some((waiting, stream)),
        }
    })
}

/// A stream's response, as the proxy makes it: its body made a [`StreamBody`] when it comes.
struct StreamResponse<F> {
    handled: F,
    /// What the body takes along; `None` once the response is out.
    body: Option<(Rc<Waiting>, OpenStream)>,
}

impl<F> Future for StreamResponse<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Unpin,
{
    type Output = Result<Response<StreamBody>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Ok(response) = std::task::ready!(Pin::new(&mut self.handled).poll(cx));
        let Some((waiting, stream)) = self.body.take() else {
            return Poll::Pending; // polled after it was ready: hyper never does
        };
        Poll::Ready(Ok(response.map(|body| StreamBody {
            body,
            waiting,
            _open: stream,
        })))
    }
}

/// hyper's HTTP/2 server with duet's limits (`limits.http2`).
fn server_builder(limits: &Limits, exec: StreamExec) -> http2::Builder<StreamExec> {
    let h2 = limits.http2;
    // The head limit, as HTTP/1.1's unless set apart: the decoded fields of one request, counted as
    // RFC 9113 §6.5.2 says (name, value and 32 bytes each).
    let list_size = h2.max_header_list_size.unwrap_or(limits.max_request_head);
    let mut builder = http2::Builder::new(exec);
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(list_size).unwrap_or(u32::MAX))
        .max_concurrent_streams(h2.max_concurrent_streams)
        .initial_stream_window_size(h2.windows.initial_stream_window_size)
        .initial_connection_window_size(h2.windows.initial_connection_window_size);
    // After the sizes: hyper's adaptive window replaces them.
    if h2.windows.adaptive_window {
        builder.adaptive_window(true);
    }
    if !h2.keepalive_interval.is_zero() {
        builder
            .keep_alive_interval(h2.keepalive_interval)
            .keep_alive_timeout(h2.keepalive_timeout);
    }
    builder
}

/// Counts a stream as open until its response body is done (or dropped with the stream).
struct OpenStream(Rc<Cell<usize>>);

impl OpenStream {
    fn new(open: &Rc<Cell<usize>>) -> Self {
        open.set(open.get() + 1);
        Self(open.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

pin_project! {
    /// A stream's response body: the proxy's, holding the stream open while it is sent, and telling
    /// the stream's task when hyper holds a frame of it for the client's window.
    pub(crate) struct StreamBody {
        #[pin]
        body: ProxyBody,
        waiting: Rc<Waiting>,
        _open: OpenStream,
    }
}

impl Body for StreamBody {
    type Data = Bytes;
    type Error = <ProxyBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        this.waiting.asked();
        let polled = this.body.poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = polled {
            this.waiting.handed();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
