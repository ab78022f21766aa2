//! Selection as a `Balancer` makes it: read counts, draws, weights, ties, membership, PeakEWMA defaults.

use duet_balance::{
    Balancer, Clock, CompleteOnBodyEnd, DefaultRtt, Draws, PeakEwmaConfig, Strategy,
};
use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tower::{service_fn, Service, ServiceExt};

fn echo() -> impl Service<
    u32,
    Response = u32,
    Error = Infallible,
    Future = std::future::Ready<Result<u32, Infallible>>,
> {
    service_fn(|x: u32| std::future::ready(Ok(x)))
}

/// An endpoint that answers with its own key.
fn named(
    k: u32,
) -> impl Service<
    u32,
    Response = u32,
    Error = Infallible,
    Future = std::future::Ready<Result<u32, Infallible>>,
> {
    service_fn(move |_: u32| std::future::ready(Ok(k)))
}

/// Sends one request and waits for its answer.
async fn serve_one<K, S, C>(balance: &mut Balancer<K, S, C>) -> C::Output
where
    K: std::hash::Hash + Eq + Clone,
    S: Service<u32>,
    S::Error: Into<duet_balance::BoxError>,
    C: tower::load::TrackCompletion<duet_balance::LoadGuard, S::Response>,
{
    balance
        .ready()
        .await
        .expect("ready")
        .call(0)
        .await
        .expect("served")
}

/// Sends `n` sequential requests and returns the answers.
async fn answers<S>(balance: &mut Balancer<u32, S>, n: usize) -> Vec<u32>
where
    S: Service<u32, Response = u32, Error = Infallible>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            balance
                .ready()
                .await
                .expect("ready")
                .call(0)
                .await
                .expect("served"),
        );
    }
    out
}

#[tokio::test]
async fn each_pick_reads_exactly_two_loads() {
    for n in [2usize, 3, 64, 4096] {
        let mut balance = Balancer::with_seed(Strategy::P2cPeakEwma, 1);
        for k in 0..n {
            balance.insert(k, 1, echo());
        }
        for _ in 0..50 {
            serve_one(&mut balance).await;
        }
        let stats = balance.stats();
        assert_eq!(stats.picks, 50);
        assert_eq!(stats.load_reads, 100, "n = {n}");
    }
}

#[tokio::test]
async fn one_endpoint_consumes_no_draw() {
    let mut balance = Balancer::with_draws(
        Strategy::P2cInflight,
        Draws::from_source(|| -> u64 { panic!("a pool of one must not draw") }),
    );
    balance.insert("solo", 1, echo());
    for _ in 0..10 {
        balance
            .ready()
            .await
            .expect("ready")
            .call(1)
            .await
            .expect("served");
    }
    assert_eq!(balance.stats().load_reads, 0);
}

#[tokio::test]
async fn the_lighter_endpoint_wins_and_is_counted_before_the_call() {
    // Script: draws 0, 0 over n = 2 give i = 0, j = 1.
    let draws = Arc::new(Mutex::new(vec![0u64, 0, 0, 0, 0, 0].into_iter()));
    let source = {
        let draws = draws.clone();
        move || draws.lock().expect("lock").next().expect("enough draws")
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let make = |name: &'static str| {
        let seen = seen.clone();
        service_fn(move |_: u32| {
            seen.lock().expect("lock").push(name);
            // Never completes: both requests stay in flight.
            std::future::pending::<Result<u32, Infallible>>()
        })
    };
    let mut balance = Balancer::with_draws(Strategy::P2cInflight, Draws::from_source(source));
    balance.insert("a", 1, make("a"));
    balance.insert("b", 1, make("b"));
    // First pick: both 0, tie, coin 0 → a. Second: a has 1, b has 0 → b, no coin drawn.
    let f1 = balance.ready().await.expect("ready").call(0);
    assert_eq!(balance.endpoint_load(&"a").map(|l| l.in_flight()), Some(1));
    let f2 = balance.ready().await.expect("ready").call(0);
    assert_eq!(*seen.lock().expect("lock"), vec!["a", "b"]);
    assert_eq!(balance.stats().ties, 1);
    assert_eq!(balance.stats().both_zero, 1);
    assert_eq!(
        draws.lock().expect("lock").len(),
        1,
        "five draws: two pairs and one coin"
    );
    drop((f1, f2));
    assert_eq!(balance.endpoint_load(&"a").map(|l| l.in_flight()), Some(0));
}

