//! The per-worker client toward backends: for each backend, a stack of idle HTTP/1.1 connections over
//! hyper's connection API, owned by the worker's thread.
//!
//! hyper-util's pooled `Client` is built to be shared across threads: a lock around its pool, and a task
//! spawned per request to wait until the connection can take another request before pooling it again.
//! A worker needs none of that. Here a connection leaves the pool for one request and comes back when
//! the response body has ended cleanly ([`Lease::release`], from the request's completion), taken from
//! the top of the stack next time (the warmest socket, LIFO). A response that ends any other way drops
//! its lease and with it the connection. Idle connections are closed after `timeouts.idle` by one
//! sweeper task per pool, alive only while something is pooled.
//!
//! A cluster with `send_proxy_protocol:` starts each connection with a header naming one client, so
//! its connections are pooled per client address as well as per backend ([`Key`]): a connection is
//! only ever reused for the client its header named, as Envoy's pools keyed by the downstream address
//! and HAProxy's private connections do.

use crate::backend::{
    connect::{Connector, UpstreamIo, HTTP_1_1},
    early_answer::EarlyAnswerIo,
    request_body::UpstreamBody,
};
use duet_config::Timeouts;
use http::{Request, Response};
use hyper::{
    body::Incoming,
    client::conn::http1::{self, SendRequest},
};
use hyper_util::rt::TokioIo;
use rustc_hash::FxBuildHasher;
use std::{
    cell::{Cell, RefCell},
    collections::{HashMap, VecDeque},
    fmt, io,
    net::SocketAddr,
    pin::pin,
    rc::{Rc, Weak},
    time::Duration,
};
use tokio::{net::TcpStream, time::Instant};

/// A new connection to `backend`, for an HTTP/1.1 or an h2 pool: TCP within `limit` (no Nagle), the
/// cluster's PROXY header naming `client` if it sends one, then its TLS offering `alpn`, if it has TLS.
pub(crate) async fn dial(
    connector: &Connector,
    Key(backend, client): Key,
    alpn: &[&[u8]],
    limit: Duration,
) -> Result<UpstreamIo, UpstreamError> {
    let mut stream = tokio::time::timeout(limit, TcpStream::connect(backend))
        .await
        .map_err(|_| UpstreamError::ConnectTimeout(limit))?
        .map_err(UpstreamError::Connect)?;
    let _ = stream.set_nodelay(true);
    connector
        .introduce(&mut stream, backend, client, limit)
        .await
        .map_err(UpstreamError::Connect)?;
    connector
        .connect(stream, backend, alpn, limit)
        .await
        .map_err(UpstreamError::Tls)
}

/// Idle connections kept per backend, per worker, at least (nginx's `keepalive 64`): a burst opens as
/// many as it needs, afterwards only this many stay. While more are lent out than this (many HTTP/2
/// streams at once, each its own HTTP/1.1 exchange), a backend keeps up to that many idle: responses
/// end in bursts, and a connection closed there is one the next burst of requests opens again (at
/// 1,600 streams in flight, 29% of all requests paid a connect and a close: #50).
pub(crate) const MAX_IDLE_PER_BACKEND: usize = 64;

/// A worker's connections toward one cluster's backends (the cluster's timeouts apply). Cheap to clone:
/// a cluster that keeps its timeouts across a reload keeps its pool. Not `Send`: it lives on its
/// worker's thread, and sends from inside a `tokio::task::LocalSet` (connections and the sweeper are
/// `spawn_local` tasks).
#[derive(Clone)]
pub struct UpstreamClient {
    pool: Rc<Pool>,
}

/// Which pooled connections a request may take: to its backend and, when the cluster sends PROXY
/// headers, made for its client (always `None` otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key(pub(crate) SocketAddr, pub(crate) Option<SocketAddr>);

/// Hashed as one word per IPv4 address with its port (the derived hash writes each variant, octet
/// and port on its own, twice per request: a take and a put). An IPv6 address goes in as its two
/// halves and its port, each mixed in on its own: folded into one word, addresses a client picks
/// from its prefix would collide at will (a PROXY cluster keys its pool by client address).
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        hash_address(self.0, state);
        if let Some(client) = self.1 {
            hash_address(client, state);
        }
    }
}

