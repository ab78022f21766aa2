//! Nothing hangs, nothing runs out: every wait has a bound and every resource a cap, and a fault is
//! blamed on the side that caused it. Each test is bounded in time.

use crate::admin::{get, sum};
use crate::support::{eventually, Duet};
use duet_testbed::{
    config::DuetConfig,
    raw::{read_response, read_until_closed},
    Backend, BackendOptions, Misbehaviour, RawBackend,
};
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

fn metric(admin: SocketAddr, name: &str, labels: &str) -> f64 {
    sum(&get(admin, "/metrics"), name, labels)
}

#[test]
fn a_stalled_response_body_is_cut_at_the_read_timeout_and_blamed_on_the_backend() {
    let stalled = RawBackend::start(Misbehaviour::StallBody).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[stalled.address()])
        .admin()
        .with_cluster("app", |c| c.set("timeouts", "{ read: 300ms }"));
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    let started = Instant::now();
    let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5));
    let response = String::from_utf8_lossy(&response);
    assert!(closed, "the client connection is closed: {response}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "within the read timeout, not never: {:?}",
        started.elapsed()
    );
    assert!(
        response.starts_with("HTTP/1.1 200") && response.ends_with("stalled"),
        "{response}"
    );
    assert_eq!(
        metric(admin, "duet_read_timeouts_total", "cluster=\"app\""),
        1.0
    );
    assert_eq!(
        metric(admin, "duet_backend_in_flight", ""),
        0.0,
        "load released"
    );
    assert!(
        eventually(Duration::from_secs(2), || duet
            .log_lines()
            .iter()
            .any(|l| l.contains("outcome=backend_read_timeout"))),
        "the access log says why: {:#?}",
        duet.log_lines()
    );
}

#[test]
fn a_slow_upload_within_the_body_timeout_is_served_and_ejects_nobody() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let spare = Backend::start(BackendOptions::named("spare")).expect("backend");
    let config = DuetConfig::single("round_robin", &[backend.address(), spare.address()])
        .admin()
        .with_cluster("app", |c| {
            c.set("timeouts", "{ response_headers: 300ms }")
                .set("outlier_detection", "{ consecutive_failures: 1 }")
        })
        .section("limits", "{ body_read_timeout: 5s }");
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let uploads: Vec<_> = (0..2)
        .map(|_| {
            let address = duet.address;
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(address).expect("connect");
                stream
                    .write_all(b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                    .expect("head");
                // Four chunks, each after a pause longer than the response-headers timeout.
                for _ in 0..4 {
                    // Wall-clock: the slow client is what is tested; its pauses must pass in real
                    // time for duet's real timers to run over them.
                    std::thread::sleep(Duration::from_millis(400));
                    stream.write_all(b"5\r\nhello\r\n").expect("chunk");
                }
                stream.write_all(b"0\r\n\r\n").expect("end");
                let (response, _) = read_until_closed(&mut stream, Duration::from_secs(5));
                String::from_utf8_lossy(&response).into_owned()
            })
        })
        .collect();
    for upload in uploads {
        let response = upload.join().expect("client");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.ends_with("\r\n\r\n20"),
            "the whole body arrived: {response}"
        );
    }
    assert_eq!(
        metric(admin, "duet_ejections_total", ""),
        0.0,
        "a slow client is not the backend's fault"
    );
}

