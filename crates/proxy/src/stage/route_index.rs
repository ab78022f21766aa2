//! The routes a request may take, found by its host without scanning the table: first match wins
//! over the whole list, so the index only narrows it to a subsequence, in the list's order, that holds
//! every route that could match.
//!
//! A route with an exact `host` can only match that host: it is listed under it. A wildcard route
//! (`*.example.com`) can only match hosts under its suffix: it is listed under the suffix
//! (`example.com`), and a request's host finds it by walking its own dot-suffixes, longest first
//! (`a.b.example.com`: `b.example.com`, `example.com`, `com`). Each suffix's list also holds the
//! routes of the suffixes above it (`*.com`'s under `example.com`), so the first suffix found lists
//! every wildcard route the host can match. Routes without a host are listed once, apart. The three
//! lists are merged in order on each lookup. A table of 1,000 exact-host or wildcard routes costs a few
//! hash lookups and a handful of route checks per request instead of up to 1,000 (see
//! `benches/routing.rs`).

use crate::path;
use duet_config::{HostPattern, Route};
use rustc_hash::FxHashMap;

/// The routes of a table by exact host and by wildcard suffix. Host names come from the
/// configuration; the lookup's key comes from the client, but only to read the maps, so a fast
/// non-keyed hash is enough.
#[derive(Debug, Default)]
pub struct RouteIndex {
    /// Positions of the routes with this exact host (lowercased, no trailing dot), in order.
    by_host: FxHashMap<Box<str>, Box<[u32]>>,
    /// Positions of the wildcard routes a host under this suffix (`example.com`, lowercased, for
    /// `*.example.com`) can match: its own and those of every suffix above it, in order.
    by_suffix: FxHashMap<Box<str>, Box<[u32]>>,
    /// Positions of the routes for any host (and of a wildcard with no suffix to index by, which
    /// only a route built in code can have), in order.
    others: Box<[u32]>,
}

impl RouteIndex {
    /// The index of `routes` (positions above `u32::MAX` are never reached: a config is far smaller).
    pub fn new(routes: &[Route]) -> Self {
        let mut by_host: FxHashMap<Box<str>, Vec<u32>> = FxHashMap::default();
        let mut by_own_suffix: FxHashMap<Box<str>, Vec<u32>> = FxHashMap::default();
        let mut others = Vec::new();
        for (position, route) in routes.iter().enumerate() {
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            match &route.host {
                Some(HostPattern::Exact(host)) => by_host
                    .entry(host.as_str().into())
                    .or_default()
                    .push(position),
                Some(HostPattern::Wildcard(suffix)) => match suffix.strip_prefix('.') {
                    Some(key) if !key.is_empty() => by_own_suffix
                        .entry(key.to_ascii_lowercase().into())
                        .or_default()
                        .push(position),
                    _ => others.push(position),
                },
                None => others.push(position),
            }
        }
        let by_suffix = (by_own_suffix.iter())
            .map(|(key, own)| {
                let mut list = own.clone();
                for above in dot_suffixes(key, 0) {
                    list.extend(by_own_suffix.get(above).into_iter().flatten());
                }
                // Each route is under one suffix: sorting merges without duplicates.
                list.sort_unstable();
                (key.clone(), list.into_boxed_slice())
            })
            .collect();
        Self {
            by_host: (by_host.into_iter())
                .map(|(host, list)| (host, list.into_boxed_slice()))
                .collect(),
            by_suffix,
            others: others.into_boxed_slice(),
        }
    }

    /// The positions of the routes a request for `host` (as sent: any case, maybe a port or a trailing
    /// dot) may take, in the table's order.
    pub(crate) fn candidates(&self, host: Option<&str>) -> Candidates<'_> {
        let mut lists: [&[u32]; 3] = [&[], &[], &self.others];
        // A table with no route by host (many have none) has nothing to look a host up in.
        let by_host = !(self.by_host.is_empty() && self.by_suffix.is_empty());
        if let Some(host) = host.filter(|_| by_host) {
            let name = path::without_root_dot(strip_port(host));
            let lowercased;
            let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                lowercased = name.to_ascii_lowercase();
                lowercased.as_str()
            } else {
                name
            };
            lists[0] = self.by_host.get(name).map_or(&[], |l| &**l);
            lists[1] = self.wildcards(name);
        }
        Candidates { lists }
    }

    /// The wildcard routes `name` (lowercased) can match: those of its longest suffix in the index. A
    /// wildcard needs at least one character before its dot, so the name itself is no suffix.
    fn wildcards(&self, name: &str) -> &[u32] {
        if self.by_suffix.is_empty() {
            return &[];
        }
        dot_suffixes(name, 1)
            .find_map(|suffix| self.by_suffix.get(suffix))
            .map_or(&[], |l| &**l)
    }
}

/// What follows each dot of `name` at or after byte `from`, longest first.
fn dot_suffixes(name: &str, from: usize) -> impl Iterator<Item = &str> {
    (name.bytes().enumerate().skip(from))
        .filter(|&(_, b)| b == b'.')
        .filter_map(move |(at, _)| name.get(at + 1..))
}