#[tokio::test]
async fn weights_10_1_1_at_equal_load_get_their_weight_share() {
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 42);
    balance.insert("heavy", 10, echo());
    balance.insert("light1", 1, echo());
    balance.insert("light2", 1, echo());
    let requests = 120_000u32;
    for _ in 0..requests {
        // Each request completes before the next pick: every comparison is at equal (zero) load.
        serve_one(&mut balance).await;
    }
    let picks: HashMap<&str, u64> = balance
        .endpoints()
        .map(|e| (*e.key, e.load.picks()))
        .collect();
    let share = |k: &str| picks[k] as f64 / f64::from(requests);
    // Tolerance: ±0.01 is over 9 standard deviations of a binomial share at this count.
    assert!(
        (share("heavy") - 10.0 / 12.0).abs() < 0.01,
        "heavy {}",
        share("heavy")
    );
    assert!(
        (share("light1") - 1.0 / 12.0).abs() < 0.01,
        "light1 {}",
        share("light1")
    );
    assert!(
        (share("light2") - 1.0 / 12.0).abs() < 0.01,
        "light2 {}",
        share("light2")
    );
}

#[tokio::test]
async fn weighted_comparison_divides_load_by_weight() {
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 3);
    let hold = || service_fn(|_: u32| std::future::pending::<Result<u32, Infallible>>());
    balance.insert("big", 4, hold());
    balance.insert("small", 1, hold());
    let mut futures = Vec::new();
    for _ in 0..500 {
        futures.push(balance.ready().await.expect("ready").call(0));
    }
    let big = balance
        .endpoint_load(&"big")
        .map(|l| l.in_flight())
        .unwrap_or(0);
    let small = balance
        .endpoint_load(&"small")
        .map(|l| l.in_flight())
        .unwrap_or(0);
    // Held requests pile up in proportion to capacity: 4:1, within a few requests.
    assert_eq!(big + small, 500);
    assert!((big as i64 - 400).abs() <= 5, "big {big}, small {small}");
}

#[tokio::test]
async fn balancers_without_a_seed_break_ties_differently() {
    let sequence = || async {
        let mut balance = Balancer::new(Strategy::P2cInflight);
        for k in 0..8u32 {
            balance.insert(k, 1, named(k));
        }
        answers(&mut balance, 64).await
    };
    assert_ne!(sequence().await, sequence().await);
}

#[tokio::test]
async fn membership_updates_keep_state_and_removed_guards_complete() {
    let hold = || service_fn(|_: u32| std::future::pending::<Result<u32, Infallible>>());
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 5);
    balance.insert("a", 1, hold());
    balance.insert("b", 1, hold());
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(balance.ready().await.expect("ready").call(0));
    }
    let a_before = balance
        .endpoint_load(&"a")
        .map(|l| l.in_flight())
        .unwrap_or(0);
    assert!(a_before > 0);

    // Ineligible, then back: the count survives.
    balance.set_eligible(&"a", false);
    assert_eq!(balance.eligible_len(), 1);
    for _ in 0..5 {
        held.push(balance.ready().await.expect("ready").call(0));
    }
    assert_eq!(
        balance.endpoint_load(&"a").map(|l| l.in_flight()),
        Some(a_before),
        "ineligible gets nothing"
    );
    balance.set_eligible(&"a", true);
    assert_eq!(
        balance.endpoint_load(&"a").map(|l| l.in_flight()),
        Some(a_before)
    );

    // Re-inserting the same key keeps state.
    balance.insert("a", 1, hold());
    assert_eq!(
        balance.endpoint_load(&"a").map(|l| l.in_flight()),
        Some(a_before)
    );

    // Removal: the guards in flight still hold the state and complete without panic.
    let state = balance.endpoint_load(&"a").cloned().expect("a");
    balance.remove(&"a");
    assert_eq!(balance.len(), 1);
    drop(held);
    assert_eq!(state.in_flight(), 0);
    assert_eq!(balance.endpoint_load(&"b").map(|l| l.in_flight()), Some(0));
}

