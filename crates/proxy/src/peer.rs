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

/// [`original_client`] as a socket address, for a PROXY header: the peer's own (its port too), or the
/// address a trusted proxy forwarded, with port 0 (`X-Forwarded-For` names no port).
pub(crate) fn original_client_address(headers: &HeaderMap, client: Client) -> SocketAddr {
    let ip = original_client(headers, client);
    if ip == client.address.ip() {
        client.address
    } else {
        SocketAddr::new(ip, 0)
    }
}

/// The client as the first trusted proxy saw it: the last `X-Forwarded-For` entry when the peer is
/// trusted (nginx's `real_ip_header X-Forwarded-For` without recursion), the peer otherwise. The
/// one address the access log names and every per-client decision (`allow:`, `rate_limit:`) is
/// taken on: an untrusted peer's `X-Forwarded-For` never changes it.
///
/// Inlined: most peers are not trusted, and their answer is a copy of the peer's address, less than
/// the call would cost (a line of the access log and each per-client decision take it per request).
#[inline(always)]
pub(crate) fn original_client(headers: &HeaderMap, client: Client) -> IpAddr {
    if !client.trusted {
        return client.address.ip();
    }
    forwarded_client(headers, client)
}

/// [`original_client`] of a trusted peer: out of line, the untrusted path's code stays small.
#[inline(never)]
fn forwarded_client(headers: &HeaderMap, client: Client) -> IpAddr {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_a_proxy_header_names_is_the_peer_s_unless_a_trusted_proxy_forwarded_one() {
        let peer: SocketAddr = "10.0.0.5:40000".parse().expect("address");
        let client = |trusted| Client {
            address: peer,
            tls: false,
            trusted,
            listener: 0,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "203.0.113.7, 198.51.100.2".parse().expect("value"),
        );
        assert_eq!(original_client_address(&headers, client(false)), peer);
        let forwarded: SocketAddr = "198.51.100.2:0".parse().expect("address");
        assert_eq!(original_client_address(&headers, client(true)), forwarded);
        assert_eq!(
            original_client_address(&HeaderMap::new(), client(true)),
            peer
        );
    }
}
