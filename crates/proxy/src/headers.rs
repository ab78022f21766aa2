//! Header rules of a forwarding proxy (RFC 9110 §7.6): hop-by-hop fields stop here; forwarding fields
//! are added.

use crate::request_id::X_REQUEST_ID;
use http::{header, header::Entry, HeaderMap, HeaderName, HeaderValue, Version};
use std::{cell::RefCell, net::IpAddr, sync::Arc};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
/// `Proxy`: no standard field, but CGI-style backends read it as the `HTTP_PROXY` variable and send
/// their own outbound requests through whatever it names (httpoxy, CVE-2016-5385).
const PROXY: HeaderName = HeaderName::from_static("proxy");

/// The most fields a request head may have, whatever its protocol: hyper's HTTP/1.1 parser refuses
/// more (its default `max_headers`, with 431), and an HTTP/2 request is held to the same (each field
/// of its header list counts, a split `Cookie`'s crumbs too), so no backend gets from one protocol a
/// head the other would have refused.
pub(crate) const MAX_REQUEST_FIELDS: usize = 100;

/// The protocols duet tunnels after a `101 Switching Protocols`. HTTP/2 over cleartext (`h2c`) is never
/// one of them: a request offering it is forwarded as plain HTTP/1.1.
const TUNNELLED: &[&str] = &["websocket"];

/// Fields a backend cannot strip by naming them in `Connection`: duet routes and frames by them.
static PROTECTED: [HeaderName; 2] = [header::HOST, header::CONTENT_LENGTH];

/// Fields a client cannot strip by naming them in `Connection`: those duet routes and frames by, and
/// those it sets or vouches for (the request id the access log records, the forwarding fields), since
/// hop-by-hop fields are removed after they are set.
static PROTECTED_IN_REQUESTS: [HeaderName; 7] = [
    header::HOST,
    header::CONTENT_LENGTH,
    X_REQUEST_ID,
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_HOST,
    X_REAL_IP,
];

/// Which of the fields a request seldom carries, but that prepare must look for, it holds: found in one
/// pass over its few names (an enum comparison each, for standard names), so that each absent one
/// costs no hashed look-up.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Seldom {
    pub(crate) transfer_encoding: bool,
    pub(crate) upgrade: bool,
    pub(crate) expect: bool,
    pub(crate) trailer: bool,
}

impl Seldom {
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let mut seldom = Self::default();
        for name in headers.keys() {
            if *name == header::TRANSFER_ENCODING {
                seldom.transfer_encoding = true;
            } else if *name == header::UPGRADE {
                seldom.upgrade = true;
            } else if *name == header::EXPECT {
                seldom.expect = true;
            } else if *name == header::TRAILER {
                seldom.trailer = true;
            }
        }
        seldom
    }
}

/// Whether `headers` holds `name`, by a pass over its names: for a field usually among the first a
/// client sends (Host), cheaper than a hashed look-up.
pub(crate) fn has(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers.keys().any(|present| present == name)
}

/// Whether `headers` may hold `name`, a field seldom sent (`grpc-status` in a plain response,
/// `X-Forwarded-Client-Cert` from a client): `false` when a pass over a head's few names finds it
/// absent. The hashed look-up costs about 180 instructions, present or not; the pass a few a name,
/// most names telling themselves apart by their kind (standard or not) alone.
pub(crate) fn may_hold(headers: &HeaderMap, name: &HeaderName) -> bool {
    const SCANNED: usize = 12;
    headers.keys_len() > SCANNED || has(headers, name)
}

/// The protocol a request may upgrade to: it must be HTTP/1.1 (RFC 9110 §7.8: an HTTP/1.0 Upgrade is
/// ignored), say `Connection: upgrade`, and offer, in any of its `Upgrade` fields, a protocol duet
/// tunnels. The first such protocol is the only one forwarded.
pub(crate) fn upgrade_protocol(headers: &HeaderMap, version: Version) -> Option<HeaderValue> {
    if version != Version::HTTP_11 || !headers.contains_key(header::UPGRADE) {
        return None;
    }
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v, "upgrade"));
    if !connection_upgrade {
        return None;
    }
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find(|offered| {
            let name = offered.split('/').next().unwrap_or_default();
            TUNNELLED.iter().any(|p| p.eq_ignore_ascii_case(name))
        })
        .and_then(|offered| HeaderValue::from_str(offered).ok())
}

