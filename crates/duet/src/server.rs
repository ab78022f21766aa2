//! Starting and stopping the workers.

use crate::{listener::bind_reuseport, worker};
use duet_config::Config;
use duet_proxy::{run_health_checks, HealthView};
use std::{io, net::SocketAddr, sync::Arc, thread};
use tokio::sync::watch;

/// A running duet: its workers, and the addresses they listen on.
pub struct Server {
    addresses: Vec<SocketAddr>,
    workers: Vec<thread::JoinHandle<io::Result<()>>>,
    control: Option<thread::JoinHandle<io::Result<()>>>,
    shutdown: watch::Sender<bool>,
}

impl Server {
    /// Binds every listener (port 0 picks a free port) and starts `config.workers` workers. Returns once
    /// the sockets are listening: connections made from then on are queued for the workers.
    pub fn start(config: Config) -> io::Result<Self> {
        let workers = config.workers.resolve();
        let mut addresses = Vec::new();
        let mut per_worker: Vec<Vec<std::net::TcpListener>> =
            (0..workers).map(|_| Vec::new()).collect();
        for listener in &config.listeners {
            let (bound, sockets) = bind_reuseport(listener.address, workers)?;
            addresses.push(bound);
            for (worker, socket) in sockets.into_iter().enumerate() {
                per_worker[worker].push(socket);
            }
        }
        let config = Arc::new(config);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (health_tx, health_rx) = watch::channel(Arc::new(HealthView::initial(&config)));
        // The control plane: health checks run once per process and are published to every worker.
        let control = if config.clusters.iter().any(|c| c.health_check.is_some()) {
            let config = config.clone();
            let shutdown_rx = shutdown_rx.clone();
            Some(
                thread::Builder::new()
                    .name("duet-control".into())
                    .spawn(move || {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()?;
                        tokio::task::LocalSet::new()
                            .block_on(&runtime, run_health_checks(config, health_tx, shutdown_rx));
                        Ok(())
                    })?,
            )
        } else {
            None
        };
        let mut handles = Vec::with_capacity(workers);
        for (index, listeners) in per_worker.into_iter().enumerate() {
            let config = config.clone();
            let shutdown_rx = shutdown_rx.clone();
            let health_rx = health_rx.clone();
            handles.push(
                thread::Builder::new()
                    .name(format!("duet-worker-{index}"))
                    .spawn(move || worker::run(index, listeners, config, shutdown_rx, health_rx))?,
            );
        }
        Ok(Self {
            addresses,
            workers: handles,
            control,
            shutdown,
        })
    }

    /// The bound address of each configured listener, in config order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addresses
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
        for handle in self.workers.into_iter().chain(self.control) {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => result = Err(error),
                Err(_) => result = Err(io::Error::other("a worker thread panicked")),
            }
        }
        result
    }
}
