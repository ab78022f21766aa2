//! Stage 1, route: host and path decide the cluster, first matching route wins.
//!
//! What is routed on is exactly what the backend will see:
//!
//! - **Host** (RFC 9112 §3.2): an HTTP/1.1 request needs exactly one, and it must be a valid authority
//!   (`name[:port]`, `IPv4[:port]`, `[IPv6][:port]`, no userinfo); anything else is 400. An absolute-form
//!   target (`GET http://host/path`) names the host instead (§3.2.2): duet routes on it and sends it to
//!   the backend as the Host. Only the configured routes decide where a request goes: duet is never an
//!   open proxy.
//! - **Path**: normalised before routing (`path.rs`: unreserved escapes decoded, slashes merged, dot
//!   segments resolved; what backends read differently is 400), and the backend gets the normalised
//!   path, so `/public/../%61dmin` is routed (and served) as `/admin`. A trailing dot on the host names
//!   the same host (`api.example.com.` routes as `api.example.com`).
//! - **Listener**: a route with `listeners:` only takes requests that came on one of them; on any
//!   other it does not exist (404 if nothing else matches), so an internal route never answers on a
//!   public listener.
//! - **Path matchers**: `path: { exact: ... }` is the whole normalised path, `{ regex: ... }` is searched in
//!   it (compiled once at load, linear time); `path_prefix:` is `path: { prefix: ... }`. Every kind
//!   matches the path without its `;` parameters (`/actuator/env;x` is `/actuator/env`), as Tomcat and
//!   Spring read it; the backend still gets them.
//! - **HTTP/2 fields**: a value with leading or trailing whitespace is malformed (RFC 9113 §8.2.1): 400.
//! - **Method**: `CONNECT` is 405 (duet tunnels nothing but upgrades), a method with a lower-case letter
//!   400 (`delete` is not `DELETE` to a route, but is to some backends).
//! - **Method, headers, query**: every one written must hold; a header is matched on any of its fields
//!   (names case-insensitive), a query parameter on the raw text of one of its `name=value` pairs.
//! - `path_prefix` is a plain string prefix, as in nginx and Envoy: `/public` also matches `/publicity`;
//!   write `/public/` to require a segment boundary.

use crate::error::{ErrorKind, ProxyError};
use crate::headers::MAX_REQUEST_FIELDS;
use crate::stage::route_index::{strip_port, RouteIndex};
use crate::{headers, path};
use duet_config::{HostPattern, Route};
use http::{header, HeaderValue, Method, Request, Uri, Version};

/// Where routing sent a request.
#[derive(Debug)]
pub(crate) struct Routed<'t> {
    /// The route that matched.
    pub(crate) route: &'t Route,
    /// Its position in the config's routes.
    pub(crate) index: usize,
    /// The host the request named, for `Host` toward the backend and `X-Forwarded-Host`.
    pub(crate) host: Option<HeaderValue>,
}

/// Finds the first route for `request`, which came on the listener at `listener`, after checking its
/// Host and normalising its path in place. 431 for a head of more fields than HTTP/1.1 allows (an
/// HTTP/2 request: hyper refuses such an HTTP/1.1 one before it gets here), 414 for a target over
/// `max_uri_length`, 400 for a bad Host or path, 404 if no route for that listener matches. `index` is
/// `routes`' index.
pub(crate) fn route<'t, B>(
    routes: &'t [Route],
    index: &RouteIndex,
    listener: usize,
    max_uri_length: usize,
    request: &mut Request<B>,
) -> Result<Routed<'t>, ProxyError> {
    if request.headers().len() > MAX_REQUEST_FIELDS {
        return Err(ProxyError::new(ErrorKind::HeadTooLarge));
    }
    if uri_length(request.uri()) > max_uri_length {
        return Err(ProxyError::new(ErrorKind::UriTooLong));
    }
    check_method(request.method()).map_err(ProxyError::new)?;
    if request.version() == Version::HTTP_2 && headers::padded_value(request.headers()) {
        return Err(ProxyError::new(ErrorKind::InvalidHeader));
    }
    let host = request_host(request).map_err(ProxyError::new)?;
    path::normalise_uri(request.uri_mut()).map_err(ProxyError::new)?;
    let host_name = host.as_ref().and_then(|h| h.to_str().ok());
    let path = path::without_parameters(request.uri().path());
    let (index, route) = (index.candidates(host_name))
        .filter_map(|i| Some((i, routes.get(i)?)))
        .find(|(_, r)| {
            r.serves(listener) && matches(r, host_name, path) && conditions_hold(r, request)
        })
        .ok_or_else(|| ProxyError::new(ErrorKind::NoRoute))?;
    Ok(Routed { route, index, host })
}

