//! A worker's proxy: its routing table, and the request path that runs each request through the stages
//! in order.

use crate::{
    attempt::body::ProxyBody,
    backend::client_body::BodyPace,
    backend::cluster::{Cluster, ClusterBalance, SharedHealth},
    error::{ErrorKind, ProxyError},
    exchange::{ConnectionState, InService, Prepared},
    grpc,
    peer::Client,
    request_id::RequestIds,
    stage::filters::Filters,
    stage::hedge_state::RouteHedging,
    stage::mirror::{self, MirrorsInFlight, RouteMirror},
    stage::prepare::{self, Preparing},
    stage::respond,
    stage::retry,
    stage::route,
    stage::route_index::RouteIndex,
    stage::split::Splitter,
    telemetry::access_log::AccessLog,
    telemetry::metrics::{MirrorCounts, Readiness, Registry, RouteTimings, WorkerCounters},
    telemetry::route_cells::RouteCells,
    view::{HealthView, ResolvedNames},
};
use duet_config::{Action, Config, Route};
use http::{Request, Response};
use hyper::body::Incoming;
use std::{
    cell::RefCell, convert::Infallible, pin::pin, rc::Rc, sync::atomic::Ordering::Relaxed,
    sync::Arc,
};
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
    mirrors_in_flight: MirrorsInFlight,
}

struct Table {
    config: Arc<Config>,
    clusters: Vec<Rc<Cluster>>,
    /// What this worker keeps for each route, in `config.routes` order.
    routes: Vec<RouteState>,
    /// `config.routes` by exact host, so a large table is not scanned per request.
    index: RouteIndex,
    /// Each route's mirroring state (`None` for a route without `mirror:`), in `config.routes` order.
    mirrors: Vec<Option<RouteMirror>>,
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
            mirrors_in_flight: MirrorsInFlight::default(),
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
                cells.routes = (table.routes.iter().flat_map(|route| &route.timings))
                    .filter(|(to, _)| *to == index)
                    .map(|(_, timings)| timings.clone())
                    .collect();
                cells.mirrors = (table.config.routes.iter().zip(&table.mirrors))
                    .filter(|(route, _)| route.mirror.is_some_and(|m| m.cluster == index))
                    .filter_map(|(_, state)| Some(state.as_ref()?.counts.clone()))
                    .collect();
                cells
            })
            .collect();
        registry.publish(*index, cells);
        registry.publish_routes(*index, RouteCells::of(&table.config));
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
                cluster.name_backends(config, names);
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
        Some(cluster.client().connections())
    }

    /// Proxies one request from `client` through the stages: route, prepare,
    /// retry (each attempt forwarded to a backend the balancer picks), respond. Never fails: errors
    /// become short text responses.
    ///
    /// The whole of what hyper boxes per request: the service hands this future to hyper as it is (no
    /// wrapper around it to double its size, 2.8 KB), and `in_service` counts the request on its
    /// connection until the response head is out. Each stage's future is pinned where it is built
    /// and awaited through the pin: awaited by value, it would be copied into this one's (kilobytes,
    /// per request).
    pub(crate) async fn handle(
        self: Rc<Self>,
        mut request: Request<Incoming>,
        client: Client,
        in_service: InService,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let connection = in_service.connection();
        // HTTP/2 has no connection fields: its connection says GOAWAY when it closes.
        let http2 = request.version() == http::Version::HTTP_2;
        self.counters.request(request.version());
        let grpc = grpc::is_grpc(request.headers());
        let started = Instant::now();
        let table = self.table.borrow().clone();
        let client = table.trust(client);
        let request_id = self.ids.assign(request.headers_mut(), client.trusted);
        let mut log = AccessLog::start(&request, started, client, request_id);
        if request.uri().path() == "*" {
            return Ok(respond::asterisk(&request, log));
        }
        let routed = match table.route(client.listener, &mut request) {
            Ok(routed) => routed,
            Err(error) => return Ok(self.unrouted(&error, log, grpc)),
        };
        if let Action::Redirect(redirect) = &routed.route.action {
            let (matched, host) = (&routed.route.path, routed.host.as_ref());
            return Ok(respond::redirect(
                redirect, matched, &request, host, client.tls, log,
            ));
        }
        let state = &table.routes[routed.index];
        let Some((index, timings)) = state.pick() else {
            return Ok(self.unrouted(&ProxyError::new(ErrorKind::NoRoute), log, grpc));
        };
        let cluster = &table.clusters[index];
        if let Some(log) = log.as_mut() {
            log.cluster = Some(cluster.name.clone());
        }

        let route = (routed.route, &state.filters);
        // A body refused is left unread, and the connection closes after the answer.
        let closes = !http2 && !http_body::Body::is_end_stream(request.body());
        let mut prepared = match prepare::prepare(request, cluster, route, routed.host, client) {
            Ok(Preparing::Ready(prepared)) => prepared,
            Ok(Preparing::Unread(unread)) => match pin!(unread.read(cluster)).await {
                Ok(prepared) => prepared,
                Err(error) => return Ok(refused(cluster, client, &error, log, grpc, closes)),
            },
            Err(error) => return Ok(refused(cluster, client, &error, log, grpc, closes)),
        };
        self.start_mirror(&table, routed.route, routed.index, &prepared);
        let hedging = table.hedging[routed.index].as_deref();
        let attempts = retry::RouteState { timings, hedging };
        let outcome = pin!(retry::send(
            cluster,
            routed.route,
            attempts,
            &mut prepared,
            started,
            log
        ))
        .await;
        if outcome.is_err() {
            // No backend answered: the error response is the whole of it. (An answered request is
            // timed when its body ends, by its `Completion`.)
            timings.request_duration.observe(started.elapsed());
        }
        let mut response = respond::respond(
            cluster,
            outcome,
            (prepared.upgrade, &state.filters.response),
            client.address,
            connection,
            grpc,
        );
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS && !http2 {
            self.http1_fields(&table, connection, response.headers_mut(), grpc);
        }
        Ok(response)
    }
}

