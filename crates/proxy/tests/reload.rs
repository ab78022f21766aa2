//! A reload keeps the balancer state of backends that remain, keyed by address.

use duet_proxy::WorkerProxy;
use std::sync::Arc;

fn config(backends: &[&str], policy: &str) -> duet_config::Config {
    let mut yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    policy: {policy}\n    backends:\n"
    );
    for b in backends {
        yaml.push_str(&format!("      - address: {b}\n"));
    }
    duet_config::parse(&yaml, "test.yaml").expect("valid")
}

#[tokio::test]
async fn reload_keeps_state_by_address_and_replaces_the_rest() {
    let (x, y, z) = ("127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103");
    let address = |a: &str| a.parse::<std::net::SocketAddr>().expect("address");
    let proxy = WorkerProxy::new(&config(&[x, y], "p2c_peak_ewma"));
    let kept_before = proxy
        .with_balance("app", |b| b.endpoint_load(&address(x)).cloned())
        .flatten()
        .expect("x");

    proxy.reload(&config(&[x, z], "p2c_peak_ewma"));
    let (kept_after, removed, added, len) = proxy
        .with_balance("app", |b| {
            (
                b.endpoint_load(&address(x)).cloned(),
                b.endpoint_load(&address(y)).is_some(),
                b.endpoint_load(&address(z)).is_some(),
                b.len(),
            )
        })
        .expect("cluster");
    assert!(
        Arc::ptr_eq(&kept_before, &kept_after.expect("x kept")),
        "same load state object for x"
    );
    assert!(!removed, "y is gone");
    assert!(added, "z is new");
    assert_eq!(len, 2);

    // A policy change starts the cluster's balancer afresh (its metric differs).
    proxy.reload(&config(&[x, z], "p2c_inflight"));
    let fresh = proxy
        .with_balance("app", |b| b.endpoint_load(&address(x)).cloned())
        .flatten()
        .expect("x");
    assert!(!Arc::ptr_eq(&kept_before, &fresh));
}