/// The position of the route `request` takes, or `None` if it gets an error response instead
/// (benchmarks and tools: the proxy's own lookup, Host check and path normalisation included).
pub fn lookup<B>(
    routes: &[Route],
    index: &RouteIndex,
    listener: usize,
    request: &mut Request<B>,
) -> Option<usize> {
    route(routes, index, listener, usize::MAX, request)
        .ok()
        .map(|r| r.index)
}

/// `CONNECT` asks for a tunnel to any host (duet is no forward proxy: 405, as nginx answers); a method
/// with a lower-case letter would pass a `method: [DELETE]` route as something else while a backend that
/// ignores case reads it as `DELETE` (400, as nginx answers). Methods are case-sensitive (RFC 9110 §9.1)
/// and every registered one is upper case.
fn check_method(method: &Method) -> Result<(), ErrorKind> {
    if *method == Method::CONNECT {
        return Err(ErrorKind::MethodNotAllowed);
    }
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(ErrorKind::InvalidMethod);
    }
    Ok(())
}

/// The host a request names: its absolute-form target's authority, else its one Host field.
fn request_host<B>(request: &Request<B>) -> Result<Option<HeaderValue>, ErrorKind> {
    // A pass over the request's few fields (Host usually first) costs less than a hashed look-up.
    let mut fields = (request.headers().iter())
        .filter(|(name, _)| *name == header::HOST)
        .map(|(_, value)| value);
    let field = fields.next();
    if fields.next().is_some() {
        return Err(ErrorKind::InvalidHost);
    }
    let http11 = request.version() >= Version::HTTP_11;
    let field = match field {
        Some(value) if valid_authority(value.as_bytes()) => Some(value),
        // HTTP/1.0 may send an empty Host, or none.
        Some(value) if value.is_empty() && !http11 => None,
        Some(_) => return Err(ErrorKind::InvalidHost),
        // HTTP/2 names the host in `:authority`, and needs no Host field beside it.
        None if http11
            && (request.version() != Version::HTTP_2 || request.uri().authority().is_none()) =>
        {
            return Err(ErrorKind::InvalidHost)
        }
        None => None,
    };
    match request.uri().authority() {
        // HTTP/2's `:authority` is the URI's; a Host field beside it must name the same (RFC 9113
        // §8.3.1), or the backend (which sees `:authority` as Host) and a cache could disagree.
        Some(authority)
            if request.version() == Version::HTTP_2
                && field.is_some_and(|f| {
                    !f.as_bytes()
                        .eq_ignore_ascii_case(authority.as_str().as_bytes())
                }) =>
        {
            Err(ErrorKind::InvalidHost)
        }
        Some(authority) if valid_authority(authority.as_str().as_bytes()) => {
            HeaderValue::from_str(authority.as_str())
                .map(Some)
                .map_err(|_| ErrorKind::InvalidHost)
        }
        Some(_) => Err(ErrorKind::InvalidHost),
        None => Ok(field.cloned()),
    }
}

/// `host[:port]` where host is a DNS name, an IPv4 address or a bracketed IPv6 address: no userinfo,
/// no list, no path, no space.
fn valid_authority(text: &[u8]) -> bool {
    if let Some(rest) = text.strip_prefix(b"[") {
        return valid_bracketed(rest);
    }
    // The port is the digits after the last `:`: read from the end, the digits first, so that each
    // byte is looked at once (a `:` before a non-digit stays in the host, which refuses it).
    let digits = text.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let host = match text.len().checked_sub(digits + 1) {
        Some(colon) if text[colon] == b':' => {
            if digits > 5 {
                return false;
            }
            &text[..colon]
        }
        _ => text,
    };
    !host.is_empty() && host.iter().all(|&b| HOST_BYTES[usize::from(b)])
}

/// An IPv6 literal's authority after its `[`: `::1]` or `::1]:443`.
fn valid_bracketed(rest: &[u8]) -> bool {
    let Some(end) = rest.iter().position(|&b| b == b']') else {
        return false;
    };
    let literal = &rest[..end];
    let literal_ok = !literal.is_empty()
        && literal
            .iter()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
    literal_ok
        && match &rest[end + 1..] {
            [] => true,
            [b':', port @ ..] => port.len() <= 5 && port.iter().all(u8::is_ascii_digit),
            _ => false,
        }
}

