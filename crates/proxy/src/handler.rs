//! A worker's proxy: its routing table, and the request path that runs each request through the stages
//! in order.

use crate::{
    attempt::body::ProxyBody,
    backend::client_body::BodyPace,
    backend::cluster::{Cluster, ClusterBalance, SharedHealth},
    error::{ErrorKind, ProxyError},
    exchange::{ConnectionState, InService, WorkerBuffers},
    filter::phase::{Arrival, Build, Decision},
    filter::RouteFilters,
    grpc, headers,
    peer::Client,
    request_id::RequestIds,
    route_state::RouteState,
    stage::prepare::{self, Preparing},
    stage::respond,
    stage::retry,
    stage::route,
    stage::route_index::RouteIndex,
    telemetry::access_log::{AccessLog, LineFormat},
    telemetry::done::{self, Done},
    telemetry::metrics::{Readiness, Registry, RouteTimings, WorkerCounters},
    telemetry::route_cells::RouteCells,
    telemetry::trace::{Export, RequestTrace, Tracer},
    view::{HealthView, ResolvedNames},
};
use duet_config::{Config, Route, Underscores};
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
    /// The process's trace exporters (or this worker's own, without a registry).
    traces: Arc<Export>,
}

struct Table {
    config: Arc<Config>,
    clusters: Vec<Rc<Cluster>>,
    /// What this worker keeps for each route, in `config.routes` order.
    routes: Vec<RouteState>,
    /// `config.routes` by exact host, so a large table is not scanned per request.
    index: RouteIndex,
    /// `Keep-Alive: timeout=N`, telling clients when duet closes an idle connection.
    keep_alive: http::HeaderValue,
    /// The config's `tracing:`, if it has one.
    tracer: Option<Tracer>,
    /// What the access log's lines hold (`access_log:`).
    log_format: Rc<LineFormat>,
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
        let counters = registry.as_ref().map_or_else(
            || Arc::new(WorkerCounters::for_listeners(&config.listeners)),
            |(index, registry)| registry.worker(*index, &config.listeners),
        );
        let readiness = registry
            .as_ref()
            .map_or_else(Default::default, |(_, r)| r.readiness_flags());
        let health = SharedHealth::default();
        let traces = (registry.as_ref()).map_or_else(Default::default, |(_, r)| r.trace_export());
        let table = Table::new(config, names, None, (&health, &traces));
        let proxy = Self {
            table: RefCell::new(Rc::new(table)),
            health,
            counters,
            registry,
            readiness,
            ids: RequestIds::new(),
            traces,
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
        let mut cells: Vec<_> = table.clusters.iter().map(|c| c.cells()).collect();
        for route in &table.routes {
            route.publish(&mut cells);
        }
        registry.publish(*index, cells, crate::filter::counter_families());
        registry.publish_routes(*index, RouteCells::of(&table.config));
    }

    /// Switches to a new config. Clusters are matched by name: a cluster that keeps its policy keeps its
    /// balancer, and with it the load and latency state of every backend address that remains; new
    /// backends start as a new endpoint would (PeakEWMA at the pool median). Requests in flight finish
    /// on the table they started with.
    pub fn reload(&self, config: Arc<Config>, names: &ResolvedNames) {
        let old = self.table.borrow().clone();
        let table = Table::new(config, names, Some(&old), (&self.health, &self.traces));
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
        let (client, keeps) = table.trust(client);
        let dropped = self.scrub_client_fields(keeps, connection, request.headers_mut());
        let request_id = self.ids.assign(request.headers_mut(), client.trusted);
        let mut log = table.log(&request, started, client, request_id, connection);
        if request.uri().path() == "*" {
            return Ok(respond::asterisk(&request, log));
        }
        let routed = match table.route(client.listener, &mut request) {
            Ok(routed) => routed,
            Err(error) => return Ok(self.unrouted(&error, log, grpc)),
        };
        let state = &table.routes[routed.index];
        let trace = table.trace(&request, &client, routed.route, &mut log);
        let shaping = state.filters.shaping(&request, grpc);
        let (pages, filters) = ((grpc, shaping.pages), &state.filters);
        let paged = |r| traced(&trace, respond::with_error_page(r, filters, shaping.pages));
        if let Some(answer) = request_phase(state, &routed, &request, client, &mut log, pages) {
            return Ok(traced(&trace, answer));
        }
        if filters.admits() {
            let decided = pin!(state.filters.admit(&mut request, &client, &mut log)).await;
            if let Some(answer) = answered(state, decided, &mut log, pages) {
                return Ok(traced(&trace, answer));
            }
        }
        let Some((index, timings)) = state.pick() else {
            return Ok(traced(&trace, self.no_route(log, grpc)));
        };
        let cluster = &table.clusters[index];
        routed_to(&mut log, trace.as_deref(), &cluster.name, &timings.route);
        let (route, trailers) = (routed.route, state.trailers(dropped));
        let parts = (route, &**filters, trailers, state.body_limit);
        // A body refused is left unread, and the connection closes after the answer.
        let closes = !http2 && !http_body::Body::is_end_stream(request.body());
        let refuse = |e: &ProxyError, log| paged(refused(cluster, client, e, log, grpc, closes));
        let mut buffering = None; // a body read in full: its budgets' share, held to the end
        let mut prepared = match prepare::prepare(request, cluster, parts, routed.host, client) {
            Ok(Preparing::Ready(prepared)) => prepared,
            Ok(Preparing::Unread(unread)) => {
                let read = unread.read(cluster, (connection, self.buffers(&table)), &mut buffering);
                match pin!(read).await {
                    Ok(prepared) => prepared,
                    Err(e) => return Ok(refuse(&e, log)),
                }
            }
            Err(e) => return Ok(refuse(&e, log)),
        };
        filters.on_prepared(&prepared);
        prepared.watch = trace.clone().map(|trace| trace as _);
        let attempts = retry::RouteState { timings, filters };
        let sent = retry::send(cluster, route, attempts, &mut prepared, started, log);
        let outcome = pin!(sent).await;
        let unanswered = outcome.is_err();
        let asked = (prepared.upgrade.as_ref(), &prepared.session);
        let shaped = (asked, &**filters, shaping);
        let mut response = respond::respond(cluster, outcome, shaped, &client, connection, grpc);
        if unanswered {
            unanswered_done(timings, filters, (started, &trace), response.status());
        }
        self.finish_head((&table, connection), &trace, &mut response, (http2, grpc));
        // Returned as it is: handed through a function by value, it would be moved twice more.
        Ok(response)
    }
}

