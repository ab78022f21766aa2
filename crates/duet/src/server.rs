//! Starting and stopping the workers.

use crate::{
    control::{self, discovery},
    listener::bind_reuseport,
    worker,
};
use duet_config::{Config, Workers};
use duet_proxy::{HealthView, Registry};
use std::{io, net::SocketAddr, num::NonZeroUsize, sync::Arc, thread};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// A running duet: its workers, and the addresses they listen on.
pub struct Server {
    addresses: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
    workers: Vec<thread::JoinHandle<io::Result<bool>>>,
    control: thread::JoinHandle<io::Result<()>>,
    shutdown: watch::Sender<bool>,
    admin_shutdown: watch::Sender<bool>,
    registry: Registry,
    /// The running configuration; the auth files thread hands it on again when an htpasswd or JWKS
    /// file changes.
    config: Arc<watch::Sender<Arc<Config>>>,
    /// Each listener's TLS acceptor, replaced on reload and when the certificate files change.
    tls: Arc<watch::Sender<Arc<Vec<Option<TlsAcceptor>>>>>,
    /// The thread that rebuilds the acceptors when certificate files change (`tls::rotation`).
    rotation: thread::JoinHandle<()>,
    /// The thread that reads htpasswd and JWKS files again when they change (`auth_files`).
    auth_files: thread::JoinHandle<()>,
}

/// The TLS acceptor of each listener (`None` for plain HTTP), with its certificate files read now.
fn tls_acceptors(config: &Config) -> io::Result<crate::tls::rotation::Built> {
    crate::tls::rotation::build(config).map_err(io::Error::from)
}

/// Reads the files of every cluster's `tls:` (the workers read them again to build their clients), so
/// a CA or client certificate that cannot be used fails the start or the reload, naming its field.
fn check_upstream_tls(config: &Config) -> io::Result<()> {
    for (i, cluster) in config.clusters.iter().enumerate() {
        let Some(tls) = &cluster.tls else { continue };
        duet_proxy::check_upstream_tls(tls).map_err(|e| {
            let message = format!("line {}: clusters[{i}].tls.{}: {e}", e.at, e.field);
            io::Error::new(io::ErrorKind::InvalidData, message)
        })?;
    }
    Ok(())
}

/// A configuration to reload, with the certificate files it names read. Reading may block (a FIFO, a
/// hung mount), so `duet run` does it on a thread of its own, never on the one that waits for SIGTERM.
pub(crate) struct Reload {
    config: Config,
    tls: Result<crate::tls::rotation::Built, String>,
}

impl Reload {
    /// Reads the certificate files `config` names (listeners' and clusters').
    pub(crate) fn read(config: Config) -> Self {
        let tls = check_upstream_tls(&config)
            .and_then(|()| tls_acceptors(&config))
            .map_err(|e| e.to_string());
        Self { config, tls }
    }
}

/// How many workers `workers` means on this machine: `auto` is one per available core.
pub fn worker_count(workers: Workers) -> usize {
    match workers {
        Workers::Auto => thread::available_parallelism().map_or(1, NonZeroUsize::get),
        Workers::Count(n) => n.get(),
    }
}

/// Each worker's sockets, one per configured listener (with the listener's index), and each
/// listener's bound address.
type WorkerSockets = Vec<Vec<(std::net::TcpListener, usize)>>;

/// Binds `workers` `SO_REUSEPORT` sockets per listener.
fn bind_listeners(config: &Config, workers: usize) -> io::Result<(Vec<SocketAddr>, WorkerSockets)> {
    let mut addresses = Vec::new();
    let mut per_worker: WorkerSockets = (0..workers).map(|_| Vec::new()).collect();
    for (index, listener) in config.listeners.iter().enumerate() {
        let (bound, sockets) = bind_reuseport(listener.address, workers)?;
        addresses.push(bound);
        for (worker, socket) in sockets.into_iter().enumerate() {
            per_worker[worker].push((socket, index));
        }
    }
    Ok((addresses, per_worker))
}

