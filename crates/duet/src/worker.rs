//! A worker: one OS thread, its own single-threaded runtime, its own listeners, clients and balancers.

use crate::memory;
use duet_config::{Config, Limits};
use duet_proxy::{serve_connection, Client, HealthView, Registry, ResolvedNames, WorkerProxy};
use std::{rc::Rc, sync::Arc, time::Duration};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore},
    task::{JoinSet, LocalSet},
};
use tokio_rustls::TlsAcceptor;

/// What a worker listens to from the control plane.
pub(crate) struct Channels {
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) health: watch::Receiver<Arc<HealthView>>,
    pub(crate) config: watch::Receiver<Arc<Config>>,
    pub(crate) names: watch::Receiver<Arc<ResolvedNames>>,
    pub(crate) registry: Registry,
    pub(crate) tls: watch::Receiver<Arc<Vec<Option<TlsAcceptor>>>>,
    /// This worker's share of `limits.max_connections`.
    pub(crate) connection_share: usize,
}

/// Runs a worker until `shutdown` turns true and its connections have drained (or `drain` has passed).
/// Returns whether the drain was clean (nothing cut at the deadline).
pub(crate) fn run(
    index: usize,
    listeners: Vec<(std::net::TcpListener, usize)>,
    channels: Channels,
) -> std::io::Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    crate::log_buffer::buffer_this_thread();
    let local = LocalSet::new();
    local.spawn_local(async {
        let mut tick = tokio::time::interval(crate::log_buffer::FLUSH_EVERY);
        loop {
            tick.tick().await;
            crate::log_buffer::flush();
        }
    });
    let drained = local.block_on(&runtime, serve_worker(index, listeners, channels));
    crate::log_buffer::flush();
    drained
}

/// A connection accepted on a listener: the peer (trusted if the listener lists it in
/// `trusted_proxies`), and the listener's TLS acceptor if it terminates TLS.
/// The permit is its place under the worker's share of `limits.max_connections`, held while it is open.
type Accepted = (TcpStream, Client, Option<TlsAcceptor>, OwnedSemaphorePermit);

/// Serves one connection, after its TLS handshake (bounded by the header read timeout) if any.
///
/// Plain and TLS connections are separate tasks of their own sizes: a parked plain connection's task
/// holds neither a TLS session nor the handshake's state.
fn serve(
    connections: &mut JoinSet<()>,
    proxy: Rc<WorkerProxy>,
    limits: Limits,
    (stream, client, tls, permit): Accepted,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    match tls {
        None => connections.spawn_local(serve_connection(
            proxy,
            limits,
            stream,
            client,
            shutdown,
            Some(permit),
        )),
        Some(acceptor) => connections.spawn_local(async move {
            let peer = client.address;
            let handshake = Box::pin(acceptor.accept(stream));
            match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                Ok(Ok(tls_stream)) => {
                    let client = Client {
                        tls: true,
                        ..client
                    };
                    serve_connection(proxy, limits, tls_stream, client, shutdown, Some(permit))
                        .await
                }
                Ok(Err(error)) => {
                    tracing::debug!(target: "duet::conn", %peer, "TLS handshake failed: {error}")
                }
                Err(_) => tracing::debug!(target: "duet::conn", %peer, "TLS handshake timed out"),
            }
        }),
    };
}

