//! Bodies stream both ways: a 1 GiB download and a 1 GiB upload pass through duet while its resident
//! memory stays far below the body size; and a backend's answer to an upload it has not read (yet)
//! reaches the client.

use crate::support::Duet;
use bytes::Bytes;
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

const GIB: u64 = 1 << 30;
/// Far below the body size: a buffered body would need at least 1 GiB.
const RSS_LIMIT_KIB: u64 = 96 * 1024;

/// A body of `remaining` bytes made on the fly, 256 KiB at a time.
struct Generated {
    remaining: u64,
    chunk: Bytes,
}

impl http_body::Body for Generated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64);
        self.remaining -= n;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n as usize)))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_each_way_with_bounded_memory() {
    let backend = Backend::start(BackendOptions::named("bulk")).expect("backend");
    let duet = Duet::start_with(
        &DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml(),
        "warn,duet::cli=info",
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Generated>();

    let download = async {
        let request = http::Request::get(duet.url(&format!("/bytes/{GIB}")))
            .body(Generated {
                remaining: 0,
                chunk: Bytes::new(),
            })
            .expect("request");
        let response = client.request(request).await.expect("response");
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut received = 0u64;
        while let Some(frame) = body.frame().await {
            received += frame
                .expect("frame")
                .data_ref()
                .map_or(0, |d| d.len() as u64);
        }
        received
    };
    let received = tokio::time::timeout(Duration::from_secs(240), download)
        .await
        .expect("download in time");
    assert_eq!(received, GIB);

    let upload = async {
        let body = Generated {
            remaining: GIB,
            chunk: Bytes::from(vec![b'u'; 256 * 1024]),
        };
        let request = http::Request::post(duet.url("/upload"))
            .body(body)
            .expect("request");
        let response = client.request(request).await.expect("response");
        assert_eq!(response.status(), 200);
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
    };
    let counted = tokio::time::timeout(Duration::from_secs(240), upload)
        .await
        .expect("upload in time");
    assert_eq!(
        counted,
        GIB.to_string().as_bytes(),
        "the backend read every byte"
    );

    let peak = duet.peak_rss_kib();
    eprintln!("duet peak RSS after 1 GiB down and 1 GiB up: {peak} KiB");
    assert!(peak > 0, "could not read duet's memory");
    assert!(
        peak < RSS_LIMIT_KIB,
        "duet peaked at {peak} KiB for 1 GiB bodies"
    );
}

/// How many uploads meet the early answer: each is told apart from the last by its framing only.
const EARLY_ROUNDS: usize = 6;

/// A backend that answers each of `EARLY_ROUNDS` connections from the request head alone: it reads up
/// to the blank line, writes a complete `413` with `Connection: close` and closes, leaving the body
/// unread (so its kernel resets the connection when more of the body arrives).
fn early_answering_backend() -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(EARLY_ROUNDS) {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while duet_testbed::raw::head_end(&head).is_none() {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buffer[..n]),
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large",
            );
        }
    });
    address
}

/// A backend may answer an upload before reading it (RFC 9110 §15.5.14) and close: the client gets that
/// answer, not a `502`, whether duet was still writing the body when the backend's reset came (hyper's
/// client then failed the exchange) or not; and, its body only partly read, its connection is closed.
/// The client writes as fast as duet takes the body, so most rounds meet the reset mid-write; each round
/// expects the same outcome, so the test does not depend on which.
#[test]
fn a_backend_answering_an_upload_early_is_relayed_and_the_client_connection_closes() {
    use std::io::Write;
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 512;
    let duet =
        Duet::start(&DuetConfig::single("p2c_inflight", &[early_answering_backend()]).to_yaml());
    for round in 0..EARLY_ROUNDS {
        let chunked = round % 2 == 1;
        let mut client = std::net::TcpStream::connect(duet.address).expect("connect");
        let framing = if chunked {
            "Transfer-Encoding: chunked".to_owned()
        } else {
            format!("Content-Length: {}", CHUNK * CHUNKS)
        };
        let head = format!("POST /upload HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n");
        client.write_all(head.as_bytes()).expect("write the head");
        // At most 32 MiB, each write bounded: the writer stops when duet closes the connection.
        let mut writer = client.try_clone().expect("clone");
        writer
            .set_write_timeout(Some(Duration::from_secs(10)))
            .expect("write timeout");
        let uploading = std::thread::spawn(move || {
            let data = [b'a'; CHUNK];
            for _ in 0..CHUNKS {
                let written = if chunked {
                    writer
                        .write_all(format!("{CHUNK:x}\r\n").as_bytes())
                        .and_then(|()| writer.write_all(&data))
                        .and_then(|()| writer.write_all(b"\r\n"))
                } else {
                    writer.write_all(&data)
                };
                if written.is_err() {
                    return;
                }
            }
        });
        let (received, closed) =
            duet_testbed::raw::read_until_closed(&mut client, Duration::from_secs(10));
        let received = String::from_utf8_lossy(&received);
        assert!(
            received.starts_with("HTTP/1.1 413 ") && received.ends_with("\r\n\r\ntoo large"),
            "round {round} (chunked: {chunked}): {received}"
        );
        assert_eq!(received.matches("HTTP/1.1 ").count(), 1, "{received}");
        assert!(closed, "round {round}: the client connection must close");
        uploading.join().expect("the upload thread");
    }
}
