//! Keeping service while backends die, hang, recover or all fail: retries, budgets, ejection, health
//! checks and slow start, through the real binary with real (and really misbehaving) backends.

use crate::support;

use crate::support::{raw_exchange, Duet};
use duet_testbed::config::DuetConfig;
use duet_testbed::{load::closed_loop, Backend, BackendOptions, Misbehaviour, RawBackend};
use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A backend in its own process, so it can be killed by pid.
struct BackendProcess {
    child: Child,
    address: SocketAddr,
}

impl BackendProcess {
    fn start(name: &str, listen: &str, delay_ms: u64) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_duet-backend"))
            .args([
                "--listen",
                listen,
                "--name",
                name,
                "--delay-ms",
                &delay_ms.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn duet-backend");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("listening line");
        let address = line
            .trim()
            .trim_start_matches("listening on ")
            .parse()
            .expect("address");
        Self { child, address }
    }

    fn kill(&mut self) {
        let status = Command::new("kill")
            .args(["-KILL", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let _ = self.child.wait();
    }
}

impl Drop for BackendProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One cluster `app` over `backends`, with `settings` (field, YAML value) on the cluster.
fn cluster_yaml(
    workers: usize,
    policy: &str,
    backends: &[SocketAddr],
    settings: &[(&str, &str)],
) -> String {
    DuetConfig::single(policy, backends)
        .workers(workers)
        .with_cluster("app", |cluster| {
            settings
                .iter()
                .fold(cluster, |cluster, (field, value)| cluster.set(field, value))
        })
        .to_yaml()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn killing_one_of_four_backends_under_load_loses_no_request() {
    let mut backends: Vec<BackendProcess> = (0..4)
        .map(|i| BackendProcess::start(&format!("b{i}"), "127.0.0.1:0", 2))
        .collect();
    let addresses: Vec<_> = backends.iter().map(|b| b.address).collect();
    let duet = Duet::start_with(
        &DuetConfig::single("p2c_peak_ewma", &addresses)
            .workers(2)
            .admin()
            .to_yaml(),
        "warn,duet::cli=info",
    );
    let admin = duet.admin_address();
    let uri = duet.url("/").parse().expect("uri");
    let load = std::thread::spawn(move || {
        runtime().block_on(closed_loop(uri, 3000, 16, Duration::from_secs(10)))
    });
    // Killed once the load is in its stride, well before its end: when b1 has answered 50 of it.
    let b1_answered = format!("backend=\"{}\",class=\"2xx\"", addresses[1]);
    assert!(
        support::eventually(Duration::from_secs(10), || crate::admin::sum(
            &crate::admin::get(admin, "/metrics"),
            "duet_backend_responses_total",
            &b1_answered
        ) >= 50.0),
        "b1 served under load: {}",
        crate::admin::get(admin, "/metrics")
    );
    backends[1].kill();
    let report = load.join().expect("load");
    eprintln!(
        "kill one of four: {} ok, {} errors, p99 {:?}, shares {:?}",
        report.latencies.len(),
        report.errors,
        report.percentile(0.99),
        report.by_backend
    );
    assert_eq!(report.errors, 0, "client-visible errors");
    assert_eq!(report.latencies.len(), 3000);
    assert!(
        report.by_backend.get("b1").copied().unwrap_or(0) > 0,
        "b1 served before it was killed"
    );
}

#[test]
fn a_hung_backend_is_avoided_and_only_unretriable_requests_time_out() {
    let good_1 = Backend::start(BackendOptions::named("good-1")).expect("good-1");
    let good_2 = Backend::start(BackendOptions::named("good-2")).expect("good-2");
    let hung = RawBackend::start(Misbehaviour::Hang).expect("hung");
    let addresses = [good_1.address(), good_2.address(), hung.address()];
    let yaml = cluster_yaml(
        1,
        "round_robin",
        &addresses,
        &[("timeouts", "{ response_headers: 300ms }")],
    );
    let duet = Duet::start_with(&yaml, "warn,duet::cli=info");

    // Round robin walks straight into the hung backend. POSTs are not idempotent and their bodies reached
    // it: they time out as 504 and are never replayed.
    let started = Instant::now();
    let mut timed_out = 0;
    for _ in 0..6 {
        let (response, _) = raw_exchange(
            duet.address,
            b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            Duration::from_secs(5),
        );
        if response.starts_with("HTTP/1.1 504") {
            timed_out += 1;
        } else {
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        }
    }
    assert_eq!(timed_out, 2, "every third POST went to the hung backend");
    assert_eq!(hung.requests(), 2, "and none was replayed elsewhere");
    assert_eq!(good_1.requests() + good_2.requests(), 4);
    // GETs that reach it are retried elsewhere: all succeed. Five consecutive failures eject it.
    let mut last_reached = Duration::ZERO;
    for _ in 0..30 {
        let before = hung.requests();
        let response = support::get_root(duet.address);
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "a GET must be retried, not time out: {response}"
        );
        if hung.requests() > before {
            last_reached = started.elapsed();
        }
    }
    let reached = hung.requests();
    eprintln!("hung backend: {timed_out} POSTs timed out, {reached} requests reached it, the last {last_reached:?} after the first");
    assert_eq!(reached, 5, "ejected after five consecutive failures");
    // Once ejected, nothing reaches it and GETs answer quickly.
    let phase_two = Instant::now();
    for _ in 0..60 {
        let response = support::get_root(duet.address);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    assert_eq!(hung.requests(), reached, "avoided after ejection");
    assert!(
        phase_two.elapsed() < Duration::from_secs(3),
        "{:?}",
        phase_two.elapsed()
    );
}

#[test]
fn a_recovered_backend_is_readmitted_by_health_checks_and_ramps_up() {
    let fast_1 = Backend::start(BackendOptions::named("a1")).expect("a1");
    let fast_2 = Backend::start(BackendOptions::named("a2")).expect("a2");
    let mut returning = BackendProcess::start("b", "127.0.0.1:0", 0);
    let b_address = returning.address;
    let yaml = cluster_yaml(
        1,
        "p2c_inflight",
        &[fast_1.address(), fast_2.address(), b_address],
        &[
            ("health_check", "{ path: /healthz, interval: 100ms, timeout: 200ms, healthy_threshold: 2, unhealthy_threshold: 2 }"),
            ("slow_start", "4s"),
        ],
    );
    let duet = Duet::start_with(&yaml, "info,duet::access=off");
    let uri: hyper::Uri = duet.url("/").parse().expect("uri");
    let rt = runtime();
    // Admitted after the first passing check.
    assert!(support::eventually(Duration::from_secs(5), || duet
        .log_lines()
        .iter()
        .filter(|l| l.contains("backend healthy"))
        .count()
        >= 3));
    // Everyone ramps up after the first admission too: b returns only once that is over (its outage
    // meanwhile), so that its own ramp is measured against a1 and a2 at their full weight.
    let everyone_ramped = Instant::now() + Duration::from_millis(4200);

    returning.kill();
    assert!(
        support::eventually(Duration::from_secs(5), || duet.log_lines().iter().any(
            |l| l.contains("backend unhealthy") && l.contains(&b_address.to_string())
        )),
        "{:#?}",
        duet.log_lines()
    );
    let outage = rt.block_on(closed_loop(uri.clone(), 200, 4, Duration::from_secs(5)));
    assert_eq!(outage.errors, 0);
    assert_eq!(outage.share("b"), 0.0);

    // Wall-clock: slow start is a real 4 s timer in duet, and how far into it a backend is shows
    // nowhere to wait on.
    std::thread::sleep(everyone_ramped.saturating_duration_since(Instant::now()));
    let _back = BackendProcess::start("b", &b_address.to_string(), 0);
    let readmitted = Instant::now();
    assert!(support::eventually(Duration::from_secs(5), || duet
        .log_lines()
        .iter()
        .filter(|l| l.contains("backend healthy") && l.contains(&b_address.to_string()))
        .count()
        >= 2));
    eprintln!("re-admitted {:?} after restart", readmitted.elapsed());
    let mut shares = Vec::new();
    // The first window measures where the ramp starts, one request at a time: every load reads 0, so
    // the share is the weighted draw's alone, w/(2+w) for b's ramped weight w (0.1 at admission: 0.05),
    // where 4 concurrent requests let P2C lift the lightly weighted b toward its in-flight share; and it
    // is short, for at 300 requests a loaded machine stretched it over half the ramp (0.203 seen). A
    // share of 0.2 would take w = 0.5, 1.6 s into the ramp. The last window, at full weight, is long
    // for a tight estimate of the third it reaches.
    for (requests, concurrency) in [(100, 1), (300, 4), (300, 4), (300, 4), (300, 4), (600, 4)] {
        let window = Instant::now();
        let report = rt.block_on(closed_loop(
            uri.clone(),
            requests,
            concurrency,
            Duration::from_secs(5),
        ));
        assert_eq!(report.errors, 0);
        shares.push(report.share("b"));
        // Wall-clock: the shares are sampled along slow start's ramp, which follows real time.
        std::thread::sleep(Duration::from_millis(800).saturating_sub(window.elapsed()));
    }
    eprintln!("returning backend's share per ~0.8 s window: {shares:?}");

    assert!(shares[0] < 0.2, "starts low: {shares:?}");
    assert!(shares[5] > shares[0] + 0.08, "ramps up: {shares:?}");
    assert!(shares[5] > 0.22, "reaches about a third: {shares:?}");
}

#[test]
fn when_every_backend_fails_retries_stay_within_the_budget() {
    let broken: Vec<RawBackend> = (0..3)
        .map(|_| RawBackend::start(Misbehaviour::Garbage).expect("raw"))
        .collect();
    let addresses: Vec<_> = broken.iter().map(RawBackend::address).collect();
    let settings = [
        (
            "retries",
            "{ attempts: 3, budget_percent: 10%, min_retries_per_second: 1 }",
        ),
        ("outlier_detection", "{ consecutive_failures: 0 }"),
    ];
    let duet = Duet::start_with(
        &cluster_yaml(1, "p2c_inflight", &addresses, &settings),
        "error,duet::cli=info",
    );
    let requests = 400u64;
    let report = runtime().block_on(closed_loop(
        duet.url("/").parse().expect("uri"),
        requests as usize,
        4,
        Duration::from_secs(5),
    ));
    assert_eq!(report.errors, requests, "every request fails");
    let attempts: u64 = broken.iter().map(RawBackend::requests).sum();
    let ratio = attempts as f64 / requests as f64;
    eprintln!("all failing: {attempts} attempts for {requests} requests = {ratio:.3}");
    // Budget: 10% of requests plus a reserve of 1/s over 10 s; without it, 3 attempts per request.
    assert!(
        ratio <= 1.0 + 0.1 + 10.0 / requests as f64 + 0.01,
        "retry storm: {ratio}"
    );
    assert!(ratio > 1.05, "retries did happen: {ratio}");
}

/// duet balancing round robin over a backend that reads each request and hangs up, and a good one,
/// never ejecting either.
fn closer_and_good() -> (RawBackend, Backend, Duet) {
    let good = Backend::start(BackendOptions::named("good")).expect("good");
    let closer = RawBackend::start(Misbehaviour::CloseAfterRequest).expect("closer");
    let settings = [("outlier_detection", "{ consecutive_failures: 0 }")];
    let backends = [closer.address(), good.address()];
    let yaml = cluster_yaml(1, "round_robin", &backends, &settings);
    let duet = Duet::start_with(&yaml, "warn,duet::cli=info");
    (closer, good, duet)
}

#[test]
fn a_post_that_failed_to_connect_is_retried_one_that_was_sent_is_not() {
    // Never reached: the connection was refused. Any method may be retried, even a large streamed body.
    let good = Backend::start(BackendOptions::named("good")).expect("good");
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let settings = [("outlier_detection", "{ consecutive_failures: 0 }")];
    let duet = Duet::start_with(
        &cluster_yaml(1, "round_robin", &[refused, good.address()], &settings),
        "warn,duet::cli=info",
    );
    let big = vec![b'z'; 1 << 20];
    for i in 0..10 {
        let body: &[u8] = if i % 2 == 0 { b"small" } else { &big };
        let mut request = format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        let (response, _) = raw_exchange(duet.address, &request, Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 200"), "POST {i}: {response}");
        assert!(
            response.ends_with(&format!("\r\n\r\n{}", body.len())),
            "the whole body arrived: {response}"
        );
    }
    assert_eq!(good.requests(), 10);

    // Reached: the backend read the request and hung up. A POST is not replayed; a GET is.
    let (closer, good, duet) = closer_and_good();
    let mut failed = 0;
    for _ in 0..10 {
        let (response, _) = raw_exchange(duet.address, b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", Duration::from_secs(5));
        if response.starts_with("HTTP/1.1 502") {
            failed += 1;
        } else {
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        }
    }
    assert_eq!(
        failed,
        closer.requests(),
        "each POST the closer swallowed failed, and was not replayed"
    );
    assert_eq!(
        good.requests() + closer.requests(),
        10,
        "no POST reached two backends"
    );
    assert_eq!(
        closer.requests(),
        5,
        "round robin sent every other POST to it"
    );
    let closer_before = closer.requests();
    for _ in 0..10 {
        let response = support::get_root(duet.address);
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "GET is retried: {response}"
        );
    }
    assert!(
        closer.requests() > closer_before,
        "some GETs reached the closer"
    );
    assert_eq!(
        good.requests(),
        5 + 10,
        "and every GET was then served by the good backend, once"
    );
}

#[test]
fn a_get_retried_after_its_backend_hung_up_carries_every_header_the_client_sent() {
    // The first attempt takes the request's header map to the backend that hangs up; the retry's
    // headers are rebuilt from the fields kept for it (`header_copy.rs`): all of them, repeated ones
    // in their order.
    let (closer, good, duet) = closer_and_good();
    let request =
        b"GET /page?q=1 HTTP/1.1\r\nHost: shop.example\r\nX-Multi: one\r\nCookie: a=1\r\n\
        X-Multi: two\r\nAccept: text/html\r\nConnection: close\r\n\r\n";
    for _ in 0..6 {
        let (response, _) = raw_exchange(duet.address, request, Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    assert!(
        closer.requests() >= 1,
        "some GETs met the closer first, and were retried"
    );
    let recorded = good.recorded();
    assert_eq!(
        recorded.len(),
        6,
        "and every GET was served by the good backend"
    );
    let request_ids: std::collections::HashSet<_> = recorded
        .iter()
        .map(|seen| seen.headers["x-request-id"].clone())
        .collect();
    assert_eq!(request_ids.len(), 6, "one request id each");
    for seen in &recorded {
        assert_eq!(seen.uri, "/page?q=1");
        assert_eq!(seen.headers["host"], "shop.example");
        let multi: Vec<_> = seen.headers.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["one", "two"], "repeated fields, in order");
        assert_eq!(seen.headers["cookie"], "a=1");
        assert_eq!(seen.headers["accept"], "text/html");
        assert_eq!(seen.headers.get_all("x-forwarded-for").iter().count(), 1);
        assert!(seen.headers.get("connection").is_none(), "hop-by-hop");
    }
}

#[test]
fn when_health_checks_fail_everywhere_panic_mode_still_serves() {
    // The checks ask for a status the backends never give: every backend is "unhealthy". Below the panic
    // threshold duet balances over all of them instead of answering 503 to everything.
    let backends: Vec<Backend> = (0..3)
        .map(|i| Backend::start(BackendOptions::named(&format!("p{i}"))).expect("backend"))
        .collect();
    let addresses: Vec<_> = backends.iter().map(Backend::address).collect();
    let check = (
        "health_check",
        "{ path: /status/500, interval: 100ms, timeout: 200ms }",
    );
    let duet = Duet::start_with(
        &cluster_yaml(
            2,
            "p2c_peak_ewma",
            &addresses,
            &[check, ("panic_threshold", "50%")],
        ),
        "warn,duet::cli=info",
    );
    assert!(
        support::eventually(Duration::from_secs(3), || backends
            .iter()
            .all(|b| b.requests() >= 2)),
        "checks ran"
    );
    let report = runtime().block_on(closed_loop(
        duet.url("/").parse().expect("uri"),
        300,
        4,
        Duration::from_secs(5),
    ));
    assert_eq!(report.errors, 0, "panic mode serves");
    assert_eq!(
        report.by_backend.len(),
        3,
        "over every backend: {:?}",
        report.by_backend
    );

    // With the threshold at 0 the same cluster answers 503: nothing is eligible. Asked once the new
    // duet's checks have failed on every backend, so not before it could have known.
    drop(duet);
    let checked: Vec<u64> = backends.iter().map(Backend::requests).collect();
    let strict = Duet::start_with(
        &cluster_yaml(
            2,
            "p2c_peak_ewma",
            &addresses,
            &[check, ("panic_threshold", "0%")],
        ),
        "error,duet::cli=info",
    );
    assert!(
        support::eventually(Duration::from_secs(3), || backends
            .iter()
            .zip(&checked)
            .all(|(b, &before)| b.requests() >= before + 2)),
        "checks ran"
    );
    let response = support::get_root(strict.address);
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
}

/// 429 and `Retry-After` speak of one client (its rate, its quota), and a 5xx can be provoked by one
/// client's request: under the default settings neither may take a backend out of rotation for everyone.
#[test]
fn one_client_cannot_eject_backends_with_429_retry_after_or_500() {
    let backends: Vec<Backend> = (0..4)
        .map(|i| Backend::start(BackendOptions::named(&format!("b{i}"))).expect("backend"))
        .collect();
    let addresses: Vec<SocketAddr> = backends.iter().map(|b| b.address()).collect();
    let duet = Duet::start_with(
        &DuetConfig::single("round_robin", &addresses)
            .admin()
            .to_yaml(),
        "warn,duet::cli=info",
    );
    let admin = duet.admin_address();
    let answered = |path: &str, status: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with(status), "{path}: {response}");
    };
    // Round robin: every backend answers each kind many times in a row from its point of view.
    for _ in 0..20 {
        answered("/status/429?retry-after=3600", "HTTP/1.1 429");
        answered("/status/503?retry-after=3600", "HTTP/1.1 503");
    }
    for _ in 0..40 {
        answered("/status/500", "HTTP/1.1 500");
    }
    let metrics = crate::admin::get(admin, "/metrics");
    assert_eq!(
        crate::admin::sum(&metrics, "duet_ejections_total", ""),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        crate::admin::sum(&metrics, "duet_backend_eligible", ""),
        4.0,
        "{metrics}"
    );
    let before: Vec<u64> = backends.iter().map(|b| b.requests()).collect();
    for _ in 0..8 {
        answered("/", "HTTP/1.1 200");
    }
    let served: Vec<u64> = backends
        .iter()
        .zip(&before)
        .map(|(b, before)| b.requests() - before)
        .collect();
    assert_eq!(served, [2, 2, 2, 2], "all four still in rotation");
}

/// An operator who trusts the backends' 5xx as a sign of breakage opts in with `consecutive_5xx`: then
/// 5xx responses eject, within the default cap of one backend of four.
#[test]
fn consecutive_5xx_opts_in_to_ejecting_on_server_errors() {
    let backends: Vec<Backend> = (0..4)
        .map(|i| Backend::start(BackendOptions::named(&format!("b{i}"))).expect("backend"))
        .collect();
    let addresses: Vec<SocketAddr> = backends.iter().map(|b| b.address()).collect();
    let yaml = DuetConfig::single("round_robin", &addresses)
        .admin()
        .with_cluster("app", |c| {
            c.set(
                "outlier_detection",
                "{ consecutive_5xx: 3, base_ejection_time: 60s }",
            )
        })
        .to_yaml();
    let duet = Duet::start_with(&yaml, "warn,duet::cli=info");
    for _ in 0..12 {
        let (response, _) = raw_exchange(
            duet.address,
            b"GET /status/500 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(response.starts_with("HTTP/1.1 500"), "{response}");
    }
    let metrics = crate::admin::get(duet.admin_address(), "/metrics");
    assert_eq!(
        crate::admin::sum(&metrics, "duet_ejections_total", ""),
        1.0,
        "three 500s each, but 10% of four is capped at one: {metrics}"
    );
    assert_eq!(
        crate::admin::sum(&metrics, "duet_backend_eligible", ""),
        3.0,
        "{metrics}"
    );
}
