//! The admin listener: `/metrics` (Prometheus text), `/status`, `/healthz`, `/ready`.

use bytes::Bytes;
use duet_proxy::Registry;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use tokio::{net::TcpListener, sync::watch};

/// Serves the admin endpoints on `listener` until `shutdown` turns true. `/healthz` says the process
/// answers; `/ready` is 200 once every worker serves and 503 while starting or draining, so a load
/// balancer or Kubernetes stops sending new connections before duet closes its listeners.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Registry,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let registry = registry.clone();
        tokio::task::spawn_local(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move {
                    let (status, content_type, body) = match request.uri().path() {
                        "/metrics" => (
                            StatusCode::OK,
                            "text/plain; version=0.0.4",
                            registry.render_prometheus(),
                        ),
                        "/status" | "/" => (
                            StatusCode::OK,
                            "text/plain; charset=utf-8",
                            registry.render_status(),
                        ),
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
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
