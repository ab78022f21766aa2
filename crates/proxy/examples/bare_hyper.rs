//! The calibration proxy of #11: the least a proxy on hyper 1.x can do per request, to measure what
//! hyper and the kernel cost before anything duet adds (routing, balancing, header rules, limits,
//! timeouts, metrics, logs). Not a product: it forwards every request to the next backend in turn
//! and answers 502 when a backend fails.
//!
//! One current-thread runtime, `writev(false)` on both sides (one `write` per response, as duet), and
//! a per-backend LIFO pool of `hyper::client::conn::http1` senders with no lock and no task per
//! request.
//!
//! ```sh
//! cargo run --release -p duet-proxy --example bare_hyper -- 127.0.0.1:18430 127.0.0.1:19301 127.0.0.1:19302
//! ```

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty};
use hyper::{body::Incoming, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use std::{
    cell::{Cell, RefCell},
    net::SocketAddr,
    rc::Rc,
};
use tokio::net::{TcpListener, TcpStream};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

struct Backends {
    addresses: Vec<SocketAddr>,
    /// Idle senders per backend, most recently used last (warm sockets first).
    idle: RefCell<Vec<Vec<SendRequest<Incoming>>>>,
    next: Cell<usize>,
}

impl Backends {
    async fn forward(&self, request: Request<Incoming>) -> Response<Body> {
        let backend = (self.next.get() + 1) % self.addresses.len();
        self.next.set(backend);
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
            None => match self.connect(backend).await {
                Ok(sender) => sender,
                Err(_) => return bad_gateway(),
            },
        };
        match sender.send_request(request).await {
            Ok(response) => {
                self.idle.borrow_mut()[backend].push(sender);
                response.map(|body| body.boxed_unsync())
            }
            Err(_) => bad_gateway(),
        }
    }

    async fn connect(&self, backend: usize) -> std::io::Result<SendRequest<Incoming>> {
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

fn bad_gateway() -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare_hyper LISTEN BACKEND...";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let addresses = args
        .map(|a| a.parse())
        .collect::<Result<Vec<SocketAddr>, _>>()?;
    if addresses.is_empty() {
        return Err(usage.into());
    }
    let backends = Rc::new(Backends {
        idle: RefCell::new(addresses.iter().map(|_| Vec::new()).collect()),
        addresses,
        next: Cell::new(0),
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
            let backends = backends.clone();
            tokio::task::spawn_local(async move {
                let service = hyper::service::service_fn(move |request| {
                    let backends = backends.clone();
                    async move { Ok::<_, std::convert::Infallible>(backends.forward(request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .writev(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(served?)
}
