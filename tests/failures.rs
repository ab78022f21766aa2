//! Each error status, with a real cause: unreachable, garbage, slow and dying backends, no eligible one.

use crate::support;

use crate::support::{raw_exchange, Duet};
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener},
    time::{Duration, Instant},
};

fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

#[test]
fn unreachable_backend_gives_502() {
    let duet = Duet::start(&DuetConfig::single("p2c_peak_ewma", &[closed_port()]).to_yaml());
    let response = support::get_root(duet.address);
    assert!(response.starts_with("HTTP/1.1 502"), "{response}");
    assert!(response.ends_with("backend unreachable\n"), "{response}");
}

#[test]
fn garbage_from_a_backend_gives_502() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(2) {
            let Ok(mut stream) = stream else { continue };
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(b"SPDY/9 banana\r\n\r\n");
        }
    });
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[address]).to_yaml());
    let response = support::get_root(duet.address);
    assert!(response.starts_with("HTTP/1.1 502"), "{response}");
    assert!(
        response.ends_with("backend closed the connection or sent an invalid response\n"),
        "{response}"
    );
}

#[test]
fn a_backend_slower_than_response_headers_timeout_gives_504() {
    let backend = Backend::start(BackendOptions::named("slow")).expect("backend");
    let duet = Duet::start(
        &DuetConfig::single("p2c_inflight", &[backend.address()])
            .with_cluster("app", |c| c.set("timeouts", "{ response_headers: 300ms }"))
            .to_yaml(),
    );
    let started = Instant::now();
    let (response, _) = raw_exchange(
        duet.address,
        b"GET /sleep/3000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 504"), "{response}");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "answered after {:?}",
        started.elapsed()
    );
}

#[test]
fn a_cluster_without_eligible_backends_gives_503() {
    // Weight 0 everywhere cannot be written in a config file (it is rejected); built in code it
    // stands for what health checks will do: every backend out of rotation.
    let backend = Backend::start(BackendOptions::named("drained")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .with_cluster("app", |c| c.set("panic_threshold", "0%"))
        .to_yaml();
    let mut config = duet_config::parse(&yaml, "test").expect("valid");
    config.clusters[0].backends[0].weight = 0;
    let server = duet::Server::start(config).expect("start");
    let address = server.local_addrs()[0];
    let response = support::get_root(address);
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.ends_with("no backend available\n"), "{response}");
    assert_eq!(backend.requests(), 0);
    server.shutdown().expect("shutdown");
}

#[test]
fn a_backend_dying_mid_body_closes_the_client_connection() {
    let backend = Backend::start(BackendOptions::named("dying")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    let (response, closed) = raw_exchange(
        duet.address,
        b"GET /die HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "{}",
        &response[..response.len().min(200)]
    );
    assert!(response.contains("content-length: 1000000"));
    let body = response.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
    assert!(closed, "the client must see the connection close");
    assert!(
        body < 1_000_000,
        "never a complete-looking response: got {body} bytes"
    );
    // The next request on a new connection is served normally.
    let response = support::get_root(duet.address);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

#[test]
fn a_pooled_connection_closed_by_the_backend_while_idle_is_not_a_502() {
    let backend =
        Backend::start(BackendOptions::named("closer").idle_timeout(Duration::from_millis(150)))
            .expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    for round in 0..4 {
        let response = support::get_root(duet.address);
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "round {round}: {response}"
        );
        // The backend's idle timeout closes duet's pooled connection under it.
        assert!(
            support::eventually(Duration::from_secs(5), || backend.connections_closed()
                > round),
            "round {round}: the backend closed its idle connection"
        );
    }
    assert_eq!(backend.requests(), 4);
    assert_eq!(
        backend.connections(),
        4,
        "each pooled connection was closed by the backend and replaced"
    );
}

#[test]
fn requests_racing_a_backend_that_closes_idle_connections_are_all_served_without_retries() {
    // The unavoidable HTTP/1.1 close race on the upstream side: the backend closes a pooled connection
    // as idle at about the moment duet picks it for the next request. Requests are spaced around the
    // backend's idle timeout, so many of them meet a connection closing under them; none may become an
    // error, and duet's own retries are off, so the pool alone must resend them on a fresh connection.
    const REQUESTS: u64 = 40;
    let backend =
        Backend::start(BackendOptions::named("closer").idle_timeout(Duration::from_millis(100)))
            .expect("backend");
    let duet = Duet::start(
        &DuetConfig::single("p2c_inflight", &[backend.address()])
            .with_cluster("app", |c| c.set("retries", "{ attempts: 1 }"))
            .to_yaml(),
    );
    let mut failures = Vec::new();
    for round in 0..REQUESTS {
        let response = support::get_root(duet.address);
        if !response.starts_with("HTTP/1.1 200") {
            failures.push(format!(
                "round {round}: {}",
                response.lines().next().unwrap_or("")
            ));
        }
        // 94 to 106 ms: on both sides of the backend's 100 ms.
        // Wall-clock: the race is between this pause and the backend's idle timer; only real time
        // spaced around that timer runs it.
        std::thread::sleep(Duration::from_millis(94 + (round % 5) * 3));
    }
    assert!(
        failures.is_empty(),
        "{failures:?}\n{}",
        duet.log_lines().join("\n")
    );
    assert_eq!(
        backend.requests(),
        REQUESTS,
        "each request reached the backend once"
    );
    assert!(
        backend.connections() >= REQUESTS / 4,
        "the backend closed pooled connections under duet ({} connections): the race was run",
        backend.connections()
    );
}
