//! gRPC through duet: h2 clients, `protocol: h2` backends, each call balanced on its own.
//!
//! The clients and servers are hyper's HTTP/2 with gRPC's framing written by hand (a 5-byte prefix per
//! message, `grpc-status` in trailers) rather than tonic: the same bytes on the wire, without a protobuf
//! toolchain in the build.

use crate::support::Duet;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use duet_testbed::config::{Cluster, DuetConfig};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::{body::Incoming, client::conn::http2, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::net::TcpListener;

/// A body of frames given in advance (data, then trailers).
pub(crate) struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// One gRPC message: uncompressed flag, length, bytes.
fn message(bytes: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + bytes.len());
    framed.put_u8(0);
    framed.put_u32(bytes.len() as u32);
    framed.put_slice(bytes);
    framed.freeze()
}

/// The messages of a gRPC body.
fn messages(mut body: Bytes) -> Vec<Bytes> {
    let mut found = Vec::new();
    while body.len() >= 5 {
        let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        body.advance(5);
        found.push(body.split_to(length.min(body.len())));
    }
    found
}

fn trailers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(*name, HeaderValue::from_str(value).expect("value"));
    }
    map
}

/// What a gRPC backend saw of one call.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) path: String,
    pub(crate) version: Version,
    pub(crate) te: Option<String>,
    pub(crate) messages: Vec<Bytes>,
}

/// A gRPC server over h2c: `/test.Echo/Unary` answers `NAME:` + the request's message;
/// `/test.Echo/Stream` answers three messages; `/test.Echo/Fail` ends with `grpc-status: 9`. Every
/// answer ends with `grpc-status` and `x-served-by` trailers, after `delay`.
struct GrpcBackend {
    address: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
    connections: Arc<AtomicUsize>,
    _server: tokio::task::JoinHandle<()>,
}

impl GrpcBackend {
    async fn start(name: &'static str, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let server = tokio::spawn(serve(
            listener,
            name,
            delay,
            calls.clone(),
            connections.clone(),
        ));
        Self {
            address,
            calls,
            connections,
            _server: server,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls").clone()
    }
}

async fn serve(
    listener: TcpListener,
    name: &'static str,
    delay: Duration,
    calls: Arc<Mutex<Vec<Call>>>,
    connections: Arc<AtomicUsize>,
) {
    while let Ok((tcp, _)) = listener.accept().await {
        connections.fetch_add(1, Relaxed);
        let calls = calls.clone();
        // A call with `x-goaway` makes the backend close this connection gracefully (GOAWAY, then
        // the streams in flight finish), as a server restarting does.
        let goaway = Arc::new(tokio::sync::Notify::new());
        let trigger = goaway.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let calls = calls.clone();
            if request.headers().contains_key("x-goaway") {
                trigger.notify_one();
            }
            async move { Ok::<_, Infallible>(answer(name, delay, request, &calls).await) }
        });
        tokio::spawn(async move {
            let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                () = goaway.notified() => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
    }
}

pub(crate) async fn answer(
    name: &str,
    delay: Duration,
    request: Request<Incoming>,
    calls: &Mutex<Vec<Call>>,
) -> Response<Frames> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let received = messages(body);
    calls.lock().expect("calls").push(Call {
        path: parts.uri.path().to_owned(),
        version: parts.version,
        te: parts
            .headers
            .get("te")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        messages: received.clone(),
    });
    let extra = parts
        .headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    tokio::time::sleep(delay + extra).await;
    let mut frames = VecDeque::new();
    let status = match parts.uri.path() {
        "/test.Echo/Unary" => {
            let first = received.first().cloned().unwrap_or_default();
            let reply = [name.as_bytes(), b":", &first].concat();
            frames.push_back(Frame::data(message(&reply)));
            "0"
        }
        "/test.Echo/Stream" => {
            for i in 0..3 {
                frames.push_back(Frame::data(message(format!("{name}-{i}").as_bytes())));
            }
            "0"
        }
        _ => "9",
    };
    frames.push_back(Frame::trailers(trailers(&[
        ("grpc-status", status),
        ("x-served-by", name),
    ])));
    Response::builder()
        .header("content-type", "application/grpc")
        .body(Frames(frames))
        .expect("response")
}

