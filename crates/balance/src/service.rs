use crate::{
    alias::AliasTable,
    clock::Clock,
    draw::Draws,
    error::{BoxError, NoEligibleEndpoint, NotReady},
    future::ResponseFuture,
    guard::LoadGuard,
    load::{DefaultRtt, EndpointLoad, LoadMetric, FALLBACK_RTT},
    p2c::{P2c, Selection},
};
use std::{
    collections::HashMap,
    fmt,
    hash::Hash,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower::load::{CompleteOnResponse, TrackCompletion};
use tower_service::Service;

/// How a [`Balance`] chooses among its eligible endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Power of two choices on the configured [`LoadMetric`]. The product.
    #[default]
    P2c,
    /// Each eligible endpoint in turn, ignoring load, in proportion to weight (smooth weighted round
    /// robin). A baseline for benchmarks.
    RoundRobin,
    /// One uniformly random (or weight-proportional) endpoint, ignoring load. A baseline.
    Random,
}

/// Counters of a balancer's selections, for telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PickStats {
    /// Endpoints picked.
    pub picks: u64,
    /// Loads read to make those picks (exactly two per P2C pick among two or more endpoints).
    pub load_reads: u64,
    /// Picks decided by a coin flip between equal loads.
    pub ties: u64,
    /// Picks where both candidates had zero load: too little concurrency for the metric to mean much.
    pub both_zero: u64,
    /// Requests refused because no endpoint was eligible.
    pub no_eligible: u64,
    /// Endpoints removed because their service's `poll_ready` failed (tower's balancer evicts them too:
    /// a service whose readiness fails is closed for good, e.g. a dropped connection).
    pub evicted: u64,
    /// Picks given up because the endpoint's service was not ready, and made again elsewhere.
    pub repicks: u64,
}

