//! Request mirroring through the real binary: the mirror cluster gets exact copies of the share of
//! requests it should, and a mirror that never answers changes nothing for clients and is capped.

use crate::admin::{get, sum};
use crate::support::{eventually, raw_exchange, Duet};
use bytes::Bytes;
use duet_testbed::{Backend, BackendOptions};
use http_body_util::BodyExt;
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::Duration,
};

/// A request as the mirror backend received it, body included.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    headers: http::HeaderMap,
    body: Bytes,
}

/// A backend on its own thread that records each request in full and answers it only once released
/// (at once when started released). Stops when dropped.
struct MirrorBackend {
    address: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    answered: Arc<AtomicU64>,
    hold: tokio::sync::watch::Sender<bool>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl MirrorBackend {
    fn start(held: bool) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answered = Arc::new(AtomicU64::new(0));
        let (hold, held_rx) = tokio::sync::watch::channel(held);
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let (seen_in, answered_in) = (seen.clone(), answered.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let stream = tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => stream,
                            Err(_) => continue,
                        },
                        _ = stop_rx.changed() => return,
                    };
                    let (seen, answered) = (seen_in.clone(), answered_in.clone());
                    let held = held_rx.clone();
                    tokio::spawn(serve(stream, seen, answered, held));
                }
            });
        });
        Self {
            address,
            seen,
            answered,
            hold,
            stop,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    fn release(&self) {
        let _ = self.hold.send(false);
    }
}

impl Drop for MirrorBackend {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.release();
    }
}

async fn serve(
    stream: tokio::net::TcpStream,
    seen: Arc<Mutex<Vec<Seen>>>,
    answered: Arc<AtomicU64>,
    held: tokio::sync::watch::Receiver<bool>,
) {
    let service =
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let (seen, answered, mut held) = (seen.clone(), answered.clone(), held.clone());
            async move {
                let (parts, body) = request.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                seen.lock().expect("seen").push(Seen {
                    method: parts.method.to_string(),
                    uri: parts.uri.to_string(),
                    headers: parts.headers,
                    body,
                });
                let _ = held.wait_for(|held| !*held).await;
                answered.fetch_add(1, Relaxed);
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    Bytes::from_static(b"mirror"),
                )))
            }
        });
    let io = hyper_util::rt::TokioIo::new(stream);
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await;
}

fn config(app: SocketAddr, mirror: SocketAddr, extra: &str, routes: &str) -> String {
    format!(
        "workers: 1
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: 127.0.0.1:0 }} ]
{extra}routes:
{routes}clusters:
  - {{ name: app, backends: [ {{ address: {app} }} ] }}
  - {{ name: shadow, backends: [ {{ address: {mirror} }} ] }}
"
    )
}

