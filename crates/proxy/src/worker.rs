//! One worker's proxy: its routes, and per cluster its own client, balancer, outlier view and retry
//! budget.

use crate::{
    body::{AccessLog, ProxyBody},
    error::{ErrorKind, ProxyError},
    headers,
    health::HealthView,
    metrics::{BackendCell, ClusterCells, ClusterCounters, Registry, WorkerCounters},
    outlier::Outliers,
    request_body::{BodySource, ClientFailure, Reclaimable, UpstreamBody},
    upstream::{upstream_client, BackendService, PickedBackend},
};
use duet_balance::{
    Balance, CompleteOnBodyEnd, LoadMetric, NoEligibleEndpoint, PeakEwma, Policy as BalancePolicy,
    StatusSet,
};
use duet_config::{Cluster, Config, Policy, Route};
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::{
    cell::RefCell,
    collections::HashMap,
    net::SocketAddr,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower::{
    retry::budget::{Budget, TpsBudget},
    Service,
};

/// The balancer type of one cluster in one worker.
pub type ClusterBalance = Balance<SocketAddr, BackendService, CompleteOnBodyEnd>;

/// The longest `Retry-After` that duet honours by ejecting the backend locally.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(30);

/// A worker's proxy state. It lives on the worker's thread (`Rc`, `RefCell`): nothing in it is shared
/// with another worker, and no borrow is held across an `.await`.
///
/// Its routing table can be replaced by [`reload`](Self::reload) between requests: each request works on
/// the table it started with; balancer state carries over for backends (keyed by address) that remain.
pub struct WorkerProxy {
    table: RefCell<Rc<Table>>,
    health: RefCell<Arc<HealthView>>,
    counters: Arc<WorkerCounters>,
    registry: Option<(usize, Registry)>,
}

struct Table {
    routes: Vec<Route>,
    clusters: Vec<Rc<ClusterState>>,
    max_uri_length: usize,
}

struct ClusterState {
    name: Arc<str>,
    policy: Policy,
    balance: RefCell<ClusterBalance>,
    backends: Vec<SocketAddr>,
    health_checked: bool,
    healthy: RefCell<HashMap<SocketAddr, bool>>,
    outliers: RefCell<Outliers>,
    budget: TpsBudget,
    attempts: u32,
    replay_body_limit: usize,
    body_read_timeout: Duration,
    penalised: StatusSet,
    counters: Arc<ClusterCounters>,
    eligible_flags: HashMap<SocketAddr, Arc<AtomicBool>>,
}

impl WorkerProxy {
    /// Builds a worker's clients and balancers from a checked config. Must run inside the worker's
    /// tokio runtime (the clients use its timer).
    pub fn new(config: &Config) -> Self {
        Self::build(config, None)
    }

    /// Like [`new`](Self::new), publishing this worker's metric cells in `registry` as worker `index`.
    pub fn with_registry(config: &Config, index: usize, registry: Registry) -> Self {
        Self::build(config, Some((index, registry)))
    }

    fn build(config: &Config, registry: Option<(usize, Registry)>) -> Self {
        let counters = registry
            .as_ref()
            .map_or_else(Default::default, |(index, registry)| {
                registry.worker(*index)
            });
        let proxy = Self {
            table: RefCell::new(Rc::new(Table::new(config, &[]))),
            health: RefCell::new(Arc::new(HealthView::default())),
            counters,
            registry,
        };
        proxy.apply_health(Arc::new(HealthView::default()));
        proxy.publish_cells();
        proxy
    }

    /// This worker's counters that belong to no cluster.
    pub(crate) fn counters(&self) -> &WorkerCounters {
        &self.counters
    }

    fn publish_cells(&self) {
        let Some((index, registry)) = &self.registry else {
            return;
        };
        let table = self.table.borrow().clone();
        let cells = table.clusters.iter().map(|c| c.cells()).collect();
        registry.publish(*index, cells);
    }

    /// Switches to a new config. Clusters are matched by name: a cluster that keeps its policy keeps its
    /// balancer, and with it the load and latency state of every backend address that remains; new
    /// backends start as a new endpoint would (PeakEWMA at the pool median). Requests in flight finish
    /// on the table they started with.
    pub fn reload(&self, config: &Config) {
        let old = self.table.borrow().clone();
        let table = Table::new(config, &old.clusters);
        *self.table.borrow_mut() = Rc::new(table);
        let view = self.health.borrow().clone();
        self.apply_health(view);
        self.publish_cells();
    }

    /// Runs `f` on a cluster's balancer (for telemetry and tests).
    pub fn with_balance<T>(
        &self,
        cluster: &str,
        f: impl FnOnce(&ClusterBalance) -> T,
    ) -> Option<T> {
        let table = self.table.borrow().clone();
        table
            .clusters
            .iter()
            .find(|c| &*c.name == cluster)
            .map(|c| f(&c.balance.borrow()))
    }

    /// Applies the control plane's health view: a backend is eligible when it is healthy and this
    /// worker has not ejected it. Runs between requests, off the request path.
    pub fn apply_health(&self, view: Arc<HealthView>) {
        let now = Instant::now();
        let table = self.table.borrow().clone();
        for cluster in &table.clusters {
            {
                let mut healthy = cluster.healthy.borrow_mut();
                for &backend in &cluster.backends {
                    let state = view
                        .healthy(&cluster.name, backend)
                        .unwrap_or(!cluster.health_checked);
                    healthy.insert(backend, state);
                }
            }
            for &backend in &cluster.backends {
                cluster.refresh_eligibility(backend, now);
            }
        }
        *self.health.borrow_mut() = view;
    }

    /// Proxies one request from `client` (over TLS when `secure`). Never fails: errors become short text
    /// responses.
    pub async fn handle(
        self: Rc<Self>,
        mut request: Request<Incoming>,
        client: SocketAddr,
        secure: bool,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let mut log = AccessLog::enabled().then(|| AccessLog {
            method: request.method().clone(),
            path: loggable_path(request.uri().path()),
            status: StatusCode::OK,
            cluster: None,
            backend: None,
            started,
            bytes: 0,
            complete: None,
        });

        let table = self.table.borrow().clone();
        if uri_length(request.uri()) > table.max_uri_length {
            self.counters.uri_too_long.fetch_add(1, Relaxed);
            return local_error(ProxyError::new(ErrorKind::UriTooLong), log);
        }
        // An absolute-form target names its host in the URI; otherwise the Host header does. Either way
        // only the configured routes decide where the request goes: never an open proxy.
        let host: Option<HeaderValue> = match request.uri().authority() {
            Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
            None => request.headers().get(header::HOST).cloned(),
        };
        let host_name = host.as_ref().and_then(|h| h.to_str().ok());
        let path = request.uri().path();
        let Some((route_index, route)) = table
            .routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(host_name, path))
        else {
            self.counters.no_route.fetch_add(1, Relaxed);
            return local_error(ProxyError::new(ErrorKind::NoRoute), log);
        };
        let Some(cluster) = table.clusters.get(route.cluster).cloned() else {
            return local_error(ProxyError::new(ErrorKind::NoRoute), log);
        };
        if let Some(log) = log.as_mut() {
            log.cluster = Some(cluster.name.clone());
        }

        let upgrading = headers::wants_upgrade(request.headers());
        let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));
        let request_headers = request.headers_mut();
        headers::remove_hop_by_hop(request_headers, upgrading);
        headers::add_forwarding(request_headers, client.ip(), host, secure);
        // The client's `Expect: 100-continue` was answered by our server when we began reading its body.
        request_headers.remove(header::EXPECT);

        let (mut parts, body) = request.into_parts();
        let source = match cluster.body_source(body).await {
            Ok(source) => source,
            Err(kind) => {
                let error = ProxyError::new(kind);
                tracing::debug!(%client, "{error}");
                cluster.counters.response(error.status().as_u16());
                return local_error(error, log);
            }
        };
        let retry_after_send = table.routes[route_index]
            .retry_methods
            .iter()
            .any(|m| m == parts.method.as_str())
            && source.replayable();
        if cluster.attempts > 1 {
            cluster.budget.deposit();
        }

        let mut tried: Vec<SocketAddr> = Vec::new();
        let mut last_error: Option<ProxyError> = None;
        let outcome = loop {
            if !tried.is_empty() {
                cluster.counters.retries.fetch_add(1, Relaxed);
            }
            let Some(body) = source.attempt() else {
                break Err(ProxyError::new(ErrorKind::BadGateway));
            };
            let mut attempt = Request::new(body);
            *attempt.method_mut() = parts.method.clone();
            *attempt.uri_mut() = parts.uri.clone();
            *attempt.version_mut() = parts.version;
            // Keep a copy only if another attempt may need it.
            *attempt.headers_mut() = if cluster.attempts > 1 {
                parts.headers.clone()
            } else {
                std::mem::take(&mut parts.headers)
            };

            let result = cluster.send(attempt, &tried).await;
            let now = Instant::now();
            let failed = match result {
                Ok(response) => {
                    let backend = response.extensions().get::<PickedBackend>().map(|b| b.0);
                    if let Some(backend) = backend {
                        cluster.record_response(backend, &response, now);
                    }
                    break Ok(response);
                }
                // Nothing left to retry on: the client hears about the failure that made us retry.
                Err(error)
                    if error.kind() == ErrorKind::NoEligibleBackend && last_error.is_some() =>
                {
                    break Err(last_error.take().unwrap_or(error));
                }
                Err(error) => error,
            };
            match source.client_failure() {
                Some(ClientFailure::Broken) => {
                    break Err(ProxyError::new(ErrorKind::BadRequestBody))
                }
                Some(ClientFailure::Stalled) => break Err(ProxyError::new(ErrorKind::BodyTimeout)),
                None => {}
            }
            let Some(backend) = failed.backend() else {
                break Err(failed);
            };
            cluster.record_failure(backend, now);
            tried.push(backend);
            let safe = match failed.kind() {
                // Never reached the backend: safe for any method, if the body is still ours to send.
                ErrorKind::Connect => true,
                ErrorKind::BadGateway | ErrorKind::Timeout => retry_after_send,
                _ => false,
            };
            if !safe || tried.len() >= cluster.attempts as usize || !source.can_attempt() {
                break Err(failed);
            }
            if !cluster.budget.withdraw() {
                tracing::debug!(cluster = %cluster.name, "retry budget exhausted");
                break Err(failed);
            }
            tracing::debug!(cluster = %cluster.name, %backend, attempt = tried.len() + 1, "retrying: {failed}");
            last_error = Some(failed);
        };

        let response = match outcome {
            Ok(mut response) => {
                let backend = response.extensions().get::<PickedBackend>().map(|b| b.0);
                let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
                if switching {
                    match client_upgrade {
                        Some(client_side) => {
                            let backend_side = hyper::upgrade::on(&mut response);
                            tokio::task::spawn_local(tunnel(client_side, backend_side, client));
                        }
                        None => {
                            cluster.counters.response(502);
                            return local_error(ProxyError::new(ErrorKind::BadGateway), log);
                        }
                    }
                }
                headers::remove_hop_by_hop(response.headers_mut(), switching);
                if let Some(log) = log.as_mut() {
                    log.status = response.status();
                    log.backend = backend;
                }
                let (parts, body) = response.into_parts();
                Response::from_parts(parts, ProxyBody::upstream(body, log))
            }
            Err(error) => {
                tracing::warn!(cluster = %cluster.name, %client, attempts = tried.len().max(1), "{error}");
                if let Some(log) = log.as_mut() {
                    log.backend = error.backend();
                }
                local_error(error, log)
            }
        };
        cluster.counters.response(response.status().as_u16());
        response
    }
}

