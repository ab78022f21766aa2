//! A route's `match:`: host, path (prefix, exact or regex), methods, headers and query parameters.

use super::matching::{self, Refusal};
use crate::{
    checker::{token, Checker},
    field::Field,
    model::{HeaderMatch, HostPattern, PathMatch, Pattern, PatternError, ValueMatch},
    raw::{Pairs, RawMatch, RawPath, RawValueMatch, Scalar},
};
use serde_saphyr::Spanned;

/// What a route requires of a request; every part left out matches any request.
pub(super) struct Matchers {
    pub(super) host: Option<HostPattern>,
    pub(super) path: PathMatch,
    pub(super) methods: Vec<String>,
    pub(super) headers: Vec<HeaderMatch>,
    pub(super) query: Vec<(String, String)>,
}

pub(super) fn matchers(checker: &mut Checker, raw: Option<&RawMatch>, route: &Field) -> Matchers {
    let field = route.key("match");
    let host = raw
        .and_then(|m| m.host.as_ref())
        .and_then(|h| host(checker, h, &field.key("host")));
    let path = match raw.map(|m| (&m.path_prefix, &m.path)) {
        None | Some((None, None)) => PathMatch::Prefix("/".to_owned()),
        Some((Some(p), None)) => {
            PathMatch::Prefix(path_prefix(checker, p, &field.key("path_prefix")))
        }
        Some((None, Some(path))) => path_match(checker, path, &field.key("path")),
        Some((Some(_), Some(path))) => {
            let e = checker.error(path, field.key("path"), "both `path` and `path_prefix`");
            checker.push(e.hint("keep one: `path_prefix: /x` is `path: { prefix: /x }`"));
            PathMatch::Prefix("/".to_owned())
        }
    };
    let methods = match raw.and_then(|m| m.method.as_ref()) {
        None => Vec::new(),
        Some(list) => {
            if list.value.is_empty() {
                let message = "an empty list: the route would match nothing";
                let e = checker.error(list, field.key("method"), message);
                checker.push(e.hint("leave `method` out for a route on every method"));
            }
            checker.methods(&list.value, &field.key("method"))
        }
    };
    let headers = raw
        .and_then(|m| m.headers.as_ref())
        .map_or_else(Vec::new, |h| headers(checker, h, &field.key("headers")));
    let query = raw
        .and_then(|m| m.query.as_ref())
        .map_or_else(Vec::new, |q| query(checker, q, &field.key("query")));
    Matchers {
        host,
        path,
        methods,
        headers,
        query,
    }
}

fn path_match(checker: &mut Checker, raw: &Spanned<RawPath>, field: &Field) -> PathMatch {
    let fallback = PathMatch::Prefix("/".to_owned());
    let given = [
        ("exact", &raw.value.exact),
        ("prefix", &raw.value.prefix),
        ("regex", &raw.value.regex),
    ];
    let written: Vec<_> = given
        .iter()
        .filter_map(|(key, value)| value.as_ref().map(|v| (*key, v)))
        .collect();
    let [(key, value)] = written[..] else {
        let e = checker.error(
            raw,
            field,
            "expected exactly one of `exact`, `prefix`, `regex`",
        );
        checker.push(e.hint(
            "write `path: { prefix: /v1 }`, `{ exact: /healthz }` or `{ regex: '^/u/[0-9]+$' }`",
        ));
        return fallback;
    };
    let field = field.key(key);
    match key {
        "exact" => PathMatch::Exact(path_prefix(checker, value, &field)),
        "prefix" => PathMatch::Prefix(path_prefix(checker, value, &field)),
        _ => regex(checker, value, &field).map_or(fallback, PathMatch::Regex),
    }
}

/// A regular expression, compiled now so a request never waits on it; an error names the problem
/// the parser found, or the memory it would take past [`Pattern::SIZE_LIMIT`] alone or
/// [`Pattern::TOTAL_LIMIT`] with the config's regexes before it.
fn regex(checker: &mut Checker, value: &Spanned<Scalar>, field: &Field) -> Option<Pattern> {
    let text = &value.value.0;
    let pattern = match Pattern::new(text) {
        Ok(pattern) => pattern,
        Err(PatternError::Invalid(error)) => {
            let reason = error.lines().last().unwrap_or_default().trim();
            let reason = reason.strip_prefix("error: ").unwrap_or(reason);
            let message = format!("`{text}` is not a valid regex: {reason}");
            checker.reject(value, field, message);
            return None;
        }
        Err(PatternError::TooLarge) => {
            let limit = Pattern::SIZE_LIMIT >> 10;
            let message =
                format!("`{text}` compiles to more than {limit} KiB, the most a regex may");
            let e = checker.error(value, field, message);
            checker.push(e.hint(SMALLER_REGEX));
            return None;
        }
    };
    let before = checker.regex_memory;
    checker.regex_memory += pattern.memory_usage();
    // Said once, at the regex that crosses the limit.
    if before <= Pattern::TOTAL_LIMIT && checker.regex_memory > Pattern::TOTAL_LIMIT {
        let (total, limit) = (checker.regex_memory >> 10, Pattern::TOTAL_LIMIT >> 10);
        let message = format!(
            "with `{text}`, the regexes so far hold {total} KiB, over the {limit} KiB a config's \
             regexes may hold together"
        );
        let e = checker.error(value, field, message);
        checker.push(e.hint(SMALLER_REGEX));
    }
    Some(pattern)
}

