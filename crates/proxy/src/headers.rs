//! Header rules of a forwarding proxy (RFC 9110 §7.6): hop-by-hop fields stop here; forwarding fields
//! are added.

use http::{header, HeaderMap, HeaderName, HeaderValue};
use std::{fmt::Write, net::IpAddr};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Whether the request asks for a protocol upgrade that duet tunnels: `Connection: upgrade` with an
/// `Upgrade` other than `h2c` (HTTP/2 over cleartext is not upgraded: the request is forwarded as plain
/// HTTP/1.1).
pub(crate) fn wants_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v, "upgrade"));
    let protocol = headers.get(header::UPGRADE);
    connection_upgrade && protocol.is_some_and(|p| !has_token(p, "h2c"))
}

fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .map(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        .unwrap_or(false)
}

/// Removes hop-by-hop fields: `Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
/// `TE`, `Transfer-Encoding` (the message is re-framed) and, unless `upgrading`, `Upgrade`. When
/// upgrading, `Connection: upgrade` is put back so the next hop sees the request.
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, upgrading: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(upgrading && name == header::UPGRADE) {
            headers.remove(&name);
        }
    }
    headers.remove(header::CONNECTION);
    headers.remove(&KEEP_ALIVE);
    headers.remove(&PROXY_CONNECTION);
    headers.remove(header::TE);
    headers.remove(header::TRANSFER_ENCODING);
    if upgrading {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// Appends the client to `X-Forwarded-For` (keeping what earlier proxies wrote) and sets
/// `X-Forwarded-Proto` and `X-Forwarded-Host`. `Host` is left as the client sent it.
pub(crate) fn add_forwarding(
    headers: &mut HeaderMap,
    client: IpAddr,
    host: Option<HeaderValue>,
    secure: bool,
) {
    // One string for the whole chain: earlier hops as they came, then this client.
    let mut chain = String::with_capacity(48);
    for earlier in headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
    {
        chain.push_str(earlier);
        chain.push_str(", ");
    }
    let _ = write!(chain, "{client}");
    if let Ok(value) = HeaderValue::from_str(&chain) {
        headers.insert(X_FORWARDED_FOR.clone(), value);
    }
    let proto = if secure { "https" } else { "http" };
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    match host {
        Some(host) => {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
        None => {
            headers.remove(&X_FORWARDED_HOST);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        map
    }

    #[test]
    fn connection_named_fields_are_removed() {
        let mut h = headers(&[
            ("connection", "close, x-secret"),
            ("connection", "keep-alive"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        remove_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["x-kept"]);
    }

    #[test]
    fn upgrade_survives_when_upgrading() {
        let mut h = headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(wants_upgrade(&h));
        remove_hop_by_hop(&mut h, true);
        assert_eq!(
            h.get("upgrade").map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            h.get("connection").map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }

    #[test]
    fn h2c_is_not_upgraded() {
        let h = headers(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ]);
        assert!(!wants_upgrade(&h));
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = headers(&[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-for", "10.1.1.1"),
        ]);
        add_forwarding(
            &mut h,
            "127.0.0.1".parse().expect("ip"),
            Some(HeaderValue::from_static("example.com")),
            false,
        );
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 10.1.1.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com");
    }
}
