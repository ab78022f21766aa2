//! Host patterns and path prefixes, held to what a request can carry once duet has normalised it: a
//! pattern that no request could match is refused, with the one that would.

use crate::model::HostPattern;
use std::net::Ipv6Addr;

/// Why a value is refused, and what to write instead when there is one clear fix.
pub(super) struct Refusal {
    pub(super) message: String,
    pub(super) hint: Option<String>,
}

impl Refusal {
    fn new(message: String, hint: Option<String>) -> Self {
        Self { message, hint }
    }
}

/// `api.example.com` or `*.example.com`, lowercased, a trailing dot dropped (`api.example.com.`
/// names the same host, and the proxy drops it from a request's Host too). An IPv6 address may be
/// written with or without its brackets: a request's `[::1]:8080` is matched as `::1`.
pub(super) fn host_pattern(raw: &str) -> Result<HostPattern, Refusal> {
    let text = raw.trim().to_ascii_lowercase();
    let literal = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
    if let Some(address) = [literal, Some(text.as_str())]
        .into_iter()
        .flatten()
        .find(|t| t.parse::<Ipv6Addr>().is_ok())
    {
        return Ok(HostPattern::Exact(address.to_owned()));
    }
    let expected = format!(
        "`{raw}` is not a host pattern: expected a name such as api.example.com, \
         or *.example.com for its subdomains"
    );
    let refuse = |hint: String| Refusal::new(expected.clone(), Some(hint));
    if let Some((name, port)) = text.rsplit_once(':') {
        if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Refusal::new(
                format!(
                    "`{raw}` has a port: a route matches the host name alone, \
                     whatever port the request names"
                ),
                Some(format!("write `{}`", name.trim_end_matches('.'))),
            ));
        }
    }
    let (wildcard, name) = match text.strip_prefix("*.") {
        Some(suffix) => (true, suffix),
        None => (false, text.as_str()),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(Refusal::new(expected.clone(), None));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '~' | '.' | '*')))
    {
        let what = match c {
            ' ' => "a space".to_owned(),
            c if c.is_whitespace() || c.is_control() => format!("{:?}", c),
            c => format!("`{c}`"),
        };
        return Err(refuse(format!(
            "a host name holds only letters, digits, `-`, `_` and dots: no request's Host \
             carries {what}"
        )));
    }
    if name.contains('*') {
        return Err(refuse(
            "`*` stands only for the leading labels, as in *.example.com".to_owned(),
        ));
    }
    if name.split('.').any(str::is_empty) {
        return Err(refuse(
            "a dot must separate two labels: `..` and a leading dot name no host".to_owned(),
        ));
    }
    Ok(if wildcard {
        HostPattern::Wildcard(format!(".{name}"))
    } else {
        HostPattern::Exact(name.to_owned())
    })
}

/// A path prefix that is already in the form duet gives a request's path before matching: no dot
/// segments, no empty segments (`//`), no percent-encoded letters, digits or `-._~`. Only a
/// complete segment counts: `/api/..` may still be the start of `/api/..hidden`. Starting with `/`
/// is checked by the caller.
pub(super) fn path_prefix(text: &str) -> Result<String, Refusal> {
    if let Some(c) = text.chars().find(|&c| c.is_whitespace() || c.is_control()) {
        return Err(Refusal::new(
            format!("`{text}` holds {c:?}: no request path carries it as written"),
            Some(format!("percent-encode it, as `%{:02X}`", u32::from(c))),
        ));
    }
    if let Some(at) = text.find(['?', '#']) {
        return Err(Refusal::new(
            format!(
                "`{text}` holds `{}`: a path prefix matches the path alone, \
                 without query or fragment",
                &text[at..=at]
            ),
            Some(format!("write `{}`", &text[..at])),
        ));
    }
    let decoded = decode_unreserved(text).map_err(|at| {
        Refusal::new(
            format!(
                "`{text}` has a `%` not followed by two hex digits (at `{}`)",
                &text[at..]
            ),
            Some("write `%25` for a `%` itself".to_owned()),
        )
    })?;
    let (normalised, problem) = resolve_segments(&decoded);
    let problem = match (problem, first_unreserved_escape(text)) {
        (Some(problem), _) => problem.to_owned(),
        (None, Some((escape, c))) => {
            format!(
                "writes `{c}` as `{escape}`, which duet decodes in request paths before matching"
            )
        }
        (None, None) => return Ok(normalised),
    };
    Err(Refusal::new(
        format!("`{text}` is not a normalised path prefix: it {problem}"),
        Some(format!("write `{normalised}`")),
    ))
}

