//! SIGTERM drains in-flight requests; upgraded connections are tunnelled both ways.

use crate::support;

use crate::support::{raw_exchange, Duet};
use duet_testbed::config::DuetConfig;
use duet_testbed::{raw::read_head, Backend, BackendOptions};
use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

#[test]
fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let backend = Backend::start(BackendOptions::named("steady")).expect("backend");
    let mut duet = Duet::start(
        &DuetConfig::single("p2c_peak_ewma", &[backend.address()])
            .workers(2)
            .admin()
            .section("shutdown", "{ drain_timeout: 10s }")
            .to_yaml(),
    );
    let address = duet.address;
    let admin = duet.admin_address();
    // "listening" is logged once the listeners are bound; each worker registers as it starts serving,
    // which a loaded machine can delay past the first look.
    assert!(
        support::eventually(Duration::from_secs(10), || crate::admin::get(
            admin, "/ready"
        )
        .starts_with("HTTP/1.1 200")),
        "/ready never said every worker serves"
    );
    let in_flight: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                raw_exchange(
                    address,
                    b"GET /sleep/1500 HTTP/1.1\r\nHost: x\r\n\r\n",
                    Duration::from_secs(8),
                )
            })
        })
        .collect();
    assert!(
        support::eventually(Duration::from_secs(5), || backend.requests() == 3),
        "requests reached the backend"
    );
    let signalled = Instant::now();
    duet.signal("TERM");
    // New connections are refused once the listeners close.
    assert!(
        support::eventually(Duration::from_secs(3), || TcpStream::connect(address)
            .is_err()),
        "still accepting after SIGTERM"
    );
    let ready = crate::admin::get(admin, "/ready");
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.ends_with("not ready: draining\n"),
        "while requests drain, /ready turns traffic away: {ready}"
    );
    for request in in_flight {
        let (response, closed) = request.join().expect("client thread");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("steady"), "{response}");
        assert!(
            closed,
            "keep-alive connections are closed after their last response"
        );
    }
    let status = duet.wait_exit(Duration::from_secs(10)).expect("exited");
    assert!(status.success(), "{status:?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "drained in {:?}",
        signalled.elapsed()
    );
}

#[test]
fn drain_deadline_bounds_shutdown() {
    let backend = Backend::start(BackendOptions::named("stuck")).expect("backend");
    let mut duet = Duet::start(
        &DuetConfig::single("p2c_inflight", &[backend.address()])
            .section("shutdown", "{ drain_timeout: 500ms }")
            .to_yaml(),
    );
    let address = duet.address;
    let stuck = std::thread::spawn(move || {
        raw_exchange(
            address,
            b"GET /sleep/20000 HTTP/1.1\r\nHost: x\r\n\r\n",
            Duration::from_secs(10),
        )
    });
    assert!(support::eventually(Duration::from_secs(5), || backend
        .requests()
        == 1));
    let signalled = Instant::now();
    duet.signal("INT");
    let status = duet.wait_exit(Duration::from_secs(5)).expect("exited");
    assert_eq!(
        status.code(),
        Some(duet::cli::DRAIN_CUT_SHORT),
        "the exit code says the drain cut a request short"
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "took {:?}",
        signalled.elapsed()
    );
    let (response, closed) = stuck.join().expect("client");
    assert!(closed);
    assert_eq!(
        response, "",
        "the request cut off by the drain deadline gets no response at all, its connection is closed"
    );
}

#[test]
fn an_upgraded_connection_is_tunnelled_both_ways() {
    let backend = Backend::start(BackendOptions::named("ws")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(b"GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        .expect("handshake");
    let head = read_head(&mut stream).expect("101 head").to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("upgrade: websocket") && head.contains("connection: upgrade"),
        "{head}"
    );
    // The backend saw the upgrade request with its Upgrade header intact.
    let seen = backend.recorded().pop().expect("request");
    assert_eq!(seen.headers["upgrade"], "websocket");
    assert_eq!(
        seen.headers["sec-websocket-key"],
        "dGhlIHNhbXBsZSBub25jZQ=="
    );
    for message in [
        &b"ping"[..],
        &[0x81, 0x85, 1, 2, 3, 4, 5][..],
        &vec![7u8; 100_000][..],
    ] {
        stream.write_all(message).expect("send");
        let mut echoed = vec![0u8; message.len()];
        stream.read_exact(&mut echoed).expect("echo");
        assert_eq!(echoed, message);
    }
}
