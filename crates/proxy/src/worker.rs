//! One worker's proxy: its routes, and per cluster its own client and balancer.

use crate::{
    body::{AccessLog, ProxyBody},
    error::{ErrorKind, ProxyError},
    headers,
    upstream::{upstream_client, BackendService, PickedBackend},
};
use duet_balance::{
    Balance, CompleteOnBodyEnd, LoadMetric, NoEligibleEndpoint, Policy as BalancePolicy,
};
use duet_config::{Config, Policy, Route};
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::{
    cell::RefCell,
    net::SocketAddr,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::time::Instant;
use tower::Service;

/// The balancer type of one cluster in one worker.
pub type ClusterBalance = Balance<SocketAddr, BackendService, CompleteOnBodyEnd>;

/// A worker's proxy state. It lives on the worker's thread (`Rc`, `RefCell`): nothing in it is shared
/// with another worker, and no borrow is held across an `.await`.
pub struct WorkerProxy {
    routes: Vec<Route>,
    clusters: Vec<ClusterState>,
    max_uri_length: usize,
}

struct ClusterState {
    name: Arc<str>,
    balance: RefCell<ClusterBalance>,
}

impl WorkerProxy {
    /// Builds a worker's clients and balancers from a checked config. Must run inside the worker's
    /// tokio runtime (the clients use its timer).
    pub fn new(config: &Config) -> Self {
        let clusters = config
            .clusters
            .iter()
            .map(|cluster| {
                let client = upstream_client(&cluster.timeouts);
                let (metric, policy) = match cluster.policy {
                    Policy::P2cInflight => (LoadMetric::InFlight, BalancePolicy::P2c),
                    Policy::P2cPeakEwma => (LoadMetric::default(), BalancePolicy::P2c),
                    Policy::RoundRobin => (LoadMetric::InFlight, BalancePolicy::RoundRobin),
                    Policy::Random => (LoadMetric::InFlight, BalancePolicy::Random),
                };
                let mut balance = Balance::new(metric)
                    .with_policy(policy)
                    .with_completion(CompleteOnBodyEnd::default());
                for backend in &cluster.backends {
                    let service = BackendService::new(
                        client.clone(),
                        backend.address,
                        cluster.timeouts.response_headers,
                    );
                    balance.insert(backend.address, backend.weight, service);
                }
                ClusterState {
                    name: Arc::from(cluster.name.as_str()),
                    balance: RefCell::new(balance),
                }
            })
            .collect();
        Self {
            routes: config.routes.clone(),
            clusters,
            max_uri_length: config.limits.max_uri_length,
        }
    }

    /// Runs `f` on a cluster's balancer (for telemetry and tests).
    pub fn with_balance<T>(
        &self,
        cluster: &str,
        f: impl FnOnce(&ClusterBalance) -> T,
    ) -> Option<T> {
        self.clusters
            .iter()
            .find(|c| &*c.name == cluster)
            .map(|c| f(&c.balance.borrow()))
    }

    /// Proxies one request from `client`. Never fails: errors become short text responses.
    pub async fn handle(
        &self,
        mut request: Request<Incoming>,
        client: SocketAddr,
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

        if uri_length(request.uri()) > self.max_uri_length {
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
        let Some(route) = self.routes.iter().find(|r| r.matches(host_name, path)) else {
            return local_error(ProxyError::new(ErrorKind::NoRoute), log);
        };
        let Some(cluster) = self.clusters.get(route.cluster) else {
            return local_error(ProxyError::new(ErrorKind::NoRoute), log);
        };
        if let Some(log) = log.as_mut() {
            log.cluster = Some(cluster.name.clone());
        }

        let upgrading = headers::wants_upgrade(request.headers());
        let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));
        let request_headers = request.headers_mut();
        headers::remove_hop_by_hop(request_headers, upgrading);
        headers::add_forwarding(request_headers, client.ip(), host);
        // The client's `Expect: 100-continue` was answered by our server when we began reading its body.
        request_headers.remove(header::EXPECT);

        let waker = std::task::Waker::noop();
        let future = {
            let mut balance = cluster.balance.borrow_mut();
            match balance.poll_ready(&mut Context::from_waker(waker)) {
                Poll::Ready(Ok(())) => balance.call(request),
                // Backends are always ready (see BackendService::poll_ready): this is unreachable in
                // practice, and a 503 is the honest answer if it ever happens.
                Poll::Ready(Err(_)) | Poll::Pending => {
                    return local_error(ProxyError::new(ErrorKind::NoEligibleBackend), log);
                }
            }
        };

        match future.await {
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
                            // A 101 nobody asked for cannot be relayed.
                            let error = ProxyError::new(ErrorKind::BadGateway);
                            return local_error(error, log);
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
                let error = match error.downcast::<ProxyError>() {
                    Ok(error) => *error,
                    Err(other) if other.is::<NoEligibleEndpoint>() => {
                        ProxyError::new(ErrorKind::NoEligibleBackend)
                    }
                    Err(_) => ProxyError::new(ErrorKind::BadGateway),
                };
                tracing::warn!(cluster = %cluster.name, %client, "{error}");
                if let Some(log) = log.as_mut() {
                    log.backend = error.backend();
                }
                local_error(error, log)
            }
        }
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
