//! The per-worker client toward backends.

use crate::request_body::UpstreamBody;
use duet_config::Timeouts;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::{TokioExecutor, TokioTimer},
};

/// A pooled HTTP/1.1 client. Each worker builds its own (one per cluster, for the cluster's timeouts):
/// no pool, lock or connection is shared between workers.
pub type UpstreamClient = Client<HttpConnector, UpstreamBody>;

/// Idle connections kept per backend, per worker.
pub(crate) const MAX_IDLE_PER_BACKEND: usize = 64;

/// The most header fields a backend's response may carry.
pub(crate) const MAX_RESPONSE_HEADERS: usize = 256;

/// Builds a worker's client for a cluster's timeouts.
pub fn upstream_client(timeouts: &Timeouts) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeouts.connect));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(timeouts.idle)
        // A burst opens as many connections as it needs; afterwards only this many stay pooled per
        // backend (nginx's `keepalive 64`): an idle pooled connection costs ~10 KiB.
        .pool_max_idle_per_host(MAX_IDLE_PER_BACKEND)
        // Without a pool timer, idle connections are only evicted when a request checks one out.
        .pool_timer(TokioTimer::new())
        // Head and small body in one write: measurably cheaper per request (../shared/design.md).
        .http1_writev(false)
        // Real responses carry more than hyper's default 100 fields (one `Set-Cookie` each); HAProxy
        // allows 101. Past this the response is refused (502), never held against the backend.
        .http1_max_headers(MAX_RESPONSE_HEADERS)
        .build(connector)
}