#[test]
fn a_client_pausing_before_the_last_of_a_response_is_cut_by_no_timeout_shorter_than_the_send_timeout(
) {
    // Once duet holds the whole response, the next head is awaited; but a client that has not read the
    // last of it yet is still a response's client, whatever the header timeout says: only
    // `send_timeout` bounds its pause. The sizes step by 256 KB (less than hyper's write buffer holds)
    // up to 6 MB, past what the socket buffers take on loopback (duet's send buffer grows to
    // `net.ipv4.tcp_wmem`'s 4 MB), so that in one of them at least the body has ended in duet while its
    // last bytes still wait in duet's buffer for the client (3.5 MB on the machine this was written on).
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()]).section(
        "limits",
        "{ header_read_timeout: 200ms, send_timeout: 30s }",
    );
    let duet = Duet::start(&config.to_yaml());
    let sizes: Vec<usize> = (1..=24).map(|k| k * 256 * 1024).collect();
    let mut clients: Vec<(usize, TcpStream)> = sizes
        .iter()
        .map(|&size| {
            let socket = socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
            .expect("socket");
            // The client's own buffer kept small: the sizes then step through duet's side.
            socket.set_recv_buffer_size(16 * 1024).expect("SO_RCVBUF");
            socket.connect(&duet.address.into()).expect("connect");
            let mut stream: TcpStream = socket.into();
            stream
                .write_all(format!("GET /bytes/{size} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .expect("write");
            (size, stream)
        })
        .collect();
    // Nothing read for five header timeouts (wall-clock: that duet does not cut shows only once the
    // time has passed).
    std::thread::sleep(Duration::from_millis(1000));
    for (size, stream) in &mut clients {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut pending = Vec::new();
        let response = read_response(stream, &mut pending);
        let received = response.as_ref().map_or(pending.len(), |r| r.body.len());
        assert!(
            response
                .as_ref()
                .is_ok_and(|r| r.status() == 200 && r.body.len() == *size),
            "{size} bytes: cut after {received}"
        );
    }
}

#[test]
fn a_client_that_stops_reading_is_cut_at_the_send_timeout() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .admin()
        .section("limits", "{ send_timeout: 500ms }");
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    // 50 MB, never read: the socket buffers fill and duet's writes stop making progress.
    stream
        .write_all(b"GET /bytes/50000000 HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    assert!(
        eventually(Duration::from_secs(10), || metric(
            admin,
            "duet_send_timeouts_total",
            ""
        ) == 1.0),
        "the connection was closed for not reading"
    );
    assert!(
        eventually(Duration::from_secs(5), || metric(
            admin,
            "duet_backend_in_flight",
            ""
        ) == 0.0),
        "the backend's in-flight count returned to zero"
    );
    drop(stream);
}

#[test]
fn an_idle_tunnel_is_closed_at_tunnel_idle() {
    let backend = Backend::start(BackendOptions::named("ws")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .with_cluster("app", |c| c.set("timeouts", "{ tunnel_idle: 400ms }"));
    let duet = Duet::start(&config.to_yaml());
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    stream
        .write_all(b"GET /upgrade HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .expect("write");
    let started = Instant::now();
    let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5));
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 101"), "{response}");
    assert!(closed, "the silent tunnel was closed");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "closed after the idle bound: {took:?}"
    );
}

#[test]
fn connections_past_max_connections_wait_until_one_closes() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .admin()
        .section("limits", "{ max_connections: 2 }");
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = TcpStream::connect(duet.address).expect("connect");
            stream.write_all(request).expect("write");
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).expect("served");
            assert_eq!(&head, b"HTTP/1.1 200");
            stream
        })
        .collect();
    let mut third = TcpStream::connect(duet.address).expect("the kernel queues it");
    third.write_all(request).expect("write");
    let (waiting, _) = read_until_closed(&mut third, Duration::from_millis(500));
    assert!(waiting.is_empty(), "not served while two are open");
    assert!(metric(admin, "duet_connections_at_capacity_total", "") >= 1.0);
    assert_eq!(metric(admin, "duet_connections_active", ""), 2.0);
    held.pop();
    let (served, _) = read_until_closed(&mut third, Duration::from_millis(1500));
    assert!(
        String::from_utf8_lossy(&served).starts_with("HTTP/1.1 200"),
        "served once a place freed up"
    );
}

