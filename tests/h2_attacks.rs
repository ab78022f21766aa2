//! Raw-frame attacks on duet's HTTP/2 server, sent by `tests/h2_frames.py` (the `h2` Python package,
//! Debian's `python3-h2`): each is ended by the server as RFC 9113 and the h2 crate's fixes say, and a
//! well-behaved client is served meanwhile. Skipped with a note where python3-h2 is missing, unless
//! `DUET_REQUIRE_PYTHON_H2` is set (`.ci/run` installs it and sets it).

use crate::admin::{get, sum};
use crate::support::{self, eventually, Duet};
use duet_testbed::config::{Cluster, DuetConfig};
use duet_testbed::{Backend, BackendOptions};
use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A Python that can `import h2`: Debian's packages are for the system interpreter, which a pyenv
/// shim earlier on the PATH may hide.
fn python_with_h2() -> Option<&'static str> {
    let found = ["/usr/bin/python3", "python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import h2"])
            .output()
            .is_ok_and(|output| output.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("DUET_REQUIRE_PYTHON_H2").is_none(),
            "python3-h2 is required here"
        );
        eprintln!("SKIPPED: no python3 with the h2 package (apt-get install python3-h2)");
    }
    found
}

/// Runs one attack against `duet`; its outcome line (`goaway CODE sent=N`, `closed sent=N`...).
fn attack(python: &str, duet: &Duet, name: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h2_frames.py");
    let output = Command::new(python)
        .args([script, "127.0.0.1", &duet.address.port().to_string(), name])
        .output()
        .expect("run h2_frames.py");
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(
        output.status.success(),
        "{name}: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Starts one attack against `duet` and gives its output line by line, for tests that look at duet
/// while the attack goes on.
fn start_attack(python: &str, duet: &Duet, name: &str) -> (Child, impl FnMut() -> String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h2_frames.py");
    let mut child = Command::new(python)
        .args([script, "127.0.0.1", &duet.address.port().to_string(), name])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run h2_frames.py");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, move || {
        lines.next().and_then(Result::ok).unwrap_or_default()
    })
}

fn metric(admin: SocketAddr, name: &str) -> f64 {
    sum(&get(admin, "/metrics"), name, "")
}

fn duet() -> (Backend, Duet) {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .section(
            "limits",
            "{ header_read_timeout: 1s, keepalive_timeout: 2s }",
        )
        .to_yaml();
    let duet = Duet::start(&yaml);
    (backend, duet)
}

/// An HTTP/1.1 client is still served.
fn still_serving(duet: &Duet) {
    let (response, _) = support::raw_exchange(
        duet.address,
        b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

/// The outcome's first words and the frame count.
fn parse(outcome: &str) -> (&str, u64) {
    let (how, sent) = outcome.rsplit_once(" sent=").expect("outcome line");
    (how, sent.parse().expect("count"))
}

#[test]
fn a_rapid_reset_flood_is_ended_with_goaway_enhance_your_calm() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let (backend, duet) = duet();
    let outcome = attack(python, &duet, "rapid_reset");
    eprintln!("rapid reset: {outcome}, backend saw {}", backend.requests());
    let (how, sent) = parse(&outcome);
    // ENHANCE_YOUR_CALM (0xb): h2 ≥ 0.4.2 counts streams reset before they are answered.
    assert!(how == "goaway 11" || how == "closed", "{outcome}");
    assert!(
        backend.requests() < 1000,
        "few of the {} streams reached the backend: {}",
        sent / 2,
        backend.requests()
    );
    still_serving(&duet);
}

#[test]
fn a_continuation_flood_is_cut_at_the_header_list_limit() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let (backend, duet) = duet();
    let outcome = attack(python, &duet, "continuation_flood");
    eprintln!("continuation flood: {outcome}");
    let (how, sent) = parse(&outcome);
    assert!(how == "goaway 11" || how == "closed", "{outcome}");
    // 64 KiB of header list (limits.max_request_head) is about 16 frames of 4 KB; the socket
    // buffers take some more before the writes fail.
    assert!(sent < 20_000, "the server stopped reading: {outcome}");
    assert_eq!(backend.requests(), 0);
    still_serving(&duet);
}

#[test]
fn a_client_silent_after_its_preface_is_sent_goaway_and_closed() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let (_backend, duet) = duet();
    let outcome = attack(python, &duet, "silent");
    eprintln!("silent: {outcome}");
    let (how, _) = parse(&outcome);
    assert!(how == "goaway 0" || how == "closed", "{outcome}");
    still_serving(&duet);
}

