//! Stage 5, respond: the response toward the client. Hop-by-hop headers stop here, a `101 Switching
//! Protocols` becomes a tunnel, and the backend's body streams through with its attempt's completion.

use crate::{
    attempt::body::ProxyBody,
    attempt::completion::Completion,
    backend::cluster::Cluster,
    error::{ErrorKind, ProxyError},
    exchange::{ConnectionState, Failed, Outcome, Upgrade},
    grpc, headers,
    stage::filters::HeaderEditor,
    telemetry::access_log::AccessLog,
    tunnel::PendingTunnel,
};
use bytes::Bytes;
use duet_config::{PathMatch, Redirect, RedirectPath};
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use std::net::SocketAddr;

/// The client's response for what the attempts came to; a backend's gets the route's response
/// `edits`, duet's own answer none; for a gRPC call (`grpc`) that no backend answered, a gRPC error
/// its client can read.
pub(crate) fn respond(
    cluster: &Cluster,
    outcome: Outcome,
    (upgrade, edits): (Option<Upgrade>, &HeaderEditor),
    client: SocketAddr,
    connection: &ConnectionState,
    grpc: bool,
) -> Response<ProxyBody> {
    let response = match outcome {
        Ok((response, completion)) => relay(
            response,
            completion,
            (upgrade, edits),
            client,
            (connection, cluster),
            grpc,
        ),
        Err(Failed { error, log }) => {
            tracing::warn!(cluster = %cluster.name, %client, "{error}");
            cluster_error(cluster, &error, log, grpc)
        }
    };
    cluster.counters.response(response.status().as_u16());
    response
}

/// Passes a backend's response on, unless its framing is ambiguous or it switches to a protocol the
/// client did not ask for: then 502 (a gRPC error for a gRPC call), counted against the backend.
fn relay(
    mut response: Response<Incoming>,
    mut completion: Completion,
    (upgrade, edits): (Option<Upgrade>, &HeaderEditor),
    client: SocketAddr,
    (connection, cluster): (&ConnectionState, &Cluster),
    grpc: bool,
) -> Response<ProxyBody> {
    let refuse = |completion: Completion, why: &'static str| {
        let backend = completion.backend();
        tracing::warn!(%backend, "refusing the response: {why}");
        let log = completion.reject();
        let error = ProxyError::upstream(ErrorKind::BadGateway, backend, why);
        cluster_error(cluster, &error, log, grpc)
    };
    if let Err(why) = check_framing(response.headers()) {
        return refuse(completion, why);
    }
    let mut protocol = None;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(upgrade) =
            upgrade.filter(|u| headers::switches_to(response.headers(), &u.protocol))
        else {
            return refuse(completion, "a 101 to a protocol the client did not ask for");
        };
        // The client's side is this connection, handed back by hyper once the 101 is written.
        connection.expect_tunnel(PendingTunnel {
            backend: hyper::upgrade::on(&mut response),
            idle: cluster.tunnel_idle(),
            peer: client,
        });
        protocol = Some(upgrade.protocol);
        completion.upgraded();
    }
    let headers = response.headers_mut();
    headers::remove_hop_by_hop(headers, protocol);
    single_content_length(headers);
    edits.apply(headers);
    let (parts, body) = response.into_parts();
    completion.on_head(&parts);
    Response::from_parts(parts, ProxyBody::upstream(body, completion))
}

/// RFC 9112 §6.3: a response with both `Transfer-Encoding` and `Content-Length` may be an attempt at
/// response splitting, and a coding other than chunked would reach the client undecoded and unlabelled.
/// duet refuses both, as nginx and Envoy do.
fn check_framing(headers: &HeaderMap) -> Result<(), &'static str> {
    if !headers::has(headers, &header::TRANSFER_ENCODING) {
        return Ok(());
    }
    if headers.contains_key(header::CONTENT_LENGTH) {
        return Err("both Content-Length and Transfer-Encoding");
    }
    if headers::unknown_transfer_coding(headers) {
        return Err("a transfer coding other than chunked");
    }
    Ok(())
}

/// `Content-Length: 5, 5` (or the field twice with one value, which hyper accepts) goes on as `5`.
fn single_content_length(headers: &mut HeaderMap) {
    // A pass over the few fields of a response costs less than a hashed look-up.
    let mut values = (headers.iter())
        .filter(|(name, _)| *name == header::CONTENT_LENGTH)
        .map(|(_, value)| value);
    let Some(first) = values.next() else { return };
    if values.next().is_none() && !first.as_bytes().contains(&b',') {
        return;
    }
    let single = first
        .as_bytes()
        .split(|&b| b == b',')
        .next()
        .map(<[u8]>::trim_ascii)
        .and_then(|v| HeaderValue::from_bytes(v).ok());
    if let Some(single) = single {
        headers.insert(header::CONTENT_LENGTH, single);
    }
}

