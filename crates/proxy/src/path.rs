//! The one form of a request path that routes match and backends receive.
//!
//! A route on `/admin` protects nothing if `/%61dmin`, `//admin` or `/x/../admin` reach a catch-all
//! route and the backend then reads them as `/admin`. So before matching, the path is brought to the
//! form every common backend would decode it to, that form is what the backend is sent, and what
//! backends disagree about is refused:
//!
//! - **Decoded**: escapes of unreserved characters (`ALPHA DIGIT - . _ ~`, RFC 3986 §2.3, §6.2.2.2), so
//!   `%61dmin` is `admin` and `%2e%2e` is `..`. The other escapes stay escaped, their hex uppercased
//!   (§6.2.2.1): `%c3%a9` becomes `%C3%A9`. Decoding happens once: `%252e` stays as sent.
//! - **Merged**: repeated slashes, `//admin` is `/admin` (nginx's `merge_slashes`, on by default there;
//!   Envoy's `merge_slashes`); a trailing slash is kept.
//! - **Resolved**: dot segments (§5.2.4), after decoding and merging; climbing above the root is
//!   `InvalidPath`.
//! - **Refused** (`AmbiguousPath`, 400): an encoded slash or backslash (`%2F`, `%5C`) and a raw backslash,
//!   which nginx decodes and IIS and some frameworks read as `/` (Envoy's
//!   `path_with_escaped_slashes_action: REJECT_REQUEST`); `%00`, which truncates paths in C backends;
//!   escapes that do not decode to UTF-8 (overlong `%C0%AE` is a `.` to old decoders); and `;` path
//!   parameters anywhere but the last segment, and on a `.` or `..` there: Tomcat and Spring drop them,
//!   so `/..;/admin` climbs and `/admin;x/users` is `/admin/users` to them, yet neither starts with
//!   `/admin/` (Spring Security's default firewall refuses these too). A session id on the last segment
//!   (`/page;jsessionid=1`) passes as sent, and routes match the path without it
//!   ([`without_parameters`]), as those backends read it. A `%` without two hex digits after it is `InvalidPath`.
//! - **Left to the backend**: letter case. Routes match case-sensitively, as nginx's prefix locations
//!   and Envoy's `prefix` do; a backend that ignores case is its operator's to route accordingly.
//!
//! The query is never touched. A path that needs none of this costs one byte scan and no allocation.

use crate::error::ErrorKind;
use http::uri::{self, PathAndQuery, Uri};
use std::borrow::Cow;

/// Normalises the path of `uri` in place (see the module docs); the query is kept as sent.
pub(crate) fn normalise_uri(uri: &mut Uri) -> Result<(), ErrorKind> {
    let Some(path_and_query) = uri.path_and_query() else {
        return Ok(());
    };
    let Cow::Owned(mut normalised) = normalise(path_and_query.path())? else {
        return Ok(());
    };
    if let Some(query) = path_and_query.query() {
        normalised.push('?');
        normalised.push_str(query);
    }
    let mut parts = uri::Parts::from(std::mem::take(uri));
    parts.path_and_query =
        Some(PathAndQuery::try_from(normalised).map_err(|_| ErrorKind::InvalidPath)?);
    *uri = Uri::from_parts(parts).map_err(|_| ErrorKind::InvalidPath)?;
    Ok(())
}

/// The normalised form of `path`, borrowed when `path` already is in it. A path not starting with `/`
/// (`*`) is not a hierarchical path and is returned as is.
pub(crate) fn normalise(path: &str) -> Result<Cow<'_, str>, ErrorKind> {
    let Some(rest) = path.strip_prefix('/') else {
        return Ok(Cow::Borrowed(path));
    };
    if is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    let count = rest.split('/').count();
    let mut kept: Vec<Cow<'_, str>> = Vec::with_capacity(count);
    for (i, raw) in rest.split('/').enumerate() {
        let last = i + 1 == count;
        let segment = decode_segment(raw)?;
        check_parameters(&segment, last)?;
        match &*segment {
            // An empty segment is a doubled slash, merged; at the end it (or a `.`) keeps the slash.
            "" | "." => {
                if last {
                    kept.push(Cow::Borrowed(""));
                }
            }
            ".." => {
                kept.pop().ok_or(ErrorKind::InvalidPath)?;
                if last {
                    kept.push(Cow::Borrowed(""));
                }
            }
            _ => kept.push(segment),
        }
    }
    let mut normalised = String::with_capacity(path.len());
    for segment in &kept {
        normalised.push('/');
        normalised.push_str(segment);
    }
    if normalised.is_empty() {
        normalised.push('/');
    }
    Ok(if normalised == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normalised)
    })
}