fn hash_address<H: std::hash::Hasher>(address: SocketAddr, state: &mut H) {
    match address {
        SocketAddr::V4(v4) => {
            state.write_u64(u64::from(v4.ip().to_bits()) << 16 | u64::from(v4.port()));
        }
        SocketAddr::V6(v6) => {
            let ip = v6.ip().to_bits();
            state.write_u64(ip as u64);
            state.write_u64((ip >> 64) as u64);
            state.write_u16(v6.port());
        }
    }
}

struct Pool {
    idle: RefCell<HashMap<Key, VecDeque<Idle>, FxBuildHasher>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    handshake: http1::Builder,
    /// Plain or TLS.
    connector: Connector,
    sweeping: Cell<bool>,
    /// One clone for each request between leaving for a connection and the end of its [`Lease`]: its
    /// count beyond this one is how many connections are lent out (or being opened).
    lent: Rc<()>,
}

struct Idle {
    sender: SendRequest<UpstreamBody>,
    since: Instant,
}

impl fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("idle", &self.idle_connections())
            .finish()
    }
}

/// Builds a worker's client for a cluster's timeouts.
///
/// Pooled connections idle for `timeouts.idle` (default 4 s, below the 5 s keep-alive of Node.js,
/// uvicorn and Apache httpd) are closed, so duet usually closes first. When the backend closes first, a
/// request may meet the close on the wire: `UpstreamError::closed_when_reused` tells that race from a
/// failing backend, and an idempotent request is then sent again.
pub fn upstream_client(timeouts: &Timeouts) -> UpstreamClient {
    upstream_client_over(timeouts, Connector::default())
}

/// A client whose connections are made by `connector` (TLS for a cluster with `tls:`).
pub(crate) fn upstream_client_over(timeouts: &Timeouts, connector: Connector) -> UpstreamClient {
    let mut handshake = http1::Builder::new();
    // Head and small body in one write: measurably cheaper per request (../shared/design.md).
    // A response may carry at most 100 header fields, hyper's default (Envoy's too; HAProxy allows
    // 101); past it, 502, never held against the backend. Left unset on purpose: any explicit limit,
    // even 100, makes hyper allocate and fill two header arrays for every response, 2.4k instructions
    // of a 41k-instruction request (callgrind, benches/instructions.sh).
    handshake.writev(false);
    UpstreamClient {
        pool: Rc::new(Pool {
            idle: RefCell::default(),
            connect_timeout: timeouts.connect,
            idle_timeout: timeouts.idle,
            handshake,
            connector,
            sweeping: Cell::new(false),
            lent: Rc::new(()),
        }),
    }
}

/// One connection, lent for one request.
pub(crate) struct Lease {
    sender: SendRequest<UpstreamBody>,
    key: Key,
    pool: Weak<Pool>,
    /// How long the connection took to open, if it was opened for this request (not pooled).
    connected_in: Option<Duration>,
    /// Counts the connection as lent out ([`Pool::lent`]).
    _lent: Rc<()>,
}

impl Lease {
    /// How long the connection took to open (TCP, TLS and hyper's handshake), when it was opened for
    /// this request; `None` for a pooled one.
    pub(crate) fn connected_in(&self) -> Option<Duration> {
        self.connected_in
    }

    /// The response ended cleanly (at `now`): the connection can take the next request.
    pub(crate) fn release(self, now: Instant) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(self.key, self.sender, now);
        }
    }
}

/// Why an attempt got no response from a backend.
#[derive(Debug)]
pub enum UpstreamError {
    /// No connection within `timeouts.connect`.
    ConnectTimeout(Duration),
    /// The connection was refused or failed.
    Connect(io::Error),
    /// The TLS handshake failed (the backend's certificate refused, or it does not speak TLS).
    Tls(io::Error),
    /// The exchange failed on a connection; `reused` when it had answered a request before.
    Http {
        /// hyper's error.
        error: hyper::Error,
        /// Whether the connection came from the pool.
        reused: bool,
    },
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConnectTimeout(limit) => write!(f, "no connection within {limit:?}"),
            Self::Connect(error) => write!(f, "cannot connect: {error}"),
            // The reason is the source (as ProxyError and the access log print it).
            Self::Tls(_) => f.write_str("TLS handshake failed"),
            Self::Http { error, .. } => error.fmt(f),
        }
    }
}

impl std::error::Error for UpstreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::ConnectTimeout(_) => None,
            Self::Connect(error) | Self::Tls(error) => Some(error),
            Self::Http { error, .. } => Some(error),
        }
    }
}