/// `OPTIONS *` asks about the server itself (RFC 9110 §9.3.7): duet answers it, listing the methods it
/// forwards. Any other method with the asterisk target is 400.
pub(crate) fn asterisk<B>(
    request: &Request<B>,
    mut log: Option<Box<AccessLog>>,
) -> Response<ProxyBody> {
    if request.method() != Method::OPTIONS {
        return local_error(&ProxyError::new(ErrorKind::InvalidPath), log);
    }
    let mut response = Response::new(ProxyBody::local(Bytes::new(), log.take()));
    response.headers_mut().insert(
        header::ALLOW,
        HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE"),
    );
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}

/// The answer of a redirect route: no backend is asked. `Location` (RFC 9110 §10.2.2) is the request's
/// URL with the redirect's parts in place and the query kept; a port is written only when it is not the
/// scheme's default. `host` is the host the request named (with its port, if any).
pub(crate) fn redirect<B>(
    redirect: &Redirect,
    matched: &PathMatch,
    request: &Request<B>,
    host: Option<&HeaderValue>,
    tls: bool,
    mut log: Option<Box<AccessLog>>,
) -> Response<ProxyBody> {
    let location = location(redirect, matched, request.uri(), host, tls);
    let Ok(location) = HeaderValue::from_str(&location) else {
        return local_error(&ProxyError::new(ErrorKind::InvalidPath), log);
    };
    let status = StatusCode::from_u16(redirect.status).unwrap_or(StatusCode::FOUND);
    if let Some(log) = log.as_mut() {
        log.status = status;
    }
    let mut response = Response::new(ProxyBody::error(Bytes::new(), log, "redirect"));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, location);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}

/// The redirect's target URL. Without a host from either the request or the redirect (an HTTP/1.0
/// request without Host), a relative reference: the path and query alone.
fn location(
    redirect: &Redirect,
    matched: &PathMatch,
    uri: &Uri,
    host: Option<&HeaderValue>,
    tls: bool,
) -> String {
    let path = match (&redirect.path, matched) {
        (Some(RedirectPath::Full(path)), _) => path.clone(),
        (Some(RedirectPath::Prefix(new)), PathMatch::Prefix(old)) => {
            let rest = uri.path().get(old.len()..).unwrap_or_default();
            match (new.strip_suffix('/'), rest.starts_with('/')) {
                (Some(trimmed), true) => format!("{trimmed}{rest}"),
                _ if new.is_empty() && rest.is_empty() => "/".to_owned(),
                _ => format!("{new}{rest}"),
            }
        }
        _ => uri.path().to_owned(),
    };
    let query = uri.query().map_or_else(String::new, |q| format!("?{q}"));
    let (request_host, request_port) = host
        .and_then(|h| h.to_str().ok())
        .map_or((None, None), split_host);
    let Some(name) = redirect.host.as_deref().or(request_host) else {
        return format!("{path}{query}");
    };
    let scheme = redirect
        .scheme
        .as_deref()
        .unwrap_or(if tls { "https" } else { "http" });
    let port = match (redirect.port, &redirect.scheme) {
        (Some(port), _) => Some(port),
        (None, Some(_)) => None,
        (None, None) => request_port,
    };
    let default = if scheme == "https" { 443 } else { 80 };
    let port = port
        .filter(|&p| p != default)
        .map_or_else(String::new, |p| format!(":{p}"));
    let name = crate::path::without_root_dot(name);
    if name.contains(':') {
        format!("{scheme}://[{name}]{port}{path}{query}")
    } else {
        format!("{scheme}://{name}{port}{path}{query}")
    }
}

/// `name[:port]` or `[v6][:port]` into the name (brackets off) and the port.
fn split_host(authority: &str) -> (Option<&str>, Option<u16>) {
    let (name, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((name, tail)) => (name, tail.strip_prefix(':')),
            None => (rest, None),
        },
        None => match authority.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        },
    };
    (Some(name), port.and_then(|p| p.parse().ok()))
}

/// A gRPC response to an HTTP/1.1 client: hyper writes only the trailers a response's `Trailer` field
/// announces (and only to a client that sent `TE: trailers`), and an HTTP/2 backend announces none,
/// so the gRPC status fields are announced here when the backend did not say.
pub(crate) fn announce_grpc_trailers(headers: &mut HeaderMap) {
    if !headers.contains_key(header::TRAILER) {
        headers.insert(
            header::TRAILER,
            HeaderValue::from_static("grpc-status, grpc-message, grpc-status-details-bin"),
        );
    }
}

