//! A worker: one OS thread, its own single-threaded runtime, its own listeners, clients and balancers.

use crate::client_limits::{ClientConnections, Refused, Slot};
use crate::memory;
use duet_config::Config;
use duet_proxy::{
    Accepted, Client, Connections, HealthView, Place, Registry, ResolvedNames, WorkerProxy,
};
use std::{net::SocketAddr, rc::Rc, sync::Arc, time::Duration};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore},
    task::LocalSet,
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
    /// The listeners' per-client connection counts, the process's.
    pub(crate) clients: Arc<ClientConnections>,
}

/// Runs a worker until `shutdown` turns true and its connections have drained (or `drain` has passed).
/// Returns whether the drain was clean (nothing cut at the deadline).
pub(crate) fn run(
    index: usize,
    listeners: Vec<(std::net::TcpListener, usize)>,
    channels: Channels,
) -> std::io::Result<bool> {
    // tokio's defaults, measured (#30, callgrind, release build): event_interval 8 or 256,
    // global_queue_interval 255 and max_io_events_per_tick 64 each moved instructions per request by
    // under 1% (noise), closed loop (46.0k with the log on) and at ~100 requests/s (50k): at low load
    // the queue empties before either interval counts down, and a current-thread runtime has no LIFO slot.
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
    // The worker's loop is a task of its own: the future `block_on` drives is polled each time any of
    // the worker's tasks wakes (tokio's `LocalSet::run_until`), and the loop's poll (its `select!`
    // over four sources) cost ~740 instructions, once per request at a low rate; a task is polled only
    // when one of its own sources wakes it.
    let worker = local.spawn_local(serve_worker(index, listeners, channels));
    let drained = match local.block_on(&runtime, worker) {
        Ok(drained) => drained,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => Err(std::io::Error::other(error)),
    };
    crate::log_buffer::flush();
    drained
}

async fn serve_worker(
    index: usize,
    listeners: Vec<(std::net::TcpListener, usize)>,
    channels: Channels,
) -> std::io::Result<bool> {
    let Channels {
        shutdown,
        mut health,
        config: mut reloads,
        mut names,
        registry,
        tls,
        connection_share,
        clients,
    } = channels;
    let config = reloads.borrow_and_update().clone();
    let resolved = names.borrow_and_update().clone();
    let proxy = Rc::new(WorkerProxy::with_registry(
        config, &resolved, index, registry,
    ));
    proxy.apply_health(health.borrow_and_update().clone());
    let connections = Connections::new(proxy.clone(), shutdown.clone());
    let (accepted_tx, accepted) = mpsc::channel::<Accepted>(64);
    // At its share of `limits.max_connections` a worker closes its longest idle parked connection for
    // a new one; with none idle, new connections wait (one per listener accepted, the others in the
    // kernel's accept queue) while established ones keep their latency.
    let capacity = Arc::new(Semaphore::new(connection_share));
    for (listener, position) in listeners {
        let listener = Listener {
            index,
            position,
            listener: TcpListener::from_std(listener)?,
            tls: tls.clone(),
            config: reloads.clone(),
            capacity: capacity.clone(),
            connections: connections.clone(),
            clients: clients.clone(),
        };
        tokio::task::spawn_local(listener.accept(accepted_tx.clone(), shutdown.clone()));
    }
    drop(accepted_tx);
    tokio::task::spawn_local(follow_control_plane(index, proxy, health, reloads, names));
    tokio::task::spawn_local(trim_memory(index, connections.clone()));

    let drained = connections.run(accepted).await;
    if drained.clean {
        tracing::debug!(worker = index, open = drained.open, "drained");
    } else {
        tracing::warn!(
            worker = index,
            remaining = drained.cut,
            tunnels = drained.tunnels,
            "drain deadline passed; closing connections"
        );
    }
    Ok(drained.clean)
}

/// One of the worker's listening sockets, with what it needs to hand each accepted connection on.
struct Listener {
    index: usize,
    /// The listener's place in `config.listeners` (its TLS acceptor and trust list).
    position: usize,
    listener: TcpListener,
    tls: watch::Receiver<Arc<Vec<Option<TlsAcceptor>>>>,
    config: watch::Receiver<Arc<Config>>,
    capacity: Arc<Semaphore>,
    connections: Connections,
    clients: Arc<ClientConnections>,
}

