//! gRPC as a proxy sees it (the HTTP/2 protocol spec of grpc/grpc): which requests are gRPC, the
//! status a call ended with, the deadline a client set, and the error a gRPC client can read when duet
//! has no backend answer to give (HTTP 200 with `grpc-status` in a trailers-only response; a 502 or
//! 504 becomes an opaque `UNKNOWN` or `INTERNAL` in gRPC clients, losing why).

use crate::error::{ErrorKind, ProxyError};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use std::time::Duration;

// Named once: a look-up by `&str` parses the name first, and two of these are looked up per request
// (gRPC or not).
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The status codes, by number (the `code` label of `duet_grpc_responses_total`).
pub(crate) const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

const UNKNOWN: u8 = 2;
const DEADLINE_EXCEEDED: u8 = 4;
const PERMISSION_DENIED: u8 = 7;
const RESOURCE_EXHAUSTED: u8 = 8;
const UNIMPLEMENTED: u8 = 12;
const INTERNAL: u8 = 13;
const UNAVAILABLE: u8 = 14;
const UNAUTHENTICATED: u8 = 16;

/// Whether the request is a gRPC call (`content-type: application/grpc` or `application/grpc+…`,
/// `application/grpc-web…` included).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// The `grpc-status` among `fields` (a trailers-only head, or the trailers): a code past 16 counts as
/// `UNKNOWN`, as gRPC clients read it.
pub(crate) fn status_of(fields: &HeaderMap) -> Option<u8> {
    let value = fields.get(GRPC_STATUS)?.to_str().ok()?;
    let code: u32 = value.trim().parse().ok()?;
    Some(
        u8::try_from(code)
            .ok()
            .filter(|c| *c <= 16)
            .unwrap_or(UNKNOWN),
    )
}

/// The call's deadline from `grpc-timeout` (at most 8 digits and a unit: `H`, `M`, `S`, `m`, `u`,
/// `n`); `None` when absent or malformed (then only the route's timeout applies).
pub(crate) fn timeout(headers: &HeaderMap) -> Option<Duration> {
    // Looked for in every request, gRPC or not, and nearly always absent: a scan of a handful of
    // names (an enum comparison for standard ones) says so for less than the hashed look-up (about
    // 190 instructions).
    const SCANNED: usize = 12;
    if headers.keys_len() <= SCANNED && !headers.keys().any(|name| *name == GRPC_TIMEOUT) {
        return None;
    }
    let value = headers.get(GRPC_TIMEOUT)?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The tighter of the route's timeout and the client's deadline.
pub(crate) fn bound(route: Option<Duration>, deadline: Option<Duration>) -> Option<Duration> {
    match (route, deadline) {
        (Some(route), Some(deadline)) => Some(route.min(deadline)),
        (route, deadline) => route.or(deadline),
    }
}

/// The status a gRPC client gets for a request duet could not proxy: `DEADLINE_EXCEEDED` when time
/// ran out, `UNAVAILABLE` when no backend could answer (clients may retry it elsewhere), and the
/// codes the gRPC spec maps the other HTTP statuses to.
pub(crate) fn code_for(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Timeout
        | ErrorKind::RouteTimeout
        | ErrorKind::BodyTimeout
        | ErrorKind::UploadTooSlow => DEADLINE_EXCEEDED,
        ErrorKind::NoEligibleBackend
        | ErrorKind::LocalResource
        | ErrorKind::Connect
        | ErrorKind::TlsHandshake
        | ErrorKind::BadGateway
        | ErrorKind::AuthUnavailable => UNAVAILABLE,
        ErrorKind::Unauthorized => UNAUTHENTICATED,
        ErrorKind::NoRoute => UNIMPLEMENTED,
        ErrorKind::BodyTooLarge | ErrorKind::TooManyRequests => RESOURCE_EXHAUSTED,
        ErrorKind::ClientDenied => PERMISSION_DENIED,
        _ => INTERNAL,
    }
}

/// A trailers-only gRPC error for `error`: status 200, `grpc-status` and `grpc-message` in the head,
/// no body.
pub(crate) fn error_response(error: &ProxyError) -> (u8, Response<Bytes>) {
    let code = code_for(error.kind());
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    // The texts are plain ASCII without `%`: nothing to percent-encode.
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(error.message()));
    (code, response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &'static str, value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn grpc_timeout_reads_every_unit_and_refuses_what_the_spec_does_not_allow() {
        let read = |v| timeout(&with("grpc-timeout", v));
        assert_eq!(read("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(read("3M"), Some(Duration::from_secs(180)));
        assert_eq!(read("1S"), Some(Duration::from_secs(1)));
        assert_eq!(read("250m"), Some(Duration::from_millis(250)));
        assert_eq!(read("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(read("5n"), Some(Duration::from_nanos(5)));
        for bad in ["123456789S", "S", "10", "1s", "-1S", "1.5S", " 1S"] {
            assert_eq!(read(bad), None, "{bad}");
        }
        // Found among a few fields (the scan) and among many (the hashed look-up alone); absent in both.
        for others in [3, 40] {
            let mut headers = HeaderMap::new();
            for k in 0..others {
                let name = HeaderName::from_bytes(format!("x-f{k}").as_bytes()).expect("name");
                headers.insert(name, HeaderValue::from_static("1"));
            }
            headers.insert(header::HOST, HeaderValue::from_static("a"));
            assert_eq!(timeout(&headers), None, "{others}");
            headers.insert(GRPC_TIMEOUT, HeaderValue::from_static("7S"));
            headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
            assert_eq!(timeout(&headers), Some(Duration::from_secs(7)), "{others}");
        }
        let (route, deadline) = (Duration::from_secs(5), Duration::from_millis(100));
        assert_eq!(bound(Some(route), Some(deadline)), Some(deadline));
        assert_eq!(bound(Some(route), None), Some(route));
        assert_eq!(bound(None, Some(deadline)), Some(deadline));
    }

    #[test]
    fn a_status_is_read_from_its_field_and_an_unknown_code_is_unknown() {
        assert_eq!(status_of(&with("grpc-status", "0")), Some(0));
        assert_eq!(status_of(&with("grpc-status", "14")), Some(14));
        assert_eq!(status_of(&with("grpc-status", "99")), Some(UNKNOWN));
        assert_eq!(status_of(&with("grpc-status", "x")), None);
        assert_eq!(status_of(&HeaderMap::new()), None);
        assert!(is_grpc(&with("content-type", "application/grpc+proto")));
        assert!(!is_grpc(&with("content-type", "application/json")));
    }

    #[test]
    fn failures_become_unavailable_and_timeouts_deadline_exceeded() {
        let (code, response) = error_response(&ProxyError::new(ErrorKind::NoEligibleBackend));
        assert_eq!(code, 14);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "14");
        assert_eq!(response.headers()["grpc-message"], "no backend available");
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert!(response.body().is_empty(), "trailers-only");
        assert_eq!(code_for(ErrorKind::Connect), 14);
        assert_eq!(code_for(ErrorKind::TlsHandshake), 14);
        assert_eq!(code_for(ErrorKind::RouteTimeout), 4);
        assert_eq!(code_for(ErrorKind::Timeout), 4);
        assert_eq!(code_for(ErrorKind::NoRoute), 12);
    }
}