impl UpstreamError {
    /// Whether the connection was never made.
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, Self::ConnectTimeout(_) | Self::Connect(_))
    }

    /// Whether the TLS handshake failed (the request was never sent).
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Whether the backend closed a pooled connection that had answered before, with no byte of a
    /// response to this request: the HTTP/1.1 keep-alive close race (RFC 9112 §9.3.1), in which a backend
    /// closing an idle connection never read the request that met the close.
    pub(crate) fn closed_when_reused(&self) -> bool {
        let Self::Http {
            error,
            reused: true,
        } = self
        else {
            return false;
        };
        error.is_incomplete_message()
            || error.is_canceled()
            || std::error::Error::source(error)
                .and_then(|e| e.downcast_ref::<io::Error>())
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                    )
                })
    }
}

impl UpstreamClient {
    /// Sends `request` (origin-form target, `Host` set) to `key`'s backend on a pooled connection, or a
    /// new one when none is ready (its PROXY header, if the cluster sends one, naming `key`'s client).
    /// The lease goes back with [`Lease::release`] once the response has ended. `now` is the attempt's
    /// start: the clock reading that says which pooled connections have been idle too long (one
    /// reading per attempt, not one more per request).
    pub(crate) async fn send(
        &self,
        key: Key,
        mut request: Request<UpstreamBody>,
        now: Instant,
    ) -> Result<(Response<Incoming>, Lease), UpstreamError> {
        // The connection counts as lent out from now (while the request waits for its response, too)
        // until its lease ends.
        let out = self.pool.lent.clone();
        while let Some(mut sender) = self.pool.take(key, now) {
            // Pinned where built: hyper's future holds the request, copied once more if moved.
            match pin!(sender.try_send_request(request)).await {
                Ok(response) => return Ok((response, self.lease(key, sender, None, out))),
                Err(mut failed) => match failed.take_message() {
                    // Closed before the request went out: nothing was sent, try the next one.
                    Some(unsent) => request = unsent,
                    None => {
                        return Err(UpstreamError::Http {
                            error: failed.into_error(),
                            reused: true,
                        })
                    }
                },
            }
        }
        // Connecting is the rare path (a burst, or a pool emptied by the backend) and its futures are
        // large: boxed, so every request's future, which holds this one, stays small and cheap to move.
        let connecting = Instant::now();
        let mut sender = Box::pin(self.connect(key)).await?;
        let connected_in = Some(connecting.elapsed());
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| UpstreamError::Http {
                error,
                reused: false,
            })?;
        Ok((response, self.lease(key, sender, connected_in, out)))
    }

    /// A new connection to `key`'s backend, its handshake done and its connection task spawned.
    async fn connect(&self, key: Key) -> Result<SendRequest<UpstreamBody>, UpstreamError> {
        let backend = key.0;
        let io = dial(
            &self.pool.connector,
            key,
            HTTP_1_1,
            self.pool.connect_timeout,
        )
        .await?;
        let (sender, connection) = self
            .pool
            .handshake
            .handshake(TokioIo::new(EarlyAnswerIo::new(io)))
            .await
            .map_err(|error| UpstreamError::Http {
                error,
                reused: false,
            })?;
        // The worker's thread drives the connection; it ends when the backend or duet closes it.
        tokio::task::spawn_local(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::trace!(%backend, "upstream connection ended: {error}");
            }
        });
        Ok(sender)
    }

    fn lease(
        &self,
        key: Key,
        sender: SendRequest<UpstreamBody>,
        connected_in: Option<Duration>,
        out: Rc<()>,
    ) -> Lease {
        Lease {
            sender,
            key,
            pool: Rc::downgrade(&self.pool),
            connected_in,
            _lent: out,
        }
    }

    /// How this client's connections are made.
    pub(crate) fn connector(&self) -> &Connector {
        &self.pool.connector
    }

    /// Connections pooled now, over every backend.
    pub(crate) fn idle_connections(&self) -> usize {
        self.pool.idle.borrow().values().map(VecDeque::len).sum()
    }
}

