//! The general model: K balancer instances of W workers each, every worker a selector with its own
//! local view, in front of n FIFO backends with exponential service (heterogeneous capacity, one or more
//! request slots sharing each backend's queue, optional degradation at a given time). Arrivals are
//! Poisson and land on a random worker.

use crate::random::Random;
use duet_balance::algo::{peak_ewma, AliasTable, P2c};
use serde::Serialize;
use std::{cmp::Reverse, collections::BinaryHeap};

/// How a worker picks a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SimPolicy {
    /// Uniform (or weight-proportional) random.
    Random,
    /// Each backend in turn, per worker.
    RoundRobin,
    /// The backend with the shortest queue in a shared view refreshed every `staleness`.
    LeastLoadedStale,
    /// P2C on the same stale shared view.
    P2cStale,
    /// P2C on the worker's own in-flight counts (duet's design: no shared state).
    P2cInflight,
    /// P2C on the worker's own PeakEWMA estimates × (in flight + 1).
    P2cPeakEwma,
}

impl SimPolicy {
    /// All policies, for `--policy` parsing.
    pub const ALL: [(&'static str, SimPolicy); 6] = [
        ("random", Self::Random),
        ("round_robin", Self::RoundRobin),
        ("least_loaded_stale", Self::LeastLoadedStale),
        ("p2c_stale", Self::P2cStale),
        ("p2c_inflight", Self::P2cInflight),
        ("p2c_peak_ewma", Self::P2cPeakEwma),
    ];

    /// The policy's name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("?", |(n, _)| n)
    }
}

/// One simulated setup.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// Independent balancer instances (e.g. duet pods).
    pub balancers: usize,
    /// Workers per instance, each with its own view.
    pub workers: usize,
    /// Service rate of each of a backend's slots (1.0 = mean service time 1). Also its weight when
    /// `weighted`.
    pub capacities: Vec<f64>,
    /// Requests each backend serves at once; the rest wait in its FIFO queue (M/M/k per backend).
    pub slots: usize,
    /// Offered load as a fraction of total capacity.
    pub utilisation: f64,
    /// Requests to simulate (the first 20% are warm-up).
    pub arrivals: usize,
    /// Refresh period of the shared view (stale policies).
    pub staleness: f64,
    /// Backend 0 serves `degrade_factor` times slower from `degrade_at` on.
    pub degrade_at: Option<f64>,
    /// Slow-down factor of the degraded backend.
    pub degrade_factor: f64,
    /// Pass capacities to the selector as weights.
    pub weighted: bool,
    /// PeakEWMA time constant, in service-time units.
    pub ewma_decay: f64,
    /// Policy.
    pub policy: SimPolicy,
    /// Seed.
    pub seed: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            balancers: 1,
            workers: 1,
            capacities: vec![1.0; 10],
            slots: 1,
            utilisation: 0.8,
            arrivals: 200_000,
            staleness: 0.0,
            degrade_at: None,
            degrade_factor: 10.0,
            weighted: false,
            ewma_decay: 10.0,
            policy: SimPolicy::P2cInflight,
            seed: 1,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Policy.
    pub policy: SimPolicy,
    /// Shared-view staleness.
    pub staleness: f64,
    /// Mean time in system.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// The longest queue seen at any backend.
    pub max_queue: u32,
    /// Share of requests each backend received.
    pub shares: Vec<f64>,
}

/// A simulation time, totally ordered for the event heap.
#[derive(PartialEq)]
struct Time(f64);
impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// One worker's local view. Its P2C selector is kept apart so a selection can read the view.
struct Selector {
    in_flight: Vec<u32>,
    ewma: Vec<f64>,
    stamp: Vec<f64>,
    next_in_turn: usize,
}