#[test]
fn a_keep_alive_client_loses_no_request_during_the_drain() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let mut duet = Duet::start(
        &DuetConfig::single("p2c_inflight", &[backend.address()])
            .section("shutdown", "{ drain_timeout: 5s }")
            .to_yaml(),
    );
    let address = duet.address;
    let client = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        // Requests back to back until the drain says to close: one is likely on the wire when the
        // signal lands. Bounded by a count and a time far past what the drain takes.
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut answered, mut told_to_close, mut pending) = (0, false, Vec::new());
        for _ in 0..100_000 {
            if Instant::now() > deadline
                || stream
                    .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                    .is_err()
            {
                break;
            }
            let Ok(response) = read_response(&mut stream, &mut pending) else {
                return (answered, told_to_close, Some(pending));
            };
            answered += 1;
            if response
                .head
                .to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n")
            {
                told_to_close = true;
                break;
            }
        }
        (answered, told_to_close, None)
    });
    // Signalled once the client is in its stride.
    assert!(
        eventually(Duration::from_secs(5), || backend.requests() > 5),
        "the client's first requests were served: {}",
        backend.requests()
    );
    duet.signal("TERM");
    let (answered, told_to_close, cut) = client.join().expect("client");
    assert!(cut.is_none(), "a request on the wire was cut: {cut:?}");
    assert!(told_to_close, "the drain asked the client to close");
    assert!(answered > 5, "{answered}");
    let status = duet.wait_exit(Duration::from_secs(10)).expect("exited");
    assert!(status.success());
}

#[test]
fn a_route_timeout_bounds_all_attempts_together() {
    let slow = Backend::start(BackendOptions::named("slow")).expect("backend");
    let config = DuetConfig::new()
        .route(None, "/", "app")
        .cluster(duet_testbed::config::Cluster::new("app").backend(slow.address()));
    let yaml = config
        .to_yaml()
        .replace("cluster: app }", "cluster: app, timeout: 300ms }");
    let duet = Duet::start(&yaml);
    let started = Instant::now();
    let (response, _) = crate::support::raw_exchange(
        duet.address,
        b"GET /sleep/3000 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 504"), "{response}");
    assert!(
        response.ends_with("no answer within the route's timeout\n"),
        "{response}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(2), || duet
            .log_lines()
            .iter()
            .any(|l| l.contains("duet::access") && l.contains("status=504"))),
        "the 504 is in the access log: {:#?}",
        duet.log_lines()
    );
}

/// CPU seconds (user + system) the process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the 14th, stime the 15th.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / 100.0
}

#[test]
fn out_of_file_descriptors_is_a_local_503_that_ejects_nobody() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let spare = Backend::start(BackendOptions::named("spare")).expect("backend");
    let config = DuetConfig::single("round_robin", &[backend.address(), spare.address()])
        .with_cluster("app", |c| {
            c.set("outlier_detection", "{ consecutive_failures: 1 }")
                .set("retries", "{ attempts: 1 }")
        });
    let duet = Duet::start_with_nofile(&config.to_yaml(), "info,duet::access=off", 64);
    // One keep-alive connection, accepted while descriptors are free; its requests will need new
    // connections to the backends (the pool is empty).
    let mut client = TcpStream::connect(duet.address).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // Served (so accepted) before the flood, by an answer that needs no backend: the pool stays empty.
    client
        .write_all(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    let mut pending = Vec::new();
    read_response(&mut client, &mut pending).expect("OPTIONS answered");
    // Then take every remaining descriptor with idle connections (the rest wait in the backlog).
    let idle: Vec<TcpStream> = (0..80)
        .filter_map(|_| TcpStream::connect(duet.address).ok())
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || duet
            .log_lines()
            .iter()
            .any(|l| l.contains("accept failed"))),
        "duet ran out of descriptors: {:#?}",
        duet.log_lines()
    );
    let cpu_before = cpu_seconds(duet.pid());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .expect("write");
        let response = read_response(&mut client, &mut pending).expect("a response");
        statuses.push(response.status());
    }
    // Wall-clock: a thread spinning on a failed accept shows only as CPU time burnt over a stretch of
    // real time; nothing can be awaited for something that must not happen.
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        statuses.iter().all(|&s| s == 503),
        "{statuses:?} {:#?}",
        duet.log_lines()
    );
    let cpu = cpu_seconds(duet.pid()) - cpu_before;
    assert!(
        cpu < 0.5,
        "no thread spins while out of descriptors: {cpu:.2}s of CPU"
    );
    assert!(
        !duet
            .log_lines()
            .iter()
            .any(|l| l.contains("ejecting backend")),
        "duet's own shortage is not a backend failure: {:#?}",
        duet.log_lines()
    );
    // Descriptors come back: so does service.
    drop(idle);
    assert!(
        eventually(Duration::from_secs(5), || {
            let (response, _) = crate::support::raw_exchange(
                duet.address,
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                Duration::from_secs(2),
            );
            response.starts_with("HTTP/1.1 200")
        }),
        "recovered once descriptors were free"
    );
}

