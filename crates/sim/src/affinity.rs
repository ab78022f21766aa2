//! Consistent hashing with bounded loads, driven through duet-balance's own keyed picks
//! ([`Balancer::pick_and_claim_for`]): how many keys move when a backend leaves or joins, and, with
//! Zipf-distributed keys, how busy the busiest backend gets and how many requests leave their key's home.
//!
//! ```
//! use duet_balance::Affinity;
//!
//! let moved = duet_sim::affinity::moved(10, 20_000, Affinity::maglev());
//! assert!(moved.leave <= 1.1 / 10.0 && moved.join <= 1.1 / 11.0);
//! ```

use crate::random::Random;
use duet_balance::{algo::stable_hash, Affinity, Balancer, LoadGuard, Strategy, Walk};
use serde::Serialize;

/// Shares of keys whose backend changed.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Moved {
    /// Backends before the change.
    pub n: usize,
    /// One of `n` left (its own keys are 1/n of them: Maglev's ideal).
    pub leave: f64,
    /// One joined `n` (its share is 1/(n+1): the ideal).
    pub join: f64,
}

/// Keys moved when one of `n` backends leaves, and when one joins, over `keys` keys, with the table
/// `affinity` builds (a Maglev table or a hash ring).
pub fn moved(n: u32, keys: u64, affinity: Affinity) -> Moved {
    let homes = |members: &[u32]| -> Vec<Option<u32>> {
        let mut balance: Balancer<u32, ()> =
            Balancer::new(Strategy::P2cInflight).with_affinity(affinity);
        for &m in members {
            balance.insert(m, 1, ());
        }
        (0..keys)
            .map(|k| balance.pick_for(Some(stable_hash(&k))).ok().copied())
            .collect()
    };
    let all: Vec<u32> = (0..n).collect();
    let share = |a: &[Option<u32>], b: &[Option<u32>]| {
        a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 / keys as f64
    };
    let before = homes(&all);
    let left = homes(&all[1..]);
    let joined = homes(&(0..=n).collect::<Vec<_>>());
    Moved {
        n: n as usize,
        leave: share(&before, &left),
        join: share(&before, &joined),
    }
}

/// One run of Zipf-keyed requests, `in_flight` at a time, through a keyed balancer.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ZipfReport {
    /// `maglev` or `ring`.
    pub table: &'static str,
    /// `next`, `p2c` or `unbounded`.
    pub walk: &'static str,
    /// The most requests any backend had in flight, over the mean (`in_flight / n`), at worst.
    pub max_over_mean: f64,
    /// The same, averaged over every pick.
    pub mean_max_over_mean: f64,
    /// Requests served by another backend than their key's home (a cache miss, for a cache).
    pub away_from_home: f64,
}

/// `requests` Zipf(`s`)-keyed requests over `keys` keys, with `in_flight` of them held at once (a
/// random one completes before each new one: memoryless service times), through a balancer of `n`
/// backends keyed by `affinity` (its table, bound and walk). Deterministic for `seed`.
pub fn zipf(
    n: u32,
    keys: usize,
    s: f64,
    in_flight: usize,
    requests: usize,
    affinity: Affinity,
    seed: u64,
) -> ZipfReport {
    let mut balance: Balancer<u32, ()> =
        Balancer::with_seed(Strategy::P2cInflight, seed).with_affinity(affinity);
    for m in 0..n {
        balance.insert(m, 1, ());
    }
    let cdf = zipf_cdf(keys, s);
    let hashes: Vec<u64> = (0..keys).map(|k| stable_hash(&k)).collect();
    let mut random = Random::new(seed);
    let mut held: Vec<LoadGuard> = Vec::with_capacity(in_flight);
    let loads: Vec<_> = balance.endpoints().map(|e| e.load.clone()).collect();
    let (mut worst, mut sum, mut measured) = (0.0f64, 0.0, 0usize);
    let mut warm_up = balance.stats();
    for request in 0..requests + in_flight {
        if request == in_flight {
            warm_up = balance.stats();
        }
        if held.len() == in_flight {
            held.swap_remove(random.index(in_flight));
        }
        let u = random.uniform();
        let key = hashes[cdf.partition_point(|&p| p < u).min(keys - 1)];
        if let Ok((_, _, guard)) = balance.pick_and_claim_for(Some(key), &[]) {
            held.push(guard);
        }
        if request >= in_flight {
            let busiest = loads.iter().map(|l| l.in_flight()).max().unwrap_or(0);
            let ratio = busiest as f64 / (held.len() as f64 / f64::from(n));
            worst = worst.max(ratio);
            sum += ratio;
            measured += 1;
        }
    }
    let stats = balance.stats();
    ZipfReport {
        table: affinity.algorithm(),
        walk: match (affinity.bound(), affinity.walk()) {
            (None, _) => "unbounded",
            (Some(_), Walk::Next) => "next",
            (Some(_), _) => "p2c",
        },
        max_over_mean: worst,
        mean_max_over_mean: sum / measured.max(1) as f64,
        away_from_home: (stats.walked - warm_up.walked) as f64
            / (stats.picks - warm_up.picks).max(1) as f64,
    }
}

/// The cumulative distribution of Zipf(`s`) over `keys` ranks.
fn zipf_cdf(keys: usize, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=keys).map(|rank| (rank as f64).powf(-s)).collect();
    let total: f64 = weights.iter().sum();
    weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w / total;
            Some(*acc)
        })
        .collect()
}
