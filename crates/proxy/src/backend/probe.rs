//! Health checks through a cluster's own kind of client: its protocol (HTTP/1.1, or HTTP/2 for a
//! `protocol: h2` cluster, whose backends may speak nothing else), TLS with the cluster's `tls:` when
//! it has one (the same CA, name and client certificate as its traffic; ALPN `h2` for an h2 cluster),
//! connections kept between checks. A cluster that sends the PROXY protocol starts its checks'
//! connections with a header too, naming no client (`LOCAL`, `UNKNOWN`), as HAProxy's
//! `check-send-proxy` does: a backend that requires the header would refuse them otherwise.

use crate::{
    backend::{
        connect::Connector,
        h2_pool::h2_client_over,
        pool::{upstream_client_over, Key},
        request_body::UpstreamBody,
        tls,
        transport::{Hold, Transport},
    },
    view::ResolvedNames,
};
use duet_config::{Cluster, Timeouts, UpstreamProtocol};
use http::{header, HeaderValue, Request};
use http_body_util::BodyExt;
use std::{net::SocketAddr, sync::Arc, time::Duration};
use tokio::time::Instant;

/// A cluster's health-check client, in the cluster's protocol. Cheap to clone; not `Send`.
#[derive(Clone)]
pub struct HealthClient(Transport);

/// A client for `cluster`'s health checks: connections made within `connect` (TLS as the cluster's
/// traffic, its files read now), idle ones closed after `idle`. Its handshakes are not counted in
/// the cluster's traffic metrics. Used inside a `tokio::task::LocalSet`.
pub fn health_client(
    cluster: &Cluster,
    names: &ResolvedNames,
    connect: Duration,
    idle: Duration,
) -> HealthClient {
    let timeouts = Timeouts {
        connect,
        idle,
        ..Timeouts::default()
    };
    let connector = match &cluster.tls {
        None => Connector::default(),
        Some(settings) => {
            let loaded = tls::load(settings).map(Arc::new).map_err(|e| e.to_string());
            let connector = Connector::tls(loaded, Arc::default());
            connector.name_backends(cluster, names);
            connector
        }
    }
    .sending_proxy_protocol(cluster.send_proxy_protocol);
    HealthClient(match cluster.protocol {
        UpstreamProtocol::Http1 => Transport::Http1(upstream_client_over(&timeouts, connector)),
        UpstreamProtocol::H2 => Transport::H2(h2_client_over(&timeouts, cluster.http2, connector)),
    })
}

impl HealthClient {
    /// GETs `path` from `backend` (`Host`, or `:authority` over h2, its address) and reads the whole
    /// response, so the connection is free for the next check. The status, or why there is none.
    pub async fn probe(&self, backend: SocketAddr, path: &str) -> Result<u16, String> {
        let mut request = Request::new(UpstreamBody::Empty);
        *request.uri_mut() = path.parse().map_err(|e| format!("bad path {path}: {e}"))?;
        if let Ok(host) = HeaderValue::from_str(&backend.to_string()) {
            request.headers_mut().insert(header::HOST, host);
        }
        let (response, hold) = self
            .0
            .send(Key(backend, None), request, Instant::now())
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
        match hold {
            Hold::Lease(lease) => lease.release(Instant::now()),
            // Its slot frees the stream on drop.
            Hold::Stream(_) => {}
        }
        Ok(status)
    }
}
