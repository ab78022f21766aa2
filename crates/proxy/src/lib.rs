//! duet's data plane: what one worker does with a connection and its requests, in layers that each
//! import only the layers below them (`tests/layering.rs` holds that):
//!
//! - **`conn/`**: client connections. [`Connections::run`] is the worker's accept loop: each accepted
//!   connection (plain TCP, or TLS after its handshake) is served by hyper with duet's limits, parked
//!   while idle (a plain socket leaves its task for the parking lot: [`ClientIo`]), resumed on its next
//!   request, turned into a tunnel by a `101`, and drained at shutdown.
//! - **`handler.rs`**: [`WorkerProxy`], one worker's routing table (replaced by reloads) and
//!   `WorkerProxy::handle`, which runs each request through the stages.
//! - **`route_state/`**: what the worker keeps for one route (its clusters with their histograms, its
//!   weighted split, its filters), carried over a reload by route name.
//! - **`stage/`**, in the order a request meets them:
//!   1. **route**: a target over `limits.max_uri_length` gets 414; host and path prefix pick the
//!      route, first match wins (404 if none).
//!   2. **prepare**: hop-by-hop headers out, `X-Forwarded-For`/`-Proto`/`-Host` in; the request body
//!      is buffered when small and replayable, streamed otherwise (400 if malformed, 408 if it stalls).
//!   3. **retry**: attempts, each re-picked among backends not tried yet, while it is safe and the
//!      cluster's retry budget allows.
//!   4. **respond**: response headers cleaned, a `101` becomes a tunnel, the body streams back.
//! - **`filter/`**: a route's features (header edits, rewrite, redirect, mirror, hedging, HSTS), one
//!   module each, which the handler and the stages run in the request's phases; its crate doc is the
//!   guide to adding one.
//! - **`forward.rs`**: one attempt. The cluster's balancer picks a backend by power of two choices
//!   and counts it as load; the request goes out on the worker's pool; every failure becomes one
//!   [`ErrorKind`] (503 nothing eligible, 502 unreachable or not HTTP, 504 too slow).
//! - **`exchange.rs`**: what passes between the stages (the prepared request, failed attempts, what
//!   the connection needs to know).
//! - **`attempt/`**: each attempt's `Completion`, the one hook for what happens when an attempt ends:
//!   it owns its load guard, latency sample, outlier verdict and access-log record, and settles them
//!   exactly once when the response body ([`ProxyBody`]) ends, fails (a backend that dies mid-body
//!   counts as an outlier failure) or is dropped.
//! - **`backend/`**: a cluster as one worker sees it: its [`duet_balance::Balancer`], pooled client
//!   (plain, or TLS with the cluster's `tls:`: `backend/connect.rs` is the seam), outlier ejection and
//!   request bodies. Nothing is shared with another worker.
//! - **`telemetry/`**: metric cells and their Prometheus text, the status page, the access log.
//! - leaves: errors, header rules, the peer, request ids, stall timers, tunnels, the heap slots a
//!   worker keeps for what it boxes per request (`spare.rs`), the control plane's [`view`].
//!
//! Between requests the worker applies what its control plane publishes ([`view`]): a reloaded config
//! ([`WorkerProxy::reload`]), host names resolved again ([`WorkerProxy::apply_names`]: membership changes
//! only, no pool rebuilt) and health checks ([`WorkerProxy::apply_health`]). A backend is eligible when
//! it is healthy and this worker has not ejected it; that one flag lives in the balancer.
//!
//! Framing is enforced by hyper before a request reaches the proxy: conflicting `Content-Length`s and a
//! `Transfer-Encoding` other than chunked get 400; a request with both `Transfer-Encoding` and
//! `Content-Length` is read by its chunked framing alone and its connection is closed after the response
//! (RFC 9112 §6.3), so the backend only ever sees one unambiguous framing. A backend body that fails
//! mid-stream makes hyper abort the client connection rather than end the response cleanly.

#![warn(missing_docs)]

// Top layer first: each module imports only modules declared after it (tests/layering.rs checks).
mod conn;
mod handler;
mod route_state;
mod stage;
mod filter;
mod forward;
mod exchange;
mod attempt;
mod backend;
mod telemetry;

mod path;
mod outcome;
mod grpc;
mod error;
mod headers;
mod header_copy;
mod peer;
mod client_cert;
mod request_id;
mod stall;
mod tunnel;
mod spare;
pub mod view;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod fuzz_tests;

pub use attempt::body::{BodyError, ProxyBody};
pub use backend::cluster::{ClusterBalance, Upstream};
pub use backend::pool::{upstream_client, UpstreamClient, UpstreamError};
pub use backend::probe::{health_client, HealthClient};
pub use backend::request_body::UpstreamBody;
pub use backend::tls::{check_upstream_tls, UpstreamTlsError};
pub use conn::parking::Resumed;
pub use conn::{
    accept::{Accepted, Drained},
    connections::Connections,
    io::ClientIo,
    place::Place,
};
pub use error::{ErrorKind, ProxyError};
pub use filter::AuthCheck;
pub use handler::WorkerProxy;
pub use peer::{Client, TlsSession};
pub use stage::route::lookup as route_lookup;
pub use stage::route_index::RouteIndex;
pub use telemetry::access_log::set_access_log_sink;
pub use telemetry::history::{BackendPoint, RoutePoint};
pub use telemetry::metrics::{
    config_hash, listener_label, CertificateExpiry, DiscoveryCounters, Registry,
};
pub use telemetry::status::{
    BackendStatus, ClusterShare, ClusterStatus, ConfigStatus, HistoryStatus, RouteStatus, Status,
    StatusWindow, Totals,
};
pub use view::{Endpoint, HealthView, ResolvedNames};
