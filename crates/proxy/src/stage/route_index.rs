//! The routes a request may take, found by its host without scanning the table: first match wins
//! over the whole list, so the index only narrows it to a subsequence, in the list's order, that holds
//! every route that could match.
//!
//! A route with an exact `host` can only match that host: it is listed under it. Routes without a
//! host, or with a wildcard, can match many: they are listed once, apart, and merged in order with the
//! host's own list on each lookup. A table of 1,000 exact-host routes costs a hash lookup and a
//! handful of route checks per request instead of up to 1,000 (see `benches/routing.rs`).

use crate::path;
use duet_config::{HostPattern, Route};
use rustc_hash::FxHashMap;

/// The routes of a table by exact host. Host names come from the configuration; the lookup's key
/// comes from the client, but only to read the map, so a fast non-keyed hash is enough.
#[derive(Debug, Default)]
pub struct RouteIndex {
    /// Positions of the routes with this exact host (lowercased, no trailing dot), in order.
    by_host: FxHashMap<Box<str>, Box<[u32]>>,
    /// Positions of the routes without an exact host (none, or a wildcard), in order.
    others: Box<[u32]>,
}

impl RouteIndex {
    /// The index of `routes` (positions above `u32::MAX` are never reached: a config is far smaller).
    pub fn new(routes: &[Route]) -> Self {
        let mut by_host: FxHashMap<Box<str>, Vec<u32>> = FxHashMap::default();
        let mut others = Vec::new();
        for (position, route) in routes.iter().enumerate() {
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            match &route.host {
                Some(HostPattern::Exact(host)) => by_host
                    .entry(host.as_str().into())
                    .or_default()
                    .push(position),
                None | Some(HostPattern::Wildcard(_)) => others.push(position),
            }
        }
        Self {
            by_host: (by_host.into_iter())
                .map(|(host, list)| (host, list.into_boxed_slice()))
                .collect(),
            others: others.into_boxed_slice(),
        }
    }

    /// The positions of the routes a request for `host` (as sent: any case, maybe a port or a trailing
    /// dot) may take, in the table's order.
    pub(crate) fn candidates(&self, host: Option<&str>) -> Candidates<'_> {
        let own = host.and_then(|host| self.exact(host)).unwrap_or_default();
        Candidates {
            own,
            others: &self.others,
        }
    }

    fn exact(&self, host: &str) -> Option<&[u32]> {
        let name = path::without_root_dot(strip_port(host));
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return self
                .by_host
                .get(name.to_ascii_lowercase().as_str())
                .map(|l| &**l);
        }
        self.by_host.get(name).map(|l| &**l)
    }
}

/// `host` without its port (`[v6]:port`, `name:port`).
pub(crate) fn strip_port(host: &str) -> &str {
    if let Some(bracketed) = host.strip_prefix('[') {
        // [v6]:port
        return bracketed.split(']').next().unwrap_or(bracketed);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Two ordered lists of positions, merged in order.
pub(crate) struct Candidates<'a> {
    own: &'a [u32],
    others: &'a [u32],
}

impl Iterator for Candidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let take_own = match (self.own.first(), self.others.first()) {
            (Some(own), Some(other)) => own < other,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        let list = if take_own {
            &mut self.own
        } else {
            &mut self.others
        };
        let (first, rest) = list.split_first()?;
        *list = rest;
        Some(*first as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_own_routes_merge_in_order_with_the_routes_for_any_host() {
        let yaml = "listeners: [ { address: 127.0.0.1:0 } ]\nroutes:\n  - { match: { host: '*.example.com' }, cluster: a }\n  - { match: { host: api.example.com }, cluster: a }\n  - { match: { path_prefix: /x }, cluster: a }\n  - { match: { host: web.example.com }, cluster: a }\n  - { match: { host: api.example.com, path_prefix: /v2 }, cluster: a }\n  - { cluster: a }\nclusters:\n  - { name: a, backends: [ { address: 127.0.0.1:1 } ] }\n";
        let routes = duet_config::parse(yaml, "t.yaml").expect("valid").routes;
        let index = RouteIndex::new(&routes);
        let of = |host| index.candidates(host).collect::<Vec<_>>();
        assert_eq!(of(Some("API.example.com.:8080")), [0, 1, 2, 4, 5]);
        assert_eq!(of(Some("web.example.com")), [0, 2, 3, 5]);
        assert_eq!(of(Some("other.test")), [0, 2, 5]);
        assert_eq!(of(None), [0, 2, 5]);
    }
}
