//! Stage 1, route: host and path decide the cluster, first matching route wins.
//!
//! An absolute-form target names its host in the URI; otherwise the Host header does. Either way only
//! the configured routes decide where a request goes: duet is never an open proxy.

use crate::error::{ErrorKind, ProxyError};
use duet_config::{HostPattern, Route};
use http::{header, HeaderValue, Request, Uri};

/// Where routing sent a request.
#[derive(Debug)]
pub(crate) struct Routed<'t> {
    /// The route that matched.
    pub(crate) route: &'t Route,
    /// The host the request named, for `X-Forwarded-Host`.
    pub(crate) host: Option<HeaderValue>,
}

/// Finds the first route for `request`. 414 for a target over `max_uri_length`, 404 if none matches.
pub(crate) fn route<'t, B>(
    routes: &'t [Route],
    max_uri_length: usize,
    request: &Request<B>,
) -> Result<Routed<'t>, ProxyError> {
    if uri_length(request.uri()) > max_uri_length {
        return Err(ProxyError::new(ErrorKind::UriTooLong));
    }
    let host: Option<HeaderValue> = match request.uri().authority() {
        Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
        None => request.headers().get(header::HOST).cloned(),
    };
    let host_name = host.as_ref().and_then(|h| h.to_str().ok());
    let path = request.uri().path();
    let route = routes
        .iter()
        .find(|r| matches(r, host_name, path))
        .ok_or_else(|| ProxyError::new(ErrorKind::NoRoute))?;
    Ok(Routed { route, host })
}

/// Whether a request for `host` (may carry a port) and `path` matches `route`.
pub(crate) fn matches(route: &Route, host: Option<&str>, path: &str) -> bool {
    let host_ok = match (&route.host, host) {
        (None, _) => true,
        (Some(pattern), Some(host)) => host_matches(pattern, host),
        (Some(_), None) => false,
    };
    host_ok && path.starts_with(&route.path_prefix)
}

/// `pattern` against `host`, ignoring a port and ASCII case.
pub(crate) fn host_matches(pattern: &HostPattern, host: &str) -> bool {
    let host = strip_port(host);
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

fn strip_port(host: &str) -> &str {
    if let Some(bracketed) = host.strip_prefix('[') {
        // [v6]:port
        return bracketed.split(']').next().unwrap_or(bracketed);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
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
        let request = request.body(()).expect("request");
        route(routes, 64, &request)
            .map(|r| r.route.cluster)
            .map_err(|e| e.kind())
    }

    #[test]
    fn first_match_wins_by_host_then_path() {
        let routes = routes();
        assert_eq!(cluster_of(&routes, "/v1/x", Some("api.example.com")), Ok(0));
        assert_eq!(cluster_of(&routes, "/v2/x", Some("api.example.com")), Ok(1));
        assert_eq!(cluster_of(&routes, "/v1/x", Some("www.example.com")), Ok(1));
        assert_eq!(cluster_of(&routes, "/static/a", Some("other.org")), Ok(1));
        assert_eq!(cluster_of(&routes, "/static/a", None), Ok(1));
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
    fn a_long_target_is_414() {
        let long = format!("/{}", "a".repeat(64));
        assert_eq!(
            cluster_of(&routes(), &long, None),
            Err(ErrorKind::UriTooLong)
        );
    }
}
