//! HAProxy's PROXY protocol (v1 text, v2 binary) on a listener behind an L4 balancer: the header
//! at the start of the connection names the client, whose address then stands for the peer's in
//! `X-Forwarded-For`, the access log, `allow:` lists and rate-limit keys.
//!
//! Exactly the header is read (v2 says its length; v1 ends at its CRLF, read a byte at a time, at
//! most 107), so what follows is left in the socket for TLS or HTTP.

use duet_config::ProxyProtocol;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 header's first 12 bytes.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest v1 header, CRLF included (the spec's 107).
const V1_MAX: usize = 107;

/// The longest v2 address block read (a TLV-laden header may be longer: refused past this).
const V2_MAX: usize = 512;

/// Why a connection's PROXY header was refused (the connection is then closed).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The peer closed or the read failed.
    Io(String),
    /// Not a header of an accepted version.
    Malformed(&'static str),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(error) => write!(f, "reading the PROXY header: {error}"),
            Self::Malformed(why) => write!(f, "not a PROXY header: {why}"),
        }
    }
}

/// Reads the header `accepted` allows from `stream`: the client it names, or `None` when it names
/// none (v2 `LOCAL`, v1 `UNKNOWN`: the balancer's own health check), which keeps the peer's address.
pub(crate) async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    accepted: ProxyProtocol,
) -> Result<Option<SocketAddr>, Refused> {
    let first = stream
        .read_u8()
        .await
        .map_err(|e| Refused::Io(e.to_string()))?;
    match (first, accepted) {
        (b'P', ProxyProtocol::V1 | ProxyProtocol::Any) => read_v1(stream).await,
        (b'\r', ProxyProtocol::V2 | ProxyProtocol::Any) => read_v2(stream).await,
        _ => Err(Refused::Malformed(
            "it starts with neither `PROXY` nor the v2 signature this listener accepts",
        )),
    }
}

async fn read_v1<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<SocketAddr>, Refused> {
    let mut line = vec![b'P'];
    while !line.ends_with(b"\r\n") {
        if line.len() >= V1_MAX {
            return Err(Refused::Malformed("a v1 line longer than 107 bytes"));
        }
        line.push(
            stream
                .read_u8()
                .await
                .map_err(|e| Refused::Io(e.to_string()))?,
        );
    }
    parse_v1(&line)
}

