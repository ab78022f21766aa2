//! DNS discovery on the control plane: backends given by host name are resolved at start, whenever the
//! config changes, and every `dns_refresh`. What they resolve to is published to the workers as
//! [`ResolvedNames`]; each worker applies it as a membership change (addresses join and leave its
//! balancers, nothing else is rebuilt).
//!
//! A name that has never resolved contributes no endpoint: its cluster answers 503 until it does, with a
//! warning in the log and `duet_dns_unresolved_names` above zero. A lookup that fails later keeps the
//! addresses the name had (a resolver blip must not empty a healthy cluster).

use duet_config::{BackendAddress, Config};
use duet_proxy::{DiscoveryCounters, ResolvedNames};
use std::{
    collections::BTreeSet,
    io,
    net::{SocketAddr, ToSocketAddrs},
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};
use tokio::sync::watch;

/// Resolves `HOST:PORT` to all its addresses. Blocking; called off the runtime's thread.
pub type Resolver = Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The operating system's resolver (`getaddrinfo`).
pub fn system_resolver() -> Resolver {
    Arc::new(|name: &str| name.to_socket_addrs().map(|addresses| addresses.collect()))
}

/// Every distinct host name the config's backends use.
fn names(config: &Config) -> BTreeSet<(String, u16)> {
    config
        .clusters
        .iter()
        .flat_map(|c| &c.backends)
        .filter_map(|b| match &b.address {
            BackendAddress::Name { host, port } => Some((host.clone(), *port)),
            BackendAddress::Ip(_) => None,
        })
        .collect()
}

/// What each of `config`'s names resolves to now. A name that fails keeps what `previous` had for it;
/// names the config no longer uses are dropped. Blocking.
pub(crate) fn resolve(
    config: &Config,
    previous: &ResolvedNames,
    resolver: &Resolver,
    counters: &DiscoveryCounters,
) -> ResolvedNames {
    let mut out = ResolvedNames::new();
    let mut unresolved = 0;
    for (host, port) in names(config) {
        let name = format!("{host}:{port}");
        let error = match resolver(&name) {
            Ok(addresses) if !addresses.is_empty() => {
                out.insert(&host, port, addresses);
                continue;
            }
            Ok(_) => "no address".to_owned(),
            Err(error) => error.to_string(),
        };
        counters.failures.fetch_add(1, Relaxed);
        match previous.get(&host, port) {
            Some(kept) => {
                tracing::warn!(%name, "dns: keeping the last addresses: {error}");
                out.insert(&host, port, kept.to_vec());
            }
            None => {
                unresolved += 1;
                tracing::warn!(%name, "dns: does not resolve ({error}); no endpoints from it until it does");
            }
        }
    }
    counters.unresolved.store(unresolved, Relaxed);
    out
}

/// The shortest refresh period among clusters that name hosts; `None` if nothing is re-resolved.
fn refresh_period(config: &Config) -> Option<Duration> {
    config
        .clusters
        .iter()
        .filter(|c| c.has_named_backends() && !c.dns_refresh.is_zero())
        .map(|c| c.dns_refresh)
        .min()
}

/// Re-resolves on every config change and every refresh period, publishing changes on `publish`, until
/// `shutdown` turns true. The names for the first config were resolved before this started.
pub(crate) async fn run(
    mut config: watch::Receiver<Arc<Config>>,
    publish: watch::Sender<Arc<ResolvedNames>>,
    resolver: Resolver,
    registry: duet_proxy::Registry,
    mut shutdown: watch::Receiver<bool>,
) {
    config.borrow_and_update();
    loop {
        let period = refresh_period(&config.borrow());
        let wait = async {
            match period {
                Some(period) => tokio::time::sleep(period).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wait => {}
            changed = config.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let current = config.borrow_and_update().clone();
        let previous = publish.borrow().clone();
        let resolver = resolver.clone();
        let registry = registry.clone();
        let resolved = tokio::task::spawn_blocking(move || {
            resolve(&current, &previous, &resolver, registry.discovery())
        })
        .await;
        let Ok(resolved) = resolved else { continue };
        publish.send_if_modified(|live| {
            let changed = **live != resolved;
            if changed {
                tracing::info!("dns: backend addresses changed");
                *live = Arc::new(resolved);
            }
            changed
        });
    }
}
