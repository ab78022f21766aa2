//! A worker's proxy: its routing table, and the request path that runs each request through the stages
//! in order.

use crate::{
    attempt::body::ProxyBody,
    backend::client_body::BodyPace,
    backend::cluster::{Cluster, ClusterBalance, SharedHealth},
    error::{ErrorKind, ProxyError},
    exchange::InService,
    peer::Client,
    request_id::RequestIds,
    stage::hedge_state::RouteHedging,
    stage::prepare,
    stage::respond,
    stage::retry::{self, RouteState},
    stage::route,
    telemetry::access_log::AccessLog,
    telemetry::metrics::{Readiness, Registry, RouteTimings, WorkerCounters},
    view::{HealthView, ResolvedNames},
};
use duet_config::{Action, Config};
use http::{Request, Response};
use hyper::body::Incoming;
use std::{cell::RefCell, convert::Infallible, rc::Rc, sync::atomic::Ordering::Relaxed, sync::Arc};
use tokio::time::Instant;

/// A worker's proxy state. It lives on the worker's thread (`Rc`, `RefCell`): nothing in it is shared
/// with another worker, and no borrow is held across an `.await`.
///
/// Its routing table can be replaced by [`reload`](Self::reload) between requests: each request works on
/// the table it started with; balancer state carries over for backends (keyed by address) that remain.
pub struct WorkerProxy {
    table: RefCell<Rc<Table>>,
    health: SharedHealth,
    counters: Arc<WorkerCounters>,
    registry: Option<(usize, Registry)>,
    readiness: Arc<Readiness>,
    ids: RequestIds,
}

struct Table {
    config: Arc<Config>,
    clusters: Vec<Rc<Cluster>>,
    /// Each route's latency histograms, in `config.routes` order.
    routes: Vec<Arc<RouteTimings>>,
    /// Each hedging route's delay and budget in this worker, in `config.routes` order.
    hedging: Vec<Option<Rc<RouteHedging>>>,
    /// `Keep-Alive: timeout=N`, telling clients when duet closes an idle connection.
    keep_alive: http::HeaderValue,
}

const KEEP_ALIVE: http::HeaderName = http::HeaderName::from_static("keep-alive");

impl WorkerProxy {
    /// Builds a worker's clients and balancers for `config`, with host names resolved as in `names`.
    /// Must run inside the worker's tokio runtime, and requests be handled inside a `tokio::task::LocalSet`
    /// (the upstream pool drives its connections with `spawn_local`).
    pub fn new(config: Arc<Config>, names: &ResolvedNames) -> Self {
        Self::build(config, names, None)
    }

    /// Like [`new`](Self::new), publishing this worker's metric cells in `registry` as worker `index`.
    pub fn with_registry(
        config: Arc<Config>,
        names: &ResolvedNames,
        index: usize,
        registry: Registry,
    ) -> Self {
        Self::build(config, names, Some((index, registry)))
    }

    fn build(
        config: Arc<Config>,
        names: &ResolvedNames,
        registry: Option<(usize, Registry)>,
    ) -> Self {
        let counters = registry
            .as_ref()
            .map_or_else(Default::default, |(index, registry)| {
                registry.worker(*index)
            });
        let readiness = registry
            .as_ref()
            .map_or_else(Default::default, |(_, r)| r.readiness_flags());
        let health = SharedHealth::default();
        let table = Table::new(config, names, None, &health);
        let proxy = Self {
            table: RefCell::new(Rc::new(table)),
            health,
            counters,
            registry,
            readiness,
            ids: RequestIds::new(),
        };
        proxy.publish_cells();
        proxy
    }

    /// The limits of the config in force now: a connection takes them when it starts, and again each
    /// time it comes back from the parking lot.
    pub fn limits(&self) -> duet_config::Limits {
        self.table.borrow().config.limits
    }

    /// The drain deadline of the config in force now.
    pub fn drain_timeout(&self) -> std::time::Duration {
        self.table.borrow().config.shutdown.drain_timeout
    }

    pub(crate) fn counters_handle(&self) -> Arc<WorkerCounters> {
        self.counters.clone()
    }

    fn publish_cells(&self) {
        let Some((index, registry)) = &self.registry else {
            return;
        };
        let table = self.table.borrow().clone();
        let cells = table
            .clusters
            .iter()
            .enumerate()
            .map(|(index, cluster)| {
                let mut cells = cluster.cells();
                cells.routes = (table.config.routes.iter().zip(&table.routes))
                    .filter(|(route, _)| route.action.cluster() == Some(index))
                    .map(|(_, timings)| timings.clone())
                    .collect();
                cells
            })
            .collect();
        registry.publish(*index, cells);
    }

