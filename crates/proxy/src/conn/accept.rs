//! The worker's accept loop: every connection its listeners accept is served in a task of its own,
//! parked connections are taken back when their next request arrives, and at shutdown everything
//! drains. The binary's workers and the in-process tests run this same loop.

use crate::conn::place::Place;
use crate::{
    conn::{
        active::Active,
        connections::Connections,
        http2::{self, Sniffed},
        parking::Parked,
        proxy_protocol,
        serve::park_after,
    },
    peer::Client,
};
use bytes::Bytes;
use duet_config::ProxyProtocol;
use std::time::Duration;
use tokio::{
    net::TcpStream,
    sync::{mpsc, watch},
    task::JoinSet,
    time::Instant,
};
use tokio_rustls::TlsAcceptor;

/// A connection one of the worker's listeners accepted.
pub struct Accepted {
    /// The connection.
    pub stream: TcpStream,
    /// Its peer as the listener saw it (trusted if the listener lists it in `trusted_proxies`).
    pub client: Client,
    /// The listener's TLS acceptor, if it terminates TLS; the handshake is bounded by
    /// `limits.header_read_timeout` (from the accept; the first request is awaited after it).
    pub tls: Option<TlsAcceptor>,
    /// Its place under `limits.max_connections`, held while it is open.
    pub permit: Place,
    /// The listener's `proxy_protocol`: the PROXY header the connection must start with, read in its
    /// task (only from a trusted peer) before TLS or HTTP.
    pub proxy_protocol: Option<ProxyProtocol>,
}

impl Accepted {
    /// A plain TCP connection accepted from `peer` on listener `listener`, untrusted, with no place
    /// under a connection cap: what a test or an embedding without TLS hands [`Connections::run`].
    pub fn plain(stream: TcpStream, peer: std::net::SocketAddr, listener: usize) -> Self {
        let client = Client {
            address: peer,
            tls: false,
            trusted: false,
            listener,
        };
        Self {
            stream,
            client,
            tls: None,
            permit: Place::default(),
            proxy_protocol: None,
        }
    }
}

/// How a worker's drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Whether everything finished before the drain deadline (nothing was cut).
    pub clean: bool,
    /// Connections still open when the drain began.
    pub open: usize,
    /// Connections cut at the deadline.
    pub cut: usize,
    /// Tunnels still open at the deadline.
    pub tunnels: usize,
}

/// What came of waiting for a connection's first byte.
#[derive(Debug, PartialEq, Eq)]
enum FirstByte {
    Arrived,
    NotYet,
    /// The client closed (or failed), or the drain started.
    Closed,
}

/// Waits until `until` for a connection's first byte (peeked, not read), or until the drain starts:
/// a request already there is served even then.
async fn first_byte(
    stream: &TcpStream,
    until: Instant,
    shutdown: &mut watch::Receiver<bool>,
) -> FirstByte {
    let mut byte = [0u8; 1];
    tokio::select! {
        biased;
        peeked = tokio::time::timeout_at(until, stream.peek(&mut byte)) => match peeked {
            Ok(Ok(1..)) => FirstByte::Arrived,
            Ok(Ok(0) | Err(_)) => FirstByte::Closed,
            Err(_) => FirstByte::NotYet,
        },
        _ = shutdown.wait_for(|stop| *stop) => FirstByte::Closed,
    }
}

/// The `result` of `duet_tls_handshakes_total` for a handshake that failed with `error`.
fn handshake_failure(error: &std::io::Error) -> &'static str {
    use tokio_rustls::rustls::Error;
    match error.get_ref().and_then(|e| e.downcast_ref::<Error>()) {
        Some(Error::InvalidMessage(_) | Error::InappropriateMessage { .. }) => "malformed",
        Some(Error::InappropriateHandshakeMessage { .. }) => "malformed",
        Some(Error::PeerIncompatible(_)) => "incompatible",
        Some(Error::NoCertificatesPresented) => "no_client_certificate",
        Some(Error::InvalidCertificate(_)) => "bad_client_certificate",
        Some(_) => "other",
        None => "closed",
    }
}

/// How often the drain looks whether the last tunnels have closed.
const TUNNEL_CHECK: Duration = Duration::from_millis(20);

