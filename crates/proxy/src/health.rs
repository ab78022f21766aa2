//! Active health checks, run once per process on the control plane (not once per worker: that would
//! multiply probe traffic by the worker count), published to every worker.

use bytes::Bytes;
use duet_config::{Config, HealthCheck};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::{TokioExecutor, TokioTimer},
};
use std::{cell::RefCell, net::SocketAddr, rc::Rc, sync::Arc};
use tokio::sync::watch;

/// Which backends pass their health checks: `clusters[c][b]` for backend `b` of cluster `c`, in config
/// order. Backends of clusters without checks are always healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthView {
    /// Per cluster, per backend.
    pub clusters: Vec<Vec<bool>>,
}

impl HealthView {
    /// The view before any check has run: with checks configured a backend is admitted only after its
    /// first passing check (as Envoy does); without, it starts healthy.
    pub fn initial(config: &Config) -> Self {
        Self {
            clusters: config
                .clusters
                .iter()
                .map(|c| vec![c.health_check.is_none(); c.backends.len()])
                .collect(),
        }
    }
}

/// Probes every backend of every cluster that has `health_check` configured, publishing each change of
/// state on `publish`, until `shutdown` turns true. Runs on the caller's (single-threaded) runtime.
pub async fn run_health_checks(
    config: Arc<Config>,
    publish: watch::Sender<Arc<HealthView>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let view = Rc::new(RefCell::new(HealthView::initial(&config)));
    let publish = Rc::new(publish);
    let mut probes = tokio::task::JoinSet::new();
    for (c, cluster) in config.clusters.iter().enumerate() {
        let Some(check) = &cluster.health_check else {
            continue;
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(check.timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(check.interval * 2)
            .build::<_, Empty<Bytes>>(connector);
        for (b, backend) in cluster.backends.iter().enumerate() {
            let probe = Probe {
                cluster: cluster.name.clone(),
                address: backend.address,
                check: check.clone(),
                client: client.clone(),
            };
            let view = view.clone();
            let publish = publish.clone();
            probes.spawn_local(async move {
                probe
                    .run(|healthy| {
                        let changed = {
                            let mut view = view.borrow_mut();
                            let slot = &mut view.clusters[c][b];
                            let changed = *slot != healthy;
                            *slot = healthy;
                            changed
                        };
                        if changed {
                            publish.send_replace(Arc::new(view.borrow().clone()));
                        }
                    })
                    .await
            });
        }
    }
    if probes.is_empty() {
        return;
    }
    let _ = shutdown.wait_for(|stop| *stop).await;
    probes.abort_all();
}

struct Probe {
    cluster: String,
    address: SocketAddr,
    check: HealthCheck,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Probe {
    async fn run(self, mut report: impl FnMut(bool)) {
        let mut healthy = false;
        let mut admitted_once = false;
        let (mut passes, mut failures) = (0u32, 0u32);
        let uri: http::Uri = match format!("http://{}{}", self.address, self.check.path).parse() {
            Ok(uri) => uri,
            Err(error) => {
                tracing::error!(cluster = %self.cluster, backend = %self.address, "bad health check path: {error}");
                return;
            }
        };
        loop {
            let passed = self.probe(&uri).await;
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
                if healthy && failures >= self.check.unhealthy_threshold {
                    healthy = false;
                    tracing::warn!(cluster = %self.cluster, backend = %self.address, failures, "backend unhealthy");
                    report(false);
                }
            }
            tokio::time::sleep(self.check.interval).await;
        }
    }

    async fn probe(&self, uri: &http::Uri) -> bool {
        let attempt = async {
            let response = self.client.get(uri.clone()).await.ok()?;
            let status = response.status().as_u16();
            // Read the body so the connection can be reused for the next check.
            response.into_body().collect().await.ok()?;
            Some(self.check.passes(status))
        };
        matches!(
            tokio::time::timeout(self.check.timeout, attempt).await,
            Ok(Some(true))
        )
    }
}
