//! The admin listener: `/metrics` (Prometheus text, or OpenMetrics when asked for), `/status`,
//! `/healthz`, `/ready`.
//!
//! It shares the control thread with health checks and DNS discovery, so nothing here may make them
//! wait: each connection is a task of its own, bounded in time (a header timeout, a lifetime) and in
//! number. At the cap a new connection closes the oldest one instead of waiting for a slot: a flood of
//! silent connections costs tasks, never a liveness probe its answer.

use bytes::Bytes;
use duet_proxy::{HealthView, Registry, StatusWindow};
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{
    cell::RefCell, collections::BTreeMap, convert::Infallible, future::ready, rc::Rc, sync::Arc,
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::watch,
    task::AbortHandle,
};

/// How often the status page's window takes a reading.
const STATUS_READING_EVERY: Duration = Duration::from_secs(5);

/// How long and how many admin connections are served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections open at once; past it, the oldest is closed. Scrapers and probes need a handful;
    /// the cap bounds what a flood can take of the control thread's memory and descriptors.
    pub(crate) connections: usize,
    /// Time a client has to send a request head, and the longest an idle connection stays. Probes
    /// send theirs at once; a few seconds closes the silent and the half-sent.
    pub(crate) header_timeout: Duration,
    /// The longest a connection is served, whatever it does (a client that never reads a response
    /// holds it no longer); then it closes after the request in flight, if any.
    pub(crate) lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            header_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(30),
        }
    }
}

/// What a route reads.
struct State {
    registry: Registry,
    health: watch::Receiver<Arc<HealthView>>,
    /// The status page's last minute (a reading of the counts every few seconds) and its figures
    /// over time (a bucket closed every `admin.status_bucket`).
    window: RefCell<StatusWindow>,
}

/// A route's answer: status, content type, body.
type Answer = (StatusCode, &'static str, String);

/// What answers a path.
type Handler = fn(&State, &Request<Incoming>) -> Answer;

/// The admin endpoints, by path.
const ROUTES: &[(&str, Handler)] = &[
    ("/metrics", metrics),
    ("/status", status),
    ("/", status),
    ("/healthz", healthz),
    ("/ready", ready_probe),
];

fn route(state: &State, request: &Request<Incoming>) -> Answer {
    match ROUTES
        .iter()
        .find(|(path, _)| *path == request.uri().path())
    {
        Some((_, handler)) => handler(state, request),
        None => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /status, /healthz or /ready\n".to_owned(),
        ),
    }
}

fn metrics(state: &State, request: &Request<Incoming>) -> Answer {
    let aggregate = request.uri().query() == Some("aggregate=worker");
    let accept = (request.headers().get(header::ACCEPT)).and_then(|v| v.to_str().ok());
    if accept.is_some_and(prefers_openmetrics) {
        let body = state.registry.render_openmetrics(aggregate);
        return (StatusCode::OK, OPENMETRICS, body);
    }
    let body = if aggregate {
        state.registry.render_prometheus_aggregated()
    } else {
        state.registry.render_prometheus()
    };
    (StatusCode::OK, "text/plain; version=0.0.4", body)
}

/// The content type of the OpenMetrics exposition.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether an `Accept` asks for OpenMetrics (1.0.0, 0.0.1, or no version named) at least as much as
/// for Prometheus's text (`text/plain`), as Prometheus's scrapes ask by default (its
/// `scrape_protocols`). Anything else, `*/*` included, gets Prometheus's text, as before OpenMetrics was served.
fn prefers_openmetrics(accept: &str) -> bool {
    let (mut openmetrics, mut plain) = (0.0_f32, 0.0_f32);
    for range in accept.split(',') {
        let mut params = range.split(';').map(str::trim);
        let media = params.next().unwrap_or("").to_ascii_lowercase();
        let (mut quality, mut version_ok) = (1.0_f32, true);
        for param in params {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => quality = value.trim().parse().unwrap_or(0.0),
                "version" => version_ok = matches!(value.trim(), "1.0.0" | "0.0.1"),
                _ => {}
            }
        }
        match media.as_str() {
            "application/openmetrics-text" if version_ok => openmetrics = openmetrics.max(quality),
            "text/plain" => plain = plain.max(quality),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= plain
}

fn status(state: &State, request: &Request<Incoming>) -> Answer {
    let page = || {
        state
            .registry
            .status(&state.health.borrow(), Some(&state.window.borrow()))
    };
    match status_format(request) {
        StatusFormat::Html => (StatusCode::OK, "text/html; charset=utf-8", page().to_html()),
        StatusFormat::Json => (StatusCode::OK, "application/json", page().to_json()),
        StatusFormat::Text => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            state.registry.render_status(),
        ),
    }
}

