//! A worker's pipeline driven in-process: the real `serve_connection` on a loopback listener, real
//! backends from duet-testbed, a real hyper client. What only the binary does (CLI, signals, several
//! workers) is tested in the repository's `tests/`.

use crate::{view::ResolvedNames, Accepted, Connections, HealthView, WorkerProxy};
use bytes::Bytes;
use duet_testbed::{
    config::{Cluster, DuetConfig},
    Backend, BackendOptions,
};
use http_body_util::{BodyExt, Empty};
use std::{net::SocketAddr, rc::Rc, sync::Arc};
use tokio::{net::TcpListener, sync::watch};

/// One worker's proxy serving a loopback listener on the current `LocalSet`, through the worker's
/// accept loop (`Connections::run`).
pub(crate) struct Harness {
    pub(crate) proxy: Rc<WorkerProxy>,
    connections: Connections,
    pub(crate) address: SocketAddr,
    shutdown: watch::Sender<bool>,
}

impl Harness {
    pub(crate) async fn start(yaml: &str) -> Self {
        Self::start_with(yaml, None, true).await
    }

    /// Like `start`, publishing the worker's metric cells in `registry` (as worker 0). Without
    /// `resuming`, connections are served but parked ones are not taken back (as in a worker whose
    /// drain has begun), so a test can hand them back itself.
    pub(crate) async fn start_with(
        yaml: &str,
        registry: Option<crate::Registry>,
        resuming: bool,
    ) -> Self {
        let config = Arc::new(duet_config::parse(yaml, "test.yaml").expect("valid config"));
        let proxy = Rc::new(match registry {
            Some(registry) => {
                WorkerProxy::with_registry(config.clone(), &ResolvedNames::new(), 0, registry)
            }
            None => WorkerProxy::new(config.clone(), &ResolvedNames::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (shutdown, watch) = watch::channel(false);
        let connections = Connections::new(proxy.clone(), watch);
        let (accepted_tx, accepted) = tokio::sync::mpsc::channel(64);
        tokio::task::spawn_local(feed(listener, accepted_tx));
        let serving = connections.clone();
        tokio::task::spawn_local(async move {
            if resuming {
                serving.run(accepted).await;
            } else {
                serve_without_resuming(&serving, accepted).await;
            }
        });
        Self {
            proxy,
            connections,
            address,
            shutdown,
        }
    }

    /// GET `path` on a new connection: the status, the `x-backend` header, and the body or `None` if
    /// it was cut short.
    pub(crate) async fn get(&self, path: &str) -> (u16, String, Option<Bytes>) {
        let stream = tokio::net::TcpStream::connect(self.address)
            .await
            .expect("connect");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::task::spawn_local(connection);
        let request = http::Request::get(path)
            .header(http::header::HOST, "test")
            .body(Empty::<Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("response");
        let status = response.status().as_u16();
        let backend = response
            .headers()
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response
            .into_body()
            .collect()
            .await
            .ok()
            .map(|b| b.to_bytes());
        (status, backend, body)
    }

    /// Connections waiting in the worker's parking lot now.
    fn parked(&self) -> usize {
        (self.connections.shared().parking_lot()).map_or(0, crate::conn::parking::ParkingLot::len)
    }

    fn eligible(&self, backend: SocketAddr) -> bool {
        self.proxy
            .with_balance("app", |b| {
                b.endpoint_load(&backend).map(|l| l.is_eligible())
            })
            .flatten()
            .expect("backend in cluster")
    }
}

/// Hands each connection `listener` accepts to the worker's loop, as a worker's listener does.
async fn feed(listener: TcpListener, accepted: tokio::sync::mpsc::Sender<Accepted>) {
    while let Ok((stream, peer)) = listener.accept().await {
        if accepted
            .send(Accepted::plain(stream, peer, 0))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Serves accepted connections, leaving parked ones in the lot.
async fn serve_without_resuming(
    connections: &Connections,
    mut accepted: tokio::sync::mpsc::Receiver<Accepted>,
) {
    while let Some(Accepted { stream, client, .. }) = accepted.recv().await {
        tokio::task::spawn_local(connections.serve(stream, client, crate::Place::default()));
    }
}

/// Waits (up to 30 s, on the test's clock: a loaded 2-core machine can take seconds to park a connection) until `condition` holds; fails saying `what` never happened.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let limit = std::time::Duration::from_secs(30);
    let held =
        duet_testbed::wait::eventually_async(limit, || std::future::ready(condition())).await;
    assert!(held, "{what}: not within {limit:?}");
}

/// One cluster `app` over `backends`, with `settings` (field, YAML value).
fn cluster(backends: &[SocketAddr], policy: &str, settings: &[(&str, &str)]) -> String {
    DuetConfig::single(policy, backends)
        .with_cluster("app", |cluster| {
            settings
                .iter()
                .fold(cluster, |cluster, (field, value)| cluster.set(field, value))
        })
        .to_yaml()
}

async fn local<F: std::future::Future>(test: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(test).await
}

#[tokio::test]
async fn a_backend_that_dies_mid_body_is_counted_as_a_failure_and_ejected() {
    local(async {
        let a = Backend::start(BackendOptions::named("a")).expect("backend");
        let b = Backend::start(BackendOptions::named("b")).expect("backend");
        let extra = [
            (
                "outlier_detection",
                "{ consecutive_failures: 2, base_ejection_time: 60s }",
            ),
            ("retries", "{ attempts: 1 }"),
        ];
        let registry = crate::Registry::new();
        let yaml = cluster(&[a.address(), b.address()], "round_robin", &extra);
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        // Complete responses are successes: nothing is ejected.
        for _ in 0..6 {
            let (status, _, body) = harness.get("/").await;
            assert_eq!((status, body.is_some()), (200, true));
        }
        assert!(harness.eligible(a.address()) && harness.eligible(b.address()));

        // `/die` sends a 200 head, 64 KiB of a promised megabyte, then fails: only the body tells.
        // Round robin gives each backend two of these in a row.
        for _ in 0..4 {
            let (status, _, body) = harness.get("/die").await;
            assert_eq!(status, 200, "the head was already on its way");
            assert!(body.is_none(), "the client sees the body cut short");
        }
        let ejected: Vec<SocketAddr> = [a.address(), b.address()]
            .into_iter()
            .filter(|&backend| !harness.eligible(backend))
            .collect();
        assert_eq!(
            ejected.len(),
            1,
            "two mid-body failures in a row eject a backend (one of two: the cap always allows one)"
        );
        let survivor = if ejected[0] == a.address() { "b" } else { "a" };
        for _ in 0..6 {
            assert_eq!(harness.get("/").await.1, survivor);
        }
        // The metrics name the backend and say what happened to it.
        let text = registry.render_prometheus();
        let of = |name: &str, extra: &str| {
            sample(
                &text,
                &format!(
                    "{name}{{worker=\"0\",cluster=\"app\",backend=\"{}\"{extra}}}",
                    ejected[0]
                ),
            )
        };
        assert_eq!(of("duet_backend_ejections_total", ""), Some(1.0), "{text}");
        assert_eq!(
            of(
                "duet_backend_eligibility_changes_total",
                ",to=\"ineligible\""
            ),
            Some(1.0)
        );
        assert_eq!(
            of("duet_backend_eligibility_changes_total", ",to=\"eligible\""),
            Some(0.0)
        );
        assert_eq!(
            of("duet_backend_failures_total", ",kind=\"body_reset\""),
            Some(2.0)
        );
    })
    .await;
}

#[tokio::test]
async fn an_ejection_survives_a_reload_and_still_ends() {
    local(async {
        let a = Backend::start(BackendOptions::named("a")).expect("backend");
        let b = Backend::start(BackendOptions::named("b")).expect("backend");
        let settings = [
            (
                "outlier_detection",
                "{ consecutive_failures: 1, base_ejection_time: 300ms }",
            ),
            ("retries", "{ attempts: 1 }"),
        ];
        let yaml = cluster(&[a.address(), b.address()], "round_robin", &settings);
        let harness = Harness::start(&yaml).await;
        assert!(harness.get("/die").await.2.is_none());
        let ejected = if harness.eligible(a.address()) {
            b.address()
        } else {
            a.address()
        };
        assert!(!harness.eligible(ejected), "one mid-body failure ejects");

        let config = Arc::new(duet_config::parse(&yaml, "test.yaml").expect("valid"));
        harness.proxy.reload(config, &ResolvedNames::new());
        assert!(!harness.eligible(ejected), "the ejection carried over");
        until("the ejection ends on time in the new table", || {
            harness.eligible(ejected)
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_refused_attempt_is_retried_on_another_backend_and_counted_as_its_load() {
    local(async {
        let good = Backend::start(BackendOptions::named("good")).expect("backend");
        let refused = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            socket.local_addr().expect("address")
        };
        let extra = [
            ("outlier_detection", "{ consecutive_failures: 0 }"),
            ("retries", "{ attempts: 2, min_retries_per_second: 1000 }"),
        ];
        let registry = crate::Registry::new();
        let yaml = cluster(&[refused, good.address()], "p2c_inflight", &extra);
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        for _ in 0..20 {
            let (status, backend, _) = harness.get("/").await;
            assert_eq!((status, backend.as_str()), (200, "good"));
        }
        let (refused_picks, good_picks, in_flight) = harness
            .proxy
            .with_balance("app", |balance| {
                let load = |b: &SocketAddr| balance.endpoint_load(b).expect("member").clone();
                (
                    load(&refused).picks(),
                    load(&good.address()).picks(),
                    load(&refused).in_flight() + load(&good.address()).in_flight(),
                )
            })
            .expect("cluster");
        assert!(
            refused_picks > 0,
            "P2C picked the refusing backend sometimes"
        );
        assert_eq!(
            good_picks, 20,
            "every request reached the good backend, retries included: each attempt is a pick"
        );
        assert_eq!(good.requests(), 20);
        assert_eq!(in_flight, 0, "every attempt released its load");
        // Attempts per request: the retried ones took two, one per pick of the refusing backend.
        let text = registry.render_prometheus();
        let bucket = |le: &str| {
            sample(
                &text,
                &format!("duet_request_attempts_bucket{{cluster=\"app\",le=\"{le}\"}}"),
            )
        };
        assert_eq!(bucket("1"), Some((20 - refused_picks) as f64), "{text}");
        assert_eq!(bucket("2"), Some(20.0));
        assert_eq!(
            sample(&text, "duet_request_attempts_sum{cluster=\"app\"}"),
            Some((20 + refused_picks) as f64)
        );
    })
    .await;
}

#[tokio::test]
async fn health_and_ejection_decide_one_flag() {
    local(async {
        let a = Backend::start(BackendOptions::named("a")).expect("backend");
        let b = Backend::start(BackendOptions::named("b")).expect("backend");
        let extra = [
            ("panic_threshold", "0%"),
            ("health_check", "{ interval: 1h }"),
        ];
        let yaml = cluster(&[a.address(), b.address()], "p2c_inflight", &extra);
        let harness = Harness::start(&yaml).await;
        let config = duet_config::parse(&yaml, "test.yaml").expect("valid");
        // Checked backends start out of rotation until the control plane says they pass.
        assert!(!harness.eligible(a.address()) && !harness.eligible(b.address()));
        assert_eq!(harness.get("/").await.0, 503);

        let mut view =
            HealthView::for_config(&config, &ResolvedNames::new(), &HealthView::default());
        view.set("app", a.address(), true);
        harness.proxy.apply_health(Arc::new(view.clone()));
        assert!(harness.eligible(a.address()) && !harness.eligible(b.address()));
        for _ in 0..5 {
            assert_eq!(harness.get("/").await.1, "a");
        }
        view.set("app", b.address(), true);
        harness.proxy.apply_health(Arc::new(view));
        assert!(harness.eligible(b.address()));
    })
    .await;
}

#[tokio::test]
async fn resolved_names_change_membership_without_dropping_pooled_connections() {
    local(async {
        let a = Backend::start(BackendOptions::named("a")).expect("backend");
        let b = Backend::start(BackendOptions::named("b")).expect("backend");
        let yaml = DuetConfig::new()
            .route(None, "/", "app")
            .cluster(
                Cluster::new("app")
                    .policy("round_robin")
                    .named("app.test:80"),
            )
            .to_yaml();
        let harness = Harness::start(&yaml).await;
        assert_eq!(
            harness.get("/").await.0,
            503,
            "a name not resolved yet has no endpoints"
        );

        let mut names = ResolvedNames::new();
        names.insert("app.test", 80, vec![a.address()]);
        harness.proxy.apply_names(&names);
        for _ in 0..3 {
            assert_eq!(harness.get("/").await.1, "a");
        }
        names.insert("app.test", 80, vec![a.address(), b.address()]);
        harness.proxy.apply_names(&names);
        let mut served = Vec::new();
        for _ in 0..4 {
            served.push(harness.get("/").await.1);
        }
        assert!(served.iter().any(|s| s == "b"), "b joined: {served:?}");
        assert_eq!(
            a.connections(),
            1,
            "a's pooled connection survived the change"
        );
    })
    .await;
}

#[tokio::test]
async fn reload_keeps_state_by_address_and_replaces_the_rest() {
    let (x, y, z) = ("127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103");
    let address = |a: &str| a.parse::<SocketAddr>().expect("address");
    let config = |backends: &[&str], policy: &str| {
        let backends: Vec<SocketAddr> = backends.iter().map(|b| address(b)).collect();
        Arc::new(duet_config::parse(&cluster(&backends, policy, &[]), "t.yaml").expect("valid"))
    };
    let names = ResolvedNames::new();
    let proxy = WorkerProxy::new(config(&[x, y], "p2c_peak_ewma"), &names);
    let kept_before = proxy
        .with_balance("app", |b| b.endpoint_load(&address(x)).cloned())
        .flatten()
        .expect("x");

    proxy.reload(config(&[x, z], "p2c_peak_ewma"), &names);
    let (kept_after, removed, added, len) = proxy
        .with_balance("app", |b| {
            (
                b.endpoint_load(&address(x)).cloned(),
                b.endpoint_load(&address(y)).is_some(),
                b.endpoint_load(&address(z)).is_some(),
                b.len(),
            )
        })
        .expect("cluster");
    assert!(
        Arc::ptr_eq(&kept_before, &kept_after.expect("x kept")),
        "same load state object for x"
    );
    assert!(!removed, "y is gone");
    assert!(added, "z is new");
    assert_eq!(len, 2);

    // A policy change starts the cluster's balancer afresh (its metric differs).
    proxy.reload(config(&[x, z], "p2c_inflight"), &names);
    let fresh = proxy
        .with_balance("app", |b| b.endpoint_load(&address(x)).cloned())
        .flatten()
        .expect("x");
    assert!(!Arc::ptr_eq(&kept_before, &fresh));
}

#[tokio::test]
async fn a_cluster_name_is_escaped_in_the_prometheus_text() {
    local(async {
        // A quote, a backslash and a line feed: unescaped, the line feed alone would end the sample
        // mid-label and the next line would not parse.
        let yaml = r#"
listeners: [ { address: 127.0.0.1:0 } ]
routes: [ { cluster: "we\"ird\\name\nx" } ]
clusters:
  - name: "we\"ird\\name\nx"
    backends: [ { address: 127.0.0.1:9 } ]
"#;
        let config = Arc::new(duet_config::parse(yaml, "test.yaml").expect("valid config"));
        let registry = crate::Registry::new();
        let _proxy = WorkerProxy::with_registry(config, &ResolvedNames::new(), 0, registry.clone());
        let text = registry.render_prometheus();
        assert!(
            text.contains(r#"duet_retries_total{worker="0",cluster="we\"ird\\name\nx"} 0"#),
            "{text}"
        );
        for line in text.lines() {
            assert!(
                line.starts_with("# ") || line.starts_with("duet_") || line.starts_with("process_"),
                "not a sample or a comment: {line:?}"
            );
        }
    })
    .await;
}

/// One backend, and connections that park 0.1 s after their last request (half the header timeout)
/// and stay parked for a minute.
fn parking_soon(backend: SocketAddr) -> String {
    DuetConfig::single("p2c_inflight", &[backend])
        .section(
            "limits",
            "{ header_read_timeout: 200ms, keepalive_timeout: 60s }",
        )
        .to_yaml()
}

/// Writes one GET on `stream` and reads its whole response (`content-length` framed); the status.
async fn exchange(stream: &mut tokio::net::TcpStream) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .expect("request");
    let mut response = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .expect("a response in time")
            .expect("read");
        assert!(n > 0, "closed before the response ended");
        response.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&response).to_ascii_lowercase();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length: usize = text[..end]
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if response.len() >= end + 4 + length {
            return text[9..12].parse().expect("a status");
        }
    }
}

#[tokio::test]
async fn an_idle_connection_leaves_its_task_for_the_parking_lot_and_comes_back_on_its_next_request()
{
    use tokio::io::AsyncReadExt;
    local(async {
        let backend = Backend::start(BackendOptions::named("a")).expect("backend");
        let harness = Harness::start(&parking_soon(backend.address())).await;
        let parked = || harness.parked();
        let counters = harness.proxy.counters_handle();
        let gauge =
            |cell: &std::sync::atomic::AtomicU64| cell.load(std::sync::atomic::Ordering::Relaxed);

        let mut first = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        let mut second = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        assert_eq!(exchange(&mut first).await, 200);
        assert_eq!(exchange(&mut second).await, 200);
        // Idle for twice `header_read_timeout / 2`: both parked, still open, and counted as such.
        until("both connections park", || parked() == 2).await;
        assert_eq!((gauge(&counters.parked), gauge(&counters.active)), (2, 2));

        // The next request on the same TCP connection takes it out of the lot and is served.
        assert_eq!(exchange(&mut first).await, 200);
        assert_eq!(parked(), 1);
        assert_eq!((gauge(&counters.parked), gauge(&counters.active)), (1, 2));
        until("parked again once idle", || parked() == 2).await;

        // A client that leaves a parked connection frees its slot.
        drop(second);
        until("the closed one leaves the lot", || parked() == 1).await;
        assert_eq!((gauge(&counters.parked), gauge(&counters.active)), (1, 1));

        // At the drain, the parked connections close (and nothing parks any more).
        let handed_back = harness.connections.close_parked();
        assert!(handed_back.is_empty(), "no request was waiting");
        assert_eq!(parked(), 0);
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(2), first.read(&mut byte))
            .await
            .expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "the idle one is closed");
        assert_eq!((gauge(&counters.parked), gauge(&counters.active)), (0, 0));
    })
    .await;
}

#[tokio::test]
async fn at_the_cap_the_longest_idle_parked_connections_are_closed_first() {
    use tokio::io::AsyncReadExt;
    local(async {
        let backend = Backend::start(BackendOptions::named("a")).expect("backend");
        let harness = Harness::start(&parking_soon(backend.address())).await;
        let parked = || harness.parked();
        let counters = harness.proxy.counters_handle();
        let gauge =
            |cell: &std::sync::atomic::AtomicU64| cell.load(std::sync::atomic::Ordering::Relaxed);
        let mut streams = Vec::new();
        for n in 1..=3 {
            let mut stream = tokio::net::TcpStream::connect(harness.address)
                .await
                .expect("connect");
            assert_eq!(exchange(&mut stream).await, 200);
            until("parked in turn", || parked() == n).await;
            streams.push(stream);
        }
        // The first comes back for a request and parks again: now the most recently idle, its first
        // deadline left behind, stale.
        assert_eq!(exchange(&mut streams[0]).await, 200);
        until("parked again", || parked() == 3).await;

        assert_eq!(harness.connections.close_oldest_idle(2), 2);
        assert_eq!(parked(), 1);
        assert_eq!(
            (
                gauge(&counters.reclaimed),
                gauge(&counters.parked),
                gauge(&counters.active)
            ),
            (2, 1, 1)
        );
        for closed in &mut streams[1..] {
            let mut byte = [0u8; 1];
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(2), closed.read(&mut byte))
                    .await
                    .expect("closed in time");
            assert!(
                matches!(read, Ok(0) | Err(_)),
                "the two longest idle are closed"
            );
        }
        assert_eq!(
            exchange(&mut streams[0]).await,
            200,
            "the latest idle one is kept"
        );
        until("parked again", || parked() == 1).await;
        assert_eq!(
            harness.connections.close_oldest_idle(5),
            1,
            "only what is parked"
        );
        assert_eq!(gauge(&counters.reclaimed), 3);
    })
    .await;
}

#[tokio::test]
async fn at_the_cap_a_parked_connection_whose_request_has_arrived_is_not_reclaimed() {
    use tokio::io::AsyncWriteExt;
    local(async {
        let backend = Backend::start(BackendOptions::named("a")).expect("backend");
        // Parked connections are not taken back by the loop: the test looks at the lot itself.
        let harness = Harness::start_with(&parking_soon(backend.address()), None, false).await;
        let lot = || harness.parked();
        let mut asking = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        assert_eq!(exchange(&mut asking).await, 200);
        until("the first parks", || lot() == 1).await;
        let mut idle = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        assert_eq!(exchange(&mut idle).await, 200);
        until("both park", || lot() == 2).await;
        // The longest idle one's next request is on its way as the cap reclaims.
        asking
            .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .expect("request");
        // Wall-clock: nothing shows the bytes have reached the parked socket before the lot looks.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(
            harness.connections.close_oldest_idle(2),
            1,
            "only the idle one is closed"
        );
        let handed_back = harness.connections.close_parked();
        assert_eq!(handed_back.len(), 1, "the one with a request waiting");
    })
    .await;
}

#[tokio::test]
async fn at_the_drain_a_parked_connection_whose_request_has_arrived_is_served_and_the_others_closed(
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    local(async {
        let backend = Backend::start(BackendOptions::named("a")).expect("backend");
        // As a worker that has begun its drain: no longer taking parked connections back.
        let harness = Harness::start_with(&parking_soon(backend.address()), None, false).await;
        let mut idle = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        let mut asking = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        assert_eq!(exchange(&mut idle).await, 200);
        assert_eq!(exchange(&mut asking).await, 200);
        let lot = || harness.parked();
        until("both connections park", || lot() == 2).await;
        // The drain begins just as `asking` sends its next request to its parked connection.
        asking
            .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .expect("request");
        // Wall-clock: nothing shows the byte has reached the parked socket before the lot looks.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let _ = harness.shutdown.send(true);
        let handed_back = harness.connections.close_parked();
        assert_eq!(
            handed_back.len(),
            1,
            "the connection with a request waiting"
        );
        for resumed in handed_back {
            tokio::task::spawn_local(harness.connections.resume(resumed));
        }
        let mut response = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            asking.read_to_end(&mut response),
        )
        .await
        .expect("answered and closed in time");
        assert!(read.is_ok());
        assert!(
            response.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&response)
        );
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(2), idle.read(&mut byte))
            .await
            .expect("closed in time");
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "the idle one is closed at once"
        );
    })
    .await;
}