impl Table {
    /// Builds the table for `config`, taking over the balancers of `previous` clusters of the same name
    /// and policy.
    fn new(config: &Config, previous: &[Rc<ClusterState>]) -> Self {
        let clusters = config
            .clusters
            .iter()
            .map(|cluster| {
                let kept = previous
                    .iter()
                    .find(|old| *old.name == *cluster.name && old.policy == cluster.policy)
                    .map(|old| old.take_balance());
                Rc::new(ClusterState::new(
                    cluster,
                    kept,
                    config.limits.body_read_timeout,
                ))
            })
            .collect();
        Self {
            routes: config.routes.clone(),
            clusters,
            max_uri_length: config.limits.max_uri_length,
        }
    }
}

fn metric_and_policy(policy: Policy) -> (LoadMetric, BalancePolicy) {
    match policy {
        Policy::P2cInflight => (LoadMetric::InFlight, BalancePolicy::P2c),
        Policy::P2cPeakEwma => (
            LoadMetric::PeakEwma(PeakEwma::default()),
            BalancePolicy::P2c,
        ),
        Policy::RoundRobin => (LoadMetric::InFlight, BalancePolicy::RoundRobin),
        Policy::Random => (LoadMetric::InFlight, BalancePolicy::Random),
    }
}

impl ClusterState {
    /// A cluster's per-worker state; `kept` is the balancer of the same cluster before a reload.
    fn new(cluster: &Cluster, kept: Option<ClusterBalance>, body_read_timeout: Duration) -> Self {
        let client = upstream_client(&cluster.timeouts);
        let (metric, policy) = metric_and_policy(cluster.policy);
        let penalised: StatusSet = cluster
            .penalty_statuses
            .iter()
            .filter_map(|&code| StatusCode::from_u16(code).ok())
            .collect();
        let mut balance = match kept {
            Some(balance) => balance,
            None => Balance::new(metric)
                .with_policy(policy)
                .with_completion(CompleteOnBodyEnd::penalising(penalised)),
        }
        .with_panic_threshold(cluster.panic_threshold)
        .with_slow_start(cluster.slow_start)
        .with_completion(CompleteOnBodyEnd::penalising(penalised));
        let addresses: Vec<SocketAddr> = cluster.backends.iter().map(|b| b.address).collect();
        balance.retain(|address| addresses.contains(address));
        for backend in &cluster.backends {
            let service = BackendService::new(
                client.clone(),
                backend.address,
                cluster.timeouts.response_headers,
            );
            // Same key: new service and weight, same load state.
            balance.insert(backend.address, backend.weight, service);
        }
        let retries = cluster.retries;
        Self {
            name: Arc::from(cluster.name.as_str()),
            policy: cluster.policy,
            balance: RefCell::new(balance),
            backends: addresses,
            health_checked: cluster.health_check.is_some(),
            healthy: RefCell::new(HashMap::new()),
            outliers: RefCell::new(Outliers::new(
                cluster.outlier_detection,
                cluster.backends.len(),
            )),
            budget: TpsBudget::new(
                Duration::from_secs(10),
                retries.min_retries_per_second,
                retries.budget_fraction as f32,
            ),
            attempts: retries.attempts.max(1),
            replay_body_limit: retries.replay_body_limit,
            body_read_timeout,
            penalised,
            counters: Arc::default(),
            eligible_flags: cluster
                .backends
                .iter()
                .map(|b| (b.address, Arc::new(AtomicBool::new(false))))
                .collect(),
        }
    }