/// The process answers: that is all liveness asks.
fn healthz(_: &State, _: &Request<Incoming>) -> Answer {
    (StatusCode::OK, "text/plain", "ok\n".to_owned())
}

fn ready_probe(state: &State, _: &Request<Incoming>) -> Answer {
    match state.registry.readiness() {
        Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready: {why}\n"),
        ),
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` turns true. `/healthz` says the process
/// answers; `/ready` is 200 once every worker serves and 503 while starting or draining, so a load
/// balancer or Kubernetes stops sending new connections before duet closes its listeners.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Registry,
    health: watch::Receiver<Arc<HealthView>>,
    status_bucket: Duration,
    shutdown: watch::Receiver<bool>,
) {
    let state = Rc::new(State {
        registry,
        health,
        window: RefCell::new(StatusWindow::with_bucket(status_bucket)),
    });
    serve_with(listener, state, Limits::default(), shutdown).await;
}

async fn serve_with(
    listener: TcpListener,
    state: Rc<State>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::task::spawn_local(take_readings(state.clone(), shutdown.clone()));
    let open = Rc::new(RefCell::new(Open::default()));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: back off instead of spinning the control thread.
            Err(error) => {
                tracing::warn!("admin accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let oldest = open.borrow_mut().make_room(limits.connections);
        if let Some(oldest) = oldest {
            tracing::debug!(
                connections = limits.connections,
                "admin: too many connections, closing the oldest"
            );
            oldest.abort();
        }
        let id = open.borrow_mut().next_id();
        let guard = Forget {
            open: open.clone(),
            id,
        };
        let state = state.clone();
        let task = tokio::task::spawn_local(async move {
            let _forget = guard;
            connection(stream, state, limits).await;
        });
        open.borrow_mut().tasks.insert(id, task.abort_handle());
    }
}

/// Feeds the status page's window and closes its buckets over time until `shutdown`: the workers'
/// counters read on the control thread, nothing asked of the workers.
async fn take_readings(state: Rc<State>, mut shutdown: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(STATUS_READING_EVERY);
    let bucket = state.window.borrow().bucket();
    let mut each_bucket = tokio::time::interval(bucket);
    // A bucket late (a busy control thread) is one longer bucket, not a burst of short ones.
    each_bucket.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => state.window.borrow_mut().record(&state.registry),
            _ = each_bucket.tick() => state.window.borrow_mut().close_bucket(&state.registry),
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Serves one connection within `limits`.
async fn connection<S>(stream: S, state: Rc<State>, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let service = service_fn(move |request: Request<Incoming>| {
        let (status, content_type, body) = route(&state, &request);
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        ready(Ok::<_, Infallible>(response))
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    if tokio::time::timeout(limits.lifetime, connection.as_mut())
        .await
        .is_err()
    {
        connection.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(limits.header_timeout, connection).await;
    }
}

/// The open admin connections by age (ids count up), so the oldest can be closed.
#[derive(Default)]
struct Open {
    next: u64,
    tasks: BTreeMap<u64, AbortHandle>,
}

impl Open {
    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The oldest connection's task, to abort, if `cap` are open.
    fn make_room(&mut self, cap: usize) -> Option<AbortHandle> {
        if self.tasks.len() < cap {
            return None;
        }
        self.tasks.pop_first().map(|(_, task)| task)
    }
}

/// Removes its connection from [`Open`] when the connection's task ends or is aborted (which drops it).
struct Forget {
    open: Rc<RefCell<Open>>,
    id: u64,
}

impl Drop for Forget {
    fn drop(&mut self) {
        // An abort drops the task's future on a later turn of the scheduler, never inside
        // `make_room`'s borrow; `try_borrow_mut` guards it all the same.
        if let Ok(mut open) = self.open.try_borrow_mut() {
            open.tasks.remove(&self.id);
        }
    }
}

enum StatusFormat {
    Html,
    Json,
    Text,
}

/// `?format=json|text|html`, else JSON when the client accepts it and not HTML (curl, scripts), else
/// the page.
fn status_format<B>(request: &hyper::Request<B>) -> StatusFormat {
    let query = request.uri().query().unwrap_or("");
    for pair in query.split('&') {
        match pair {
            "format=json" => return StatusFormat::Json,
            "format=text" => return StatusFormat::Text,
            "format=html" => return StatusFormat::Html,
            _ => {}
        }
    }
    let accept = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("application/json") && !accept.contains("text/html") {
        StatusFormat::Json
    } else {
        StatusFormat::Html
    }
}

#[cfg(test)]
mod tests;