/// The value of the sample that starts with `series` (its name and labels) in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn latency_histograms_and_per_backend_counters_tell_a_slow_backend_from_a_fast_and_a_gone_one(
) {
    local(async {
        let fast = Backend::start(BackendOptions::named("fast")).expect("backend");
        let slow = Backend::start(
            BackendOptions::named("slow").delay(std::time::Duration::from_millis(60)),
        )
        .expect("backend");
        let registry = crate::Registry::new();
        let app = duet_testbed::config::Cluster::new("app")
            .policy("round_robin")
            .backend(fast.address())
            .backend(slow.address());
        let yaml = DuetConfig::new()
            .route(None, "/api", "app")
            .route(None, "/", "app")
            .cluster(app)
            .to_yaml();
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        let mut body_bytes = 0;
        for i in 0..10 {
            let (status, _, body) = harness.get(if i < 4 { "/api/x" } else { "/" }).await;
            assert_eq!(status, 200);
            body_bytes += body.map_or(0, |b| b.len());
        }
        let text = registry.render_prometheus();
        assert_eq!(
            sample(&text, "duet_response_body_bytes_total{worker=\"0\",cluster=\"app\"}"),
            Some(body_bytes as f64),
            "{text}"
        );
        assert!(body_bytes > 0);
        for backend in [fast.address(), slow.address()] {
            assert_eq!(
                sample(
                    &text,
                    &format!("duet_backend_responses_total{{worker=\"0\",cluster=\"app\",backend=\"{backend}\",class=\"2xx\"}}")
                ),
                Some(5.0),
                "{text}"
            );
        }
        let header = |backend: SocketAddr, le: &str| {
            sample(
                &text,
                &format!("duet_upstream_header_seconds_bucket{{cluster=\"app\",backend=\"{backend}\",le=\"{le}\"}}"),
            )
        };
        // Round robin: five each. The fast one answers within 50 ms, the slow one never does.
        assert_eq!(header(fast.address(), "0.05"), Some(5.0), "{text}");
        assert_eq!(header(slow.address(), "0.05"), Some(0.0), "{text}");
        assert_eq!(header(slow.address(), "+Inf"), Some(5.0), "{text}");
        // One series per route (named by its match when it has no `name:`).
        let count = |name: &str, route: &str| {
            sample(&text, &format!("{name}_count{{cluster=\"app\",route=\"{route}\"}}"))
        };
        assert_eq!(count("duet_request_duration_seconds", "*/api"), Some(4.0), "{text}");
        assert_eq!(count("duet_request_duration_seconds", "*/"), Some(6.0), "{text}");
        assert_eq!(count("duet_response_head_seconds", "*/api"), Some(4.0));
        assert_eq!(count("duet_response_head_seconds", "*/"), Some(6.0));
        let within_50ms = |route: &str| {
            sample(
                &text,
                &format!("duet_request_duration_seconds_bucket{{cluster=\"app\",route=\"{route}\",le=\"0.05\"}}"),
            )
        };
        // Round robin alternates fast, slow over both routes: the slow answers took 60 ms.
        assert_eq!(within_50ms("*/api"), Some(2.0), "{text}");
        assert_eq!(within_50ms("*/"), Some(3.0), "{text}");

        // A request no backend answers (its only backend refuses connections) is timed too.
        let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let gone = refused.local_addr().expect("address");
        drop(refused);
        let registry = crate::Registry::new();
        let harness = Harness::start_with(&cluster(&[gone], "round_robin", &[]), Some(registry.clone()), true).await;
        assert_eq!(harness.get("/").await.0, 502);
        let text = registry.render_prometheus();
        assert_eq!(
            sample(&text, "duet_request_duration_seconds_count{cluster=\"app\",route=\"*/\"}"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "duet_response_head_seconds_count{cluster=\"app\",route=\"*/\"}"),
            Some(0.0),
            "{text}"
        );
        let failures = |kind: &str| {
            sample(
                &text,
                &format!("duet_backend_failures_total{{worker=\"0\",cluster=\"app\",backend=\"{gone}\",kind=\"{kind}\"}}"),
            )
        };
        assert_eq!(failures("connect"), Some(1.0), "{text}");
        assert_eq!(failures("timeout"), Some(0.0), "{text}");
    })
    .await;
}

