//! The access-log record of one request, written once when its response is finished.

use crate::{request_body::Received, server::Client};
use http::{header, HeaderValue, Method, Request, StatusCode, Version};
use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};
use tokio::time::Instant;

/// One access-log line, written when it is dropped: at the end of the response body (only then are the
/// byte count and the duration known), or when the response is dropped unfinished.
///
/// The fields are those of nginx's `combined` format and Envoy's default line: who (client address,
/// after `trusted_proxies`; user agent), what (method, host, path, protocol, request id), where to
/// (cluster, the backend that answered and every backend tried before it), how it went (status,
/// attempts, duration, the backend's response-head time, bytes sent and received, outcome).
pub(crate) struct AccessLog {
    method: Method,
    path: String,
    version: Version,
    host: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    request_id: HeaderValue,
    client: IpAddr,
    started: Instant,
    pub(crate) status: StatusCode,
    pub(crate) cluster: Option<Arc<str>>,
    pub(crate) backend: Option<SocketAddr>,
    /// Backends whose attempts failed before the last one.
    pub(crate) tried: Vec<SocketAddr>,
    /// Attempts sent to backends (0: none was picked).
    pub(crate) attempts: u32,
    /// From the answering attempt's start to its response head.
    pub(crate) upstream_head_ms: Option<f64>,
    pub(crate) bytes: u64,
    /// Request body bytes read from the client.
    pub(crate) received: Received,
    /// How the response ended: `complete`, `upgraded`, `client_gone` until told, `backend_error`,
    /// `backend_read_timeout`, or for a response duet made itself the reason (`no_route`, `timeout`...).
    pub(crate) outcome: &'static str,
}

impl AccessLog {
    /// A record for `request` from `client`, if the access log is enabled (target `duet::access` at
    /// info).
    pub(crate) fn start<B>(
        request: &Request<B>,
        started: Instant,
        client: Client,
        request_id: HeaderValue,
    ) -> Option<Self> {
        if !tracing::enabled!(target: "duet::access", tracing::Level::INFO) {
            return None;
        }
        let headers = request.headers();
        Some(Self {
            method: request.method().clone(),
            path: loggable_path(request.uri().path()),
            version: request.version(),
            host: headers.get(header::HOST).cloned(),
            user_agent: headers.get(header::USER_AGENT).cloned(),
            request_id,
            client: original_client(request, client),
            started,
            status: StatusCode::OK,
            cluster: None,
            backend: None,
            tried: Vec::new(),
            attempts: 0,
            upstream_head_ms: None,
            bytes: 0,
            received: Received::Known(0),
            outcome: "client_gone",
        })
    }
}

/// The client as the first trusted proxy saw it: the last `X-Forwarded-For` entry when the peer is
/// trusted (nginx's `real_ip_header X-Forwarded-For` without recursion), the peer otherwise.
fn original_client<B>(request: &Request<B>, client: Client) -> IpAddr {
    if !client.trusted {
        return client.address.ip();
    }
    request
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(client.address.ip())
}

/// A value, or `-` when there is none: formatted straight into the line, no `String` per request.
struct OrDash<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for OrDash<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// Addresses joined by commas, or `-` for none.
struct Joined<'a>(&'a [SocketAddr]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("-");
        }
        for (i, address) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            address.fmt(f)?;
        }
        Ok(())
    }
}

fn text(value: Option<&HeaderValue>) -> &str {
    value.and_then(|v| v.to_str().ok()).unwrap_or("-")
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        // Milliseconds with microsecond precision, as numbers (in JSON too).
        let millis = |ms: f64| (ms * 1000.0).round() / 1000.0;
        let duration_ms = millis(self.started.elapsed().as_secs_f64() * 1000.0);
        tracing::info!(
            target: "duet::access",
            client = %self.client,
            method = %self.method,
            host = %text(self.host.as_ref()),
            path = %self.path,
            protocol = ?self.version,
            status = self.status.as_u16(),
            cluster = %self.cluster.as_deref().unwrap_or("-"),
            backend = %OrDash(self.backend),
            tried = %Joined(&self.tried),
            attempts = self.attempts,
            duration_ms,
            upstream_head_ms = self.upstream_head_ms.map_or(-1.0, millis),
            bytes = self.bytes,
            bytes_received = self.received.bytes(),
            outcome = %self.outcome,
            user_agent = %text(self.user_agent.as_ref()),
            request_id = %text(Some(&self.request_id)),
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
