//! Weighted splits, header edits, rewrites and per-route retries, through the real binary to real
//! backends: which cluster took each request, and exactly what the backend and the client saw.

use crate::support::{self, raw_exchange, Duet};
use duet_testbed::{Backend, BackendOptions, Recorded};
use std::{net::SocketAddr, time::Duration};

/// An address nothing listens on: connecting to it is refused at once.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address")
}

/// `request` sent on its own connection (`Connection: close` is added); the status and the response's
/// head lines.
fn exchange(duet: &Duet, request: &str) -> (String, Vec<String>) {
    let request = format!("{request}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let status = response.get(9..12).unwrap_or_default().to_owned();
    (status, head.lines().skip(1).map(str::to_owned).collect())
}

/// Every value of `name` in what the backend received, in order.
fn values(seen: &Recorded, name: &str) -> Vec<String> {
    (seen.headers.get_all(name).iter())
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .collect()
}

/// 2,000 requests on a 95/5 split, one worker: smooth weighted round robin gives each cluster exactly
/// its share (well inside ±1.5 points), and the access log and the route's series name the cluster
/// that took each request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_split_sends_each_cluster_exactly_its_share() {
    let v1 = Backend::start(BackendOptions::named("v1")).expect("v1");
    let v2 = Backend::start(BackendOptions::named("v2")).expect("v2");
    let yaml = format!(
        "workers: 1
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - name: canary
    backends: [ {{ cluster: api-v1, weight: 95 }}, {{ cluster: api-v2, weight: 5 }} ]
clusters:
  - {{ name: api-v1, backends: [ {{ address: {} }} ] }}
  - {{ name: api-v2, backends: [ {{ address: {} }} ] }}
",
        v1.address(),
        v2.address()
    );
    let duet = Duet::start(&yaml);
    let client = support::client();
    let mut to_v2 = Vec::new();
    for i in 0..2000 {
        let response = client
            .get(duet.url("/x").parse().expect("url"))
            .await
            .expect("response");
        assert_eq!(response.status(), 200);
        if response.headers()["x-backend"] == "v2" {
            to_v2.push(i);
        }
        let _ = http_body_util::BodyExt::collect(response.into_body()).await;
    }
    assert_eq!((v1.requests(), v2.requests()), (1900, 100));
    assert_eq!(to_v2.len(), 100);
    assert!(
        to_v2.windows(2).all(|w| w[1] - w[0] == 20),
        "spread one in twenty: {to_v2:?}"
    );
    let logged = |cluster: &str| {
        let field = format!(" cluster={cluster} ");
        (duet.log_lines().iter())
            .filter(|l| l.contains("duet::access") && l.contains(&field))
            .count()
    };
    assert!(
        support::eventually(Duration::from_secs(10), || logged("api-v1") == 1900
            && logged("api-v2") == 100),
        "access log: {} to api-v1, {} to api-v2",
        logged("api-v1"),
        logged("api-v2")
    );
    let admin = duet.admin_address();
    let metrics = || {
        let request = "GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";
        raw_exchange(admin, request.as_bytes(), Duration::from_secs(5)).0
    };
    let counted = |text: &str| {
        [
            "duet_request_duration_seconds_count{cluster=\"api-v1\",route=\"canary\"} 1900",
            "duet_request_duration_seconds_count{cluster=\"api-v2\",route=\"canary\"} 100",
        ]
        .iter()
        .all(|line| text.lines().any(|l| l == *line))
    };
    assert!(
        support::eventually(Duration::from_secs(10), || counted(&metrics())),
        "{}",
        metrics()
    );
}