#[tokio::test]
async fn weight_zero_is_ineligible() {
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 5);
    balance.insert("a", 0, echo());
    assert_eq!(balance.eligible_len(), 0);
    assert!(balance.pick().is_err());
    balance.set_weight(&"a", 2);
    assert_eq!(balance.pick().copied(), Ok("a"));
}

#[tokio::test(start_paused = true)]
async fn a_new_endpoint_starts_at_the_pool_median() {
    let metric = Strategy::P2cPeakEwma;
    let mut balance = Balancer::with_seed(metric, 1).with_clock(Clock::tokio());
    let sleepy = |ms: u64| {
        service_fn(move |_: u32| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(0u32)
        })
    };
    balance.insert("first", 1, sleepy(0));
    assert_eq!(
        balance.endpoint_load(&"first").map(|l| l.rtt_estimate()),
        Some(Duration::from_millis(30))
    );
    balance.insert("slow", 1, sleepy(0));
    balance.insert("fast", 1, sleepy(0));
    // Drive samples: 90 ms and 10 ms peaks.
    for (key, ms) in [("slow", 90u64), ("fast", 10)] {
        let state = balance.endpoint_load(&key).cloned().expect("present");
        balance.insert(key, 1, sleepy(ms));
        // Weight 0 isolates the endpoint without re-admission (which would reset estimates).
        for other in ["first", "slow", "fast"] {
            balance.set_weight(&other, u32::from(other == key));
        }
        serve_one(&mut balance).await;
        let _ = state;
    }
    for key in ["first", "slow", "fast"] {
        balance.set_weight(&key, 1);
    }
    let estimates: Vec<Duration> = ["first", "slow", "fast"]
        .iter()
        .map(|k| {
            balance
                .endpoint_load(k)
                .map(|l| l.rtt_estimate())
                .unwrap_or_default()
        })
        .collect();
    // Each first answer replaced the 30 ms start (the slow one's has decayed for 10 ms since); "first"
    // has not answered: it reads the pool's lowest answer so far, and stays out of the median.
    assert_eq!(estimates[0], Duration::from_millis(10), "{estimates:?}");
    assert_eq!(estimates[2], Duration::from_millis(10), "{estimates:?}");
    assert!(
        estimates[1] > Duration::from_millis(89),
        "slow peaked: {estimates:?}"
    );
    balance.insert("newcomer", 1, sleepy(0));
    assert_eq!(
        balance.endpoint_load(&"newcomer").map(|l| l.rtt_estimate()),
        Some((estimates[1] + estimates[2]) / 2),
        "median of the measured {estimates:?}"
    );

    let mut fixed = Balancer::<&str, _>::with_seed(Strategy::P2cPeakEwma, 1)
        .with_latency_config(PeakEwmaConfig {
            default_rtt: DefaultRtt::Fixed(Duration::from_millis(7)),
            ..PeakEwmaConfig::default()
        })
        .with_clock(Clock::tokio());
    fixed.insert("x", 1, sleepy(0));
    assert_eq!(
        fixed.endpoint_load(&"x").map(|l| l.rtt_estimate()),
        Some(Duration::from_millis(7))
    );
}