impl Connections {
    /// Serves every connection `accepted` brings until the drain starts (the `shutdown` given to
    /// [`new`](Self::new) turns true), then drains: connections accepted but not yet served are served,
    /// parked ones close (or, if their next request has arrived, are served with `Connection: close`),
    /// and requests in flight and tunnels finish, up to `shutdown.drain_timeout`. The listeners feeding
    /// `accepted` should stop at the same signal.
    pub async fn run(&self, mut accepted: mpsc::Receiver<Accepted>) -> Drained {
        let mut tasks = JoinSet::new();
        let mut shutdown = self.shared().shutdown.clone();
        while !*shutdown.borrow_and_update() {
            tokio::select! {
                Some(connection) = accepted.recv() => self.spawn(&mut tasks, connection),
                // A parked keep-alive connection's next request: back into a task of its own.
                resumed = self.next_resumed() => {
                    tasks.spawn_local(self.resume(resumed));
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
            self.note_tasks(tasks.len());
        }
        self.drain(tasks, accepted).await
    }

    fn spawn(&self, tasks: &mut JoinSet<()>, accepted: Accepted) {
        let Accepted {
            stream,
            client,
            tls,
            permit,
            proxy_protocol,
        } = accepted;
        let _ = stream.set_nodelay(true);
        // Plain and TLS connections are tasks of their own sizes: a parked plain connection's task
        // holds neither a TLS session nor the handshake's state.
        let connections = self.clone();
        match (proxy_protocol, tls) {
            (None, None) => tasks.spawn_local(connections.serve_plain(stream, client, permit)),
            (None, Some(acceptor)) => {
                tasks.spawn_local(connections.serve_tls(stream, client, acceptor, permit))
            }
            (Some(accepted), tls) => {
                tasks.spawn_local(connections.serve_proxied(stream, client, accepted, tls, permit))
            }
        };
    }

    /// Reads a connection's PROXY header (its peer must be a trusted proxy; the header is due within
    /// `limits.header_read_timeout` of the accept), then serves it as the client the header names.
    /// Anything else closes it.
    async fn serve_proxied(
        self,
        mut stream: TcpStream,
        client: Client,
        accepted: ProxyProtocol,
        tls: Option<TlsAcceptor>,
        permit: Place,
    ) {
        let peer = client.address;
        if !client.trusted {
            tracing::debug!(target: "duet::conn", %peer, "closed: a PROXY header is taken only from trusted_proxies");
            return;
        }
        let timeout = self.proxy().limits().header_read_timeout;
        let header = proxy_protocol::read_header(&mut stream, accepted);
        let client = match tokio::time::timeout(timeout, header).await {
            // The address the header names is a client's: its own forwarding fields are not trusted
            // (decided again per request against the list, as for any peer).
            Ok(Ok(Some(address))) => Client {
                address,
                trusted: false,
                ..client
            },
            Ok(Ok(None)) => client,
            Ok(Err(refused)) => {
                tracing::debug!(target: "duet::conn", %peer, "closed: {refused}");
                return;
            }
            Err(_) => {
                tracing::debug!(target: "duet::conn", %peer, "closed: no PROXY header in time");
                return;
            }
        };
        match tls {
            None => Box::pin(self.serve_plain(stream, client, permit)).await,
            Some(acceptor) => Box::pin(self.serve_tls(stream, client, acceptor, permit)).await,
        }
    }

    /// Serves a TLS connection after its handshake, which has a bound of its own; what follows it is
    /// timed as over a plain connection (the first request's first byte as a keep-alive wait, its
    /// head from that byte).
    async fn serve_tls(
        self,
        stream: TcpStream,
        client: Client,
        acceptor: TlsAcceptor,
        permit: Place,
    ) {
        let timeout = self.proxy().limits().header_read_timeout;
        let peer = client.address;
        let handshake = Box::pin(acceptor.accept(stream));
        let counters = &self.shared().counters;
        match tokio::time::timeout(timeout, handshake).await {
            Ok(Ok(stream)) => {
                counters.tls_handshake(client.listener, "success");
                let client = Client {
                    tls: true,
                    ..client
                };
                let http2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                let (opened, active) = (Instant::now(), self.count_open());
                if http2 {
                    let serve =
                        self.serve_http2(stream, Bytes::new(), client, permit, opened, active);
                    Box::pin(serve).await;
                } else {
                    let serve = self.serve_accepted(stream, Bytes::new(), client, permit, active);
                    serve.await;
                }
            }
            Ok(Err(error)) => {
                counters.tls_handshake(client.listener, handshake_failure(&error));
                tracing::debug!(target: "duet::conn", %peer, "TLS handshake failed: {error}")
            }
            Err(_) => {
                counters.tls_handshake(client.listener, "timeout");
                tracing::debug!(target: "duet::conn", %peer, "TLS handshake timed out")
            }
        }
    }

    /// Serves a plain connection. Its first byte is awaited as an idle keep-alive connection's next
    /// request is, since clients open connections ahead of their requests: for a moment in its task,
    /// then in the worker's parking lot, until `limits.keepalive_timeout` after the accept (or until
    /// `limits.max_connections` needs its place). The drain starting first closes it.
    async fn serve_plain(self, mut stream: TcpStream, client: Client, permit: Place) {
        let limits = self.proxy().limits();
        let opened = Instant::now();
        let active = self.count_open();
        let mut shutdown = self.shared().shutdown.clone();
        match first_byte(&stream, opened + park_after(&limits), &mut shutdown).await {
            FirstByte::Arrived => {}
            FirstByte::Closed => return,
            FirstByte::NotYet => {
                let deadline = opened + limits.keepalive_timeout;
                if let Some(lot) = self.shared().parking_lot() {
                    match stream.into_std() {
                        Ok(stream) => {
                            let parked = Parked {
                                client,
                                requests: 0,
                                active,
                                permit,
                            };
                            lot.park(stream, parked, deadline);
                        }
                        Err(error) => {
                            tracing::debug!(target: "duet::conn", peer = %client.address, "closing instead of parking: {error}");
                        }
                    }
                    return;
                }
                // No lot: it waits in its task.
                if first_byte(&stream, deadline, &mut shutdown).await != FirstByte::Arrived {
                    return;
                }
            }
        }
        // As `serve_first` does, but with the HTTP/1.1 connection's future awaited in this one and
        // not a layer further down: every poll of the connection's task passes through each layer
        // (~60 instructions per request). The limits are read again, as there: a reload may have
        // changed them while the connection waited for its first byte.
        let limits = self.proxy().limits();
        let arrived = Instant::now();
        let head_by = arrived + limits.header_read_timeout;
        match http2::sniff(&mut stream, Bytes::new(), head_by).await {
            Sniffed::Http1(prefix) => {
                (self.serve_accepted(stream, prefix, client, permit, active)).await;
            }
            Sniffed::Http2(prefix) => {
                // Boxed: hyper's h2 state would otherwise size every plain connection's task.
                let serve = self.serve_http2(stream, prefix, client, permit, arrived, active);
                Box::pin(serve).await;
            }
            Sniffed::Closed => {}
        }
    }

    /// Serves a plain connection whose first bytes have arrived (`prefix`: what was read of them) in
    /// the protocol they say: HTTP/2 with prior knowledge if they are the preface, else HTTP/1.1 (an
    /// `Upgrade: h2c` is not honoured). The rest of a preface is due within
    /// `limits.header_read_timeout`, as a head is.
    pub(crate) async fn serve_first(
        self,
        mut stream: TcpStream,
        prefix: Bytes,
        client: Client,
        permit: Place,
        active: Active,
    ) {
        let opened = Instant::now();
        let head_by = opened + self.proxy().limits().header_read_timeout;
        match http2::sniff(&mut stream, prefix, head_by).await {
            Sniffed::Http1(prefix) => {
                (self.serve_accepted(stream, prefix, client, permit, active)).await;
            }
            Sniffed::Http2(prefix) => {
                // Boxed: hyper's h2 state would otherwise size every plain connection's task.
                let serve = self.serve_http2(stream, prefix, client, permit, opened, active);
                Box::pin(serve).await;
            }
            Sniffed::Closed => {}
        }
    }

    async fn drain(
        &self,
        mut tasks: JoinSet<()>,
        mut accepted: mpsc::Receiver<Accepted>,
    ) -> Drained {
        accepted.close();
        while let Ok(connection) = accepted.try_recv() {
            self.spawn(&mut tasks, connection);
        }
        // Parked connections close now (they have been idle for seconds), except those whose next
        // request is already on its way: those are served, with `Connection: close`.
        for resumed in self.close_parked() {
            tasks.spawn_local(self.resume(resumed));
        }
        let open = tasks.len();
        let finished = tokio::time::timeout(self.proxy().drain_timeout(), async {
            while tasks.join_next().await.is_some() {}
            while self.open_tunnels() > 0 {
                tokio::time::sleep(TUNNEL_CHECK).await;
            }
        })
        .await;
        let drained = Drained {
            clean: finished.is_ok(),
            open,
            cut: tasks.len(),
            tunnels: self.open_tunnels(),
        };
        tasks.abort_all();
        drained
    }
}
