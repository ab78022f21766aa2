//! The worker's accept loop: every connection its listeners accept is served in a task of its own,
//! parked connections are taken back when their next request arrives, and at shutdown everything
//! drains. The binary's workers and the in-process tests run this same loop.

use crate::{
    conn::{
        connections::Connections,
        http2::{self, Sniffed},
    },
    peer::Client,
};
use bytes::Bytes;
use std::time::Duration;
use tokio::{
    net::TcpStream,
    sync::{mpsc, OwnedSemaphorePermit},
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
    /// `limits.header_read_timeout`.
    pub tls: Option<TlsAcceptor>,
    /// Its place under `limits.max_connections`, held while it is open.
    pub permit: Option<OwnedSemaphorePermit>,
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
            permit: None,
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
        } = accepted;
        let _ = stream.set_nodelay(true);
        // Plain and TLS connections are tasks of their own sizes: a parked plain connection's task
        // holds neither a TLS session nor the handshake's state.
        let connections = self.clone();
        let timeout = self.proxy().limits().header_read_timeout;
        let opened = tokio::time::Instant::now();
        let Some(acceptor) = tls else {
            tasks.spawn_local(connections.serve_plain(stream, client, permit, opened));
            return;
        };
        tasks.spawn_local(async move {
            let peer = client.address;
            let handshake = Box::pin(acceptor.accept(stream));
            match tokio::time::timeout(timeout, handshake).await {
                Ok(Ok(stream)) => {
                    let client = Client {
                        tls: true,
                        ..client
                    };
                    let http2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    if http2 {
                        let serve =
                            connections.serve_http2(stream, Bytes::new(), client, permit, opened);
                        Box::pin(serve).await;
                    } else {
                        let serve = connections.serve_accepted(
                            stream,
                            Bytes::new(),
                            client,
                            permit,
                            opened,
                        );
                        serve.await;
                    }
                }
                Ok(Err(error)) => {
                    tracing::debug!(target: "duet::conn", %peer, "TLS handshake failed: {error}")
                }
                Err(_) => tracing::debug!(target: "duet::conn", %peer, "TLS handshake timed out"),
            }
        });
    }

    /// Serves a plain connection in the protocol its first bytes say: HTTP/2 with prior knowledge if
    /// they are the preface, else HTTP/1.1 (an `Upgrade: h2c` is not honoured). Nothing arriving by
    /// `limits.header_read_timeout` after `opened`, or the drain starting first, closes it.
    async fn serve_plain(
        self,
        mut stream: TcpStream,
        client: Client,
        permit: Option<OwnedSemaphorePermit>,
        opened: Instant,
    ) {
        let first_request_by = opened + self.proxy().limits().header_read_timeout;
        let mut shutdown = self.shared().shutdown.clone();
        let sniffed = tokio::select! {
            sniffed = http2::sniff(&mut stream, first_request_by) => sniffed,
            _ = shutdown.wait_for(|stop| *stop) => Sniffed::Closed,
        };
        match sniffed {
            Sniffed::Http1(prefix) => {
                (self.serve_accepted(stream, prefix, client, permit, opened)).await;
            }
            Sniffed::Http2(prefix) => {
                // Boxed: hyper's h2 state would otherwise size every plain connection's task.
                Box::pin(self.serve_http2(stream, prefix, client, permit, opened)).await;
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
