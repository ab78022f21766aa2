//! duet's data plane: what one worker does with a request, in the order the request meets it.
//!
//! A [`WorkerProxy`] holds one worker's routing table and, for each cluster, that worker's own pooled
//! client, [`duet_balance::Balance`] and outlier view: nothing is shared with another worker.
//! [`serve_connection`] runs hyper's HTTP/1.1 server over a client connection with duet's limits and
//! hands each request to `WorkerProxy::handle` (`proxy.rs`), which runs the stages below, one file each:
//!
//! 1. **route** (`route.rs`): a target over `limits.max_uri_length` gets 414; host and path prefix pick
//!    the route, first match wins (404 if none).
//! 2. **prepare** (`prepare.rs`): hop-by-hop headers out, `X-Forwarded-For`/`-Proto`/`-Host` in; the
//!    request body is buffered when small and replayable, streamed otherwise (400 if malformed, 408 if
//!    it stalls).
//! 3. **retry** (`retry.rs`): attempts, each re-picked among backends not tried yet, while it is safe
//!    and the cluster's retry budget allows.
//! 4. **forward** (`forward.rs`): one attempt. The cluster's balancer picks a backend by power of two
//!    choices and counts it as load; the request goes out on the worker's pool; every failure becomes
//!    one [`ErrorKind`] (503 nothing eligible, 502 unreachable or not HTTP, 504 too slow).
//! 5. **respond** (`respond.rs`): response headers cleaned, a `101` becomes a tunnel, the body streams
//!    back.
//!
//! Each attempt's `Completion` (`completion.rs`) — the one hook for what happens when an attempt ends — owns
//! its load guard, latency sample, outlier verdict and access-log record, and settles them exactly once
//! when the response body ends, fails (a backend that dies mid-body counts as an outlier failure) or is
//! dropped.
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

mod completion;
mod forward;
mod prepare;
mod proxy;
mod respond;
mod retry;
mod route;
mod server;

mod access_log;
mod body;
mod cluster;
mod error;
mod headers;
mod histogram;
mod metrics;
mod outlier;
mod parking;
mod path;
mod request_body;
mod request_id;
mod stall;
mod status;
mod upstream;
pub mod view;

#[cfg(test)]
mod tests;

pub use access_log::set_access_log_sink;
pub use body::{BodyError, ProxyBody};
pub use cluster::{ClusterBalance, Upstream};
pub use error::{ErrorKind, ProxyError};
pub use metrics::{config_hash, DiscoveryCounters, Registry};
pub use parking::Resumed;
pub use proxy::WorkerProxy;
pub use request_body::UpstreamBody;
pub use server::{serve_connection, Client};
pub use status::{BackendStatus, ClusterStatus, ConfigStatus, Status, StatusWindow, Totals};
pub use upstream::{upstream_client, UpstreamClient, UpstreamError};
pub use view::{Endpoint, HealthView, ResolvedNames};
