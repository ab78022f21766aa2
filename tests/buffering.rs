//! A slow upload holds no backend: a route's `buffer_request` reads the whole body before a backend is
//! picked, and `limits.min_upload_rate` answers 408 to a client that falls behind. The clients' pauses
//! are real time (duet's real timers run against them); every loop and every read is bounded.

use crate::admin::{get, sum};
use crate::support::{eventually, Duet};
use duet_testbed::{
    raw::{read_response, read_until_closed, RawResponse},
    Backend, BackendOptions, Misbehaviour, RawBackend,
};
use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// `/upload/buffered` buffers up to 1 MiB, `/upload/capped` up to 1 KiB, anything else streams. The
/// testbed backend answers `/upload/...` with the number of body bytes it read.
fn config(backends: &[SocketAddr], limits: &str) -> String {
    let backends: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address: {b} }}"))
        .collect();
    let backends = backends.join(", ");
    format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
admin: {{ address: 127.0.0.1:0 }}
routes:
  - {{ match: {{ path_prefix: /upload/buffered }}, cluster: app, buffer_request: 1MiB }}
  - {{ match: {{ path_prefix: /upload/capped }}, cluster: app, buffer_request: 1KiB }}
  - {{ cluster: app }}
clusters:
  - {{ name: app, policy: round_robin, backends: [ {backends} ] }}
limits: {limits}
"
    )
}

fn in_flight(admin: SocketAddr) -> f64 {
    sum(&get(admin, "/metrics"), "duet_backend_in_flight", "")
}

fn connect(duet: &Duet) -> TcpStream {
    let stream = TcpStream::connect(duet.address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    stream
}

fn chunked_head(path: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
}

/// Writes `head`, then `chunk` every `pause` and never the end, until duet answers (at most
/// `max_chunks` chunks): the answer, and how long after the head it came.
fn trickle_until_answered(
    duet: &Duet,
    head: &str,
    chunk: &[u8],
    pause: Duration,
    max_chunks: usize,
) -> (RawResponse, Duration) {
    let mut stream = connect(duet);
    stream.write_all(head.as_bytes()).expect("head");
    let started = Instant::now();
    let answered = Arc::new(AtomicBool::new(false));
    let reader = {
        let mut stream = stream.try_clone().expect("clone");
        let answered = answered.clone();
        std::thread::spawn(move || {
            let response = read_response(&mut stream, &mut Vec::new());
            answered.store(true, Ordering::Release);
            response.map(|r| (r, started.elapsed()))
        })
    };
    for _ in 0..max_chunks {
        if answered.load(Ordering::Acquire) || stream.write_all(chunk).is_err() {
            break;
        }
        std::thread::sleep(pause);
    }
    reader.join().expect("reader").expect("an answer from duet")
}

fn logged(duet: &Duet, outcome: &str) -> bool {
    eventually(Duration::from_secs(2), || {
        duet.log_lines().iter().any(|l| l.contains(outcome))
    })
}

#[test]
fn a_trickled_upload_reaches_the_backend_only_once_it_is_complete() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&config(&[backend.address()], "{ body_read_timeout: 5s }"));
    let admin = duet.admin_address();

    let mut stream = connect(&duet);
    stream
        .write_all(chunked_head("/upload/buffered").as_bytes())
        .expect("head");
    for chunk in 0..4 {
        stream.write_all(b"5\r\nhello\r\n").expect("chunk");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            backend.requests(),
            0,
            "no request reaches the backend while the client sends (after chunk {chunk})"
        );
    }
    assert_eq!(in_flight(admin), 0.0, "no load on any backend meanwhile");
    stream
        .write_all(b"0\r\nx-checksum: 1\r\n\r\n")
        .expect("end");
    let response = read_response(&mut stream, &mut Vec::new()).expect("response");
    assert_eq!(response.status(), 200, "{}", response.head);
    assert_eq!(response.body, b"20", "the whole body arrived");
    assert_eq!(backend.requests(), 1);
    let recorded = backend.recorded();
    let headers = &recorded[0].headers;
    assert_eq!(
        headers.get("content-length").map(|v| v.as_bytes()),
        Some(&b"20"[..]),
        "sent whole, with its length: {headers:?}"
    );
    assert!(
        headers.get("transfer-encoding").is_none(),
        "not chunked: {headers:?}"
    );

    // The same trickle on a route without `buffer_request` is streamed: the backend holds the request
    // (one unit of load) while the client is still sending.
    let mut stream = connect(&duet);
    stream
        .write_all(chunked_head("/upload/streamed").as_bytes())
        .expect("head");
    stream.write_all(b"5\r\nhello\r\n").expect("chunk");
    assert!(
        eventually(Duration::from_secs(2), || backend.requests() == 2),
        "a streamed request reaches the backend at once"
    );
    assert_eq!(in_flight(admin), 1.0, "and counts as its load");
    stream.write_all(b"0\r\n\r\n").expect("end");
    let response = read_response(&mut stream, &mut Vec::new()).expect("response");
    assert_eq!((response.status(), response.body), (200, b"5".to_vec()));
}

