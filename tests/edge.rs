//! What duet does at the edge with exactly these bytes: Host, framing, limits, paths, upgrades and
//! forwarding fields, each rule against the real binary through a raw socket.

use crate::{
    admin,
    support::{raw_exchange, Duet},
};
use duet_testbed::{
    config::{Cluster, DuetConfig},
    Backend, BackendOptions, Misbehaviour, RawBackend,
};
use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpStream},
    time::Duration,
};

/// Sends `request` and returns the whole response (the requests say `Connection: close`).
fn exchange(duet: &Duet, request: &[u8]) -> String {
    raw_exchange(duet.address, request, Duration::from_secs(5)).0
}

fn status(response: &str) -> &str {
    response.get(9..12).unwrap_or(response)
}

fn one_backend() -> (Backend, Duet) {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    (backend, duet)
}

#[test]
fn host_must_be_one_valid_authority() {
    let (backend, duet) = one_backend();
    let rejected: &[&[u8]] = &[
        b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.com\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x/y\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: evil@host\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test, b.test\r\nConnection: close\r\n\r\n",
        b"GET http://user@a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    ];
    for request in rejected {
        let response = exchange(&duet, request);
        assert_eq!(
            status(&response),
            "400",
            "{:?}: {response}",
            String::from_utf8_lossy(request)
        );
    }
    assert_eq!(backend.requests(), 0, "none of them was forwarded");
    // HTTP/1.0 may omit Host.
    let response = exchange(&duet, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(status(&response), "200", "{response}");
    assert_eq!(backend.requests(), 1);
}

#[test]
fn an_absolute_target_is_the_host_the_backend_sees() {
    let inside = Backend::start(BackendOptions::named("inside")).expect("backend");
    let outside = Backend::start(BackendOptions::named("outside")).expect("backend");
    let config = DuetConfig::new()
        .route(Some("internal.example.com"), "/", "inside")
        .route(None, "/", "outside")
        .cluster(Cluster::new("inside").backend(inside.address()))
        .cluster(Cluster::new("outside").backend(outside.address()));
    let duet = Duet::start(&config.to_yaml());
    let response = exchange(
        &duet,
        b"GET http://internal.example.com/secret HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n",
    );
    assert!(response.ends_with("inside"), "{response}");
    let seen = inside.recorded().pop().expect("forwarded");
    assert_eq!(seen.uri, "/secret");
    assert_eq!(
        seen.headers["host"], "internal.example.com",
        "routed and forwarded on the same host"
    );
}

#[test]
fn connection_cannot_remove_host_or_framing() {
    let (backend, duet) = one_backend();
    let response = exchange(
        &duet,
        b"POST /upload HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nConnection: host, content-length, close\r\n\r\nhello",
    );
    assert!(
        response.ends_with("\r\n\r\n5"),
        "the body arrived whole: {response}"
    );
    let seen = backend.recorded().pop().expect("forwarded");
    assert_eq!(seen.headers["host"], "a.test");
    assert_eq!(seen.headers["content-length"], "5");
}

#[test]
fn ambiguous_or_undecodable_response_framing_is_502() {
    for misbehaviour in [Misbehaviour::BothLengths, Misbehaviour::GzipChunked] {
        let raw = RawBackend::start(misbehaviour).expect("backend");
        let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[raw.address()]).to_yaml());
        let response = exchange(
            &duet,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status(&response), "502", "{misbehaviour:?}: {response}");
        assert!(!response.contains("hello"), "{misbehaviour:?}: {response}");
    }
}

#[test]
fn a_repeated_content_length_goes_on_as_one() {
    let raw = RawBackend::start(Misbehaviour::RepeatedLength).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[raw.address()]).to_yaml());
    let response = exchange(
        &duet,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let lengths: Vec<&str> = response
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
        .collect();
    assert_eq!(lengths, vec!["content-length: 5"], "{response}");
    assert!(response.ends_with("\r\n\r\nhello"), "{response}");
}

