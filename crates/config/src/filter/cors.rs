//! `cors:`: which other origins' pages may call a route from a browser (the Fetch standard's CORS
//! protocol), as nginx's `add_header Access-Control-*` with a preflight `return 204`, and Envoy's and
//! Traefik's CORS settings. duet answers the preflight itself and adds the fields to the backend's
//! responses for an allowed origin.

use super::{RouteContext, Section};
use crate::{checker::Checker, field::Field, raw::leaf, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{fmt, time::Duration};

/// An entry of `allow_origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedOrigin {
    /// `*`: every origin (never with credentials, which the Fetch standard forbids).
    Any,
    /// One origin, lowercased: `https://app.example`, `http://localhost:3000`.
    Exact(String),
    /// `https://*.example.com`: every subdomain of `example.com`, at any depth, on that scheme and
    /// port; not `https://example.com` itself. Held as the scheme with `://` and the suffix with its
    /// leading dot: (`https://`, `.example.com`).
    Subdomains {
        /// `https://`.
        scheme: String,
        /// `.example.com`, or `.example.com:8443`.
        suffix: String,
    },
}

impl AllowedOrigin {
    /// Whether the `Origin` a browser sent (as it sent it) is this one or covered by it.
    pub fn covers(&self, origin: &[u8]) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(exact) => origin.eq_ignore_ascii_case(exact.as_bytes()),
            Self::Subdomains { scheme, suffix } => {
                let (scheme, suffix) = (scheme.as_bytes(), suffix.as_bytes());
                if origin.len() <= scheme.len() + suffix.len()
                    || !origin[..scheme.len()].eq_ignore_ascii_case(scheme)
                {
                    return false;
                }
                let (host, tail) =
                    origin[scheme.len()..].split_at(origin.len() - scheme.len() - suffix.len());
                // The label(s) before the suffix: a host's characters, no port, path or userinfo.
                tail.eq_ignore_ascii_case(suffix)
                    && host
                        .iter()
                        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                    && !host.starts_with(b".")
                    && !host.ends_with(b".")
            }
        }
    }
}

impl fmt::Display for AllowedOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Exact(origin) => f.write_str(origin),
            Self::Subdomains { scheme, suffix } => write!(f, "{scheme}*{suffix}"),
        }
    }
}

/// `cors: { allow_origins, allow_methods, allow_headers, expose_headers, allow_credentials,
/// max_age }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// The origins whose pages may call the route.
    pub allow_origins: Vec<AllowedOrigin>,
    /// The methods a preflight allows, uppercase as written (`GET, HEAD, POST` when left out).
    pub allow_methods: Vec<String>,
    /// The request fields a preflight allows, lowercased (none when left out; `*` for any, without
    /// credentials).
    pub allow_headers: Vec<String>,
    /// The response fields a page's script may read besides the safelisted ones.
    pub expose_headers: Vec<String>,
    /// Whether the page may send cookies and read the answer (`Access-Control-Allow-Credentials`).
    pub allow_credentials: bool,
    /// How long a browser may keep a preflight's answer (`Access-Control-Max-Age`); `None`: the
    /// browser's default (5 s).
    pub max_age: Option<Duration>,
}

impl fmt::Display for Cors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origins: Vec<String> = self.allow_origins.iter().map(ToString::to_string).collect();
        write!(
            f,
            "{} methods {}",
            origins.join(","),
            self.allow_methods.join(",")
        )?;
        if !self.allow_headers.is_empty() {
            write!(f, " headers {}", self.allow_headers.join(","))?;
        }
        if !self.expose_headers.is_empty() {
            write!(f, " expose {}", self.expose_headers.join(","))?;
        }
        if self.allow_credentials {
            f.write_str(" credentials")?;
        }
        if let Some(age) = self.max_age {
            write!(f, " max-age {}", age.as_secs())?;
        }
        Ok(())
    }
}

type List = Option<Spanned<Vec<Spanned<Scalar>>>>;

