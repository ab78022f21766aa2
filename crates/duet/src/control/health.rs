//! Active health checks, run once per process on the control plane (not once per worker: that would
//! multiply probe traffic by the worker count), published to every worker.

use duet_config::{Config, HealthCheck};
use duet_proxy::{health_client, HealthClient, HealthView, ResolvedNames};
use std::{cell::RefCell, net::SocketAddr, rc::Rc, sync::Arc};
use tokio::sync::watch;

/// Probes every endpoint of every cluster that has `health_check` configured, publishing each change of
/// state on `publish`, until `shutdown` turns true. A new config, or host names resolving to new
/// addresses, restarts the probes, keeping the state of endpoints that remain. Runs on the caller's
/// (single-threaded) runtime.
pub(crate) async fn run(
    mut config: watch::Receiver<Arc<Config>>,
    mut names: watch::Receiver<Arc<ResolvedNames>>,
    publish: watch::Sender<Arc<HealthView>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let current = config.borrow_and_update().clone();
        let resolved = names.borrow_and_update().clone();
        let previous = publish.borrow().clone();
        let view = HealthView::for_config(&current, &resolved, &previous);
        let view = Rc::new(RefCell::new(view));
        publish.send_replace(Arc::new(view.borrow().clone()));
        let publish = Rc::new(publish.clone());
        let mut probes = tokio::task::JoinSet::new();
        for cluster in &current.clusters {
            let Some(check) = &cluster.health_check else {
                continue;
            };
            // The cluster's own kind of connection: its protocol, TLS with its `tls:` settings if any.
            let client = health_client(cluster, &resolved, check.timeout, check.interval * 2);
            for endpoint in resolved.endpoints(cluster) {
                let initial = view
                    .borrow()
                    .healthy(&cluster.name, endpoint.address)
                    .unwrap_or(false);
                let probe = Probe {
                    cluster: cluster.name.clone(),
                    address: endpoint.address,
                    check: check.clone(),
                    client: client.clone(),
                };
                let view = view.clone();
                let publish = publish.clone();
                probes.spawn_local(async move {
                    let (cluster, address) = (probe.cluster.clone(), probe.address);
                    probe
                        .run(initial, |healthy| {
                            if view.borrow_mut().set(&cluster, address, healthy) {
                                publish.send_replace(Arc::new(view.borrow().clone()));
                            }
                        })
                        .await
                });
            }
        }
        tokio::select! {
            changed = config.changed() => {
                probes.abort_all();
                if changed.is_err() {
                    return;
                }
            }
            changed = names.changed() => {
                probes.abort_all();
                if changed.is_err() {
                    return;
                }
            }
            _ = shutdown.wait_for(|stop| *stop) => {
                probes.abort_all();
                return;
            }
        }
    }
}

struct Probe {
    cluster: String,
    address: SocketAddr,
    check: HealthCheck,
    client: HealthClient,
}

impl Probe {
    async fn run(self, initial: bool, mut report: impl FnMut(bool)) {
        let mut healthy = initial;
        let mut admitted_once = initial;
        let (mut passes, mut failures) = (0u32, 0u32);
        let mut last_failure = String::new();
        loop {
            let passed = match self.probe().await {
                Ok(()) => true,
                Err(why) => {
                    last_failure = why;
                    false
                }
            };
            if passed {
                passes += 1;
                failures = 0;
                // The first pass admits at once; after a failure it takes healthy_threshold passes.
                if !healthy && (!admitted_once || passes >= self.check.healthy_threshold) {
                    healthy = true;
                    admitted_once = true;
                    tracing::info!(cluster = %self.cluster, backend = %self.address, "backend healthy");
                    report(true);
                }
            } else {
                failures += 1;
                passes = 0;
                // A backend that never passed would otherwise never say why (a refused certificate).
                if failures == 1 && !admitted_once {
                    tracing::warn!(cluster = %self.cluster, backend = %self.address, reason = %last_failure, "backend not admitted: its health check failed");
                }
                if healthy && failures >= self.check.unhealthy_threshold {
                    healthy = false;
                    tracing::warn!(cluster = %self.cluster, backend = %self.address, failures, reason = %last_failure, "backend unhealthy");
                    report(false);
                }
            }
            tokio::time::sleep(self.check.interval).await;
        }
    }

    /// One check; why it failed, such as a refused certificate (logged when the backend goes down).
    async fn probe(&self) -> Result<(), String> {
        let attempt = self.client.probe(self.address, &self.check.path);
        match tokio::time::timeout(self.check.timeout, attempt).await {
            Ok(Ok(status)) if self.check.passes(status) => Ok(()),
            Ok(Ok(status)) => Err(format!("answered {status}")),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(format!("no answer within {:?}", self.check.timeout)),
        }
    }
}
