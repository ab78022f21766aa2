//! Real HTTP/1.1 backends on loopback for duet's tests, demo and load benchmarks.
//!
//! Each [`Backend`] runs hyper on its own thread and runtime, on a port the OS chooses, and answers by
//! path:
//!
//! | path | answer |
//! |---|---|
//! | `/bytes/N` | N bytes (`x`), streamed in 64 KiB chunks with a `Content-Length` |
//! | `/upload` | reads the request body as a stream and answers with its length |
//! | `/status/N` | status N (with `?retry-after=S`, a `Retry-After: S` header too) |
//! | `/sleep/MS` | waits MS milliseconds, then answers |
//! | `/die` | announces 1 MB, sends 64 KiB, then fails the body (the connection is cut) |
//! | `/upgrade` | `101 Switching Protocols`, then echoes every byte it receives |
//! | `/healthz` | `200 ok` at once (no delay) |
//! | anything else | the backend's name, after its configured delay |
//!
//! Every request is counted, and its head recorded, so a test can assert which backend served what and
//! which headers arrived.

pub mod alloc;
pub mod config;
pub mod fixed_rate;
pub mod load;
pub mod raw;
pub mod wait;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{
    body::{Frame, Incoming},
    server::conn::http1,
    service::service_fn,
    HeaderMap, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    rc::Rc,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    sync::oneshot,
};

type Body = BoxBody<Bytes, io::Error>;

/// How a backend behaves.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Name, sent as the body of default answers and in an `x-backend` header.
    pub name: String,
    /// Delay before each default answer.
    pub delay: Duration,
    /// Close keep-alive connections idle for this long (to test pooled connections that went stale).
    pub idle_timeout: Option<Duration>,
    /// Address to bind; defaults to 127.0.0.1:0.
    pub address: SocketAddr,
    /// If set, default answers wait a uniform random time in `[delay, jitter_to)` instead of `delay`.
    pub jitter_to: Option<Duration>,
    /// Answer at most this many default requests at once; the rest wait their turn (first come, first
    /// served): a server with that many workers and a queue in front of them.
    pub max_concurrency: Option<usize>,
    /// If set, default answers take an exponentially distributed time with this mean (a server whose
    /// work per request varies, as queueing theory's M/M/c models it) instead of `delay`.
    pub exponential_mean: Option<Duration>,
    /// From `.0` to `.1` after the backend starts, default answers take `.2`.
    pub slow_window: Option<(Duration, Duration, Duration)>,
    /// Each default answer, with probability `.0`, takes `.1` longer (a GC pause, a cold cache): a
    /// stall that can hit any request of any backend.
    pub stalls: Option<(f64, Duration)>,
    /// Keep every request head for [`Backend::recorded`] (tests); off for a long-running backend, whose
    /// memory would otherwise grow with every request.
    pub record_requests: bool,
}

impl BackendOptions {
    /// A backend called `name` that answers at once.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            delay: Duration::ZERO,
            idle_timeout: None,
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            jitter_to: None,
            max_concurrency: None,
            exponential_mean: None,
            record_requests: true,
            slow_window: None,
            stalls: None,
        }
    }

    /// With probability `chance`, a default answer takes `extra` longer.
    pub fn random_stalls(mut self, chance: f64, extra: Duration) -> Self {
        self.stalls = Some((chance, extra));
        self
    }

    /// Default answers wait a uniform random time in `[low, high)`.
    pub fn uniform_delay(mut self, low: Duration, high: Duration) -> Self {
        self.delay = low;
        self.jitter_to = Some(high);
        self
    }

    /// At most `limit` default answers in progress at once.
    pub fn max_concurrency(mut self, limit: usize) -> Self {
        self.max_concurrency = Some(limit);
        self
    }

    /// Default answers take an exponentially distributed time of mean `mean`.
    pub fn exponential_delay(mut self, mean: Duration) -> Self {
        self.exponential_mean = Some(mean);
        self
    }

    /// Between `from` and `to` after start, default answers take `latency`.
    pub fn slow_between(mut self, from: Duration, to: Duration, latency: Duration) -> Self {
        self.slow_window = Some((from, to, latency));
        self
    }

    /// Adds a delay before each default answer.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Closes idle keep-alive connections after `timeout`.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }
}