/// The bytes a host name may hold, by value: one load per byte instead of a range test and four
/// comparisons (every request's `Host` is checked).
const HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
        byte += 1;
    }
    table
};

/// Whether a request for `host` (may carry a port) and `path` matches `route`.
pub(crate) fn matches(route: &Route, host: Option<&str>, path: &str) -> bool {
    let host_ok = match (&route.host, host) {
        (None, _) => true,
        (Some(pattern), Some(host)) => host_matches(pattern, host),
        (Some(_), None) => false,
    };
    host_ok && route.path.matches(path)
}

/// The route's method, header and query matchers against `request`; each list is usually empty, so
/// a plain route costs nothing here.
fn conditions_hold<B>(route: &Route, request: &Request<B>) -> bool {
    let method = request.method().as_str();
    let method_ok = route.methods.is_empty() || route.methods.iter().any(|m| m == method);
    method_ok
        && route.headers.iter().all(|wanted| {
            request
                .headers()
                .get_all(wanted.name.as_str())
                .iter()
                .any(|value| wanted.value.matches(value.as_bytes()))
        })
        && route.query.iter().all(|(name, value)| {
            let query = request.uri().query().unwrap_or_default();
            query.split('&').any(|pair| {
                let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
                n == name && v == value
            })
        })
}

/// `pattern` against `host`, ignoring a port and ASCII case.
pub(crate) fn host_matches(pattern: &HostPattern, host: &str) -> bool {
    let host = path::without_root_dot(strip_port(host));
    match pattern {
        HostPattern::Exact(exact) => host.eq_ignore_ascii_case(exact),
        HostPattern::Wildcard(suffix) => {
            host.len() > suffix.len()
                && host
                    .get(host.len() - suffix.len()..)
                    .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
        }
    }
}

