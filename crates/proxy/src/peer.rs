//! Who is at the other end of a client connection.

use std::net::SocketAddr;

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
