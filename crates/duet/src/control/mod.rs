//! The control plane: one thread per process, beside the workers. It resolves backend host names
//! ([`discovery`]), runs active health checks once per process rather than once per worker
//! ([`health`]), and serves the admin listener ([`admin`]). Workers hear from it through watch channels
//! and apply what it publishes between requests.

pub(crate) mod admin;
pub(crate) mod discovery;
pub(crate) mod health;

use duet_config::Config;
use duet_proxy::{HealthView, Registry, ResolvedNames};
use std::{io, sync::Arc, thread};
use tokio::sync::watch;

/// What the control plane reads and publishes.
pub(crate) struct Control {
    pub(crate) config: watch::Receiver<Arc<Config>>,
    pub(crate) names: watch::Sender<Arc<ResolvedNames>>,
    pub(crate) health: watch::Sender<Arc<HealthView>>,
    pub(crate) resolver: discovery::Resolver,
    pub(crate) registry: Registry,
    pub(crate) admin: Option<std::net::TcpListener>,
    /// Stops discovery and health checks (with the workers' drain).
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Stops the admin listener, once the workers have drained: `/ready` answers 503 meanwhile.
    pub(crate) admin_shutdown: watch::Receiver<bool>,
}

/// Starts the control plane's thread.
pub(crate) fn spawn(control: Control) -> io::Result<thread::JoinHandle<io::Result<()>>> {
    thread::Builder::new()
        .name("duet-control".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            tokio::task::LocalSet::new().block_on(&runtime, run(control))
        })
}

async fn run(control: Control) -> io::Result<()> {
    let Control {
        config,
        names,
        health,
        resolver,
        registry,
        admin,
        shutdown,
        admin_shutdown,
    } = control;
    let admin = match admin {
        Some(listener) => {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            Some(tokio::task::spawn_local(admin::serve(
                listener,
                registry.clone(),
                health.subscribe(),
                config.borrow().admin_status_bucket,
                admin_shutdown,
            )))
        }
        None => None,
    };
    tokio::task::spawn_local(discovery::run(
        config.clone(),
        names.clone(),
        resolver,
        registry,
        shutdown.clone(),
    ));
    health::run(config, names.subscribe(), health, shutdown).await;
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    Ok(())
}