/// The length of the request target as the client sent it, without building a string.
fn uri_length(uri: &Uri) -> usize {
    let authority = uri.authority().map_or(0, |a| a.as_str().len());
    let scheme = uri.scheme_str().map_or(0, |s| s.len() + 3);
    let rest = uri.path_and_query().map_or(0, |p| p.as_str().len());
    scheme + authority + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        let exact = HostPattern::Exact("api.example.com".into());
        assert!(host_matches(&exact, "API.example.com:8080"));
        assert!(!host_matches(&exact, "x.api.example.com"));
        let wild = HostPattern::Wildcard(".example.com".into());
        assert!(host_matches(&wild, "a.EXAMPLE.com"));
        assert!(host_matches(&wild, "a.b.example.com:443"));
        assert!(!host_matches(&wild, "example.com"));
        assert!(!host_matches(&wild, "badexample.com"));
        assert!(host_matches(&HostPattern::Exact("::1".into()), "[::1]:80"));
        assert!(host_matches(&exact, "api.example.com.:80"));
        assert!(host_matches(&wild, "a.example.com."));
    }

    fn routes() -> Vec<Route> {
        let yaml = "listeners: [ { address: 127.0.0.1:0 } ]\nroutes:\n  - { match: { host: api.example.com, path_prefix: /v1 }, cluster: api }\n  - { match: { host: '*.example.com' }, cluster: web }\n  - { match: { path_prefix: /static }, cluster: web }\nclusters:\n  - { name: api, backends: [ { address: 127.0.0.1:1 } ] }\n  - { name: web, backends: [ { address: 127.0.0.1:2 } ] }\n";
        duet_config::parse(yaml, "t.yaml").expect("valid").routes
    }

    fn cluster_of(routes: &[Route], target: &str, host: Option<&str>) -> Result<usize, ErrorKind> {
        let mut request = Request::get(target);
        if let Some(host) = host {
            request = request.header(header::HOST, host);
        }
        let mut request = request.body(()).expect("request");
        route(routes, &RouteIndex::new(routes), 0, 64, &mut request)
            .map(|r| r.route.action.cluster().unwrap_or(usize::MAX))
            .map_err(|e| e.kind())
    }

    #[test]
    fn a_route_limited_to_some_listeners_does_not_exist_on_the_others() {
        let yaml = "listeners: [ { name: public, address: 127.0.0.1:0 }, { name: internal, address: '[::1]:0' } ]\nroutes:\n  - { match: { path_prefix: /admin }, cluster: api, listeners: [internal] }\n  - { match: { path_prefix: /a }, cluster: web }\nclusters:\n  - { name: api, backends: [ { address: 127.0.0.1:1 } ] }\n  - { name: web, backends: [ { address: 127.0.0.1:2 } ] }\n";
        let routes = duet_config::parse(yaml, "t.yaml").expect("valid").routes;
        let on = |listener, target: &str| {
            let mut request = Request::get(target)
                .header(header::HOST, "x")
                .body(())
                .expect("request");
            route(
                &routes,
                &RouteIndex::new(&routes),
                listener,
                64,
                &mut request,
            )
            .map(|r| r.index)
            .map_err(|e| e.kind())
        };
        assert_eq!(on(1, "/admin/users"), Ok(0));
        assert_eq!(on(0, "/admin/users"), Ok(1), "the next match, as if absent");
        assert_eq!(on(0, "/admin"), Ok(1));
        assert_eq!(on(1, "/b"), Err(ErrorKind::NoRoute));
    }

    #[test]
    fn path_method_header_and_query_matchers() {
        let yaml = "listeners: [ { address: 127.0.0.1:0 } ]\nroutes:\n  - { match: { path: { exact: /healthz } }, cluster: a }\n  - { match: { path: { regex: '^/users/[0-9]+$' } }, cluster: a }\n  - { match: { method: [POST], path_prefix: /m }, cluster: a }\n  - { match: { headers: { X-Env: canary, x-user: { regex: '^u[0-9]+$' } } }, cluster: a }\n  - { match: { query: { debug: '1' } }, cluster: a }\n  - { match: { path: { prefix: / } }, cluster: a }\nclusters:\n  - { name: a, backends: [ { address: 127.0.0.1:1 } ] }\n";
        let routes = duet_config::parse(yaml, "t.yaml").expect("valid").routes;
        let index = |method: &str, target: &str, headers: &[(&str, &str)]| {
            let mut request = Request::builder()
                .method(method)
                .uri(target)
                .header(header::HOST, "x");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let mut request = request.body(()).expect("request");
            route(&routes, &RouteIndex::new(&routes), 0, 256, &mut request)
                .map(|r| r.index)
                .map_err(|e| e.kind())
        };
        assert_eq!(index("GET", "/healthz", &[]), Ok(0));
        assert_eq!(
            index("GET", "/healthz/", &[]),
            Ok(5),
            "exact is the whole path"
        );
        assert_eq!(
            index("GET", "/users/./42", &[]),
            Ok(1),
            "on the normalised path"
        );
        assert_eq!(index("GET", "/users/42x", &[]), Ok(5));
        assert_eq!(index("POST", "/m", &[]), Ok(2));
        assert_eq!(index("GET", "/m", &[]), Ok(5));
        let both = [("x-env", "canary"), ("X-User", "u7")];
        assert_eq!(index("GET", "/h", &both), Ok(3));
        assert_eq!(
            index("GET", "/h", &both[..1]),
            Ok(5),
            "every header must match"
        );
        assert_eq!(
            index("GET", "/h", &[("x-env", "Canary"), ("x-user", "u7")]),
            Ok(5)
        );
        assert_eq!(index("GET", "/q?a=2&debug=1", &[]), Ok(4));
        assert_eq!(index("GET", "/q?debug=10", &[]), Ok(5));
    }

    /// The authority check as first written (a search for the last `:`, then a test per byte), which
    /// the table-driven one must agree with on any input.
    fn valid_authority_by_search(text: &[u8]) -> bool {
        if text.starts_with(b"[") {
            return valid_authority(text); // the bracketed form is unchanged
        }
        let (host, port) = match text.iter().rposition(|&b| b == b':') {
            Some(colon) => (&text[..colon], Some(&text[colon + 1..])),
            None => (text, None),
        };
        let host_ok = !host.is_empty()
            && host
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        let port_ok = port.is_none_or(|p| p.len() <= 5 && p.iter().all(u8::is_ascii_digit));
        host_ok && port_ok
    }

    proptest::proptest! {
        #[test]
        fn the_authority_check_agrees_with_a_search_for_the_last_colon(
            text in proptest::collection::vec(
                proptest::prop_oneof![
                    12 => proptest::sample::select(b"aZ09:.-_~%@ /".to_vec()),
                    1 => proptest::num::u8::ANY,
                ],
                0..16,
            )
        ) {
            proptest::prop_assert_eq!(valid_authority(&text), valid_authority_by_search(&text));
        }
    }

    #[test]
    fn authorities() {
        for good in [
            "a",
            "api.example.com",
            "a-b.c:8080",
            "10.0.0.1:80",
            "[::1]",
            "[::1]:443",
            "x:",
        ] {
            assert!(valid_authority(good.as_bytes()), "{good}");
        }
        for bad in [
            "",
            "a b",
            "x/y",
            "evil@host",
            "a,b",
            "[::1",
            "[::1]x",
            "a:99999999",
            "[zz]",
            ":80",
        ] {
            assert!(!valid_authority(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn first_match_wins_by_host_then_path() {
        let routes = routes();
        assert_eq!(cluster_of(&routes, "/v1/x", Some("api.example.com")), Ok(0));
        assert_eq!(cluster_of(&routes, "/v2/x", Some("api.example.com")), Ok(1));
        assert_eq!(cluster_of(&routes, "/v1/x", Some("www.example.com")), Ok(1));
        assert_eq!(cluster_of(&routes, "/static/a", Some("other.org")), Ok(1));
        assert_eq!(
            cluster_of(&routes, "/static/a", None),
            Err(ErrorKind::InvalidHost),
            "HTTP/1.1 needs a Host"
        );
        assert_eq!(
            cluster_of(&routes, "/v1/x", Some("other.org")),
            Err(ErrorKind::NoRoute)
        );
    }

    #[test]
    fn an_absolute_target_routes_by_its_authority() {
        let routes = routes();
        assert_eq!(
            cluster_of(&routes, "http://api.example.com/v1/x", Some("other.org")),
            Ok(0)
        );
    }

    #[test]
    fn an_http2_request_routes_by_its_authority_and_a_host_field_that_disagrees_is_400() {
        let routes = routes();
        let on = |host: Option<&str>| {
            let mut request = Request::get("https://api.example.com/v1/x").version(Version::HTTP_2);
            if let Some(host) = host {
                request = request.header(header::HOST, host);
            }
            let mut request = request.body(()).expect("request");
            route(&routes, &RouteIndex::new(&routes), 0, 64, &mut request)
                .map(|r| (r.route.action.cluster(), r.host))
                .map_err(|e| e.kind())
        };
        let routed = Ok((Some(0), Some(HeaderValue::from_static("api.example.com"))));
        assert_eq!(on(None), routed);
        assert_eq!(on(Some("API.example.com")), routed);
        assert_eq!(on(Some("other.org")), Err(ErrorKind::InvalidHost));
    }

    #[test]
    fn connect_is_405_and_a_method_in_lower_case_400() {
        let routes = routes();
        let on = |method: &str, target: &str| {
            let mut request = Request::builder()
                .method(method)
                .uri(target)
                .header(header::HOST, "other.org")
                .body(())
                .expect("request");
            route(&routes, &RouteIndex::new(&routes), 0, 64, &mut request)
                .map(|r| r.index)
                .map_err(|e| e.kind())
        };
        assert_eq!(
            on("CONNECT", "a.test:443"),
            Err(ErrorKind::MethodNotAllowed)
        );
        assert_eq!(on("CONNECT", "/static/a"), Err(ErrorKind::MethodNotAllowed));
        for method in ["get", "Delete", "pOST", "propfind"] {
            assert_eq!(
                on(method, "/static/a"),
                Err(ErrorKind::InvalidMethod),
                "{method}"
            );
        }
        for method in ["GET", "DELETE", "PROPFIND", "M-SEARCH", "X_1"] {
            assert_eq!(on(method, "/static/a"), Ok(2), "{method}");
        }
    }

    #[test]
    fn a_head_of_more_fields_than_http11_allows_is_431_whatever_its_protocol() {
        let routes = routes();
        let with_fields = |count: usize| {
            let mut request = Request::get("/static/a")
                .version(Version::HTTP_2)
                .body(())
                .expect("request");
            for n in 1..count {
                let name = header::HeaderName::from_bytes(format!("x-f{n}").as_bytes());
                let name = name.expect("a field name");
                request
                    .headers_mut()
                    .append(name, HeaderValue::from_static("v"));
            }
            request
                .headers_mut()
                .append(header::HOST, HeaderValue::from_static("a.org"));
            route(&routes, &RouteIndex::new(&routes), 0, 64, &mut request)
                .map(|r| r.index)
                .map_err(|e| e.kind())
        };
        assert_eq!(with_fields(MAX_REQUEST_FIELDS), Ok(2));
        assert_eq!(
            with_fields(MAX_REQUEST_FIELDS + 1),
            Err(ErrorKind::HeadTooLarge)
        );
    }

    #[test]
    fn a_long_target_is_414() {
        let long = format!("/{}", "a".repeat(64));
        assert_eq!(
            cluster_of(&routes(), &long, None),
            Err(ErrorKind::UriTooLong)
        );
    }
}
