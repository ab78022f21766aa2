//! Shadowed routes: a route that can never match, because a route before it matches every request it
//! would (first match wins). Not an error — the config works, the route is just dead — so it is a
//! warning, from `duet check` and when duet loads the file.
//!
//! Conservative: a route is reported only when every matcher of the earlier one provably holds for
//! every request the later one matches. A regex is never compared with anything: a later regex path
//! counts as covered only by an earlier catch-all prefix (`/`), and an earlier regex path covers nothing.

use crate::model::{Config, HeaderMatch, HostPattern, Location, PathMatch, Route, ValueMatch};
use std::fmt;

/// A route that can never match, and the earlier route that always wins over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadowed {
    /// The dead route's name.
    pub route: String,
    /// Where it is written.
    pub at: Location,
    /// The earlier route that takes all its requests.
    pub by: String,
    /// Where that one is written.
    pub by_at: Location,
}

impl fmt::Display for Shadowed {
    /// `line 12: route `b` can never match: route `a` (line 5) comes first and matches every request it would`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}: route `{}` can never match: route `{}` (line {}) comes first and matches every request it would",
            self.at.line, self.route, self.by, self.by_at.line
        )
    }
}

/// Every route of `config` that an earlier route shadows, each with the first route that does.
pub fn shadowed_routes(config: &Config) -> Vec<Shadowed> {
    let routes = &config.routes;
    routes
        .iter()
        .enumerate()
        .filter_map(|(i, later)| {
            let earlier = routes[..i].iter().find(|e| covers(e, later))?;
            Some(Shadowed {
                route: later.name.clone(),
                at: later.at,
                by: earlier.name.clone(),
                by_at: earlier.at,
            })
        })
        .collect()
}

/// Whether every request `later` matches is also matched by `earlier`.
fn covers(earlier: &Route, later: &Route) -> bool {
    listeners_cover(earlier, later)
        && host_covers(earlier.host.as_ref(), later.host.as_ref())
        && path_covers(&earlier.path, &later.path)
        && (earlier.methods.is_empty()
            || (!later.methods.is_empty()
                && later.methods.iter().all(|m| earlier.methods.contains(m))))
        && earlier
            .headers
            .iter()
            .all(|wanted| later.headers.iter().any(|h| header_implies(h, wanted)))
        && earlier.query.iter().all(|pair| later.query.contains(pair))
}

fn listeners_cover(earlier: &Route, later: &Route) -> bool {
    match (&earlier.listeners, &later.listeners) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(wide), Some(narrow)) => narrow.iter().all(|l| wide.contains(l)),
    }
}

fn host_covers(earlier: Option<&HostPattern>, later: Option<&HostPattern>) -> bool {
    match (earlier, later) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(HostPattern::Exact(a)), Some(HostPattern::Exact(b))) => a == b,
        (Some(HostPattern::Exact(_)), Some(HostPattern::Wildcard(_))) => false,
        (Some(HostPattern::Wildcard(suffix)), Some(HostPattern::Exact(host))) => {
            host.len() > suffix.len() && host.ends_with(suffix.as_str())
        }
        // `*.a.example.com` names only hosts that `*.example.com` names too.
        (Some(HostPattern::Wildcard(wide)), Some(HostPattern::Wildcard(narrow))) => {
            narrow.ends_with(wide.as_str())
        }
    }
}

fn path_covers(earlier: &PathMatch, later: &PathMatch) -> bool {
    match (earlier, later) {
        // A normalised path always starts with `/`: `/` (or nothing) is every path.
        (PathMatch::Prefix(prefix), PathMatch::Regex(_)) => prefix.is_empty() || prefix == "/",
        (PathMatch::Prefix(prefix), PathMatch::Prefix(p) | PathMatch::Exact(p)) => {
            p.starts_with(prefix.as_str())
        }
        (PathMatch::Exact(a), PathMatch::Exact(b)) => a == b,
        (PathMatch::Exact(_), _) | (PathMatch::Regex(_), _) => false,
    }
}

