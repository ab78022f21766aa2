//! DNS discovery: backends given by name are re-resolved on the control plane; new addresses join, gone
//! ones leave, and addresses that stay keep their balancer state.

use crate::support;

use crate::admin::{get, sum};
use crate::support::served_by;
use duet_testbed::{
    config::{Cluster, DuetConfig},
    Backend, BackendOptions,
};
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

fn picks(admin: SocketAddr, backend: SocketAddr) -> f64 {
    let metrics = get(admin, "/metrics");
    sum(
        &metrics,
        "duet_backend_picks_total",
        &format!("backend=\"{backend}\""),
    )
}

/// An unlabelled metric's value.
fn metric(admin: SocketAddr, name: &str) -> f64 {
    sum(&get(admin, "/metrics"), name, "")
}

/// `workers` workers, an admin listener, and cluster `app` whose only backend is the name `app.test:80`,
/// re-resolved every 100 ms.
fn named_config(workers: usize) -> duet_config::Config {
    let yaml = DuetConfig::new()
        .workers(workers)
        .admin()
        .route(None, "/", "app")
        .cluster(
            Cluster::new("app")
                .named("app.test:80")
                .set("dns_refresh", "100ms"),
        )
        .to_yaml();
    duet_config::parse(&yaml, "test.yaml").expect("valid")
}

#[test]
fn re_resolution_moves_traffic_and_keeps_state_of_addresses_that_stay() {
    let a = Backend::start(BackendOptions::named("a")).expect("a");
    let b = Backend::start(BackendOptions::named("b")).expect("b");
    // Stands in for a name such as `app.default.svc:80`; the test's resolver answers for it.
    let config = named_config(2);
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
    // Twenty answers from b can all come from one worker while the other has not applied the change
    // yet (a descheduled thread on a loaded machine): wait until no worker's balancer has a.
    let a_series = format!("backend=\"{}\"", a.address());
    let a_lines = || -> Vec<String> {
        get(admin, "/metrics")
            .lines()
            .filter(|l| l.contains(&a_series) && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    assert!(
        support::eventually(Duration::from_secs(5), || a_lines().is_empty()),
        "a left every worker: {:#?}",
        a_lines()
    );

    // A failing lookup keeps the backends there are...
    let failures_before = metric(admin, "duet_dns_resolution_failures_total");
    *answer.lock().expect("lock") = vec![];
    assert!(
        support::eventually(Duration::from_secs(5), || metric(
            admin,
            "duet_dns_resolution_failures_total"
        ) > failures_before),
        "the lookups failed and were counted"
    );
    for _ in 0..10 {
        assert_eq!(served_by(proxy), "b", "{:#?}", a_lines());
    }
    // ...and discovery is still running: the next answer is applied.
    *answer.lock().expect("lock") = vec![a.address()];
    assert!(
        support::eventually(Duration::from_secs(5), || (0..10)
            .all(|_| served_by(proxy) == "a")),
        "discovery kept refreshing after the failures"
    );
    server.shutdown().expect("shutdown");
}

#[test]
fn a_name_that_does_not_resolve_yet_is_an_empty_cluster_not_a_failed_start() {
    let a = Backend::start(BackendOptions::named("a")).expect("a");
    let config = named_config(1);
    // A headless service with no ready pods: the name does not resolve, until it does.
    let answer: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let resolver: duet::Resolver = {
        let answer = answer.clone();
        Arc::new(move |_: &str| match *answer.lock().expect("lock") {
            Some(address) => Ok(vec![address]),
            None => Err(std::io::Error::other("no such host")),
        })
    };
    let server = duet::Server::start_with_resolver(config, resolver).expect("duet starts anyway");
    let (proxy, admin) = (server.local_addrs()[0], server.admin_addr().expect("admin"));
    let response = support::get_root(proxy);
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.ends_with("no backend available\n"), "{response}");
    assert_eq!(metric(admin, "duet_dns_unresolved_names"), 1.0);

    *answer.lock().expect("lock") = Some(a.address());
    assert!(
        support::eventually(Duration::from_secs(5), || served_by(proxy) == "a"),
        "served once the name resolves"
    );
    assert_eq!(metric(admin, "duet_dns_unresolved_names"), 0.0);
    server.shutdown().expect("shutdown");
}
