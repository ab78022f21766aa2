//! `rewrite: { path | path_prefix, host }`: the path and Host a backend gets instead of the request's.
//! The Host is set after the route's request edits (which may not name Host); `X-Forwarded-Host` still
//! names the request's.
//!
//! Both work on the normalised path (the one routed on) and keep the query as sent. `path_prefix` is
//! Gateway API's `ReplacePrefixMatch`: it replaces exactly the prefix the route matched, segment by
//! segment, so neither a trailing `/` on the prefix nor on the replacement doubles or loses a slash:
//!
//! | path       | matched | replacement | backend gets |
//! |------------|---------|-------------|--------------|
//! | `/foo/bar` | `/foo`  | `/xyz`      | `/xyz/bar`   |
//! | `/foo/bar` | `/foo/` | `/xyz/`     | `/xyz/bar`   |
//! | `/foo`     | `/foo`  | `/xyz/`     | `/xyz/`      |
//! | `/foo/`    | `/foo`  | `/xyz`      | `/xyz/`      |
//! | `/foo/bar` | `/foo`  | `/`         | `/bar`       |
//! | `/`        | `/`     | `/v2`       | `/v2`        |
//! | `/a/b`     | `/`     | `/v2`       | `/v2/a/b`    |
//!
//! duet's prefixes are plain string prefixes, so `/foo` also matches `/foobar`: there the matched text
//! is replaced as is (`/xyzbar`), and the result normalised again, so no rewrite ever produces `//`, a
//! dot segment or a path above `/` (one that would, as `/foo..` rewritten from `/foo` to `/`, is 400).

use crate::{
    error::ErrorKind,
    filter::phase::{Build, Phase, Phases},
    path,
};
use duet_config::{PathMatch, PathRewrite, Route};
use http::{header, request, HeaderValue, Uri};

/// A route's `rewrite:`, compiled.
#[derive(Debug)]
pub(crate) struct Rewrite {
    path: Option<(PathRewrite, PathMatch)>,
    host: Option<HeaderValue>,
}

impl Phases for Rewrite {
    const PHASES: Phase = Phase::UPSTREAM_REQUEST;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let rewrite = &route.rewrite;
        let path = (rewrite.path.clone()).map(|path| (path, route.path.clone()));
        let host = (rewrite.host.as_deref()).and_then(|h| HeaderValue::from_str(h).ok());
        (path.is_some() || host.is_some()).then_some(Self { path, host })
    }

    /// The target becomes origin-form (the Host already names the authority). An edge case the
    /// normaliser refuses (see [`path`]) is 400.
    fn on_upstream_request(&self, parts: &mut request::Parts) -> Result<(), ErrorKind> {
        if let Some(host) = &self.host {
            parts.headers.insert(header::HOST, host.clone());
        }
        if let Some((rewrite, matched)) = &self.path {
            parts.uri = path(&parts.uri, rewrite, matched)?;
        }
        Ok(())
    }
}

/// `uri`'s origin-form target with its path rewritten and its query kept.
pub(crate) fn path(
    uri: &Uri,
    rewrite: &PathRewrite,
    matched: &PathMatch,
) -> Result<Uri, ErrorKind> {
    let new = match (rewrite, matched) {
        (PathRewrite::Full(path), _) => path.clone(),
        (PathRewrite::Prefix(new), PathMatch::Prefix(old)) => replace_prefix(uri.path(), old, new)?,
        // The config allows `path_prefix` only on a prefix match.
        (PathRewrite::Prefix(_), _) => uri.path().to_owned(),
    };
    let target = match uri.query() {
        Some(query) => format!("{new}?{query}"),
        None => new,
    };
    Uri::try_from(target).map_err(|_| ErrorKind::InvalidPath)
}

/// `path`, which starts with `old`, with `old` replaced by `new` (both normalised, from `/`).
fn replace_prefix(path: &str, old: &str, new: &str) -> Result<String, ErrorKind> {
    if path == old {
        return Ok(new.to_owned());
    }
    let old = old.strip_suffix('/').unwrap_or(old);
    let rest = path.get(old.len()..).unwrap_or_default();
    if rest.starts_with('/') {
        // A segment boundary: `new` without its trailing slash, then the rest from its slash.
        let new = new.strip_suffix('/').unwrap_or(new);
        return Ok(format!("{new}{rest}"));
    }
    let joined = format!("{new}{rest}");
    Ok(path::normalise(&joined)?.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(target: &str, old: &str, new: &str) -> Result<String, ErrorKind> {
        let uri: Uri = target.parse().expect("uri");
        let rewrite = PathRewrite::Prefix(new.to_owned());
        path(&uri, &rewrite, &PathMatch::Prefix(old.to_owned())).map(|u| u.to_string())
    }

    #[test]
    fn a_prefix_is_replaced_segment_by_segment_as_gateway_api_says() {
        let rows = [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo", "/foo", "/xyz/", "/xyz/"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "/", "/bar"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
            ("/", "/", "/v2", "/v2"),
            ("/a/b?x=1&y", "/", "/v2", "/v2/a/b?x=1&y"),
            ("/foobar", "/foo", "/xyz", "/xyzbar"),
            ("/foobar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo..", "/foo", "/xyz/", "/"),
        ];
        for (target, old, new, want) in rows {
            assert_eq!(
                rewritten(target, old, new).as_deref(),
                Ok(want),
                "{target} {old} -> {new}"
            );
        }
        assert_eq!(
            rewritten("/foo..", "/foo", "/"),
            Err(ErrorKind::InvalidPath),
            "never above /"
        );
    }

    #[test]
    fn a_whole_path_rewrite_keeps_the_query() {
        let uri: Uri = "http://a.test/any/thing?q=%20".parse().expect("uri");
        let rewrite = PathRewrite::Full("/fixed".to_owned());
        let matched = PathMatch::Exact("/any/thing".to_owned());
        assert_eq!(
            path(&uri, &rewrite, &matched).map(|u| u.to_string()),
            Ok("/fixed?q=%20".to_owned())
        );
    }
}