impl WorkerProxy {
    /// The fields only an HTTP/1.1 response has: whether the connection stays open, and the trailers
    /// a gRPC response will end with.
    fn http1_fields(
        &self,
        table: &Table,
        connection: &ConnectionState,
        headers: &mut http::HeaderMap,
        grpc: bool,
    ) {
        if grpc {
            respond::announce_grpc_trailers(headers);
        }
        let limits = &table.config.limits;
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

    /// Copies the request to the route's mirror cluster, if it has one: never waited for.
    fn start_mirror(&self, table: &Table, route: &Route, index: usize, prepared: &Prepared) {
        let (Some(mirror), Some(Some(state))) = (&route.mirror, table.mirrors.get(index)) else {
            return;
        };
        let Some(cluster) = table.clusters.get(mirror.cluster) else {
            return;
        };
        let cap = table.config.limits.max_mirrors_in_flight;
        mirror::mirror(
            mirror,
            state,
            cluster,
            &self.mirrors_in_flight,
            cap,
            prepared,
        );
    }

    /// The answer to a request refused before routing, counted by why.
    fn unrouted(
        &self,
        error: &ProxyError,
        log: Option<Box<AccessLog>>,
        grpc: bool,
    ) -> Response<ProxyBody> {
        let counter = match error.kind() {
            ErrorKind::UriTooLong => &self.counters.uri_too_long,
            ErrorKind::NoRoute => &self.counters.no_route,
            _ => &self.counters.malformed,
        };
        counter.fetch_add(1, Relaxed);
        respond::error_response(error, log, grpc)
    }
}

impl Table {
    /// Stage 1 on this table's routes.
    fn route<B>(
        &self,
        listener: usize,
        request: &mut Request<B>,
    ) -> Result<route::Routed<'_>, ProxyError> {
        let (routes, limits) = (&self.config.routes, &self.config.limits);
        route::route(
            routes,
            &self.index,
            listener,
            limits.max_uri_length,
            request,
        )
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
        let routes = (config.routes.iter())
            .map(|route| RouteState::new(route, &config.clusters, previous))
            .collect();
        let mirrors = mirror_states(&config, previous);
        let index = RouteIndex::new(&config.routes);
        let hedging = hedging(&config, previous);
        let previous = previous.map_or(&[][..], |old| &old.clusters[..]);
        let clusters = config
            .clusters
            .iter()
            .map(|cluster| {
                let kept = previous.iter().find(|old| *old.name == *cluster.name);
                let built = Cluster::new(
                    cluster,
                    kept.map(|c| &**c),
                    &names.endpoints(cluster),
                    health.clone(),
                    BodyPace::new(&config.limits),
                );
                built.name_backends(cluster, names);
                Rc::new(built)
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
            index,
            mirrors,
            hedging,
            keep_alive,
        }
    }
}

/// What a worker keeps for one route: its split, its filters compiled, and the latency histograms of
/// each cluster it sends to.
struct RouteState {
    /// The index of each cluster the route sends to, and its histograms for the route (the `cluster`
    /// label of its series), in the order of the route's action.
    timings: Vec<(usize, Arc<RouteTimings>)>,
    /// The smooth weighted round robin of a split route.
    split: Option<Splitter>,
    filters: Filters,
}

impl RouteState {
    /// The state of `route`, keeping the histograms `previous` had for the same route name and
    /// cluster name, so that a reload does not reset their series.
    fn new(route: &Route, clusters: &[duet_config::Cluster], previous: Option<&Table>) -> Self {
        let name = |clusters: &[duet_config::Cluster], index: usize| {
            clusters.get(index).map(|c| c.name.clone())
        };
        let kept = |index: usize| {
            let old = previous?;
            let (_, state) =
                (old.config.routes.iter().zip(&old.routes)).find(|(r, _)| r.name == route.name)?;
            let wanted = name(clusters, index);
            (state.timings.iter())
                .find(|(to, _)| name(&old.config.clusters, *to) == wanted)
                .map(|(_, timings)| timings.clone())
        };
        let timings = (route.action.clusters())
            .map(|index| {
                let timings =
                    kept(index).unwrap_or_else(|| Arc::new(RouteTimings::new(&route.name)));
                (index, timings)
            })
            .collect();
        let split = match &route.action {
            Action::Split(split) => Some(Splitter::new(split)),
            Action::Cluster(_) | Action::Redirect(_) => None,
        };
        Self {
            timings,
            split,
            filters: Filters::new(route),
        }
    }