/// One P2C comparison, as passed to an observer set with [`Balance::with_observer`].
#[derive(Debug, Clone, Copy)]
pub struct PickEvent<'a, K> {
    /// The two candidates in draw order, with the (weight-normalised) loads they were compared at.
    pub candidates: [(&'a K, f64); 2],
    /// The winner.
    pub chosen: &'a K,
    /// The loads were equal and a coin flip decided.
    pub tie: bool,
    /// Both loads were zero.
    pub both_zero: bool,
}

type Observer<K> = Arc<dyn Fn(&PickEvent<'_, K>) + Send + Sync>;

/// A read-only view of one endpoint.
#[derive(Debug)]
pub struct EndpointView<'a, K> {
    /// Its key.
    pub key: &'a K,
    /// Its weight.
    pub weight: u32,
    /// Whether it was marked eligible (it also needs a non-zero weight to be picked).
    pub eligible: bool,
    /// Its load state in this balancer.
    pub load: &'a Arc<EndpointLoad>,
}

struct Endpoint<K, S> {
    key: K,
    weight: u32,
    /// When it last became eligible, for slow start.
    admitted: Instant,
    service: S,
    load: Arc<EndpointLoad>,
}

enum Ready {
    None,
    /// Picked and ready; with the pick's clock reading when the metric uses latency, reused as the
    /// request's start (one clock read saved per request).
    Endpoint(usize, Option<u64>),
    NoEligible,
}

/// A tower [`Service`] that sends each request to one of its endpoints, chosen by power of two choices.
///
/// `K` keys an endpoint (e.g. its address): updates that keep a key keep its load state. `S` is the
/// endpoint's service. `C` decides when a request stops counting as load: [`CompleteOnResponse`] for any
/// response type, [`CompleteOnBodyEnd`](crate::CompleteOnBodyEnd) for HTTP responses.
///
/// Each instance owns its state; two balancers share nothing. Membership changes
/// ([`insert`](Self::insert), [`remove`](Self::remove), [`set_eligible`](Self::set_eligible),
/// [`set_weight`](Self::set_weight)) apply at once and cost O(n); a pick costs O(1).
pub struct Balance<K, S, C = CompleteOnResponse> {
    endpoints: Vec<Endpoint<K, S>>,
    index: HashMap<K, usize>,
    /// Dense list of pickable endpoint positions.
    eligible: Vec<usize>,
    /// Weights of `eligible`, and the table to draw from them, when they are not all equal.
    weighted: Option<Weights>,
    /// Below this fraction of eligible endpoints, every endpoint of non-zero weight is a candidate.
    panic_threshold: f64,
    panicking: bool,
    slow_start: Option<Duration>,
    /// While an endpoint is ramping up, when to recompute the ramped weights next.
    next_ramp_step: Option<Instant>,
    policy: Policy,
    metric: LoadMetric,
    p2c: P2c,
    next_in_turn: usize,
    completion: C,
    /// Latency is measured on it; slow start follows tokio's clock (`admitted`, `next_ramp_step`).
    clock: Clock,
    stats: PickStats,
    observer: Option<Observer<K>>,
    /// Set by [`Balance::with_service_load`]: P2C compares the endpoints' own `Load` instead of the
    /// metric's.
    service_load: Option<fn(&S) -> f64>,
    ready: Ready,
}

// === impl Balance ===

impl<K, S> Balance<K, S, CompleteOnResponse>
where
    K: Hash + Eq + Clone,
{
    /// An empty balancer using `metric`, with its generator seeded from the operating system.
    pub fn new(metric: LoadMetric) -> Self {
        Self::with_draws(metric, Draws::from_os())
    }

    /// An empty balancer with reproducible draws. For tests and simulation; see [`Draws`].
    pub fn with_seed(metric: LoadMetric, seed: u64) -> Self {
        Self::with_draws(metric, Draws::with_seed(seed))
    }

    /// An empty balancer drawing from `draws`.
    pub fn with_draws(metric: LoadMetric, draws: Draws) -> Self {
        Self {
            endpoints: Vec::new(),
            index: HashMap::new(),
            eligible: Vec::new(),
            weighted: None,
            panic_threshold: 0.0,
            panicking: false,
            slow_start: None,
            next_ramp_step: None,
            policy: Policy::P2c,
            metric,
            p2c: P2c::with_draws(draws),
            next_in_turn: 0,
            completion: CompleteOnResponse::default(),
            clock: Clock::new(),
            stats: PickStats::default(),
            observer: None,
            service_load: None,
            ready: Ready::None,
        }
    }
}

impl<K, S, C> Balance<K, S, C>
where
    K: Hash + Eq + Clone,
{
    /// Uses `completion` to decide when a request stops counting as load.
    pub fn with_completion<C2>(self, completion: C2) -> Balance<K, S, C2> {
        Balance {
            endpoints: self.endpoints,
            index: self.index,
            eligible: self.eligible,
            weighted: self.weighted,
            panic_threshold: self.panic_threshold,
            panicking: self.panicking,
            slow_start: self.slow_start,
            next_ramp_step: self.next_ramp_step,
            policy: self.policy,
            metric: self.metric,
            p2c: self.p2c,
            next_in_turn: self.next_in_turn,
            completion,
            clock: self.clock,
            stats: self.stats,
            observer: self.observer,
            service_load: self.service_load,
            ready: Ready::None,
        }
    }

    /// Compares endpoints on their services' own [`tower::load::Load`] instead of the balancer's
    /// [`LoadMetric`]: the open end of the metrics, for endpoints that know their load better (a
    /// connection pool's queue, a server-reported utilisation, a nested balancer). Two loads are still
    /// read per pick and the lighter wins; the balancer keeps counting in flight and latency (for
    /// [`EndpointLoad`] readers) whatever it compares. Weights divide nothing here: a service's own load
    /// is taken as already relative to its capacity.
    pub fn with_service_load(mut self) -> Self
    where
        S: tower::load::Load,
        S::Metric: Into<f64>,
    {
        self.service_load = Some(|service: &S| service.load().into());
        self
    }

    /// Chooses with `policy` instead of P2C (baselines for comparison).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Panic mode: when fewer than `fraction` (0.0–1.0) of the endpoints with non-zero weight are
    /// eligible, picks among all of them instead, eligible or not. Health information that rules out most
    /// of a pool is more often wrong (a network partition between checker and backends) than true, and
    /// serving through it beats answering every request with an error. With 0.0 (the default) the
    /// balancer never panics and answers [`NoEligibleEndpoint`] when nothing is eligible; Envoy's
    /// default is 0.5.
    pub fn with_panic_threshold(mut self, fraction: f64) -> Self {
        self.panic_threshold = fraction.clamp(0.0, 1.0);
        self.rebuild();
        self
    }

    /// Slow start: an endpoint that is added or re-admitted takes `window` to reach its full weight,
    /// starting at a tenth of it and growing linearly, so a recovering backend is not stampeded.
    pub fn with_slow_start(mut self, window: Duration) -> Self {
        self.slow_start = (!window.is_zero()).then_some(window);
        self
    }

    /// Measures latency on `clock` (a [`Clock::mock`] in tests and simulations). Endpoints already
    /// added move to it keeping their estimates.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        for endpoint in &mut self.endpoints {
            let estimate = endpoint.load.rtt_estimate();
            let load = EndpointLoad::new(clock.clone(), &self.metric, estimate);
            load.set_eligible(endpoint.load.is_eligible());
            endpoint.load = Arc::new(load);
        }
        self.ready = Ready::None;
        self.clock = clock;
        self
    }

    /// Whether the balancer is in panic mode (see [`with_panic_threshold`](Self::with_panic_threshold)).
    pub fn is_panicking(&self) -> bool {
        self.panicking
    }

    /// Calls `observer` after every P2C comparison with the two candidates, their loads and the winner.
    /// It runs on the request path: keep it to a few counter updates.
    pub fn with_observer(
        mut self,
        observer: impl Fn(&PickEvent<'_, K>) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Adds an endpoint, or replaces the service and weight of the endpoint with this key while keeping
    /// its load state and eligibility. Returns the replaced service.
    pub fn insert(&mut self, key: K, weight: u32, service: S) -> Option<S> {
        if let Some(&at) = self.index.get(&key) {
            let endpoint = &mut self.endpoints[at];
            endpoint.weight = weight;
            let old = std::mem::replace(&mut endpoint.service, service);
            self.rebuild();
            return Some(old);
        }
        let now = Instant::now();
        let initial = self.initial_rtt();
        let load = Arc::new(EndpointLoad::new(self.clock.clone(), &self.metric, initial));
        self.index.insert(key.clone(), self.endpoints.len());
        self.endpoints.push(Endpoint {
            key,
            weight,
            admitted: now,
            service,
            load,
        });
        self.rebuild();
        None
    }

    /// Removes an endpoint. Requests in flight to it complete normally; their guards hold its state.
    pub fn remove(&mut self, key: &K) -> Option<S> {
        let at = self.index.remove(key)?;
        // Positions move: a pick reserved by `poll_ready` is made again.
        self.ready = Ready::None;
        let removed = self.endpoints.swap_remove(at);
        if let Some(moved) = self.endpoints.get(at) {
            self.index.insert(moved.key.clone(), at);
        }
        self.rebuild();
        Some(removed.service)
    }

    /// Keeps only the endpoints for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let doomed: Vec<K> = self
            .endpoints
            .iter()
            .filter(|e| !keep(&e.key))
            .map(|e| e.key.clone())
            .collect();
        for key in &doomed {
            self.remove(key);
        }
    }

    /// Marks an endpoint eligible or not (unhealthy, ejected, draining) without losing its load state.
    /// Returns whether it was eligible before, or `None` if there is no such endpoint.
    ///
    /// The flag lives in the endpoint's [`EndpointLoad`], so a metrics reader on another thread sees the
    /// same flag the balancer picks by: there is no second copy to fall out of step.
    pub fn set_eligible(&mut self, key: &K, eligible: bool) -> Option<bool> {
        let &at = self.index.get(key)?;
        let was = self.endpoints[at].load.is_eligible();
        if was != eligible {
            if eligible {
                // Re-admitted: start from the pool's median estimate, neither the stale penalty that
                // would starve it nor an idle-looking zero that would stampede it.
                let now = Instant::now();
                let median = self.median_rtt(Some(at));
                let endpoint = &mut self.endpoints[at];
                endpoint.admitted = now;
                if let (LoadMetric::PeakEwma(_), Some(median)) = (&self.metric, median) {
                    endpoint.load.reset_estimate(median);
                }
            }
            self.endpoints[at].load.set_eligible(eligible);
            self.rebuild();
        }
        Some(was)
    }

    /// Changes an endpoint's weight (0 makes it ineligible). Returns false if there is no such endpoint.
    pub fn set_weight(&mut self, key: &K, weight: u32) -> bool {
        let Some(&at) = self.index.get(key) else {
            return false;
        };
        if self.endpoints[at].weight != weight {
            self.endpoints[at].weight = weight;
            self.rebuild();
        }
        true
    }

    /// Number of endpoints, eligible or not.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are no endpoints at all.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Number of endpoints that can be picked.
    pub fn eligible_len(&self) -> usize {
        self.eligible.len()
    }

    /// The endpoints in insertion order (removal may reorder).
    pub fn endpoints(&self) -> impl Iterator<Item = EndpointView<'_, K>> {
        self.endpoints.iter().map(|e| EndpointView {
            key: &e.key,
            weight: e.weight,
            eligible: e.load.is_eligible(),
            load: &e.load,
        })
    }

    /// The load state of the endpoint with this key.
    pub fn endpoint_load(&self, key: &K) -> Option<&Arc<EndpointLoad>> {
        self.index.get(key).map(|&at| &self.endpoints[at].load)
    }

    /// The selection counters.
    pub fn stats(&self) -> PickStats {
        self.stats
    }

    /// The load metric.
    pub fn metric(&self) -> &LoadMetric {
        &self.metric
    }

    /// Picks an endpoint without sending anything: the selection alone, as a request would make it,
    /// counted in [`stats`](Self::stats) but not as load. For simulations and tests.
    pub fn pick(&mut self) -> Result<&K, NoEligibleEndpoint> {
        let at = self.select()?;
        Ok(&self.endpoints[at].key)
    }

    /// Picks an endpoint and claims it as [`pick`](Self::pick) then a call would: its load stays
    /// incremented until the returned guard is dropped. For callers that forward requests themselves.
    pub fn pick_and_claim(&mut self) -> Result<(&K, &mut S, LoadGuard), NoEligibleEndpoint> {
        let picked = self.select_at()?;
        Ok(self.claim(picked))
    }

    /// Like [`pick_and_claim`](Self::pick_and_claim), but never picks an endpoint whose key is in
    /// `exclude`: a retry re-picks with P2C among the endpoints not tried yet. Costs O(n) when `exclude`
    /// is not empty (retries only); an empty `exclude` is the O(1) pick.
    pub fn pick_and_claim_excluding(
        &mut self,
        exclude: &[K],
    ) -> Result<(&K, &mut S, LoadGuard), NoEligibleEndpoint> {
        let picked = self.select_excluding(exclude)?;
        Ok(self.claim(picked))
    }

    fn claim(&mut self, (at, picked_at): (usize, Option<u64>)) -> (&K, &mut S, LoadGuard) {
        // The pick's clock reading is the request's start: one clock read per request, not two.
        let clock = &self.clock;
        let started = picked_at.or_else(|| self.metric.uses_clock().then(|| clock.now()));
        let endpoint = &mut self.endpoints[at];
        let guard = LoadGuard::new(endpoint.load.clone(), started);
        (&endpoint.key, &mut endpoint.service, guard)
    }

    /// Like `poll_ready`, but never picks an endpoint whose key is in `exclude`: a retry re-picks with
    /// P2C among the endpoints not tried yet. Then `call` sends to the endpoint picked. Costs O(n) when
    /// `exclude` is not empty (retries only). A pick already reserved by `poll_ready` is kept only if its
    /// endpoint is not excluded.
    pub fn poll_ready_excluding<Req>(
        &mut self,
        cx: &mut Context<'_>,
        exclude: &[K],
    ) -> Poll<Result<(), BoxError>>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        C: TrackCompletion<LoadGuard, S::Response>,
    {
        // A pick reserved by an earlier `poll_ready` that names an excluded endpoint is given up: the
        // caller asked for anything but it.
        if let Ready::Endpoint(at, _) = &self.ready {
            if self
                .endpoints
                .get(*at)
                .is_none_or(|endpoint| exclude.contains(&endpoint.key))
            {
                self.ready = Ready::None;
            }
        }
        self.poll_pick::<Req>(cx, exclude)
    }

    /// Picks an endpoint not in `exclude` and polls its service's readiness. One that is not ready is
    /// passed over for another pick among the rest (up to [`MAX_PICKS`] picks per call, after which, or
    /// when no other candidate is left, the last one's readiness is awaited: its waker is registered).
    /// One whose readiness fails is evicted ([`PickStats::evicted`]) and another is picked. With nothing
    /// eligible it is ready, and `call` fails with [`NoEligibleEndpoint`].
    fn poll_pick<Req>(&mut self, cx: &mut Context<'_>, exclude: &[K]) -> Poll<Result<(), BoxError>>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        // Endpoints found not ready in this call, left out of the next pick (allocated only then).
        let mut pending: Vec<K> = Vec::new();
        loop {
            let (at, picked_at) = match self.ready {
                Ready::Endpoint(at, _) => (at, None),
                Ready::NoEligible => return Poll::Ready(Ok(())),
                Ready::None => {
                    let picked = if pending.is_empty() {
                        self.select_excluding(exclude)
                    } else {
                        let skip: Vec<K> = exclude.iter().chain(&pending).cloned().collect();
                        self.select_excluding(&skip)
                    };
                    match picked {
                        Ok(picked) => picked,
                        Err(NoEligibleEndpoint) => {
                            // Every other candidate was passed over: wait for the last one not ready.
                            let waiting = pending.last().and_then(|key| self.index.get(key));
                            if let Some(&at) = waiting {
                                self.ready = Ready::Endpoint(at, None);
                                return Poll::Pending;
                            }
                            // Ready, so that `call` can answer this request with the error; the
                            // next request picks again and may find an endpoint re-admitted.
                            self.ready = Ready::NoEligible;
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
            };
            match self.endpoints[at].service.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    self.ready = Ready::Endpoint(at, picked_at);
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending if pending.len() + 1 >= MAX_PICKS as usize => {
                    self.ready = Ready::Endpoint(at, None);
                    return Poll::Pending;
                }
                Poll::Pending => {
                    self.stats.repicks += 1;
                    pending.push(self.endpoints[at].key.clone());
                    self.ready = Ready::None;
                }
                Poll::Ready(Err(_)) => {
                    self.stats.evicted += 1;
                    let key = self.endpoints[at].key.clone();
                    self.remove(&key);
                }
            }
        }
    }

    fn select_excluding(
        &mut self,
        exclude: &[K],
    ) -> Result<(usize, Option<u64>), NoEligibleEndpoint> {
        if exclude.is_empty() {
            return self.select_at();
        }
        let keep: Vec<usize> = self
            .eligible
            .iter()
            .copied()
            .filter(|&at| !exclude.contains(&self.endpoints[at].key))
            .collect();
        let weighted = self.weighted.as_ref().map(|_| {
            let weights: Vec<u32> = keep
                .iter()
                .map(|&at| self.endpoints[at].weight.saturating_mul(1000))
                .collect();
            Weights::new(&weights)
        });
        // Select over the remaining candidates by swapping them in; the step check is skipped so the
        // full lists are not rebuilt underneath.
        let saved_list = std::mem::replace(&mut self.eligible, keep);
        let saved_weights = std::mem::replace(&mut self.weighted, weighted);
        let saved_step = self.next_ramp_step.take();
        let picked = self.select_at();
        self.eligible = saved_list;
        self.weighted = saved_weights;
        self.next_ramp_step = saved_step;
        picked
    }

    fn select(&mut self) -> Result<usize, NoEligibleEndpoint> {
        self.select_at().map(|(at, _)| at)
    }

    fn select_at(&mut self) -> Result<(usize, Option<u64>), NoEligibleEndpoint> {
        if let Some(step) = self.next_ramp_step {
            if Instant::now() >= step {
                self.rebuild();
            }
        }
        let n = self.eligible.len();
        if n == 0 {
            self.stats.no_eligible += 1;
            return Err(NoEligibleEndpoint);
        }
        self.stats.picks += 1;
        let mut picked_at = None;
        let chosen = match self.policy {
            Policy::RoundRobin => match &mut self.weighted {
                Some(weights) => weights.next_in_turn(),
                None => {
                    self.next_in_turn = self.next_in_turn.wrapping_add(1);
                    self.next_in_turn % n
                }
            },
            Policy::Random if n == 1 => 0,
            Policy::Random => match &self.weighted {
                Some(weights) => weights.table.sample(self.p2c.draw()),
                None => (self.p2c.draw() % n as u64) as usize,
            },
            Policy::P2c => {
                let now = self.metric.uses_clock().then(|| self.clock.now());
                picked_at = now;
                let selection = self.select_p2c(n, now.unwrap_or(0));
                if let Some(observer) = &self.observer {
                    self.notify(observer.clone(), &selection);
                }
                if selection.tie {
                    self.stats.ties += 1;
                }
                if selection.both_zero() {
                    self.stats.both_zero += 1;
                }
                selection.chosen
            }
        };
        Ok((self.eligible[chosen], picked_at))
    }

    #[inline]
    fn select_p2c(&mut self, n: usize, now: u64) -> Selection {
        let Self {
            endpoints,
            eligible,
            weighted,
            metric,
            p2c,
            stats,
            service_load,
            ..
        } = self;
        let reads = &mut stats.load_reads;
        if let Some(service_load) = *service_load {
            let load = |i: usize| {
                *reads += 1;
                service_load(&endpoints[eligible[i]].service)
            };
            let selection = match weighted {
                Some(weights) => p2c.select_weighted(&weights.table, load),
                None => p2c.select(n, load),
            };
            return selection.unwrap_or(Selection {
                chosen: 0,
                candidates: None,
                tie: false,
            });
        }
        let selection = match weighted {
            Some(weights) => p2c.select_weighted(&weights.table, |i| {
                *reads += 1;
                metric.weighted_load(&endpoints[eligible[i]].load, now, weights.units[i])
            }),
            None => p2c.select(n, |i| {
                *reads += 1;
                metric.load(&endpoints[eligible[i]].load, now)
            }),
        };
        // n >= 1 here, so selection cannot fail.
        selection.unwrap_or(Selection {
            chosen: 0,
            candidates: None,
            tie: false,
        })
    }

    fn notify(&self, observer: Observer<K>, selection: &Selection) {
        if let Some([a, b]) = selection.candidates {
            let key = |i: usize| &self.endpoints[self.eligible[i]].key;
            observer(&PickEvent {
                candidates: [(key(a.index), a.load), (key(b.index), b.load)],
                chosen: key(selection.chosen),
                tie: selection.tie,
                both_zero: selection.both_zero(),
            });
        }
    }

    fn initial_rtt(&self) -> Duration {
        let LoadMetric::PeakEwma(config) = &self.metric else {
            return FALLBACK_RTT;
        };
        match config.default_rtt {
            DefaultRtt::Fixed(rtt) => rtt,
            DefaultRtt::PoolMedian => self.median_rtt(None).unwrap_or(FALLBACK_RTT),
        }
    }

    /// The median latency estimate of the eligible endpoints (all endpoints if none is eligible),
    /// leaving out `except`.
    fn median_rtt(&self, except: Option<usize>) -> Option<Duration> {
        let others = || {
            self.endpoints
                .iter()
                .enumerate()
                .filter(|(at, _)| Some(*at) != except)
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

    fn rebuild(&mut self) {
        self.ready = Ready::None;
        let now = Instant::now();
        let pickable = self.endpoints.iter().filter(|e| e.weight > 0).count();
        let eligible = self
            .endpoints
            .iter()
            .filter(|e| e.load.is_eligible() && e.weight > 0)
            .count();
        self.panicking = pickable > 0 && (eligible as f64) < self.panic_threshold * pickable as f64;
        let panicking = self.panicking;
        self.eligible.clear();
        self.eligible.extend(
            self.endpoints
                .iter()
                .enumerate()
                .filter(|(_, e)| (e.load.is_eligible() || panicking) && e.weight > 0)
                .map(|(at, _)| at),
        );
        // Slow start scales weights by how far into its window each endpoint is: 1/10 at admission,
        // growing linearly to the full weight. Ramping weights are kept to 1/1000 of a unit.
        let mut ramping = false;
        let weights: Vec<u32> = self
            .eligible
            .iter()
            .map(|&at| {
                let endpoint = &self.endpoints[at];
                let ramp = match self.slow_start {
                    Some(window) => {
                        let elapsed = now.saturating_duration_since(endpoint.admitted);
                        (elapsed.as_secs_f64() / window.as_secs_f64()).clamp(0.1, 1.0)
                    }
                    None => 1.0,
                };
                if ramp < 1.0 {
                    ramping = true;
                }
                (f64::from(endpoint.weight) * 1000.0 * ramp)
                    .round()
                    .max(1.0) as u32
            })
            .collect();
        self.next_ramp_step = ramping.then(|| now + RAMP_STEP);
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        self.weighted = (!uniform).then(|| Weights::new(&weights));
    }
}

/// The eligible endpoints' weights, when they are not all equal (in thousandths of a unit, so slow start
/// can ramp them smoothly).
struct Weights {
    /// Draws a candidate in proportion to its weight, in O(1).
    table: AliasTable,
    /// Each eligible endpoint's weight in units, dividing its concurrency in the load comparison.
    units: Vec<f64>,
    /// Smooth weighted round robin (nginx's): each endpoint's running weight, and what it gains per turn.
    running: Vec<i64>,
    gains: Vec<i64>,
    total: i64,
}

impl Weights {
    fn new(thousandths: &[u32]) -> Self {
        let gains: Vec<i64> = thousandths.iter().map(|&w| i64::from(w)).collect();
        Self {
            table: AliasTable::new(thousandths),
            units: thousandths.iter().map(|&w| f64::from(w) / 1000.0).collect(),
            running: vec![0; gains.len()],
            total: gains.iter().sum(),
            gains,
        }
    }

    /// Smooth weighted round robin: every endpoint gains its weight, the richest is chosen and pays the
    /// total. Weights 3:1 give `a a b a`, never a burst longer than the weights require; O(n) with no
    /// allocation (round robin is a baseline, n is small).
    fn next_in_turn(&mut self) -> usize {
        let (mut chosen, mut richest) = (0, i64::MIN);
        for (at, (running, gain)) in self.running.iter_mut().zip(&self.gains).enumerate() {
            *running += gain;
            if *running > richest {
                (chosen, richest) = (at, *running);
            }
        }
        self.running[chosen] -= self.total;
        chosen
    }
}

/// Picks one `poll_ready` makes before it waits on an endpoint that is not ready.
pub const MAX_PICKS: u32 = 3;

/// The balancer's load, so that a balancer can be an endpoint of another (zones of clusters): the mean
/// over its eligible endpoints of the load it compares them on (weighted as in a pick, or their own
/// [`Balance::with_service_load`]), `f64::INFINITY` when none is eligible.
///
/// The mean, because a request sent to this balancer lands on one of two randomly drawn endpoints, not on
/// its least loaded one: the minimum would make a pool with one idle endpoint look idle however busy the
/// rest are. Not the sum, which would make a large pool look busier than a small one at the same load
/// per endpoint. Reading it costs O(n).
impl<K, S, C> tower::load::Load for Balance<K, S, C> {
    type Metric = f64;

    fn load(&self) -> f64 {
        if self.eligible.is_empty() {
            return f64::INFINITY;
        }
        let now = self.clock.now();
        let total: f64 = self
            .eligible
            .iter()
            .enumerate()
            .map(|(slot, &at)| {
                let endpoint = &self.endpoints[at];
                if let Some(service_load) = self.service_load {
                    return service_load(&endpoint.service);
                }
                match &self.weighted {
                    Some(weights) => {
                        self.metric
                            .weighted_load(&endpoint.load, now, weights.units[slot])
                    }
                    None => self.metric.load(&endpoint.load, now),
                }
            })
            .sum();
        total / self.eligible.len() as f64
    }
}

/// How often ramping weights are recomputed during slow start.
const RAMP_STEP: Duration = Duration::from_millis(250);

impl<K, S, C, Req> Service<Req> for Balance<K, S, C>
where
    K: Hash + Eq + Clone,
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: TrackCompletion<LoadGuard, S::Response>,
{
    type Response = C::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    /// See [`Balance::poll_ready_excluding`] with nothing excluded: a pending endpoint is passed over
    /// for another pick (up to [`MAX_PICKS`]), a failed one evicted.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_pick::<Req>(cx, &[])
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let uses_clock = self.metric.uses_clock();
        let clock = &self.clock;
        let started = |picked_at: Option<u64>| {
            if uses_clock {
                picked_at.or_else(|| Some(clock.now()))
            } else {
                None
            }
        };
        match std::mem::replace(&mut self.ready, Ready::None) {
            Ready::Endpoint(at, picked_at) => {
                let endpoint = &mut self.endpoints[at];
                let guard = LoadGuard::new(endpoint.load.clone(), started(picked_at));
                let future = endpoint.service.call(request);
                ResponseFuture::called(future, guard, self.completion.clone())
            }
            Ready::NoEligible => {
                ResponseFuture::failed(NoEligibleEndpoint.into(), self.completion.clone())
            }
            Ready::None => ResponseFuture::failed(NotReady.into(), self.completion.clone()),
        }
    }
}

impl<K: fmt::Debug, S, C> fmt::Debug for Balance<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balance")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|e| &e.key).collect::<Vec<_>>(),
            )
            .field("eligible", &self.eligible.len())
            .field("policy", &self.policy)
            .field("metric", &self.metric)
            .field("stats", &self.stats)
            .finish()
    }
}