#[tokio::test]
async fn the_status_page_counts_over_its_window_not_since_start() {
    local(async {
        let backend = Backend::start(BackendOptions::named("a")).expect("backend");
        let registry = crate::Registry::new();
        let yaml = cluster(&[backend.address()], "p2c_inflight", &[]);
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        for _ in 0..10 {
            assert_eq!(harness.get("/").await.0, 200);
        }
        let mut window = crate::StatusWindow::new();
        window.record(&registry);
        for _ in 0..4 {
            assert_eq!(harness.get("/").await.0, 200);
        }
        let health = HealthView::default();
        let since_start = registry.status(&health, None);
        let recent = registry.status(&health, Some(&window));
        assert_eq!(since_start.clusters[0].requests, 14);
        assert_eq!(since_start.clusters[0].backends[0].picks, 14);
        assert_eq!(recent.clusters[0].requests, 4, "since the window's reading");
        assert_eq!(recent.clusters[0].backends[0].picks, 4);
        assert_eq!(recent.clusters[0].backends[0].responses[1], 4);
        assert_eq!(recent.clusters[0].backends[0].state, "up");
        assert_eq!(
            since_start.window_seconds, since_start.uptime_seconds,
            "without a window the figures run from the start"
        );
    })
    .await;
}

#[tokio::test]
async fn each_bucket_over_time_holds_what_every_backend_and_route_did_in_it() {
    local(async {
        let a = Backend::start(BackendOptions::named("a")).expect("backend");
        let b = Backend::start(BackendOptions::named("b")).expect("backend");
        let registry = crate::Registry::new();
        let yaml = cluster(&[a.address(), b.address()], "round_robin", &[]);
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        let mut window = crate::StatusWindow::with_bucket(std::time::Duration::from_secs(1));
        // The first close only takes the reading the first bucket starts from.
        window.close_bucket(&registry);
        for _ in 0..10 {
            assert_eq!(harness.get("/").await.0, 200);
        }
        window.close_bucket(&registry);
        for _ in 0..4 {
            assert_eq!(harness.get("/").await.0, 200);
        }
        for _ in 0..2 {
            assert_eq!(harness.get("/status/500").await.0, 500);
        }
        window.close_bucket(&registry);
        let status = registry.status(&HealthView::default(), Some(&window));
        assert_eq!(status.schema, 3);
        assert_eq!(status.history.bucket_seconds, 1.0);
        assert_eq!(status.history.bucket_ends_unix.len(), 2);
        let backends = &status.clusters[0].backends;
        assert_eq!(backends.len(), 2);
        for (bucket, picks) in [(0, 10), (1, 6)] {
            let points: Vec<_> = (backends.iter())
                .map(|b| b.history[bucket].expect("a point in every bucket"))
                .collect();
            assert_eq!(points.iter().map(|p| p.picks).sum::<u64>(), picks);
            let shares: f64 = points.iter().filter_map(|p| p.share).sum();
            assert!((shares - 1.0).abs() < 1e-9, "{points:?}");
            assert!(points
                .iter()
                .all(|p| p.in_flight == 0 && p.p50_ms.is_some()));
            // Round robin: an even split.
            assert_eq!(points[0].picks, picks / 2, "{points:?}");
        }
        let route = &status.routes[0].history;
        assert_eq!(route.len(), 2);
        let (first, second) = (route[0].expect("a point"), route[1].expect("a point"));
        assert_eq!(
            (first.responses, first.errors_5xx, first.error_ratio),
            (10, 0, 0.0)
        );
        assert_eq!((second.responses, second.errors_5xx), (6, 2));
        assert!((second.error_ratio - 2.0 / 6.0).abs() < 1e-9, "{second:?}");
        assert!(first.requests_per_second > 0.0);
        // The page: one line per backend in each of the cluster's plots.
        let html = status.to_html();
        for backend in [a.address(), b.address()] {
            let series = format!("data-series=\"{backend}\"");
            assert_eq!(html.matches(&series).count(), 4, "{html}");
        }
    })
    .await;
}

