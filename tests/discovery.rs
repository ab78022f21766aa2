//! DNS discovery: backends given by name are re-resolved on the control plane; new addresses join, gone
//! ones leave, and addresses that stay keep their balancer state.

use crate::support;

use crate::support::{raw_exchange, served_by};
use duet_testbed::{Backend, BackendOptions};
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

fn picks(admin: SocketAddr, backend: SocketAddr) -> f64 {
    let (metrics, _) = raw_exchange(
        admin,
        b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("duet_backend_picks_total{")
                && l.contains(&format!("backend=\"{backend}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn re_resolution_moves_traffic_and_keeps_state_of_addresses_that_stay() {
    let a = Backend::start(BackendOptions::named("a")).expect("a");
    let b = Backend::start(BackendOptions::named("b")).expect("b");
    // Stands in for a name such as `app.default.svc:80`; the test's resolver answers for it.
    let yaml = "workers: 2\nlisteners: [ { address: 127.0.0.1:0 } ]\nadmin: { address: 127.0.0.1:0 }\nroutes: [ { cluster: app } ]\nclusters:\n  - name: app\n    dns_refresh: 100ms\n    backends: [ { address: app.test:80 } ]\n";
    let config = duet_config::parse(yaml, "test.yaml").expect("valid");
    let answer = Arc::new(Mutex::new(vec![a.address()]));
    let resolver: duet::Resolver = {
        let answer = answer.clone();
        Arc::new(move |name: &str| {
            assert_eq!(name, "app.test:80");
            Ok(answer.lock().expect("lock").clone())
        })
    };
    let server = duet::Server::start_with_resolver(config, resolver).expect("start");
    let (proxy, admin) = (server.local_addrs()[0], server.admin_addr().expect("admin"));

    for _ in 0..10 {
        assert_eq!(served_by(proxy), "a");
    }
    let a_picks = picks(admin, a.address());
    assert_eq!(a_picks, 10.0);

    *answer.lock().expect("lock") = vec![a.address(), b.address()];
    assert!(
        support::eventually(Duration::from_secs(5), || (0..10)
            .any(|_| served_by(proxy) == "b")),
        "b joined"
    );
    assert!(
        picks(admin, a.address()) > a_picks,
        "a's counters carried over: state kept by address"
    );

    *answer.lock().expect("lock") = vec![b.address()];
    assert!(
        support::eventually(Duration::from_secs(5), || (0..20)
            .all(|_| served_by(proxy) == "b")),
        "a left"
    );

    // A failing lookup keeps the backends there are.
    *answer.lock().expect("lock") = vec![];
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..10 {
        assert_eq!(served_by(proxy), "b");
    }
    server.shutdown().expect("shutdown");
}
