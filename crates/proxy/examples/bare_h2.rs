//! The floors of #50: the least an HTTP/2 server built on the `h2` crate pays per stream, and the
//! least an h2-to-HTTP/1.1 proxy on it pays. Not a product: an h2c (prior knowledge) server that
//! answers every request at once with what the benchmarks' backends answer (`duet-backend`: 200,
//! `x-backend: NAME`, `content-length`, `date`, the 6-byte body NAME), so that its instructions per
//! request, counted by `benches/h2load.sh` (`PROXIES="bare-h2 bare-hyper-h2"`), are what HTTP/2
//! alone costs a server on `h2`, to set beside HAProxy answering itself (`haproxy-return`).
//!
//! One current-thread runtime with a `LocalSet`, as each duet worker, and one of three ways to
//! serve:
//! - `hyper`: hyper's `server::conn::http2` with a local executor (duet's serving, without duet);
//! - `h2`: the `h2` crate driven directly, one `spawn_local` task per stream (as Pingora serves);
//! - `h2-inline`: the `h2` crate, each stream answered inside the connection's task, no task per
//!   stream (the least a server on `h2` can do).
//!
//! Given backend addresses instead of a name, `hyper` and `h2` forward each request to the next
//! backend in turn over HTTP/1.1 (`PROXIES="bare-hyper-h2-proxy bare-h2-proxy"`): the same pool of
//! `hyper::client::conn::http1` senders as `bare_hyper.rs`, so the floor of an h2-to-HTTP/1.1
//! proxy on these crates, with nothing of duet's (no routing, header rules, balancing, limits or
//! logs; the request's body is not forwarded: the benchmark's requests are GETs), to set beside
//! HAProxy proxying.
//!
//! ```sh
//! cargo run --release -p duet-proxy --example bare_h2 -- h2 127.0.0.1:18440 b19301
//! cargo run --release -p duet-proxy --example bare_h2 -- hyper 127.0.0.1:18440 127.0.0.1:19301
//! h2load -c16 -m10 -n 20000 http://127.0.0.1:18440/x
//! ```

use bytes::Bytes;
use http::{
    header::{CONTENT_LENGTH, DATE},
    HeaderName, HeaderValue, Request, Response, StatusCode,
};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};
use hyper::{body::Body, body::Incoming, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use std::{
    cell::{Cell, RefCell},
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    rc::Rc,
};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Hyper,
    H2,
    H2Inline,
}

/// The fields of every answer, made once: what each stream pays is the `h2` crate's (and hyper's),
/// not building header values.
struct Answer {
    backend: HeaderValue,
    length: HeaderValue,
    body: Bytes,
}

const X_BACKEND: HeaderName = HeaderName::from_static("x-backend");

impl Answer {
    fn new(name: &str) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(Self {
            backend: HeaderValue::from_str(name)?,
            length: HeaderValue::from(name.len()),
            body: Bytes::copy_from_slice(name.as_bytes()),
        })
    }

    /// For hyper, which adds `date` itself (once a second, cached).
    fn hyper(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body.clone()));
        let headers = response.headers_mut();
        headers.insert(X_BACKEND, self.backend.clone());
        headers.insert(CONTENT_LENGTH, self.length.clone());
        response
    }

    /// For `h2`, which adds nothing: `date` here is a fixed value (hyper formats a new one once a
    /// second), so the client gets as many fields as from hyper and `duet-backend`.
    fn head(&self) -> Response<()> {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(X_BACKEND, self.backend.clone());
        headers.insert(CONTENT_LENGTH, self.length.clone());
        headers.insert(
            DATE,
            HeaderValue::from_static("Mon, 07 Dec 2026 15:00:00 GMT"),
        );
        response
    }

    /// One stream's answer through `h2`: the head, then the body with END_STREAM. An error is the
    /// client's (a reset stream, a closed connection): nothing to do but drop the stream.
    fn send(&self, mut respond: h2::server::SendResponse<Bytes>) {
        if let Ok(mut stream) = respond.send_response(self.head(), false) {
            let _ = stream.send_data(self.body.clone(), true);
        }
    }
}

/// The backends and their idle HTTP/1.1 connections, as in `bare_hyper.rs`: round robin, a LIFO
/// of senders per backend, no lock and no task per request. `B` is the request body sent on.
struct Backends<B> {
    addresses: Vec<SocketAddr>,
    idle: RefCell<Vec<Vec<SendRequest<B>>>>,
    next: Cell<usize>,
}