impl WorkerProxy {
    /// The response's last touches: the fields that speak of its connection (only an HTTP/1.1
    /// response has them: `http2` has none, its connection says GOAWAY when it closes; and a `101`
    /// keeps its own), and its status noted in the request's `trace`, if it is traced.
    fn finish_head(
        &self,
        (table, connection): (&Table, &ConnectionState),
        trace: &Option<Rc<RequestTrace>>,
        response: &mut Response<ProxyBody>,
        (http2, grpc): (bool, bool),
    ) {
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS && !http2 {
            self.http1_fields(table, connection, response.headers_mut(), grpc);
        }
        if let Some(trace) = trace {
            trace.respond(response.status());
        }
    }

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

    /// Takes out the request fields no client sets: any `X-Forwarded-Client-Cert` (the
    /// `connection`'s own goes in its place, if its client presented a certificate), and (counted)
    /// those whose name holds an underscore, unless the listener the request came on `keeps` them
    /// (`underscores_in_headers: keep`); says whether it drops them (its trailers then lose them
    /// too). Before routing: no matcher, header edit or forwarding rule then sees them. Here rather
    /// than in the connection's service: a request changed there is moved once more into this
    /// future (a `memcpy` of it, every request).
    fn scrub_client_fields(
        &self,
        keeps: bool,
        connection: &ConnectionState,
        headers: &mut http::HeaderMap,
    ) -> bool {
        let certificate = connection.certificate.as_ref();
        let dropped = headers::scrub_client_fields(headers, certificate, !keeps);
        if dropped > 0 {
            self.counters.underscore_dropped.fetch_add(dropped, Relaxed);
        }
        !keeps
    }

