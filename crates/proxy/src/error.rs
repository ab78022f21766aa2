//! Why a request could not be proxied, and the response the client gets for it.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use std::{fmt, net::SocketAddr};

/// Which side failed and how: this decides the status code the client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No route matches the request's host and path (404).
    NoRoute,
    /// The request target is longer than `limits.max_uri_length` (414).
    UriTooLong,
    /// The request head has more fields than HTTP/1.1 allows (100): an HTTP/2 request is held to
    /// HTTP/1.1's limit (431).
    HeadTooLarge,
    /// The client's request body was malformed or cut short (400).
    BadRequestBody,
    /// The request's Host is missing (HTTP/1.1), repeated, or not a valid authority; or its target
    /// carries userinfo (400).
    InvalidHost,
    /// The request's path climbs above the root with `..`, or has a `%` without two hex digits (400).
    InvalidPath,
    /// The request's path holds what common backends read differently (an encoded slash or backslash,
    /// a backslash, NUL, escapes that are not UTF-8, `;` parameters before the last segment or on a dot
    /// segment), so it cannot be routed as the backend will read it (400).
    AmbiguousPath,
    /// The request's method is not an upper-case token (`delete`): methods are case-sensitive (RFC 9110
    /// §9.1), so a method route would not see it as `DELETE` while some backends would (400).
    InvalidMethod,
    /// An HTTP/2 request's field value starts or ends with whitespace, which RFC 9113 §8.2.1 calls
    /// malformed: an HTTP/1.1 hop would trim it, so a route and the backend could read different values
    /// (400).
    InvalidHeader,
    /// The request's method is one duet never forwards: `CONNECT` asks for a tunnel to any host, and duet
    /// is no forward proxy (405, with `Allow`).
    MethodNotAllowed,
    /// The request's body uses a transfer coding duet does not decode (501).
    UnknownTransferCoding,
    /// The client stopped sending its request body for longer than `limits.body_read_timeout` (408).
    BodyTimeout,
    /// The client sent its request body slower than `limits.min_upload_rate` (408).
    UploadTooSlow,
    /// The request body is larger than its route's `buffer_request` (413).
    BodyTooLarge,
    /// The cluster has no eligible backend (503).
    NoEligibleBackend,
    /// duet itself ran out of something (file descriptors, memory) to reach the backend (503). Never
    /// counted against a backend.
    LocalResource,
    /// The backend could not be connected to (502).
    Connect,
    /// The TLS handshake with the backend failed: its certificate was refused, or it does not speak
    /// TLS (502). Never retried in plain text.
    TlsHandshake,
    /// The backend did not send response headers within `timeouts.response_headers` (504).
    Timeout,
    /// The route's `timeout` passed before any attempt got a response head (504).
    RouteTimeout,
    /// The backend closed the connection or answered something that is not HTTP (502).
    BadGateway,
    /// The client's address is not one its route's `allow:` lists, or is one its `deny:` lists
    /// (403).
    ClientDenied,
    /// The client (or the route) is over a limit of its route, such as `rate_limit` (429).
    TooManyRequests,
    /// The request did not prove who sent it as its route's `auth:` asks (401, with
    /// `WWW-Authenticate`).
    Unauthorized,
    /// The route's auth service did not answer in time or could not be reached, and the route's
    /// `on_error` is `deny` (503).
    AuthUnavailable,
}

/// The methods duet forwards, as an `Allow` field lists them (a 405, `OPTIONS *`).
pub(crate) const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// A request that could not be proxied.
#[derive(Debug)]
pub struct ProxyError {
    kind: ErrorKind,
    backend: Option<SocketAddr>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ProxyError {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Self {
            kind,
            backend: None,
            source: None,
        }
    }