/// `host` without its port (`[v6]:port`, `name:port`).
pub(crate) fn strip_port(host: &str) -> &str {
    if let Some(bracketed) = host.strip_prefix('[') {
        // [v6]:port
        return bracketed.split(']').next().unwrap_or(bracketed);
    }
    // The last byte that is not a digit is the last `:` exactly when a port (digits, maybe none)
    // follows it: one backward pass over bytes, cheaper than a search for `:` and then a check of
    // what follows (~230 instructions per request).
    let bytes = host.as_bytes();
    match bytes.iter().rposition(|b| !b.is_ascii_digit()) {
        Some(colon) if bytes[colon] == b':' => host.get(..colon).unwrap_or(host),
        _ => host,
    }
}

/// Ordered lists of positions (the host's own routes, its wildcards', any host's), merged in order.
pub(crate) struct Candidates<'a> {
    lists: [&'a [u32]; 3],
}

impl Iterator for Candidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let (list, _) = (self.lists.iter().enumerate())
            .filter_map(|(i, list)| Some((i, *list.first()?)))
            .min_by_key(|&(_, first)| first)?;
        let (first, rest) = self.lists[list].split_first()?;
        self.lists[list] = rest;
        Some(*first as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_stripped_as_a_search_for_the_last_colon_would() {
        let by_search = |host: &'static str| -> &'static str {
            if let Some(bracketed) = host.strip_prefix('[') {
                return bracketed.split(']').next().unwrap_or(bracketed);
            }
            match host.rsplit_once(':') {
                Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
                _ => host,
            }
        };
        let hosts = [
            "",
            ":",
            "::",
            "1",
            "80",
            ":80",
            "a",
            "a:",
            "a:80",
            "a:8x",
            "a:x8",
            "a.b:1:2",
            "a:1:b",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:443",
            "é:1",
            "1é",
            "é:",
            "a:é1",
            "example.com:443",
            "example.com.:",
            "x:12345678901234567890",
        ];
        for host in hosts {
            assert_eq!(strip_port(host), by_search(host), "{host:?}");
        }
    }

    fn index(routes: &str) -> RouteIndex {
        let yaml = format!("listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n{routes}clusters:\n  - {{ name: a, backends: [ {{ address: 127.0.0.1:1 }} ] }}\n");
        RouteIndex::new(&duet_config::parse(&yaml, "t.yaml").expect("valid").routes)
    }

    #[test]
    fn a_hosts_own_routes_merge_in_order_with_the_routes_for_any_host() {
        let index = index("  - { match: { host: '*.example.com' }, cluster: a }\n  - { match: { host: api.example.com }, cluster: a }\n  - { match: { path_prefix: /x }, cluster: a }\n  - { match: { host: web.example.com }, cluster: a }\n  - { match: { host: api.example.com, path_prefix: /v2 }, cluster: a }\n  - { cluster: a }\n");
        let of = |host| index.candidates(host).collect::<Vec<_>>();
        assert_eq!(of(Some("API.example.com.:8080")), [0, 1, 2, 4, 5]);
        assert_eq!(of(Some("web.example.com")), [0, 2, 3, 5]);
        assert_eq!(of(Some("other.test")), [2, 5]);
        assert_eq!(of(None), [2, 5]);
    }

    #[test]
    fn a_table_without_host_routes_gives_every_host_its_routes_in_order() {
        let index = index("  - { match: { path_prefix: /x }, cluster: a }\n  - { cluster: a }\n");
        for host in [
            Some("API.example.com.:8080"),
            Some("[::1]:80"),
            Some(""),
            None,
        ] {
            assert_eq!(
                index.candidates(host).collect::<Vec<_>>(),
                [0, 1],
                "{host:?}"
            );
        }
    }

    #[test]
    fn a_host_finds_every_wildcard_above_it_in_order_and_no_other() {
        let index = index(concat!(
            "  - { match: { host: '*.b.example.com' }, cluster: a }\n", // 0
            "  - { match: { host: '*.com' }, cluster: a }\n",           // 1
            "  - { match: { host: a.b.example.com }, cluster: a }\n",   // 2
            "  - { match: { path_prefix: /x }, cluster: a }\n",         // 3
            "  - { match: { host: '*.example.com' }, cluster: a }\n",   // 4
            "  - { match: { host: '*.a.b.example.com' }, cluster: a }\n", // 5
            "  - { match: { host: '*.b.example.com', path_prefix: /v2 }, cluster: a }\n", // 6
            "  - { match: { host: '*.example.org' }, cluster: a }\n",   // 7
            "  - { cluster: a }\n",                                     // 8
        ));
        let of = |host| index.candidates(Some(host)).collect::<Vec<_>>();
        // Its exact routes, every wildcard it falls under (not its own name's: `*.a.b.example.com`
        // needs a label before `a`), the routes for any host: in the table's order.
        assert_eq!(of("A.B.Example.COM.:443"), [0, 1, 2, 3, 4, 6, 8]);
        assert_eq!(of("x.a.b.example.com"), [0, 1, 3, 4, 5, 6, 8]);
        // Under a suffix no wildcard names: the nearest one above it.
        assert_eq!(of("x.y.example.com"), [1, 3, 4, 8]);
        // A wildcard never matches its bare suffix.
        assert_eq!(of("example.com"), [1, 3, 8]);
        assert_eq!(of("b.example.com"), [1, 3, 4, 8]);
        assert_eq!(of("com"), [3, 8]);
        assert_eq!(of("www.example.org"), [3, 7, 8]);
        assert_eq!(of("[::1]:8080"), [3, 8]);
        // A leading dot is no label: `.com` is not under `*.com`, `a..com` is.
        assert_eq!(of(".com"), [3, 8]);
        assert_eq!(of("a..com"), [1, 3, 8]);
    }
}