/// A whole v1 line, CRLF included: `PROXY TCP4 SRC DST SPORT DPORT\r\n` or `PROXY UNKNOWN ...\r\n`.
fn parse_v1(line: &[u8]) -> Result<Option<SocketAddr>, Refused> {
    let text = std::str::from_utf8(line).map_err(|_| Refused::Malformed("v1 line not ASCII"))?;
    let text = text.strip_suffix("\r\n").unwrap_or(text);
    let mut words = text.split(' ');
    if words.next() != Some("PROXY") {
        return Err(Refused::Malformed("v1 line not starting `PROXY `"));
    }
    let family = words.next();
    if family == Some("UNKNOWN") {
        return Ok(None);
    }
    let fields: Vec<&str> = words.collect();
    let [source, _destination, port, _destination_port] = fields[..] else {
        return Err(Refused::Malformed(
            "v1 line without four addresses and ports",
        ));
    };
    let ip: IpAddr = source
        .parse()
        .map_err(|_| Refused::Malformed("v1 source not an IP"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| Refused::Malformed("v1 source port not a port"))?;
    match (family, ip) {
        (Some("TCP4"), IpAddr::V4(_)) | (Some("TCP6"), IpAddr::V6(_)) => {
            Ok(Some(SocketAddr::new(ip, port)))
        }
        _ => Err(Refused::Malformed(
            "v1 family not TCP4/TCP6 with its kind of address",
        )),
    }
}

async fn read_v2<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<SocketAddr>, Refused> {
    let mut fixed = [0u8; 16];
    fixed[0] = b'\r';
    stream
        .read_exact(&mut fixed[1..])
        .await
        .map_err(|e| Refused::Io(e.to_string()))?;
    let length = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if length > V2_MAX {
        return Err(Refused::Malformed("a v2 address block over 512 bytes"));
    }
    let mut block = vec![0u8; length];
    stream
        .read_exact(&mut block)
        .await
        .map_err(|e| Refused::Io(e.to_string()))?;
    parse_v2(&fixed, &block)
}

/// The v2 header: its 16 fixed bytes and the address block they announce.
fn parse_v2(fixed: &[u8; 16], block: &[u8]) -> Result<Option<SocketAddr>, Refused> {
    if fixed[..12] != V2_SIGNATURE {
        return Err(Refused::Malformed("v2 signature wrong"));
    }
    let (version, command) = (fixed[12] >> 4, fixed[12] & 0x0f);
    if version != 2 {
        return Err(Refused::Malformed("v2 header of another version"));
    }
    match command {
        0 => return Ok(None),
        1 => {}
        _ => return Err(Refused::Malformed("v2 command neither LOCAL nor PROXY")),
    }
    let port = |at: usize| u16::from_be_bytes([block[at], block[at + 1]]);
    // The family in the high nibble; the low one is the transport (any: the address is what counts).
    match fixed[13] >> 4 {
        1 if block.len() >= 12 => {
            let ip = Ipv4Addr::new(block[0], block[1], block[2], block[3]);
            Ok(Some(SocketAddr::new(ip.into(), port(8))))
        }
        2 if block.len() >= 36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&block[..16]);
            Ok(Some(SocketAddr::new(
                Ipv6Addr::from(octets).into(),
                port(32),
            )))
        }
        // AF_UNSPEC or AF_UNIX: no IP to take.
        0 | 3 => Ok(None),
        _ => Err(Refused::Malformed("v2 address block short for its family")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(
        bytes: &[u8],
        accepted: ProxyProtocol,
    ) -> (Result<Option<SocketAddr>, Refused>, Vec<u8>) {
        let mut stream = bytes;
        let found = read_header(&mut stream, accepted).await;
        (found, stream.to_vec())
    }

    #[tokio::test]
    async fn v1_names_the_client_and_leaves_the_request() {
        let (found, rest) = read(
            b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 443\r\nGET /",
            ProxyProtocol::V1,
        )
        .await;
        assert_eq!(found, Ok(Some("192.0.2.7:51234".parse().expect("address"))));
        assert_eq!(rest, b"GET /");
        let (found, _) = read(b"PROXY TCP6 2001:db8::1 ::1 9 443\r\n", ProxyProtocol::Any).await;
        assert_eq!(found, Ok(Some("[2001:db8::1]:9".parse().expect("address"))));
        let (found, rest) = read(b"PROXY UNKNOWN\r\nx", ProxyProtocol::V1).await;
        assert_eq!((found, rest), (Ok(None), b"x".to_vec()));
    }

    fn v2(command: u8, family: u8, block: &[u8]) -> Vec<u8> {
        let mut header = V2_SIGNATURE.to_vec();
        header.extend([0x20 | command, family]);
        header.extend(u16::try_from(block.len()).expect("short").to_be_bytes());
        header.extend(block);
        header
    }

    #[tokio::test]
    async fn v2_names_the_client_and_leaves_the_request() {
        let mut block = vec![198, 51, 100, 9, 10, 0, 0, 1];
        block.extend(40000u16.to_be_bytes());
        block.extend(443u16.to_be_bytes());
        block.extend([0x04, 0, 1, 0xff]); // a TLV after the addresses
        let mut bytes = v2(1, 0x11, &block);
        bytes.extend(b"\x16\x03\x01");
        let (found, rest) = read(&bytes, ProxyProtocol::V2).await;
        assert_eq!(
            found,
            Ok(Some("198.51.100.9:40000".parse().expect("address")))
        );
        assert_eq!(rest, b"\x16\x03\x01");
        let mut block = [0u8; 36].to_vec();
        block[15] = 1;
        block[32..34].copy_from_slice(&7u16.to_be_bytes());
        let (found, _) = read(&v2(1, 0x21, &block), ProxyProtocol::Any).await;
        assert_eq!(found, Ok(Some("[::1]:7".parse().expect("address"))));
        let (found, _) = read(&v2(0, 0x00, &[]), ProxyProtocol::V2).await;
        assert_eq!(found, Ok(None), "LOCAL keeps the peer");
    }

    #[tokio::test]
    async fn garbage_the_other_version_and_short_headers_are_refused() {
        let cases: [(&[u8], ProxyProtocol); 6] = [
            (b"GET / HTTP/1.1\r\n\r\n", ProxyProtocol::Any),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", ProxyProtocol::V2),
            (b"PROXY TCP4 ::1 ::1 1 2\r\n", ProxyProtocol::V1),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", ProxyProtocol::V1),
            (&[b'P'; 200], ProxyProtocol::V1),
            (b"PROXY TCP4 1.2.3.4", ProxyProtocol::V1),
        ];
        for (bytes, accepted) in cases {
            let (found, _) = read(bytes, accepted).await;
            assert!(
                found.is_err(),
                "{:?}: {found:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let mut v2_short = v2(1, 0x11, &[1, 2, 3]);
        v2_short.truncate(18);
        assert!(read(&v2_short, ProxyProtocol::V2).await.0.is_err());
        assert!(read(&v2(1, 0x11, &[1, 2, 3]), ProxyProtocol::V2)
            .await
            .0
            .is_err());
        assert!(read(&v2(1, 0x11, &[1, 2, 3]), ProxyProtocol::V1)
            .await
            .0
            .is_err());
    }
}