/// Whether `path` (starting with `/`) holds nothing normalisation could change or refuse: no `%`,
/// `\` or `;`, and no `/` followed by `/` or `.`. Most paths are like this.
fn is_normal(path: &str) -> bool {
    // Byte arithmetic, no early exit: without branches the compiler vectorises both scans.
    let bytes = path.as_bytes();
    let special = bytes.iter().fold(0, |found, &b| {
        found | u8::from(b == b'%') | u8::from(b == b'\\') | u8::from(b == b';')
    });
    let next = bytes.get(1..).unwrap_or_default();
    let after_slash = bytes.iter().zip(next).fold(0, |found, (&b, &n)| {
        found | (u8::from(b == b'/') & (u8::from(n == b'/') | u8::from(n == b'.')))
    });
    (special | after_slash) == 0
}

/// `raw` (one segment, without slashes) with escapes of unreserved characters decoded and the others'
/// hex uppercased; an escaped or raw separator, NUL, non-UTF-8 escapes or a malformed `%` are refused.
fn decode_segment(raw: &str) -> Result<Cow<'_, str>, ErrorKind> {
    let bytes = raw.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || b == b'\\') {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = Vec::with_capacity(bytes.len());
    // Escaped bytes above ASCII, checked as UTF-8 once their run ends.
    let mut high: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'\\' {
            return Err(ErrorKind::AmbiguousPath);
        }
        if byte != b'%' {
            check_utf8(&mut high)?;
            out.push(byte);
            i += 1;
            continue;
        }
        let value = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| Some(hex_value(hex[0])? << 4 | hex_value(hex[1])?))
            .ok_or(ErrorKind::InvalidPath)?;
        i += 3;
        if value >= 0x80 {
            high.push(value);
        } else {
            check_utf8(&mut high)?;
        }
        match value {
            b'\0' | b'/' | b'\\' => return Err(ErrorKind::AmbiguousPath),
            _ if is_unreserved(value) => out.push(value),
            _ => out.extend_from_slice(&[
                b'%',
                HEX[usize::from(value >> 4)],
                HEX[usize::from(value & 15)],
            ]),
        }
    }
    check_utf8(&mut high)?;
    // Only ASCII was added and the raw bytes were copied whole, so this cannot fail.
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| ErrorKind::InvalidPath)
}

/// Refuses a run of escaped non-ASCII bytes that is not UTF-8, and empties it.
fn check_utf8(run: &mut Vec<u8>) -> Result<(), ErrorKind> {
    let valid = std::str::from_utf8(run).is_ok();
    run.clear();
    if valid {
        Ok(())
    } else {
        Err(ErrorKind::AmbiguousPath)
    }
}