/// A request as the backend received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Method.
    pub method: String,
    /// Target, as received.
    pub uri: String,
    /// Headers, as received.
    pub headers: HeaderMap,
    /// HTTP version.
    pub version: hyper::Version,
}

#[derive(Default)]
struct Shared {
    requests: AtomicU64,
    connections: AtomicU64,
    /// Connections that ended while the backend ran (closed by either side).
    closed: AtomicU64,
    /// Requests received in each second since the backend started.
    per_second: Mutex<Vec<u64>>,
    started: Mutex<Option<std::time::Instant>>,
    recorded: Mutex<Vec<Recorded>>,
}

/// A running backend. Dropping it (or [`Backend::stop`]) stops it and closes its connections.
pub struct Backend {
    address: SocketAddr,
    name: String,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Backend {
    /// Starts a backend on its own thread.
    pub fn start(options: BackendOptions) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(options.address)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        if let Ok(mut started) = shared.started.lock() {
            *started = Some(std::time::Instant::now());
        }
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let name = options.name.clone();
        let thread = {
            let shared = shared.clone();
            thread::Builder::new()
                .name(format!("backend-{}", options.name))
                .spawn(move || {
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&runtime, serve(listener, options, shared, stopped));
                })?
        };
        Ok(Self {
            address,
            name,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Requests received in each whole second since the backend started.
    pub fn requests_per_second(&self) -> Vec<u64> {
        self.shared
            .per_second
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Connections that have ended so far, closed by either side: with [`BackendOptions::idle_timeout`],
    /// a test waits on this for the backend to have closed an idle connection.
    pub fn connections_closed(&self) -> u64 {
        self.shared.closed.load(Ordering::Relaxed)
    }

    /// The requests received so far, oldest first.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared
            .recorded
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Stops serving and closes every connection, like a crashed process.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn serve(
    listener: std::net::TcpListener,
    options: BackendOptions,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    let behaviour = Rc::new(Behaviour {
        limit: options
            .max_concurrency
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n))),
        started: tokio::time::Instant::now(),
        random: std::cell::RefCell::new(
            <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(
                options
                    .name
                    .bytes()
                    .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
            ),
        ),
        options,
    });
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nodelay(true);
                let behaviour = behaviour.clone();
                let shared = shared.clone();
                connections.spawn_local(async move {
                    let idle_timeout = behaviour.options.idle_timeout;
                    let ended = shared.clone();
                    let service = service_fn(move |request| answer(request, behaviour.clone(), shared.clone()));
                    let mut builder = http1::Builder::new();
                    builder.timer(TokioTimer::new()).writev(false);
                    if let Some(idle) = idle_timeout {
                        builder.header_read_timeout(idle);
                    }
                    let _ = builder.serve_connection(TokioIo::new(stream), service).with_upgrades().await;
                    ended.closed.fetch_add(1, Ordering::Relaxed);
                });
            }
        }
    }
    // Dropping the set aborts every connection task: their sockets close.
    connections.abort_all();
}

fn full(status: StatusCode, body: impl Into<Bytes>, name: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    if let Ok(value) = name.parse() {
        response.headers_mut().insert("x-backend", value);
    }
    response
}

/// A backend's options and the state its answers share (on the backend's own thread).
struct Behaviour {
    options: BackendOptions,
    limit: Option<Arc<tokio::sync::Semaphore>>,
    started: tokio::time::Instant,
    random: std::cell::RefCell<rand::rngs::SmallRng>,
}

impl Behaviour {
    fn delay(&self) -> Duration {
        let base = self.base_delay();
        match self.options.stalls {
            Some((chance, extra)) if self.unit() < chance => base + extra,
            _ => base,
        }
    }