#[tokio::test(start_paused = true)]
async fn a_penalised_status_records_the_penalty() {
    let mut balance = Balancer::with_seed(Strategy::P2cPeakEwma, 1)
        .with_clock(Clock::tokio())
        .with_completion(CompleteOnBodyEnd::default());
    let status = |code: u16| {
        service_fn(move |_: u32| async move {
            let mut response = http::Response::new(http_body_util::Empty::<bytes::Bytes>::new());
            *response.status_mut() = http::StatusCode::from_u16(code).map_err(|_| "bad status")?;
            Ok::<_, &'static str>(response)
        })
    };
    balance.insert("shedding", 1, status(503));
    let response = serve_one(&mut balance).await;
    assert_eq!(response.status(), 503);
    assert_eq!(
        balance.endpoint_load(&"shedding").map(|l| l.rtt_estimate()),
        Some(Duration::from_secs(1))
    );
    // A connect failure is penalised the same way.
    // Status 0 cannot be built: the service fails before any response, as a refused connect would.
    balance.insert("refusing", 1, status(0));
    balance.set_eligible(&"shedding", false);
    assert!(balance.ready().await.expect("ready").call(0).await.is_err());
    assert_eq!(
        balance.endpoint_load(&"refusing").map(|l| l.rtt_estimate()),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        balance.endpoint_load(&"refusing").map(|l| l.in_flight()),
        Some(0)
    );
}

#[tokio::test]
async fn the_observer_sees_both_candidates() {
    let events = Arc::new(AtomicU64::new(0));
    let ties = Arc::new(AtomicU64::new(0));
    let (e, t) = (events.clone(), ties.clone());
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 8).with_observer(move |event| {
        e.fetch_add(1, Ordering::Relaxed);
        assert_ne!(event.candidates[0].0, event.candidates[1].0);
        assert!(event.chosen == event.candidates[0].0 || event.chosen == event.candidates[1].0);
        if event.tie {
            t.fetch_add(1, Ordering::Relaxed);
        }
    });
    for k in 0..4u32 {
        balance.insert(k, 1, echo());
    }
    for _ in 0..100 {
        serve_one(&mut balance).await;
    }
    assert_eq!(events.load(Ordering::Relaxed), 100);
    assert_eq!(ties.load(Ordering::Relaxed), balance.stats().ties);
    assert_eq!(
        balance.stats().ties,
        100,
        "sequential requests always compare two idle endpoints"
    );
}

#[tokio::test]
async fn round_robin_baseline_takes_turns() {
    let mut balance = Balancer::with_seed(Strategy::RoundRobin, 1);
    for k in 0..3u32 {
        balance.insert(k, 1, named(k));
    }
    let got = answers(&mut balance, 6).await;
    assert_eq!(got[..3], got[3..]);
    let mut first = got[..3].to_vec();
    first.sort();
    assert_eq!(first, vec![0, 1, 2]);
}

#[tokio::test]
async fn panic_mode_balances_over_all_when_too_few_are_eligible() {
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 4).with_panic_threshold(0.5);
    for k in 0..4u32 {
        balance.insert(k, 1, named(k));
    }
    // Two of four eligible: exactly at the threshold, no panic, only 2 and 3 are picked.
    balance.set_eligible(&0, false);
    balance.set_eligible(&1, false);
    assert!(!balance.is_panicking());
    for _ in 0..50 {
        let got = serve_one(&mut balance).await;
        assert!(got >= 2, "picked ineligible {got}");
    }
    // One of four: below half, so all four are candidates again.
    balance.set_eligible(&2, false);
    assert!(balance.is_panicking());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        seen.insert(
            balance
                .ready()
                .await
                .expect("ready")
                .call(0)
                .await
                .expect("served"),
        );
    }
    assert_eq!(seen.len(), 4, "panic mode uses every endpoint: {seen:?}");
    // None eligible: still served (a balancer without a panic threshold would answer NoEligibleEndpoint).
    balance.set_eligible(&3, false);
    assert!(balance.ready().await.expect("ready").call(0).await.is_ok());
    let mut strict = Balancer::with_seed(Strategy::P2cInflight, 4);
    strict.insert(0u32, 1, echo());
    strict.set_eligible(&0, false);
    assert!(strict.ready().await.expect("ready").call(0).await.is_err());
}

