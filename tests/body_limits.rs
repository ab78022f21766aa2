//! `max_request_body` through the real binary, HTTP/1.1 and HTTP/2: a declared length over the limit
//! is refused before a byte is read; a streamed body is cut where it passes the limit, the backend's
//! request reset (never ended as if whole), and the client answered 413.

use crate::support::{raw_exchange, Duet};
use bytes::Bytes;
use duet_testbed::{Backend, BackendOptions};
use http::{Request, Version};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    convert::Infallible,
    io::Read,
    net::{SocketAddr, TcpListener},
    sync::{Arc, Mutex},
    time::Duration,
};

/// What each connection sent, and whether the proxy closed it.
type Connections = Arc<Mutex<Vec<(Vec<u8>, bool)>>>;

/// A backend that reads what each connection sends until it is closed, and never answers.
struct Sink {
    address: SocketAddr,
    seen: Connections,
}

impl Sink {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let record = record.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let at = {
                        let mut seen = record.lock().expect("seen");
                        seen.push((Vec::new(), false));
                        seen.len() - 1
                    };
                    let mut buffer = [0u8; 4096];
                    let closed = loop {
                        match stream.read(&mut buffer) {
                            Ok(0) => break true,
                            Ok(n) => record.lock().expect("seen")[at].0.extend(&buffer[..n]),
                            // A reset is a close too; a timeout is not.
                            Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
                        }
                    };
                    record.lock().expect("seen")[at].1 = closed;
                });
            }
        });
        Self { address, seen }
    }

    fn seen(&self) -> Vec<(Vec<u8>, bool)> {
        self.seen.lock().expect("seen").clone()
    }

    /// Every connection's bytes, once each was closed (waits up to 5 s).
    fn closed(&self) -> Vec<Vec<u8>> {
        let all_closed = || {
            let seen = self.seen();
            !seen.is_empty() && seen.iter().all(|(_, closed)| *closed)
        };
        assert!(
            crate::support::eventually(Duration::from_secs(5), all_closed),
            "the backend's connection stays open: {:?}",
            self.seen()
        );
        self.seen().into_iter().map(|(bytes, _)| bytes).collect()
    }
}

/// Routes: `/` limited to 1,000 bytes by `limits`, `/free` lifting it, both to `backend`.
fn config(backend: SocketAddr) -> String {
    format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
limits: {{ max_request_body: 1000 }}
routes:
  - {{ name: free, match: {{ path_prefix: /free }}, cluster: web, max_request_body: 0 }}
  - {{ name: capped, cluster: web }}
clusters:
  - {{ name: web, backends: [ {{ address: {backend} }} ] }}
"
    )
}

/// `count` chunks of `size` bytes each, then the last chunk.
fn chunked(count: usize, size: usize) -> String {
    let chunk = format!("{size:x}\r\n{}\r\n", "a".repeat(size));
    format!("{}0\r\n\r\n", chunk.repeat(count))
}

/// What a backend got is a request whose chunked body never ended.
fn assert_cut(got: &[u8]) {
    let text = String::from_utf8_lossy(got);
    assert!(text.starts_with("POST / HTTP/1.1\r\n"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    assert!(!text.ends_with("0\r\n\r\n"), "never the last chunk: {text}");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    assert!(
        body.matches('a').count() <= 1000,
        "at most the limit passed"
    );
}

#[test]
fn an_http1_body_declared_over_the_limit_gets_413_before_a_byte_is_read() {
    let sink = Sink::start();
    let duet = Duet::start(&config(sink.address));
    let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\nExpect: 100-continue\r\n\r\n";
    let (response, _) = raw_exchange(duet.address, head.as_bytes(), Duration::from_secs(5));
    assert!(response.starts_with("HTTP/1.1 413 "), "{response}");
    assert!(!response.contains("100 Continue"), "{response}");
    assert!(sink.seen().is_empty(), "no backend asked");
}

#[test]
fn an_http1_chunked_body_past_the_limit_is_cut_the_backend_reset_and_the_client_told_413() {
    let sink = Sink::start();
    let duet = Duet::start(&config(sink.address));
    let request = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        chunked(5, 400)
    );
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    assert!(response.starts_with("HTTP/1.1 413 "), "{response}");
    let seen = sink.closed();
    assert_eq!(seen.len(), 1);
    assert_cut(&seen[0]);
}

#[test]
fn a_chunked_body_within_the_limit_or_on_a_route_that_lifts_it_goes_through_whole() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let duet = Duet::start(&config(backend.address()));
    for (path, chunks) in [("/", chunked(2, 500)), ("/free", chunked(10, 500))] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunks}"
        );
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 200 "), "{path}: {response}");
    }
    assert_eq!(backend.requests(), 2);
}

type Body = BoxBody<Bytes, Infallible>;

/// POST `/` over h2 with prior knowledge: the response status.
async fn h2_post(duet: &Duet, length: Option<usize>, body: Body) -> u16 {
    let io = tokio::net::TcpStream::connect(duet.address)
        .await
        .expect("connect");
    let (mut sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    let mut request = Request::post("http://localhost/").version(Version::HTTP_2);
    if let Some(length) = length {
        request = request.header("content-length", length);
    }
    let request = request.body(body).expect("request");
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("in time")
        .expect("response");
    response.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_declared_length_and_a_streamed_body_past_the_limit_both_get_413() {
    let sink = Sink::start();
    let duet = Duet::start(&config(sink.address));
    let declared = Full::new(Bytes::from(vec![b'a'; 1001])).boxed();
    assert_eq!(h2_post(&duet, Some(1001), declared).await, 413);
    assert!(sink.seen().is_empty(), "no backend asked");
    // DATA frames without a length, 50 ms apart (the backend has the head and the first ones before
    // the third passes the limit): counted as they pass, cut past the limit.
    let frames = futures_util::stream::unfold(0, |sent| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let frame = Frame::data(Bytes::from(vec![b'a'; 400]));
        (sent < 5).then_some((Ok::<_, Infallible>(frame), sent + 1))
    });
    let streamed = StreamBody::new(frames).boxed();
    assert_eq!(h2_post(&duet, None, streamed).await, 413);
    let seen = tokio::task::spawn_blocking(move || sink.closed())
        .await
        .expect("sink");
    assert_eq!(seen.len(), 1);
    assert_cut(&seen[0]);
}