#[test]
fn a_body_over_the_buffer_gets_413_and_reaches_no_backend() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&config(&[backend.address()], "{ body_read_timeout: 5s }"));

    // Announced too large: refused before a byte of it is asked for (no `100 Continue`).
    let mut stream = connect(&duet);
    stream
        .write_all(b"POST /upload/capped HTTP/1.1\r\nHost: a\r\nContent-Length: 1025\r\nExpect: 100-continue\r\n\r\n")
        .expect("head");
    let response = read_response(&mut stream, &mut Vec::new()).expect("response");
    assert_eq!(response.status(), 413, "{}", response.head);
    assert_eq!(
        response.body,
        b"request body larger than this route accepts\n"
    );

    // Chunked: refused once it passes the limit, without waiting for the rest.
    let mut stream = connect(&duet);
    stream
        .write_all(chunked_head("/upload/capped").as_bytes())
        .expect("head");
    let chunk = format!("200\r\n{}\r\n", "x".repeat(0x200));
    for _ in 0..3 {
        stream.write_all(chunk.as_bytes()).expect("chunk");
    }
    let response = read_response(&mut stream, &mut Vec::new()).expect("response");
    assert_eq!(response.status(), 413, "{}", response.head);
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(2));
    assert!(
        closed,
        "the rest of the body is never read: the connection closes"
    );

    // Exactly the limit passes.
    let mut stream = connect(&duet);
    let body = "x".repeat(1024);
    let request =
        format!("POST /upload/capped HTTP/1.1\r\nHost: a\r\nContent-Length: 1024\r\n\r\n{body}");
    stream.write_all(request.as_bytes()).expect("request");
    let response = read_response(&mut stream, &mut Vec::new()).expect("response");
    assert_eq!((response.status(), response.body), (200, b"1024".to_vec()));
    assert_eq!(backend.requests(), 1, "only the body within the limit");
    assert!(logged(&duet, "outcome=request_body_too_large"));
}

#[test]
fn a_client_writing_its_whole_body_before_reading_gets_the_early_answer() {
    // Many clients write the whole request before they read (Python's http.client, Java's
    // HttpURLConnection). Had duet closed with their body still arriving, its socket would have reset
    // the connection: their next write fails, and the answer already waiting for them is never read.
    // duet reads and drops the rest of the body after answering (a lingering close, as nginx's).
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&config(&[backend.address()], "{ body_read_timeout: 5s }"));
    const SIZE: usize = 16 << 20;
    let body = vec![b'x'; SIZE];
    let cases = [
        // Refused by its announced length, before a byte of it is read.
        ("/upload/capped", format!("Content-Length: {SIZE}"), 413),
        // Refused at the limit, the rest of its one chunk unread.
        (
            "/upload/capped",
            "Transfer-Encoding: chunked".to_owned(),
            413,
        ),
        // Answered by the backend before it read the body; the stream toward it stops.
        ("/other", format!("Content-Length: {SIZE}"), 200),
    ];
    for (path, framing, status) in cases {
        let mut stream = connect(&duet);
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .expect("write timeout");
        let chunked = framing.starts_with("Transfer-Encoding");
        let head = format!("POST {path} HTTP/1.1\r\nHost: a\r\n{framing}\r\n\r\n");
        stream.write_all(head.as_bytes()).expect("head");
        if chunked {
            stream
                .write_all(format!("{SIZE:x}\r\n").as_bytes())
                .expect("size");
        }
        stream
            .write_all(&body)
            .unwrap_or_else(|e| panic!("{path}, {framing}: the whole body is taken in: {e}"));
        if chunked {
            stream.write_all(b"\r\n0\r\n\r\n").expect("last chunk");
        }
        let response = read_response(&mut stream, &mut Vec::new()).expect("response");
        assert_eq!(
            response.status(),
            status,
            "{path}, {framing}: {}",
            response.head
        );
        if status == 413 {
            assert!(
                response
                    .head
                    .to_ascii_lowercase()
                    .contains("connection: close"),
                "the client is told the connection ends: {}",
                response.head
            );
        }
        let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(5));
        assert!(closed, "{path}, {framing}: then the connection closes");
    }
}

