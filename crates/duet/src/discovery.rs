//! DNS discovery on the control plane: backends given by host name are resolved again every
//! `dns_refresh`, and a changed address set is published to the workers as a config change (the reload
//! path, which keeps the balancer state of addresses that remain).

use duet_config::Config;
use std::{
    io,
    net::{SocketAddr, ToSocketAddrs},
    sync::Arc,
};
use tokio::sync::watch;

/// Resolves `HOST:PORT` to all its addresses. Blocking; called off the runtime's thread.
pub type Resolver = Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The operating system's resolver (`getaddrinfo`).
pub fn system_resolver() -> Resolver {
    Arc::new(|name: &str| name.to_socket_addrs().map(|addresses| addresses.collect()))
}

pub(crate) async fn run(
    config: watch::Sender<Arc<Config>>,
    resolver: Resolver,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut changes = config.subscribe();
    loop {
        let current = changes.borrow_and_update().clone();
        // Every cluster is refreshed at least as often as it asks; all on the shortest period.
        let period = current
            .clusters
            .iter()
            .filter(|c| c.has_named_backends() && !c.dns_refresh.is_zero())
            .map(|c| c.dns_refresh)
            .min();
        let wait = async {
            match period {
                Some(period) => tokio::time::sleep(period).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wait => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let snapshot = current.clone();
        let resolver = resolver.clone();
        let resolved = tokio::task::spawn_blocking(move || {
            snapshot
                .clusters
                .iter()
                .map(|c| {
                    (c.has_named_backends() && !c.dns_refresh.is_zero())
                        .then(|| c.resolve_again(&mut |name| resolver(name)))
                })
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(resolved) = resolved else { continue };
        let mut next = (*current).clone();
        let mut changed = false;
        for (cluster, result) in next.clusters.iter_mut().zip(resolved) {
            match result {
                None => {}
                Some(Err(error)) => {
                    tracing::warn!(cluster = %cluster.name, "dns: keeping the current backends: {error}")
                }
                Some(Ok(backends)) if backends != cluster.backends => {
                    tracing::info!(
                        cluster = %cluster.name,
                        before = cluster.backends.len(),
                        after = backends.len(),
                        "dns: backend addresses changed"
                    );
                    cluster.backends = backends;
                    changed = true;
                }
                Some(Ok(_)) => {}
            }
        }
        if changed {
            // Only if nobody (a SIGHUP reload) replaced the config while we were resolving.
            config.send_if_modified(|live| {
                if Arc::ptr_eq(live, &current) {
                    *live = Arc::new(next);
                    true
                } else {
                    false
                }
            });
        }
    }
}
