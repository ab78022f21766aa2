//! Which client carries a cluster's requests: HTTP/1.1 connections lent one request at a time
//! ([`UpstreamClient`]) or HTTP/2 connections shared by many streams ([`H2Client`]), per the cluster's
//! `protocol`. The stages above see one `send`, and one [`Hold`] that the attempt keeps until it settles.

use crate::backend::{
    h2_pool::{H2Client, StreamSlot},
    pool::{Key, Lease, UpstreamClient, UpstreamError},
    request_body::UpstreamBody,
};
use http::{header, uri::Authority, HeaderValue, Request, Response, Uri, Version};
use hyper::body::Incoming;
use std::{net::SocketAddr, pin::pin};
use tokio::time::Instant;

/// A worker's client toward one cluster's backends, in the cluster's protocol.
#[derive(Clone)]
pub(crate) enum Transport {
    Http1(UpstreamClient),
    H2(H2Client),
}

/// What an attempt holds of its connection until it settles.
pub(crate) enum Hold {
    /// An HTTP/1.1 connection, pooled again when the response ends cleanly.
    Lease(Lease),
    /// A stream slot on a shared HTTP/2 connection, freed when the attempt settles (held for its
    /// `Drop`, never read).
    #[allow(dead_code)]
    Stream(StreamSlot),
}

impl Transport {
    /// Sends `request`, built for HTTP/1.1 (origin-form target, `Host` set), in this protocol, to
    /// `key`'s backend (for its client, over HTTP/1.1), for an attempt that started at `now`.
    pub(crate) async fn send(
        &self,
        key: Key,
        request: Request<UpstreamBody>,
        now: Instant,
    ) -> Result<(Response<Incoming>, Hold), UpstreamError> {
        match self {
            Self::Http1(client) => {
                // Pinned where built: awaited by value, the future (about a kilobyte) would be copied.
                let (response, lease) = pin!(client.send(key, request, now)).await?;
                Ok((response, Hold::Lease(lease)))
            }
            Self::H2(client) => {
                let backend = key.0;
                let request = for_h2(request, backend, client.connector().is_tls());
                let (response, slot) = client.send(backend, request).await?;
                Ok((response, Hold::Stream(slot)))
            }
        }
    }

    /// Idle HTTP/1.1 connections, or open HTTP/2 ones.
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        match self {
            Self::Http1(client) => client.idle_connections(),
            Self::H2(client) => client.open_connections(),
        }
    }
}

/// An HTTP/1.1-shaped request as an HTTP/2 one: `Host` becomes `:authority` (RFC 9113 §8.3.1: a
/// client that sends both must send the same; duet sends only the pseudo-header), the target becomes
/// absolute so hyper sends `:scheme` (`https` over TLS) and `:authority`, and a gRPC request keeps the `te: trailers`
/// gRPC servers require (the prepare stage drops `TE` as hop-by-hop).
fn for_h2(
    mut request: Request<UpstreamBody>,
    backend: SocketAddr,
    tls: bool,
) -> Request<UpstreamBody> {
    let authority = request
        .headers_mut()
        .remove(header::HOST)
        .and_then(|host| Authority::try_from(host.as_bytes()).ok())
        .or_else(|| Authority::try_from(backend.to_string()).ok());
    let mut parts = std::mem::take(request.uri_mut()).into_parts();
    parts.scheme = Some(if tls {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    });
    parts.authority = authority;
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    *request.uri_mut() = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
    *request.version_mut() = Version::HTTP_2;
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        request
            .headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_h2_request_carries_the_host_as_its_authority_and_grpc_keeps_te_trailers() {
        let request = Request::post("/pkg.Svc/Call?x=1")
            .header(header::HOST, "api.example.com")
            .header(header::CONTENT_TYPE, "application/grpc+proto")
            .body(UpstreamBody::Empty)
            .expect("request");
        let backend: SocketAddr = "10.0.0.1:50051".parse().expect("address");
        let request = for_h2(request, backend, false);
        assert_eq!(request.uri(), "http://api.example.com/pkg.Svc/Call?x=1");
        assert_eq!(request.version(), Version::HTTP_2);
        assert!(request.headers().get(header::HOST).is_none());
        assert_eq!(request.headers()[header::TE], "trailers");

        // No Host (an HTTP/1.0 client): the backend's address; not gRPC: no TE.
        let request = Request::get("/")
            .body(UpstreamBody::Empty)
            .expect("request");
        let request = for_h2(request, backend, false);
        assert_eq!(request.uri(), "http://10.0.0.1:50051/");
        assert!(request.headers().get(header::TE).is_none());

        // Over TLS, the scheme says so.
        let request = Request::get("/x")
            .body(UpstreamBody::Empty)
            .expect("request");
        let request = for_h2(request, backend, true);
        assert_eq!(request.uri(), "https://10.0.0.1:50051/x");
    }
}