#[test]
fn the_configured_http2_limits_are_the_settings_clients_see() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .section(
            "limits",
            "{ http2: { max_concurrent_streams: 7, max_header_list_size: 16KiB, \
             initial_stream_window_size: 100000, initial_connection_window_size: 3MiB } }",
        )
        .to_yaml();
    let duet = Duet::start(&yaml);
    assert_eq!(
        attack(python, &duet, "settings"),
        "settings max_concurrent_streams=7 max_header_list_size=16384 initial_window_size=100000 \
         connection_window=3145728 sent=0"
    );
    // The defaults: 100 streams, the head limit (64 KiB) for the header list, 256 KiB per stream
    // and 1 MiB per connection.
    let (_backend, duet) = self::duet();
    assert_eq!(
        attack(python, &duet, "settings"),
        "settings max_concurrent_streams=100 max_header_list_size=65536 initial_window_size=262144 \
         connection_window=1048576 sent=0"
    );
    // Adaptive: both start at RFC 9113's 65,535 and grow with the measured bandwidth.
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .section("limits", "{ http2: { adaptive_window: true } }")
        .to_yaml();
    let duet = Duet::start(&yaml);
    assert_eq!(
        attack(python, &duet, "settings"),
        "settings max_concurrent_streams=100 max_header_list_size=65536 initial_window_size=65535 \
         connection_window=65535 sent=0"
    );
}

#[test]
fn an_h2_cluster_grants_its_backends_the_configured_windows() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h2_frames.py");
    let mut backend = Command::new(python)
        .args([script, "127.0.0.1", "0", "backend"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run h2_frames.py");
    let mut lines = BufReader::new(backend.stdout.take().expect("stdout")).lines();
    let mut line = || lines.next().and_then(Result::ok).unwrap_or_default();
    let listening = line();
    let port: u16 = listening
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .expect("the backend's port");
    let cluster = Cluster::new("app")
        .backend(([127, 0, 0, 1], port).into())
        .set("protocol", "h2")
        .set(
            "http2",
            "{ initial_stream_window_size: 100000, initial_connection_window_size: 3MiB }",
        );
    let yaml = DuetConfig::new()
        .route(None, "/", "app")
        .cluster(cluster)
        .to_yaml();
    let duet = Duet::start(&yaml);
    let (response, _) = support::raw_exchange(
        duet.address,
        b"GET /w HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(
        line(),
        "backend initial_window_size=100000 connection_window=3145728"
    );
    let _ = backend.wait();
}

#[test]
fn streams_a_client_reads_nothing_of_are_reset_at_the_send_timeout_and_their_backends_let_go() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = DuetConfig::single("p2c_inflight", &[backend.address()])
        .admin()
        .section("limits", "{ send_timeout: 3s }")
        .to_yaml();
    let duet = Duet::start(&yaml);
    let admin = duet.admin_address();
    // Ten GETs of 2 MiB each behind a window of 0: every response starts, no body byte can go out.
    let (mut child, mut line) = start_attack(python, &duet, "zero_window");
    assert_eq!(line(), "holding 10");
    let holding = Instant::now();
    assert_eq!(metric(admin, "duet_backend_in_flight"), 10.0);
    assert_eq!(
        backend.connections(),
        10,
        "one backend connection per stream"
    );
    let outcome = line();
    let took = holding.elapsed();
    let _ = child.wait();
    eprintln!("zero window: {outcome} after {took:?}");
    assert_eq!(outcome, "reset=10 ended=0 sent=10", "every stream reset");
    assert!(
        took < Duration::from_secs(8),
        "at the send timeout: {took:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || metric(
            admin,
            "duet_backend_in_flight"
        ) == 0.0),
        "the backends' in-flight count returned to zero"
    );
    assert!(
        eventually(Duration::from_secs(5), || backend.connections_closed()
            == 10),
        "the backend connections were closed: {} of 10",
        backend.connections_closed()
    );
    assert_eq!(
        metric(admin, "duet_send_timeouts_total"),
        10.0,
        "each stream counted"
    );
    still_serving(&duet);
}

/// The seconds in a `closed after S s` outcome.
fn closed_after(outcome: &str) -> u64 {
    outcome
        .strip_prefix("closed after ")
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(seconds, _)| seconds.parse().ok())
        .unwrap_or_else(|| panic!("not closed: {outcome}"))
}