impl Pool {
    /// The most recently pooled connection for `key` that can take a request at `now`. Closed and
    /// expired ones are dropped; one still finishing its last response (its connection task has not
    /// caught up with the body's end yet) stays for later.
    fn take(&self, key: Key, now: Instant) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.borrow_mut();
        let stack = idle.get_mut(&key)?;
        let mut busy = None;
        let mut found = None;
        while let Some(entry) = stack.pop_back() {
            let idle = now.saturating_duration_since(entry.since);
            if entry.sender.is_closed() || idle >= self.idle_timeout {
                continue;
            }
            if entry.sender.is_ready() {
                found = Some(entry.sender);
                break;
            }
            busy.get_or_insert_with(Vec::new).push(entry);
        }
        for entry in busy.into_iter().flatten().rev() {
            stack.push_back(entry);
        }
        // An emptied stack stays for the lease coming back (the sweeper removes it if none does):
        // removed here, it would be hashed and inserted again, allocation and all, every request
        // that took a backend's last idle connection.
        found
    }

    fn put(self: Rc<Self>, key: Key, sender: SendRequest<UpstreamBody>, now: Instant) {
        if sender.is_closed() {
            return;
        }
        {
            // The lease coming back is still counted: the others lent are those still out.
            let lent = Rc::strong_count(&self.lent).saturating_sub(2);
            let mut idle = self.idle.borrow_mut();
            let stack = idle.entry(key).or_default();
            if stack.len() >= MAX_IDLE_PER_BACKEND.max(lent) {
                stack.pop_front();
            }
            stack.push_back(Idle { sender, since: now });
        }
        if !self.sweeping.replace(true) {
            tokio::task::spawn_local(sweep(Rc::downgrade(&self)));
        }
    }
}

/// Closes connections idle past `timeouts.idle` (checked every half of it), until the pool is empty or
/// gone.
async fn sweep(pool: Weak<Pool>) {
    loop {
        let period = match pool.upgrade() {
            Some(pool) => (pool.idle_timeout / 2).max(Duration::from_millis(50)),
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut idle = pool.idle.borrow_mut();
        idle.retain(|_, stack| {
            stack.retain(|entry| {
                !entry.sender.is_closed() && entry.since.elapsed() < pool.idle_timeout
            });
            !stack.is_empty()
        });
        if idle.is_empty() {
            pool.sweeping.set(false);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duet_testbed::{Backend, BackendOptions};
    use http_body_util::BodyExt;

    #[test]
    fn ipv6_clients_chosen_to_fold_alike_still_hash_apart() {
        use std::hash::BuildHasher;
        let backend: SocketAddr = "127.0.0.1:9000".parse().expect("address");
        // Low half XOR port kept equal: one word folded from the two would be the same for all.
        let client = |port: u16| {
            let ip = std::net::Ipv6Addr::from_bits(
                0x2001_0db8_0000_0000_0000_0000_0000_0000 | u128::from(port ^ 0x5a5a),
            );
            SocketAddr::new(ip.into(), port)
        };
        let hashes: std::collections::HashSet<u64> = (1000..1100)
            .map(|port| FxBuildHasher.hash_one(Key(backend, Some(client(port)))))
            .collect();
        assert_eq!(hashes.len(), 100);
        let same = Key(backend, Some(client(1000)));
        assert_eq!(FxBuildHasher.hash_one(same), FxBuildHasher.hash_one(same));
    }

    /// `count` requests, each response read to its end and its lease kept: as many connections lent
    /// out at once.
    async fn lend(client: &UpstreamClient, key: Key, count: usize) -> Vec<Lease> {
        let mut leases = Vec::with_capacity(count);
        for _ in 0..count {
            let request = Request::get("/")
                .header(http::header::HOST, "backend")
                .body(UpstreamBody::Empty)
                .expect("request");
            let (response, lease) = client
                .send(key, request, Instant::now())
                .await
                .expect("response");
            response.into_body().collect().await.expect("body");
            leases.push(lease);
        }
        leases
    }

    #[tokio::test]
    async fn connections_freed_while_more_than_64_are_lent_out_stay_pooled_for_the_next_requests() {
        let backend = Backend::start(BackendOptions::named("b")).expect("backend");
        let client = upstream_client(&Timeouts::default());
        let key = Key(backend.address(), None);
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut leases = lend(&client, key, 200).await;
                assert_eq!(backend.connections(), 200);
                // Half the responses end while the other half are still out: all 100 stay idle.
                let now = Instant::now();
                for lease in leases.drain(..100) {
                    lease.release(now);
                }
                assert_eq!(client.idle_connections(), 100, "not trimmed to 64");
                // The next 100 requests take them: no connection is opened again.
                let more = lend(&client, key, 100).await;
                assert_eq!(backend.connections(), 200);
                assert_eq!(client.idle_connections(), 0);
                drop((leases, more));
            })
            .await;
    }
}
