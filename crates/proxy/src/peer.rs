//! Who is at the other end of a client connection.

use http::HeaderMap;
use std::net::{IpAddr, SocketAddr};

/// Who is at the other end of a client connection, as its listener saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The peer's address.
    pub address: SocketAddr,
    /// Whether the connection is TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// Whether the peer is one of the listener's `trusted_proxies`, whose forwarding fields are kept.
    /// Decided again for each request against the listener's list in force then (a reload may have
    /// revoked it while the connection stayed open): what is given here holds until the first request.
    pub trusted: bool,
    /// The listener it came on: its index in the config's `listeners` (routes may be limited to
    /// some; a reload keeps every listener in its place).
    pub listener: usize,
}

/// The client as the first trusted proxy saw it: the last `X-Forwarded-For` entry when the peer is
/// trusted (nginx's `real_ip_header X-Forwarded-For` without recursion), the peer otherwise. The
/// one address the access log names and every per-client decision (`allow:`, `rate_limit:`) is
/// taken on: an untrusted peer's `X-Forwarded-For` never changes it.
pub(crate) fn original_client(headers: &HeaderMap, client: Client) -> IpAddr {
    if !client.trusted {
        return client.address.ip();
    }
    headers
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(client.address.ip())
}

/// What a TLS client connection negotiated, read once when its handshake is done and shared by its
/// requests (the access log's `tls_version` and `sni`). Plain connections have none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSession {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: &'static str,
    /// The server name the client asked for, if it sent one.
    pub sni: Option<std::sync::Arc<str>>,
}
