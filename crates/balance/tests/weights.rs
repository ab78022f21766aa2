//! What weights mean, for every policy: among equally fast endpoints, weights 3:1 and 10:1:1 get their
//! share (w / Σw, ± 0.05) whether requests come one at a time or 16 at once; and a slow endpoint stays
//! out under PeakEWMA whatever its weight. Virtual time: each request takes its endpoint's latency.

use duet_balance::{Balancer, Clock, LoadGuard, Strategy};
use std::{cmp::Reverse, collections::BinaryHeap, time::Duration};
use tokio::time::Instant;

/// A small deterministic generator for latency jitter (±10%), so that equal endpoints' estimates are
/// never exactly equal, as on a real network.
struct Jitter(u64);

impl Jitter {
    fn apply(&mut self, latency: Duration) -> Duration {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let unit = (self.0 >> 33) as f64 / (1u64 << 31) as f64; // [0, 1)
        latency.mul_f64(0.9 + 0.2 * unit)
    }
}

/// Each endpoint's share of `requests` requests, `concurrency` at a time.
async fn shares(
    strategy: Strategy,
    weights: &[u32],
    latencies: &[Duration],
    concurrency: usize,
    requests: usize,
) -> Vec<f64> {
    let mut balance: Balancer<usize, ()> =
        Balancer::with_seed(strategy, 11).with_clock(Clock::tokio());
    for (key, &weight) in weights.iter().enumerate() {
        balance.insert(key, weight, ());
    }
    let mut jitter = Jitter(5);
    let mut served = vec![0usize; weights.len()];
    // Requests in flight, earliest completion first.
    let mut in_flight: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    let mut guards: Vec<Option<LoadGuard>> = Vec::new();
    let mut pick = |balance: &mut Balancer<usize, ()>, guards: &mut Vec<Option<LoadGuard>>| {
        let (key, (), guard) = balance.pick_and_claim().expect("an endpoint");
        let key = *key;
        served[key] += 1;
        guards.push(Some(guard));
        (
            Instant::now() + jitter.apply(latencies[key]),
            guards.len() - 1,
        )
    };
    for _ in 0..concurrency {
        in_flight.push(Reverse(pick(&mut balance, &mut guards)));
    }
    for _ in concurrency..requests {
        let Some(Reverse((done, slot))) = in_flight.pop() else {
            break;
        };
        tokio::time::advance(done.saturating_duration_since(Instant::now())).await;
        guards[slot].take();
        in_flight.push(Reverse(pick(&mut balance, &mut guards)));
    }
    let total: usize = served.iter().sum();
    served.iter().map(|&s| s as f64 / total as f64).collect()
}

fn policies() -> [Strategy; 4] {
    [
        Strategy::RoundRobin,
        Strategy::Random,
        Strategy::P2cInflight,
        Strategy::P2cPeakEwma,
    ]
}

#[tokio::test(start_paused = true)]
async fn equal_endpoints_get_their_weight_share_under_every_policy() {
    let latency = Duration::from_millis(10);
    for weights in [&[3u32, 1][..], &[10, 1, 1][..]] {
        let total: u32 = weights.iter().sum();
        let latencies = vec![latency; weights.len()];
        for name in policies() {
            for concurrency in [1, 16] {
                let got = shares(name, weights, &latencies, concurrency, 4000).await;
                for (share, &weight) in got.iter().zip(weights) {
                    let expected = f64::from(weight) / f64::from(total);
                    assert!(
                        (share - expected).abs() <= 0.05,
                        "{name}, weights {weights:?}, {concurrency} at a time: {got:?}"
                    );
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_endpoint_stays_out_under_peak_ewma_whatever_its_weight() {
    let latencies = [Duration::from_millis(100), Duration::from_millis(10)];
    // Weight is capacity: it divides the slow endpoint's concurrency, so as clients pile onto the fast
    // one the slow one's share grows (10.5% at 16 clients here, 2.5% unweighted). Up to 8 clients it
    // stays under a tenth.
    for concurrency in [1, 4, 8] {
        let got = shares(
            Strategy::P2cPeakEwma,
            &[3, 1],
            &latencies,
            concurrency,
            4000,
        )
        .await;
        assert!(
            got[0] < 0.10,
            "the weight-3 endpoint, 10x slower, {concurrency} at a time: {got:?}"
        );
    }
}

#[test]
fn smooth_weighted_round_robin_interleaves() {
    let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::RoundRobin, 1);
    balance.insert("a", 3, ());
    balance.insert("b", 1, ());
    let turns: String = (0..12)
        .map(|_| *balance.pick().expect("endpoint"))
        .collect::<Vec<_>>()
        .concat();
    // nginx's smooth weighted round robin: b is spread out, never a burst of a.
    assert_eq!(turns, "aaba".repeat(3));
}

/// A retry draws among what is left with the weights a first pick uses: weights 1, 2, 3, 4 with the
/// endpoint of weight 2 tried give 1/8, 3/8 and 4/8 under every policy, and never the tried one.
#[test]
fn a_retry_gets_the_weight_shares_of_the_endpoints_left() {
    for name in policies() {
        if name == Strategy::P2cPeakEwma {
            continue;
        }
        let mut balance = Balancer::with_seed(name, 5);
        for (key, weight) in [(0u32, 1), (1, 2), (2, 3), (3, 4)] {
            balance.insert(
                key,
                weight,
                tower::service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) }),
            );
        }
        let picks = 16_000;
        let mut counts = [0u32; 4];
        for _ in 0..picks {
            let (&key, _, guard) = balance.pick_and_claim_excluding(&[1]).expect("three left");
            counts[key as usize] += 1;
            drop(guard);
        }
        assert_eq!(counts[1], 0, "{name}: the tried endpoint");
        for (key, weight) in [(0usize, 1.0), (2, 3.0), (3, 4.0)] {
            let share = f64::from(counts[key]) / f64::from(picks);
            assert!(
                (share - weight / 8.0).abs() < 0.02,
                "{name}: endpoint {key} got {share:.3} of retries, its share is {:.3}; {counts:?}",
                weight / 8.0
            );
        }
    }
}
