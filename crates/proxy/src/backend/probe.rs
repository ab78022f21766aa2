//! Health checks through a cluster's own kind of client: TLS with the cluster's `tls:` when it has
//! one (the same CA, name and client certificate as its traffic), connections kept between checks.

use crate::{
    backend::{
        connect::Connector,
        pool::{upstream_client, upstream_client_over, UpstreamClient},
        request_body::UpstreamBody,
        tls,
    },
    view::ResolvedNames,
};
use duet_config::{Cluster, Timeouts};
use http::{header, HeaderValue, Request};
use http_body_util::BodyExt;
use std::{net::SocketAddr, sync::Arc, time::Duration};

/// A client for `cluster`'s health checks: connections made within `connect` (TLS as the cluster's
/// traffic, its files read now), idle ones closed after `idle`. Its handshakes are not counted in
/// the cluster's traffic metrics. Used inside a `tokio::task::LocalSet`.
pub fn health_client(
    cluster: &Cluster,
    names: &ResolvedNames,
    connect: Duration,
    idle: Duration,
) -> UpstreamClient {
    let timeouts = Timeouts {
        connect,
        idle,
        ..Timeouts::default()
    };
    let Some(settings) = &cluster.tls else {
        return upstream_client(&timeouts);
    };
    let loaded = tls::load(settings).map(Arc::new).map_err(|e| e.to_string());
    let connector = Connector::tls(loaded, Arc::default());
    connector.name_backends(cluster, names);
    upstream_client_over(&timeouts, connector)
}

impl UpstreamClient {
    /// GETs `path` from `backend` (`Host` its address) and reads the whole response, so the
    /// connection goes back to the pool for the next check. The status, or why there is none.
    pub async fn probe(&self, backend: SocketAddr, path: &str) -> Result<u16, String> {
        let mut request = Request::new(UpstreamBody::Empty);
        *request.uri_mut() = path.parse().map_err(|e| format!("bad path {path}: {e}"))?;
        if let Ok(host) = HeaderValue::from_str(&backend.to_string()) {
            request.headers_mut().insert(header::HOST, host);
        }
        let (response, lease) =
            self.send(backend, request)
                .await
                .map_err(|e| match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                })?;
        let status = response.status().as_u16();
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        lease.release();
        Ok(status)
    }
}
