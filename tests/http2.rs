//! HTTP/2 at the edge: clients speak h2 to duet (with prior knowledge on a plain listener, by ALPN on a
//! TLS one), each stream is a request through the same stages, and backends still get HTTP/1.1.

use crate::support::{self, Duet};
use bytes::Bytes;
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// An h2 connection over `io` (already past TLS, if any), its driver spawned.
async fn h2_client<IO>(io: IO) -> http2::SendRequest<Empty<Bytes>>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

/// GET `path` for `authority` on the h2 connection; the response with its whole body.
async fn get(
    sender: &mut http2::SendRequest<Empty<Bytes>>,
    scheme: &str,
    path: &str,
) -> (Response<()>, Bytes) {
    let request = Request::get(format!("{scheme}://localhost{path}"))
        .version(Version::HTTP_2)
        .body(Empty::new())
        .expect("request");
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        sender.clone().send_request(request),
    )
    .await
    .expect("in time")
    .expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (Response::from_parts(parts, ()), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_on_one_prior_knowledge_connection_reach_the_backend_as_http11_requests()
{
    // Slow enough that the streams overlap at the backend: each then needs a connection of its own.
    let backend = Backend::start(BackendOptions::named("plain").delay(Duration::from_millis(300)))
        .expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .workers(1)
        .to_yaml();
    let duet = Duet::start(&yaml);

    let tcp = tokio::net::TcpStream::connect(duet.address)
        .await
        .expect("connect");
    let mut sender = h2_client(tcp).await;
    let streams: Vec<_> = (0..5)
        .map(|i| {
            let mut sender = sender.clone();
            tokio::spawn(async move { get(&mut sender, "http", &format!("/stream/{i}")).await })
        })
        .collect();
    for stream in streams {
        let (response, body) = stream.await.expect("stream");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.version(), Version::HTTP_2);
        assert_eq!(response.headers()["x-backend"], "plain");
        // No connection fields on h2 (RFC 9113 §8.2.2): duet adds no Keep-Alive or Connection.
        assert!(
            !response.headers().contains_key("keep-alive"),
            "{response:?}"
        );
        assert!(
            !response.headers().contains_key("connection"),
            "{response:?}"
        );
        assert_eq!(body, "plain");
    }
    let mut seen = backend.recorded();
    seen.sort_by(|a, b| a.uri.cmp(&b.uri));
    let uris: Vec<_> = seen.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/stream/0",
            "/stream/1",
            "/stream/2",
            "/stream/3",
            "/stream/4"
        ]
    );
    for request in &seen {
        assert_eq!(request.version, Version::HTTP_11, "{}", request.uri);
        assert_eq!(
            request.headers["host"], "localhost",
            "the :authority is the Host"
        );
        assert_eq!(request.headers["x-forwarded-proto"], "http");
    }
    assert_eq!(
        backend.connections(),
        5,
        "the five streams were in flight at once"
    );

    // A later stream on the same connection, and an HTTP/1.1 client on the same listener.
    let (response, body) = get(&mut sender, "http", "/again").await;
    assert_eq!(
        (response.status(), &body[..]),
        (StatusCode::OK, &b"plain"[..])
    );
    let (response, _) = support::raw_exchange(
        duet.address,
        b"GET /h1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("plain"), "{response}");
    assert_eq!(backend.recorded().len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_host_is_routed_as_over_http11() {
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\n\
         routes: [ {{ match: {{ host: localhost }}, cluster: app }} ]\n\
         clusters: [ {{ name: app, backends: [ {{ address: {} }} ] }} ]\n",
        backend.address()
    );
    let duet = Duet::start(&yaml);
    let tcp = tokio::net::TcpStream::connect(duet.address)
        .await
        .expect("connect");
    let mut sender = h2_client(tcp).await;
    let (response, _) = get(&mut sender, "http", "/x").await;
    assert_eq!(response.status(), StatusCode::OK);
    let request = Request::get("http://elsewhere.test/x")
        .version(Version::HTTP_2)
        .body(Empty::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(backend.recorded().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_offering_h2_gets_http2() {
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .workers(1)
        .tls(&certificate.cert, &certificate.key)
        .to_yaml();
    let duet = Duet::start(&yaml);

    let mut config = certificate.client_config();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = support::tls_connect(duet.address, config)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut sender = h2_client(tls).await;
    for path in ["/one", "/two"] {
        let (response, body) = get(&mut sender, "https", path).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.version(), Version::HTTP_2);
        assert_eq!(body, "plain");
    }
    let seen = backend.recorded();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert_eq!(request.version, Version::HTTP_11);
        assert_eq!(request.headers["x-forwarded-proto"], "https");
        assert_eq!(request.headers["host"], "localhost");
    }
}

/// duet over one backend, and a prior-knowledge h2 connection to it.
async fn h2_to_one_backend() -> (Backend, Duet, http2::SendRequest<Empty<Bytes>>) {
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .workers(1)
        .to_yaml();
    let duet = Duet::start(&yaml);
    let tcp = tokio::net::TcpStream::connect(duet.address)
        .await
        .expect("connect");
    let sender = h2_client(tcp).await;
    (backend, duet, sender)
}

/// GET `path` on the h2 connection with `fields` (each appended, so a name may repeat): the status.
async fn get_with(
    sender: &mut http2::SendRequest<Empty<Bytes>>,
    path: &str,
    fields: &[(&'static str, &'static str)],
) -> StatusCode {
    let mut request = Request::get(format!("http://localhost{path}"))
        .version(Version::HTTP_2)
        .body(Empty::new())
        .expect("request");
    for (name, value) in fields {
        request
            .headers_mut()
            .append(*name, http::HeaderValue::from_static(value));
    }
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("in time")
        .expect("response");
    response.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_cookie_fields_reach_an_http11_backend_as_one_joined_by_semicolons() {
    let (backend, _duet, mut sender) = h2_to_one_backend().await;
    let cookies = [("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")];
    assert_eq!(get_with(&mut sender, "/c", &cookies).await, StatusCode::OK);
    let seen = backend.recorded().pop().expect("forwarded");
    let values: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    // RFC 9113 §8.2.3: joined with "; " before an HTTP/1.1 hop, whose Cookie is one field.
    assert_eq!(values, ["a=1; b=2; c=3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_field_value_with_leading_or_trailing_whitespace_is_400_and_never_forwarded() {
    let (backend, duet, mut sender) = h2_to_one_backend().await;
    for value in [" admin", "admin ", "\tadmin", "admin\t"] {
        let status = get_with(&mut sender, "/w", &[("x-role", value)]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{value:?}");
    }
    assert_eq!(backend.requests(), 0, "RFC 9113 §8.2.1: malformed");
    let logged = support::eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().any(|l| {
            l.contains("duet::access")
                && l.contains(" status=400 ")
                && l.contains(" outcome=invalid_header")
        })
    });
    assert!(logged, "{:#?}", duet.log_lines());
    // Whitespace inside a value is fine.
    let inside = [("x-role", "team admin")];
    assert_eq!(get_with(&mut sender, "/w", &inside).await, StatusCode::OK);
    assert_eq!(
        backend.recorded().pop().expect("forwarded").headers["x-role"],
        "team admin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_request_is_logged_with_the_authority_it_was_routed_by() {
    let (_backend, duet, mut sender) = h2_to_one_backend().await;
    assert_eq!(get_with(&mut sender, "/logged", &[]).await, StatusCode::OK);
    let logged = support::eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().any(|l| {
            l.contains("duet::access")
                && l.contains(" host=localhost path=/logged protocol=HTTP/2.0 ")
        })
    });
    assert!(logged, "{:#?}", duet.log_lines());
}

/// A request body of frames given in advance: data, then trailers.
struct FramesThenTrailers(std::collections::VecDeque<http_body::Frame<Bytes>>);

impl http_body::Body for FramesThenTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_request_trailers_cannot_undo_the_routes_header_edits() {
    let (backend, received) = crate::edge::recording_backend();
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n\
         \x20 - cluster: app\n    request_headers: {{ set: {{ x-user-role: guest }}, remove: [x-debug] }}\n\
         clusters: [ {{ name: app, backends: [ {{ address: {backend} }} ] }} ]\n"
    );
    let duet = Duet::start(&yaml);
    let tcp = tokio::net::TcpStream::connect(duet.address)
        .await
        .expect("connect");
    let (mut sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    let mut trailers = http::HeaderMap::new();
    for (name, value) in [
        ("x-user-role", "admin"),
        ("x-debug", "1"),
        ("x_team", "admin"),
        ("x-checksum", "abc"),
    ] {
        trailers.insert(name, http::HeaderValue::from_static(value));
    }
    let body = FramesThenTrailers(
        [
            http_body::Frame::data(Bytes::from_static(b"hello")),
            http_body::Frame::trailers(trailers),
        ]
        .into(),
    );
    let request = Request::post("http://localhost/upload")
        .version(Version::HTTP_2)
        .header("trailer", "x-user-role, x-debug, x_team, x-checksum")
        .body(body)
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let seen = tokio::task::spawn_blocking(move || received.recv_timeout(Duration::from_secs(5)))
        .await
        .expect("joined")
        .expect("the backend got the request")
        .to_ascii_lowercase();
    let (head, body) = seen.split_once("\r\n\r\n").expect("a head");
    assert!(head.contains("\r\nx-user-role: guest\r\n"), "{head}");
    let trailers = body.split_once("\r\n0\r\n").expect("the last chunk").1;
    assert_eq!(trailers, "x-checksum: abc\r\n\r\n", "{seen}");
}
