//! A route's `redirect:`: the URL parts it changes, each held to what a `Location` can carry.

use super::matching;
use crate::{
    checker::Checker,
    field::Field,
    model::{HostPattern, PathMatch, Redirect, RedirectPath},
    raw::{RawRedirect, Scalar},
};
use serde_saphyr::Spanned;

const STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

/// The redirect, or `None` after recording why it is refused. `path` is what the route matches: a
/// `path_prefix` redirect replaces the matched prefix, so it needs a prefix match.
pub(super) fn redirect(
    checker: &mut Checker,
    raw: &Spanned<RawRedirect>,
    route: &Field,
    path: &PathMatch,
) -> Option<Redirect> {
    let field = route.key("redirect");
    let written = &raw.value;
    let errors = checker.errors.len();
    let scheme = written.scheme.as_ref().and_then(|s| {
        let text = s.value.0.trim().to_ascii_lowercase();
        if text == "http" || text == "https" {
            return Some(text);
        }
        let message = format!(
            "`{}` is not a scheme duet redirects to: expected http or https",
            s.value.0
        );
        checker.reject(s, field.key("scheme"), message);
        None
    });
    let host = written
        .host
        .as_ref()
        .and_then(|h| host(checker, h, &field.key("host")));
    let port = written.port.as_ref().map(|p| {
        let port = checker.count(Some(p), &field.key("port"), 1, (1, 65535));
        u16::try_from(port).unwrap_or(1)
    });
    let path = redirect_path(checker, written, &field, path);
    let status = match &written.status {
        None => 302,
        Some(s) => match s.value.0.trim().parse::<u16>() {
            Ok(code) if STATUSES.contains(&code) => code,
            _ => {
                let message = format!(
                    "`{}` is not a redirect status: expected 301, 302, 303, 307 or 308",
                    s.value.0
                );
                checker.reject(s, field.key("status"), message);
                302
            }
        },
    };
    let redirect = Redirect {
        scheme,
        host,
        port,
        path,
        status,
    };
    if redirect.scheme.is_none()
        && redirect.host.is_none()
        && redirect.port.is_none()
        && redirect.path.is_none()
        && checker.errors.len() == errors
    {
        let e = checker.error(
            raw,
            &field,
            "changes nothing: every request would be sent back to itself",
        );
        checker.push(e.hint("give at least one of scheme, host, port, path, path_prefix"));
    }
    (checker.errors.len() == errors).then_some(redirect)
}

fn host(checker: &mut Checker, h: &Spanned<Scalar>, field: &Field) -> Option<String> {
    match matching::host_pattern(&h.value.0) {
        Ok(HostPattern::Exact(name)) => Some(name),
        Ok(HostPattern::Wildcard(_)) => {
            checker.reject(h, field, "a redirect needs one host, not a pattern");
            None
        }
        Err(refusal) => {
            let mut e = checker.error(h, field, refusal.message);
            if let Some(hint) = refusal.hint {
                e = e.hint(hint);
            }
            checker.push(e);
            None
        }
    }
}

fn redirect_path(
    checker: &mut Checker,
    written: &RawRedirect,
    field: &Field,
    matched: &PathMatch,
) -> Option<RedirectPath> {
    match (&written.path, &written.path_prefix) {
        (None, None) => None,
        (Some(_), Some(prefix)) => {
            let message = "both `path` and `path_prefix`: write one";
            checker.reject(prefix, field.key("path_prefix"), message);
            None
        }
        (Some(path), None) => {
            location_path(checker, path, &field.key("path")).map(RedirectPath::Full)
        }
        (None, Some(prefix)) => {
            let at = field.key("path_prefix");
            if !matches!(matched, PathMatch::Prefix(_)) {
                let e = checker.error(prefix, &at, "the route matches no prefix to replace");
                checker.push(e.hint("match with `path_prefix` (or `path: { prefix }`), or redirect to a whole `path`"));
                return None;
            }
            location_path(checker, prefix, &at).map(RedirectPath::Prefix)
        }
    }
}

/// A path for `Location`: from `/`, with nothing a URL would read as the query, fragment or a space.
fn location_path(checker: &mut Checker, p: &Spanned<Scalar>, field: &Field) -> Option<String> {
    let text = p.value.0.trim();
    if !text.starts_with('/') {
        let e = checker.error(p, field, format!("`{text}` must start with `/`"));
        checker.push(e.hint(format!("did you mean `/{text}`?")));
        return None;
    }
    if text.starts_with("//") {
        // `//x` in a Location is another host.
        let message = format!("`{text}` would read as a host (`//`) in a Location");
        checker.reject(p, field, message);
        return None;
    }
    if let Some(c) = text
        .chars()
        .find(|&c| c.is_whitespace() || c.is_control() || matches!(c, '?' | '#') || !c.is_ascii())
    {
        let message = format!("`{text}` holds {c:?}: a redirect path carries no query, fragment, space or non-ASCII character");
        checker.reject(p, field, message);
        return None;
    }
    Some(text.to_owned())
}