/// [`error_response`] for a request routed to `cluster`, its gRPC status counted there.
pub(crate) fn cluster_error(
    cluster: &Cluster,
    error: &ProxyError,
    log: Option<Box<AccessLog>>,
    grpc: bool,
) -> Response<ProxyBody> {
    if grpc {
        cluster.counters.grpc_status(grpc::code_for(error.kind()));
    }
    error_response(error, log, grpc)
}

/// [`local_error`], or for a gRPC call (`grpc`) a trailers-only gRPC status: HTTP 200 with
/// `grpc-status` and `grpc-message`, since gRPC clients cannot read why from an HTTP 502 or 504.
pub(crate) fn error_response(
    error: &ProxyError,
    mut log: Option<Box<AccessLog>>,
    grpc: bool,
) -> Response<ProxyBody> {
    if !grpc {
        return local_error(error, log);
    }
    let (code, response) = grpc::error_response(error);
    if let Some(log) = log.as_mut() {
        log.status = response.status();
        log.grpc_status = Some(code);
        if log.backend.is_none() {
            log.backend = error.backend();
        }
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, ProxyBody::error(body, log, error.flag()))
}

/// A short text response for a request duet could not proxy.
pub(crate) fn local_error(
    error: &ProxyError,
    mut log: Option<Box<AccessLog>>,
) -> Response<ProxyBody> {
    if let Some(log) = log.as_mut() {
        log.status = error.status();
        if log.backend.is_none() {
            log.backend = error.backend();
        }
    }
    let (parts, body) = error.to_response().into_parts();
    Response::from_parts(parts, ProxyBody::error(body, log, error.flag()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        map
    }

    #[test]
    fn a_response_framed_two_ways_or_in_an_unknown_coding_is_refused() {
        let rows: [(&[(&str, &str)], bool); 5] = [
            (&[("content-length", "5")], true),
            (&[("transfer-encoding", "chunked")], true),
            (
                &[("transfer-encoding", "chunked"), ("content-length", "5")],
                false,
            ),
            (&[("transfer-encoding", "gzip")], false),
            (&[], true),
        ];
        for (fields, passes) in rows {
            assert_eq!(
                check_framing(&headers(fields)).is_ok(),
                passes,
                "{fields:?}"
            );
        }
    }

    #[test]
    fn a_location_keeps_the_query_and_writes_only_what_is_not_a_default() {
        let redirect = |scheme: Option<&str>, port, path| Redirect {
            scheme: scheme.map(str::to_owned),
            host: None,
            port,
            path,
            status: 308,
        };
        let prefix = PathMatch::Prefix("/old".into());
        let uri: Uri = "/old/x?a=1&b".parse().expect("uri");
        let host = HeaderValue::from_static("shop.example.com:8080");
        let at =
            |r: &Redirect, host: Option<&HeaderValue>, tls| location(r, &prefix, &uri, host, tls);
        assert_eq!(
            at(&redirect(Some("https"), None, None), Some(&host), false),
            "https://shop.example.com/old/x?a=1&b"
        );
        assert_eq!(
            at(
                &redirect(None, None, Some(RedirectPath::Prefix("/new".into()))),
                Some(&host),
                false
            ),
            "http://shop.example.com:8080/new/x?a=1&b"
        );
        assert_eq!(
            at(
                &redirect(None, None, Some(RedirectPath::Prefix("/".into()))),
                Some(&host),
                true
            ),
            "https://shop.example.com:8080/x?a=1&b"
        );
        assert_eq!(
            at(
                &redirect(
                    Some("https"),
                    Some(8443),
                    Some(RedirectPath::Full("/p".into()))
                ),
                Some(&HeaderValue::from_static("[::1]:80")),
                false
            ),
            "https://[::1]:8443/p?a=1&b"
        );
        assert_eq!(
            at(&redirect(None, Some(9000), None), None, false),
            "/old/x?a=1&b",
            "no host known: a relative reference"
        );
    }

    #[test]
    fn repeated_equal_content_lengths_go_on_as_one() {
        for fields in [
            &[("content-length", "5, 5")][..],
            &[("content-length", "5"), ("content-length", "5")][..],
        ] {
            let mut map = headers(fields);
            single_content_length(&mut map);
            let values: Vec<_> = map.get_all(header::CONTENT_LENGTH).iter().collect();
            assert_eq!(values, [HeaderValue::from_static("5")], "{fields:?}");
        }
    }
}