/// Runs a scenario. Every selection goes through duet-balance's `P2c` (seeded per worker) and, for
/// PeakEWMA, its `peak_ewma` arithmetic.
pub fn run(scenario: &Scenario) -> Result<RunReport, String> {
    let n = scenario.capacities.len();
    if n < 2 || scenario.balancers == 0 || scenario.workers == 0 || scenario.slots == 0 {
        return Err("need at least 2 backends, 1 balancer, 1 worker and 1 slot".into());
    }
    if !(0.0..1.5).contains(&scenario.utilisation) || scenario.capacities.iter().any(|&c| c <= 0.0)
    {
        return Err("utilisation must be in [0, 1.5) and capacities positive".into());
    }
    let mut random = Random::new(scenario.seed);
    let selectors_count = scenario.balancers * scenario.workers;
    let mut draws: Vec<P2c> = (0..selectors_count)
        .map(|s| P2c::with_seed(scenario.seed.wrapping_mul(1_000_003).wrapping_add(s as u64)))
        .collect();
    let mut selectors: Vec<Selector> = (0..selectors_count)
        .map(|s| Selector {
            in_flight: vec![0; n],
            ewma: vec![1.0; n],
            stamp: vec![0.0; n],
            next_in_turn: s,
        })
        .collect();
    let weights: Vec<u32> = scenario
        .capacities
        .iter()
        .map(|&c| (c * 1000.0).round().max(1.0) as u32)
        .collect();
    let table = scenario.weighted.then(|| AliasTable::new(&weights));
    let total_capacity = scenario.capacities.iter().sum::<f64>() * scenario.slots as f64;
    let arrival_rate = scenario.utilisation * total_capacity;

    let mut queue = vec![0u32; n];
    // When each slot of each backend is next free. FIFO with k slots: an arrival starts on the slot
    // that frees first, never before the arrivals queued ahead of it.
    let mut free_at = vec![vec![0.0f64; scenario.slots]; n];
    let mut view = vec![0u32; n];
    let mut next_refresh = 0.0f64;
    let mut served = vec![0u64; n];
    // (departure time, worker, backend, arrival time bits)
    let mut departures: BinaryHeap<Reverse<(Time, usize, usize, u64)>> = BinaryHeap::new();
    let mut times = Vec::with_capacity(scenario.arrivals);
    let warmup = scenario.arrivals / 5;
    let (mut now, mut max_queue) = (0.0f64, 0u32);

    for k in 0..scenario.arrivals {
        now += random.exponential(arrival_rate);
        while departures.peek().is_some_and(|Reverse((t, ..))| t.0 <= now) {
            let Some(Reverse((Time(t), s, b, started_bits))) = departures.pop() else {
                break;
            };
            queue[b] -= 1;
            let selector = &mut selectors[s];
            selector.in_flight[b] -= 1;
            let rtt = t - f64::from_bits(started_bits);
            selector.ewma[b] = peak_ewma::update(
                selector.ewma[b],
                rtt,
                t - selector.stamp[b],
                scenario.ewma_decay,
            );
            selector.stamp[b] = t;
        }
        if now >= next_refresh {
            view.copy_from_slice(&queue);
            next_refresh = if scenario.staleness > 0.0 {
                now + scenario.staleness
            } else {
                now
            };
        }
        let s = random.index(selectors_count);
        let (p2c, selector) = (&mut draws[s], &mut selectors[s]);
        let weight_of = |i: usize| {
            if scenario.weighted {
                scenario.capacities[i]
            } else {
                1.0
            }
        };
        let mut compare = |load: &dyn Fn(usize) -> f64| -> Result<usize, String> {
            let selection = match &table {
                Some(table) => p2c.select_weighted(table, |i| load(i) / weight_of(i)),
                None => p2c.select(n, load),
            };
            selection.map(|s| s.chosen).map_err(|e| e.to_string())
        };
        let backend = match scenario.policy {
            SimPolicy::Random => match &table {
                Some(table) => table.sample(p2c.draw()),
                None => (p2c.draw() % n as u64) as usize,
            },
            SimPolicy::RoundRobin => {
                selector.next_in_turn = (selector.next_in_turn + 1) % n;
                selector.next_in_turn
            }
            SimPolicy::LeastLoadedStale => {
                // Ties are broken at random, or every worker would also agree on the first index.
                let min = view.iter().copied().min().unwrap_or(0);
                let ties: Vec<usize> = (0..n).filter(|&i| view[i] == min).collect();
                ties[(p2c.draw() % ties.len() as u64) as usize]
            }
            SimPolicy::P2cStale => compare(&|i| f64::from(view[i]))?,
            SimPolicy::P2cInflight => compare(&|i| f64::from(selector.in_flight[i]))?,
            SimPolicy::P2cPeakEwma => compare(&|i| {
                peak_ewma::load(
                    peak_ewma::project(
                        selector.ewma[i],
                        now - selector.stamp[i],
                        scenario.ewma_decay,
                        u64::from(selector.in_flight[i]),
                    ),
                    u64::from(selector.in_flight[i]),
                )
            })?,
        };
        let selector = &mut selectors[s];
        selector.in_flight[backend] += 1;
        queue[backend] += 1;
        served[backend] += 1;
        max_queue = max_queue.max(queue[backend]);
        let slow = match scenario.degrade_at {
            Some(at) if backend == 0 && now >= at => scenario.degrade_factor,
            _ => 1.0,
        };
        let slot = free_at[backend]
            .iter_mut()
            .min_by(|a, b| a.total_cmp(b))
            .ok_or("a backend without slots")?;
        let start = slot.max(now);
        let departure = start + random.exponential(scenario.capacities[backend]) * slow;
        *slot = departure;
        departures.push(Reverse((Time(departure), s, backend, now.to_bits())));
        if k >= warmup {
            times.push(departure - now);
        }
    }
    times.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        times
            .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    let total: u64 = served.iter().sum();
    Ok(RunReport {
        policy: scenario.policy,
        staleness: scenario.staleness,
        mean: times.iter().sum::<f64>() / times.len().max(1) as f64,
        p50: quantile(0.5),
        p99: quantile(0.99),
        p999: quantile(0.999),
        max_queue,
        shares: served
            .iter()
            .map(|&s| s as f64 / total.max(1) as f64)
            .collect(),
    })
}
