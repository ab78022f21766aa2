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
    /// P2C with memory on the worker's own in-flight counts (duet-balance's `Policy::P2cMemory`): the
    /// last two backends the worker's requests completed on since its last pick are the candidates,
    /// in place of fresh draws.
    P2cMemoryInflight,
    /// P2C with memory on the worker's own PeakEWMA loads.
    P2cMemoryPeakEwma,
    /// Shortest expected delay, sampled: P2C on (in flight + 1) × a plain (not peak) EWMA of the
    /// latency, with the PeakEWMA time constant. Simulator only.
    P2cSed,
    /// P2C with memory on the shortest-expected-delay cost. Simulator only.
    P2cMemorySed,
    /// P2C with memory on the worker's in-flight counts, a tie broken by the lower plain latency EWMA
    /// (in flight + a fraction under one: never against a lower count). Simulator only.
    P2cMemoryTies,
    /// Full scan of the worker's own in-flight counts, as duet-balance's `Policy::LeastLoaded` makes it
    /// under `least_inflight` (`LoadMetric::InFlightThenLatency`): n reads, the minimum wins, equal
    /// counts go to the lower plain latency average, and only exactly equal averages to one draw.
    LeastInflight,
    /// Full scan of the worker's own PeakEWMA loads (`least_peak_ewma`).
    LeastPeakEwma,
    /// Full scan of the worker's in-flight counts, equal minimums drawn at random (nginx's
    /// `least_conn` on one worker's view; duet's `least_inflight` before it ordered ties by latency).
    /// Simulator only.
    LeastInflightDraw,
    /// Full scan of the worker's in-flight counts, equal counts ordered by the PeakEWMA estimate instead
    /// of the plain average. Simulator only: it herds (a peak estimate ranks by the last slow sample).
    LeastInflightPeakTies,
}

