//! Stage 2, prepare: the header rules of a forwarding proxy, and where the request body comes from.

use crate::{
    cluster::Cluster,
    error::{ErrorKind, ProxyError},
    headers,
    request_body::{BodySource, Reclaimable},
};
use http::{header, request::Parts, HeaderValue, Request};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::{body::Incoming, upgrade::OnUpgrade};
use std::net::SocketAddr;

/// A request ready to be sent to any backend of its cluster, as often as retries need.
pub(crate) struct Prepared {
    /// Method, target, version and the rewritten headers.
    pub(crate) parts: Parts,
    /// The body each attempt gets.
    pub(crate) source: BodySource,
    /// The client side of a protocol upgrade, if the request asks for one.
    pub(crate) client_upgrade: Option<OnUpgrade>,
}

/// Rewrites the headers (hop-by-hop fields out, forwarding fields in) and decides how the body is sent:
/// buffered when small and retries may need it again, streamed otherwise. A client body that is
/// malformed gets 400, one that stalls longer than `limits.body_read_timeout` gets 408.
pub(crate) async fn prepare(
    mut request: Request<Incoming>,
    cluster: &Cluster,
    host: Option<HeaderValue>,
    client: SocketAddr,
    secure: bool,
) -> Result<Prepared, ProxyError> {
    let upgrading = headers::wants_upgrade(request.headers());
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));
    let request_headers = request.headers_mut();
    headers::remove_hop_by_hop(request_headers, upgrading);
    headers::add_forwarding(request_headers, client.ip(), host, secure);
    // The client's `Expect: 100-continue` was answered by our server when we began reading its body.
    request_headers.remove(header::EXPECT);

    let (parts, body) = request.into_parts();
    let source = body_source(body, cluster).await.map_err(ProxyError::new)?;
    Ok(Prepared {
        parts,
        source,
        client_upgrade,
    })
}

/// Keeps a small body so that it can be replayed; streams anything larger or unsized.
async fn body_source(body: Incoming, cluster: &Cluster) -> Result<BodySource, ErrorKind> {
    if body.is_end_stream() {
        return Ok(BodySource::Empty);
    }
    let small = body
        .size_hint()
        .exact()
        .is_some_and(|n| n <= cluster.replay_body_limit as u64);
    if small && cluster.attempts > 1 {
        return match tokio::time::timeout(cluster.body_read_timeout, body.collect()).await {
            Ok(Ok(collected)) => Ok(BodySource::Buffered(collected.to_bytes())),
            Ok(Err(_)) => Err(ErrorKind::BadRequestBody),
            Err(_) => Err(ErrorKind::BodyTimeout),
        };
    }
    Ok(BodySource::Streaming(Reclaimable::new(
        body,
        cluster.body_read_timeout,
    )))
}