#[tokio::test]
async fn a_retry_never_picks_an_excluded_endpoint() {
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 6);
    for k in 0..3u32 {
        balance.insert(k, 1, named(k));
    }
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for _ in 0..100 {
        assert!(balance
            .poll_ready_excluding::<u32>(&mut cx, &[0, 2])
            .is_ready());
        assert_eq!(balance.call(0).await.expect("served"), 1);
    }
    assert!(balance
        .poll_ready_excluding::<u32>(&mut cx, &[0, 1, 2])
        .is_ready());
    let error = balance.call(0).await.expect_err("everything excluded");
    assert!(error.is::<duet_balance::NoEligibleEndpoint>());
    // A pick reserved by a plain `poll_ready` that names an excluded endpoint is not kept.
    for _ in 0..50 {
        assert!(Service::<u32>::poll_ready(&mut balance, &mut cx).is_ready());
        assert!(balance
            .poll_ready_excluding::<u32>(&mut cx, &[0, 1])
            .is_ready());
        assert_eq!(balance.call(0).await.expect("served"), 2);
    }
    // Each retry pick reads exactly two loads as well.
    let before = balance.stats().load_reads;
    assert!(balance
        .poll_ready_excluding::<u32>(&mut cx, &[2])
        .is_ready());
    let _ = balance.call(0).await;
    assert_eq!(balance.stats().load_reads - before, 2);
}