impl<B> Backends<B>
where
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn new(addresses: Vec<SocketAddr>) -> Self {
        Self {
            idle: RefCell::new(addresses.iter().map(|_| Vec::new()).collect()),
            addresses,
            next: Cell::new(0),
        }
    }

    /// The backend's response, or `None` (the caller answers 502).
    async fn forward(&self, mut request: Request<B>) -> Option<Response<Incoming>> {
        let backend = (self.next.get() + 1) % self.addresses.len();
        self.next.set(backend);
        origin_form(&mut request);
        let pooled = {
            let mut idle = self.idle.borrow_mut();
            let list = &mut idle[backend];
            let mut found = None;
            while let Some(sender) = list.pop() {
                if sender.is_ready() {
                    found = Some(sender);
                    break;
                }
                if !sender.is_closed() {
                    // Still sending its last response body: keep it for later.
                    list.insert(0, sender);
                    break;
                }
            }
            found
        };
        let mut sender = match pooled {
            Some(sender) => sender,
            None => self.connect(backend).await.ok()?,
        };
        let response = sender.send_request(request).await.ok()?;
        self.idle.borrow_mut()[backend].push(sender);
        Some(response)
    }

    async fn connect(&self, backend: usize) -> std::io::Result<SendRequest<B>> {
        let stream = TcpStream::connect(self.addresses[backend]).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::task::spawn_local(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

/// An HTTP/2 request's target is its `:authority` and path; HTTP/1.1 wants the path and a `host`
/// field, as every h2-to-HTTP/1.1 proxy sends them.
fn origin_form<B>(request: &mut Request<B>) {
    let uri = request.uri();
    let host = uri
        .authority()
        .and_then(|authority| HeaderValue::from_str(authority.as_str()).ok());
    let path = uri
        .path_and_query()
        .map_or_else(|| http::uri::PathAndQuery::from_static("/"), Clone::clone);
    *request.uri_mut() = http::Uri::from(path);
    if let Some(host) = host {
        request.headers_mut().insert(http::header::HOST, host);
    }
}

fn bad_gateway() -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// One stream forwarded through `h2` (a task per stream, as Pingora): the head of the backend's
/// response, then each of its body's frames, END_STREAM on the last.
async fn relay(
    backends: Rc<Backends<Empty<Bytes>>>,
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    // A GET's body is empty (END_STREAM on its HEADERS): nothing to send on.
    let (parts, _) = request.into_parts();
    let Some(response) = backends
        .forward(Request::from_parts(parts, Empty::new()))
        .await
    else {
        let _ = respond.send_response(bad_gateway(), true);
        return;
    };
    let (head, mut body) = response.into_parts();
    let ended = body.is_end_stream();
    let Ok(mut stream) = respond.send_response(Response::from_parts(head, ()), ended) else {
        return;
    };
    while !body.is_end_stream() {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if stream.send_data(data, body.is_end_stream()).is_err() {
                        return;
                    }
                }
            }
            Some(Err(_)) => {
                stream.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
            // The body ended without saying so before its last frame (no content-length).
            None => {
                let _ = stream.send_data(Bytes::new(), true);
                return;
            }
        }
    }
}

/// What a connection does with each stream: answer it, or forward it.
enum Serve {
    Answer(Rc<Answer>),
    Forward(Rc<Backends<Incoming>>, Rc<Backends<Empty<Bytes>>>),
}

/// hyper's per-stream tasks, on the worker's thread.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, future: F) {
        tokio::task::spawn_local(future);
    }
}

async fn connection(stream: TcpStream, mode: Mode, serve: Rc<Serve>) {
    match mode {
        Mode::Hyper => {
            let builder = hyper::server::conn::http2::Builder::new(LocalExec);
            let io = TokioIo::new(stream);
            // Two services rather than one boxing its answer: the answering floor pays no box.
            let _ = match &*serve {
                Serve::Answer(answer) => {
                    let answer = answer.clone();
                    let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                        let response = answer.hyper();
                        async move { Ok::<_, Infallible>(response) }
                    });
                    builder.serve_connection(io, service).await
                }
                Serve::Forward(backends, _) => {
                    let backends = backends.clone();
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let backends = backends.clone();
                        async move {
                            let response = match backends.forward(request).await {
                                Some(response) => response.map(|body| body.boxed_unsync()),
                                None => bad_gateway().map(|()| {
                                    Empty::new().map_err(|never| match never {}).boxed_unsync()
                                }),
                            };
                            Ok::<Response<UnsyncBoxBody<Bytes, hyper::Error>>, Infallible>(response)
                        }
                    });
                    builder.serve_connection(io, service).await
                }
            };
        }
        Mode::H2 | Mode::H2Inline => {
            let Ok(mut connection) = h2::server::handshake(stream).await else {
                return;
            };
            // `accept` also drives the connection: reading frames, writing what the streams queued.
            while let Some(Ok((request, respond))) = connection.accept().await {
                match &*serve {
                    Serve::Answer(answer) if mode == Mode::H2Inline => answer.send(respond),
                    Serve::Answer(answer) => {
                        let answer = answer.clone();
                        tokio::task::spawn_local(async move { answer.send(respond) });
                    }
                    Serve::Forward(_, backends) => {
                        tokio::task::spawn_local(relay(backends.clone(), request, respond));
                    }
                }
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare_h2 hyper|h2|h2-inline LISTEN [NAME | BACKEND...]";
    let mode = match args.next().as_deref() {
        Some("hyper") => Mode::Hyper,
        Some("h2") => Mode::H2,
        Some("h2-inline") => Mode::H2Inline,
        _ => return Err(usage.into()),
    };
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let rest: Vec<String> = args.collect();
    let backends = rest
        .iter()
        .map(|a| a.parse())
        .collect::<Result<Vec<SocketAddr>, _>>();
    let serve = Rc::new(match backends {
        Ok(addresses) if !addresses.is_empty() => {
            if mode == Mode::H2Inline {
                return Err("h2-inline answers, it cannot wait for a backend".into());
            }
            Serve::Forward(
                Rc::new(Backends::new(addresses.clone())),
                Rc::new(Backends::new(addresses)),
            )
        }
        // duet-backend's name in the benchmarks is `b` and its port: 6 bytes.
        _ => Serve::Answer(Rc::new(Answer::new(
            rest.first().map_or("b19301", String::as_str),
        )?)),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let served: std::io::Result<()> = local.block_on(&runtime, async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            tokio::task::spawn_local(connection(stream, mode, serve.clone()));
        }
    });
    Ok(served?)
}
