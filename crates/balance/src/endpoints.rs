//! The endpoint set: membership, eligibility, weights with slow start, panic mode, and the
//! [`Candidates`] they come to. Everything here changes off the request path and costs O(n); a pick only
//! reads the candidates.

use crate::{
    candidates::Candidates,
    clock::Clock,
    load::{ColdStart, DefaultRtt, EndpointLoad, LoadMetric, PeakEwmaConfig},
};
use std::{collections::HashMap, hash::Hash, sync::Arc, time::Duration};
use tokio::time::Instant;

/// A read-only view of one endpoint.
#[derive(Debug)]
pub(crate) struct EndpointView<'a, K> {
    pub(crate) key: &'a K,
    pub(crate) weight: u32,
    pub(crate) load: &'a Arc<EndpointLoad>,
}

pub(crate) struct Endpoint<K, S> {
    pub(crate) key: K,
    weight: u32,
    /// When it last became eligible, for slow start.
    admitted: Instant,
    pub(crate) service: S,
    pub(crate) load: Arc<EndpointLoad>,
}

/// How often ramping weights are recomputed during slow start.
const RAMP_STEP: Duration = Duration::from_millis(250);

/// A balancer's endpoints, keyed by `K`, and the candidates of its next pick.
pub(crate) struct EndpointSet<K, S> {
    endpoints: Vec<Endpoint<K, S>>,
    index: HashMap<K, usize>,
    candidates: Candidates,
    /// Below this fraction of eligible endpoints, every endpoint of non-zero weight is a candidate.
    panic_threshold: f64,
    panicking: bool,
    slow_start: Option<Duration>,
    /// While an endpoint is ramping up, when to recompute the ramped weights next.
    next_ramp_step: Option<Instant>,
    /// What the endpoints' load states measure, and on which clock (slow start follows tokio's clock
    /// instead: `admitted`, `next_ramp_step`).
    metric: LoadMetric,
    clock: Clock,
    /// The estimate of the endpoints that have not answered yet, learnt from the pool's first answers.
    cold: Arc<ColdStart>,
}

/// What a pick and a load reading need, whatever the key.
impl<K, S> EndpointSet<K, S> {
    /// The candidates as last built.
    #[inline]
    pub(crate) fn candidates(&self) -> &Candidates {
        &self.candidates
    }

    /// The endpoint at `position`.
    #[inline]
    pub(crate) fn at(&self, position: usize) -> &Endpoint<K, S> {
        &self.endpoints[position]
    }

    /// The endpoint at `position`, to call its service.
    #[inline]
    pub(crate) fn at_mut(&mut self, position: usize) -> &mut Endpoint<K, S> {
        &mut self.endpoints[position]
    }

    /// Number of endpoints, eligible or not.
    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The keys, in insertion order (removal may reorder).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.endpoints.iter().map(|e| &e.key)
    }

    /// What the endpoints' loads measure.
    #[inline]
    pub(crate) fn metric(&self) -> &LoadMetric {
        &self.metric
    }

    /// The clock latency is measured on.
    #[inline]
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }
}