impl SimPolicy {
    /// All policies, for `--policy` parsing.
    pub const ALL: [(&'static str, SimPolicy); 15] = [
        ("random", Self::Random),
        ("round_robin", Self::RoundRobin),
        ("least_loaded_stale", Self::LeastLoadedStale),
        ("p2c_stale", Self::P2cStale),
        ("p2c_inflight", Self::P2cInflight),
        ("p2c_peak_ewma", Self::P2cPeakEwma),
        ("p2c_memory_inflight", Self::P2cMemoryInflight),
        ("p2c_memory_peak_ewma", Self::P2cMemoryPeakEwma),
        ("p2c_sed", Self::P2cSed),
        ("p2c_memory_sed", Self::P2cMemorySed),
        ("p2c_memory_ties", Self::P2cMemoryTies),
        ("least_inflight", Self::LeastInflight),
        ("least_peak_ewma", Self::LeastPeakEwma),
        ("least_inflight_draw", Self::LeastInflightDraw),
        ("least_inflight_peak_ties", Self::LeastInflightPeakTies),
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
    /// Arrivals evenly spaced (what the testbed's open-loop client sends) instead of a Poisson stream.
    pub paced: bool,
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
            paced: false,
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
    /// Each backend's share of the requests slower than the p99: where the tail comes from.
    pub tail_shares: Vec<f64>,
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
    /// Plain EWMA of the latency, for the shortest-expected-delay cost.
    smooth: Vec<f64>,
    next_in_turn: usize,
    /// The last two distinct backends this worker's requests completed on since its last pick, latest
    /// first: the memory of the memory policies, kept as duet-balance's guards keep it.
    freed: [Option<usize>; 2],
}

impl Selector {
    /// A request of this worker completed on `backend`.
    fn freed(&mut self, backend: usize) {
        if self.freed[0] != Some(backend) {
            if self.freed[0].is_some() {
                self.freed[1] = self.freed[0];
            }
            self.freed[0] = Some(backend);
        }
    }

    fn in_flight(&self, i: usize) -> f64 {
        f64::from(self.in_flight[i])
    }

    /// PeakEWMA's load, as duet-balance computes it.
    fn peak_ewma(&self, i: usize, now: f64, tau: f64) -> f64 {
        let in_flight = u64::from(self.in_flight[i]);
        let projected = peak_ewma::project(self.ewma[i], now - self.stamp[i], tau, in_flight);
        peak_ewma::load(projected, in_flight)
    }

    /// In flight, ties broken by the plain latency average: `smooth / (1 + smooth)` is under one and
    /// grows with the latency, so it orders equal counts and never outweighs a difference of one.
    fn in_flight_then_latency(&self, i: usize) -> f64 {
        self.in_flight(i) + self.smooth[i] / (1.0 + self.smooth[i])
    }

    /// The load a full-scan `policy` reads of backend `i`.
    fn scanned_load(&self, policy: SimPolicy, weighted: bool, i: usize, now: f64, tau: f64) -> f64 {
        match policy {
            // With weights, duet-balance draws among equal loads by weight, as the plain scan does.
            SimPolicy::LeastInflight if !weighted => self.in_flight_then_latency(i),
            SimPolicy::LeastPeakEwma => self.peak_ewma(i, now, tau),
            SimPolicy::LeastInflightPeakTies => {
                let estimate = self.peak_ewma(i, now, tau);
                self.in_flight(i) + estimate / (1.0 + estimate)
            }
            _ => self.in_flight(i),
        }
    }

    /// Shortest expected delay: (in flight + 1) × the plain latency average.
    fn expected_delay(&self, i: usize) -> f64 {
        self.smooth[i] * f64::from(self.in_flight[i] + 1)
    }
}

/// A full scan, as duet-balance's `Policy::LeastLoaded` makes it: every load read once, divided by
/// weight, the minimum wins; equal minimums are settled by one draw, in proportion to weight; no tie, no
/// draw.
fn scan(
    n: usize,
    p2c: &mut P2c,
    weight: impl Fn(usize) -> f64,
    load: impl Fn(usize) -> f64,
) -> usize {
    let (mut lightest, mut tied) = (f64::INFINITY, Vec::new());
    for i in 0..n {
        let load = load(i) / weight(i);
        if load < lightest {
            (lightest, tied) = (load, vec![i]);
        } else if load == lightest {
            tied.push(i);
        }
    }
    match tied.as_slice() {
        [] => 0,
        [only] => *only,
        many => {
            let total: f64 = many.iter().map(|&i| weight(i)).sum();
            let mut point = (p2c.draw() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let last = many[many.len() - 1];
            many.iter()
                .copied()
                .find(|&i| {
                    point -= weight(i);
                    point < 0.0
                })
                .unwrap_or(last)
        }
    }
}

/// Runs a scenario. Every selection goes through duet-balance's `P2c` (seeded per worker; with memory,
/// `P2c::select_with_memory`) and, for PeakEWMA, its `peak_ewma` arithmetic.
pub fn run(scenario: &Scenario) -> Result<RunReport, String> {
    check(scenario)?;
    let mut sim = Sim::new(scenario);
    let arrival_rate =
        scenario.utilisation * scenario.capacities.iter().sum::<f64>() * scenario.slots as f64;
    let mut times = Vec::with_capacity(scenario.arrivals);
    let warmup = scenario.arrivals / 5;
    let mut now = 0.0f64;
    for k in 0..scenario.arrivals {
        now += if scenario.paced {
            1.0 / arrival_rate
        } else {
            sim.random.exponential(arrival_rate)
        };
        sim.complete_departures(now);
        sim.refresh_view(now);
        let worker = sim.random.index(sim.selectors.len());
        let backend = sim.pick(worker, now)?;
        let departure = sim.admit(worker, backend, now)?;
        if k >= warmup {
            times.push((departure - now, backend));
        }
    }
    Ok(sim.report(times))
}

fn check(scenario: &Scenario) -> Result<(), String> {
    if scenario.capacities.len() < 2
        || scenario.balancers == 0
        || scenario.workers == 0
        || scenario.slots == 0
    {
        return Err("need at least 2 backends, 1 balancer, 1 worker and 1 slot".into());
    }
    if !(0.0..1.5).contains(&scenario.utilisation) || scenario.capacities.iter().any(|&c| c <= 0.0)
    {
        return Err("utilisation must be in [0, 1.5) and capacities positive".into());
    }
    Ok(())
}

/// A departure: (time, worker, backend, arrival time bits).
type Departure = Reverse<(Time, usize, usize, u64)>;

/// A run's state: the backends' queues and slots, and each worker's selector and view.
struct Sim<'a> {
    scenario: &'a Scenario,
    random: Random,
    /// Each worker's P2C draws, seeded apart.
    draws: Vec<P2c>,
    selectors: Vec<Selector>,
    /// The weights' alias table, when `weighted`.
    table: Option<AliasTable>,
    queue: Vec<u32>,
    /// When each slot of each backend is next free. FIFO with k slots: an arrival starts on the slot
    /// that frees first, never before the arrivals queued ahead of it.
    free_at: Vec<Vec<f64>>,
    /// The shared view of the stale policies: `queue` as of the last refresh.
    view: Vec<u32>,
    next_refresh: f64,
    served: Vec<u64>,
    departures: BinaryHeap<Departure>,
    max_queue: u32,
}

impl<'a> Sim<'a> {
    fn new(scenario: &'a Scenario) -> Self {
        let n = scenario.capacities.len();
        let selectors = scenario.balancers * scenario.workers;
        let weights: Vec<u32> = scenario
            .capacities
            .iter()
            .map(|&c| (c * 1000.0).round().max(1.0) as u32)
            .collect();
        Self {
            scenario,
            random: Random::new(scenario.seed),
            draws: (0..selectors)
                .map(|s| {
                    P2c::with_seed(scenario.seed.wrapping_mul(1_000_003).wrapping_add(s as u64))
                })
                .collect(),
            selectors: (0..selectors)
                .map(|s| Selector {
                    in_flight: vec![0; n],
                    ewma: vec![1.0; n],
                    stamp: vec![0.0; n],
                    smooth: vec![1.0; n],
                    next_in_turn: s,
                    freed: [None, None],
                })
                .collect(),
            table: scenario.weighted.then(|| AliasTable::new(&weights)),
            queue: vec![0; n],
            free_at: vec![vec![0.0; scenario.slots]; n],
            view: vec![0; n],
            next_refresh: 0.0,
            served: vec![0; n],
            departures: BinaryHeap::new(),
            max_queue: 0,
        }
    }

    /// Completes every request that departs by `now`, feeding each worker's PeakEWMA.
    fn complete_departures(&mut self, now: f64) {
        while self
            .departures
            .peek()
            .is_some_and(|Reverse((t, ..))| t.0 <= now)
        {
            let Some(Reverse((Time(t), s, b, started_bits))) = self.departures.pop() else {
                break;
            };
            self.queue[b] -= 1;
            let selector = &mut self.selectors[s];
            selector.in_flight[b] -= 1;
            selector.freed(b);
            let rtt = t - f64::from_bits(started_bits);
            let w = (-(t - selector.stamp[b]) / self.scenario.ewma_decay).exp();
            selector.smooth[b] = selector.smooth[b] * w + rtt * (1.0 - w);
            selector.ewma[b] = peak_ewma::update(
                selector.ewma[b],
                rtt,
                t - selector.stamp[b],
                self.scenario.ewma_decay,
            );
            selector.stamp[b] = t;
        }
    }

    /// Copies the queues into the shared view once every `staleness`.
    fn refresh_view(&mut self, now: f64) {
        if now >= self.next_refresh {
            self.view.copy_from_slice(&self.queue);
            self.next_refresh = if self.scenario.staleness > 0.0 {
                now + self.scenario.staleness
            } else {
                now
            };
        }
    }

    /// The backend worker `s` picks under the scenario's policy.
    fn pick(&mut self, s: usize, now: f64) -> Result<usize, String> {
        let Self {
            scenario,
            draws,
            selectors,
            table,
            view,
            ..
        } = self;
        let n = scenario.capacities.len();
        let (p2c, selector) = (&mut draws[s], &mut selectors[s]);
        let weight_of = |i: usize| {
            if scenario.weighted {
                scenario.capacities[i]
            } else {
                1.0
            }
        };
        // The memory policies take what the worker remembers, as `Policy::P2cMemory` does, and ignore
        // it where it does (weights differ).
        let remembered = match scenario.policy {
            SimPolicy::P2cMemoryInflight
            | SimPolicy::P2cMemoryPeakEwma
            | SimPolicy::P2cMemorySed
            | SimPolicy::P2cMemoryTies
                if table.is_none() =>
            {
                std::mem::take(&mut selector.freed)
            }
            _ => [None, None],
        };
        let mut compare = |load: &dyn Fn(usize) -> f64| -> Result<usize, String> {
            let selection = match table {
                Some(table) => p2c.select_weighted(table, |i| load(i) / weight_of(i)),
                None => p2c.select_with_memory(n, remembered, load),
            };
            selection.map(|s| s.chosen).map_err(|e| e.to_string())
        };
        let tau = scenario.ewma_decay;
        Ok(match scenario.policy {
            SimPolicy::Random => match table {
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
            SimPolicy::P2cInflight | SimPolicy::P2cMemoryInflight => {
                compare(&|i| selector.in_flight(i))?
            }
            SimPolicy::P2cPeakEwma | SimPolicy::P2cMemoryPeakEwma => {
                compare(&|i| selector.peak_ewma(i, now, tau))?
            }
            SimPolicy::P2cSed | SimPolicy::P2cMemorySed => {
                compare(&|i| selector.expected_delay(i))?
            }
            SimPolicy::P2cMemoryTies => compare(&|i| selector.in_flight_then_latency(i))?,
            SimPolicy::LeastInflight
            | SimPolicy::LeastInflightDraw
            | SimPolicy::LeastPeakEwma
            | SimPolicy::LeastInflightPeakTies => {
                let (policy, weighted) = (scenario.policy, scenario.weighted);
                scan(n, p2c, weight_of, |i| {
                    selector.scanned_load(policy, weighted, i, now, tau)
                })
            }
        })
    }

    /// Queues worker `s`'s request on `backend`; returns when it departs.
    fn admit(&mut self, s: usize, backend: usize, now: f64) -> Result<f64, String> {
        self.selectors[s].in_flight[backend] += 1;
        self.queue[backend] += 1;
        self.served[backend] += 1;
        self.max_queue = self.max_queue.max(self.queue[backend]);
        let slow = match self.scenario.degrade_at {
            Some(at) if backend == 0 && now >= at => self.scenario.degrade_factor,
            _ => 1.0,
        };
        let slot = self.free_at[backend]
            .iter_mut()
            .min_by(|a, b| a.total_cmp(b))
            .ok_or("a backend without slots")?;
        let start = slot.max(now);
        let departure = start + self.random.exponential(self.scenario.capacities[backend]) * slow;
        *slot = departure;
        self.departures
            .push(Reverse((Time(departure), s, backend, now.to_bits())));
        Ok(departure)
    }

    /// The report, from each request measured after the warm-up: its time in system and its backend.
    fn report(&self, mut timed: Vec<(f64, usize)>) -> RunReport {
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let times: Vec<f64> = timed.iter().map(|t| t.0).collect();
        let quantile = |q: f64| {
            times
                .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        let p99 = quantile(0.99);
        let mut tail = vec![0u64; self.served.len()];
        for &(_, backend) in timed.iter().filter(|t| t.0 > p99) {
            tail[backend] += 1;
        }
        let slow = tail.iter().sum::<u64>().max(1) as f64;
        let total: u64 = self.served.iter().sum();
        RunReport {
            policy: self.scenario.policy,
            staleness: self.scenario.staleness,
            mean: times.iter().sum::<f64>() / times.len().max(1) as f64,
            p50: quantile(0.5),
            p99,
            p999: quantile(0.999),
            max_queue: self.max_queue,
            tail_shares: tail.iter().map(|&t| t as f64 / slow).collect(),
            shares: self
                .served
                .iter()
                .map(|&s| s as f64 / total.max(1) as f64)
                .collect(),
        }
    }
}
