//! A route's filters: `request_headers:`, `response_headers:`, `rewrite:` and `retries:`.

use super::matching::{self, Refusal};
use crate::{
    checker::{token, Checker},
    field::Field,
    model::{HeaderEdits, HostPattern, PathMatch, PathRewrite, Rewrite},
    raw::{Pairs, RawHeaderEdits, RawRewrite, RawRoute, Scalar},
};
use serde_saphyr::Spanned;

/// Fields a header edit may not name: the hop-by-hop ones (RFC 9110 §7.6.1), which duet strips and
/// sets per connection; the framing ones, which hyper writes for the body it sends; Host, which only
/// `rewrite.host` changes; `Expect`, which duet has answered already; and `Proxy` (httpoxy), which duet
/// strips from every request.
const REFUSED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
    "expect",
    "proxy",
];

/// What a route does to requests and responses beside routing them.
#[derive(Default)]
pub(super) struct Filters {
    pub(super) request_headers: HeaderEdits,
    pub(super) response_headers: HeaderEdits,
    pub(super) rewrite: Rewrite,
    pub(super) retry_attempts: Option<u32>,
}

/// The filters of `route`; `matched` is its path match (a `path_prefix` rewrite needs a prefix).
/// A redirect route sends nothing to a backend, so every filter on it is refused.
pub(super) fn filters(
    checker: &mut Checker,
    route: &RawRoute,
    field: &Field,
    matched: &PathMatch,
) -> Filters {
    if route.redirect.is_some() {
        refuse_on_redirect(checker, route, field);
        return Filters::default();
    }
    let edits = |checker: &mut Checker, raw: &Option<Spanned<RawHeaderEdits>>, key| {
        raw.as_ref()
            .map(|raw| header_edits(checker, raw, &field.key(key)))
            .unwrap_or_default()
    };
    Filters {
        request_headers: edits(checker, &route.request_headers, "request_headers"),
        response_headers: edits(checker, &route.response_headers, "response_headers"),
        rewrite: route
            .rewrite
            .as_ref()
            .map(|raw| rewrite(checker, raw, &field.key("rewrite"), matched))
            .unwrap_or_default(),
        retry_attempts: route.retries.as_ref().and_then(|r| {
            let at = field.key("retries").key("attempts");
            r.attempts
                .as_ref()
                .map(|a| checker.count(Some(a), &at, 1, (1, 10)))
        }),
    }
}

fn refuse_on_redirect(checker: &mut Checker, route: &RawRoute, field: &Field) {
    let message = |key: &str| {
        format!("`{key}` on a redirect route: nothing is sent to a backend for it to change")
    };
    for (key, given) in [
        ("request_headers", &route.request_headers),
        ("response_headers", &route.response_headers),
    ] {
        if let Some(given) = given {
            checker.reject(given, field.key(key), message(key));
        }
    }
    if let Some(given) = &route.rewrite {
        checker.reject(given, field.key("rewrite"), message("rewrite"));
    }
    if let Some(attempts) = route.retries.as_ref().and_then(|r| r.attempts.as_ref()) {
        let at = field.key("retries").key("attempts");
        checker.reject(attempts, at, message("retries"));
    }
}

fn header_edits(
    checker: &mut Checker,
    raw: &Spanned<RawHeaderEdits>,
    field: &Field,
) -> HeaderEdits {
    let written = &raw.value;
    let mut edits = HeaderEdits {
        set: pairs(checker, written.set.as_ref(), &field.key("set")),
        add: pairs(checker, written.add.as_ref(), &field.key("add")),
        remove: Vec::new(),
    };
    let list = field.key("remove");
    for (i, name) in written.remove.iter().flatten().enumerate() {
        let Some(lower) = header_name(checker, &name.value.0, name, &list.index(i)) else {
            continue;
        };
        let also = |pairs: &[(String, String)]| pairs.iter().any(|(n, _)| *n == lower);
        if also(&edits.set) || also(&edits.add) {
            let message = format!("`{lower}` is both removed and set or added");
            let e = checker.error(name, list.index(i), message);
            checker.push(e.hint("keep one: `set` already replaces every field of that name"));
        } else if !edits.remove.contains(&lower) {
            edits.remove.push(lower);
        }
    }
    if edits.is_empty()
        && written.remove.is_none()
        && written.set.is_none()
        && written.add.is_none()
    {
        let e = checker.error(raw, field, "changes nothing");
        checker.push(
            e.hint("give `set: { name: value }`, `add: { name: value }` or `remove: [name]`"),
        );
    }
    edits
}

/// `set:` or `add:`: each name a field duet lets a route change, once, with a value a field can carry.
fn pairs(
    checker: &mut Checker,
    raw: Option<&Pairs<Spanned<Scalar>>>,
    field: &Field,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (name, value) in raw.map_or(&[][..], |p| &p.0[..]) {
        let at = field.key(&name.value);
        let Some(lower) = header_name(checker, &name.value, name, &at) else {
            continue;
        };
        if out.iter().any(|(n, _)| *n == lower) {
            let message = format!("`{lower}` is given twice (names are case-insensitive)");
            checker.reject(name, &at, message);
            continue;
        }
        let text = &value.value.0;
        let bad = text
            .chars()
            .find(|&c| (c.is_control() && c != '\t') || !c.is_ascii());
        if let Some(c) = bad {
            let message = format!("`{text}` holds {c:?}: a header value is printable ASCII");
            checker.reject(value, &at, message);
        } else if text.trim() != text {
            let message =
                format!("`{text}` starts or ends with white space, which a field value cannot");
            let e = checker.error(value, &at, message);
            checker.push(e.hint(format!("write `{}`", text.trim())));
        } else {
            out.push((lower, text.clone()));
        }
    }
    out
}

