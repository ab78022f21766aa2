//! Stage 5, respond: the response toward the client. Hop-by-hop headers stop here, a `101 Switching
//! Protocols` becomes a tunnel, and the backend's body streams through with its attempt's completion.

use crate::{
    attempt::body::ProxyBody,
    attempt::completion::Completion,
    backend::cluster::Cluster,
    backend::sticky::Session,
    error::{ErrorKind, ProxyError, ALLOWED_METHODS},
    exchange::{ConnectionState, Failed, Outcome, Upgrade},
    filter::phase::{BodyPlan, ResponseHead, Shaping},
    filter::RouteFilters,
    grpc, headers,
    peer::Client,
    telemetry::access_log::AccessLog,
    tunnel::PendingTunnel,
};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

/// The client's response for what the attempts came to; a backend's goes through the response-head
/// and response-body phases of the route's `filters`, duet's own answer through the error-page phase
/// (what they need of the request in `shaping`); for a gRPC call (`grpc`) that no backend answered,
/// a gRPC error its client can read. A backend's answer in a sticky cluster carries the cookie naming
/// it when the request's `session` did not name it already.
pub(crate) fn respond(
    cluster: &Cluster,
    outcome: Outcome,
    ((upgrade, session), filters, shaping): ((Option<&Upgrade>, &Session), &RouteFilters, Shaping),
    client: &Client,
    connection: &ConnectionState,
    grpc: bool,
) -> Response<ProxyBody> {
    let response = match outcome {
        Ok((response, completion)) => relay(
            response,
            completion,
            (upgrade, session, filters, shaping),
            client,
            (connection, cluster),
            grpc,
        ),
        Err(Failed { error, log }) => {
            let client = client.address;
            tracing::warn!(cluster = %cluster.name, %client, "{error}");
            shaped_error(cluster_error(cluster, &error, log, grpc), filters, shaping)
        }
    };
    cluster.counters.response(response.status().as_u16());
    response
}

/// duet's own answer in place of a backend's, through the error-page and response-fields phases.
#[inline(never)]
fn shaped_error(
    response: Response<ProxyBody>,
    filters: &RouteFilters,
    shaping: Shaping,
) -> Response<ProxyBody> {
    let mut response = with_error_page(response, filters, shaping.pages);
    if let Some(fields) = shaping.fields {
        add_fields(response.headers_mut(), *fields);
    }
    response
}

/// The response-fields phase's `fields` on a response: each replaces the response's field of the
/// same name (the route's policy is the edge's), except `Vary`, whose values are added where it
/// does not name them yet.
#[inline(never)]
fn add_fields(headers: &mut HeaderMap, fields: HeaderMap) {
    let mut last = None;
    for (name, value) in fields {
        let name = match name {
            Some(name) => {
                last = Some(name.clone());
                if name != header::VARY {
                    headers.remove(&name);
                }
                name
            }
            // A further value of the field before it.
            None => match &last {
                Some(name) => name.clone(),
                None => continue,
            },
        };
        if name == header::VARY && headers::varies_by(headers, &value) {
            continue;
        }
        headers.append(name, value);
    }
}