/// Whether a backend's `101` switches to `protocol`, the one the request offered.
pub(crate) fn switches_to(headers: &HeaderMap, protocol: &HeaderValue) -> bool {
    let mut upgrades = headers.get_all(header::UPGRADE).iter();
    let only = upgrades.next();
    upgrades.next().is_none()
        && only.is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(protocol.as_bytes()))
}

fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .map(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        .unwrap_or(false)
}

/// Removes a response's hop-by-hop fields: `Connection` and every field it names (except
/// [`PROTECTED`] ones), `Keep-Alive`, `Proxy-Connection`, `TE`, `Transfer-Encoding` (the message is
/// re-framed) and `Upgrade`. With `upgrade`, the client is told of that protocol alone
/// (`Connection: upgrade`).
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, upgrade: Option<HeaderValue>) {
    // All but `Proxy`, which means nothing in a response.
    strip(headers, upgrade, false, &PROTECTED);
}

/// Removes a request's hop-by-hop fields as [`remove_hop_by_hop`] does, and `Proxy`; `Connection`
/// cannot name the [`PROTECTED_IN_REQUESTS`] fields. With `upgrade`, the backend is asked for that
/// protocol alone.
pub(crate) fn remove_request_hop_by_hop(headers: &mut HeaderMap, upgrade: Option<HeaderValue>) {
    strip(headers, upgrade, true, &PROTECTED_IN_REQUESTS);
}

/// Removes `Connection` (the first of [`HOP_BY_HOP`]) and the fields it names but `protected`, then the
/// rest of [`HOP_BY_HOP`] (`Proxy` only `with_proxy`).
fn strip(
    headers: &mut HeaderMap,
    upgrade: Option<HeaderValue>,
    with_proxy: bool,
    protected: &[HeaderName],
) {
    let stripped = if with_proxy {
        &HOP_BY_HOP[..]
    } else {
        &HOP_BY_HOP[..HOP_BY_HOP.len() - 1]
    };
    if upgrade.is_none() && !headers.keys().any(|name| is_hop_by_hop(name, with_proxy)) {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .filter(|name| !protected.contains(name))
            .collect();
        for name in named {
            headers.remove(&name);
        }
        headers.remove(header::CONNECTION);
    }
    for name in &stripped[1..] {
        headers.remove(name);
    }
    if let Some(protocol) = upgrade {
        headers.insert(header::UPGRADE, protocol);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The hop-by-hop fields every message loses (`Connection` first: the fields it names go too), and
/// last the one only requests lose ([`PROXY`]).
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    PROXY,
];

/// Whether `name` is one of [`HOP_BY_HOP`] (`Proxy` only `with_proxy`). Most messages hold none, and
/// a match on each present name's text costs less than comparing it with every name of the list (a
/// test keeps the two in step).
fn is_hop_by_hop(name: &HeaderName, with_proxy: bool) -> bool {
    match name.as_str() {
        "connection" | "keep-alive" | "proxy-connection" | "te" | "transfer-encoding"
        | "upgrade" => true,
        "proxy" => with_proxy,
        _ => false,
    }
}

/// Whether `name` is one of [`FORWARDING`], as [`is_hop_by_hop`] checks its list.
fn is_forwarding(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "x-forwarded-for"
            | "x-forwarded-proto"
            | "x-forwarded-host"
            | "x-forwarded-port"
            | "x-real-ip"
            | "forwarded"
    )
}

/// Whether `headers` holds any field of `names`. Most messages hold none of the fields a proxy strips,
/// and one pass over the few names present (an enum comparison each, for standard names) costs less
/// than a hashed look-up per name stripped.
fn any_of(headers: &HeaderMap, names: &[HeaderName]) -> bool {
    headers.keys().any(|present| names.contains(present))
}

/// Takes out of a client's request the fields no client sets: any `X-Forwarded-Client-Cert` (its
/// connection's own, `certificate`, when its client presented one, goes in its place) and, when
/// `underscores` says so, the names with an underscore ([`remove_underscored`]), saying how many of
/// those went. One pass over the names tells both absent, in most requests: each looked for on its
/// own was a pass (or a hashed look-up) of its own, every request.
pub(crate) fn scrub_client_fields(
    headers: &mut HeaderMap,
    certificate: Option<&HeaderValue>,
    underscores: bool,
) -> u64 {
    let certificate_name = &crate::client_cert::X_FORWARDED_CLIENT_CERT;
    let (mut sent_certificate, mut underscored) = (false, false);
    for name in headers.keys() {
        sent_certificate |= name == certificate_name;
        underscored |= underscores && has_underscore(name);
    }
    match certificate {
        Some(value) => {
            headers.insert(certificate_name, value.clone());
        }
        None if sent_certificate => {
            headers.remove(certificate_name);
        }
        None => {}
    }
    if underscored {
        remove_underscored(headers)
    } else {
        0
    }
}