    /// This cluster's metric cells, for the registry.
    fn cells(&self) -> ClusterCells {
        let balance = self.balance.borrow();
        let backends = balance
            .endpoints()
            .map(|e| BackendCell {
                address: *e.key,
                weight: e.weight,
                load: e.load.clone(),
                eligible: self.eligible_flags.get(e.key).cloned().unwrap_or_default(),
            })
            .collect();
        ClusterCells {
            name: self.name.to_string(),
            policy: self.policy.name(),
            counters: self.counters.clone(),
            backends,
        }
    }

    /// Moves the balancer out (for the table that replaces this one), leaving an empty one behind for
    /// the requests still finishing here.
    fn take_balance(&self) -> ClusterBalance {
        let (metric, policy) = metric_and_policy(self.policy);
        let empty = Balance::new(metric)
            .with_policy(policy)
            .with_completion(CompleteOnBodyEnd::penalising(self.penalised));
        std::mem::replace(&mut *self.balance.borrow_mut(), empty)
    }

    fn record_response(
        self: &Rc<Self>,
        backend: SocketAddr,
        response: &Response<duet_balance::TrackedBody<Incoming>>,
        now: Instant,
    ) {
        let status = response.status();
        if status.is_server_error() {
            self.record_failure(backend, now);
        } else {
            self.outliers.borrow_mut().record_success(backend, now);
        }
        // A backend shedding load with Retry-After is left alone for that long (capped).
        if self.penalised.contains(status) {
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|secs| Duration::from_secs(secs).min(RETRY_AFTER_CAP));
            if let Some(time) = retry_after {
                let ejected = self.outliers.borrow_mut().eject(backend, time, now);
                if let Some(time) = ejected {
                    self.eject(backend, time);
                }
            }
        }
    }

    fn record_failure(self: &Rc<Self>, backend: SocketAddr, now: Instant) {
        let ejected = self.outliers.borrow_mut().record_failure(backend, now);
        if let Some(time) = ejected {
            self.eject(backend, time);
        }
    }

    /// Takes `backend` out of this worker's rotation for `time`, then re-admits it (if still healthy).
    fn eject(self: &Rc<Self>, backend: SocketAddr, time: Duration) {
        self.counters.ejections.fetch_add(1, Relaxed);
        tracing::warn!(cluster = %self.name, %backend, seconds = time.as_secs_f64(), "ejecting backend");
        self.refresh_eligibility(backend, Instant::now());
        let cluster = self.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(time).await;
            cluster.refresh_eligibility(backend, Instant::now());
            tracing::info!(cluster = %cluster.name, %backend, "ejection over");
        });
    }

    fn refresh_eligibility(&self, backend: SocketAddr, now: Instant) {
        let healthy = self
            .healthy
            .borrow()
            .get(&backend)
            .copied()
            .unwrap_or(!self.health_checked);
        let ejected = self.outliers.borrow().is_ejected(backend, now);
        let eligible = healthy && !ejected;
        let mut balance = self.balance.borrow_mut();
        let was = balance.endpoints().any(|e| *e.key == backend && e.eligible);
        balance.set_eligible(&backend, eligible);
        if let Some(flag) = self.eligible_flags.get(&backend) {
            flag.store(eligible, Relaxed);
        }
        if was != eligible {
            tracing::debug!(cluster = %self.name, %backend, eligible, healthy, ejected, panicking = balance.is_panicking(), "eligibility changed");
        }
    }

    /// Keeps a small body so that it can be replayed; streams anything larger or unsized. A client that
    /// pauses longer than `body_read_timeout` gets 408.
    async fn body_source(&self, body: Incoming) -> Result<BodySource, ErrorKind> {
        if body.is_end_stream() {
            return Ok(BodySource::Empty);
        }
        let small = body
            .size_hint()
            .exact()
            .is_some_and(|n| n <= self.replay_body_limit as u64);
        if small && self.attempts > 1 {
            return match tokio::time::timeout(self.body_read_timeout, body.collect()).await {
                Ok(Ok(collected)) => Ok(BodySource::Buffered(collected.to_bytes())),
                Ok(Err(_)) => Err(ErrorKind::BadRequestBody),
                Err(_) => Err(ErrorKind::BodyTimeout),
            };
        }
        Ok(BodySource::Streaming(Reclaimable::new(
            body,
            self.body_read_timeout,
        )))
    }

    /// One attempt: P2C (excluding backends already tried), counted as load until its body ends.
    async fn send(
        &self,
        request: Request<UpstreamBody>,
        tried: &[SocketAddr],
    ) -> Result<Response<duet_balance::TrackedBody<Incoming>>, ProxyError> {
        let waker = std::task::Waker::noop();
        let future = {
            let mut balance = self.balance.borrow_mut();
            let mut cx = Context::from_waker(waker);
            let ready = if tried.is_empty() {
                Service::<Request<UpstreamBody>>::poll_ready(&mut *balance, &mut cx)
            } else {
                balance.poll_ready_excluding::<Request<UpstreamBody>>(&mut cx, tried)
            };
            match ready {
                Poll::Ready(Ok(())) => balance.call(request),
                // Backends are always ready (see BackendService::poll_ready): this is unreachable in
                // practice, and a 503 is the honest answer if it ever happens.
                Poll::Ready(Err(_)) | Poll::Pending => {
                    return Err(ProxyError::new(ErrorKind::NoEligibleBackend))
                }
            }
        };
        future
            .await
            .map_err(|error| match error.downcast::<ProxyError>() {
                Ok(error) => *error,
                Err(other) if other.is::<NoEligibleEndpoint>() => {
                    ProxyError::new(ErrorKind::NoEligibleBackend)
                }
                Err(_) => ProxyError::new(ErrorKind::BadGateway),
            })
    }
}