/// Passes a backend's response on, unless its framing is ambiguous or it switches to a protocol the
/// client did not ask for: then 502 (a gRPC error for a gRPC call), counted against the backend.
/// Inlined, and the response built as the value returned, not changed once built: each call that
/// takes or returns a response by value, and each change through a reference, costs a copy of it
/// (~30 instructions).
#[inline(always)]
fn relay(
    mut response: Response<Incoming>,
    mut completion: Completion,
    (upgrade, session, filters, shaping): (Option<&Upgrade>, &Session, &RouteFilters, Shaping),
    client: &Client,
    (connection, cluster): (&ConnectionState, &Cluster),
    grpc: bool,
) -> Response<ProxyBody> {
    let cookie = cluster.sticky_cookie(session, completion.backend(), client.tls);
    if let Some(cookie) = cookie {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    let refuse = |completion: Completion, why: &'static str, shaping| {
        let backend = completion.backend();
        tracing::warn!(%backend, "refusing the response: {why}");
        let log = completion.reject();
        let error = ProxyError::upstream(ErrorKind::BadGateway, backend, why);
        shaped_error(cluster_error(cluster, &error, log, grpc), filters, shaping)
    };
    if let Err(why) = check_framing(response.headers()) {
        return refuse(completion, why, shaping);
    }
    let mut protocol = None;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(upgrade) =
            upgrade.filter(|u| headers::switches_to(response.headers(), &u.protocol))
        else {
            return refuse(
                completion,
                "a 101 to a protocol the client did not ask for",
                shaping,
            );
        };
        // The client's side is this connection, handed back by hyper once the 101 is written.
        connection.expect_tunnel(PendingTunnel {
            backend: hyper::upgrade::on(&mut response),
            idle: cluster.tunnel_idle(),
            peer: client.address,
        });
        protocol = Some(upgrade.protocol.clone());
        completion.upgraded();
    }
    let status = response.status().as_u16();
    let page = (shaping.pages).and_then(|json| filters.backend_page(status, json));
    let headers = response.headers_mut();
    headers::remove_hop_by_hop(headers, protocol);
    single_content_length(headers);
    if let Some(page) = page {
        // The backend's fields spoke of its body and its representation; the page is duet's.
        headers.clear();
        headers.insert(header::CONTENT_TYPE, page.content_type.clone());
    }
    let mut head = ResponseHead { headers, client };
    filters.on_response_head(&mut head);
    let (parts, body) = response.into_parts();
    completion.on_head(&parts);
    let body = match page {
        None => ProxyBody::upstream(body, completion),
        Some(page) => ProxyBody::in_place_of(page.body.clone(), body, completion),
    };
    shaped(parts, body, filters, shaping)
}

/// A backend's response through the response-body and response-fields phases, built as the value
/// returned (inlined into [`relay`], for the reason given there).
#[inline(always)]
fn shaped(
    mut parts: http::response::Parts,
    body: ProxyBody,
    filters: &RouteFilters,
    shaping: Shaping,
) -> Response<ProxyBody> {
    match shaping {
        Shaping {
            body: None,
            fields: None,
            ..
        } => Response::from_parts(parts, body),
        Shaping {
            body: None,
            fields: Some(fields),
            ..
        } => {
            add_fields(&mut parts.headers, *fields);
            Response::from_parts(parts, body)
        }
        Shaping {
            body: Some(plan),
            fields,
            ..
        } => body_phase(Response::from_parts(parts, body), filters, plan, fields),
    }
}

/// The response-body phase of a backend's response, then the response-fields phase; out of line, so
/// that a route without it pays one test.
#[inline(never)]
fn body_phase(
    mut response: Response<ProxyBody>,
    filters: &RouteFilters,
    plan: BodyPlan,
    fields: Option<Box<HeaderMap>>,
) -> Response<ProxyBody> {
    filters.on_response_body(plan, &mut response);
    if let Some(fields) = fields {
        add_fields(response.headers_mut(), *fields);
    }
    response
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
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
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

/// duet's own error answer in the route's error page for its status, if it has one (`json`: what
/// [`RouteFilters::shaping`] said; `None`: no pages, or a gRPC call).
pub(crate) fn with_error_page(
    mut response: Response<ProxyBody>,
    filters: &RouteFilters,
    json: Option<bool>,
) -> Response<ProxyBody> {
    if let Some(json) = json {
        error_page(&mut response, filters, json);
    }
    response
}

/// duet's own error answer with the route's error page for its status in place of its text, if the
/// route has one; `json`: the request's `Accept` prefers JSON. A backend's response passes as it is.
#[inline(never)]
fn error_page(response: &mut Response<ProxyBody>, filters: &RouteFilters, json: bool) {
    let Some(page) = filters.error_page(response.status().as_u16(), json) else {
        return;
    };
    if response.body_mut().replace_local(page.body.clone()) {
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, page.content_type.clone());
        headers.remove(header::CONTENT_LENGTH);
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