/// Whether a field name holds an underscore; a byte loop rather than `contains`, which calls `memchr`
/// for each name.
fn has_underscore(name: &HeaderName) -> bool {
    name.as_str().bytes().any(|b| b == b'_')
}

/// Removes the fields whose name holds an underscore (`X_Forwarded_For`), and says how many went. A CGI
/// or WSGI backend reads each field as `HTTP_` and its name upper-cased with `-` as `_`, so such a name
/// reaches it as the hyphenated field duet scrubs, sets or a route edits, past every rule that goes by
/// name; nginx drops them by default too. One pass over the names finds none in most requests.
pub(crate) fn remove_underscored(headers: &mut HeaderMap) -> u64 {
    if !headers.keys().any(has_underscore) {
        return 0;
    }
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| has_underscore(n))
        .cloned()
        .collect();
    let mut removed = 0;
    for name in names {
        removed += headers.get_all(&name).iter().count() as u64;
        headers.remove(&name);
    }
    removed
}

/// Whether a field value starts or ends with a space or tab: RFC 9113 §8.2.1 calls such an HTTP/2
/// request malformed (HTTP/1.1's parser trims what it reads, so only HTTP/2 can carry one), and a route
/// matching the value and a backend trimming it would read two values.
pub(crate) fn padded_value(headers: &HeaderMap) -> bool {
    headers.values().any(|value| {
        let bytes = value.as_bytes();
        let blank = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
        blank(bytes.first()) || blank(bytes.last())
    })
}

/// Joins an HTTP/2 request's `cookie` fields into one, separated by `; `: RFC 9113 §8.2.3 lets HTTP/2
/// split the cookie into fields for compression and says they MUST be joined before an HTTP/1.1 hop,
/// where a request carries one Cookie field (RFC 6265 §5.4) and many servers read only the first.
pub(crate) fn join_cookies(headers: &mut HeaderMap) {
    let Entry::Occupied(mut cookies) = headers.entry(header::COOKIE) else {
        return;
    };
    let mut crumbs = cookies.iter();
    let (Some(first), Some(_)) = (crumbs.next(), crumbs.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for crumb in cookies.iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(crumb.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(joined)) {
        cookies.insert(value);
    }
}

/// Why a message's `Transfer-Encoding` cannot be relayed: duet decodes `chunked` and nothing else.
pub(crate) fn unknown_transfer_coding(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .any(|value| match value.to_str() {
            Ok(codings) => codings
                .split(',')
                .any(|coding| !coding.trim().eq_ignore_ascii_case("chunked")),
            Err(_) => true,
        })
}

/// The forwarding fields a client can forge.
static FORWARDING: [HeaderName; 6] = [
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_HOST,
    HeaderName::from_static("x-forwarded-port"),
    X_REAL_IP,
    header::FORWARDED,
];

/// Fields a request's trailers cannot carry (RFC 9110 §6.5.1: framing, routing, authentication,
/// request modifiers, content format are read from the header section before the content): duet
/// scrubs and sets the forwarding and identity fields in the head only, so a trailer copy would reach
/// a backend that merges trailers into its headers unscrubbed.
static NOT_IN_TRAILERS: [HeaderName; 32] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    PROXY,
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_HOST,
    HeaderName::from_static("x-forwarded-port"),
    X_REAL_IP,
    header::FORWARDED,
    X_REQUEST_ID,
    header::HOST,
    header::CONTENT_LENGTH,
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::TRAILER,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::EXPECT,
    header::MAX_FORWARDS,
    header::RANGE,
    header::CACHE_CONTROL,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// Drops the trailer fields of [`NOT_IN_TRAILERS`]; the others go on to the backend.
pub(crate) fn remove_forbidden_trailers(trailers: &mut HeaderMap) {
    if any_of(trailers, &NOT_IN_TRAILERS) {
        for name in &NOT_IN_TRAILERS {
            trailers.remove(name);
        }
    }
}

/// What a request's trailers lose besides [`NOT_IN_TRAILERS`]: every field the route's request edits
/// set or remove, and names with an underscore where the head loses them. A backend that merges
/// trailers into its headers (many do) would otherwise read `X-User-Role: admin` past a route that sets
/// it, or the `X-Debug` it removes: a trailer may carry only what the head could.
///
/// Why not drop request trailers altogether, as nginx (which never forwards them) and Envoy (HTTP/1
/// by default) do: duet has forwarded end-to-end trailers (an upload's checksum) until now, and none
/// of them reaches further than its head would.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrailerScrub {
    /// The names the route's request edits set or remove, parsed once per config.
    edited: Arc<[HeaderName]>,
    /// Names with an underscore go too (the listener drops them from the head).
    underscored: bool,
}