#[test]
fn a_client_below_the_upload_floor_gets_408_before_any_backend_sees_it() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let limits = "{ body_read_timeout: 5s, min_upload_rate: 1KiB/s, upload_rate_grace: 200ms }";
    let duet = Duet::start(&config(&[backend.address()], limits));

    // 10 bytes every 50 ms (200 B/s) earns 10 ms per 50 ms waited: behind the floor ~250 ms in.
    let chunk = b"a\r\n0123456789\r\n";
    let pause = Duration::from_millis(50);
    let head = chunked_head("/upload/buffered");
    let (response, after) = trickle_until_answered(&duet, &head, chunk, pause, 40);
    assert_eq!(response.status(), 408, "{}", response.head);
    assert_eq!(response.body, b"request body sent too slowly\n");
    assert!(
        after >= Duration::from_millis(200) && after < Duration::from_millis(1500),
        "past the grace, well before the client would have finished: {after:?}"
    );
    assert_eq!(backend.requests(), 0, "the backend saw nothing");
    assert!(logged(&duet, "outcome=client_upload_too_slow"));

    // Streamed, the same client is cut as well; the backend had the head, and is not blamed.
    let head = chunked_head("/upload/streamed");
    let (response, _) = trickle_until_answered(&duet, &head, chunk, pause, 40);
    assert_eq!(response.status(), 408, "{}", response.head);
    assert_eq!(backend.requests(), 1);
    let metrics = get(duet.admin_address(), "/metrics");
    assert_eq!(sum(&metrics, "duet_backend_failures_total", ""), 0.0);

    // A client above the floor is served: 1 KiB every 50 ms is 20 KiB/s.
    let mut stream = connect(&duet);
    stream
        .write_all(chunked_head("/upload/buffered").as_bytes())
        .expect("head");
    let chunk = format!("400\r\n{}\r\n", "y".repeat(1024));
    for _ in 0..6 {
        stream.write_all(chunk.as_bytes()).expect("chunk");
        std::thread::sleep(pause);
    }
    stream.write_all(b"0\r\n\r\n").expect("end");
    let response = read_response(&mut stream, &mut Vec::new()).expect("response");
    assert_eq!((response.status(), response.body), (200, b"6144".to_vec()));
}

#[test]
fn a_buffered_body_past_the_replay_limit_is_retried_elsewhere() {
    // Reads the whole request, then closes without answering: a 502 for a body that cannot be resent.
    let closing = RawBackend::start(Misbehaviour::CloseAfterRequest).expect("backend");
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&config(&[closing.address(), backend.address()], "{}"));
    // 100 KiB, past the 64 KiB `replay_body_limit`: streamed, it could not be sent twice.
    let body = "z".repeat(100 * 1024);
    let request = format!(
        "PUT /upload/buffered HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let mut stream = connect(&duet);
    let mut pending = Vec::new();
    for _ in 0..2 {
        stream.write_all(request.as_bytes()).expect("request");
        let response = read_response(&mut stream, &mut pending).expect("response");
        assert_eq!(response.status(), 200, "{}", response.head);
        assert_eq!(response.body, b"102400");
    }
    assert_eq!(
        closing.requests(),
        1,
        "round robin sent one first attempt to the closing backend"
    );
    assert_eq!(backend.requests(), 2, "which was retried on the other");
}

#[test]
fn past_the_workers_buffering_budget_a_request_gets_503_rather_than_duet_growing() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&config(
        &[backend.address()],
        "{ max_buffered_bytes: 1MiB }",
    ));
    let admin = duet.admin_address();
    let metric = |name: &str| sum(&get(admin, "/metrics"), name, "");
    let head = |length: usize| {
        format!("POST /upload/buffered HTTP/1.1\r\nHost: a\r\nContent-Length: {length}\r\n\r\n")
    };
    // The first announces 600,000 bytes and sends a part: they are held for it.
    let mut first = connect(&duet);
    first
        .write_all(head(600_000).as_bytes())
        .expect("first head");
    first.write_all(&[b'x'; 1000]).expect("a part");
    assert!(
        eventually(Duration::from_secs(5), || metric(
            "duet_buffered_request_bytes"
        ) == 600_000.0),
        "the first body's bytes are held"
    );
    // A second would take the worker past 1 MiB: 503 at once, counted.
    let mut second = connect(&duet);
    second
        .write_all(head(600_000).as_bytes())
        .expect("second head");
    let response = read_response(&mut second, &mut Vec::new()).expect("an answer");
    assert!(
        response.head.starts_with("HTTP/1.1 503"),
        "{}",
        response.head
    );
    assert_eq!(metric("duet_buffer_budget_refusals_total"), 1.0);
    // A body of unknown length holds what it has read, not all it may: a small one fits beside.
    let mut small = connect(&duet);
    small
        .write_all(chunked_head("/upload/buffered").as_bytes())
        .expect("chunked head");
    small
        .write_all(b"3e8\r\n")
        .and_then(|()| small.write_all(&[b'y'; 1000]))
        .and_then(|()| small.write_all(b"\r\n0\r\n\r\n"))
        .expect("a 1,000-byte chunked body");
    let response = read_response(&mut small, &mut Vec::new()).expect("an answer");
    assert!(
        response.head.starts_with("HTTP/1.1 200"),
        "{}",
        response.head
    );
    assert_eq!(response.body, b"1000");
    // The first completes, and gives its bytes back.
    first.write_all(&[b'x'; 599_000]).expect("the rest");
    let response = read_response(&mut first, &mut Vec::new()).expect("an answer");
    assert!(
        response.head.starts_with("HTTP/1.1 200"),
        "{}",
        response.head
    );
    assert!(
        eventually(Duration::from_secs(5), || metric(
            "duet_buffered_request_bytes"
        ) == 0.0),
        "given back"
    );
}