async fn serve_worker(
    index: usize,
    listeners: Vec<(std::net::TcpListener, usize)>,
    channels: Channels,
) -> std::io::Result<bool> {
    let Channels {
        mut shutdown,
        mut health,
        config: mut reloads,
        mut names,
        registry,
        tls,
        connection_share,
    } = channels;
    let mut config = reloads.borrow_and_update().clone();
    let resolved = names.borrow_and_update().clone();
    let proxy = Rc::new(WorkerProxy::with_registry(
        config.clone(),
        &resolved,
        index,
        registry,
    ));
    proxy.apply_health(health.borrow_and_update().clone());
    let mut limits = config.limits;
    let (accepted_tx, mut accepted) = mpsc::channel::<Accepted>(64);
    let mut acceptors = JoinSet::new();
    // Past its share of `limits.max_connections` a worker stops accepting: new connections wait in the
    // kernel's accept queue (or go to another worker) while established ones keep their latency.
    let capacity = Arc::new(Semaphore::new(connection_share));
    for (listener, position) in listeners {
        let listener = TcpListener::from_std(listener)?;
        let accepted_tx = accepted_tx.clone();
        let tls = tls.clone();
        let config = reloads.clone();
        let capacity = capacity.clone();
        let proxy = proxy.clone();
        acceptors.spawn_local(async move {
            loop {
                let permit = match capacity.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    Err(_) => {
                        proxy.note_at_capacity();
                        tracing::debug!(worker = index, "at max_connections: not accepting");
                        match capacity.clone().acquire_owned().await {
                            Ok(permit) => permit,
                            Err(_) => return,
                        }
                    }
                };
                match listener.accept().await {
                    Ok((stream, peer)) => {
                        // The acceptor and trust list current now: a reload may have changed them.
                        let acceptor = tls.borrow().get(position).cloned().flatten();
                        let trusted = config
                            .borrow()
                            .listeners
                            .get(position)
                            .is_some_and(|l| l.trusts(peer.ip()));
                        let client = Client {
                            address: peer,
                            tls: false,
                            trusted,
                        };
                        if accepted_tx
                            .send((stream, client, acceptor, permit))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    // Out of file descriptors and the like: back off instead of spinning.
                    Err(error) => {
                        tracing::warn!(worker = index, "accept failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }
    drop(accepted_tx);

    let mut connections = JoinSet::new();
    let mut trim = tokio::time::interval(memory::TRIM_EVERY);
    trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The most connections served in tasks at once (not parked) since memory was last trimmed.
    let mut busy_high = 0;
    // Trims still to do after a drop: one now and one a tick later, for the upstream connections the
    // crowd opened, which the pool closes after `timeouts.idle` (4 s by default).
    let mut trims_due = 0u8;
    loop {
        busy_high = busy_high.max(connections.len());
        tokio::select! {
            _ = trim.tick() => {
                if memory::worth_trimming(busy_high, connections.len()) {
                    busy_high = connections.len();
                    trims_due = 2;
                }
                if trims_due > 0 {
                    trims_due -= 1;
                    let started = tokio::time::Instant::now();
                    if memory::trim() {
                        tracing::debug!(target: "duet::memory", worker = index, took = ?started.elapsed(), "returned free memory to the system");
                    }
                }
            }
            Some(connection) = accepted.recv() => {
                serve(&mut connections, proxy.clone(), limits, connection, shutdown.clone());
            }
            // A parked keep-alive connection's next request: back into a task of its own.
            resumed = proxy.next_resumed() => {
                connections.spawn_local(resumed.serve(proxy.clone(), limits, shutdown.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            Ok(()) = health.changed() => {
                let view = health.borrow_and_update().clone();
                proxy.apply_health(view);
            }
            Ok(()) = reloads.changed() => {
                config = reloads.borrow_and_update().clone();
                limits = config.limits;
                proxy.reload(config.clone(), &names.borrow_and_update());
                tracing::info!(worker = index, "configuration reloaded");
            }
            Ok(()) = names.changed() => {
                let resolved = names.borrow_and_update().clone();
                proxy.apply_names(&resolved);
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }

    // Stop accepting: the listening sockets close with their tasks. Connections already accepted but
    // not yet served are served (and drained) too.
    acceptors.abort_all();
    while let Ok(connection) = accepted.try_recv() {
        serve(
            &mut connections,
            proxy.clone(),
            limits,
            connection,
            shutdown.clone(),
        );
    }
    // Parked connections close now (they have been idle for seconds), except those whose next request
    // is already on its way: those are served, with `Connection: close`.
    for resumed in proxy.close_parked() {
        connections.spawn_local(resumed.serve(proxy.clone(), limits, shutdown.clone()));
    }
    let open = connections.len();
    // Requests in flight and upgraded tunnels both finish, up to the drain deadline.
    let drained = tokio::time::timeout(config.shutdown.drain_timeout, async {
        while connections.join_next().await.is_some() {}
        while proxy.open_tunnels() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    match drained {
        Ok(()) => {
            tracing::debug!(worker = index, open, "drained");
            Ok(true)
        }
        Err(_) => {
            tracing::warn!(
                worker = index,
                remaining = connections.len(),
                tunnels = proxy.open_tunnels(),
                "drain deadline passed; closing connections"
            );
            connections.abort_all();
            Ok(false)
        }
    }
}