impl TrailerScrub {
    /// For a route whose request edits set `set` and remove `removed` (names as the config checked).
    pub(crate) fn new<'a>(
        set: impl Iterator<Item = &'a str>,
        removed: impl Iterator<Item = &'a str>,
    ) -> Self {
        let edited = (set.chain(removed))
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        Self {
            edited,
            underscored: false,
        }
    }

    /// This scrub for a request whose listener drops names with an underscore, or keeps them.
    pub(crate) fn with_underscores_dropped(&self, dropped: bool) -> Self {
        Self {
            edited: self.edited.clone(),
            underscored: dropped,
        }
    }

    /// Drops from `trailers` what the head could not carry.
    pub(crate) fn apply(&self, trailers: &mut HeaderMap) {
        remove_forbidden_trailers(trailers);
        for name in self.edited.iter() {
            trailers.remove(name);
        }
        if self.underscored {
            remove_underscored(trailers);
        }
    }
}

thread_local! {
    /// The last client address this worker formatted, and its text: a keep-alive connection's requests
    /// all come from one address, so formatting it once per run of requests is enough.
    static LAST_ADDRESS: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
}

/// `client` as a field value (its text; a clone of the last one made when the address repeats).
fn address_value(client: IpAddr) -> HeaderValue {
    LAST_ADDRESS.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((address, value)) = last.as_ref() {
            if *address == client {
                return value.clone();
            }
        }
        let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(client.to_string()))
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        *last = Some((client, value.clone()));
        value
    })
}

/// Sets `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Forwarded-Host`. From a `trusted` peer (another
/// proxy listed in the listener's `trusted_proxies`) the `X-Forwarded-For` chain is kept and this client
/// appended, and its `X-Forwarded-Proto` and `X-Forwarded-Host` are kept when it sent them (a TLS front
/// proxy's `https` is how the client came in; duet's own hop may be plain); from anyone else every forwarding field the client sent (`X-Forwarded-*`, `Forwarded`,
/// `X-Real-IP`) is dropped and rebuilt from what duet saw, so a client cannot forge its address.
pub(crate) fn add_forwarding(
    headers: &mut HeaderMap,
    client: IpAddr,
    host: Option<HeaderValue>,
    secure: bool,
    trusted: bool,
) {
    let proto = if secure { "https" } else { "http" };
    if trusted {
        add_trusted_forwarding(headers, client, host, proto);
        return;
    }
    if headers.keys().any(is_forwarding) {
        for name in &FORWARDING {
            headers.remove(name);
        }
    }
    // None of the forwarding fields is left: each goes in as a new field.
    headers.insert(X_FORWARDED_FOR, address_value(client));
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// [`add_forwarding`] for a trusted peer: one hashed look-up per field (its entry), whether it is kept,
/// extended or set. Apart, so that the untrusted path's code stays as lean as before it.
#[inline(never)]
fn add_trusted_forwarding(
    headers: &mut HeaderMap,
    client: IpAddr,
    host: Option<HeaderValue>,
    proto: &'static str,
) {
    match headers.entry(X_FORWARDED_FOR) {
        Entry::Occupied(mut earlier) => {
            // One value for the whole chain: earlier hops as they came, then this client.
            let mut chain = Vec::with_capacity(48);
            for hop in earlier.iter().filter(|v| v.to_str().is_ok()) {
                chain.extend_from_slice(hop.as_bytes());
                chain.extend_from_slice(b", ");
            }
            chain.extend_from_slice(address_value(client).as_bytes());
            if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(chain)) {
                earlier.insert(value);
            }
        }
        Entry::Vacant(none) => {
            none.insert(address_value(client));
        }
    }
    if let Entry::Vacant(none) = headers.entry(X_FORWARDED_PROTO) {
        none.insert(HeaderValue::from_static(proto));
    }
    if let (Entry::Vacant(none), Some(host)) = (headers.entry(X_FORWARDED_HOST), host) {
        none.insert(host);
    }
}