/// Sends one request on `stream` and reads one response (the testbed answers `b` with a length).
fn exchange_on(stream: &mut TcpStream, request: &[u8]) -> String {
    stream.write_all(request).expect("write");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut pending = Vec::new();
    match read_response(stream, &mut pending) {
        Ok(response) => response.head + &String::from_utf8_lossy(&response.body),
        // Cut short: what came, for the assertion's message.
        Err(_) => String::from_utf8_lossy(&pending).into_owned(),
    }
}

#[test]
fn keep_alive_is_timed_apart_from_the_header_timeout() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()]).section(
        "limits",
        "{ header_read_timeout: 300ms, keepalive_timeout: 2s, keepalive_requests: 3 }",
    );
    let duet = Duet::start(&config.to_yaml());
    let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    let first = exchange_on(&mut stream, request);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        first
            .to_ascii_lowercase()
            .contains("\r\nkeep-alive: timeout=2\r\n"),
        "clients are told when duet closes an idle connection: {first}"
    );
    // A second connection goes idle at the same time, to start a head after the idle stretch, and a
    // third to stay idle until duet closes it.
    let mut slow = TcpStream::connect(duet.address).expect("connect");
    assert!(exchange_on(&mut slow, request).starts_with("HTTP/1.1 200"));
    let mut idle = TcpStream::connect(duet.address).expect("connect");
    assert!(exchange_on(&mut idle, request).starts_with("HTTP/1.1 200"));
    let idle_since = Instant::now();
    // Idle for three header timeouts: the connection is still there.
    // Wall-clock: that duet does not close an idle connection at the header timeout shows only once
    // the time has passed.
    std::thread::sleep(Duration::from_millis(900));
    // A head that starts after the idle stretch and stalls is still cut at the header timeout, from
    // its first byte (checked below).
    slow.write_all(b"GET / HTTP/1.1\r\n")
        .expect("a partial head");
    let slow_started = Instant::now();
    let second = exchange_on(&mut stream, request);
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "kept past the header timeout: {second:?}"
    );
    // The third request on the connection is told to reconnect.
    let third = exchange_on(&mut stream, request);
    assert!(
        third
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "keepalive_requests: {third}"
    );
    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5));
    assert!(
        closed && slow_started.elapsed() < Duration::from_secs(1),
        "{:?}",
        slow_started.elapsed()
    );

    // An idle connection is closed after keepalive_timeout.
    let (_, closed) = read_until_closed(&mut idle, Duration::from_secs(5));
    assert!(closed, "closed when idle");
    let took = idle_since.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "after keepalive_timeout: {took:?}"
    );
}

#[test]
fn a_connection_opened_ahead_of_its_first_request_waits_for_it_as_a_kept_alive_one_would() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .admin()
        .section(
            "limits",
            "{ header_read_timeout: 1s, keepalive_timeout: 3s }",
        );
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let opened = Instant::now();
    let mut early = TcpStream::connect(duet.address).expect("connect");
    let mut silent = TcpStream::connect(duet.address).expect("connect");
    // Both wait in the parking lot, as idle keep-alive connections do.
    assert!(
        eventually(Duration::from_secs(5), || metric(
            admin,
            "duet_connections_parked",
            ""
        ) == 2.0),
        "both parked"
    );
    // Wall-clock: that duet keeps the connection past the header timeout shows only once it has
    // passed.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(opened.elapsed()));
    let response = exchange_on(&mut early, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "the first request, past the header timeout: {response:?}"
    );
    // The one that never sends a request is closed at the keep-alive timeout.
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(6));
    let took = opened.elapsed();
    assert!(closed, "a silent connection is closed");
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(5),
        "closed at the keep-alive timeout: {took:?}"
    );
}