#[test]
fn a_response_with_up_to_100_fields_is_relayed_and_one_with_more_is_a_local_502() {
    // The response, and duet's metrics after it.
    let response_with_cookies = |count| {
        let raw = RawBackend::start(Misbehaviour::Cookies(count)).expect("backend");
        let duet = Duet::start(
            &DuetConfig::single("p2c_inflight", &[raw.address()])
                .admin()
                .to_yaml(),
        );
        let response = exchange(
            &duet,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        (response, admin::get(duet.admin_address(), "/metrics"))
    };
    // 99 `Set-Cookie` and a `Content-Length`: 100 fields, hyper's (and Envoy's) limit.
    let (response, _) = response_with_cookies(99);
    assert_eq!(status(&response), "200", "{response}");
    let cookies = response
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .count();
    assert_eq!(cookies, 99);
    // One more is over duet's own limit: a 502 that is not the backend's failure.
    let (response, metrics) = response_with_cookies(100);
    assert_eq!(status(&response), "502", "{response}");
    assert!(!response.contains("c99=v"), "{response}");
    let failures = |kind: &str| {
        admin::sum(
            &metrics,
            "duet_backend_failures_total",
            &format!("kind=\"{kind}\""),
        )
    };
    assert_eq!(failures("local"), 1.0, "{metrics}");
    assert_eq!(failures("protocol"), 0.0, "{metrics}");
}

#[test]
fn a_request_coding_other_than_chunked_is_501() {
    let (backend, duet) = one_backend();
    let response = exchange(
        &duet,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    assert_eq!(status(&response), "501", "{response}");
    assert_eq!(backend.requests(), 0);
}

/// A request whose head (request line, fields and the blank line) is exactly `size` bytes, padded with
/// `fields` fields.
fn head_of(size: usize, fields: usize) -> Vec<u8> {
    let start = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n";
    let end = "\r\n";
    // Each padding field is "X-Pad-NNN: vvv\r\n".
    let overhead = start.len() + end.len() + fields * "X-Pad-000: \r\n".len();
    let value = size.checked_sub(overhead).expect("size fits the fields");
    let mut head = start.to_owned();
    for i in 0..fields {
        let share = value / fields + usize::from(i < value % fields);
        head.push_str(&format!("X-Pad-{i:03}: {}\r\n", "v".repeat(share)));
    }
    head.push_str(end);
    assert_eq!(head.len(), size);
    head.into_bytes()
}

#[test]
fn the_head_limit_holds_to_the_byte() {
    for (configured, limit) in [
        (None, 64 * 1024),
        (Some("16KiB"), 16 * 1024),
        (Some("100KiB"), 100 * 1024),
    ] {
        let backend = Backend::start(BackendOptions::named("b")).expect("backend");
        let mut config = DuetConfig::single("p2c_inflight", &[backend.address()]);
        if let Some(size) = configured {
            config = config.section("limits", &format!("{{ max_request_head: {size} }}"));
        }
        let duet = Duet::start(&config.to_yaml());
        for fields in [1, 90] {
            let at = exchange(&duet, &head_of(limit, fields));
            assert_eq!(status(&at), "200", "{limit} bytes in {fields} fields");
            let over = exchange(&duet, &head_of(limit + 1, fields));
            assert_eq!(
                status(&over),
                "431",
                "{} bytes in {fields} fields",
                limit + 1
            );
        }
        assert_eq!(
            backend.requests(),
            2,
            "only the heads within the limit were forwarded"
        );
    }
}

#[test]
fn dot_segments_are_resolved_before_routing() {
    let public = Backend::start(BackendOptions::named("public")).expect("backend");
    let admin = Backend::start(BackendOptions::named("admin")).expect("backend");
    let config = DuetConfig::new()
        .route(None, "/public", "public")
        .route(None, "/", "admin")
        .cluster(Cluster::new("public").backend(public.address()))
        .cluster(Cluster::new("admin").backend(admin.address()));
    let duet = Duet::start(&config.to_yaml());
    for target in [
        "/public/../admin/x",
        "/public/%2e%2e/admin/x",
        "/public/./.././admin/x",
    ] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let response = exchange(&duet, request.as_bytes());
        assert!(response.ends_with("admin"), "{target}: {response}");
        assert_eq!(
            admin.recorded().pop().expect("forwarded").uri,
            "/admin/x",
            "{target}"
        );
    }
    // An encoded slash is a separator to some backends and not to others: refused, never forwarded.
    let response = exchange(
        &duet,
        b"GET /public/a%2f..%2fb HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&response), "400", "{response}");
    assert!(response.ends_with("ambiguous request path\n"), "{response}");
    let response = exchange(
        &duet,
        b"GET /../etc/passwd HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&response), "400", "{response}");
    assert_eq!(public.requests() + admin.requests(), 3);
}

#[test]
fn only_websocket_is_upgraded_and_only_on_http_11() {
    let (backend, duet) = one_backend();
    // The testbed backend switches on `/upgrade`; the tunnel then stays open, so read for a second.
    let (response, _) = raw_exchange(
        duet.address,
        b"GET /upgrade HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nUpgrade: websocket\r\n\r\n",
        Duration::from_secs(1),
    );
    assert!(response.starts_with("HTTP/1.1 101"), "{response}");
    let seen = backend.recorded().pop().expect("forwarded");
    let upgrades: Vec<_> = seen.headers.get_all("upgrade").iter().collect();
    assert_eq!(upgrades, vec!["websocket"], "h2c never goes on");

    let response = exchange(
        &duet,
        b"GET / HTTP/1.0\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    let seen = backend.recorded().pop().expect("forwarded");
    assert!(!seen.headers.contains_key("upgrade"), "RFC 9110 §7.8");
}

#[test]
fn a_trailer_field_without_a_body_is_dropped() {
    let (backend, duet) = one_backend();
    let response = exchange(
        &duet,
        b"GET / HTTP/1.1\r\nHost: a\r\nTrailer: x-checksum\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    assert!(!backend
        .recorded()
        .pop()
        .expect("forwarded")
        .headers
        .contains_key("trailer"));
}

#[test]
fn options_asterisk_is_answered() {
    let (backend, duet) = one_backend();
    let response = exchange(
        &duet,
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    assert!(
        response
            .to_ascii_lowercase()
            .contains("\r\nallow: get, head"),
        "{response}"
    );
    assert_eq!(backend.requests(), 0);
}

#[test]
fn a_client_that_half_closes_after_its_request_is_answered() {
    let (_backend, duet) = one_backend();
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    stream.shutdown(Shutdown::Write).expect("half-close");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
}

#[test]
fn bytes_after_a_head_response_never_reach_the_next_request() {
    let raw = RawBackend::start(Misbehaviour::BodyAfterHead).expect("backend");
    let duet = Duet::start(
        &DuetConfig::single("p2c_inflight", &[raw.address()])
            .with_cluster("app", |c| c.set("retries", "{ attempts: 1 }"))
            .to_yaml(),
    );
    let head = exchange(
        &duet,
        b"HEAD / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&head), "200", "{head}");
    assert!(head.ends_with("\r\n\r\n"), "no body after a HEAD: {head}");
    for _ in 0..3 {
        let get = exchange(
            &duet,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status(&get), "200", "{get}");
        assert!(get.ends_with("\r\n\r\nhello"), "{get}");
    }
    let _: SocketAddr = raw.address();
}

/// A backend that answers one request with `ok` and hands over the bytes it received, trailers and
/// all (the testbed's backends record heads only).
pub(crate) fn recording_backend() -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let (sent, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 4096];
        // The request is chunked: it ends with the last chunk and the blank line after its trailers.
        while !ends_chunked_message(&bytes) {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            }
        }
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        let _ = sent.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    (address, received)
}

fn ends_chunked_message(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.split_once("\r\n\r\n")
        .and_then(|(_, body)| body.find("\r\n0\r\n").map(|at| &body[at + 2..]))
        .is_some_and(|last| last.ends_with("\r\n\r\n"))
}

#[test]
fn request_trailers_cannot_carry_forwarding_or_identity_fields() {
    let (backend, received) = recording_backend();
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend]).to_yaml());
    let response = exchange(
        &duet,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\
          Trailer: X-Forwarded-For, X-Request-Id, X-Real-IP, Proxy, Connection, X-Checksum\r\n\
          Connection: close\r\n\r\n\
          5\r\nhello\r\n0\r\n\
          X-Forwarded-For: 6.6.6.6\r\nX-Request-Id: forged\r\nX-Real-IP: 6.6.6.6\r\n\
          Proxy: http://evil.test\r\nConnection: x-checksum\r\nX-Checksum: abc\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    let seen = received
        .recv_timeout(Duration::from_secs(5))
        .expect("the backend got the request")
        .to_ascii_lowercase();
    let (head, body) = seen.split_once("\r\n\r\n").expect("a head");
    let trailers = body.split_once("\r\n0\r\n").expect("the last chunk").1;
    assert_eq!(
        trailers, "x-checksum: abc\r\n\r\n",
        "only the end-to-end trailer goes on"
    );
    assert!(
        !head.contains("forged") && !head.contains("6.6.6.6"),
        "{head}"
    );
}

#[test]
fn connection_cannot_remove_the_fields_duet_sets() {
    let (backend, duet) = one_backend();
    let response = exchange(
        &duet,
        b"GET /id HTTP/1.1\r\nHost: a.test\r\n\
          Connection: close, X-Request-Id, X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    let seen = backend.recorded().pop().expect("forwarded").headers;
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "a.test");
    let forwarded = seen
        .get("x-request-id")
        .and_then(|id| id.to_str().ok())
        .expect("the backend got an X-Request-Id")
        .to_owned();
    let logged = crate::support::eventually(Duration::from_secs(5), || {
        duet.log_lines()
            .iter()
            .any(|l| l.contains("path=/id") && l.ends_with(&format!(" request_id={forwarded}")))
    });
    assert!(
        logged,
        "the access log records the id the backend got ({forwarded}): {:#?}",
        duet.log_lines()
    );
}

#[test]
fn the_proxy_field_never_reaches_a_backend() {
    // httpoxy (CVE-2016-5385): CGI-style backends read `Proxy` as the HTTP_PROXY variable.
    let (backend, duet) = one_backend();
    let response = exchange(
        &duet,
        b"GET / HTTP/1.1\r\nHost: a\r\nProxy: http://evil.test:8080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    let seen = backend.recorded().pop().expect("forwarded").headers;
    assert!(!seen.contains_key("proxy"), "{seen:?}");
}

/// The access-log lines written so far that hold every one of `fields`.
fn access_lines_with(duet: &Duet, fields: &[&str]) -> bool {
    crate::support::eventually(Duration::from_secs(5), || {
        duet.log_lines()
            .iter()
            .any(|l| l.contains("duet::access") && fields.iter().all(|f| l.contains(f)))
    })
}

#[test]
fn connect_is_answered_405_with_allow_and_logged_so() {
    let (backend, duet) = one_backend();
    for request in [
        &b"CONNECT / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..],
        b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nConnection: close\r\n\r\n",
    ] {
        let response = exchange(&duet, request);
        assert_eq!(status(&response), "405", "{response}");
        assert!(
            response
                .to_ascii_lowercase()
                .contains("\r\nallow: get, head, post, put, delete, patch, options, trace\r\n"),
            "{response}"
        );
    }
    assert_eq!(backend.requests(), 0, "never forwarded");
    assert!(
        access_lines_with(
            &duet,
            &[
                " method=CONNECT ",
                " status=405 ",
                " outcome=method_not_allowed"
            ]
        ),
        "{:#?}",
        duet.log_lines()
    );
}

#[test]
fn a_method_that_is_not_upper_case_is_400_and_never_routed() {
    // A lower-case `delete` would miss a `method: [DELETE]` route and reach a catch-all, while some
    // backends read it as DELETE; methods are case-sensitive (RFC 9110 §9.1) and nginx refuses it.
    let guarded = Backend::start(BackendOptions::named("guarded")).expect("backend");
    let open = Backend::start(BackendOptions::named("open")).expect("backend");
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n\
         \x20 - {{ match: {{ method: [DELETE], path_prefix: /api }}, cluster: guarded }}\n\
         \x20 - {{ cluster: open }}\nclusters:\n\
         \x20 - {{ name: guarded, backends: [ {{ address: {} }} ] }}\n\
         \x20 - {{ name: open, backends: [ {{ address: {} }} ] }}\n",
        guarded.address(),
        open.address()
    );
    let duet = Duet::start(&yaml);
    for method in ["delete", "Delete", "get", "pOST"] {
        let request =
            format!("{method} /api/users/1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let response = exchange(&duet, request.as_bytes());
        assert_eq!(status(&response), "400", "{method}: {response}");
    }
    assert_eq!((guarded.requests(), open.requests()), (0, 0));
    assert!(
        access_lines_with(
            &duet,
            &[" method=delete ", " status=400 ", " outcome=invalid_method"]
        ),
        "{:#?}",
        duet.log_lines()
    );
    // Upper case, and extension methods in upper case, still go where their routes say.
    let response = exchange(
        &duet,
        b"DELETE /api/users/1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert!(response.ends_with("guarded"), "{response}");
    let response = exchange(
        &duet,
        b"PROPFIND /api/users/1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert!(response.ends_with("open"), "{response}");
}

/// duet with one listener (its `underscores_in_headers` as given, when given) and a route that sets
/// `x-team` and removes `x-debug`, over `backend`, with the admin listener.
fn edited_route(backend: SocketAddr, underscores: &str) -> Duet {
    let yaml = format!(
        "workers: 1\nadmin: {{ address: 127.0.0.1:0 }}\n\
         listeners: [ {{ address: 127.0.0.1:0 {underscores} }} ]\nroutes:\n\
         \x20 - cluster: app\n    request_headers: {{ set: {{ x-team: api }}, remove: [x-debug] }}\n\
         clusters: [ {{ name: app, backends: [ {{ address: {backend} }} ] }} ]\n"
    );
    Duet::start(&yaml)
}

const UNDERSCORED: &[u8] = b"GET /u HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 6.6.6.6\r\n\
    X_Real_IP: 6.6.6.6\r\nX_Request_Id: forged\r\nX_Team: admin\r\nX_Debug: 1\r\n\
    X-Kept: yes\r\nConnection: close\r\n\r\n";

#[test]
fn header_names_with_underscores_are_dropped_and_counted_by_default() {
    // A CGI or WSGI backend reads `X_Forwarded_For` as HTTP_X_FORWARDED_FOR, the variable of the
    // X-Forwarded-For duet rebuilt: nginx drops such names by default.
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = edited_route(backend.address(), "");
    let response = exchange(&duet, UNDERSCORED);
    assert_eq!(status(&response), "200", "{response}");
    let seen = backend.recorded().pop().expect("forwarded").headers;
    let underscored: Vec<_> = seen.keys().filter(|n| n.as_str().contains('_')).collect();
    assert!(underscored.is_empty(), "{seen:?}");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-team"], "api");
    assert!(!seen.contains_key("x-debug"));
    assert_eq!(seen["x-kept"], "yes");
    let metrics = admin::get(duet.admin_address(), "/metrics");
    assert_eq!(
        admin::sum(&metrics, "duet_underscore_headers_dropped_total", ""),
        5.0,
        "{metrics}"
    );
}

#[test]
fn a_listener_may_keep_header_names_with_underscores() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = edited_route(backend.address(), ", underscores_in_headers: keep");
    let response = exchange(&duet, UNDERSCORED);
    assert_eq!(status(&response), "200", "{response}");
    let seen = backend.recorded().pop().expect("forwarded").headers;
    assert_eq!(seen["x_forwarded_for"], "6.6.6.6");
    assert_eq!(seen["x_team"], "admin");
    assert_eq!(seen["x-team"], "api");
    let metrics = admin::get(duet.admin_address(), "/metrics");
    assert_eq!(
        admin::sum(&metrics, "duet_underscore_headers_dropped_total", ""),
        0.0,
        "{metrics}"
    );
}

#[test]
fn request_trailers_cannot_undo_the_routes_header_edits_or_carry_underscored_names() {
    // A backend that merges trailers into its headers would otherwise read the `X-User-Role` the route
    // sets and the `X-Debug` it removes as the client wrote them.
    let (backend, received) = recording_backend();
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n\
         \x20 - cluster: app\n    request_headers: {{ set: {{ x-user-role: guest }}, remove: [x-debug] }}\n\
         clusters: [ {{ name: app, backends: [ {{ address: {backend} }} ] }} ]\n"
    );
    let duet = Duet::start(&yaml);
    let response = exchange(
        &duet,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\
          Trailer: X-User-Role, X-Debug, X_Team, X-Checksum\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n0\r\n\
          X-User-Role: admin\r\nX-Debug: 1\r\nX_Team: admin\r\nX-Checksum: abc\r\n\r\n",
    );
    assert_eq!(status(&response), "200", "{response}");
    let seen = received
        .recv_timeout(Duration::from_secs(5))
        .expect("the backend got the request")
        .to_ascii_lowercase();
    let (head, body) = seen.split_once("\r\n\r\n").expect("a head");
    assert!(head.contains("\r\nx-user-role: guest\r\n"), "{head}");
    let trailers = body.split_once("\r\n0\r\n").expect("the last chunk").1;
    assert_eq!(
        trailers, "x-checksum: abc\r\n\r\n",
        "only the trailer the route leaves alone goes on"
    );
}