/// Tomcat and Spring drop `;` parameters from each segment before reading the path: only a last
/// segment that is not a dot segment without them reads the same with and without them.
fn check_parameters(segment: &str, last: bool) -> Result<(), ErrorKind> {
    match segment.split_once(';') {
        Some((base, _)) if !last || base == "." || base == ".." => Err(ErrorKind::AmbiguousPath),
        _ => Ok(()),
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}

/// RFC 3986 §2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The path routes match: `path` (normalised) without its `;` parameters, as Tomcat and Spring read it
/// (`/actuator/env;x` is `/actuator/env` to them), so that an exact or regex route takes what its
/// backend will serve, as a prefix route does. Normalising left parameters on the last segment alone,
/// so they start at the path's first `;`.
pub(crate) fn without_parameters(path: &str) -> &str {
    // A byte loop: `str::find` goes through `memchr`, ~140 instructions on a short path, every request.
    match path.bytes().position(|b| b == b';') {
        Some(at) => &path[..at],
        None => path,
    }
}

/// The host name routes match: a fully qualified `name.` is the same name as `name` (RFC 1034 §3.1),
/// as nginx and Envoy's `strip_trailing_host_dot` treat it. One dot is dropped, never the whole name.
pub(crate) fn without_root_dot(host: &str) -> &str {
    match host.strip_suffix('.') {
        Some(name) if !name.is_empty() => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn normalised(path: &str) -> Result<String, ErrorKind> {
        normalise(path).map(Cow::into_owned)
    }

    #[test]
    fn paths_are_decoded_merged_and_resolved() {
        for (path, expected) in [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b/"),
            ("/%61dmin/users", "/admin/users"),
            ("/adm%69n/users", "/admin/users"),
            ("/%7e%2D%5f%2E%30Z", "/~-_.0Z"),
            ("//admin/users", "/admin/users"),
            ("/admin//users//", "/admin/users/"),
            ("//", "/"),
            ("/x/../admin", "/admin"),
            ("/public/%2e%2e/admin/x", "/admin/x"),
            ("/public/%2E./admin", "/admin"),
            ("/a/./b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/a/..", "/"),
            ("/a//../b", "/b"),
            ("/a/.../b", "/a/.../b"),
            ("/.well-known/x", "/.well-known/x"),
            ("/a%20b/%c3%a9", "/a%20b/%C3%A9"),
            ("/%252e%252e/x", "/%252e%252e/x"),
            ("/a%3bb/x", "/a%3Bb/x"),
            ("/page;jsessionid=1", "/page;jsessionid=1"),
            ("/a/;jsessionid=1", "/a/;jsessionid=1"),
            ("/a/b%3B", "/a/b%3B"),
        ] {
            assert_eq!(normalised(path).as_deref(), Ok(expected), "{path}");
        }
    }

    #[test]
    fn what_backends_read_differently_is_refused() {
        for path in [
            "/..;/admin",
            "/public/..;/admin",
            "/public/.;/admin",
            "/public/%2e%2E;x/admin",
            "/admin;x=y/users",
            "/;x/admin",
            "/a/..;",
            "/a/.;x",
            "/a%2fb",
            "/a%2F..%2Fadmin",
            "/a%5cb",
            "/a\\b",
            "/a%00b",
            "/%c0%ae%c0%ae/admin",
            "/%c3",
            "/%c3/%a9",
            "/%ff",
        ] {
            assert_eq!(normalised(path), Err(ErrorKind::AmbiguousPath), "{path}");
        }
        for path in [
            "/../etc/passwd",
            "/%2e%2e/admin",
            "/a/../../b",
            "//..",
            "/%zz",
            "/a%4",
            "/a%",
        ] {
            assert_eq!(normalised(path), Err(ErrorKind::InvalidPath), "{path}");
        }
    }

    #[test]
    fn a_normal_path_is_borrowed() {
        for path in ["/", "/a/b.c/d", "/.well-known", "/p;v=1", "/a/b/", "*"] {
            assert!(
                matches!(normalise(path), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
        assert!(is_normal("/api/v1/users/12345.json"));
        for path in ["/a%20", "/a//b", "/a/./b", "/a;b", "/a\\b"] {
            assert!(!is_normal(path), "{path}");
        }
    }

    #[test]
    fn the_query_is_kept_as_sent() {
        let mut uri: Uri = "/p/%2e%2e/%71?x=/../%61&y=%2f".parse().expect("uri");
        normalise_uri(&mut uri).expect("normalised");
        assert_eq!(uri, "/q?x=/../%61&y=%2f");
        let mut absolute: Uri = "http://a.test//x?q".parse().expect("uri");
        normalise_uri(&mut absolute).expect("normalised");
        assert_eq!(absolute, "http://a.test/x?q");
    }

    #[test]
    fn parameters_of_the_last_segment_are_left_out_of_the_path_routes_match() {
        for (path, routed) in [
            ("/actuator/env;x", "/actuator/env"),
            ("/actuator/env;", "/actuator/env"),
            ("/users/42;jsessionid=1;b=2", "/users/42"),
            ("/a/;jsessionid=1", "/a/"),
            ("/a/b%3Bc", "/a/b%3Bc"),
            ("/a/b", "/a/b"),
        ] {
            let normalised = normalise(path).expect("normalised");
            assert_eq!(without_parameters(&normalised), routed, "{path}");
        }
    }

    #[test]
    fn a_trailing_dot_names_the_same_host() {
        assert_eq!(without_root_dot("api.example.com."), "api.example.com");
        assert_eq!(without_root_dot("api.example.com"), "api.example.com");
        assert_eq!(without_root_dot("a.."), "a.");
        assert_eq!(without_root_dot("."), ".");
    }

    /// Every `%XX` decoded (the test's reference decoder).
    fn decode_all(path: &str) -> String {
        let bytes = path.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes.get(i + 1..i + 3).filter(|_| bytes[i] == b'%') {
                Some(hex) => {
                    let text = std::str::from_utf8(hex).expect("ascii");
                    out.push(u8::from_str_radix(text, 16).expect("hex"));
                    i += 3;
                }
                None => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).expect("utf-8")
    }

    /// Paths built from pieces that exercise every rule, reserved escapes included; the pieces that get
    /// a path refused are rarer, so that most paths are normalised.
    fn any_path() -> impl Strategy<Value = String> {
        let fine = prop::sample::select(vec![
            "a", "B", "~", "-_", ".", "..", "", "%2e", "%2E", "%61", "%7e", "%41", "%3b", "%20",
            "%c3%a9", "%25", "é", "x;y",
        ]);
        let refused =
            prop::sample::select(vec![";", "%2f", "%5C", "\\", "%00", "%C0%AE", "%2", "%"]);
        let piece = prop_oneof![12 => fine, 1 => refused];
        let segment = prop::collection::vec(piece, 0..3).prop_map(|p| p.concat());
        prop::collection::vec(segment, 0..6).prop_map(|s| format!("/{}", s.join("/")))
    }

    /// Paths whose only escapes are of unreserved characters.
    fn unreserved_path() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "a", "B", "~", "-_", ".", "..", "", "%2e", "%2E", "%61", "%7e", "%41", "%5f", "x;y",
            "é",
        ]);
        let segment = prop::collection::vec(piece, 0..3).prop_map(|p| p.concat());
        prop::collection::vec(segment, 0..6).prop_map(|s| format!("/{}", s.join("/")))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn normalising_is_idempotent_and_leaves_nothing_to_normalise(path in any_path()) {
            if let Ok(once) = normalise(&path) {
                prop_assert!(matches!(normalise(&once), Ok(Cow::Borrowed(_))), "{path} -> {once}");
                prop_assert!(once.starts_with('/'));
                prop_assert!(!once.contains("//"), "{path} -> {once}");
                prop_assert!(once[1..].split('/').all(|s| s != "." && s != ".."), "{path} -> {once}");
                let bytes = once.as_bytes();
                for (i, _) in once.match_indices('%') {
                    let hex = &bytes[i + 1..i + 3];
                    let value = u8::from_str_radix(std::str::from_utf8(hex).expect("ascii"), 16);
                    let value = value.expect("a well-formed escape");
                    prop_assert!(!is_unreserved(value), "{path} -> {once}");
                    prop_assert!(!hex.iter().any(u8::is_ascii_lowercase), "{path} -> {once}");
                }
            }
        }

        #[test]
        fn decoding_commutes_with_normalising(path in unreserved_path()) {
            let normalised_then_decoded = normalise(&path).map(|p| decode_all(&p));
            let decoded_then_normalised = normalise(&decode_all(&path)).map(Cow::into_owned);
            prop_assert_eq!(normalised_then_decoded, decoded_then_normalised, "{}", path);
        }

        #[test]
        fn any_text_is_normalised_or_refused_without_panicking(path in "/[a-f0-9%./;\\\\~_-]{0,24}") {
            if let Ok(once) = normalise(&path) {
                prop_assert_eq!(normalise(&once).map(Cow::into_owned), Ok(once.clone().into_owned()));
            }
        }
    }
}