/// Whether a request that satisfies `later`'s header matcher always satisfies `wanted` (same name).
fn header_implies(later: &HeaderMatch, wanted: &HeaderMatch) -> bool {
    if later.name != wanted.name {
        return false;
    }
    match (&later.value, &wanted.value) {
        (ValueMatch::Exact(a), ValueMatch::Exact(b)) => a == b,
        (ValueMatch::Exact(a), ValueMatch::Regex(p)) => p.regex().is_match(a),
        (ValueMatch::Regex(a), ValueMatch::Regex(b)) => a == b,
        (ValueMatch::Regex(_), ValueMatch::Exact(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shadowed(routes: &str) -> Vec<(String, u64, String, u64)> {
        let yaml = format!(
            "listeners: [ {{ name: a, address: 127.0.0.1:0 }}, {{ name: b, address: 127.0.0.1:1 }} ]\nclusters:\n  - {{ name: c, backends: [ {{ address: 127.0.0.1:9 }} ] }}\nroutes:\n{routes}"
        );
        let config = crate::parse(&yaml, "t.yaml").expect("valid");
        shadowed_routes(&config)
            .into_iter()
            .map(|s| (s.route, s.at.line, s.by, s.by_at.line))
            .collect()
    }

    fn pair(route: &str, line: u64, by: &str, by_line: u64) -> (String, u64, String, u64) {
        (route.to_owned(), line, by.to_owned(), by_line)
    }

    #[test]
    fn a_wider_prefix_first_shadows_a_narrower_one_with_both_lines() {
        let found = shadowed(
            "  - { name: all, match: { path_prefix: /api }, cluster: c }\n  - { name: v1, match: { path_prefix: /api/v1 }, cluster: c }\n  - { name: exact, match: { path: { exact: /api/x } }, cluster: c }\n",
        );
        assert_eq!(found, [pair("v1", 6, "all", 5), pair("exact", 7, "all", 5)]);
    }

    #[test]
    fn hosts_cover_by_wildcard_and_a_hostless_route_covers_every_host() {
        let found = shadowed(
            "  - { name: wild, match: { host: '*.example.com' }, cluster: c }\n  - { name: api, match: { host: api.example.com, path_prefix: /v1 }, cluster: c }\n  - { name: deeper, match: { host: '*.a.example.com' }, cluster: c }\n  - { name: apex, match: { host: example.com }, cluster: c }\n  - { name: other, match: { host: example.org }, cluster: c }\n",
        );
        assert_eq!(
            found,
            [pair("api", 6, "wild", 5), pair("deeper", 7, "wild", 5)],
            "the apex and another domain are not under *.example.com"
        );
    }

    #[test]
    fn a_narrower_or_differently_restricted_earlier_route_shadows_nothing() {
        let found = shadowed(
            "  - { name: v1, match: { path_prefix: /api/v1 }, cluster: c }\n  - { name: api, match: { path_prefix: /api }, cluster: c }\n  - { name: get, match: { method: [GET], path_prefix: /x }, cluster: c }\n  - { name: x, match: { path_prefix: /x }, cluster: c }\n  - { name: hdr, match: { headers: { x-env: canary }, path_prefix: /h }, cluster: c }\n  - { name: h, match: { path_prefix: /h }, cluster: c }\n  - { name: q, match: { query: { debug: '1' }, path_prefix: /q }, cluster: c }\n  - { name: qq, match: { path_prefix: /q }, cluster: c }\n  - { name: only-a, match: { path_prefix: /l }, listeners: [a], cluster: c }\n  - { name: l, match: { path_prefix: /l }, cluster: c }\n  - { name: host, match: { host: h.example, path_prefix: /z }, cluster: c }\n  - { name: z, match: { path_prefix: /z }, cluster: c }\n",
        );
        assert_eq!(found, []);
    }

    #[test]
    fn restrictions_the_later_route_also_has_still_shadow() {
        let found = shadowed(
            "  - { name: get, match: { method: [GET, HEAD], headers: { x-env: canary }, query: { a: '1' }, path_prefix: /x }, listeners: [a, b], cluster: c }\n  - { name: later, match: { method: [GET], headers: { x-env: canary, x-user: u }, query: { a: '1', b: '2' }, path_prefix: /x/y }, listeners: [a], cluster: c }\n  - { name: regex-hdr, match: { headers: { x-user: { regex: '^u[0-9]+$' } } }, cluster: c }\n  - { name: exact-hdr, match: { headers: { x-user: u7 }, path_prefix: /p }, cluster: c }\n",
        );
        assert_eq!(
            found,
            [
                pair("later", 6, "get", 5),
                pair("exact-hdr", 8, "regex-hdr", 7)
            ]
        );
    }

    #[test]
    fn regexes_are_only_shadowed_by_a_catch_all_and_shadow_nothing() {
        let found = shadowed(
            "  - { name: users, match: { path: { regex: '^/users' } }, cluster: c }\n  - { name: u, match: { path_prefix: /users/1 }, cluster: c }\n  - { name: api, match: { path_prefix: /api }, cluster: c }\n  - { name: api-re, match: { path: { regex: '^/api/[0-9]+$' } }, cluster: c }\n  - { name: all, match: { path_prefix: / }, cluster: c }\n  - { name: re, match: { path: { regex: '^/x$' } }, cluster: c }\n  - { name: redirect, match: { path_prefix: /r }, redirect: { path: /s } }\n",
        );
        assert_eq!(
            found,
            [pair("re", 10, "all", 9), pair("redirect", 11, "all", 9)]
        );
    }
}