/// One request on its own connection; the response's status and body.
fn exchange(duet: &Duet, request: &str) -> (String, String) {
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    let status = response.get(9..12).unwrap_or_default().to_owned();
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

fn mirrors(admin: SocketAddr, route: &str, outcome: &str) -> f64 {
    let labels = format!("cluster=\"shadow\",route=\"{route}\",outcome=\"{outcome}\"");
    sum(&get(admin, "/metrics"), "duet_mirrors_total", &labels)
}

/// The mirror gets the request as the primary backend got it (method, target, every header, the
/// body), for exactly its share of requests; a streamed body is not copied, and is counted.
#[test]
fn the_mirror_gets_exact_copies_of_its_share_of_requests() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let mirror = MirrorBackend::start(false);
    let routes = "  - { name: sampled, match: { path_prefix: /sampled }, cluster: app, mirror: { cluster: shadow, percent: 25 } }
  - { name: all, cluster: app, mirror: { cluster: shadow } }
";
    let duet = Duet::start(&config(app.address(), mirror.address, "", routes));
    let admin = duet.admin_address();
    let close = "Host: shop.test\r\nConnection: close";
    let requests = [
        format!("GET /a/b?x=1 HTTP/1.1\r\n{close}\r\nX-Test: one\r\n\r\n"),
        format!("POST /form HTTP/1.1\r\n{close}\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"),
        format!("POST /chunked HTTP/1.1\r\n{close}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nworld\r\n0\r\n\r\n"),
    ];
    for request in &requests {
        assert_eq!(
            exchange(&duet, request),
            ("200".to_owned(), "app".to_owned())
        );
    }
    for i in 1..=8 {
        let request = format!("GET /sampled/{i} HTTP/1.1\r\n{close}\r\n\r\n");
        assert_eq!(exchange(&duet, &request).0, "200");
    }
    assert!(
        eventually(Duration::from_secs(5), || mirrors(admin, "all", "sent")
            + mirrors(admin, "sampled", "sent")
            == 4.0),
        "{:#?}",
        mirror.seen()
    );
    let seen = mirror.seen();
    let mut uris: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    uris.sort_unstable();
    assert_eq!(uris, ["/a/b?x=1", "/form", "/sampled/4", "/sampled/8"]);
    let primary = app.recorded();
    assert_eq!(primary.len(), 11, "every request reached the primary");
    let copy_of = |uri: &str| {
        seen.iter()
            .find(|s| s.uri == uri)
            .expect("mirrored")
            .clone()
    };
    let original = |uri: &str| {
        primary
            .iter()
            .find(|r| r.uri == uri)
            .expect("primary")
            .clone()
    };
    let get = copy_of("/a/b?x=1");
    assert_eq!((get.method.as_str(), &get.body[..]), ("GET", &b""[..]));
    assert_eq!(
        get.headers,
        original("/a/b?x=1").headers,
        "every header as the primary got it"
    );
    assert_eq!(get.headers["x-test"], "one");
    assert_eq!(get.headers["host"], "shop.test");
    let post = copy_of("/form");
    assert_eq!(
        (post.method.as_str(), &post.body[..]),
        ("POST", &b"hello"[..])
    );
    assert_eq!(post.headers, original("/form").headers);
    assert_eq!(post.headers["content-length"], "5");
    let counts =
        |route| ["sent", "failed", "skipped_cap", "skipped_body"].map(|o| mirrors(admin, route, o));
    assert_eq!(
        counts("all"),
        [2.0, 0.0, 0.0, 1.0],
        "the chunked body was not copied"
    );
    assert_eq!(counts("sampled"), [2.0, 0.0, 0.0, 0.0], "25% of 8");
    // The copies' answers reach no client: not counted as passed to clients.
    let passed = |cluster: &str| {
        let labels = format!("cluster=\"{cluster}\"");
        sum(
            &crate::admin::get(admin, "/metrics"),
            "duet_response_body_bytes_total",
            &labels,
        )
    };
    assert_eq!(passed("shadow"), 0.0);
    assert_eq!(passed("app"), 11.0 * 3.0, "11 answers of `app`");
}

/// A mirror that never answers: every client still gets its response (while the copies hang), at
/// most `max_mirrors_in_flight` copies are out (their load counted in the mirror cluster's balancer),
/// the rest are skipped and counted; once the mirror answers, mirroring resumes.
#[test]
fn a_hanging_mirror_changes_nothing_for_clients_and_is_capped() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let mirror = MirrorBackend::start(true);
    let routes = "  - { name: all, cluster: app, mirror: { cluster: shadow } }\n";
    let extra = "limits: { max_mirrors_in_flight: 2 }\n";
    let duet = Duet::start(&config(app.address(), mirror.address, extra, routes));
    let admin = duet.admin_address();
    let request = |i: u32| format!("GET /{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    for i in 1..=4 {
        assert_eq!(
            exchange(&duet, &request(i)),
            ("200".to_owned(), "app".to_owned())
        );
        let expected = i.min(2) as usize;
        assert!(
            eventually(Duration::from_secs(5), || mirror.seen().len() == expected),
            "request {i}: {:#?}",
            mirror.seen()
        );
    }
    assert_eq!(
        mirror.answered.load(Relaxed),
        0,
        "every client was answered while the mirror still held its copies"
    );
    assert_eq!(mirrors(admin, "all", "skipped_cap"), 2.0);
    assert_eq!(mirrors(admin, "all", "sent"), 0.0);
    let in_flight = |admin| {
        sum(
            &get(admin, "/metrics"),
            "duet_backend_in_flight",
            "cluster=\"shadow\"",
        )
    };
    assert_eq!(
        in_flight(admin),
        2.0,
        "the copies are the mirror cluster's load"
    );
    mirror.release();
    assert!(eventually(Duration::from_secs(5), || mirrors(
        admin, "all", "sent"
    ) == 2.0));
    assert!(eventually(Duration::from_secs(5), || in_flight(admin) == 0.0));
    assert_eq!(exchange(&duet, &request(5)).0, "200");
    assert!(eventually(Duration::from_secs(5), || mirrors(
        admin, "all", "sent"
    ) == 3.0));
    let uris: Vec<String> = mirror.seen().into_iter().map(|s| s.uri).collect();
    assert_eq!(uris, ["/1", "/2", "/5"]);
    assert_eq!(app.requests(), 5);
}