    /// The cluster (its index) that takes this request, and the route's histograms for it; `None`
    /// for a redirect route.
    fn pick(&self) -> Option<(usize, &Arc<RouteTimings>)> {
        let position = self.split.as_ref().map_or(0, Splitter::pick);
        self.timings
            .get(position)
            .map(|(index, timings)| (*index, timings))
    }
}

/// The answer to a request the prepare stage refused, counted as its cluster's; `body_unread`: the
/// request has a body duet did not read to its end (it refused it before or while reading it).
fn refused(
    cluster: &Cluster,
    client: Client,
    error: &ProxyError,
    log: Option<Box<AccessLog>>,
    grpc: bool,
    body_unread: bool,
) -> Response<ProxyBody> {
    tracing::debug!(client = %client.address, "{error}");
    cluster.counters.response(error.status().as_u16());
    let mut response = respond::cluster_error(cluster, error, log, grpc);
    if body_unread {
        // What is left of the body is not read: the connection closes after the answer (hyper
        // honours the field), and the client hears it rather than meeting the close.
        let close = http::HeaderValue::from_static("close");
        response
            .headers_mut()
            .insert(http::header::CONNECTION, close);
    }
    response
}

/// Each route's mirroring state; a route that mirrors to the same cluster under the same name as in
/// `previous` keeps its counts.
fn mirror_states(config: &Config, previous: Option<&Table>) -> Vec<Option<RouteMirror>> {
    let mirror_cluster = |config: &Config, route: &Route| {
        let mirror = route.mirror?;
        Some(config.clusters.get(mirror.cluster)?.name.clone())
    };
    (config.routes.iter())
        .map(|route| {
            let target = mirror_cluster(config, route)?;
            let kept = previous.and_then(|old| {
                let (_, state) = (old.config.routes.iter().zip(&old.mirrors)).find(|(r, _)| {
                    r.name == route.name && mirror_cluster(&old.config, r).as_ref() == Some(&target)
                })?;
                Some(state.as_ref()?.counts.clone())
            });
            let counts = kept.unwrap_or_else(|| Arc::new(MirrorCounts::new(&route.name)));
            Some(RouteMirror::new(counts))
        })
        .collect()
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