    /// A uniform draw in [0, 1).
    fn unit(&self) -> f64 {
        (rand::Rng::next_u64(&mut *self.random.borrow_mut()) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn base_delay(&self) -> Duration {
        if let Some((from, to, latency)) = self.options.slow_window {
            let since = self.started.elapsed();
            if since >= from && since < to {
                return latency;
            }
        }
        let unit = || self.unit();
        if let Some(mean) = self.options.exponential_mean {
            // Inverse transform: -ln(U) for U in (0, 1] is exponential with mean 1.
            return mean.mul_f64(-(1.0 - unit()).ln());
        }
        match self.options.jitter_to {
            Some(high) if high > self.options.delay => {
                self.options.delay + (high - self.options.delay).mul_f64(unit())
            }
            _ => self.options.delay,
        }
    }
}

async fn answer(
    mut request: Request<Incoming>,
    behaviour: Rc<Behaviour>,
    shared: Arc<Shared>,
) -> Result<Response<Body>, Infallible> {
    let options = &behaviour.options;
    count(&shared);
    if options.record_requests {
        record(&request, &shared);
    }
    let name = options.name.as_str();
    let path = request.uri().path().to_owned();
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    let response = match (segments.next(), segments.next()) {
        (Some("bytes"), Some(n)) => bytes(n.parse().unwrap_or(0)),
        (Some("upload"), _) => {
            let total = drain_body(&mut request).await;
            full(StatusCode::OK, total.to_string(), name)
        }
        (Some("healthz"), None) => full(StatusCode::OK, "ok", name),
        (Some("status"), Some(code)) => {
            let status = code
                .parse()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::OK);
            let mut response = full(status, format!("status {}\n", status.as_u16()), name);
            if let Some(seconds) = retry_after(request.uri().query()) {
                response
                    .headers_mut()
                    .insert(hyper::header::RETRY_AFTER, seconds.into());
            }
            response
        }
        (Some("sleep"), Some(ms)) => {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
            full(StatusCode::OK, name.to_owned(), name)
        }
        (Some("die"), _) => die(),
        (Some("upgrade"), _) => upgrade(&mut request, name),
        _ => {
            let _permit = match &behaviour.limit {
                Some(limit) => limit.clone().acquire_owned().await.ok(),
                None => None,
            };
            let delay = behaviour.delay();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            full(StatusCode::OK, name.to_owned(), name)
        }
    };
    Ok(response)
}

/// The `retry-after=S` of a query, if there is one.
fn retry_after(query: Option<&str>) -> Option<u64> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("retry-after="))?
        .parse()
        .ok()
}

/// Counts a request, in total and in its second since the count started.
fn count(shared: &Shared) {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let second = shared
        .started
        .lock()
        .ok()
        .and_then(|s| *s)
        .map_or(0, |s| s.elapsed().as_secs() as usize);
    if let Ok(mut buckets) = shared.per_second.lock() {
        if buckets.len() <= second {
            buckets.resize(second + 1, 0);
        }
        buckets[second] += 1;
    }
}

/// Keeps the request's head for the test to read.
fn record(request: &Request<Incoming>, shared: &Shared) {
    if let Ok(mut recorded) = shared.recorded.lock() {
        recorded.push(Recorded {
            method: request.method().to_string(),
            uri: request.uri().to_string(),
            headers: request.headers().clone(),
            version: request.version(),
        });
    }
}

/// `/bytes/N`: N bytes of `x`, streamed in 64 KiB frames.
fn bytes(total: u64) -> Response<Body> {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let chunks = (0..total.div_ceil(64 * 1024)).map(move |i| {
        let len = (total - i * 64 * 1024).min(64 * 1024) as usize;
        Ok::<_, io::Error>(Frame::data(chunk.slice(..len)))
    });
    let body = StreamBody::new(futures_lite_iter(chunks)).boxed();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, total.into());
    response
}

/// Reads the request body to its end (or its first error); returns how many bytes came.
async fn drain_body(request: &mut Request<Incoming>) -> u64 {
    let mut total = 0u64;
    let body = request.body_mut();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => total += frame.data_ref().map_or(0, |d| d.len() as u64),
            Err(_) => break,
        }
    }
    total
}

/// `/die`: promises a megabyte, sends 64 KiB, then fails the body.
fn die() -> Response<Body> {
    let body = DyingBody {
        sent: false,
        pause: Box::pin(tokio::time::sleep(Duration::from_millis(100))),
    };
    let mut response = Response::new(body.boxed());
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, 1_000_000u64.into());
    response
}

/// `/upgrade`: 101, then echoes whatever the upgraded connection carries.
fn upgrade(request: &mut Request<Incoming>, name: &str) -> Response<Body> {
    let upgrade = hyper::upgrade::on(request);
    tokio::task::spawn_local(async move {
        if let Ok(upgraded) = upgrade.await {
            let mut io = TokioIo::new(upgraded);
            let mut buffer = [0u8; 4096];
            while let Ok(n) = io.read(&mut buffer).await {
                if n == 0 || io.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        }
    });
    let mut response = full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new(), name);
    response.headers_mut().insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    response.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("upgrade"),
    );
    response
}

