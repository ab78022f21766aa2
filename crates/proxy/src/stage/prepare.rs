//! Stage 2, prepare: the header rules of a forwarding proxy, and where the request body comes from.

use crate::{
    backend::cluster::Cluster,
    backend::request_body::{BodySource, Reclaimable},
    error::{ErrorKind, ProxyError},
    exchange::{Prepared, Upgrade},
    headers,
    peer::Client,
};
use http::{header, HeaderValue, Request};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::sync::atomic::Ordering::Relaxed;

/// Rewrites the headers (hop-by-hop fields out; Host as routed; forwarding fields by trust) and decides
/// how the body is sent: buffered when small and retries may need it again, streamed otherwise. A body
/// in a transfer coding other than chunked gets 501, one that is malformed 400, one that stalls longer
/// than `limits.body_read_timeout` 408.
pub(crate) async fn prepare(
    mut request: Request<Incoming>,
    cluster: &Cluster,
    host: Option<HeaderValue>,
    client: Client,
) -> Result<Prepared, ProxyError> {
    // hyper decodes `chunked` only; a coding under it would reach the backend unlabelled.
    if headers::unknown_transfer_coding(request.headers()) {
        return Err(ProxyError::new(ErrorKind::UnknownTransferCoding));
    }
    let protocol = headers::upgrade_protocol(request.headers(), request.version());
    let upgrade = protocol.clone().map(|protocol| Upgrade { protocol });
    let absolute_form = request.uri().authority().is_some();
    let request_headers = request.headers_mut();
    headers::remove_request_hop_by_hop(request_headers, protocol);
    if let (true, Some(host)) = (absolute_form, &host) {
        // The host routed on is the host the backend sees (RFC 9112 §3.2.2); otherwise Host already is.
        request_headers.insert(header::HOST, host.clone());
    }
    headers::add_forwarding(
        request_headers,
        client.address.ip(),
        host,
        client.tls,
        client.trusted,
    );
    // The client's `Expect: 100-continue` was answered by our server when we began reading its body.
    request_headers.remove(header::EXPECT);

    let (mut parts, body) = request.into_parts();
    let source = body_source(body, cluster).await.map_err(ProxyError::new)?;
    if matches!(source, BodySource::Empty) {
        // A Trailer field announces trailers of a body; with no body it announces nothing.
        parts.headers.remove(header::TRAILER);
    }
    Ok(Prepared {
        parts,
        source,
        upgrade,
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
            Ok(Ok(collected)) => {
                let bytes = collected.to_bytes();
                let length = bytes.len() as u64;
                cluster.counters.bytes_received.fetch_add(length, Relaxed);
                Ok(BodySource::Buffered(bytes))
            }
            Ok(Err(_)) => Err(ErrorKind::BadRequestBody),
            Err(_) => Err(ErrorKind::BodyTimeout),
        };
    }
    Ok(BodySource::Streaming(Reclaimable::new(
        body,
        cluster.body_read_timeout,
        Some(cluster.counters.clone()),
    )))
}