/// An h2c connection to duet (one TCP connection for every call made on it).
pub(crate) async fn client(address: SocketAddr) -> http2::SendRequest<Frames> {
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

/// A finished call: head, messages, trailers.
pub(crate) struct Answer {
    pub(crate) head: Response<()>,
    pub(crate) messages: Vec<Bytes>,
    pub(crate) trailers: HeaderMap,
}

pub(crate) async fn call(
    sender: &http2::SendRequest<Frames>,
    path: &str,
    extra: &[(&'static str, &str)],
) -> Answer {
    let mut request = Request::post(format!("http://grpc.test{path}"))
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let body = Frames(VecDeque::from([Frame::data(message(b"hello"))]));
    let request = request.body(body).expect("request");
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        sender.clone().send_request(request),
    )
    .await
    .expect("in time")
    .expect("response");
    let (head, body) = response.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("body in time")
        .expect("body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    Answer {
        head: Response::from_parts(head, ()),
        messages: messages(collected.to_bytes()),
        trailers,
    }
}

fn h2_cluster(backends: &[&GrpcBackend]) -> Cluster {
    backends.iter().fold(
        Cluster::new("app")
            .policy("p2c_peak_ewma")
            .set("protocol", "h2"),
        |cluster, backend| cluster.backend(backend.address),
    )
}

pub(crate) fn grpc_status(answer: &Answer) -> Option<&str> {
    answer
        .trailers
        .get("grpc-status")
        .or_else(|| answer.head.headers().get("grpc-status"))
        .and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_and_server_streaming_calls_pass_through_with_their_trailers_over_h2_both_sides() {
    let backend = GrpcBackend::start("one", Duration::ZERO).await;
    let yaml = DuetConfig::new()
        .route(None, "/", "app")
        .cluster(h2_cluster(&[&backend]))
        .to_yaml();
    let duet = Duet::start_with_args(&yaml, &["--log-format", "json"]);
    let sender = client(duet.address).await;

    let unary = call(&sender, "/test.Echo/Unary", &[]).await;
    assert_eq!(unary.head.status(), StatusCode::OK);
    assert_eq!(unary.head.headers()["content-type"], "application/grpc");
    assert_eq!(unary.messages, [Bytes::from_static(b"one:hello")]);
    assert_eq!(grpc_status(&unary), Some("0"));
    assert_eq!(unary.trailers["x-served-by"], "one");

    let stream = call(&sender, "/test.Echo/Stream", &[]).await;
    assert_eq!(
        stream.messages,
        [
            Bytes::from_static(b"one-0"),
            Bytes::from_static(b"one-1"),
            Bytes::from_static(b"one-2")
        ]
    );
    assert_eq!(grpc_status(&stream), Some("0"));

    let failed = call(&sender, "/test.Echo/Fail", &[]).await;
    assert_eq!(failed.head.status(), StatusCode::OK);
    assert_eq!(grpc_status(&failed), Some("9"), "the backend's own status");

    let calls = backend.calls();
    let paths: Vec<_> = calls.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/test.Echo/Unary", "/test.Echo/Stream", "/test.Echo/Fail"]
    );
    for call in &calls {
        assert_eq!(call.version, Version::HTTP_2, "{}", call.path);
        assert_eq!(call.te.as_deref(), Some("trailers"), "{}", call.path);
        assert_eq!(call.messages, [Bytes::from_static(b"hello")]);
    }
    assert_eq!(
        backend.connections.load(Relaxed),
        1,
        "the calls shared one connection to the backend"
    );
    // The status each call ended with, read from the trailers as they passed.
    assert!(wait_for(|| access_entries(&duet).len() == 3).await);
    let codes: Vec<_> = access_entries(&duet)
        .iter()
        .map(|e| e["grpc_status"].clone())
        .collect();
    assert_eq!(
        codes,
        [
            serde_json::json!(0),
            serde_json::json!(0),
            serde_json::json!(9)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_goaway_lets_its_stream_finish_and_the_next_call_opens_a_new_connection() {
    let backend = GrpcBackend::start("restarting", Duration::ZERO).await;
    let yaml = DuetConfig::new()
        .admin()
        .route(None, "/", "app")
        .cluster(h2_cluster(&[&backend]))
        .to_yaml();
    let duet = Duet::start(&yaml);
    let sender = client(duet.address).await;

    // The backend sends GOAWAY as soon as it has this call, and answers it 300 ms later.
    let pending = {
        let sender = sender.clone();
        tokio::spawn(async move {
            let headers = [("x-goaway", "1"), ("x-delay-ms", "300")];
            call(&sender, "/test.Echo/Unary", &headers).await
        })
    };
    assert!(
        wait_for(|| backend.calls().len() == 1).await,
        "the first call reached the backend"
    );
    // The GOAWAY is on its way to duet; whether duet has it before the next call or meets it on
    // the wire, a call sent with a body duet can replay lands on a new connection.
    for _ in 0..3 {
        let next = call(&sender, "/test.Echo/Unary", &[("content-length", "10")]).await;
        assert_eq!(grpc_status(&next), Some("0"));
        assert_eq!(next.messages, [Bytes::from_static(b"restarting:hello")]);
    }
    let first = pending.await.expect("first call");
    assert_eq!(
        grpc_status(&first),
        Some("0"),
        "the stream in flight finished"
    );
    assert_eq!(first.messages, [Bytes::from_static(b"restarting:hello")]);
    assert_eq!(backend.calls().len(), 4);
    assert_eq!(backend.connections.load(Relaxed), 2);

    let admin = duet.admin_address();
    let metrics = tokio::task::spawn_blocking(move || crate::admin::get(admin, "/metrics"))
        .await
        .expect("metrics");
    assert_eq!(
        crate::admin::sum(&metrics, "duet_backend_failures_total", ""),
        0.0,
        "a GOAWAY is no failure"
    );
    assert_eq!(
        crate::admin::sum(&metrics, "duet_backend_ejections_total", ""),
        0.0
    );
}

/// Polls `done` every 10 ms, for at most 10 s.
async fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_from_one_client_connection_are_balanced_each_on_its_own_away_from_a_slow_backend() {
    // Delays long enough that a busy machine's own hiccups stay small beside them: PeakEWMA takes a
    // latency peak at once, so a 30 ms stall of a 5 ms backend would make it look slow for seconds.
    let fast_a = GrpcBackend::start("fast-a", Duration::from_millis(50)).await;
    let fast_b = GrpcBackend::start("fast-b", Duration::from_millis(50)).await;
    let slow = GrpcBackend::start("slow", Duration::from_millis(500)).await;
    let yaml = DuetConfig::new()
        .route(None, "/", "app")
        .cluster(h2_cluster(&[&fast_a, &slow, &fast_b]))
        .to_yaml();
    let duet = Duet::start(&yaml);
    // One client connection (an L4 balancer would pin it, and every call, to one backend), four
    // calls at a time, 60 each.
    let sender = client(duet.address).await;
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let sender = sender.clone();
            tokio::spawn(async move {
                let mut served_by = Vec::new();
                for _ in 0..60 {
                    let answer = call(&sender, "/test.Echo/Unary", &[]).await;
                    assert_eq!(grpc_status(&answer), Some("0"));
                    served_by.push(answer.trailers["x-served-by"].clone());
                }
                served_by
            })
        })
        .collect();
    let mut served_by = Vec::new();
    for caller in callers {
        served_by.extend(caller.await.expect("caller"));
    }
    assert_eq!(served_by.len(), 240);
    let share = |name: &str| served_by.iter().filter(|b| *b == name).count();
    let (a, b, slow_calls) = (share("fast-a"), share("fast-b"), share("slow"));
    assert_eq!(a + b + slow_calls, 240);
    assert_eq!(
        slow.calls().len(),
        slow_calls,
        "each call reached the backend named"
    );
    eprintln!("calls per backend: fast-a {a}, fast-b {b}, slow {slow_calls}");
    assert!(
        slow_calls < 12,
        "the slow backend's share stays under 5%: {slow_calls} of 240"
    );
    assert!(a > 0 && b > 0, "both fast backends served: {a} and {b}");
}

/// The JSON access-log entries written so far.
fn access_entries(duet: &Duet) -> Vec<serde_json::Value> {
    duet.log_lines()
        .iter()
        .filter(|l| l.contains("\"target\":\"duet::access\""))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_no_backend_answers_gets_a_grpc_status_unavailable_or_deadline_exceeded() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = refused.local_addr().expect("address");
    drop(refused);
    let slow = GrpcBackend::start("slow", Duration::from_secs(3)).await;
    let down = Cluster::new("down").set("protocol", "h2").backend(gone);
    let yaml = DuetConfig::new()
        .admin()
        .route(None, "/test.Slow/", "slow")
        .route(None, "/", "down")
        .cluster(down)
        .cluster(
            Cluster::new("slow")
                .set("protocol", "h2")
                .backend(slow.address),
        )
        .to_yaml();
    let duet = Duet::start_with_args(&yaml, &["--log-format", "json"]);
    let sender = client(duet.address).await;

    let unavailable = call(&sender, "/test.Echo/Unary", &[]).await;
    assert_eq!(unavailable.head.status(), StatusCode::OK, "not a 502");
    assert_eq!(grpc_status(&unavailable), Some("14"));
    assert_eq!(
        unavailable.head.headers()["grpc-message"],
        "backend unreachable"
    );
    assert_eq!(
        unavailable.head.headers()["content-type"],
        "application/grpc"
    );
    assert!(unavailable.messages.is_empty());

    // The client's deadline (200 ms) is shorter than the route's (none) and the backend's pace.
    let late = call(&sender, "/test.Slow/Unary", &[("grpc-timeout", "200m")]).await;
    assert_eq!(late.head.status(), StatusCode::OK);
    assert_eq!(grpc_status(&late), Some("4"));
    assert_eq!(
        late.head.headers()["grpc-message"],
        "no answer within the route's timeout"
    );

    // Not gRPC: the same failure is the usual 502.
    let plain = Request::get("http://grpc.test/plain")
        .version(Version::HTTP_2)
        .body(Frames(VecDeque::new()))
        .expect("request");
    let response = sender.clone().send_request(plain).await.expect("response");
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);

    assert!(wait_for(|| access_entries(&duet).len() == 3).await);
    let entries = access_entries(&duet);
    let codes: Vec<_> = entries.iter().map(|e| e["grpc_status"].clone()).collect();
    assert_eq!(
        codes,
        [
            serde_json::json!(14),
            serde_json::json!(4),
            serde_json::Value::Null
        ]
    );
    for entry in &entries {
        assert_eq!(entry["protocol"], "HTTP/2.0", "{entry}");
    }
    assert_eq!(entries[0]["status"], 200);
    assert_eq!(entries[0]["outcome"], "connect_failed");
    assert_eq!(entries[1]["outcome"], "route_timeout");

    let admin = duet.admin_address();
    let metrics = tokio::task::spawn_blocking(move || crate::admin::get(admin, "/metrics"))
        .await
        .expect("metrics");
    let sum = |labels: &str| crate::admin::sum(&metrics, "duet_grpc_responses_total", labels);
    assert_eq!(sum("cluster=\"down\",code=\"UNAVAILABLE\""), 1.0);
    assert_eq!(sum("cluster=\"slow\",code=\"DEADLINE_EXCEEDED\""), 1.0);
    assert_eq!(sum(""), 2.0);
    assert_eq!(
        crate::admin::sum(&metrics, "duet_requests_total", "protocol=\"HTTP/2\""),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http11_client_asking_for_trailers_gets_the_h2_backends_grpc_status_chunked() {
    let backend = GrpcBackend::start("one", Duration::ZERO).await;
    let yaml = DuetConfig::new()
        .route(None, "/", "app")
        .cluster(h2_cluster(&[&backend]))
        .to_yaml();
    let duet = Duet::start(&yaml);
    let mut request = b"POST /test.Echo/Unary HTTP/1.1\r\nHost: grpc.test\r\nTE: trailers\r\n\
        Content-Type: application/grpc\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
        .to_vec();
    request.extend_from_slice(&message(b"hello"));
    let address = duet.address;
    let (response, _) = tokio::task::spawn_blocking(move || {
        crate::support::raw_exchange(address, &request, Duration::from_secs(10))
    })
    .await
    .expect("exchange");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("transfer-encoding: chunked"),
        "{response}"
    );
    assert!(response.contains("one:hello"), "{response}");
    assert!(
        response.ends_with("0\r\ngrpc-status: 0\r\n\r\n"),
        "the gRPC trailers after the last chunk (only announced ones pass): {response:?}"
    );
    let calls = backend.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].version, Version::HTTP_2);
    assert_eq!(calls[0].messages, [Bytes::from_static(b"hello")]);
}

/// Each backend's `health` on the status page, in the order configured.
fn health_states(duet: &Duet) -> Vec<String> {
    let (response, _) = crate::support::raw_exchange(
        duet.admin_address(),
        b"GET /status?format=json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let status: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    status["clusters"][0]["backends"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|b| b["health"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_of_an_h2_cluster_speak_h2_so_an_h2c_only_backend_passes() {
    let live = GrpcBackend::start("live", Duration::ZERO).await;
    let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let gone_address = gone.local_addr().expect("address");
    drop(gone);
    let cluster = h2_cluster(&[&live]).backend(gone_address).set(
        "health_check",
        "{ path: /healthz, interval: 100ms, timeout: 2s, healthy_threshold: 1, unhealthy_threshold: 1 }",
    );
    let yaml = DuetConfig::new()
        .admin()
        .route(None, "/", "app")
        .cluster(cluster)
        .to_yaml();
    let duet = Duet::start(&yaml);
    let states = || health_states(&duet);
    let settled = wait_for(|| states() == ["passing", "failing"]).await;
    assert!(settled, "{:?} {:#?}", states(), duet.log_lines());
    // The checks reached the backend as h2 requests (an HTTP/1.1 one would never be served).
    let checks: Vec<_> = live
        .calls()
        .into_iter()
        .filter(|c| c.path == "/healthz")
        .collect();
    assert!(!checks.is_empty());
    assert!(checks.iter().all(|c| c.version == Version::HTTP_2));
    let sender = client(duet.address).await;
    for _ in 0..4 {
        let answer = call(&sender, "/test.Echo/Unary", &[]).await;
        assert_eq!(grpc_status(&answer), Some("0"));
        assert_eq!(answer.trailers["x-served-by"], "live");
    }
}