/// An iterator as a stream.
fn futures_lite_iter<I: Iterator + Unpin>(iter: I) -> IterStream<I> {
    IterStream(iter)
}

struct IterStream<I>(I);

impl<I: Iterator + Unpin> futures_core::Stream for IterStream<I> {
    type Item = I::Item;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<I::Item>> {
        std::task::Poll::Ready(self.0.next())
    }
}

/// 64 KiB of a promised megabyte, a pause (so it is on the wire), then a failure: hyper cuts the
/// connection, as when a backend process dies mid-response.
struct DyingBody {
    sent: bool,
    pause: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for DyingBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if !self.sent {
            self.sent = true;
            return std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![
                b'x';
                64 * 1024
            ])))));
        }
        std::task::ready!(std::future::Future::poll(self.pause.as_mut(), cx));
        std::task::Poll::Ready(Some(Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "backend died mid-body",
        ))))
    }
}

/// How a [`RawBackend`] misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Reads requests and never answers.
    Hang,
    /// Answers each request head with bytes that are not HTTP, then closes.
    Garbage,
    /// Reads the whole request (head and `Content-Length` body), then closes without answering.
    CloseAfterRequest,
    /// Answers `103 Early Hints`, then `200 OK` with body `ok` (a valid interim response).
    EarlyHints,
    /// Answers with both `Content-Length: 5` and `Transfer-Encoding: chunked` (body `hello world`).
    BothLengths,
    /// Answers `Transfer-Encoding: gzip, chunked`: a coding under chunked.
    GzipChunked,
    /// Answers `Content-Length: 5, 5` with body `hello`.
    RepeatedLength,
    /// Answers `200 OK` with this many `Set-Cookie` fields and body `ok`.
    Cookies(usize),
    /// Answers every request, HEAD included, with `Content-Length: 5` and the 5 bytes `hello`: after a
    /// HEAD those bytes are not part of any response.
    BodyAfterHead,
    /// Announces `Content-Length: 100`, sends 7 bytes, then sends nothing more (and never closes).
    StallBody,
}

/// A TCP server that speaks broken HTTP, counting connections and request heads.
pub struct RawBackend {
    address: SocketAddr,
    connections: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl RawBackend {
    /// Starts one on a port the OS chooses.
    pub fn start(behaviour: Misbehaviour) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let connections = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, r, s) = (connections.clone(), requests.clone(), stop.clone());
        thread::Builder::new()
            .name("raw-backend".into())
            .spawn(move || {
                let mut held = Vec::new();
                while !s.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            c.fetch_add(1, Ordering::Relaxed);
                            let r = r.clone();
                            let s = s.clone();
                            held.push(thread::spawn(move || raw_serve(stream, behaviour, &r, &s)));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(5)),
                    }
                }
                for handle in held {
                    let _ = handle.join();
                }
            })?;
        Ok(Self {
            address,
            connections,
            requests,
            stop,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Request heads received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn raw_serve(
    mut stream: std::net::TcpStream,
    behaviour: Misbehaviour,
    requests: &AtomicU64,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buffer.len() < end + 4 + length {
            continue;
        }
        requests.fetch_add(1, Ordering::Relaxed);
        buffer.drain(..end + 4 + length);
        match behaviour {
            Misbehaviour::Hang => {}
            Misbehaviour::Garbage => {
                let _ = stream.write_all(b"BANANA 9000 nonsense\r\n\r\n");
                return;
            }
            Misbehaviour::CloseAfterRequest => return,
            Misbehaviour::EarlyHints => {
                let _ = stream.write_all(
                    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Backend: hints\r\n\r\nok",
                );
            }
            Misbehaviour::BothLengths => {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n",
                );
            }
            Misbehaviour::GzipChunked => {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                );
            }
            Misbehaviour::RepeatedLength => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello");
            }
            Misbehaviour::Cookies(count) => {
                let mut response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n".to_vec();
                for i in 0..count {
                    response.extend_from_slice(format!("Set-Cookie: c{i}=v\r\n").as_bytes());
                }
                response.extend_from_slice(b"\r\nok");
                let _ = stream.write_all(&response);
            }
            Misbehaviour::StallBody => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nstalled");
            }
            Misbehaviour::BodyAfterHead => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
            }
        }
    }
}