#[test]
fn a_first_head_that_starts_late_and_stalls_is_cut_at_the_header_timeout_from_its_first_byte() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()]).section(
        "limits",
        "{ header_read_timeout: 1s, keepalive_timeout: 30s }",
    );
    let duet = Duet::start(&config.to_yaml());
    let mut slow = TcpStream::connect(duet.address).expect("connect");
    // Wall-clock: the head starts after the header timeout has passed since the accept.
    std::thread::sleep(Duration::from_millis(1500));
    slow.write_all(b"GET / HTTP/1.1\r\n")
        .expect("a partial head");
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5));
    let took = started.elapsed();
    assert!(closed, "a stalled head is cut");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "at the header timeout from its first byte: {took:?}"
    );
    assert_eq!(backend.requests(), 0);
}

#[test]
fn at_max_connections_connections_opened_ahead_of_their_requests_make_room() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .workers(1)
        .admin()
        .section(
            "limits",
            "{ max_connections: 4, header_read_timeout: 1s, keepalive_timeout: 30s }",
        );
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let _silent: Vec<_> = (0..4)
        .map(|_| TcpStream::connect(duet.address).expect("connect"))
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || metric(
            admin,
            "duet_connections_parked",
            ""
        ) == 4.0),
        "all four parked"
    );
    let started = Instant::now();
    let mut newcomer = TcpStream::connect(duet.address).expect("connect");
    let response = exchange_on(&mut newcomer, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    // Without room made it would wait for a keep-alive timeout (30 s).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "served at once: {:?}",
        started.elapsed()
    );
    assert_eq!(metric(admin, "duet_connections_reclaimed_total", ""), 1.0);
}

#[test]
fn at_max_connections_the_oldest_idle_connection_makes_room() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .workers(1)
        .admin()
        .section(
            "limits",
            "{ max_connections: 4, header_read_timeout: 1s, keepalive_timeout: 30s }",
        );
    let duet = Duet::start(&config.to_yaml());
    let admin = duet.admin_address();
    let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    // Each served, then idle until parked, before the next: the first is the oldest idle one.
    let mut idle = Vec::new();
    for parked in 1..=4 {
        let mut stream = TcpStream::connect(duet.address).expect("connect");
        assert!(exchange_on(&mut stream, request).starts_with("HTTP/1.1 200"));
        idle.push(stream);
        assert!(
            eventually(Duration::from_secs(5), || metric(
                admin,
                "duet_connections_parked",
                ""
            ) == f64::from(parked)),
            "{parked} parked"
        );
    }
    let started = Instant::now();
    let mut newcomer = TcpStream::connect(duet.address).expect("connect");
    let response = exchange_on(&mut newcomer, request);
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    // Without room made it would wait for an idle one's keep-alive timeout (30 s): 10 s tells the two
    // apart on a machine too loaded to serve within a second.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "served at once: {:?}",
        started.elapsed()
    );
    let (_, closed) = read_until_closed(&mut idle[0], Duration::from_secs(1));
    assert!(closed, "the oldest idle connection made room");
    for (n, stream) in idle.iter_mut().enumerate().skip(1) {
        let response = exchange_on(stream, request);
        assert!(response.starts_with("HTTP/1.1 200"), "{n}: {response:?}");
    }
    assert_eq!(metric(admin, "duet_connections_reclaimed_total", ""), 1.0);
    assert_eq!(metric(admin, "duet_connections_active", ""), 4.0);
}
