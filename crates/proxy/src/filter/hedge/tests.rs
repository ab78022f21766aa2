//! Hedging's rules, through the worker's real pipeline (in-process harness, real loopback backends).
//!
//! Timing is kept out of the assertions: a stalled backend stalls for seconds (or never answers)
//! while the hedge delay is a few milliseconds, and the tests assert which backend answered and what
//! was counted, never how fast.

use crate::tests::Harness;
use bytes::Bytes;
use duet_testbed::{Backend, BackendOptions, Misbehaviour, RawBackend};
use http_body_util::{BodyExt, Full};
use std::{net::SocketAddr, time::Duration};

async fn local<F: std::future::Future>(test: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(test).await
}

/// One route to cluster `app` (round robin over `backends`, no retries) with `route` settings added.
fn config(backends: &[SocketAddr], route: &str, cluster: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address: {b} }}"))
        .collect();
    format!(
        "listeners: [{{ address: 127.0.0.1:0 }}]\n\
         routes: [{{ match: {{ path_prefix: / }}, cluster: app, {route} }}]\n\
         clusters:\n  - {{ name: app, policy: round_robin, retries: {{ attempts: 1 }}, \
         backends: [{}]{cluster} }}\n",
        list.join(", ")
    )
}

/// `method` on `path` with `body`, on a new connection: the status and the `x-backend` header.
async fn send(harness: &Harness, method: &str, body: &'static str) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(harness.address)
        .await
        .expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::task::spawn_local(connection);
    let request = http::Request::builder()
        .method(method)
        .uri("/")
        .header(http::header::HOST, "test")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let backend = response
        .headers()
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let _ = response.into_body().collect().await;
    (status, backend)
}

/// The value of `series` (name and labels) in the Prometheus text, 0 if absent.
fn sample(registry: &crate::Registry, series: &str) -> u64 {
    registry
        .render_prometheus()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

fn hedges(registry: &crate::Registry, outcome: &str) -> u64 {
    let series = format!(
        "duet_hedges_total{{worker=\"0\",cluster=\"app\",route=\"*/\",outcome=\"{outcome}\"}}"
    );
    sample(registry, &series)
}

/// (in flight, picks) of `backend` in this worker's balancer.
fn load(harness: &Harness, backend: SocketAddr) -> (u64, u64) {
    harness
        .proxy
        .with_balance("app", |b| {
            b.endpoint_load(&backend)
                .map(|l| (l.in_flight(), l.picks()))
        })
        .flatten()
        .expect("backend in cluster")
}

async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let limit = Duration::from_secs(30);
    let held =
        duet_testbed::wait::eventually_async(limit, || std::future::ready(condition())).await;
    assert!(held, "{what}: not within {limit:?}");
}

/// A backend that stalls for seconds loses every race to one that answers at once: every client gets
/// the fast backend's answer, each hedge is counted, and the dropped attempts release their load once
/// (both backends back to 0 in flight; picks = requests + hedges).
#[tokio::test]
async fn a_stalled_first_attempt_is_hedged_and_the_fast_backend_answers() {
    local(async {
        let slow = Backend::start(BackendOptions::named("slow").delay(Duration::from_secs(30)))
            .expect("backend");
        let fast = Backend::start(BackendOptions::named("fast")).expect("backend");
        let backends = [slow.address(), fast.address()];
        let yaml = config(&backends, "hedge: { after: 5ms, max_extra: 100% }", "");
        let registry = crate::Registry::new();
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        let requests = 8;
        for _ in 0..requests {
            assert_eq!(send(&harness, "GET", "").await, (200, "fast".to_owned()));
        }
        let (won, lost) = (hedges(&registry, "won"), hedges(&registry, "lost"));
        assert!(
            won >= 1,
            "round robin gave the slow backend a first attempt"
        );
        // Every attempt sent to the slow backend was either a first one that a hedge beat, or a hedge
        // that the fast backend beat (only if it took over 5 ms on a busy machine). An attempt dropped
        // before its request was written (still connecting when the other answered) never reaches the
        // backend, so the backend may count fewer, never more.
        assert!(
            slow.requests() <= won + lost,
            "slow saw {} requests, hedges won {won} lost {lost}",
            slow.requests()
        );
        // A dropped attempt's connection is closed, never pooled mid-response: no connection to the
        // slow backend carried a second request (one dropped while connecting carried none).
        assert!(
            slow.requests() <= slow.connections(),
            "{} requests on {} connections",
            slow.requests(),
            slow.connections()
        );
        assert_eq!(hedges(&registry, "cancelled"), 0);
        until("every attempt settled", || {
            load(&harness, slow.address()).0 == 0 && load(&harness, fast.address()).0 == 0
        })
        .await;
        let picks = load(&harness, slow.address()).1 + load(&harness, fast.address()).1;
        assert_eq!(
            picks,
            requests + won + lost,
            "one pick per attempt, hedges included"
        );
        // The attempts histogram counts the hedge as the request's second attempt.
        let two = sample(
            &registry,
            "duet_request_attempts_bucket{cluster=\"app\",le=\"2\"}",
        );
        let one = sample(
            &registry,
            "duet_request_attempts_bucket{cluster=\"app\",le=\"1\"}",
        );
        assert_eq!(two - one, won + lost);
    })
    .await;
}