    /// The worker's budget for bodies read in full, as `table`'s limits set it.
    fn buffers(&self, table: &Table) -> WorkerBuffers<'_> {
        WorkerBuffers {
            counters: &self.counters,
            limit: table.config.limits.max_buffered_bytes,
        }
    }

    /// The answer to a request whose route has no cluster to send it to.
    fn no_route(&self, log: Option<Box<AccessLog>>, grpc: bool) -> Response<ProxyBody> {
        self.unrouted(&ProxyError::new(ErrorKind::NoRoute), log, grpc)
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
            ErrorKind::HeadTooLarge => &self.counters.head_too_large,
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

    /// The trace of `request` on `route`, if this table's `tracing:` traces it; its access-log
    /// record then names it. Inlined: without `tracing:` it is one test, not a call.
    #[inline]
    fn trace(
        &self,
        request: &Request<Incoming>,
        client: &Client,
        route: &Route,
        log: &mut Option<Box<AccessLog>>,
    ) -> Option<Rc<RequestTrace>> {
        let trace = self.tracer.as_ref()?.start(request, client, &route.name)?;
        if let Some(log) = log.as_mut() {
            log.trace = Some(trace.ids());
        }
        Some(trace)
    }

    /// The access-log record of `request` (from `client` on `connection`), its line as this table's
    /// config says; `None` when the access log is off.
    fn log<B>(
        &self,
        request: &Request<B>,
        started: Instant,
        client: Client,
        request_id: http::HeaderValue,
        connection: &ConnectionState,
    ) -> Option<Box<AccessLog>> {
        let (format, tls) = (&self.log_format, connection.tls.as_ref());
        AccessLog::start(request, started, client, request_id, format, tls)
    }

    /// `client` trusted as its listener's `trusted_proxies` say now: a reload may have revoked (or
    /// granted) the trust since the connection was accepted; and whether the listener keeps field
    /// names with underscores (`underscores_in_headers: keep`). One look-up of the listener for both.
    fn trust(&self, client: Client) -> (Client, bool) {
        let Some(listener) = self.config.listeners.get(client.listener) else {
            return (
                Client {
                    trusted: false,
                    ..client
                },
                false,
            );
        };
        let trusted = listener.trusts(client.address.ip());
        let keeps = listener.underscores_in_headers == Underscores::Keep;
        (Client { trusted, ..client }, keeps)
    }

    /// The table for `config`, taking over what `previous` clusters of the same name can hand on, and
    /// what each route of the same name keeps (histograms, what its filters keep).
    fn new(
        config: Arc<Config>,
        names: &ResolvedNames,
        previous: Option<&Table>,
        (health, traces): (&SharedHealth, &Export),
    ) -> Self {
        let index = RouteIndex::new(&config.routes);
        let old_clusters = previous.map_or(&[][..], |old| &old.clusters[..]);
        let clusters: Vec<Rc<Cluster>> = config
            .clusters
            .iter()
            .map(|cluster| {
                let kept = old_clusters.iter().find(|old| *old.name == *cluster.name);
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
        let build = Build {
            config: &config,
            clusters: &clusters,
        };
        let routes = (config.routes.iter())
            .map(|route| {
                RouteState::new(
                    route,
                    &build,
                    previous.and_then(|old| old.route_named(&route.name)),
                )
            })
            .collect();
        let keep_alive = http::HeaderValue::from_str(&format!(
            "timeout={}",
            config.limits.keepalive_timeout.as_secs()
        ))
        .unwrap_or_else(|_| http::HeaderValue::from_static("timeout=75"));
        let tracer = (config.tracing.as_ref()).map(|tracing| Tracer::new(tracing, traces));
        let log_format = Rc::new(LineFormat::new(&config.access_log));
        Self {
            config,
            clusters,
            routes,
            index,
            keep_alive,
            tracer,
            log_format,
        }
    }

    /// The state of the route named `name`.
    fn route_named(&self, name: &str) -> Option<&RouteState> {
        let at = self.config.routes.iter().position(|r| r.name == name)?;
        self.routes.get(at)
    }
}

/// `response`, the status of which the request's trace, if it is traced, notes as sent.
fn traced(trace: &Option<Rc<RequestTrace>>, response: Response<ProxyBody>) -> Response<ProxyBody> {
    if let Some(trace) = trace {
        trace.respond(response.status());
    }
    response
}

/// The request's route picked `cluster`: its access-log record and its trace (if any) name it.
#[inline]
fn routed_to(
    log: &mut Option<Box<AccessLog>>,
    trace: Option<&RequestTrace>,
    cluster: &Arc<str>,
    route: &Arc<str>,
) {
    if let Some(log) = log.as_mut() {
        log.routed(cluster, route);
    }
    if let Some(trace) = trace {
        trace.routed(cluster);
    }
}

/// The done phase of a request no backend answered, with duet's own answer of `status` (one that a
/// backend answered is done when its response body ends, by its attempt's `Completion`).
fn unanswered_done(
    timings: &RouteTimings,
    filters: &RouteFilters,
    (started, trace): (Instant, &Option<Rc<RequestTrace>>),
    status: http::StatusCode,
) {
    let done = Done {
        route: &timings.route,
        status,
        duration: started.elapsed(),
        backend: None,
        exemplar: trace.as_ref().map(|trace| trace.ids().0),
    };
    // Its access-log line is written when duet's answer's body is done with.
    done::finish(
        &done,
        timings,
        Some(filters).filter(|f| f.observes()).map(|f| f as _),
        None,
        "",
    );
}

/// The request phase of the route's filters: duet's own answer if a filter answers or refuses the
/// request, a refusal in the route's error page (`pages`, as [`respond::with_error_page`] takes it).
/// Inlined: a route without a request filter pays one test.
#[inline]
fn request_phase(
    state: &RouteState,
    routed: &route::Routed<'_>,
    request: &Request<Incoming>,
    client: Client,
    log: &mut Option<Box<AccessLog>>,
    (grpc, pages): (bool, Option<bool>),
) -> Option<Response<ProxyBody>> {
    if !state.filters.requests() {
        return None;
    }
    let arrival = Arrival {
        request,
        route: routed.route,
        host: routed.host.as_ref(),
        client,
    };
    let decided = state.filters.on_request(&arrival, log);
    answered(state, decided, log, (grpc, pages))
}

/// What a filter's request or admission phase decided, as duet's own answer if a filter answers or
/// refuses the request, a refusal in the route's error page.
fn answered(
    state: &RouteState,
    decided: Decision,
    log: &mut Option<Box<AccessLog>>,
    (grpc, pages): (bool, Option<bool>),
) -> Option<Response<ProxyBody>> {
    let refused = |response| respond::with_error_page(response, &state.filters, pages);
    match decided {
        Decision::Continue => None,
        Decision::Answer(response) => Some(response),
        Decision::Refuse(error) => Some(refused(respond::error_response(&error, log.take(), grpc))),
        Decision::RefuseWith(error, fields) => {
            let mut response = respond::error_response(&error, log.take(), grpc);
            response.headers_mut().extend(fields);
            Some(refused(response))
        }
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
