//! The access-log record of one request, written once when its response is finished.

use http::{Method, Request, StatusCode};
use std::{net::SocketAddr, sync::Arc};
use tokio::time::Instant;

/// One access-log line, written when it is dropped: at the end of the response body (only then are the
/// byte count and the duration known), or when the response is dropped unfinished.
pub(crate) struct AccessLog {
    method: Method,
    path: String,
    started: Instant,
    pub(crate) status: StatusCode,
    pub(crate) cluster: Option<Arc<str>>,
    pub(crate) backend: Option<SocketAddr>,
    pub(crate) bytes: u64,
    /// How the response ended: `complete`, `backend_error`, `upgraded`, or `client_gone` until told.
    pub(crate) outcome: &'static str,
}

impl AccessLog {
    /// A record for `request`, if the access log is enabled (target `duet::access` at info).
    pub(crate) fn start<B>(request: &Request<B>, started: Instant) -> Option<Self> {
        tracing::enabled!(target: "duet::access", tracing::Level::INFO).then(|| Self {
            method: request.method().clone(),
            path: loggable_path(request.uri().path()),
            started,
            status: StatusCode::OK,
            cluster: None,
            backend: None,
            bytes: 0,
            outcome: "client_gone",
        })
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        tracing::info!(
            target: "duet::access",
            method = %self.method,
            path = %self.path,
            status = self.status.as_u16(),
            cluster = %self.cluster.as_deref().unwrap_or("-"),
            backend = %self.backend.map_or_else(|| "-".to_owned(), |b| b.to_string()),
            duration_ms = format_args!("{duration_ms:.3}"),
            bytes = self.bytes,
            outcome = %self.outcome,
        );
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
