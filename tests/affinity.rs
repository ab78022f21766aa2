//! `policy: hash` through the real binary: a key goes to the backend the library's Maglev table names
//! for it, from both workers and after a restart; a request without the key is still served (P2C).

use crate::support::{raw_exchange, Duet};
use duet_balance::{algo::stable_hash, Affinity, Balancer, Strategy};
use duet_testbed::config::{Cluster, DuetConfig};
use duet_testbed::{Backend, BackendOptions};
use std::{collections::HashMap, net::SocketAddr, time::Duration};

const USERS: usize = 24;

/// The backend that answers `GET /` with `x-user: user` (or no such header), on a new connection.
fn served_to(address: SocketAddr, user: Option<&str>) -> String {
    let header = user.map_or_else(String::new, |u| format!("x-user: {u}\r\n"));
    let request = format!("GET / HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(address, request.as_bytes(), Duration::from_secs(5));
    response
        .rsplit("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Where the library sends each user over `backends` (by address, as duet keys them).
fn expected(backends: &[(SocketAddr, String)]) -> HashMap<String, String> {
    let mut balance = Balancer::new(Strategy::P2cInflight).with_affinity(Affinity::maglev());
    for (address, name) in backends {
        balance.insert(*address, 1, name.clone());
    }
    (0..USERS)
        .map(|u| {
            let user = format!("user-{u}");
            let key = stable_hash(user.as_bytes());
            let address = balance.pick_for(Some(key)).copied().ok();
            let name = backends.iter().find(|(a, _)| Some(*a) == address);
            (user, name.map(|(_, n)| n.clone()).unwrap_or_default())
        })
        .collect()
}

fn start(backends: &[SocketAddr]) -> Duet {
    let mut cluster = Cluster::new("web")
        .policy("hash")
        .set("hash", "{ key: 'header:x-user', bound: 1.25, walk: p2c }");
    for backend in backends {
        cluster = cluster.backend(*backend);
    }
    let yaml = DuetConfig::new()
        .workers(2)
        .route(None, "/", "web")
        .cluster(cluster)
        .to_yaml();
    Duet::start_with(&yaml, "warn,duet::cli=info")
}

#[test]
fn a_key_goes_to_its_maglev_home_from_every_worker_and_after_a_restart() {
    let backends: Vec<Backend> = (0..4)
        .map(|i| Backend::start(BackendOptions::named(&format!("b{i}"))).expect("backend"))
        .collect();
    let addresses: Vec<SocketAddr> = backends.iter().map(Backend::address).collect();
    let named: Vec<(SocketAddr, String)> = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| (*a, format!("b{i}")))
        .collect();
    let homes = expected(&named);
    // The users are spread: at least three of the four backends are someone's home.
    let mut distinct: Vec<&String> = homes.values().collect();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 3, "{homes:?}");
    for run in 0..2 {
        // Run 1 is a restart: a new process, nothing carried over.
        let duet = start(&addresses);
        let address = duet.address;
        for round in 0..3 {
            // One request at a time, each on a new connection (SO_REUSEPORT spreads them over both
            // workers), so every backend is idle and every key is under the bound: all go home.
            for (user, home) in &homes {
                let served = served_to(address, Some(user));
                assert_eq!(&served, home, "run {run} round {round}: {user}");
            }
        }
        let anyone = served_to(address, None);
        assert!(anyone.starts_with('b'), "no key: served by {anyone:?}");
    }
}