/// `cors:` as written.
#[derive(Debug, Deserialize)]
struct RawCors {
    #[serde(default)]
    allow_origins: List,
    #[serde(default)]
    allow_methods: List,
    #[serde(default)]
    allow_headers: List,
    #[serde(default)]
    expose_headers: List,
    #[serde(default)]
    allow_credentials: Option<Spanned<Scalar>>,
    #[serde(default)]
    max_age: Option<Spanned<Scalar>>,
}

/// The route key `cors:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    cors: Option<Spanned<RawCors>>,
}

impl Section for Cors {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static crate::raw::Shape)] =
        &[("cors", &leaf::<RawCors>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, raw.cors.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("cors {self}")
    }
}

/// What `allow_methods` means when left out: the methods a page may send without a preflight's
/// method check anyway (the CORS-safelisted methods).
const DEFAULT_METHODS: &[&str] = &["GET", "HEAD", "POST"];

fn check(checker: &mut Checker, raw: &Spanned<RawCors>, route: &RouteContext<'_>) -> Option<Cors> {
    let field = route.field.key("cors");
    let errors = checker.errors.len();
    if route.redirects {
        let e = checker.error(
            raw,
            &field,
            "a redirect route answers itself: no backend response carries the fields",
        );
        checker.push(e.hint("leave `cors` out of redirect routes"));
    }
    let written = &raw.value;
    let allow_origins = match &written.allow_origins {
        Some(list) => origins(checker, list, &field.key("allow_origins")),
        None => {
            let e = checker.error(
                raw,
                &field,
                "`allow_origins` is missing: no origin would be allowed",
            );
            checker
                .push(e.hint("list the origins, such as `allow_origins: [https://app.example]`"));
            Vec::new()
        }
    };
    let allow_methods = match &written.allow_methods {
        Some(list) => tokens(checker, list, &field.key("allow_methods"), false),
        None => DEFAULT_METHODS.iter().map(|m| (*m).to_owned()).collect(),
    };
    let allow_headers = (written.allow_headers.as_ref())
        .map(|list| tokens(checker, list, &field.key("allow_headers"), true))
        .unwrap_or_default();
    let expose_headers = (written.expose_headers.as_ref())
        .map(|list| tokens(checker, list, &field.key("expose_headers"), true))
        .unwrap_or_default();
    let allow_credentials = checker.boolean(
        written.allow_credentials.as_ref(),
        &field.key("allow_credentials"),
        false,
    );
    if let (true, Some(value)) = (allow_credentials, written.allow_credentials.as_ref()) {
        credentials_with_any(checker, written, value, &field);
    }
    let max_age = (written.max_age.as_ref())
        .map(|age| checker.duration(Some(age), &field.key("max_age"), Duration::ZERO));
    (checker.errors.len() == errors).then_some(Cors {
        allow_origins,
        allow_methods,
        allow_headers,
        expose_headers,
        allow_credentials,
        max_age,
    })
}

/// Refuses `allow_credentials: true` beside a `*` in a list: a browser refuses a credentialed answer
/// that allows every origin (or, in these fields, reads `*` as a name), so the route would never work
/// as written.
fn credentials_with_any(
    checker: &mut Checker,
    written: &RawCors,
    credentials: &Spanned<Scalar>,
    field: &Field,
) {
    let lists = [
        ("allow_origins", &written.allow_origins),
        ("allow_headers", &written.allow_headers),
        ("expose_headers", &written.expose_headers),
    ];
    for (key, list) in lists {
        let Some(list) = list else { continue };
        for (i, value) in list.value.iter().enumerate() {
            if value.value.0.trim() == "*" {
                let message = format!(
                    "`*` with `allow_credentials: true` (line {}): browsers refuse a credentialed answer that allows any",
                    credentials.referenced.line()
                );
                let e = checker.error(value, field.key(key).index(i), message);
                checker.push(e.hint(
                    "list the origins (and fields) by name, or leave `allow_credentials` out",
                ));
            }
        }
    }
}