/// POST is not among the methods hedged by default: it waits for its backend, however slow.
#[tokio::test]
async fn a_post_is_never_hedged_by_default() {
    local(async {
        let slow = Backend::start(BackendOptions::named("slow").delay(Duration::from_millis(300)))
            .expect("backend");
        let fast = Backend::start(BackendOptions::named("fast")).expect("backend");
        let backends = [slow.address(), fast.address()];
        let yaml = config(&backends, "hedge: { after: 5ms, max_extra: 100% }", "");
        let registry = crate::Registry::new();
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        let mut answered = Vec::new();
        for _ in 0..2 {
            answered.push(send(&harness, "POST", "small body").await);
        }
        answered.sort();
        let expected = [(200, "fast".to_owned()), (200, "slow".to_owned())];
        assert_eq!(answered, expected, "round robin: one each, none hedged");
        assert_eq!((slow.requests(), fast.requests()), (1, 1));
        for outcome in ["won", "lost", "cancelled"] {
            assert_eq!(hedges(&registry, outcome), 0, "{outcome}");
        }
    })
    .await;
}

/// Under a backend that never answers, hedges stay within `max_extra` of the requests: 10% of 30 is
/// 3 hedges at most, whatever the stalls; requests without a token wait out the route's timeout.
#[tokio::test]
async fn the_budget_holds_under_a_backend_that_always_stalls() {
    local(async {
        let stalled = RawBackend::start(Misbehaviour::Hang).expect("backend");
        let fast = Backend::start(BackendOptions::named("fast")).expect("backend");
        let backends = [stalled.address(), fast.address()];
        let route = "timeout: 150ms, hedge: { after: 5ms, max_extra: 10% }";
        let registry = crate::Registry::new();
        let harness =
            Harness::start_with(&config(&backends, route, ""), Some(registry.clone()), true).await;
        let requests = 30u64;
        let mut answered = 0;
        for _ in 0..requests {
            let (status, backend) = send(&harness, "GET", "").await;
            match status {
                200 => {
                    assert_eq!(backend, "fast");
                    answered += 1;
                }
                status => assert_eq!(status, 504, "the route's timeout"),
            }
        }
        let sent = ["won", "lost", "cancelled"].map(|o| hedges(&registry, o));
        let hedges_sent: u64 = sent.iter().sum();
        assert!(hedges_sent <= requests / 10, "{sent:?}");
        assert!(
            sent[0] >= 1,
            "a token was spent on a stalled first attempt: {sent:?}"
        );
        // Every request's attempts reached a backend: the extra ones are the hedges.
        let attempts = stalled.requests() + fast.requests();
        assert_eq!(attempts - requests, hedges_sent);
        assert!(
            answered > requests / 2,
            "the fast backend's share, plus hedges won"
        );
        until("every attempt settled", || {
            load(&harness, stalled.address()).0 == 0 && load(&harness, fast.address()).0 == 0
        })
        .await;
    })
    .await;
}

/// A first attempt that fails after its hedge was sent is still the backend's failure (counted, and
/// here ejecting it), though the hedge answers the client.
#[tokio::test]
async fn a_hedge_that_wins_after_the_first_attempt_failed_still_counts_the_failure() {
    local(async {
        // Fails each first attempt at 2 s (no response head); the other backend answers 1.5 s after
        // the hedge leaves at 1 s: after the failure, well within its own 2 s.
        let hanging = RawBackend::start(Misbehaviour::Hang).expect("backend");
        let steady = Backend::start(BackendOptions::named("steady").delay(Duration::from_millis(1500)))
            .expect("backend");
        let backends = [steady.address(), hanging.address()];
        let cluster = ", timeouts: { response_headers: 2s }, \
                       outlier_detection: { consecutive_failures: 1, base_ejection_time: 60s }";
        let yaml = config(&backends, "hedge: { after: 1s, max_extra: 100% }", cluster);
        let registry = crate::Registry::new();
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        // Smooth round robin gives the first attempt to the backend listed second; should that
        // change, a first attempt to the steady one is hedged to the hanging one, which loses, and
        // the next request tries again.
        for _ in 0..4 {
            assert_eq!(send(&harness, "GET", "").await, (200, "steady".to_owned()));
            if hedges(&registry, "won") > 0 {
                break;
            }
        }
        assert_eq!(hedges(&registry, "won"), 1);
        let failures = format!(
            "duet_backend_failures_total{{worker=\"0\",cluster=\"app\",backend=\"{}\",kind=\"timeout\"}}",
            hanging.address()
        );
        assert_eq!(sample(&registry, &failures), 1, "the failure the hedge did not hide");
        let ejected = harness
            .proxy
            .with_balance("app", |b| b.endpoint_load(&hanging.address()).map(|l| !l.is_eligible()))
            .flatten();
        assert_eq!(ejected, Some(true), "outlier detection saw it");
    })
    .await;
}

/// When neither attempt answers before the route's timeout, both are dropped with the request: the
/// hedge counts as cancelled, and both backends' load is released once.
#[tokio::test]
async fn a_route_timeout_cancels_both_attempts_and_releases_both_loads() {
    local(async {
        let a = RawBackend::start(Misbehaviour::Hang).expect("backend");
        let b = RawBackend::start(Misbehaviour::Hang).expect("backend");
        let backends = [a.address(), b.address()];
        let route = "timeout: 200ms, hedge: { after: 5ms, max_extra: 100% }";
        let registry = crate::Registry::new();
        let yaml = config(&backends, route, "");
        let harness = Harness::start_with(&yaml, Some(registry.clone()), true).await;
        assert_eq!(send(&harness, "GET", "").await.0, 504);
        assert_eq!(hedges(&registry, "cancelled"), 1);
        assert_eq!(hedges(&registry, "won") + hedges(&registry, "lost"), 0);
        until("both attempts settled", || {
            load(&harness, a.address()).0 == 0 && load(&harness, b.address()).0 == 0
        })
        .await;
        assert_eq!(
            (load(&harness, a.address()).1, load(&harness, b.address()).1),
            (1, 1)
        );
    })
    .await;
}