impl<K, S> EndpointSet<K, S>
where
    K: Hash + Eq + Clone,
{
    /// An empty set whose endpoints' loads measure `metric`.
    pub(crate) fn new(metric: LoadMetric) -> Self {
        Self {
            endpoints: Vec::new(),
            index: HashMap::new(),
            candidates: Candidates::default(),
            panic_threshold: 0.0,
            panicking: false,
            slow_start: None,
            next_ramp_step: None,
            cold: Arc::new(ColdStart::new(&metric)),
            metric,
            clock: Clock::new(),
        }
    }

    /// See `Balancer::with_panic_threshold`.
    pub(crate) fn set_panic_threshold(&mut self, fraction: f64) {
        self.panic_threshold = fraction.clamp(0.0, 1.0);
        self.rebuild();
    }

    /// See `Balancer::with_slow_start`.
    pub(crate) fn set_slow_start(&mut self, window: Duration) {
        self.slow_start = (!window.is_zero()).then_some(window);
    }

    /// Moves every endpoint's load state to `clock`, keeping its estimate and eligibility.
    pub(crate) fn set_clock(&mut self, clock: Clock) {
        for endpoint in &mut self.endpoints {
            let estimate = endpoint
                .load
                .is_measured()
                .then(|| endpoint.load.rtt_estimate());
            let load =
                EndpointLoad::starting(clock.clone(), &self.metric, estimate, self.cold.clone());
            load.set_eligible(endpoint.load.is_eligible());
            endpoint.load = Arc::new(load);
        }
        self.clock = clock;
    }

    /// Measures latency with `config` under a metric that measures it: the endpoints' load states are
    /// made again with it (as [`set_clock`](Self::set_clock) does), keeping their estimates.
    pub(crate) fn set_latency_config(&mut self, config: PeakEwmaConfig) {
        if self.metric.set_latency_config(config) {
            self.cold = Arc::new(ColdStart::new(&self.metric));
            self.set_clock(self.clock.clone());
        }
    }

    /// See `Balancer::insert`.
    pub(crate) fn insert(&mut self, key: K, weight: u32, service: S) -> Option<S> {
        if let Some(&at) = self.index.get(&key) {
            let endpoint = &mut self.endpoints[at];
            endpoint.weight = weight;
            let old = std::mem::replace(&mut endpoint.service, service);
            self.rebuild();
            return Some(old);
        }
        let start = self.initial_rtt();
        let load = Arc::new(EndpointLoad::starting(
            self.clock.clone(),
            &self.metric,
            start,
            self.cold.clone(),
        ));
        self.index.insert(key.clone(), self.endpoints.len());
        self.endpoints.push(Endpoint {
            key,
            weight,
            admitted: Instant::now(),
            service,
            load,
        });
        self.rebuild();
        None
    }

    /// See `Balancer::remove`. Positions move: the last endpoint takes the removed one's.
    pub(crate) fn remove(&mut self, key: &K) -> Option<S> {
        let at = self.index.remove(key)?;
        let removed = self.endpoints.swap_remove(at);
        if let Some(moved) = self.endpoints.get(at) {
            self.index.insert(moved.key.clone(), at);
        }
        self.rebuild();
        Some(removed.service)
    }

    /// See `Balancer::set_eligible`.
    pub(crate) fn set_eligible(&mut self, key: &K, eligible: bool) -> Option<bool> {
        let &at = self.index.get(key)?;
        let was = self.endpoints[at].load.is_eligible();
        if was != eligible {
            if eligible {
                // Re-admitted: start from the pool's median estimate, neither the stale penalty that
                // would starve it nor an idle-looking zero that would stampede it; unmeasured (the
                // cold-start estimate until its next answer) if no other endpoint has answered yet.
                let median = self.median_rtt(Some(at));
                let endpoint = &mut self.endpoints[at];
                endpoint.admitted = Instant::now();
                if self.metric.uses_clock() {
                    endpoint.load.reset_estimate(median);
                }
            }
            self.endpoints[at].load.set_eligible(eligible);
            self.rebuild();
        }
        Some(was)
    }

    /// See `Balancer::set_weight`.
    pub(crate) fn set_weight(&mut self, key: &K, weight: u32) -> bool {
        let Some(&at) = self.index.get(key) else {
            return false;
        };
        if self.endpoints[at].weight != weight {
            self.endpoints[at].weight = weight;
            self.rebuild();
        }
        true
    }

    /// Brings the ramped weights up to date before a pick: a step every [`RAMP_STEP`] while an endpoint
    /// ramps up, one comparison otherwise.
    #[inline]
    pub(crate) fn refresh(&mut self) {
        if let Some(step) = self.next_ramp_step {
            if Instant::now() >= step {
                self.rebuild();
            }
        }
    }

    /// The position of the endpoint with this key.
    #[inline]
    pub(crate) fn position(&self, key: &K) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// The endpoints, in insertion order (removal may reorder).
    pub(crate) fn views(&self) -> impl Iterator<Item = EndpointView<'_, K>> {
        self.endpoints.iter().map(|e| EndpointView {
            key: &e.key,
            weight: e.weight,
            load: &e.load,
        })
    }

    /// Whether the set is in panic mode.
    pub(crate) fn is_panicking(&self) -> bool {
        self.panicking
    }

    /// A new endpoint's estimate: the median of the measured ones under [`DefaultRtt::PoolMedian`]
    /// (a warm pool); otherwise `None`, unmeasured: the pool's [`ColdStart`] estimate until its first
    /// answer replaces it (a cold pool, or a fixed start).
    fn initial_rtt(&self) -> Option<Duration> {
        match self.metric.latency_config()?.default_rtt {
            DefaultRtt::Fixed(_) => None,
            DefaultRtt::PoolMedian => self.median_rtt(None),
        }
    }

    /// The median latency estimate of the measured eligible endpoints (of all measured endpoints if
    /// none is eligible), leaving out `except`. Estimates no answer has confirmed yet are guesses, not
    /// the pool's latency: a median of them would hand a newcomer the guess without its replacement.
    fn median_rtt(&self, except: Option<usize>) -> Option<Duration> {
        let others = || {
            self.endpoints
                .iter()
                .enumerate()
                .filter(|(at, e)| Some(*at) != except && e.load.is_measured())
        };
        let mut estimates: Vec<Duration> = others()
            .filter(|(_, e)| e.load.is_eligible())
            .map(|(_, e)| e.load.rtt_estimate())
            .collect();
        if estimates.is_empty() {
            estimates = others().map(|(_, e)| e.load.rtt_estimate()).collect();
        }
        if estimates.is_empty() {
            return None;
        }
        estimates.sort_unstable();
        let mid = estimates.len() / 2;
        Some(if estimates.len() % 2 == 1 {
            estimates[mid]
        } else {
            (estimates[mid - 1] + estimates[mid]) / 2
        })
    }

    /// Decides the candidates: eligibility (or panic mode) first, then each one's weight as slow start
    /// has ramped it by now.
    fn rebuild(&mut self) {
        let now = Instant::now();
        let pickable = self.endpoints.iter().filter(|e| e.weight > 0).count();
        let eligible = self
            .endpoints
            .iter()
            .filter(|e| e.load.is_eligible() && e.weight > 0)
            .count();
        self.panicking = pickable > 0 && (eligible as f64) < self.panic_threshold * pickable as f64;
        let panicking = self.panicking;
        let positions: Vec<usize> = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| (e.load.is_eligible() || panicking) && e.weight > 0)
            .map(|(at, _)| at)
            .collect();
        let weights: Vec<u32> = positions
            .iter()
            .map(|&at| self.ramped_thousandths(&self.endpoints[at], now))
            .collect();
        let ramping = positions
            .iter()
            .any(|&at| self.ramp(&self.endpoints[at], now) < 1.0);
        self.next_ramp_step = ramping.then(|| now + RAMP_STEP);
        let generation = self.candidates.generation().wrapping_add(1);
        self.candidates = Candidates::new(positions, &weights, self.endpoints.len(), generation);
    }

    /// How far into its slow-start window `endpoint` is: 1/10 at admission, growing linearly to 1.
    fn ramp(&self, endpoint: &Endpoint<K, S>, now: Instant) -> f64 {
        match self.slow_start {
            Some(window) => {
                let elapsed = now.saturating_duration_since(endpoint.admitted);
                (elapsed.as_secs_f64() / window.as_secs_f64()).clamp(0.1, 1.0)
            }
            None => 1.0,
        }
    }

    /// `endpoint`'s weight as ramped now, kept to 1/1000 of a unit.
    fn ramped_thousandths(&self, endpoint: &Endpoint<K, S>, now: Instant) -> u32 {
        (f64::from(endpoint.weight) * 1000.0 * self.ramp(endpoint, now))
            .round()
            .max(1.0) as u32
    }
}
