//! duet's data plane: HTTP/1.1 forwarding for one worker.
//!
//! A [`WorkerProxy`] holds one worker's routes and, for each cluster, that worker's own pooled client and
//! [`duet_balance::Balance`]. [`serve_connection`] runs hyper's HTTP/1.1 server over a client connection
//! with duet's limits and hands each request to [`WorkerProxy::handle`], which:
//!
//! 1. rejects over-long targets (414) and routes by host and path prefix, first match wins (404 if none);
//! 2. strips hop-by-hop headers, appends `X-Forwarded-For`, sets `X-Forwarded-Proto`/`-Host`;
//! 3. lets the cluster's balancer pick a backend (503 if none is eligible), which counts the request as
//!    load until the response body ends;
//! 4. streams the backend's response back (502 if unreachable or invalid, 504 if too slow), tunnelling
//!    the connection after a `101 Switching Protocols`.
//!
//! Framing is enforced by hyper before a request reaches the proxy: conflicting `Content-Length`s and a
//! `Transfer-Encoding` other than chunked get 400; a request with both `Transfer-Encoding` and
//! `Content-Length` is read by its chunked framing alone and its connection is closed after the response
//! (RFC 9112 §6.3), so the backend only ever sees one unambiguous framing. A backend body that fails
//! mid-stream makes hyper abort the client connection rather than end the response cleanly.

#![warn(missing_docs)]

mod admin;
mod body;
mod error;
mod headers;
mod health;
mod metrics;
mod outlier;
mod request_body;
mod server;
mod upstream;
mod worker;

pub use admin::serve_admin;
pub use body::ProxyBody;
pub use error::{ErrorKind, ProxyError};
pub use health::{run_health_checks, HealthView};
pub use metrics::Registry;
pub use request_body::UpstreamBody;
pub use server::serve_connection;
pub use upstream::{upstream_client, BackendFuture, BackendService, PickedBackend, UpstreamClient};
pub use worker::{ClusterBalance, WorkerProxy};