/// What makes a regex smaller, for the errors that say it is too large.
const SMALLER_REGEX: &str = "a counted repetition of a Unicode class grows fast (`\\w{1,50}` is 2.5 MiB): \
     use an ASCII class (`[0-9A-Za-z_]`, or `(?-u:\\w)`) or a smaller count, and `path: { prefix }` or \
     `{ exact }` where they do";

fn headers(checker: &mut Checker, raw: &Pairs<RawValueMatch>, field: &Field) -> Vec<HeaderMatch> {
    let mut out = Vec::new();
    for (name, wanted) in &raw.0 {
        let field = field.key(&name.value);
        let lower = name.value.trim().to_ascii_lowercase();
        if !token(&lower) {
            let message = format!("`{}` is not a header name", name.value);
            checker.reject(name, &field, message);
            continue;
        }
        if CLIENT_ADDRESS_FIELDS.contains(&lower.as_str()) {
            let message = format!(
                "`{lower}` is replaced by duet from what it saw: the route would match the value the \
                 client sent, which the backend never gets"
            );
            let e = checker.error(name, &field, message);
            checker.push(e.hint(
                "a client writes any address it likes here (duet keeps it only from `trusted_proxies`); \
                 route by the client's address, not this field (matching the address is not supported yet)",
            ));
            continue;
        }
        let value = match wanted {
            RawValueMatch::Exact(text) => Some(ValueMatch::Exact(text.0.clone())),
            RawValueMatch::Regex(text) => {
                regex(checker, text, &field.key("regex")).map(ValueMatch::Regex)
            }
            RawValueMatch::Unknown(key) => {
                let message = format!("`{}` is not a way to match a value", key.value);
                let e = checker.error(key, &field, message);
                checker.push(e.hint("write a value, or `{ regex: '...' }`"));
                None
            }
        };
        if let Some(value) = value {
            out.push(HeaderMatch { name: lower, value });
        }
    }
    out
}

fn query(
    checker: &mut Checker,
    raw: &Pairs<Spanned<Scalar>>,
    field: &Field,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, value) in &raw.0 {
        let bad = |c: char| c.is_whitespace() || c.is_control() || matches!(c, '&' | '=' | '#');
        if name.value.is_empty() || name.value.contains(bad) {
            let message = format!("`{}` is not a query parameter name", name.value);
            checker.reject(name, field.key(&name.value), message);
        } else {
            out.push((name.value.clone(), value.value.0.clone()));
        }
    }
    out
}

/// The forwarding fields that carry the client's address, which duet drops and rebuilds from the peer
/// it saw unless the peer is a trusted proxy: a matcher on them would act on what any client can forge
/// (an allow-list by `X-Real-IP` would let everyone in). `X-Forwarded-Proto` and `-Host` may still be
/// matched: they say what a client chooses anyway (its scheme, its host), and behind a TLS front proxy
/// they are how a route tells `https` from `http`.
const CLIENT_ADDRESS_FIELDS: [&str; 3] = ["x-forwarded-for", "x-real-ip", "forwarded"];

fn host(checker: &mut Checker, h: &Spanned<Scalar>, field: &Field) -> Option<HostPattern> {
    matching::host_pattern(&h.value.0)
        .map_err(|refusal| refuse(checker, h, field, refusal))
        .ok()
}

fn path_prefix(checker: &mut Checker, p: &Spanned<Scalar>, field: &Field) -> String {
    let text = &p.value.0;
    if !text.starts_with('/') {
        let e = checker.error(p, field, format!("`{text}` must start with `/`"));
        checker.push(e.hint(format!("did you mean `/{text}`?")));
        return "/".to_owned();
    }
    if let Some(at) = text.find(';') {
        let message = format!(
            "`{text}` holds `;`: routes match a request's path without its `;` parameters, as \
             Tomcat and Spring read it, so no request would match"
        );
        let e = checker.error(p, field, message);
        checker.push(e.hint(format!("write `{}`", &text[..at])));
        return "/".to_owned();
    }
    matching::path_prefix(text)
        .map_err(|refusal| refuse(checker, p, field, refusal))
        .unwrap_or_else(|()| "/".to_owned())
}

fn refuse(checker: &mut Checker, at: &Spanned<Scalar>, field: &Field, refusal: Refusal) {
    let mut e = checker.error(at, field, refusal.message);
    if let Some(hint) = refusal.hint {
        e = e.hint(hint);
    }
    checker.push(e);
}