#[test]
fn a_client_silent_after_its_preface_is_closed_even_if_it_never_acknowledges_the_goaway() {
    let Some(python) = python_with_h2() else {
        return;
    };
    // header_read_timeout 1s: the GOAWAY at 1 s, the close a header_read_timeout later.
    let (_backend, duet) = duet();
    let outcome = attack(python, &duet, "silent_forever");
    eprintln!("silent forever: {outcome}");
    assert!(closed_after(&outcome) <= 4, "{outcome}");
    still_serving(&duet);
}

#[test]
fn a_client_silent_after_a_request_is_closed_even_if_it_never_acknowledges_the_goaway() {
    let Some(python) = python_with_h2() else {
        return;
    };
    // keepalive_timeout 2s: idle for 2 to 4 s (it is looked at every 2 s), then GOAWAY, then the
    // close a header_read_timeout (1 s) later.
    let (backend, duet) = duet();
    let outcome = attack(python, &duet, "silent_after_a_request");
    eprintln!("silent after a request: {outcome}");
    assert!(closed_after(&outcome) <= 7, "{outcome}");
    assert_eq!(backend.requests(), 1);
}

#[test]
fn silent_http2_clients_at_max_connections_do_not_lock_others_out() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .section(
            "limits",
            "{ header_read_timeout: 1s, keepalive_timeout: 2s, max_connections: 4 }",
        )
        .to_yaml();
    let duet = Duet::start(&yaml);
    let silent: Vec<_> = (0..4)
        .map(|_| start_attack(python, &duet, "silent_forever"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Waits in the accept queue until a silent one is closed (about 2 s after its preface).
    still_serving(&duet);
    for (mut child, mut line) in silent {
        let outcome = line();
        let _ = child.wait();
        assert!(closed_after(&outcome) <= 4, "{outcome}");
    }
}

#[test]
fn a_prior_knowledge_client_may_open_its_connection_ahead_of_its_first_request() {
    let Some(python) = python_with_h2() else {
        return;
    };
    // header_read_timeout 1s: the preface comes 1.5 s after the connect.
    let (backend, duet) = duet();
    assert_eq!(attack(python, &duet, "late_preface"), "status 200 sent=1");
    assert_eq!(backend.requests(), 1);
}

#[test]
fn an_http2_request_with_more_fields_than_http11_allows_gets_431() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .admin()
        .to_yaml();
    let duet = Duet::start(&yaml);
    // 1,500 fields: 431 as over HTTP/1.1 (past 100 fields), before routing; 50 are served.
    assert_eq!(
        attack(python, &duet, "many_fields"),
        "statuses 431 200 sent=2"
    );
    assert_eq!(backend.requests(), 1, "the 431 reached no backend");
    assert_eq!(
        sum(
            &get(duet.admin_address(), "/metrics"),
            "duet_rejected_requests_total",
            "reason=\"head_too_large\""
        ),
        1.0
    );
}

#[test]
fn an_http2_connection_buffers_no_more_request_bodies_at_once_than_an_http11_one() {
    let Some(python) = python_with_h2() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path_prefix: /upload/buffered }}, cluster: app, buffer_request: 1MiB }}
  - {{ cluster: app }}
clusters:
  - {{ name: app, backends: [ {{ address: {} }} ] }}
",
        backend.address()
    );
    let duet = Duet::start(&yaml);
    still_serving(&duet);
    let before = duet.peak_rss_kib();
    // 100 streams each send 999,999 of the 1,000,000 bytes they announce, as fast as duet grants
    // window. Over HTTP/1.1 a connection buffers one body at a time (1 MiB here); over HTTP/2 its
    // streams queue for that one turn, their bytes held back by flow control.
    let outcome = attack(python, &duet, "buffered_uploads");
    let grown = duet.peak_rss_kib().saturating_sub(before);
    eprintln!("buffered uploads: {outcome}, duet grew {grown} KiB");
    let uploaded: u64 = outcome
        .strip_prefix("uploaded ")
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .expect("bytes uploaded");
    assert!(
        uploaded < 8_000_000,
        "held back by flow control: {uploaded} bytes taken"
    );
    assert!(grown < 24 * 1024, "duet grew {grown} KiB");
    assert_eq!(
        backend.requests(),
        1,
        "no body was whole (the one request is still_serving's)"
    );
}