#[tokio::test]
async fn request_body_bytes_are_counted_whether_buffered_for_replay_or_streamed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    local(async {
        let backend = Backend::start(BackendOptions::named("sink")).expect("backend");
        let registry = crate::Registry::new();
        let yaml = cluster(&[backend.address()], "round_robin", &[]);
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        // 100 bytes with a length (small enough to be kept for a retry), then 500 chunked (streamed).
        // To `/upload`, where the backend reads the whole body (it answers with the count).
        let mut buffered =
            b"POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n".to_vec();
        buffered.extend_from_slice(&[b'a'; 100]);
        let mut streamed =
            b"POST /upload HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for size in [300, 200] {
            streamed.extend_from_slice(format!("{size:x}\r\n").as_bytes());
            streamed.extend_from_slice(&vec![b'b'; size]);
            streamed.extend_from_slice(b"\r\n");
        }
        streamed.extend_from_slice(b"0\r\n\r\n");
        for request in [buffered, streamed] {
            let mut stream = tokio::net::TcpStream::connect(harness.address)
                .await
                .expect("connect");
            stream.write_all(&request).await.expect("request");
            let mut head = [0u8; 12];
            tokio::time::timeout(
                std::time::Duration::from_secs(5),
                stream.read_exact(&mut head),
            )
            .await
            .expect("an answer in time")
            .expect("read");
            assert_eq!(&head[9..12], b"200");
        }
        let text = registry.render_prometheus();
        assert_eq!(
            sample(
                &text,
                "duet_request_body_bytes_total{worker=\"0\",cluster=\"app\"}"
            ),
            Some(600.0),
            "{text}"
        );
    })
    .await;
}