fn origins(
    checker: &mut Checker,
    list: &Spanned<Vec<Spanned<Scalar>>>,
    field: &Field,
) -> Vec<AllowedOrigin> {
    if list.value.is_empty() {
        let e = checker.error(list, field, "an empty list: no origin would be allowed");
        checker.push(e.hint("list origins such as `https://app.example`, or leave `cors` out"));
    }
    let mut found = Vec::new();
    for (i, value) in list.value.iter().enumerate() {
        match origin(value.value.0.trim()) {
            Ok(origin) => found.push(origin),
            Err(message) => {
                let e = checker.error(value, field.index(i), message);
                checker.push(e.hint(
                    "write an origin as browsers send it: `https://app.example`, `http://localhost:3000`, `https://*.example.com` or `*`",
                ));
            }
        }
    }
    found
}

/// An origin as written: `*`, `scheme://host[:port]`, or `scheme://*.domain[:port]`.
fn origin(text: &str) -> Result<AllowedOrigin, String> {
    if text == "*" {
        return Ok(AllowedOrigin::Any);
    }
    let lower = text.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once("://") else {
        return Err(format!("`{text}` is not an origin: it has no scheme"));
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (rest, None),
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host),
    };
    let name_ok = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !scheme_ok || !port_ok || !name_ok {
        return Err(format!(
            "`{text}` is not an origin: expected a scheme, a host and at most a port (no path, no trailing `/`), with `*.` only as the first label"
        ));
    }
    let scheme = format!("{scheme}://");
    Ok(if wildcard {
        AllowedOrigin::Subdomains {
            scheme,
            suffix: rest[1..].to_owned(),
        }
    } else {
        AllowedOrigin::Exact(lower)
    })
}

/// Methods (as written) or field names (lowercased, `fields`): tokens, or `*` for fields.
fn tokens(
    checker: &mut Checker,
    list: &Spanned<Vec<Spanned<Scalar>>>,
    field: &Field,
    fields: bool,
) -> Vec<String> {
    let mut found = Vec::new();
    for (i, value) in list.value.iter().enumerate() {
        let text = value.value.0.trim();
        let text = if fields {
            text.to_ascii_lowercase()
        } else {
            text.to_owned()
        };
        if !crate::checker::token(&text) || (!fields && text == "*") {
            let what = if fields {
                "a field name such as `content-type`, or `*`"
            } else {
                "a method such as `PUT`"
            };
            checker.reject(value, field.index(i), format!("`{text}` is not {what}"));
            continue;
        }
        if !found.contains(&text) {
            found.push(text);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_covers_subdomains_at_any_depth_on_its_scheme_and_port_only() {
        let wildcard = origin("https://*.Example.com").expect("origin");
        for (sent, covered) in [
            ("https://a.example.com", true),
            ("https://A.b.example.com", true),
            ("https://example.com", false),
            ("https://.example.com", false),
            ("http://a.example.com", false),
            ("https://a.example.com:8443", false),
            ("https://evil-example.com", false),
            ("https://a.example.com.evil", false),
            ("https://x/y.example.com", false),
        ] {
            assert_eq!(wildcard.covers(sent.as_bytes()), covered, "{sent}");
        }
        let with_port = origin("https://*.example.com:8443").expect("origin");
        assert!(with_port.covers(b"https://a.example.com:8443"));
        assert!(!with_port.covers(b"https://a.example.com"));
        let exact = origin("http://localhost:3000").expect("origin");
        assert!(exact.covers(b"http://localhost:3000"));
        assert!(!exact.covers(b"http://localhost:3001"));
    }

    #[test]
    fn paths_missing_schemes_and_inner_wildcards_are_not_origins() {
        for text in [
            "app.example",
            "https://app.example/",
            "https://a.*.example",
            "https://app.example:99999",
            "https://",
        ] {
            assert!(origin(text).is_err(), "{text}");
        }
    }
}
