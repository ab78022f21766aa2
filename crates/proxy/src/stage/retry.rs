//! Stage 3, retry: attempts re-picked by P2C among backends not tried yet, under the cluster's budget.
//!
//! An attempt that never reached its backend (connect refused) is retried for any method, as long as the
//! request body is still ours to send. One that reached it (reset, timeout, not HTTP) is retried only for
//! the route's `retry_methods` and a body that can be sent again. Every attempt counts as its backend's
//! load; a retry also draws from a [`TpsBudget`](tower::retry::budget::TpsBudget) that every request
//! fills, so retries stay a fraction of traffic when a whole cluster fails. A route's `timeout` bounds all
//! the attempts together: past it the client gets 504. A route's filter may send the first attempt in
//! its own way (a hedge: [`RouteFilters::first_attempt`]); what it comes to is retried the same.

use crate::{
    backend::cluster::Cluster,
    error::{ErrorKind, ProxyError},
    exchange::Prepared,
    exchange::{Failed, Outcome},
    filter::phase::{FirstAttempt, Raced},
    filter::RouteFilters,
    forward, grpc,
    telemetry::access_log::AccessLog,
    telemetry::done::Observer,
    telemetry::metrics::RouteTimings,
};
use duet_config::Route;
use std::{
    net::SocketAddr,
    pin::pin,
    rc::Rc,
    sync::{atomic::Ordering::Relaxed, Arc},
};
use tokio::time::Instant;
use tower::retry::budget::Budget;

/// What a route keeps in one worker that its attempts use: its latency histograms for the cluster
/// picked, and its filters.
#[derive(Clone, Copy)]
pub(crate) struct RouteState<'a> {
    pub(crate) timings: &'a Arc<RouteTimings>,
    pub(crate) filters: &'a Rc<RouteFilters>,
}

/// Sends `prepared` to `cluster`, retrying failed attempts where that is safe; the first attempt as
/// the route's filters send it.
pub(crate) async fn send(
    cluster: &Rc<Cluster>,
    route: &Route,
    RouteState { timings, filters }: RouteState<'_>,
    prepared: &mut Prepared,
    started: Instant,
    log: Option<Box<AccessLog>>,
) -> Outcome {
    let mut log = log;
    if let Some(log) = log.as_mut() {
        log.received = prepared.source.received();
    }
    // A gRPC client's deadline bounds the route's timeout: past it, nobody waits for the answer.
    let limit = grpc::bound(route.timeout, grpc::timeout(&prepared.parts.headers));
    let deadline = limit.map(|limit| Instant::now() + limit);
    let resendable = prepared.source.replayable()
        && route
            .retry_methods
            .iter()
            .any(|m| m == prepared.parts.method.as_str());
    cluster.count_request();
    let attempts = route.retry_attempts.unwrap_or(cluster.attempts).max(1) as usize;
    let mut tried: Vec<SocketAddr> = Vec::new();
    let mut last_error = None;
    let mut first = true;
    let mut dropped = false;
    loop {
        if !tried.is_empty() {
            cluster.counters.retries.fetch_add(1, Relaxed);
        }
        let last = tried.len() + 1 >= attempts;
        // Past the route's deadline the attempt in flight is dropped (its load released) and the
        // request fails with 504: an error that blames no backend, so final below.
        let timed_out = || Err(ProxyError::new(ErrorKind::RouteTimeout));
        let result = 'attempt: {
            if std::mem::take(&mut first) {
                let attempt = FirstAttempt {
                    cluster,
                    prepared,
                    tried: &mut tried,
                };
                if let Some(race) = filters.first_attempt(attempt) {
                    break 'attempt match within(deadline, race).await {
                        Some(Raced {
                            result,
                            dropped: d,
                            answered,
                        }) => {
                            dropped = d;
                            if let (Some(answered), Some(log)) = (answered, log.as_mut()) {
                                log.raced = answered;
                            }
                            result
                        }
                        None => timed_out(),
                    };
                }
            }
            // The attempt is awaited here, pinned where it is built, rather than in a helper
            // future: each layer of future would copy the attempt's (two kilobytes) and its result.
            match forward::begin(cluster, prepared, &tried, last) {
                Err(error) => Err(error),
                Ok((picked, body, headers)) => {
                    let attempt = pin!(forward::send(
                        cluster,
                        prepared,
                        picked,
                        body,
                        Some(headers)
                    ));
                    match deadline {
                        None => attempt.await,
                        Some(deadline) => (tokio::time::timeout_at(deadline, attempt).await)
                            .unwrap_or_else(|_| timed_out()),
                    }
                }
            }
        };
        let error = match result {
            Ok((response, mut completion)) => {
                let answered = Some(completion.backend());
                let sent = attempts_sent(&tried, answered) + usize::from(dropped);
                cluster.counters.attempts.observe(sent);
                let log = noted(log, &tried, answered).map(|mut log| {
                    log.attempts = sent as u32;
                    log
                });
                let observer = filters
                    .observes()
                    .then(|| filters.clone() as Rc<dyn Observer>);
                completion.attach_request(started, timings.clone(), observer, log);
                return Ok((response, completion));
            }
            Err(error) => error,
        };
        // Nothing left to retry on: the client hears about the failure that made us retry.
        if error.kind() == ErrorKind::NoEligibleBackend {
            let error = last_error.unwrap_or(error);
            return Err(failed(cluster, error, log, &tried));
        }
        // No backend to blame (the client's body failed, or the request could not be built): final.
        let Some(backend) = error.backend() else {
            return Err(failed(cluster, error, log, &tried));
        };
        tried.push(backend);
        if last || !may_retry(cluster, &error, resendable, prepared) {
            return Err(failed(cluster, error, log, &tried));
        }
        tracing::debug!(cluster = %cluster.name, %backend, attempt = tried.len() + 1, "retrying: {error}");
        last_error = Some(error);
    }
}