/// The first percent-encoded unreserved character in `text`: `("%61", 'a')`.
fn first_unreserved_escape(text: &str) -> Option<(&str, char)> {
    text.match_indices('%').find_map(|(at, _)| {
        let escape = text.get(at..at + 3)?;
        let c = char::from(u8::from_str_radix(escape.get(1..)?, 16).ok()?);
        unreserved(c).then_some((escape, c))
    })
}

/// RFC 3986 §2.3: the characters a URI never needs to percent-encode.
fn unreserved(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')
}

/// `text` with percent-encoded unreserved characters (RFC 3986 §2.3) decoded; other escapes kept
/// as written. `Err` holds the byte offset of a `%` without two hex digits after it.
fn decode_unreserved(text: &str) -> Result<String, usize> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = rest
            .get(at + 1..at + 3)
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(hex) = escape else {
            return Err(text.len() - rest.len() + at);
        };
        match u8::from_str_radix(hex, 16).map(char::from) {
            Ok(c) if unreserved(c) => out.push(c),
            _ => out.push_str(&rest[at..at + 3]),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The path with dot segments resolved and empty segments dropped (RFC 3986 §5.2.4), and what was
/// found to resolve, if anything. The last segment is kept whatever it is: in a prefix it may be
/// the start of a longer one.
fn resolve_segments(path: &str) -> (String, Option<&'static str>) {
    let segments: Vec<&str> = path.get(1..).unwrap_or_default().split('/').collect();
    let last = segments.len().saturating_sub(1);
    let mut out: Vec<&str> = Vec::new();
    let mut dots = false;
    let mut empty = false;
    for (i, segment) in segments.into_iter().enumerate() {
        match segment {
            _ if i == last => out.push(segment),
            "" => empty = true,
            "." => dots = true,
            ".." => {
                dots = true;
                out.pop();
            }
            _ => out.push(segment),
        }
    }
    let problem = if dots {
        Some(
            "has a dot segment (`.` or `..`), which duet resolves in request paths before matching",
        )
    } else if empty {
        Some("has an empty segment (`//`): a normalised path has none")
    } else {
        None
    };
    (format!("/{}", out.join("/")), problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_normalise_as_request_paths_do() {
        for (prefix, normalised) in [
            ("/api/../admin", "/admin"),
            ("/api/./x", "/api/x"),
            ("//x", "/x"),
            ("/%61dmin", "/admin"),
            ("/api/%2e%2e/admin/", "/admin/"),
            ("/../x", "/x"),
        ] {
            let refusal = path_prefix(prefix).expect_err(prefix);
            assert_eq!(
                refusal.hint,
                Some(format!("write `{normalised}`")),
                "{prefix}"
            );
        }
        for kept in [
            "/",
            "/api",
            "/api/",
            "/api/..",
            "/.well-known/",
            "/a%2Fb",
            "/caf%C3%A9",
        ] {
            assert_eq!(path_prefix(kept).ok().as_deref(), Some(kept));
        }
    }

    #[test]
    fn host_patterns_are_lowercased_without_a_trailing_dot() {
        let exact = |h: &str| Some(HostPattern::Exact(h.to_owned()));
        assert_eq!(
            host_pattern("API.example.com.").ok(),
            exact("api.example.com")
        );
        assert_eq!(
            host_pattern("*.Example.com.").ok(),
            Some(HostPattern::Wildcard(".example.com".to_owned()))
        );
        assert_eq!(host_pattern("[::1]").ok(), exact("::1"));
        assert_eq!(host_pattern("127.0.0.1").ok(), exact("127.0.0.1"));
        for refused in [
            "api.example.com:8080",
            "a b",
            "a..b",
            ".example.com",
            "*",
            "a.*.com",
            "x/y",
            "",
        ] {
            assert!(host_pattern(refused).is_err(), "{refused}");
        }
    }
}
