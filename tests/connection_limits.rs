//! A listener's per-client connection caps (`limits:`), through the real binary with two workers
//! (the counts are the process's): real connections from 127.0.0.2 and 127.0.0.3 as sources, the
//! one over a cap closed at accept with nothing written, counted by reason.

use crate::{admin, support::Duet};
use duet_testbed::{raw::read_until_closed, Backend, BackendOptions};
use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

/// A connection to `to` from `source`.
fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let source: IpAddr = source.parse().expect("ip");
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::new(source, 0).into())
        .expect("bind the source address");
    socket.connect(&to.into()).expect("connect");
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
}

/// One keep-alive `GET /` on `stream`: the status line's code, or `""` if duet closed the
/// connection without an answer. The connection stays open after an answer.
fn get_on(stream: &mut TcpStream) -> String {
    // Writing to a connection duet closed may fail: what is read says what happened.
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return String::new(),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let length: usize = (text.lines())
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let _ = stream.read_exact(&mut body);
    text.get(9..12).unwrap_or_default().to_owned()
}

/// A new connection from `source`, one request on it, then closed: its status, or `""`.
fn get_from(source: &str, to: SocketAddr) -> String {
    let mut stream = connect_from(source, to);
    let status = get_on(&mut stream);
    if status.is_empty() {
        let (rest, _) = read_until_closed(&mut stream, Duration::from_secs(5));
        assert!(
            rest.is_empty(),
            "nothing is written on a refused connection"
        );
    }
    status
}

fn config(limits: &str, backend: SocketAddr) -> String {
    format!(
        "workers: 2
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: '0.0.0.0:0', limits: {limits} }} ]
routes: [ {{ cluster: web }} ]
clusters:
  - {{ name: web, backends: [ {{ address: {backend} }} ] }}
"
    )
}

/// `duet_connections_refused_total` for `reason`, over the workers.
fn refused(duet: &Duet, reason: &str) -> f64 {
    let metrics = admin::get(duet.admin_address(), "/metrics");
    admin::sum(
        &metrics,
        "duet_connections_refused_total",
        &format!("reason=\"{reason}\""),
    )
}

#[test]
fn a_client_holding_its_cap_of_open_connections_gets_no_more_until_one_closes() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let duet = Duet::start(&config("{ connections_per_client: 2 }", backend.address()));
    let to = SocketAddr::new([127, 0, 0, 1].into(), duet.address.port());
    // Each answered before the next opens: admitted in this order, whichever worker took it.
    let mut first = connect_from("127.0.0.2", to);
    assert_eq!(get_on(&mut first), "200");
    let mut second = connect_from("127.0.0.2", to);
    assert_eq!(get_on(&mut second), "200");
    for _ in 0..3 {
        assert_eq!(
            get_from("127.0.0.2", to),
            "",
            "over the cap: closed unanswered"
        );
    }
    assert_eq!(
        get_from("127.0.0.3", to),
        "200",
        "another client has its own cap"
    );
    assert_eq!(get_on(&mut first), "200", "the open ones are served on");
    assert_eq!(refused(&duet, "connections_per_client"), 3.0);
    assert_eq!(refused(&duet, "new_connections_per_client"), 0.0);
    drop(first);
    let freed = duet_testbed::wait::eventually(Duration::from_secs(5), || {
        let mut again = connect_from("127.0.0.2", to);
        get_on(&mut again) == "200"
    });
    assert!(freed, "a closed connection gives its place back");
    drop(second);
}

#[test]
fn a_client_over_its_new_connections_per_period_is_closed_at_accept_and_counted() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let duet = Duet::start(&config(
        "{ new_connections_per_client: 3/m }",
        backend.address(),
    ));
    let to = SocketAddr::new([127, 0, 0, 1].into(), duet.address.port());
    let statuses: Vec<String> = (0..5).map(|_| get_from("127.0.0.2", to)).collect();
    assert_eq!(statuses, ["200", "200", "200", "", ""]);
    assert_eq!(
        get_from("127.0.0.3", to),
        "200",
        "another client has its own allowance"
    );
    assert_eq!(refused(&duet, "new_connections_per_client"), 2.0);
    assert_eq!(refused(&duet, "connections_per_client"), 0.0);
    assert_eq!(backend.requests(), 4);
}
