//! The admin listener: Prometheus metrics summed from per-worker cells, and a status page.

use crate::support::{raw_exchange, Duet};
use duet_testbed::config::{Cluster, DuetConfig};
use duet_testbed::{Backend, BackendOptions};
use std::{net::SocketAddr, time::Duration};

pub(crate) fn get(address: SocketAddr, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    raw_exchange(address, request.as_bytes(), Duration::from_secs(5)).0
}

/// Sums a metric's samples whose label set contains `labels`.
pub(crate) fn sum(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
                && l.contains(labels)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn metrics_count_what_happened_across_workers() {
    let a = Backend::start(BackendOptions::named("a")).expect("a");
    let b = Backend::start(BackendOptions::named("b")).expect("b");
    let config = DuetConfig::new()
        .workers(2)
        .admin()
        .route(None, "/app", "app")
        .cluster(
            Cluster::new("app")
                .backend(a.address())
                .backend(b.address()),
        );
    let duet = Duet::start_with(&config.to_yaml(), "warn,duet::cli=info");
    let admin = duet.admin_address();
    for _ in 0..20 {
        let (response, _) = raw_exchange(
            duet.address,
            b"GET /app HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(response.starts_with("HTTP/1.1 200"));
    }
    for _ in 0..3 {
        let (response, _) = raw_exchange(
            duet.address,
            b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(response.starts_with("HTTP/1.1 404"));
    }
    let metrics = get(admin, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("# TYPE duet_responses_total counter"));
    assert_eq!(
        sum(
            &metrics,
            "duet_responses_total",
            "cluster=\"app\",class=\"2xx\""
        ),
        20.0,
        "{metrics}"
    );
    assert_eq!(
        sum(
            &metrics,
            "duet_rejected_requests_total",
            "reason=\"no_route\""
        ),
        3.0
    );
    assert_eq!(
        sum(&metrics, "duet_backend_picks_total", "cluster=\"app\""),
        20.0,
        "every pick counted once"
    );
    assert_eq!(
        sum(&metrics, "duet_backend_in_flight", "cluster=\"app\""),
        0.0,
        "every request completed"
    );
    assert_eq!(
        sum(&metrics, "duet_backend_eligible", "cluster=\"app\""),
        4.0,
        "2 backends x 2 workers"
    );
    assert_eq!(sum(&metrics, "duet_connections_total", ""), 23.0);
    assert_eq!(a.requests() + b.requests(), 20);
    let per_backend = sum(
        &metrics,
        "duet_backend_picks_total",
        &format!("backend=\"{}\"", a.address()),
    );
    assert_eq!(
        per_backend,
        a.requests() as f64,
        "picks match what the backend saw"
    );

    // Latency histograms add the workers' cells up: one series per cluster, every request in it.
    assert_eq!(
        sum(
            &metrics,
            "duet_request_duration_seconds_count",
            "cluster=\"app\""
        ),
        20.0,
        "{metrics}"
    );
    assert_eq!(
        sum(
            &metrics,
            "duet_upstream_header_seconds_count",
            "cluster=\"app\""
        ),
        20.0
    );
    promtool_accepts(&metrics);
    // With the worker label summed away: one series per backend, the same totals.
    let aggregated = get(admin, "/metrics?aggregate=worker");
    assert!(!body(&aggregated).contains("worker=\""), "{aggregated}");
    assert_eq!(
        sum(&aggregated, "duet_backend_picks_total", "cluster=\"app\""),
        20.0
    );
    assert_eq!(
        aggregated
            .lines()
            .filter(|l| l.starts_with("duet_backend_picks_total{"))
            .count(),
        2,
        "{aggregated}"
    );
    assert_eq!(sum(&aggregated, "duet_connections_total", ""), 23.0);
    promtool_accepts(&aggregated);

    let status = get(admin, "/status?format=text");
    assert!(status.contains("cluster app (p2c_peak_ewma)"), "{status}");
    assert!(
        status.contains(&a.address().to_string()) && status.contains(&b.address().to_string()),
        "{status}"
    );
    assert!(get(admin, "/healthz").ends_with("ok\n"));
    let ready = get(admin, "/ready");
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"),
        "both workers serve: {ready}"
    );
    assert_eq!(sum(&metrics, "duet_dns_unresolved_names", ""), 0.0);
    assert!(get(admin, "/nope").starts_with("HTTP/1.1 404"));
}

/// `promtool check metrics` (Prometheus's own linter: format, names, types, help) on a `/metrics`
/// response. Skipped with a note where promtool is not installed, unless `DUET_REQUIRE_PROMTOOL` is set
/// (`.ci/run` installs it and sets it).
fn promtool_accepts(response: &str) {
    use std::io::Write;
    let body = response
        .split_once("\r\n\r\n")
        .map_or(response, |(_, body)| body);
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) if std::env::var_os("DUET_REQUIRE_PROMTOOL").is_none() => {
            eprintln!("promtool not run ({error}): install Debian's `prometheus` package");
            return;
        }
        Err(error) => panic!("promtool is required here: {error}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool ran");
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The response body of an admin request.
fn body(response: &str) -> &str {
    response
        .split_once("\r\n\r\n")
        .map_or(response, |(_, body)| body)
}

#[test]
fn the_status_page_shows_every_backend_and_the_one_taken_down() {
    let a = Backend::start(BackendOptions::named("a")).expect("a");
    let b = Backend::start(BackendOptions::named("b")).expect("b");
    let (a_address, b_address) = (a.address(), b.address());
    let config = DuetConfig::new().workers(2).admin().route(None, "/", "web <&>").cluster(
        Cluster::new("web <&>")
            .backend(a_address)
            .backend(b_address)
            .set(
                "health_check",
                "{ path: /healthz, interval: 100ms, timeout: 200ms, healthy_threshold: 1, unhealthy_threshold: 2 }",
            ),
    );
    let duet = Duet::start_with(&config.to_yaml(), "warn,duet::cli=info");
    let admin = duet.admin_address();
    let json = || -> serde_json::Value {
        serde_json::from_str(body(&get(admin, "/status?format=json"))).expect("JSON")
    };
    let state = |status: &serde_json::Value, address: SocketAddr| {
        status["clusters"][0]["backends"]
            .as_array()
            .and_then(|b| b.iter().find(|b| b["address"] == address.to_string()))
            .map(|b| {
                (
                    b["state"].as_str().unwrap_or("").to_owned(),
                    b["health"].as_str().unwrap_or("").to_owned(),
                )
            })
    };
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        let status = json();
        state(&status, a_address) == Some(("up".into(), "passing".into()))
            && state(&status, b_address) == Some(("up".into(), "passing".into()))
    }));
    for _ in 0..10 {
        let (response, _) = raw_exchange(
            duet.address,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(response.starts_with("HTTP/1.1 200"));
    }
    let status = json();
    assert_eq!(status["workers"], 2);
    assert_eq!(status["clusters"][0]["name"], "web <&>");
    assert_eq!(status["clusters"][0]["requests"], 10);
    let picks: u64 = status["clusters"][0]["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["picks"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(picks, 10, "{status}");
    // Schema 3 (2 with the figures over time): every count a named field, no positional arrays.
    assert_eq!(status["schema"], 3, "{status}");
    let two_hundreds: u64 = status["clusters"][0]["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["responses"]["2xx"].as_u64().expect("a named 2xx count"))
        .sum();
    assert_eq!(two_hundreds, 10, "{status}");

    // Taken down: its health checks fail, and the page says so.
    b.stop();
    assert!(
        crate::support::eventually(Duration::from_secs(5), || state(&json(), b_address)
            == Some(("down".into(), "failing".into()))),
        "{}",
        json()
    );
    let page = get(admin, "/status");
    assert!(page.contains("content-type: text/html"), "{page}");
    let html = body(&page);
    assert!(
        html.contains("<h2>web &lt;&amp;&gt; "),
        "the name is escaped: {html}"
    );
    assert!(html.contains(&a_address.to_string()) && html.contains(&b_address.to_string()));
    assert!(html.contains("class=\"down\""), "{html}");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external assets"
    );
    crate::browser::check_status_page(admin, &[a_address, b_address], b_address);
    drop(a);
}

/// The admin listener shares the control thread with health checks and DNS: connections that never
/// send a request must neither hold `/healthz` up (they once took every slot until a 10 s header
/// timeout) nor stay open past the header timeout (5 s).
#[test]
fn silent_connections_neither_delay_healthz_nor_outstay_the_header_timeout() {
    use std::io::Read;
    let backend = Backend::start(BackendOptions::named("a")).expect("backend");
    let config = DuetConfig::new()
        .admin()
        .route(None, "/", "app")
        .cluster(Cluster::new("app").backend(backend.address()));
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let opened = std::time::Instant::now();
    let silent: Vec<std::net::TcpStream> = (0..40)
        .map(|_| std::net::TcpStream::connect(admin).expect("connect"))
        .collect();
    let asked = std::time::Instant::now();
    let (response, _) = raw_exchange(
        admin,
        b"GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n",
        Duration::from_secs(15),
    );
    let took = asked.elapsed();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.ends_with("\r\n\r\nok\n"), "{response}");
    // Answered while every silent connection is still open: /healthz did not wait for the header
    // timeout to free a slot (it would have closed one first), however slowly a loaded machine ran it.
    for stream in &silent {
        stream.set_nonblocking(true).expect("nonblocking");
        let open = matches!(stream.peek(&mut [0; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        assert!(
            open,
            "a silent connection closed before /healthz was answered ({took:?})"
        );
        stream.set_nonblocking(false).expect("blocking");
    }
    for mut stream in silent {
        let left = Duration::from_secs(9).saturating_sub(opened.elapsed());
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("timeout");
        let mut byte = [0; 1];
        // A read under SO_RCVTIMEO fails with EINTR when any signal reaches the thread, whatever
        // SA_RESTART says (signal(7)); the glibc-internal signals other tests' work raises are not
        // the answer this test waits for. Bounded: at most one retry per signal, within the window.
        let read = loop {
            match stream.read(&mut byte) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::Interrupted
                        && opened.elapsed() < Duration::from_secs(9) => {}
                other => break other,
            }
        };
        assert!(
            matches!(read, Ok(0)),
            "a silent connection still open {:?} after it opened: {read:?}",
            opened.elapsed()
        );
    }
    let closed = opened.elapsed();
    assert!(
        closed >= Duration::from_millis(4500),
        "closed after {closed:?}, before the header timeout"
    );
}

/// A route's error ratio from one scrape, as an SLO's recording rule computes it: its 5xx responses
/// over all its responses (`duet_route_responses_total{route,code}`), the backend's own 5xx and duet's
/// answers for a cluster no backend of which answers alike.
#[test]
fn a_per_route_5xx_ratio_comes_from_one_scrape() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let config = DuetConfig::new()
        .workers(2)
        .admin()
        .route(None, "/status", "app")
        .route(None, "/dead", "dead")
        .cluster(Cluster::new("app").backend(app.address()))
        // Nothing listens on port 1: every attempt is refused.
        .cluster(Cluster::new("dead").backend("127.0.0.1:1".parse().expect("address")));
    let duet = Duet::start_with(&config.to_yaml(), "warn,duet::cli=info");
    let paths = ["/status/200"; 6]
        .into_iter()
        .chain(["/status/500", "/status/500", "/status/503"])
        .chain(["/dead"; 3]);
    for path in paths {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 "), "{path}: {response}");
    }
    let metrics = get(duet.admin_address(), "/metrics");
    let family = "duet_route_responses_total";
    let of = |route: &str, code: &str| {
        sum(
            &metrics,
            family,
            &format!("route=\"{route}\",code=\"{code}\""),
        )
    };
    assert_eq!(of("*/status", "200"), 6.0, "{metrics}");
    assert_eq!(of("*/status", "500"), 2.0, "{metrics}");
    assert_eq!(of("*/status", "503"), 1.0, "{metrics}");
    assert_eq!(of("*/dead", "502"), 3.0, "{metrics}");
    let ratio = |route: &str| {
        let route = format!("route=\"{route}\",code=\"");
        let errors = sum(&metrics, family, &format!("{route}5"));
        errors / sum(&metrics, family, &route)
    };
    assert_eq!(ratio("*/status"), 3.0 / 9.0, "{metrics}");
    assert_eq!(ratio("*/dead"), 1.0, "{metrics}");
    // Every request once, whichever worker served it: the codes add up to the requests.
    assert_eq!(sum(&metrics, family, ""), 12.0, "{metrics}");
    promtool_accepts(&metrics);
}
