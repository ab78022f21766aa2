//! The status page over time, from a running duet with 1 s buckets (`admin.status_bucket`): after
//! traffic to two backends (one route answering 500 now and then), the JSON holds a point per bucket
//! for each backend and route, and the page, as served and as headless Chromium renders it, one line
//! per backend in each of the cluster's plots.

use crate::admin::get;
use crate::support::{raw_exchange, Duet};
use duet_testbed::config::{Cluster, DuetConfig};
use duet_testbed::{Backend, BackendOptions};
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

/// The response body of an admin request.
fn body(response: &str) -> &str {
    response
        .split_once("\r\n\r\n")
        .map_or(response, |(_, body)| body)
}

fn status_json(admin: SocketAddr) -> serde_json::Value {
    serde_json::from_str(body(&get(admin, "/status?format=json"))).expect("JSON")
}

/// `GET path` through duet; its status line.
fn request(duet: &Duet, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    response.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn after_traffic_the_page_plots_one_line_per_backend_and_the_json_a_point_per_bucket() {
    let a = Backend::start(BackendOptions::named("a")).expect("a");
    let b = Backend::start(BackendOptions::named("b")).expect("b");
    let backends = [a.address(), b.address()];
    let yaml = DuetConfig::new()
        .workers(2)
        .admin()
        .route(None, "/", "web")
        .cluster(
            Cluster::new("web")
                .backend(backends[0])
                .backend(backends[1]),
        )
        .to_yaml()
        .replace(
            "admin: { address: 127.0.0.1:0 }",
            "admin: { address: 127.0.0.1:0, status_bucket: 1s }",
        );
    let duet = Duet::start(&yaml);
    let admin = duet.admin_address();
    // Traffic until three buckets have closed with it (bounded: 20 s, 2,000 requests).
    let started = Instant::now();
    let mut sent = 0;
    while status_json(admin)["history"]["bucket_ends_unix"]
        .as_array()
        .map_or(0, Vec::len)
        < 3
    {
        assert!(started.elapsed() < Duration::from_secs(20) && sent < 2_000);
        let path = if sent % 5 == 4 { "/status/500" } else { "/" };
        let expected = if sent % 5 == 4 { " 500 " } else { " 200 " };
        assert!(request(&duet, path).contains(expected));
        sent += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = status_json(admin);
    assert_eq!(status["schema"], 3, "{status}");
    assert_eq!(status["history"]["bucket_seconds"], 1.0, "{status}");
    let buckets = status["history"]["bucket_ends_unix"]
        .as_array()
        .map_or(0, Vec::len);
    for backend in status["clusters"][0]["backends"]
        .as_array()
        .expect("backends")
    {
        let history = backend["history"].as_array().expect("a history");
        assert_eq!(history.len(), buckets, "{backend}");
        // Each backend picked in some bucket (the default policy, PeakEWMA, tries both).
        let picked = history
            .iter()
            .filter(|p| p["picks"].as_u64() > Some(0))
            .count();
        assert!(picked >= 1, "{backend}");
        for field in ["share", "in_flight", "p50_ms", "p99_ms"] {
            assert!(
                history.iter().all(|p| p.get(field).is_some()),
                "{field}: {backend}"
            );
        }
    }
    let route = status["routes"][0]["history"]
        .as_array()
        .expect("a route history");
    let responses: u64 = route.iter().filter_map(|p| p["responses"].as_u64()).sum();
    let errors: u64 = route.iter().filter_map(|p| p["errors_5xx"].as_u64()).sum();
    assert!(responses >= 10 && errors >= 1, "{route:?}");
    assert!(
        route.iter().any(|p| p["error_ratio"].as_f64() > Some(0.0)),
        "{route:?}"
    );

    let html = get(admin, "/status");
    for backend in backends {
        let series = format!("<path class=\"series\" data-series=\"{backend}\"");
        assert_eq!(body(&html).matches(&series).count(), 4, "{html}");
    }
    crate::browser::check_status_plots(admin, &backends);
}