    /// Switches to a new config. Clusters are matched by name: a cluster that keeps its policy keeps its
    /// balancer, and with it the load and latency state of every backend address that remains; new
    /// backends start as a new endpoint would (PeakEWMA at the pool median). Requests in flight finish
    /// on the table they started with.
    pub fn reload(&self, config: Arc<Config>, names: &ResolvedNames) {
        let old = self.table.borrow().clone();
        let table = Table::new(config, names, Some(&old), &self.health);
        for cluster in &table.clusters {
            cluster.resume();
        }
        *self.table.borrow_mut() = Rc::new(table);
        self.publish_cells();
    }

    /// Applies discovery's latest resolution: each cluster's balancer gains the new addresses and loses
    /// the gone ones, keeping everything else (state, clients, pooled connections).
    pub fn apply_names(&self, names: &ResolvedNames) {
        let table = self.table.borrow().clone();
        for (config, cluster) in table.config.clusters.iter().zip(&table.clusters) {
            if config.has_named_backends() {
                cluster.set_endpoints(&names.endpoints(config));
            }
        }
        self.publish_cells();
    }

    /// Applies the control plane's health view: a backend is eligible when it is healthy and this
    /// worker has not ejected it. Runs between requests, off the request path.
    pub fn apply_health(&self, view: Arc<HealthView>) {
        *self.health.borrow_mut() = view;
        let now = Instant::now();
        for cluster in &self.table.borrow().clusters {
            cluster.refresh_all(now);
        }
    }

    /// Runs `f` on a cluster's balancer (for telemetry and tests).
    pub fn with_balance<T>(
        &self,
        cluster: &str,
        f: impl FnOnce(&ClusterBalance) -> T,
    ) -> Option<T> {
        let table = self.table.borrow().clone();
        let cluster = table.clusters.iter().find(|c| &*c.name == cluster)?;
        Some(cluster.with_balance(f))
    }

    /// Upstream connections pooled now for `cluster`'s backends.
    #[cfg(test)]
    pub(crate) fn pooled_connections(&self, cluster: &str) -> Option<usize> {
        let table = self.table.borrow().clone();
        let cluster = table.clusters.iter().find(|c| &*c.name == cluster)?;
        Some(cluster.client().idle_connections())
    }

    /// Proxies one request from `client` through the stages: route, prepare,
    /// retry (each attempt forwarded to a backend the balancer picks), respond. Never fails: errors
    /// become short text responses.
    ///
    /// The whole of what hyper boxes per request: the service hands this future to hyper as it is (no
    /// wrapper around it to double its size, 2.8 KB), and `in_service` counts the request on its
    /// connection until the response head is out.
    pub(crate) async fn handle(
        self: Rc<Self>,
        mut request: Request<Incoming>,
        client: Client,
        in_service: InService,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let connection = in_service.connection();
        // HTTP/2 has no connection fields: its connection says GOAWAY when it closes.
        let http2 = request.version() == http::Version::HTTP_2;
        let started = Instant::now();
        let table = self.table.borrow().clone();
        let client = table.trust(client);
        let request_id = self.ids.assign(request.headers_mut(), client.trusted);
        let mut log = AccessLog::start(&request, started, client, request_id);
        if request.uri().path() == "*" {
            return Ok(respond::asterisk(&request, log));
        }
        let limits = &table.config.limits;
        let routes = &table.config.routes;
        let routed =
            match route::route(routes, client.listener, limits.max_uri_length, &mut request) {
                Ok(routed) => routed,
                Err(error) => return Ok(self.unrouted(&error, log)),
            };
        let index = match &routed.route.action {
            Action::Cluster(index) => *index,
            Action::Redirect(redirect) => {
                let (matched, host) = (&routed.route.path, routed.host.as_ref());
                return Ok(respond::redirect(
                    redirect, matched, &request, host, client.tls, log,
                ));
            }
        };
        let cluster = &table.clusters[index];
        if let Some(log) = log.as_mut() {
            log.cluster = Some(cluster.name.clone());
        }

        let mut prepared =
            match prepare::prepare(request, cluster, routed.route, routed.host, client).await {
                Ok(prepared) => prepared,
                Err(error) => {
                    tracing::debug!(client = %client.address, "{error}");
                    cluster.counters.response(error.status().as_u16());
                    return Ok(respond::local_error(&error, log));
                }
            };
        let state = table.route_state(routed.index);
        let outcome = retry::send(cluster, routed.route, state, &mut prepared, started, log).await;
        if outcome.is_err() {
            // No backend answered: the error response is the whole of it. (An answered request is
            // timed when its body ends, by its `Completion`.)
            state.timings.request_duration.observe(started.elapsed());
        }
        let mut response = respond::respond(
            cluster,
            outcome,
            prepared.upgrade,
            client.address,
            connection,
        );
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS && !http2 {
            let headers = response.headers_mut();
            if self.readiness.draining() || connection.requests() >= limits.keepalive_requests {
                // Clients reconnect (elsewhere) instead of reusing a connection about to close.
                headers.insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            } else {
                headers.insert(KEEP_ALIVE, table.keep_alive.clone());
            }
        }
        Ok(response)
    }
}