fn bind_admin(address: SocketAddr) -> io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(address).map_err(|e| {
        io::Error::new(e.kind(), format!("cannot listen on {address} (admin): {e}"))
    })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Starts one worker thread per entry of `per_worker`, each with its own `channels()`.
fn spawn_workers(
    per_worker: WorkerSockets,
    channels: impl Fn() -> worker::Channels,
) -> io::Result<Vec<thread::JoinHandle<io::Result<bool>>>> {
    let mut handles = Vec::with_capacity(per_worker.len());
    for (index, listeners) in per_worker.into_iter().enumerate() {
        let channels = channels();
        handles.push(
            thread::Builder::new()
                .name(format!("duet-worker-{index}"))
                .spawn(move || worker::run(index, listeners, channels))?,
        );
    }
    Ok(handles)
}

impl Server {
    /// Binds every listener (port 0 picks a free port) and starts `config.workers` workers. Returns once
    /// the sockets are listening: connections made from then on are queued for the workers.
    pub fn start(config: Config) -> io::Result<Self> {
        Self::start_with_resolver(config, discovery::system_resolver())
    }

    /// Like [`start`](Self::start), resolving backend host names with `resolver`. Names are resolved
    /// once before the workers start; one that does not resolve leaves its endpoints empty (503, and
    /// a warning) until a later refresh finds it: never a failed start.
    pub fn start_with_resolver(config: Config, resolver: discovery::Resolver) -> io::Result<Self> {
        let workers = worker_count(config.workers);
        check_upstream_tls(&config)?;
        let seen = crate::tls::rotation::fingerprint_of(&config);
        let built = tls_acceptors(&config)?;
        let (addresses, per_worker) = bind_listeners(&config, workers)?;
        let (tls, tls_rx) = watch::channel(Arc::new(built.acceptors));
        // The admin listener is bound here too, so a port conflict fails the start, not a thread later.
        let admin_listener = config.admin.map(bind_admin).transpose()?;
        let admin = admin_listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()?;
        let registry = Registry::new();
        registry.expect_workers(workers);
        registry.note_certificates(built.certificates);
        let names = discovery::resolve(
            &config,
            &Default::default(),
            &resolver,
            registry.discovery(),
        );
        let config = Arc::new(config);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (admin_shutdown, admin_shutdown_rx) = watch::channel(false);
        let (config_tx, config_rx) = watch::channel(config.clone());
        let initial_health = HealthView::for_config(&config, &names, &HealthView::default());
        let (names_tx, names_rx) = watch::channel(Arc::new(names));
        let (health_tx, health_rx) = watch::channel(Arc::new(initial_health));
        let control = control::spawn(control::Control {
            config: config_rx.clone(),
            names: names_tx,
            health: health_tx,
            resolver,
            registry: registry.clone(),
            admin: admin_listener,
            shutdown: shutdown_rx.clone(),
            admin_shutdown: admin_shutdown_rx,
        })?;
        let clients = crate::client_limits::ClientConnections::new(config.listeners.len());
        let tls = Arc::new(tls);
        let rotation = crate::tls::rotation::spawn(crate::tls::rotation::Rotation {
            config: config_rx.clone(),
            acceptors: tls.clone(),
            shutdown: shutdown_rx.clone(),
            registry: registry.clone(),
            seen,
        })?;
        let config_tx = Arc::new(config_tx);
        let auth_files = crate::auth_files::spawn(crate::auth_files::AuthFiles {
            config: config_tx.clone(),
            shutdown: shutdown_rx.clone(),
        })?;
        let handles = spawn_workers(per_worker, || worker::Channels {
            shutdown: shutdown_rx.clone(),
            health: health_rx.clone(),
            config: config_rx.clone(),
            names: names_rx.clone(),
            registry: registry.clone(),
            tls: tls_rx.clone(),
            connection_share: config.limits.max_connections.div_ceil(workers),
            clients: clients.clone(),
        })?;
        Ok(Self {
            addresses,
            admin,
            workers: handles,
            control,
            shutdown,
            admin_shutdown,
            registry,
            config: config_tx,
            tls,
            rotation,
            auth_files,
        })
    }

