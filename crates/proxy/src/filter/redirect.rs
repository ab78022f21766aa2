//! A redirect route's answer: no backend is asked. `Location` (RFC 9110 §10.2.2) is the request's URL
//! with the redirect's parts in place and the query kept; a port is written only when it is not the
//! scheme's default.

use crate::{
    attempt::body::ProxyBody,
    error::{ErrorKind, ProxyError},
    filter::phase::{Arrival, Build, Decision, Phase, Phases},
    telemetry::access_log::AccessLog,
};
use bytes::Bytes;
use duet_config::{Action, PathMatch, Redirect, RedirectPath, Route};
use http::{header, HeaderValue, Response, StatusCode, Uri};

/// A redirect route's `redirect:`: it answers every request the route takes.
#[derive(Debug)]
pub(crate) struct RedirectRoute(Redirect);

impl Phases for RedirectRoute {
    const PHASES: Phase = Phase::REQUEST;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let Action::Redirect(redirect) = &route.action else {
            return None;
        };
        Some(Self(redirect.clone()))
    }

    fn on_request(&self, arrival: &Arrival<'_>, log: &mut Option<Box<AccessLog>>) -> Decision {
        let request = arrival.request;
        let (matched, tls) = (&arrival.route.path, arrival.client.tls);
        let location = location(&self.0, matched, request.uri(), arrival.host, tls);
        let Ok(location) = HeaderValue::from_str(&location) else {
            return Decision::Refuse(ProxyError::new(ErrorKind::InvalidPath));
        };
        let status = StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::FOUND);
        let mut log = log.take();
        if let Some(log) = log.as_mut() {
            log.status = status;
        }
        let mut response = Response::new(ProxyBody::error(Bytes::new(), log, "redirect"));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::LOCATION, location);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        Decision::Answer(response)
    }
}

/// The redirect's target URL. Without a host from either the request or the redirect (an HTTP/1.0
/// request without Host), a relative reference: the path and query alone.
fn location(
    redirect: &Redirect,
    matched: &PathMatch,
    uri: &Uri,
    host: Option<&HeaderValue>,
    tls: bool,
) -> String {
    let path = match (&redirect.path, matched) {
        (Some(RedirectPath::Full(path)), _) => path.clone(),
        (Some(RedirectPath::Prefix(new)), PathMatch::Prefix(old)) => {
            let rest = uri.path().get(old.len()..).unwrap_or_default();
            match (new.strip_suffix('/'), rest.starts_with('/')) {
                (Some(trimmed), true) => format!("{trimmed}{rest}"),
                _ if new.is_empty() && rest.is_empty() => "/".to_owned(),
                _ => format!("{new}{rest}"),
            }
        }
        _ => uri.path().to_owned(),
    };
    let query = uri.query().map_or_else(String::new, |q| format!("?{q}"));
    let (request_host, request_port) = host
        .and_then(|h| h.to_str().ok())
        .map_or((None, None), split_host);
    let Some(name) = redirect.host.as_deref().or(request_host) else {
        return format!("{path}{query}");
    };
    let scheme = redirect
        .scheme
        .as_deref()
        .unwrap_or(if tls { "https" } else { "http" });
    let port = match (redirect.port, &redirect.scheme) {
        (Some(port), _) => Some(port),
        (None, Some(_)) => None,
        (None, None) => request_port,
    };
    let default = if scheme == "https" { 443 } else { 80 };
    let port = port
        .filter(|&p| p != default)
        .map_or_else(String::new, |p| format!(":{p}"));
    let name = crate::path::without_root_dot(name);
    if name.contains(':') {
        format!("{scheme}://[{name}]{port}{path}{query}")
    } else {
        format!("{scheme}://{name}{port}{path}{query}")
    }
}

/// `name[:port]` or `[v6][:port]` into the name (brackets off) and the port.
fn split_host(authority: &str) -> (Option<&str>, Option<u16>) {
    let (name, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((name, tail)) => (name, tail.strip_prefix(':')),
            None => (rest, None),
        },
        None => match authority.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        },
    };
    (Some(name), port.and_then(|p| p.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_keeps_the_query_and_writes_only_what_is_not_a_default() {
        let redirect = |scheme: Option<&str>, port, path| Redirect {
            scheme: scheme.map(str::to_owned),
            host: None,
            port,
            path,
            status: 308,
        };
        let prefix = PathMatch::Prefix("/old".into());
        let uri: Uri = "/old/x?a=1&b".parse().expect("uri");
        let host = HeaderValue::from_static("shop.example.com:8080");
        let at =
            |r: &Redirect, host: Option<&HeaderValue>, tls| location(r, &prefix, &uri, host, tls);
        assert_eq!(
            at(&redirect(Some("https"), None, None), Some(&host), false),
            "https://shop.example.com/old/x?a=1&b"
        );
        assert_eq!(
            at(
                &redirect(None, None, Some(RedirectPath::Prefix("/new".into()))),
                Some(&host),
                false
            ),
            "http://shop.example.com:8080/new/x?a=1&b"
        );
        assert_eq!(
            at(
                &redirect(None, None, Some(RedirectPath::Prefix("/".into()))),
                Some(&host),
                true
            ),
            "https://shop.example.com:8080/x?a=1&b"
        );
        assert_eq!(
            at(
                &redirect(
                    Some("https"),
                    Some(8443),
                    Some(RedirectPath::Full("/p".into()))
                ),
                Some(&HeaderValue::from_static("[::1]:80")),
                false
            ),
            "https://[::1]:8443/p?a=1&b"
        );
        assert_eq!(
            at(&redirect(None, Some(9000), None), None, false),
            "/old/x?a=1&b",
            "no host known: a relative reference"
        );
    }
}