#[tokio::test(start_paused = true)]
async fn a_readmitted_endpoint_restarts_at_the_median_estimate() {
    let mut balance = Balancer::with_seed(Strategy::P2cPeakEwma, 12).with_clock(Clock::tokio());
    let sleepy = |ms: u64| {
        service_fn(move |_: u32| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(0u32)
        })
    };
    for (k, ms) in [(0u32, 10u64), (1, 20), (2, 40), (3, 900)] {
        balance.insert(k, 1, sleepy(ms));
    }
    // One sample each: the estimates peak at 10, 20, 40 and 900 ms.
    for k in 0..4u32 {
        for other in 0..4u32 {
            balance.set_weight(&other, u32::from(other == k));
        }
        serve_one(&mut balance).await;
    }
    for k in 0..4u32 {
        balance.set_weight(&k, 1);
    }
    let before = balance
        .endpoint_load(&3)
        .map(|l| l.rtt_estimate())
        .expect("3");
    assert!(before > Duration::from_millis(800), "{before:?}");
    balance.set_eligible(&3, false);
    balance.set_eligible(&3, true);
    let median = balance
        .endpoint_load(&1)
        .map(|l| l.rtt_estimate())
        .expect("1");
    assert_eq!(
        balance.endpoint_load(&3).map(|l| l.rtt_estimate()),
        Some(median),
        "median of 10, 20, 40 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_start_ramps_a_readmitted_share_up_gradually() {
    let mut balance =
        Balancer::with_seed(Strategy::P2cInflight, 12).with_slow_start(Duration::from_secs(10));
    for k in 0..4u32 {
        balance.insert(k, 1, echo());
    }
    tokio::time::advance(Duration::from_secs(20)).await;
    let state = balance.endpoint_load(&3).cloned().expect("3");
    balance.set_eligible(&3, false);
    balance.set_eligible(&3, true);
    // Sequential requests compare idle endpoints, so the share follows the ramped weight exactly:
    // w / (3 + w) with w growing from 0.1 to 1 over the 10 s window.
    let mut shares = Vec::new();
    for _ in 0..12 {
        let before = state.picks();
        for _ in 0..1000 {
            serve_one(&mut balance).await;
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        shares.push((state.picks() - before) as f64 / 1000.0);
    }
    let expected = |second: f64| {
        let w = ((second + 0.5) / 10.0).clamp(0.1, 1.0);
        w / (3.0 + w)
    };
    for (second, &share) in shares.iter().enumerate() {
        assert!(
            (share - expected(second as f64)).abs() < 0.04,
            "second {second}: {share} vs {:.3}; all {shares:?}",
            expected(second as f64)
        );
    }
    assert!(shares[0] < 0.06 && shares[11] > 0.21, "{shares:?}");
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_that_stalls_loses_its_picks_before_any_of_its_requests_completes() {
    let mut balance = Balancer::<&str, _>::with_seed(Strategy::P2cPeakEwma, 7)
        .with_latency_config(PeakEwmaConfig {
            default_rtt: DefaultRtt::Fixed(Duration::from_millis(10)),
            ..PeakEwmaConfig::default()
        })
        .with_clock(Clock::tokio());
    balance.insert("stalled", 1, echo());
    balance.insert("healthy", 1, echo());
    // One request outstanding on each, as at any moment under steady load; the healthy one's is recent.
    // The other one's weight is 0 for the claim: a pick of it, dropped at once, would record its
    // first sample, which replaces the start estimate.
    let claim = |balance: &mut Balancer<&str, _>, wanted: &'static str| {
        let other = if wanted == "stalled" {
            "healthy"
        } else {
            "stalled"
        };
        balance.set_weight(&other, 0);
        let (key, _, guard) = balance.pick_and_claim().expect("an endpoint");
        assert_eq!(*key, wanted);
        balance.set_weight(&other, 1);
        guard
    };
    let _stuck = claim(&mut balance, "stalled");
    tokio::time::advance(Duration::from_millis(90)).await;
    let _recent = claim(&mut balance, "healthy");
    tokio::time::advance(Duration::from_millis(10)).await;
    // Same estimate (10 ms, no sample yet), same in flight: only the age of what each is waiting for
    // (100 ms against 10 ms) tells them apart.
    let picks: Vec<&str> = (0..200)
        .map(|_| *balance.pick_and_claim().expect("an endpoint").0)
        .collect();
    assert!(picks.iter().all(|k| *k == "healthy"), "{picks:?}");
    assert_eq!(
        balance.endpoint_load(&"stalled").map(|l| l.rtt_estimate()),
        Some(Duration::from_millis(100)),
        "its waiting request's age is its estimate's floor"
    );
}

/// A retry during slow start draws with the same ramped weights as a first pick: endpoint 2, re-admitted
/// at a tenth of its weight, gets `0.1 / (1 + 0.1)` of the retries that exclude endpoint 0, not the half
/// its full weight would give it. The clock stands still, so the ramp stays at a tenth throughout.
#[tokio::test(start_paused = true)]
async fn a_retry_during_slow_start_uses_the_ramped_weights() {
    let mut balance =
        Balancer::with_seed(Strategy::P2cInflight, 21).with_slow_start(Duration::from_secs(10));
    for k in 0..3u32 {
        balance.insert(k, 1, named(k));
    }
    tokio::time::advance(Duration::from_secs(20)).await;
    balance.set_eligible(&2, false);
    balance.set_eligible(&2, true);
    let ramped = 0.1 / 1.1;
    let picks = 20_000;

    let mut claimed = 0u32;
    for _ in 0..picks {
        let (&key, _, guard) = balance
            .pick_and_claim_excluding(&[0])
            .expect("1 and 2 remain");
        assert_ne!(key, 0, "excluded");
        claimed += u32::from(key == 2);
        drop(guard);
    }
    let share = f64::from(claimed) / f64::from(picks);
    assert!(
        (share - ramped).abs() < 0.015,
        "pick_and_claim_excluding: endpoint 2 got {share:.3}, its ramped share is {ramped:.3}"
    );

    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut served = 0u32;
    for _ in 0..picks {
        assert!(balance
            .poll_ready_excluding::<u32>(&mut cx, &[0])
            .is_ready());
        served += u32::from(balance.call(0).await.expect("served") == 2);
    }
    let share = f64::from(served) / f64::from(picks);
    assert!(
        (share - ramped).abs() < 0.015,
        "poll_ready_excluding: endpoint 2 got {share:.3}, its ramped share is {ramped:.3}"
    );
    // The first pick agrees: with nothing excluded, 2's share is 0.1 / 2.1.
    let mut first = 0u32;
    for _ in 0..picks {
        first += u32::from(*balance.pick().expect("three candidates") == 2);
    }
    let share = f64::from(first) / f64::from(picks);
    assert!((share - 0.1 / 2.1).abs() < 0.015, "first pick: {share:.3}");
}