/// The path for the access log, cut at 512 bytes so an oversized target cannot flood the log.
fn loggable_path(path: &str) -> String {
    const MAX: usize = 512;
    if path.len() <= MAX {
        return path.to_owned();
    }
    let mut end = MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &path[..end])
}

/// The length of the request target as the client sent it, without building a string.
fn uri_length(uri: &Uri) -> usize {
    let authority = uri.authority().map_or(0, |a| a.as_str().len());
    let scheme = uri.scheme_str().map_or(0, |s| s.len() + 3);
    let rest = uri.path_and_query().map_or(0, |p| p.as_str().len());
    scheme + authority + rest
}

fn local_error(error: ProxyError, mut log: Option<AccessLog>) -> Response<ProxyBody> {
    if let Some(log) = log.as_mut() {
        log.status = error.status();
    }
    let (parts, body) = error.to_response().into_parts();
    Response::from_parts(parts, ProxyBody::local(body, log))
}

/// Relays an upgraded connection (e.g. a WebSocket) both ways until either side closes.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    backend: hyper::upgrade::OnUpgrade,
    peer: SocketAddr,
) {
    let (client, backend) = match tokio::try_join!(client, backend) {
        Ok(pair) => pair,
        Err(error) => {
            tracing::debug!(%peer, "upgrade failed: {error}");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut backend = TokioIo::new(backend);
    if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
        tracing::debug!(%peer, "tunnel closed: {error}");
    }
}
