//! What the control plane publishes to the workers: which host names resolve to which addresses, and
//! which endpoints pass their health checks. Workers apply both between requests.

use duet_config::{BackendAddress, Cluster, Config};
use std::{collections::HashMap, net::SocketAddr, sync::Arc};

/// One endpoint of a cluster: an address and the weight of the backend entry it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Where to connect.
    pub address: SocketAddr,
    /// The weight of the backend entry (every address of a name takes the name's weight).
    pub weight: u32,
}

/// The addresses each backend host name resolved to, as the binary's discovery last saw them. A name
/// with no entry has not resolved yet: it contributes no endpoint (requests get 503 until it resolves).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResolvedNames {
    names: HashMap<(String, u16), Arc<[SocketAddr]>>,
}

impl ResolvedNames {
    /// No name resolved.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the addresses of `host:port`.
    pub fn insert(&mut self, host: &str, port: u16, addresses: Vec<SocketAddr>) {
        self.names.insert((host.to_owned(), port), addresses.into());
    }

    /// The addresses of `host:port`, if it has resolved.
    pub fn get(&self, host: &str, port: u16) -> Option<&[SocketAddr]> {
        self.names
            .get(&(host.to_owned(), port))
            .map(|addresses| &addresses[..])
    }

    /// A cluster's endpoints: its IP backends as written, each name's resolved addresses with the
    /// name's weight. An address reached twice (two names, or a name and an IP) is one endpoint: the
    /// first entry's.
    pub fn endpoints(&self, cluster: &Cluster) -> Vec<Endpoint> {
        let mut out: Vec<Endpoint> = Vec::with_capacity(cluster.backends.len());
        let mut add = |address: SocketAddr, weight: u32| {
            if !out.iter().any(|e| e.address == address) {
                out.push(Endpoint { address, weight });
            }
        };
        for backend in &cluster.backends {
            match &backend.address {
                BackendAddress::Ip(address) => add(*address, backend.weight),
                BackendAddress::Name { host, port } => {
                    for &address in self.get(host, *port).unwrap_or_default() {
                        add(address, backend.weight);
                    }
                }
            }
        }
        out
    }
}

/// Which endpoints pass their health checks, by cluster name and address. Endpoints of clusters without
/// checks have no entry: they are always healthy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthView {
    clusters: HashMap<String, HashMap<SocketAddr, bool>>,
}

impl HealthView {
    /// The view for `config`'s endpoints before their checks have run: endpoints kept from `previous`
    /// keep their state; new endpoints of checked clusters start unhealthy, admitted after their first
    /// passing check (as Envoy does).
    pub fn for_config(config: &Config, names: &ResolvedNames, previous: &HealthView) -> Self {
        let clusters = config
            .clusters
            .iter()
            .filter(|c| c.health_check.is_some())
            .map(|c| {
                let endpoints = names
                    .endpoints(c)
                    .into_iter()
                    .map(|e| {
                        let was = previous.healthy(&c.name, e.address).unwrap_or(false);
                        (e.address, was)
                    })
                    .collect();
                (c.name.clone(), endpoints)
            })
            .collect();
        Self { clusters }
    }

    /// Whether a checked endpoint is healthy; `None` if it is not checked.
    pub fn healthy(&self, cluster: &str, endpoint: SocketAddr) -> Option<bool> {
        self.clusters
            .get(cluster)
            .and_then(|c| c.get(&endpoint))
            .copied()
    }

    /// Records a check's verdict; returns whether it changed anything.
    pub fn set(&mut self, cluster: &str, endpoint: SocketAddr, healthy: bool) -> bool {
        match self
            .clusters
            .get_mut(cluster)
            .and_then(|c| c.get_mut(&endpoint))
        {
            Some(slot) if *slot != healthy => {
                *slot = healthy;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_expand_to_their_addresses_with_their_weight() {
        let yaml = "listeners: [ { address: 127.0.0.1:0 } ]\nroutes: [ { cluster: app } ]\nclusters:\n  - name: app\n    backends:\n      - { address: 127.0.0.1:1 }\n      - { address: app.test:80, weight: 3 }\n      - { address: other.test:80 }\n";
        let config = duet_config::parse(yaml, "t.yaml").expect("valid");
        let cluster = &config.clusters[0];
        let mut names = ResolvedNames::new();
        let ip = |last: u8| SocketAddr::from(([127, 0, 0, last], 80));
        assert_eq!(
            names.endpoints(cluster),
            vec![Endpoint {
                address: "127.0.0.1:1".parse().expect("address"),
                weight: 1
            }],
            "an unresolved name adds nothing"
        );
        names.insert("app.test", 80, vec![ip(2), ip(3)]);
        names.insert("other.test", 80, vec![ip(3), ip(4)]);
        let endpoints = names.endpoints(cluster);
        let got: Vec<(SocketAddr, u32)> = endpoints.iter().map(|e| (e.address, e.weight)).collect();
        assert_eq!(
            got,
            vec![
                ("127.0.0.1:1".parse().expect("address"), 1),
                (ip(2), 3),
                (ip(3), 3),
                (ip(4), 1)
            ],
            "an address reached twice is the first entry's"
        );
    }
}
