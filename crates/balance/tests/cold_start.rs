//! A cold cluster (issue #43, item 5): PeakEWMA ranks endpoints by latency from their first answers,
//! not after the 30 ms start estimate has faded (τ = 10 s).

use duet_balance::{Balancer, Clock, DefaultRtt, PeakEwmaConfig, Strategy};
use std::{convert::Infallible, time::Duration};
use tokio::task::JoinSet;
use tower::{service_fn, util::BoxService, Service, ServiceExt};

type Endpoint = BoxService<u32, &'static str, Infallible>;

/// An endpoint that answers its key after `ms` of (paused) time.
fn sleepy(key: &'static str, ms: u64) -> Endpoint {
    BoxService::new(service_fn(move |_: u32| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, Infallible>(key)
    }))
}

type Sleepy = Balancer<&'static str, Endpoint>;

/// A fresh balancer over endpoints of 2, 2 and 20 ms, all at the default start estimate.
fn cold(config: PeakEwmaConfig, seed: u64) -> Sleepy {
    let mut balance = Balancer::with_seed(Strategy::P2cPeakEwma, seed)
        .with_latency_config(config)
        .with_clock(Clock::tokio());
    for (key, ms) in [("a", 2), ("b", 2), ("slow", 20)] {
        balance.insert(key, 1, sleepy(key, ms));
    }
    balance
}

/// Sends `n` requests, at most `concurrency` at a time (one client connection multiplexing them), and
/// counts the answers from "slow".
async fn run(balance: &mut Sleepy, n: usize, concurrency: usize) -> usize {
    let mut pending = JoinSet::new();
    let (mut sent, mut slow) = (0, 0);
    while sent < n || !pending.is_empty() {
        while sent < n && pending.len() < concurrency {
            let future = balance.ready().await.expect("ready").call(0);
            pending.spawn(future);
            sent += 1;
        }
        if let Some(answer) = pending.join_next().await {
            slow += usize::from(answer.expect("joined").expect("served") == "slow");
        }
    }
    slow
}

fn estimate(balance: &Sleepy, key: &'static str) -> Duration {
    balance
        .endpoint_load(&key)
        .map(|l| l.rtt_estimate())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_cold_cluster_ranks_by_latency_within_its_first_answers() {
    for seed in 1..=5 {
        let mut balance = cold(PeakEwmaConfig::default(), seed);
        let first = run(&mut balance, 40, 8).await;
        let (a, b, slow) = (
            estimate(&balance, "a"),
            estimate(&balance, "b"),
            estimate(&balance, "slow"),
        );
        assert!(
            slow > a.max(b) * 4,
            "seed {seed}: after 40 answers the 20 ms endpoint must look slowest: a {a:?} b {b:?} slow {slow:?}"
        );
        let next = run(&mut balance, 600, 8).await;
        assert!(
            next * 100 < 3 * 600,
            "seed {seed}: slow got {next} of the next 600 (and {first} of the first 40)"
        );
        // Over the first 640 answers, learning included.
        assert!(
            (first + next) * 100 < 3 * 640,
            "seed {seed}: {first} + {next}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn one_request_at_a_time_the_slow_endpoint_is_left_after_its_first_answer() {
    for seed in 1..=5 {
        let mut balance = cold(PeakEwmaConfig::default(), seed);
        let slow = run(&mut balance, 600, 1).await;
        // Each endpoint answers once before it is measured; after that, the 20 ms one only loses.
        assert!(slow <= 2, "seed {seed}: slow served {slow} of 600");
    }
}

#[tokio::test(start_paused = true)]
async fn a_fixed_start_estimate_is_replaced_by_the_first_sample_too() {
    let config = PeakEwmaConfig {
        default_rtt: DefaultRtt::Fixed(Duration::from_millis(50)),
        ..PeakEwmaConfig::default()
    };
    let mut balance = cold(config, 3);
    let _ = run(&mut balance, 40, 8).await;
    let slow = estimate(&balance, "slow");
    assert!(
        slow >= Duration::from_millis(19) && slow <= Duration::from_millis(21),
        "{slow:?}"
    );
    assert!(estimate(&balance, "a") <= Duration::from_millis(3));
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_in_a_warm_pool_starts_at_the_measured_median_and_keeps_the_peak_rule() {
    let mut balance = cold(PeakEwmaConfig::default(), 4);
    let _ = run(&mut balance, 40, 8).await;
    // Measured: a, b at 2 ms, slow at 20 ms; the median is a measured 2 ms, not the 30 ms default.
    balance.insert("newcomer", 1, sleepy("newcomer", 1));
    let start = estimate(&balance, "newcomer");
    assert_eq!(start, estimate(&balance, "a").max(estimate(&balance, "b")));
    assert!(start <= Duration::from_millis(3), "{start:?}");
    // Its estimate came from the pool's own answers: a lower first sample does not replace it at once.
    for key in ["a", "b", "slow"] {
        balance.set_weight(&key, 0);
    }
    let _ = run(&mut balance, 1, 1).await;
    let after = estimate(&balance, "newcomer");
    assert!(
        after > Duration::from_micros(1900),
        "one 1 ms sample moved a measured median of {start:?} to {after:?}"
    );
}

/// An endpoint whose first answer carries a connection's setup (10 ms, say a TLS handshake) and whose
/// later ones take 1 ms.
fn pooled(key: &'static str) -> Endpoint {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    BoxService::new(service_fn(move |_: u32| {
        let first = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
        async move {
            let ms = if first { 10 } else { 1 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(key)
        }
    }))
}

/// One request at a time: the first endpoint picked answers in 10 ms, then in 1 ms. The other, yet to
/// answer, reads the pool's lowest answer so far, not that first one: it is tried, rather than left
/// behind an estimate its rival's setup inflated.
#[tokio::test(start_paused = true)]
async fn an_endpoint_yet_to_answer_is_tried_once_the_pool_answers_faster_than_its_first_answer() {
    for seed in 1..=5 {
        let mut balance =
            Balancer::with_seed(Strategy::P2cPeakEwma, seed).with_clock(Clock::tokio());
        for key in ["a", "b"] {
            balance.insert(key, 1, pooled(key));
        }
        let mut answered = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let future = balance.ready().await.expect("ready").call(0);
            answered.insert(future.await.expect("served"));
        }
        assert_eq!(answered.len(), 2, "seed {seed}: only {answered:?} answered");
    }
}