/// `future`, bounded by the route's deadline if it has one: `None` once the deadline has passed.
async fn within<F: std::future::Future>(deadline: Option<Instant>, future: F) -> Option<F::Output> {
    match deadline {
        None => Some(future.await),
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
    }
}

/// Whether a failed attempt (not the last) may be tried again on another backend: when the request
/// never reached the backend, or it is safe to send twice, and its body can be sent again, and the
/// cluster's retry budget allows.
fn may_retry(cluster: &Cluster, error: &ProxyError, resendable: bool, prepared: &Prepared) -> bool {
    let safe = match error.kind() {
        // Nothing of the request was sent.
        ErrorKind::Connect | ErrorKind::TlsHandshake => true,
        ErrorKind::BadGateway | ErrorKind::Timeout => resendable,
        _ => false,
    };
    if !safe || !prepared.source.can_attempt() {
        return false;
    }
    if !cluster.budget.withdraw() {
        tracing::debug!(cluster = %cluster.name, "retry budget exhausted");
        return false;
    }
    true
}

/// The access-log record told which backends were tried: `last` (if any) answered or failed last, the
/// others failed before it.
fn noted(
    mut log: Option<Box<AccessLog>>,
    tried: &[SocketAddr],
    last: Option<SocketAddr>,
) -> Option<Box<AccessLog>> {
    if let Some(log) = log.as_mut() {
        log.tried = tried.iter().copied().filter(|b| Some(*b) != last).collect();
        log.attempts = (log.tried.len() + usize::from(last.is_some())) as u32;
    }
    log
}

/// How many attempts went to backends: those `tried` (failed), and `last` if it is not among them.
fn attempts_sent(tried: &[SocketAddr], last: Option<SocketAddr>) -> usize {
    tried.len() + usize::from(last.is_some_and(|b| !tried.contains(&b)))
}

/// Giving up with `error`: the client hears about it, the log names every backend tried.
fn failed(
    cluster: &Cluster,
    error: ProxyError,
    log: Option<Box<AccessLog>>,
    tried: &[SocketAddr],
) -> Failed {
    let last = error.backend().or(tried.last().copied());
    let sent = attempts_sent(tried, last);
    if sent > 0 {
        cluster.counters.attempts.observe(sent);
    }
    let log = noted(log, tried, last);
    Failed { error, log }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::request_body::BodySource;

    fn prepared(method: http::Method) -> Prepared {
        let (parts, ()) = http::Request::builder()
            .method(method)
            .uri("/")
            .body(())
            .expect("request")
            .into_parts();
        Prepared::new(parts, BodySource::Empty, None)
    }

    #[test]
    fn attempts_count_each_backend_once() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().expect("a"),
            "127.0.0.1:2".parse().expect("b"),
        );
        assert_eq!(attempts_sent(&[], None), 0);
        assert_eq!(attempts_sent(&[], Some(a)), 1);
        assert_eq!(attempts_sent(&[a], Some(b)), 2);
        assert_eq!(
            attempts_sent(&[a, b], Some(b)),
            2,
            "the last one failed: already counted"
        );
    }

    #[test]
    fn only_what_is_safe_to_send_again_is_retried() {
        let cluster = crate::backend::cluster::for_tests(&["127.0.0.1:9", "127.0.0.1:10"], "");
        let post = prepared(http::Method::POST);
        let error = |kind| ProxyError::new(kind);
        // Never reached the backend: any method.
        assert!(may_retry(
            &cluster,
            &error(ErrorKind::Connect),
            false,
            &post
        ));
        // Reached it: only a request safe to send twice (the route's retry methods, body replayable).
        assert!(!may_retry(
            &cluster,
            &error(ErrorKind::BadGateway),
            false,
            &post
        ));
        assert!(may_retry(
            &cluster,
            &error(ErrorKind::BadGateway),
            true,
            &post
        ));
        assert!(may_retry(&cluster, &error(ErrorKind::Timeout), true, &post));
        // Not the backend's failure to answer: never.
        assert!(!may_retry(
            &cluster,
            &error(ErrorKind::NoEligibleBackend),
            true,
            &post
        ));
        assert!(!may_retry(
            &cluster,
            &error(ErrorKind::RouteTimeout),
            true,
            &post
        ));
    }
}