/// Whether the response's `Vary` already names `by` (or is `*`).
pub(crate) fn varies_by(headers: &http::HeaderMap, by: &http::HeaderValue) -> bool {
    (headers.get_all(http::header::VARY).iter())
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|v| v.eq_ignore_ascii_case(by.as_bytes()) || v == b"*")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_matches_agree_with_the_lists() {
        for name in &HOP_BY_HOP[..HOP_BY_HOP.len() - 1] {
            assert!(
                is_hop_by_hop(name, false) && is_hop_by_hop(name, true),
                "{name}"
            );
        }
        assert!(is_hop_by_hop(&PROXY, true) && !is_hop_by_hop(&PROXY, false));
        for name in &FORWARDING {
            assert!(is_forwarding(name), "{name}");
        }
        let others = [
            "host",
            "content-length",
            "date",
            "x-backend",
            "x-request-id",
            "proxy-authorization",
            "connectionx",
            "tes",
            "user-agent",
            "x-forwarded",
            "forwarded-for",
        ];
        for other in others {
            let name = HeaderName::from_static(other);
            assert!(!is_hop_by_hop(&name, true), "{other}");
            assert!(!is_forwarding(&name), "{other}");
        }
    }

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
    fn the_one_pass_finds_exactly_the_seldom_fields_present() {
        let plain = headers(&[("host", "a"), ("accept", "*/*"), ("x-trailer", "1")]);
        let seldom = Seldom::of(&plain);
        assert!(!seldom.transfer_encoding && !seldom.upgrade && !seldom.expect && !seldom.trailer);
        assert!(has(&plain, &header::HOST));
        assert!(!has(&plain, &header::TRAILER));
        let all = headers(&[
            ("Transfer-Encoding", "chunked"),
            ("upgrade", "websocket"),
            ("EXPECT", "100-continue"),
            ("trailer", "x"),
        ]);
        let seldom = Seldom::of(&all);
        assert!(seldom.transfer_encoding && seldom.upgrade && seldom.expect && seldom.trailer);
        assert!(!has(&all, &header::HOST));
    }

    #[test]
    fn connection_named_fields_are_removed_but_not_host_or_framing() {
        let mut h = headers(&[
            ("connection", "close, x-secret, host"),
            ("connection", "keep-alive, Content-Length"),
            ("host", "a.test"),
            ("content-length", "5"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        remove_hop_by_hop(&mut h, None);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, vec!["content-length", "host", "x-kept"]);
    }

    #[test]
    fn a_client_cannot_strip_the_fields_duet_sets_and_loses_proxy() {
        let sent = [
            (
                "connection",
                "x-request-id, x-forwarded-for, x-forwarded-proto, x-forwarded-host, x-real-ip, x-hop",
            ),
            ("x-request-id", "id"),
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "a.test"),
            ("x-real-ip", "1.1.1.1"),
            ("x-hop", "1"),
            ("proxy", "http://evil.test"),
        ];
        let mut request = headers(&sent);
        remove_request_hop_by_hop(&mut request, None);
        let mut names: Vec<&str> = request.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "x-forwarded-for",
                "x-forwarded-host",
                "x-forwarded-proto",
                "x-real-ip",
                "x-request-id"
            ]
        );
        // A backend's Connection still strips what it names, and a response keeps a `Proxy` field.
        let mut response = headers(&sent);
        remove_hop_by_hop(&mut response, None);
        let names: Vec<&str> = response.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["proxy"]);
        // Nothing to strip: nothing touched.
        let mut plain = headers(&[("host", "a"), ("accept", "*/*")]);
        remove_request_hop_by_hop(&mut plain, None);
        assert_eq!(plain.len(), 2);
    }

    #[test]
    fn trailers_lose_the_fields_the_head_is_scrubbed_of() {
        let mut trailers = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-request-id", "forged"),
            ("x-real-ip", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("proxy", "http://evil.test"),
            ("connection", "x-checksum"),
            ("host", "evil.test"),
            ("content-length", "0"),
            ("authorization", "Basic eDp5"),
            ("x-checksum", "abc"),
            ("server-timing", "db;dur=53"),
        ]);
        remove_forbidden_trailers(&mut trailers);
        let mut names: Vec<&str> = trailers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["server-timing", "x-checksum"]);
    }

    #[test]
    fn trailers_lose_what_the_route_edits_and_underscored_names_where_the_head_does() {
        let sent = [
            ("x-user-role", "admin"),
            ("x-debug", "1"),
            ("x_team", "admin"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-checksum", "abc"),
        ];
        let scrub = TrailerScrub::new(["x-user-role"].into_iter(), ["x-debug"].into_iter());
        let names = |scrub: &TrailerScrub| {
            let mut trailers = headers(&sent);
            scrub.apply(&mut trailers);
            let mut names: Vec<String> = trailers.keys().map(|k| k.as_str().to_owned()).collect();
            names.sort_unstable();
            names
        };
        assert_eq!(names(&scrub.with_underscores_dropped(true)), ["x-checksum"]);
        assert_eq!(names(&scrub), ["x-checksum", "x_team"]);
        assert_eq!(
            names(&TrailerScrub::default()),
            ["x-checksum", "x-debug", "x-user-role", "x_team"]
        );
    }

    #[test]
    fn only_a_tunnelled_protocol_is_forwarded_and_only_on_http_11() {
        let offer = |pairs: &[(&str, &str)], version| upgrade_protocol(&headers(pairs), version);
        let websocket = [("connection", "Upgrade"), ("upgrade", "websocket")];
        assert_eq!(
            offer(&websocket, Version::HTTP_11),
            Some(HeaderValue::from_static("websocket"))
        );
        assert_eq!(offer(&websocket, Version::HTTP_10), None, "RFC 9110 §7.8");
        assert_eq!(offer(&[("upgrade", "websocket")], Version::HTTP_11), None);
        let h2c = [
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ];
        assert_eq!(offer(&h2c, Version::HTTP_11), None);
        // Every Upgrade field counts, and only the tunnelled protocol goes on.
        let both = [
            ("connection", "upgrade"),
            ("upgrade", "h2c"),
            ("upgrade", "WebSocket"),
        ];
        let protocol = offer(&both, Version::HTTP_11).expect("websocket offered");
        let mut h = headers(&both);
        remove_hop_by_hop(&mut h, Some(protocol));
        let upgrades: Vec<&[u8]> = h.get_all("upgrade").iter().map(|v| v.as_bytes()).collect();
        assert_eq!(upgrades, vec![&b"WebSocket"[..]]);
        assert_eq!(h["connection"], "upgrade");
    }

    #[test]
    fn cookie_fields_are_joined_into_one_and_a_single_one_left_as_it_is() {
        let mut split = headers(&[
            ("cookie", "a=1"),
            ("accept", "*/*"),
            ("cookie", "b=2"),
            ("cookie", "c=3"),
        ]);
        join_cookies(&mut split);
        let cookies: Vec<_> = split.get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2; c=3"]);
        assert_eq!(split["accept"], "*/*");
        let mut single = headers(&[("cookie", "a=1; b=2")]);
        join_cookies(&mut single);
        assert_eq!(single.get_all("cookie").iter().count(), 1);
        assert_eq!(single["cookie"], "a=1; b=2");
        let mut none = headers(&[("accept", "*/*")]);
        join_cookies(&mut none);
        assert!(!none.contains_key("cookie"));
    }

    #[test]
    fn names_with_underscores_are_removed_and_counted_and_the_others_kept() {
        let mut request = headers(&[
            ("x_forwarded_for", "6.6.6.6"),
            ("host", "a"),
            ("x_team", "a"),
            ("x_team", "b"),
            ("x-team", "api"),
        ]);
        assert_eq!(remove_underscored(&mut request), 3);
        let mut names: Vec<&str> = request.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["host", "x-team"]);
        assert_eq!(remove_underscored(&mut request), 0);
    }

    #[test]
    fn a_client_certificate_field_is_replaced_or_removed_and_underscores_dropped_as_told() {
        let sent = || {
            headers(&[
                ("x-forwarded-client-cert", "Hash=forged"),
                ("host", "a"),
                ("x_team", "a"),
            ])
        };
        let names = |headers: &HeaderMap| {
            let mut names: Vec<String> = headers.keys().map(|k| k.as_str().to_owned()).collect();
            names.sort_unstable();
            names
        };
        let own = HeaderValue::from_static("Hash=own");
        let mut request = sent();
        assert_eq!(scrub_client_fields(&mut request, None, true), 1);
        assert_eq!(names(&request), ["host"]);
        let mut request = sent();
        assert_eq!(scrub_client_fields(&mut request, Some(&own), false), 0);
        assert_eq!(
            names(&request),
            ["host", "x-forwarded-client-cert", "x_team"]
        );
        let certificates: Vec<_> = request.get_all("x-forwarded-client-cert").iter().collect();
        assert_eq!(certificates, [&own]);
        let mut plain = headers(&[("host", "a")]);
        assert_eq!(scrub_client_fields(&mut plain, None, true), 0);
        assert_eq!(names(&plain), ["host"]);
    }

    #[test]
    fn a_value_padded_with_whitespace_is_found() {
        for padded in [" a", "a ", "\ta", "a\t", " "] {
            assert!(
                padded_value(&headers(&[("x", "ok"), ("y", padded)])),
                "{padded:?}"
            );
        }
        assert!(!padded_value(&headers(&[
            ("x", "a b"),
            ("y", ""),
            ("z", "a\tb")
        ])));
    }

    #[test]
    fn transfer_codings_other_than_chunked_are_unknown() {
        let te = |v: &str| unknown_transfer_coding(&headers(&[("transfer-encoding", v)]));
        assert!(!te("chunked"));
        assert!(!te("Chunked"));
        assert!(te("gzip, chunked"));
        assert!(te("xchunked"));
        assert!(!unknown_transfer_coding(&HeaderMap::new()));
    }

    #[test]
    fn forwarding_fields_are_kept_only_from_a_trusted_peer() {
        let sent = [
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-for", "10.1.1.1"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("x-forwarded-port", "1"),
        ];
        let client = "127.0.0.1".parse().expect("ip");
        let host = Some(HeaderValue::from_static("example.com"));
        let mut trusted = headers(&sent);
        add_forwarding(&mut trusted, client, host.clone(), false, true);
        assert_eq!(trusted.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(
            trusted["x-forwarded-for"],
            "203.0.113.7, 10.1.1.1, 127.0.0.1"
        );
        assert_eq!(trusted["x-forwarded-proto"], "http");
        assert_eq!(trusted["x-forwarded-host"], "example.com");

        let mut untrusted = headers(&sent);
        add_forwarding(&mut untrusted, client, host, true, false);
        assert_eq!(untrusted["x-forwarded-for"], "127.0.0.1");
        assert_eq!(untrusted["x-forwarded-proto"], "https");
        for forged in ["forwarded", "x-real-ip", "x-forwarded-port"] {
            assert!(!untrusted.contains_key(forged), "{forged}");
        }
    }

    #[test]
    fn a_trusted_proxy_says_how_its_client_came_in() {
        let front = [
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "shop.example.com"),
        ];
        let client = "127.0.0.1".parse().expect("ip");
        let host = || Some(HeaderValue::from_static("backend.internal"));
        let mut trusted = headers(&front);
        add_forwarding(&mut trusted, client, host(), false, true);
        assert_eq!(trusted["x-forwarded-proto"], "https");
        assert_eq!(trusted["x-forwarded-host"], "shop.example.com");
        let mut untrusted = headers(&front);
        add_forwarding(&mut untrusted, client, host(), false, false);
        assert_eq!(untrusted["x-forwarded-proto"], "http");
        assert_eq!(untrusted["x-forwarded-host"], "backend.internal");
    }

    #[test]
    fn a_trusted_peer_that_sent_no_forwarding_fields_gets_them_all() {
        let client = "2001:db8::7".parse().expect("ip");
        let mut trusted = headers(&[("host", "a")]);
        add_forwarding(&mut trusted, client, None, true, true);
        assert_eq!(trusted["x-forwarded-for"], "2001:db8::7");
        assert_eq!(trusted["x-forwarded-proto"], "https");
        assert!(!trusted.contains_key("x-forwarded-host"), "no host to say");
        let mut chained = headers(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        add_forwarding(&mut chained, client, None, false, true);
        assert_eq!(chained.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(
            chained["x-forwarded-for"],
            "10.0.0.1, 10.0.0.2, 2001:db8::7"
        );
    }
}
