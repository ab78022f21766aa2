//! The PROXY protocol header duet sends first on a new connection to a `send_proxy_protocol:`
//! cluster's backend (HAProxy's `send-proxy` and `send-proxy-v2`): the client the connection is for
//! as the source, the backend as the destination. Written before TLS, as HAProxy and Envoy do.
//!
//! A connection without a client (a health check) says so: `PROXY UNKNOWN` in v1, the `LOCAL`
//! command in v2, which readers take as the balancer speaking for itself.

use duet_config::SendProxyProtocol;
use std::net::{IpAddr, SocketAddr};

/// The v2 header's first 12 bytes.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The header for a connection to `backend` on behalf of `client` (`None`: on duet's own behalf).
/// Both addresses are written in one family: an IPv4 one beside an IPv6 one becomes IPv4-mapped.
pub(crate) fn header(
    version: SendProxyProtocol,
    client: Option<SocketAddr>,
    backend: SocketAddr,
) -> Vec<u8> {
    let pair = client.map(|client| same_family(client, backend));
    match version {
        SendProxyProtocol::V1 => v1(pair),
        SendProxyProtocol::V2 => v2(pair),
    }
}

/// `source` and `destination` in one family: IPv4 when both are, else IPv6.
fn same_family(source: SocketAddr, destination: SocketAddr) -> (SocketAddr, SocketAddr) {
    let v6 = |address: SocketAddr| match address.ip() {
        IpAddr::V4(ip) => SocketAddr::new(ip.to_ipv6_mapped().into(), address.port()),
        IpAddr::V6(_) => address,
    };
    if source.is_ipv4() && destination.is_ipv4() {
        (source, destination)
    } else {
        (v6(source), v6(destination))
    }
}

fn v1(pair: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let Some((source, destination)) = pair else {
        return b"PROXY UNKNOWN\r\n".to_vec();
    };
    let family = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {family} {} {} {} {}\r\n",
        source.ip(),
        destination.ip(),
        source.port(),
        destination.port()
    )
    .into_bytes()
}

fn v2(pair: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let mut header = V2_SIGNATURE.to_vec();
    let Some((source, destination)) = pair else {
        // Version 2, LOCAL; AF_UNSPEC; no address block.
        header.extend([0x20, 0x00, 0, 0]);
        return header;
    };
    // Version 2, PROXY; then the family (INET 1, INET6 2) with STREAM (1).
    header.push(0x21);
    let mut block = Vec::with_capacity(36);
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(from), IpAddr::V4(to)) => {
            header.push(0x11);
            block.extend(from.octets());
            block.extend(to.octets());
        }
        (from, to) => {
            header.push(0x21);
            block.extend(v6_octets(from));
            block.extend(v6_octets(to));
        }
    }
    block.extend(source.port().to_be_bytes());
    block.extend(destination.port().to_be_bytes());
    // 12 or 36 bytes: always fits.
    let length = u16::try_from(block.len()).unwrap_or(u16::MAX);
    header.extend(length.to_be_bytes());
    header.extend(block);
    header
}

fn v6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
        IpAddr::V6(ip) => ip.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    #[test]
    fn v1_names_the_client_then_the_backend() {
        let backend = address("10.0.0.1:8080");
        let header = header(
            SendProxyProtocol::V1,
            Some(address("192.0.2.7:51234")),
            backend,
        );
        assert_eq!(header, b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 8080\r\n");
        let header = super::header(
            SendProxyProtocol::V1,
            Some(address("[2001:db8::1]:9")),
            backend,
        );
        assert_eq!(
            header,
            b"PROXY TCP6 2001:db8::1 ::ffff:10.0.0.1 9 8080\r\n".to_vec()
        );
        let header = super::header(SendProxyProtocol::V1, None, backend);
        assert_eq!(header, b"PROXY UNKNOWN\r\n");
    }

    #[test]
    fn v2_names_the_client_then_the_backend_in_binary() {
        let backend = address("10.0.0.1:8080");
        let header = header(
            SendProxyProtocol::V2,
            Some(address("192.0.2.7:51234")),
            backend,
        );
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend([0x21, 0x11, 0, 12, 192, 0, 2, 7, 10, 0, 0, 1]);
        expected.extend(51234u16.to_be_bytes());
        expected.extend(8080u16.to_be_bytes());
        assert_eq!(header, expected);

        let header = super::header(SendProxyProtocol::V2, Some(address("[::1]:7")), backend);
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend([0x21, 0x21, 0, 36]);
        expected.extend(std::net::Ipv6Addr::LOCALHOST.octets());
        expected.extend([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
        expected.extend(7u16.to_be_bytes());
        expected.extend(8080u16.to_be_bytes());
        assert_eq!(header, expected);

        let header = super::header(SendProxyProtocol::V2, None, backend);
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend([0x20, 0x00, 0, 0]);
        assert_eq!(header, expected);
    }
}