    pub(crate) fn upstream(
        kind: ErrorKind,
        backend: SocketAddr,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            backend: Some(backend),
            source: Some(source.into()),
        }
    }

    /// What failed.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Why, in the access log's `outcome` field: a short snake_case name.
    pub fn flag(&self) -> &'static str {
        match self.kind {
            ErrorKind::NoRoute => "no_route",
            ErrorKind::UriTooLong => "uri_too_long",
            ErrorKind::HeadTooLarge => "head_too_large",
            ErrorKind::BadRequestBody => "bad_request_body",
            ErrorKind::InvalidHost => "invalid_host",
            ErrorKind::InvalidPath => "invalid_path",
            ErrorKind::AmbiguousPath => "ambiguous_path",
            ErrorKind::InvalidMethod => "invalid_method",
            ErrorKind::InvalidHeader => "invalid_header",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::UnknownTransferCoding => "unknown_transfer_coding",
            ErrorKind::BodyTimeout => "client_body_timeout",
            ErrorKind::UploadTooSlow => "client_upload_too_slow",
            ErrorKind::BodyTooLarge => "request_body_too_large",
            ErrorKind::NoEligibleBackend => "no_eligible_backend",
            ErrorKind::LocalResource => "local_resource",
            ErrorKind::Connect => "connect_failed",
            ErrorKind::TlsHandshake => "backend_tls_failed",
            ErrorKind::Timeout => "response_headers_timeout",
            ErrorKind::RouteTimeout => "route_timeout",
            ErrorKind::BadGateway => "backend_error",
            ErrorKind::ClientDenied => "client_denied",
            ErrorKind::TooManyRequests => "rate_limited",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::AuthUnavailable => "auth_unavailable",
        }
    }

    /// The backend involved, if one was picked.
    pub fn backend(&self) -> Option<SocketAddr> {
        self.backend
    }

    /// The status code the client gets.
    pub fn status(&self) -> StatusCode {
        match self.kind {
            ErrorKind::NoRoute => StatusCode::NOT_FOUND,
            ErrorKind::UriTooLong => StatusCode::URI_TOO_LONG,
            ErrorKind::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorKind::BadRequestBody
            | ErrorKind::InvalidHost
            | ErrorKind::InvalidPath
            | ErrorKind::AmbiguousPath
            | ErrorKind::InvalidMethod
            | ErrorKind::InvalidHeader => StatusCode::BAD_REQUEST,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::UnknownTransferCoding => StatusCode::NOT_IMPLEMENTED,
            ErrorKind::BodyTimeout | ErrorKind::UploadTooSlow => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::NoEligibleBackend
            | ErrorKind::LocalResource
            | ErrorKind::AuthUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Connect | ErrorKind::TlsHandshake | ErrorKind::BadGateway => {
                StatusCode::BAD_GATEWAY
            }
            ErrorKind::Timeout | ErrorKind::RouteTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::ClientDenied => StatusCode::FORBIDDEN,
            ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The error's text on one line (a gRPC error's `grpc-message`).
    pub(crate) fn message(&self) -> &'static str {
        self.text().trim_end()
    }

    fn text(&self) -> &'static str {
        match self.kind {
            ErrorKind::NoRoute => "no route matches this host and path\n",
            ErrorKind::UriTooLong => "request target too long\n",
            ErrorKind::HeadTooLarge => "request header fields too large\n",
            ErrorKind::BadRequestBody => "bad request body\n",
            ErrorKind::InvalidHost => "missing, repeated or invalid Host\n",
            ErrorKind::InvalidPath => "invalid request path\n",
            ErrorKind::AmbiguousPath => "ambiguous request path\n",
            ErrorKind::InvalidMethod => "invalid request method\n",
            ErrorKind::InvalidHeader => "malformed header field\n",
            ErrorKind::MethodNotAllowed => "method not allowed\n",
            ErrorKind::UnknownTransferCoding => "transfer coding not implemented\n",
            ErrorKind::BodyTimeout => "request body not received in time\n",
            ErrorKind::UploadTooSlow => "request body sent too slowly\n",
            ErrorKind::BodyTooLarge => "request body larger than this route accepts\n",
            ErrorKind::NoEligibleBackend => "no backend available\n",
            ErrorKind::LocalResource => "the proxy is out of resources; try again\n",
            ErrorKind::Connect => "backend unreachable\n",
            ErrorKind::TlsHandshake => "TLS handshake with the backend failed\n",
            ErrorKind::Timeout => "backend did not answer in time\n",
            ErrorKind::RouteTimeout => "no answer within the route's timeout\n",
            ErrorKind::BadGateway => "backend closed the connection or sent an invalid response\n",
            ErrorKind::ClientDenied => "this route does not take requests from your address\n",
            ErrorKind::TooManyRequests => "too many requests; try again later\n",
            ErrorKind::Unauthorized => "authentication required\n",
            ErrorKind::AuthUnavailable => "the authentication service is unavailable\n",
        }
    }

    /// The short text response for this error.
    pub fn to_response(&self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::from_static(self.text().as_bytes()));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if self.kind == ErrorKind::MethodNotAllowed {
            // RFC 9110 §15.5.6: a 405 lists the methods the target does support.
            (response.headers_mut())
                .insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
        }
        response
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().trim_end())?;
        if let Some(backend) = self.backend {
            write!(f, " ({backend})")?;
        }
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
            let mut next = source.source();
            while let Some(cause) = next {
                write!(f, ": {cause}")?;
                next = cause.source();
            }
        }
        Ok(())
    }
}

impl std::error::Error for ProxyError {}
