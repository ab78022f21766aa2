//! Starting and stopping the workers.

use crate::{listener::bind_reuseport, worker};
use duet_config::Config;
use duet_proxy::{run_health_checks, serve_admin, HealthView, Registry};
use std::{io, net::SocketAddr, sync::Arc, thread};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// A running duet: its workers, and the addresses they listen on.
pub struct Server {
    addresses: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
    workers: Vec<thread::JoinHandle<io::Result<()>>>,
    control: thread::JoinHandle<io::Result<()>>,
    shutdown: watch::Sender<bool>,
    config: watch::Sender<Arc<Config>>,
    /// Each listener's TLS acceptor, replaced on reload so certificates can be rotated.
    tls: watch::Sender<Arc<Vec<Option<TlsAcceptor>>>>,
}

/// The TLS acceptor of each listener (`None` for plain HTTP), with its certificate files read now.
fn tls_acceptors(config: &Config) -> io::Result<Vec<Option<TlsAcceptor>>> {
    config
        .listeners
        .iter()
        .map(|listener| listener.tls.as_ref().map(crate::tls::acceptor).transpose())
        .collect()
}

impl Server {
    /// Binds every listener (port 0 picks a free port) and starts `config.workers` workers. Returns once
    /// the sockets are listening: connections made from then on are queued for the workers.
    pub fn start(config: Config) -> io::Result<Self> {
        Self::start_with_resolver(config, crate::discovery::system_resolver())
    }

    /// Like [`start`](Self::start), re-resolving backend host names with `resolver`.
    pub fn start_with_resolver(config: Config, resolver: crate::Resolver) -> io::Result<Self> {
        let workers = config.workers.resolve();
        let mut addresses = Vec::new();
        let mut per_worker: Vec<Vec<(std::net::TcpListener, usize)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let acceptors = tls_acceptors(&config)?;
        for (index, listener) in config.listeners.iter().enumerate() {
            let (bound, sockets) = bind_reuseport(listener.address, workers)?;
            addresses.push(bound);
            for (worker, socket) in sockets.into_iter().enumerate() {
                per_worker[worker].push((socket, index));
            }
        }
        let (tls, tls_rx) = watch::channel(Arc::new(acceptors));
        // The admin listener is bound here too, so a port conflict fails the start, not a thread later.
        let admin_listener = config
            .admin
            .map(|address| {
                let listener = std::net::TcpListener::bind(address).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot listen on {address} (admin): {e}"))
                })?;
                listener.set_nonblocking(true)?;
                Ok::<_, io::Error>(listener)
            })
            .transpose()?;
        let admin = admin_listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()?;
        let registry = Registry::new();
        let config = Arc::new(config);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (config_tx, config_rx) = watch::channel(config.clone());
        let initial_health = HealthView::for_config(&config, &HealthView::default());
        let (health_tx, health_rx) = watch::channel(Arc::new(initial_health));
        // The control plane: health checks run once per process and are published to every worker (a
        // reloaded config restarts them); DNS names are re-resolved; the admin listener is served.
        let control = {
            let config_rx = config_rx.clone();
            let config_tx = config_tx.clone();
            let shutdown_rx = shutdown_rx.clone();
            let registry = registry.clone();
            thread::Builder::new()
                .name("duet-control".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&runtime, async move {
                        if let Some(listener) = admin_listener {
                            let listener = tokio::net::TcpListener::from_std(listener)?;
                            tokio::task::spawn_local(serve_admin(
                                listener,
                                registry,
                                shutdown_rx.clone(),
                            ));
                        }
                        tokio::task::spawn_local(crate::discovery::run(
                            config_tx,
                            resolver,
                            shutdown_rx.clone(),
                        ));
                        run_health_checks(config_rx, health_tx, shutdown_rx).await;
                        Ok::<_, io::Error>(())
                    })
                })?
        };
        let mut handles = Vec::with_capacity(workers);
        for (index, listeners) in per_worker.into_iter().enumerate() {
            let config = config.clone();
            let shutdown_rx = shutdown_rx.clone();
            let channels = worker::Channels {
                shutdown: shutdown_rx.clone(),
                health: health_rx.clone(),
                config: config_rx.clone(),
                registry: registry.clone(),
                tls: tls_rx.clone(),
            };
            handles.push(
                thread::Builder::new()
                    .name(format!("duet-worker-{index}"))
                    .spawn(move || worker::run(index, listeners, config, channels))?,
            );
        }
        Ok(Self {
            addresses,
            admin,
            workers: handles,
            control,
            shutdown,
            config: config_tx,
            tls,
        })
    }

    /// Switches every worker to `config` between requests, keeping the balancer state of backends that
    /// remain, and restarts health checks. TLS certificate files are read again (rotation). Listener
    /// addresses and the worker count are fixed at start: a change to them is refused (restart duet to
    /// apply it), and nothing changes; so is a certificate that does not load.
    pub fn reload(&self, config: Config) -> Result<(), String> {
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
        if config.workers.resolve() != self.workers.len() {
            return Err("the worker count changed: restart duet to apply it".into());
        }
        let acceptors = tls_acceptors(&config).map_err(|e| e.to_string())?;
        self.tls.send_replace(Arc::new(acceptors));
        self.config.send_replace(Arc::new(config));
        Ok(())
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
    pub fn shutdown(self) -> io::Result<()> {
        let _ = self.shutdown.send(true);
        self.join()
    }

    fn join(self) -> io::Result<()> {
        let mut result = Ok(());
        for handle in self
            .workers
            .into_iter()
            .chain(std::iter::once(self.control))
        {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => result = Err(error),
                Err(_) => result = Err(io::Error::other("a worker thread panicked")),
            }
        }
        result
    }
}
