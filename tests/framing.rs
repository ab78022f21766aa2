//! Request smuggling and limits: nothing ambiguous reaches a backend, oversized heads are refused.

use crate::support;

use crate::support::{raw_exchange, Duet};
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use std::time::{Duration, Instant};

/// A backend behind duet, with `limits` set to a YAML value if given.
fn setup(limits: Option<&str>) -> (Backend, Duet) {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let mut config = DuetConfig::single("p2c_inflight", &[backend.address()]);
    if let Some(limits) = limits {
        config = config.section("limits", limits);
    }
    let duet = Duet::start(&config.to_yaml());
    (backend, duet)
}

#[test]
fn conflicting_content_lengths_get_400_and_close() {
    let (backend, duet) = setup(None);
    let (response, closed) = raw_exchange(
        duet.address,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhelloo",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(closed, "the connection is closed after a framing error");
    assert_eq!(backend.requests(), 0, "nothing reached the backend");
}

#[test]
fn transfer_encoding_other_than_chunked_gets_400() {
    let (backend, duet) = setup(None);
    for te in ["gzip", "chunked, gzip", "identity"] {
        let request = format!("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        let (response, closed) =
            raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 400"), "{te}: {response}");
        assert!(closed);
    }
    assert_eq!(backend.requests(), 0);
}

/// Content-Length with Transfer-Encoding: RFC 9112 §6.3 lets a server either reject it or read the body
/// by its chunked framing alone and close the connection afterwards. hyper does the latter, and discards
/// the Content-Length, so the backend sees one unambiguous framing and no second request can be
/// smuggled behind the first: the bytes after the chunked body never become a request.
#[test]
fn content_length_with_transfer_encoding_is_read_as_chunked_then_closed() {
    let (backend, duet) = setup(None);
    let smuggled = b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let (response, closed) = raw_exchange(duet.address, smuggled, Duration::from_secs(5));
    assert!(closed, "connection closed after the response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.ends_with("\r\n\r\n5"),
        "the whole chunked body (5 bytes) was read: {response}"
    );
    assert_eq!(
        response.matches("HTTP/1.1").count(),
        1,
        "only one response: {response}"
    );
    let seen = backend.recorded();
    assert_eq!(seen.len(), 1, "the smuggled GET never reached the backend");
    assert!(
        !seen[0].headers.contains_key("content-length"),
        "{:?}",
        seen[0].headers
    );
}

#[test]
fn an_oversized_head_gets_431_and_a_long_target_414() {
    let (backend, duet) = setup(Some("{ max_request_head: 16KiB, max_uri_length: 1KiB }"));
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    let (response, closed) =
        raw_exchange(duet.address, big_header.as_bytes(), Duration::from_secs(5));
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    assert!(closed);
    let long_target = format!(
        "GET /{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "p".repeat(2000)
    );
    let (response, _) = raw_exchange(duet.address, long_target.as_bytes(), Duration::from_secs(5));
    assert!(response.starts_with("HTTP/1.1 414"), "{response}");
    assert_eq!(backend.requests(), 0);
    let rejected = support::eventually(Duration::from_secs(5), || {
        duet.log_lines()
            .iter()
            .any(|l| l.contains("reason=head_too_large"))
    });
    assert!(rejected, "the 431 is logged: {:#?}", duet.log_lines());
}

#[test]
fn a_client_trickling_its_head_is_cut_off() {
    let (backend, duet) = setup(Some("{ header_read_timeout: 500ms }"));
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(duet.address).expect("connect");
    use std::io::{Read, Write};
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n");
    // Keep sending a byte now and then, never finishing the head.
    let mut buffer = [0u8; 256];
    let mut cut_off = false;
    for _ in 0..40 {
        // Wall-clock: the trickling client is what is tested; its pauses must pass in real time for
        // duet's real header timer to run over them.
        std::thread::sleep(Duration::from_millis(100));
        if stream.write_all(b"X").is_err() {
            cut_off = true;
            break;
        }
        stream.set_nonblocking(true).expect("nonblocking");
        let read = stream.read(&mut buffer);
        stream.set_nonblocking(false).expect("blocking");
        if read.is_ok() {
            cut_off = true;
            break;
        }
    }
    assert!(cut_off, "still connected after {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cut off after {:?}",
        started.elapsed()
    );
    assert_eq!(backend.requests(), 0);
    let logged = support::eventually(Duration::from_secs(5), || {
        duet.log_lines()
            .iter()
            .any(|l| l.contains("reason=header_timeout"))
    });
    assert!(logged, "{:#?}", duet.log_lines());
}

#[test]
fn malformed_requests_get_4xx_and_duet_keeps_serving() {
    let (backend, duet) = setup(None);
    let garbage: &[&[u8]] = &[
        b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
        b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    ];
    for request in garbage {
        let (response, closed) = raw_exchange(duet.address, request, Duration::from_secs(5));
        // Every one is answered, and answered 400: silence or a 5xx would pass for a broken parser.
        assert!(
            response.starts_with("HTTP/1.1 400 "),
            "{:?} got {response:?}",
            String::from_utf8_lossy(request)
        );
        assert!(closed, "{:?}", String::from_utf8_lossy(request));
    }
    let response = support::get_root(duet.address);
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "still serving: {response}"
    );
    // The chunked request with a bad chunk size may have reached the backend before its body failed;
    // nothing else did.
    assert!(backend.requests() <= 2, "{}", backend.requests());
}

/// Seeded random corruptions of a valid request: every one gets a response or a closed connection, none
/// takes duet down, and a valid request afterwards is served.
#[test]
fn randomly_corrupted_requests_never_take_duet_down() {
    let (_backend, duet) = setup(Some("{ header_read_timeout: 300ms }"));
    let valid = b"POST /upload?x=1 HTTP/1.1\r\nHost: example.test\r\nContent-Length: 5\r\nConnection: close\r\nX-A: b\r\n\r\nhello".to_vec();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..150 {
        let mut request = valid.clone();
        for _ in 0..(next() % 4 + 1) {
            let at = (next() % request.len() as u64) as usize;
            match next() % 3 {
                0 => request[at] = (next() % 256) as u8,
                1 => {
                    request.remove(at);
                }
                _ => request.insert(at, b"\r\n:\x00 -9aZ"[(next() % 9) as usize]),
            }
        }
        // A corrupted length can leave duet waiting for body bytes that never come: a second is plenty
        // to see any answer it would give.
        let (response, _) = raw_exchange(duet.address, &request, Duration::from_secs(1));
        assert!(
            response.is_empty() || response.starts_with("HTTP/1.1 "),
            "{:?} -> {response:?}",
            String::from_utf8_lossy(&request)
        );
        assert!(
            !response.starts_with("HTTP/1.1 5"),
            "a client's mistake is never a 5xx: {:?} -> {response}",
            String::from_utf8_lossy(&request)
        );
    }
    let response = support::get_root(duet.address);
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "still serving: {response}"
    );
}

#[test]
fn a_client_that_stalls_its_body_gets_408() {
    let (backend, duet) = setup(Some("{ body_read_timeout: 400ms }"));
    for (length, sent) in [(10usize, 3usize), (200_000, 70_000)] {
        // Small bodies are buffered for replay (nothing reaches the backend); large ones are streamed.
        let mut stream = std::net::TcpStream::connect(duet.address).expect("connect");
        use std::io::{Read, Write};
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let head = format!("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n");
        stream.write_all(head.as_bytes()).expect("head");
        stream
            .write_all(&vec![b'b'; sent])
            .expect("part of the body");
        let started = Instant::now();
        let mut response = vec![0u8; 4096];
        let n = stream.read(&mut response).expect("a response");
        let response = String::from_utf8_lossy(&response[..n]);
        assert!(response.starts_with("HTTP/1.1 408"), "{length}: {response}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(
        backend.requests() <= 1,
        "only the streamed one may have reached the backend"
    );
}