impl Listener {
    /// Accepts until the drain starts (then the listening socket closes, so the kernel sends new
    /// connections to workers still accepting), each connection once it has a place under the
    /// worker's connection share.
    async fn accept(self, accepted: mpsc::Sender<Accepted>, mut shutdown: watch::Receiver<bool>) {
        tokio::select! {
            () = self.accept_until_closed(accepted) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    }

    async fn accept_until_closed(&self, accepted: mpsc::Sender<Accepted>) {
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(connection) => connection,
                // Out of file descriptors and the like: back off instead of spinning.
                Err(error) => {
                    tracing::warn!(worker = self.index, "accept failed: {error}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            // Over its client's cap: closed at once (dropped), before any TLS handshake.
            let Ok(slot) = self.client_slot(peer) else {
                continue;
            };
            let Some(permit) = self.make_room().await else {
                return;
            };
            let place = Place::new(permit);
            let place = match slot {
                Some(slot) => place.holding(slot),
                None => place,
            };
            if accepted
                .send(self.accepted(stream, peer, place))
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// A place under the worker's share of `limits.max_connections` for a connection just accepted: a
    /// free one, else the one the longest idle parked connection leaves when it is closed for it (as
    /// nginx reuses keep-alive connections at `worker_connections`), else the first to free up. Only
    /// a client already waiting gets an idle one closed. `None` if the worker is going away.
    async fn make_room(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.capacity.clone().try_acquire_owned() {
            return Some(permit);
        }
        self.connections.note_at_capacity();
        tracing::debug!(worker = self.index, "at max_connections");
        loop {
            if self.connections.close_oldest_idle(1) > 0 {
                // Its place may have gone to another listener's connection, waiting too.
                if let Ok(permit) = self.capacity.clone().try_acquire_owned() {
                    return Some(permit);
                }
            }
            // Connections busy now park once idle: look again now and then.
            match tokio::time::timeout(RECLAIM_RETRY, self.capacity.clone().acquire_owned()).await {
                Ok(Ok(permit)) => return Some(permit),
                Ok(Err(_)) => return None,
                Err(_) => {}
            }
        }
    }

    /// The connection's count under its listener's per-client caps (`None`: the listener has
    /// none); `Err`: it is over one, counted, and to be closed.
    fn client_slot(&self, peer: SocketAddr) -> Result<Option<Slot>, Refused> {
        let limits = (self.config.borrow().listeners.get(self.position)).map(|l| l.limits);
        let Some(limits) = limits.filter(|limits| limits.any()) else {
            return Ok(None);
        };
        match self.clients.admit(self.position, peer.ip(), &limits) {
            Ok(admitted) => {
                if admitted.forgotten > 0 {
                    self.connections.note_clients_forgotten(admitted.forgotten);
                }
                Ok(Some(admitted.slot))
            }
            Err(refused) => {
                self.connections
                    .note_client_refused(refused == Refused::New);
                tracing::debug!(worker = self.index, %peer, ?refused, "connection over its client's cap");
                Err(refused)
            }
        }
    }

    /// The connection with its listener's TLS acceptor and trust list as they are now: a reload may
    /// have changed them (the trust is decided again for each request).
    fn accepted(&self, stream: TcpStream, peer: SocketAddr, place: Place) -> Accepted {
        let tls = self.tls.borrow().get(self.position).cloned().flatten();
        let config = self.config.borrow();
        let listener = config.listeners.get(self.position);
        let trusted = listener.is_some_and(|l| l.trusts(peer.ip()));
        let proxy_protocol = listener.and_then(|l| l.proxy_protocol);
        drop(config);
        let client = Client {
            address: peer,
            tls: false,
            trusted,
            listener: self.position,
        };
        Accepted {
            stream,
            client,
            tls,
            permit: place,
            proxy_protocol,
        }
    }
}

/// How long a listener waits after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// At `limits.max_connections` with no idle connection to close, how often a waiting connection looks
/// again for one (busy connections park once idle).
const RECLAIM_RETRY: Duration = Duration::from_millis(100);

/// Applies what the control plane publishes, between requests: health, reloaded configs, resolved
/// names.
async fn follow_control_plane(
    index: usize,
    proxy: Rc<WorkerProxy>,
    mut health: watch::Receiver<Arc<HealthView>>,
    mut reloads: watch::Receiver<Arc<Config>>,
    mut names: watch::Receiver<Arc<ResolvedNames>>,
) {
    loop {
        tokio::select! {
            Ok(()) = health.changed() => {
                let view = health.borrow_and_update().clone();
                proxy.apply_health(view);
            }
            Ok(()) = reloads.changed() => {
                let config = reloads.borrow_and_update().clone();
                proxy.reload(config, &names.borrow_and_update());
                tracing::info!(worker = index, "configuration reloaded");
            }
            Ok(()) = names.changed() => {
                let resolved = names.borrow_and_update().clone();
                proxy.apply_names(&resolved);
            }
            else => return,
        }
    }
}

/// Gives memory back to the system after a crowd of connections has gone.
async fn trim_memory(index: usize, connections: Connections) {
    let mut trim = tokio::time::interval(memory::TRIM_EVERY);
    trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Trims still to do after a drop: one now and one a tick later, for the upstream connections the
    // crowd opened, which the pool closes after `timeouts.idle` (4 s by default).
    let mut trims_due = 0u8;
    loop {
        trim.tick().await;
        let (now, high) = connections.tasks();
        if memory::worth_trimming(high, now) {
            connections.reset_tasks_high();
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
}