/// A field name a route may change, lowercased; `None` after recording why not.
fn header_name<T>(
    checker: &mut Checker,
    written: &str,
    at: &Spanned<T>,
    field: &Field,
) -> Option<String> {
    let lower = written.trim().to_ascii_lowercase();
    if !token(&lower) {
        checker.reject(at, field, format!("`{written}` is not a header name"));
        return None;
    }
    if REFUSED.contains(&lower.as_str()) {
        let message =
            format!("`{lower}` is a hop-by-hop or framing field: duet sets it for each connection");
        let e = checker.error(at, field, message);
        let hint = if lower == "host" {
            "change the Host a backend gets with `rewrite: { host: NAME }`"
        } else {
            "leave it to duet"
        };
        checker.push(e.hint(hint));
        return None;
    }
    Some(lower)
}

fn rewrite(
    checker: &mut Checker,
    raw: &Spanned<RawRewrite>,
    field: &Field,
    matched: &PathMatch,
) -> Rewrite {
    let written = &raw.value;
    let path = match (&written.path, &written.path_prefix) {
        (None, None) => None,
        (Some(_), Some(prefix)) => {
            let message = "both `path` and `path_prefix`: write one";
            checker.reject(prefix, field.key("path_prefix"), message);
            None
        }
        (Some(path), None) => {
            rewrite_path(checker, path, &field.key("path")).map(PathRewrite::Full)
        }
        (None, Some(prefix)) => {
            let at = field.key("path_prefix");
            if matches!(matched, PathMatch::Prefix(_)) {
                rewrite_path(checker, prefix, &at).map(PathRewrite::Prefix)
            } else {
                let e = checker.error(prefix, &at, "the route matches no prefix to replace");
                checker.push(e.hint("match with `path_prefix` (or `path: { prefix }`), or rewrite to a whole `path`"));
                None
            }
        }
    };
    let host = written
        .host
        .as_ref()
        .and_then(|h| host(checker, h, &field.key("host")));
    if written.path.is_none() && written.path_prefix.is_none() && written.host.is_none() {
        let e = checker.error(raw, field, "changes nothing");
        checker.push(e.hint("give `path`, `path_prefix` or `host`"));
    }
    Rewrite { path, host }
}

/// A path as the backend will get it: normalised (so the rewrite can never add `//` or a dot segment),
/// printable ASCII.
fn rewrite_path(checker: &mut Checker, p: &Spanned<Scalar>, field: &Field) -> Option<String> {
    let text = p.value.0.trim();
    if !text.starts_with('/') {
        let e = checker.error(p, field, format!("`{text}` must start with `/`"));
        checker.push(e.hint(format!("did you mean `/{text}`?")));
        return None;
    }
    if let Some(c) = text.chars().find(|c| !c.is_ascii()) {
        let message = format!("`{text}` holds {c:?}: a path is ASCII");
        let e = checker.error(p, field, message);
        checker.push(e.hint("percent-encode it"));
        return None;
    }
    matching::path_prefix(text)
        .map_err(|refusal| refuse(checker, p, field, refusal))
        .ok()
}

/// `name` or `name:port`, lowercased; an IPv6 address in brackets.
fn host(checker: &mut Checker, h: &Spanned<Scalar>, field: &Field) -> Option<String> {
    let text = h.value.0.trim().to_ascii_lowercase();
    let (name, port) = match text.strip_prefix('[').and_then(|t| t.split_once(']')) {
        Some((literal, tail)) => (literal, Some(tail.strip_prefix(':').unwrap_or(tail))),
        // Two colons or more: a bare IPv6 address, whose last group is no port.
        None if text.matches(':').count() > 1 => (text.as_str(), None),
        None => match text.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (text.as_str(), None),
        },
    };
    let port = port.filter(|p| !p.is_empty());
    if let Some(port) = port.filter(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        let message = format!("`{port}` is not a port: expected 1 to 65535");
        checker.reject(h, field, message);
        return None;
    }
    match matching::host_pattern(name) {
        Ok(HostPattern::Exact(exact)) => {
            let exact = if exact.contains(':') {
                format!("[{exact}]")
            } else {
                exact
            };
            Some(match port {
                Some(port) => format!("{exact}:{port}"),
                None => exact,
            })
        }
        Ok(HostPattern::Wildcard(_)) => {
            checker.reject(h, field, "a rewrite needs one host, not a pattern");
            None
        }
        Err(refusal) => {
            refuse(checker, h, field, refusal);
            None
        }
    }
}

fn refuse(checker: &mut Checker, at: &Spanned<Scalar>, field: &Field, refusal: Refusal) {
    let mut e = checker.error(at, field, refusal.message);
    if let Some(hint) = refusal.hint {
        e = e.hint(hint);
    }
    checker.push(e);
}