    /// Switches every worker to `config` between requests, keeping the balancer state of backends that
    /// remain, and restarts health checks. TLS certificate files are read again (rotation). Listener
    /// addresses and the worker count are fixed at start: a change to them is refused (restart duet to
    /// apply it), and nothing changes; so is a certificate that does not load.
    pub fn reload(&self, config: Config) -> Result<(), String> {
        self.apply(Reload::read(config)).map(drop)
    }

    /// [`reload`](Self::reload) with the certificate files already read; what it changed, as
    /// `duet check --diff` writes it (empty: the same configuration again).
    pub(crate) fn apply(&self, reload: Reload) -> Result<Vec<duet_config::Change>, String> {
        let config = reload.config;
        let current = self.config.borrow().clone();
        // A listener is unchanged if it names the address it was configured with or the one it bound
        // (port 0 resolved).
        let same_listeners = config.listeners.len() == current.listeners.len()
            && config
                .listeners
                .iter()
                .zip(current.listeners.iter().zip(&self.addresses))
                .all(|(new, (old, bound))| new.address == old.address || new.address == *bound);
        if !same_listeners {
            return Err("listeners changed: restart duet to apply a new set of listeners".into());
        }
        if worker_count(config.workers) != self.workers.len() {
            return Err("the worker count changed: restart duet to apply it".into());
        }
        let built = reload.tls?;
        // Diffed against the running listeners as bound: port 0 resolved is no change.
        let mut running = (*current).clone();
        let bound = running.listeners.iter_mut().zip(&self.addresses);
        for ((old, bound), new) in bound.zip(&config.listeners) {
            if new.address == *bound {
                old.address = *bound;
            }
        }
        let changes = duet_config::diff(&running, &config);
        self.tls.send_replace(Arc::new(built.acceptors));
        self.registry.note_certificates(built.certificates);
        self.config.send_replace(Arc::new(config));
        Ok(changes)
    }

    /// Where the workers' metrics are published (and the process's own facts recorded).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The bound address of each configured listener, in config order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// The admin listener's bound address, if one is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Stops accepting, lets in-flight requests finish (up to the configured drain timeout), and waits
    /// for every worker to exit.
    /// `/ready` answers 503 from now on; the admin listener closes last. Returns whether the drain was
    /// clean: `false` if requests or tunnels were still open at `drain_timeout` and were cut.
    pub fn shutdown(self) -> io::Result<bool> {
        self.registry.set_draining();
        // Keep accepting for `drain_delay`, answering `/ready` with 503 and every response with
        // `Connection: close`, so that load balancers in front stop sending before the listeners close.
        let delay = self.config.borrow().shutdown.drain_delay;
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "draining: still accepting while load balancers catch up"
            );
            thread::sleep(delay);
        }
        let _ = self.shutdown.send(true);
        let mut result = Ok(true);
        for handle in self.workers {
            match handle.join() {
                Ok(Ok(clean)) => {
                    if let Ok(all) = result.as_mut() {
                        *all &= clean;
                    }
                }
                Ok(Err(error)) => result = Err(error),
                Err(_) => result = Err(io::Error::other("a duet worker panicked")),
            }
        }
        if self.rotation.join().is_err() {
            result = Err(io::Error::other("the certificate rotation thread panicked"));
        }
        if self.auth_files.join().is_err() {
            result = Err(io::Error::other("the auth files thread panicked"));
        }
        let _ = self.admin_shutdown.send(true);
        match self.control.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => result = Err(error),
            Err(_) => result = Err(io::Error::other("the control thread panicked")),
        }
        result
    }
}