impl WorkerProxy {
    /// The answer to a request refused before routing, counted by why.
    fn unrouted(&self, error: &ProxyError, log: Option<Box<AccessLog>>) -> Response<ProxyBody> {
        let counter = match error.kind() {
            ErrorKind::UriTooLong => &self.counters.uri_too_long,
            ErrorKind::NoRoute => &self.counters.no_route,
            _ => &self.counters.malformed,
        };
        counter.fetch_add(1, Relaxed);
        respond::local_error(error, log)
    }
}

impl Table {
    /// What the route at `index` keeps in this worker.
    fn route_state(&self, index: usize) -> RouteState<'_> {
        RouteState {
            timings: &self.routes[index],
            hedging: self.hedging[index].as_deref(),
        }
    }

    /// `client` trusted as its listener's `trusted_proxies` say now: a reload may have revoked (or
    /// granted) the trust since the connection was accepted.
    fn trust(&self, client: Client) -> Client {
        let trusted = (self.config.listeners.get(client.listener))
            .is_some_and(|listener| listener.trusts(client.address.ip()));
        Client { trusted, ..client }
    }

    /// The table for `config`, taking over what `previous` clusters of the same name can hand on, and
    /// the histograms of routes that keep their name and cluster.
    fn new(
        config: Arc<Config>,
        names: &ResolvedNames,
        previous: Option<&Table>,
        health: &SharedHealth,
    ) -> Self {
        let routes = config
            .routes
            .iter()
            .map(|route| {
                let target = route.target(&config.clusters);
                previous
                    .and_then(|old| {
                        old.config.routes.iter().zip(&old.routes).find(|(r, _)| {
                            r.name == route.name && r.target(&old.config.clusters) == target
                        })
                    })
                    .map_or_else(
                        || Arc::new(RouteTimings::new(&route.name)),
                        |(_, kept)| kept.clone(),
                    )
            })
            .collect();
        let hedging = hedging(&config, previous);
        let previous = previous.map_or(&[][..], |old| &old.clusters[..]);
        let clusters = config
            .clusters
            .iter()
            .map(|cluster| {
                let kept = previous.iter().find(|old| *old.name == *cluster.name);
                Rc::new(Cluster::new(
                    cluster,
                    kept.map(|c| &**c),
                    &names.endpoints(cluster),
                    health.clone(),
                    BodyPace::new(&config.limits),
                ))
            })
            .collect();
        let keep_alive = http::HeaderValue::from_str(&format!(
            "timeout={}",
            config.limits.keepalive_timeout.as_secs()
        ))
        .unwrap_or_else(|_| http::HeaderValue::from_static("timeout=75"));
        Self {
            config,
            clusters,
            routes,
            hedging,
            keep_alive,
        }
    }
}

/// Each route's hedging state: a route that keeps its name, cluster and `hedge:` across a reload
/// keeps its latency window and budget (no new warm-up).
fn hedging(config: &Config, previous: Option<&Table>) -> Vec<Option<Rc<RouteHedging>>> {
    let kept = |route: &duet_config::Route| {
        let old = previous?;
        let target = route.target(&config.clusters);
        let at = old.config.routes.iter().position(|r| {
            r.name == route.name
                && r.hedge == route.hedge
                && r.target(&old.config.clusters) == target
        })?;
        old.hedging.get(at).cloned().flatten()
    };
    (config.routes.iter())
        .map(|route| {
            let hedge = route.hedge.clone()?;
            Some(kept(route).unwrap_or_else(|| Rc::new(RouteHedging::new(hedge))))
        })
        .collect()
}