#[tokio::test]
async fn an_upstream_connection_is_reused_warm_and_closed_after_the_idle_timeout() {
    local(async {
        let backend = Backend::start(BackendOptions::named("pooled")).expect("backend");
        let yaml = cluster(
            &[backend.address()],
            "round_robin",
            &[("timeouts", "{ idle: 300ms }")],
        );
        let harness = Harness::start(&yaml).await;
        for _ in 0..5 {
            assert_eq!(harness.get("/").await.0, 200);
        }
        assert_eq!(backend.connections(), 1, "one connection, reused");
        assert_eq!(harness.proxy.pooled_connections("app"), Some(1));
        // Closed by duet once idle for 300 ms (the sweeper checks every 150 ms), not kept for the next
        // request to find expired.
        until("the idle upstream connection is closed", || {
            harness.proxy.pooled_connections("app") == Some(0)
        })
        .await;
        assert_eq!(harness.get("/").await.0, 200);
        assert_eq!(backend.connections(), 2, "a new one after the idle timeout");

        // A body the client abandons halfway takes its connection with it: the next request cannot
        // reuse a connection with half a response still on it.
        let stream = tokio::net::TcpStream::connect(harness.address)
            .await
            .expect("connect");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::task::spawn_local(connection);
        let request = http::Request::get("/bytes/100000000")
            .header(http::header::HOST, "test")
            .body(Empty::<Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("response");
        drop(response);
        drop(sender);
        // The backend sees it closed: the idle one before, and now the cut one.
        until("the cut upstream connection is closed", || {
            backend.connections_closed() == 2
        })
        .await;
        assert_eq!(harness.get("/").await.0, 200);
        assert_eq!(
            backend.connections(),
            3,
            "the cut connection was not pooled"
        );
    })
    .await;
}
