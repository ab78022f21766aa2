//! The admin listener: `/metrics` (Prometheus text), `/status`, `/healthz`, `/ready`.

use bytes::Bytes;
use duet_proxy::{HealthView, Registry, StatusWindow};
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{cell::RefCell, convert::Infallible, rc::Rc, sync::Arc, time::Duration};
use tokio::{
    net::TcpListener,
    sync::{watch, Semaphore},
};

/// Admin connections served at once; more wait in the accept queue.
const ADMIN_CONNECTIONS: usize = 32;

/// How often the status page's window takes a reading.
const STATUS_READING_EVERY: Duration = Duration::from_secs(5);

/// Time an admin client has to send a request head (and the longest an idle one stays).
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the admin endpoints on `listener` until `shutdown` turns true. `/healthz` says the process
/// answers; `/ready` is 200 once every worker serves and 503 while starting or draining, so a load
/// balancer or Kubernetes stops sending new connections before duet closes its listeners.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Registry,
    health: watch::Receiver<Arc<HealthView>>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Scrapers and probes need a handful of connections; a cap keeps a flood from taking the control
    // thread's memory, and the header timeout closes the idle and the half-sent.
    let capacity = Arc::new(Semaphore::new(ADMIN_CONNECTIONS));
    // The status page's last minute: a reading of the counts every few seconds.
    let window = Rc::new(RefCell::new(StatusWindow::new()));
    {
        let (window, registry, mut shutdown) = (window.clone(), registry.clone(), shutdown.clone());
        tokio::task::spawn_local(async move {
            let mut every = tokio::time::interval(STATUS_READING_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => window.borrow_mut().record(&registry),
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
            }
        });
    }
    loop {
        let Ok(permit) = capacity.clone().acquire_owned().await else {
            return;
        };
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
        let registry = registry.clone();
        let health = health.clone();
        let window = window.clone();
        tokio::task::spawn_local(async move {
            let _permit = permit;
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                let health = health.clone();
                let window = window.clone();
                async move {
                    let (status, content_type, body) = match request.uri().path() {
                        "/metrics" => (
                            StatusCode::OK,
                            "text/plain; version=0.0.4",
                            if request.uri().query() == Some("aggregate=worker") {
                                registry.render_prometheus_aggregated()
                            } else {
                                registry.render_prometheus()
                            },
                        ),
                        "/status" | "/" => match status_format(&request) {
                            StatusFormat::Html => (
                                StatusCode::OK,
                                "text/html; charset=utf-8",
                                registry
                                    .status(&health.borrow(), Some(&window.borrow()))
                                    .to_html(),
                            ),
                            StatusFormat::Json => (
                                StatusCode::OK,
                                "application/json",
                                registry
                                    .status(&health.borrow(), Some(&window.borrow()))
                                    .to_json(),
                            ),
                            StatusFormat::Text => (
                                StatusCode::OK,
                                "text/plain; charset=utf-8",
                                registry.render_status(),
                            ),
                        },
                        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
                        "/ready" => match registry.readiness() {
                            Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
                            Err(why) => (
                                StatusCode::SERVICE_UNAVAILABLE,
                                "text/plain",
                                format!("not ready: {why}\n"),
                            ),
                        },
                        _ => (
                            StatusCode::NOT_FOUND,
                            "text/plain",
                            "try /metrics, /status, /healthz or /ready\n".to_owned(),
                        ),
                    };
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    response
                        .headers_mut()
                        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
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
