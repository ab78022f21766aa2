//! Load metrics and the per-endpoint state they read.

use crate::clock::Clock;
use std::{
    fmt,
    sync::{
        atomic::{
            AtomicBool, AtomicU64,
            Ordering::{Acquire, Relaxed, Release},
        },
        Arc,
    },
    time::Duration,
};

/// What "lighter" means when two candidates are compared.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub(crate) enum LoadMetric {
    /// Requests this balancer has in flight to the endpoint (tower's `PendingRequests`).
    InFlight,
    /// Peak-sensitive EWMA of latency times (in flight + 1): Finagle's and Linkerd's `PeakEWMA`.
    PeakEwma(PeakEwmaConfig),
    /// Requests in flight, as [`InFlight`](Self::InFlight); equal counts are ordered by a plain (not
    /// peak) moving average of latency, the faster endpoint lighter, and only exactly equal averages are
    /// left to the balancer's draw. When the candidates' weights differ, it is
    /// [`InFlight`](Self::InFlight) (in flight ÷ weight, ties drawn by weight): weights, not latency,
    /// then say how equal loads split. The average never outweighs a difference in counts: it adds less than
    /// 10⁻⁶ to the load. Like PeakEWMA's estimate it moves with time constant τ, is sampled
    /// as [`PeakEwmaConfig::sample_at`] says, records the penalty for a failed attempt, and is never read
    /// below the mean age of the requests still waiting for their sample. Unlike it, it does not decay
    /// while the endpoint is idle: an endpoint that was slow loses ties until its count is the lowest and
    /// it answers faster, and nothing more (its count still wins it every request where it is lowest).
    ///
    /// Where many requests are in flight at once, counts rarely tie and this is [`InFlight`](Self::InFlight).
    /// Where few are (a worker's own share of a busy pool, or light traffic), equal counts are the
    /// common case, and the latency average carries what the counts cannot: how busy the endpoint is
    /// with everyone else's requests. A plain average, because a peak estimate orders ties by the last
    /// slow sample (duet-sim: in the 32-worker herd setup, ties ordered by the plain average cut the
    /// mean time in system by 28% against a draw; by the peak estimate they raised it by 29%, and so did
    /// the plain average decayed while idle, which makes every worker's idle endpoints look fastest).
    InFlightThenLatency(PeakEwmaConfig),
}

/// The most the latency average adds to an in-flight load under [`LoadMetric::InFlightThenLatency`]:
/// far under a difference of one request.
pub(crate) const LATENCY_ORDER: f64 = 1e-6;

/// `ns` mapped into `[0, LATENCY_ORDER)`, increasing: `ns / (ns + 1 ms)` keeps sub-millisecond and
/// second-long averages apart alike.
#[inline]
fn latency_order(ns: f64) -> f64 {
    LATENCY_ORDER * ns / (ns + 1e6)
}

impl Default for LoadMetric {
    fn default() -> Self {
        Self::PeakEwma(PeakEwmaConfig::default())
    }
}

impl LoadMetric {
    pub(crate) fn uses_clock(&self) -> bool {
        self.latency_config().is_some()
    }

    /// Replaces the latency settings of a metric that measures latency; whether it does.
    pub(crate) fn set_latency_config(&mut self, config: PeakEwmaConfig) -> bool {
        match self {
            Self::InFlight => false,
            Self::PeakEwma(settings) | Self::InFlightThenLatency(settings) => {
                *settings = config;
                true
            }
        }
    }

    /// The latency settings of a metric that measures latency.
    pub(crate) fn latency_config(&self) -> Option<&PeakEwmaConfig> {
        match self {
            Self::InFlight => None,
            Self::PeakEwma(config) | Self::InFlightThenLatency(config) => Some(config),
        }
    }

    /// The load of `state` at `now`. Reading never changes the state.
    #[inline]
    pub(crate) fn load(&self, state: &EndpointLoad, now: u64) -> f64 {
        match self {
            Self::InFlight => state.in_flight() as f64,
            Self::PeakEwma(_) => {
                let counts = state.counts();
                let in_flight = EndpointLoad::in_flight_of(counts);
                peak_ewma::load(state.estimate_ns(now, counts), in_flight)
            }
            Self::InFlightThenLatency(_) => {
                let counts = state.counts();
                EndpointLoad::in_flight_of(counts) as f64
                    + latency_order(state.average_ns(now, counts))
            }
        }
    }

    /// The load of an endpoint of `weight` (its capacity, in units): weight divides the concurrency, never
    /// the latency. In flight: `in_flight / weight`. PeakEWMA: `estimate × (1 + in_flight / weight)`, which
    /// is [`load`](Self::load) at weight 1. See the crate docs for why.
    #[inline]
    pub(crate) fn weighted_load(&self, state: &EndpointLoad, now: u64, weight: f64) -> f64 {
        let counts = state.counts();
        let concurrency = EndpointLoad::in_flight_of(counts) as f64 / weight;
        match self {
            Self::InFlight => concurrency,
            Self::PeakEwma(_) => state.estimate_ns(now, counts) * (1.0 + concurrency),
            // Differing weights settle ties themselves (a draw by weight): ordered by latency, one
            // request at a time would all go to the faster endpoint, whatever the weights.
            Self::InFlightThenLatency(_) => concurrency,
        }
    }
}

/// When the latency sample of a request is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SampleAt {
    /// When the response head arrives (time to first byte): the default, as in Linkerd.
    #[default]
    ResponseHeaders,
    /// When the response body ends (or errors, or is dropped).
    BodyEnd,
}

/// The latency estimate a newly added endpoint starts with.
///
/// A start estimate that no answer has confirmed (the 30 ms of a cold pool, or a fixed one) is a
/// guess: the endpoint's first answer replaces it, whether higher or lower, instead of being blended
/// in with time constant τ. Blended, a 30 ms guess took ~10 s to fade, and until then every endpoint
/// faster than it looked alike ([`EndpointLoad::is_measured`] tells which estimates are guesses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DefaultRtt {
    /// In a warm pool, the median of the measured endpoints' estimates: a newcomer then neither looks
    /// idle (and gets stampeded) nor looks slow (and gets starved), and its answers move the estimate
    /// as any endpoint's do. In a cold pool (no endpoint has answered yet), 30 ms until the pool's
    /// first answer, then the lowest answer of any endpoint, until its own first answer: an endpoint
    /// yet to answer is never ranked behind measured ones (which would starve it of the answer that
    /// measures it).
    #[default]
    PoolMedian,
    /// A fixed estimate for every new endpoint, until its first answer.
    Fixed(Duration),
}

/// Latency settings: of the PeakEWMA load (`p2c_peak_ewma`, `p2c_memory_peak_ewma`,
/// `least_peak_ewma`), and of `least_inflight`'s latency average, which has no peak. Set with
/// [`Balancer::with_latency_config`](crate::Balancer::with_latency_config).
///
/// ```
/// use duet_balance::{Balancer, DefaultRtt, PeakEwmaConfig, SampleAt, Strategy};
/// use std::time::Duration;
///
/// let config = PeakEwmaConfig {
///     decay: Duration::from_secs(5),
///     default_rtt: DefaultRtt::Fixed(Duration::from_millis(5)), // a new endpoint's guess
///     sample_at: SampleAt::BodyEnd,                             // latency to the body's end
///     ..PeakEwmaConfig::default()
/// };
/// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cPeakEwma).with_latency_config(config);
/// balance.insert("a", 1, ());
/// assert_eq!(balance.endpoint_load(&"a").map(|l| l.rtt_estimate()), Some(Duration::from_millis(5)));
/// ```
///
/// The estimate jumps to any sample above it at once (peak) and otherwise moves toward new samples with
/// weight `w = exp(-Δt/τ)`: `ewma = ewma·w + rtt·(1 - w)`, Δt being the time since the last sample. While
/// no sample arrives, reads see the estimate decay toward zero with the same τ, so an endpoint that was
/// slow once is eventually tried again; this decay is computed at read time and never stored, so how often
/// the balancer reads a load cannot change it.
///
/// Samples only arrive when requests complete, so an endpoint that has just turned slow would look fast
/// until its first slow answer, and keep attracting requests that are all going to be slow. Reads
/// therefore also see the requests still waiting for their sample: the mean age of those requests is a
/// lower bound on their latency, and the estimate read is never below it. A healthy endpoint's waiting
/// requests are younger than its latency on average (half of it, for steady arrivals), so this changes
/// nothing there; one that stalls looks slower with every millisecond, before any request completes.
#[derive(Debug, Clone, PartialEq)]
pub struct PeakEwmaConfig {
    /// Time constant τ. Default 10 s.
    pub decay: Duration,
    /// Estimate of a new endpoint until its first answer. Default: the pool median (see [`DefaultRtt`]).
    pub default_rtt: DefaultRtt,
    /// When the latency sample is taken. Default: at response headers.
    pub sample_at: SampleAt,
    /// The latency recorded for a failed attempt (the inner service failed, e.g. connect refused, or the
    /// response carried a penalised status). Default 1 s.
    pub penalty: Duration,
}

impl Default for PeakEwmaConfig {
    fn default() -> Self {
        Self {
            decay: Duration::from_secs(10),
            default_rtt: DefaultRtt::PoolMedian,
            sample_at: SampleAt::ResponseHeaders,
            penalty: Duration::from_secs(1),
        }
    }
}

const FALLBACK_RTT: Duration = Duration::from_millis(30);

/// The bits `ewma_ns` and `average_ns` hold until an endpoint's first sample: a NaN no arithmetic
/// produces, so an unmeasured estimate costs a pick one comparison of a word it reads anyway.
const UNMEASURED: u64 = u64::MAX;

/// The estimate of a pool's endpoints that have not answered yet, shared by their load states.
///
/// Under [`DefaultRtt::PoolMedian`] it starts at 30 ms and then learns from the pool's own answers: it
/// is the lowest sample of any endpoint, so an endpoint that has not answered is never ranked behind
/// the measured ones (which would starve it of the answer that measures it): it ties with or beats
/// the fastest until its own first answer. Under [`DefaultRtt::Fixed`] it stays at the configured estimate.
pub(crate) struct ColdStart {
    /// f64 bits of what a sample must be below to be learned: under `PoolMedian`, +∞ until the first
    /// sample, then the lowest sample, which is the estimate; under `Fixed`, −∞. So a sample that
    /// teaches nothing, every one but a few, costs one comparison.
    learn_below: AtomicU64,
    /// Under `Fixed`: the estimate, never learned.
    fixed_ns: Option<f64>,
}

impl ColdStart {
    pub(crate) fn new(metric: &LoadMetric) -> Self {
        let ns = |rtt: Duration| rtt.as_nanos() as u64 as f64;
        match metric.latency_config().map(|c| c.default_rtt) {
            Some(DefaultRtt::Fixed(rtt)) => Self {
                learn_below: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
                fixed_ns: Some(ns(rtt)),
            },
            _ => Self {
                learn_below: AtomicU64::new(f64::INFINITY.to_bits()),
                fixed_ns: None,
            },
        }
    }

    fn learn_below(&self) -> f64 {
        f64::from_bits(self.learn_below.load(Relaxed))
    }

    fn estimate_ns(&self) -> f64 {
        match self.fixed_ns {
            Some(fixed) => fixed,
            None if self.learned() => self.learn_below(),
            None => FALLBACK_RTT.as_nanos() as f64,
        }
    }

    /// Whether a sample was learned (under `PoolMedian`).
    fn learned(&self) -> bool {
        self.fixed_ns.is_none() && self.learn_below() < f64::INFINITY
    }

    /// A sample of any endpoint: the first one replaces the start, later ones can only lower it.
    #[inline]
    fn learn(&self, rtt_ns: f64) {
        if rtt_ns < self.learn_below() {
            self.lower(rtt_ns);
        }
    }

    /// Keeps `rtt_ns` unless a lower sample (on another thread) came first.
    #[cold]
    fn lower(&self, rtt_ns: f64) {
        let _ = self.learn_below.fetch_update(Relaxed, Relaxed, |bits| {
            (rtt_ns < f64::from_bits(bits)).then_some(rtt_ns.to_bits())
        });
    }
}

impl fmt::Debug for ColdStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ColdStart")
            .field("estimate", &nanos(self.estimate_ns()))
            .field("learns", &self.fixed_ns.is_none())
            .field("learned", &self.learned())
            .finish()
    }
}

/// A duration of `ns` nanoseconds (0 for what is not a finite positive number), for `Debug`.
fn nanos(ns: f64) -> Duration {
    Duration::from_nanos(if ns.is_finite() {
        ns.max(0.0) as u64
    } else {
        0
    })
}

/// The load state of one endpoint in one balancer.
///
/// Shared (by `Arc`) between the balancer and the guards of requests in flight, which may complete on
/// other threads; all fields are atomics. Each balancer has its own: nothing here is shared between
/// duet's workers. A control plane may hold the `Arc` to read it for metrics.
///
/// ```
/// use duet_balance::{Balancer, Strategy};
/// use std::time::Duration;
///
/// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cPeakEwma);
/// balance.insert("a", 1, ());
/// let load = balance.endpoint_load(&"a").cloned().ok_or("no endpoint a")?;
/// assert!(load.is_eligible() && !load.is_measured());
/// assert_eq!((load.in_flight(), load.picks()), (0, 0));
/// // Before any answer, a cold pool's estimate: 30 ms. Debug prints durations and counts as such.
/// assert_eq!(load.rtt_estimate(), Duration::from_millis(30));
/// assert!(format!("{load:?}").contains("rtt_estimate: 30ms"));
/// # Ok::<(), duet_balance::BoxError>(())
/// ```
// Field order is layout: what a pick reads of a candidate (counts, estimate, stamp, decay: 32 bytes)
// comes first, right after the `Arc`'s two counters, so that a candidate costs one cache line (two when
// the allocation straddles a line) instead of reads spread over the whole 128 bytes, which matters once
// the pool is too large for the cache (n = 4096 in the bench: 107 -> ~90 ns per pick + complete).
#[repr(C)]
pub struct EndpointLoad {
    /// Requests in flight (low 32 bits) and, of those, the ones whose latency sample is still to come
    /// (high 32 bits): one atomic, so a request's start is one update, and a reader sees both counts
    /// of one moment.
    counts: AtomicU64,
    /// f64 bits of the estimate in nanoseconds.
    ewma_ns: AtomicU64,
    /// Clock reading of the last sample.
    stamp: AtomicU64,
    /// Clock ticks divided by τ: a span in ticks times this is the span over τ, with no division.
    decay_per_tick: f64,
    /// f64 bits of the plain (not peak) moving average of latency in nanoseconds, kept beside the
    /// estimate for [`LoadMetric::InFlightThenLatency`].
    average_ns: AtomicU64,
    /// Sum of the clock readings at which the waiting requests started (wrapping): with their count,
    /// their mean age, a lower bound on the latency now.
    waiting_since: AtomicU64,
    /// Only the balancer that owns this state counts picks (under `&mut`): a load and a store, not a
    /// read-modify-write.
    picks: AtomicU64,
    penalty_ns: f64,
    clock: Clock,
    /// Whether the balancer may pick it: the one copy of that flag, kept by the balancer.
    eligible: AtomicBool,
    /// The start estimate of the pool's endpoints that have not answered yet, read in place of
    /// `ewma_ns` and `average_ns` while those hold [`UNMEASURED`].
    cold: Arc<ColdStart>,
    sample_at: SampleAt,
}

/// What a person reading it needs: counts as counts, latencies as durations, read now.
impl fmt::Debug for EndpointLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (now, counts) = (self.clock.now(), self.counts());
        f.debug_struct("EndpointLoad")
            .field("eligible", &self.is_eligible())
            .field("in_flight", &Self::in_flight_of(counts))
            .field("waiting", &(counts >> 32))
            .field("picks", &self.picks())
            .field("rtt_estimate", &nanos(self.estimate_ns(now, counts)))
            .field("latency_average", &nanos(self.average_ns(now, counts)))
            .field("measured", &self.is_measured())
            .field("penalty", &nanos(self.penalty_ns))
            .field("sample_at", &self.sample_at)
            .finish_non_exhaustive()
    }
}

const ONE_IN_FLIGHT: u64 = 1;
const ONE_WAITING: u64 = 1 << 32;

impl EndpointLoad {
    /// A state measured at `initial_rtt`, alone in its pool: a unit test's starting point.
    #[cfg(test)]
    pub(crate) fn new(clock: Clock, metric: &LoadMetric, initial_rtt: Duration) -> Self {
        let cold = Arc::new(ColdStart::new(metric));
        Self::starting(clock, metric, Some(initial_rtt), cold)
    }

    /// A state at `start`, or, if `None`, unmeasured: its estimate is `cold`'s until its first sample
    /// replaces it.
    pub(crate) fn starting(
        clock: Clock,
        metric: &LoadMetric,
        start: Option<Duration>,
        cold: Arc<ColdStart>,
    ) -> Self {
        let bits = start.map_or(UNMEASURED, |rtt| (rtt.as_nanos() as u64 as f64).to_bits());
        let (tau, penalty, sample_at) = match metric.latency_config() {
            Some(cfg) => (cfg.decay, cfg.penalty, cfg.sample_at),
            None => (
                Duration::from_secs(10),
                Duration::from_secs(1),
                SampleAt::default(),
            ),
        };
        Self {
            counts: AtomicU64::new(0),
            eligible: AtomicBool::new(true),
            picks: AtomicU64::new(0),
            waiting_since: AtomicU64::new(0),
            ewma_ns: AtomicU64::new(bits),
            average_ns: AtomicU64::new(bits),
            stamp: AtomicU64::new(clock.now()),
            decay_per_tick: clock.ns_per_tick() / (tau.as_nanos() as u64 as f64).max(1.0),
            clock,
            penalty_ns: penalty.as_nanos() as u64 as f64,
            sample_at,
            cold,
        }
    }

    /// Whether the estimate comes from answers: this endpoint's own, or the pool median it started at.
    /// `false` from a start in a pool where no endpoint had answered yet, or at a
    /// [`DefaultRtt::Fixed`] estimate, until the endpoint's first sample.
    pub fn is_measured(&self) -> bool {
        self.ewma_ns.load(Relaxed) != UNMEASURED
    }

    /// Whether the balancer may pick this endpoint (healthy, not ejected; see
    /// [`Balancer::set_eligible`](crate::Balancer::set_eligible)).
    pub fn is_eligible(&self) -> bool {
        self.eligible.load(Relaxed)
    }

    pub(crate) fn set_eligible(&self, eligible: bool) {
        self.eligible.store(eligible, Relaxed);
    }

    /// Requests in flight to this endpoint through this balancer.
    pub fn in_flight(&self) -> u64 {
        Self::in_flight_of(self.counts.load(Relaxed))
    }

    /// Requests in flight whose latency sample is still to come (at most [`in_flight`](Self::in_flight)).
    pub fn waiting(&self) -> u64 {
        self.counts.load(Relaxed) >> 32
    }

    /// How many times this endpoint was picked.
    pub fn picks(&self) -> u64 {
        self.picks.load(Relaxed)
    }

    /// The latency estimate as seen now: decayed toward zero since the last sample, and never below
    /// the mean age of the requests still waiting for their sample. Computed, not stored.
    pub fn rtt_estimate(&self) -> Duration {
        let counts = self.counts.load(Acquire);
        Duration::from_nanos(self.estimate_ns(self.clock.now(), counts) as u64)
    }

    /// The in-flight count and the word the estimate needs, read once per load read.
    #[inline]
    pub(crate) fn counts(&self) -> u64 {
        self.counts.load(Acquire)
    }

    /// The in-flight part of [`counts`](Self::counts).
    #[inline]
    pub(crate) fn in_flight_of(counts: u64) -> u64 {
        counts & u64::from(u32::MAX)
    }

    /// The estimate at the reading `now`, given the counts the caller has read.
    #[inline]
    pub(crate) fn estimate_ns(&self, now: u64, counts: u64) -> f64 {
        let bits = self.ewma_ns.load(Relaxed);
        if bits == UNMEASURED {
            return self.unmeasured_ns(now, counts);
        }
        let ewma = f64::from_bits(bits);
        let in_flight = Self::in_flight_of(counts);
        let elapsed = now.saturating_sub(self.stamp.load(Relaxed)) as f64;
        let projected = peak_ewma::project_scaled(ewma, elapsed * self.decay_per_tick, in_flight);
        let waiting = counts >> 32;
        if waiting == 0 {
            return projected;
        }
        projected.max(self.waiting_age_ns(now, counts, waiting))
    }

    /// The plain latency average at the reading `now`, never below the mean age of the requests waiting
    /// for their sample. No idle decay: see [`LoadMetric::InFlightThenLatency`].
    #[inline]
    pub(crate) fn average_ns(&self, now: u64, counts: u64) -> f64 {
        let bits = self.average_ns.load(Relaxed);
        if bits == UNMEASURED {
            return self.unmeasured_ns(now, counts);
        }
        let average = f64::from_bits(bits);
        let waiting = counts >> 32;
        if waiting == 0 {
            return average;
        }
        average.max(self.waiting_age_ns(now, counts, waiting))
    }

    /// The estimate of an endpoint that has not answered yet: the pool's cold-start estimate, with no
    /// idle decay (nothing was measured to decay), never below the mean age of its waiting requests.
    #[cold]
    fn unmeasured_ns(&self, now: u64, counts: u64) -> f64 {
        let guess = self.cold.estimate_ns();
        let waiting = counts >> 32;
        if waiting == 0 {
            return guess;
        }
        guess.max(self.waiting_age_ns(now, counts, waiting))
    }

    /// The mean age of the `waiting` requests (read in `counts`); 0 if the sum cannot be trusted.
    #[inline]
    fn waiting_age_ns(&self, now: u64, counts: u64, waiting: u64) -> f64 {
        // A guard adds its start to the sum before it counts itself (release on the count), and stops
        // counting itself before it takes its start back out (release on the sum): a sum read after the
        // counts holds the start of every request counted, unless one finished between the two reads,
        // which the second read of the counts catches. The rest of what a read can meet between updates
        // on other threads (a start in the sum whose count is not seen yet) only makes the age smaller.
        let since = self.waiting_since.load(Acquire);
        if self.counts.load(Relaxed) != counts {
            return 0.0;
        }
        // Wrapping: n·now − Σ starts is the sum of the ages whatever the readings' magnitude.
        let age_sum = waiting.wrapping_mul(now).wrapping_sub(since);
        if age_sum > i64::MAX as u64 {
            return 0.0;
        }
        self.clock.ticks_as_nanos(age_sum) / waiting as f64
    }

    /// Counts a request that does not wait for a latency sample (the metric needs none).
    pub(crate) fn start(&self) {
        self.counts.fetch_add(ONE_IN_FLIGHT, Relaxed);
        self.count_pick();
    }

    /// Counts a request started at the reading `started`, waiting for its latency sample.
    pub(crate) fn start_waiting(&self, started: u64) {
        self.waiting_since.fetch_add(started, Relaxed);
        self.counts.fetch_add(ONE_IN_FLIGHT | ONE_WAITING, Release);
        self.count_pick();
    }

    fn count_pick(&self) {
        self.picks.store(self.picks.load(Relaxed) + 1, Relaxed);
    }

    /// The request [`start_waiting`](Self::start_waiting) counted at `started` has its sample (or
    /// never will): it stays in flight, no longer waiting.
    pub(crate) fn stop_waiting(&self, started: u64) {
        self.counts.fetch_sub(ONE_WAITING, Relaxed);
        self.waiting_since.fetch_sub(started, Release);
    }

    /// A request counted by [`start`](Self::start), or one no longer waiting, ends.
    pub(crate) fn finish(&self) {
        self.counts.fetch_sub(ONE_IN_FLIGHT, Relaxed);
    }

    /// A request still waiting for its sample ends (the sample was just recorded): one update of the
    /// counts for both.
    pub(crate) fn finish_waiting(&self, started: u64) {
        self.counts.fetch_sub(ONE_IN_FLIGHT | ONE_WAITING, Relaxed);
        self.waiting_since.fetch_sub(started, Release);
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    pub(crate) fn sample_at(&self) -> SampleAt {
        self.sample_at
    }

    /// Replaces the estimate (re-admission after ejection or failed health checks): with `rtt`, or, if
    /// `None`, with the pool's cold-start estimate until the next sample.
    pub(crate) fn reset_estimate(&self, rtt: Option<Duration>) {
        let bits = rtt.map_or(UNMEASURED, |rtt| (rtt.as_nanos() as u64 as f64).to_bits());
        self.ewma_ns.store(bits, Relaxed);
        self.average_ns.store(bits, Relaxed);
        self.stamp.store(self.clock.now(), Relaxed);
    }

    pub(crate) fn record_penalty(&self, now: u64) {
        self.record_ns(self.penalty_ns, now);
    }

    /// Records the latency of a request that started at the reading `started`, sampled at `now`.
    pub(crate) fn record_since(&self, started: u64, now: u64) {
        self.record_ns(self.clock.nanos(started, now), now);
    }

    fn record_ns(&self, rtt_ns: f64, now: u64) {
        let stamp = self.stamp.load(Relaxed);
        // The first answer replaces a guess: blended in, a 30 ms guess would take τ (10 s) to fade,
        // and until then endpoints faster than it would all look alike (issue #43).
        let first = rtt_ns.to_bits();
        if self.ewma_ns.load(Relaxed) == UNMEASURED
            && self
                .ewma_ns
                .compare_exchange(UNMEASURED, first, Relaxed, Relaxed)
                .is_ok()
        {
            self.average_ns.store(first, Relaxed);
            self.stamp.store(now.max(stamp), Relaxed);
            self.cold.learn(rtt_ns);
            return;
        }
        let weight = peak_ewma::decay(now.saturating_sub(stamp) as f64 * self.decay_per_tick);
        // The pair (estimate, stamp) is not updated as one: two samples completing at the same instant on
        // two threads may each decay from the other's stamp. The error is bounded by one sample's weight
        // and cannot happen in duet's single-threaded workers.
        let _ = self.ewma_ns.fetch_update(Relaxed, Relaxed, |bits| {
            Some(peak_ewma::blend(f64::from_bits(bits), rtt_ns, weight).to_bits())
        });
        let _ = self.average_ns.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) * weight + rtt_ns * (1.0 - weight)).to_bits())
        });
        if now > stamp {
            self.stamp.store(now, Relaxed);
        }
        // Every sample, not only the first: an endpoint's first answer often carries a connection's
        // setup (a TLS handshake), and a cold estimate left at it would rank the endpoints yet to
        // answer behind the pooled ones for good.
        self.cold.learn(rtt_ns);
    }
}

/// The PeakEWMA arithmetic on plain numbers (any time unit, used consistently), shared by the balancer
/// and by simulations that run on virtual time.
///
/// ```
/// use duet_balance::algo::peak_ewma;
///
/// let tau = 10.0;
/// assert_eq!(peak_ewma::update(20.0, 50.0, 1.0, tau), 50.0, "a peak replaces the estimate");
/// let lower = peak_ewma::update(50.0, 20.0, 10.0, tau); // one τ later: w = 1/e
/// assert!((lower - (50.0 / std::f64::consts::E + 20.0 * (1.0 - 1.0 / std::f64::consts::E))).abs() < 1e-9);
/// assert_eq!(peak_ewma::project(50.0, 100.0, tau, 1), 50.0, "no decay with a request in flight");
/// assert_eq!(peak_ewma::load(50.0, 2), 150.0, "estimate × (in flight + 1)");
/// ```
pub mod peak_ewma {
    /// The estimate after a sample `rtt` taken `elapsed` after the previous one: a higher sample replaces
    /// it (peak); otherwise `ewma·w + rtt·(1 − w)` with `w = exp(−elapsed/τ)`.
    #[inline]
    pub fn update(ewma: f64, rtt: f64, elapsed: f64, tau: f64) -> f64 {
        blend(ewma, rtt, decay(elapsed / tau))
    }

    /// [`update`] with the weight `w = exp(−elapsed/τ)` computed by the caller.
    #[inline]
    pub(crate) fn blend(ewma: f64, rtt: f64, w: f64) -> f64 {
        if rtt > ewma {
            rtt
        } else {
            ewma * w + rtt * (1.0 - w)
        }
    }

    /// `exp(-x)`, by its Taylor polynomial when `x` is tiny: samples and reads microseconds apart with τ
    /// in seconds are the common case, and the polynomial's error there (below x³/6 < 2·10⁻¹⁰) is far
    /// under anything a load comparison can notice, at a fraction of `exp`'s cost.
    #[inline]
    pub(crate) fn decay(x: f64) -> f64 {
        if x < 1e-3 {
            1.0 - x + 0.5 * x * x
        } else {
            (-x).exp()
        }
    }

    /// The estimate as read `elapsed` after the last sample, computed, never stored. An idle endpoint's
    /// estimate decays toward zero, so one that was slow once is tried again. One with requests in
    /// flight does not decay: no sample there means its requests are slow, and letting its estimate
    /// fade would make a black hole look idle and attract ever more traffic.
    #[inline]
    pub fn project(ewma: f64, elapsed: f64, tau: f64, in_flight: u64) -> f64 {
        project_scaled(ewma, elapsed / tau, in_flight)
    }

    /// [`project`] with the time since the last sample given in units of τ.
    #[inline]
    pub(crate) fn project_scaled(ewma: f64, elapsed_over_tau: f64, in_flight: u64) -> f64 {
        if elapsed_over_tau <= 0.0 || in_flight > 0 {
            ewma
        } else {
            ewma * decay(elapsed_over_tau)
        }
    }

    /// The load P2C compares: the projected estimate times (in flight + 1).
    #[inline]
    pub fn load(projected: f64, in_flight: u64) -> f64 {
        projected * (in_flight + 1) as f64
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_polynomial_matches_exp_where_it_is_used() {
            for x in [0.0, 1e-9, 1e-6, 5e-4, 9.99e-4] {
                assert!((super::decay(x) - (-x).exp()).abs() < 2e-10, "{x}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::MockTime;

    fn ewma_state(initial: Duration) -> (EndpointLoad, MockTime) {
        let (clock, time) = Clock::mock();
        // Readings of 0 mean "never" to nothing here, but start the mock away from it anyway.
        time.advance(Duration::from_secs(1));
        let metric = LoadMetric::PeakEwma(PeakEwmaConfig::default());
        (EndpointLoad::new(clock, &metric, initial), time)
    }

    fn now(state: &EndpointLoad) -> u64 {
        state.clock().now()
    }

    #[test]
    fn a_higher_sample_is_taken_at_once() {
        let (state, time) = ewma_state(Duration::from_millis(10));
        let started = now(&state);
        time.advance(Duration::from_millis(500));
        state.record_since(started, now(&state));
        assert_eq!(state.rtt_estimate(), Duration::from_millis(500));
    }

    #[test]
    fn lower_samples_pull_the_estimate_down_with_time_constant() {
        let (state, time) = ewma_state(Duration::from_millis(100));
        time.advance(Duration::from_secs(10));
        let started = now(&state);
        time.advance(Duration::from_millis(10));
        state.record_since(started, now(&state));
        // w = e^-1.001: 100·0.3675 + 10·0.6325 = 43.07 ms
        let got = state.rtt_estimate().as_secs_f64() * 1000.0;
        assert!((got - 43.07).abs() < 0.05, "{got}");
    }

    #[test]
    fn reading_does_not_change_the_estimate() {
        let (clock, time) = Clock::mock();
        let metric = LoadMetric::PeakEwma(PeakEwmaConfig::default());
        let a = EndpointLoad::new(clock.clone(), &metric, Duration::from_millis(100));
        let b = EndpointLoad::new(clock.clone(), &metric, Duration::from_millis(100));
        for _ in 0..100 {
            time.advance(Duration::from_millis(50));
            let _ = a.rtt_estimate();
        }
        assert_eq!(a.rtt_estimate(), b.rtt_estimate());
        // Idle decay is projected: 5 s at τ = 10 s leaves e^-0.5 of the estimate.
        let got = a.rtt_estimate().as_secs_f64() * 1000.0;
        assert!((got - 100.0 * (-0.5f64).exp()).abs() < 0.01, "{got}");
        let started = clock.now();
        time.advance(Duration::from_millis(20));
        a.record_since(started, clock.now());
        b.record_since(started, clock.now());
        assert_eq!(a.rtt_estimate(), b.rtt_estimate());
    }

    #[test]
    fn no_idle_decay_while_requests_are_in_flight() {
        let (state, time) = ewma_state(Duration::from_millis(100));
        state.start();
        time.advance(Duration::from_secs(30));
        assert_eq!(
            state.rtt_estimate(),
            Duration::from_millis(100),
            "a stuck request is no idleness"
        );
        state.finish();
        let decayed = state.rtt_estimate().as_secs_f64() * 1000.0;
        assert!(
            (decayed - 100.0 * (-3.0f64).exp()).abs() < 0.01,
            "{decayed}"
        );
    }

    #[test]
    fn requests_waiting_longer_than_the_estimate_raise_it_before_any_completes() {
        let ms = |state: &EndpointLoad| state.rtt_estimate().as_secs_f64() * 1e3;
        let (state, time) = ewma_state(Duration::from_millis(100));
        let first = now(&state);
        state.start_waiting(first);
        time.advance(Duration::from_millis(50));
        let second = now(&state);
        state.start_waiting(second);
        assert_eq!((state.in_flight(), state.waiting()), (2, 2));
        assert_eq!(
            ms(&state),
            100.0,
            "ages 50 and 0 ms: younger than the estimate"
        );
        time.advance(Duration::from_millis(250));
        assert_eq!(
            ms(&state),
            275.0,
            "ages 300 and 250 ms: their mean is a lower bound"
        );
        state.stop_waiting(first);
        assert_eq!((state.in_flight(), state.waiting()), (2, 1));
        assert_eq!(ms(&state), 250.0, "the one still waiting");
        state.stop_waiting(second);
        assert_eq!(
            ms(&state),
            100.0,
            "sampled: back to the estimate, not decayed while in flight"
        );
        state.finish();
        state.finish();
        assert_eq!((state.in_flight(), state.waiting()), (0, 0));
        let idle = ms(&state);
        assert!((idle - 100.0 * (-0.03f64).exp()).abs() < 1e-6, "{idle}");
    }

    #[test]
    fn the_waiting_age_holds_when_the_sum_of_start_readings_wraps() {
        let (state, _time) = ewma_state(Duration::from_millis(1));
        // Starts near the top of u64 (the mock reads in nanoseconds): their sum wraps, the ages do not.
        state.start_waiting(u64::MAX - 10);
        state.start_waiting(u64::MAX - 30);
        let now = (u64::MAX - 10).wrapping_add(20_000_000);
        assert_eq!(state.waiting_age_ns(now, state.counts(), 2), 20_000_010.0);
        state.finish_waiting(u64::MAX - 10);
        state.finish_waiting(u64::MAX - 30);
        assert_eq!((state.in_flight(), state.waiting()), (0, 0));
    }

    #[test]
    fn in_flight_then_latency_orders_counts_first_and_has_no_peak() {
        let metric = LoadMetric::InFlightThenLatency(PeakEwmaConfig::default());
        let (clock, time) = Clock::mock();
        time.advance(Duration::from_secs(1));
        let slow = EndpointLoad::new(clock.clone(), &metric, Duration::from_secs(2));
        let fast = EndpointLoad::new(clock, &metric, Duration::from_micros(100));
        let at = now(&slow);
        // Equal counts: the faster average is lighter, by less than LATENCY_ORDER.
        assert!(metric.load(&fast, at) < metric.load(&slow, at));
        assert!(metric.load(&slow, at) < LATENCY_ORDER);
        // One more request in flight outweighs any average.
        fast.start();
        assert!(metric.load(&fast, at) > metric.load(&slow, at));
        fast.finish();
        // Weights that differ split ties by themselves: no latency in the load.
        assert_eq!(metric.weighted_load(&slow, at, 3.0), 0.0);
        // A sample above the average moves it by its weight only: no peak.
        time.advance(Duration::from_secs(10));
        fast.record_ns(1e9, now(&fast));
        let average = fast.average_ns(now(&fast), fast.counts());
        let expected = 1e5 * (-1.0f64).exp() + 1e9 * (1.0 - (-1.0f64).exp());
        assert!((average - expected).abs() < 1.0, "{average} {expected}");
        assert_eq!(
            fast.rtt_estimate(),
            Duration::from_secs(1),
            "the estimate peaks"
        );
    }

    #[test]
    fn debug_shows_counts_and_durations_not_float_bits() {
        let (state, _time) = ewma_state(Duration::from_millis(30));
        state.start();
        let shown = format!("{state:?}");
        assert_eq!(
            shown,
            "EndpointLoad { eligible: true, in_flight: 1, waiting: 0, picks: 1, rtt_estimate: 30ms, \
             latency_average: 30ms, measured: true, penalty: 1s, sample_at: ResponseHeaders, .. }"
        );
        state.finish();
    }

    #[test]
    fn the_cold_estimate_takes_the_first_sample_then_only_lower_ones_and_a_fixed_one_none() {
        let pooled = ColdStart::new(&LoadMetric::PeakEwma(PeakEwmaConfig::default()));
        assert_eq!((pooled.estimate_ns(), pooled.learned()), (30e6, false));
        pooled.learn(50e6);
        assert_eq!(
            (pooled.estimate_ns(), pooled.learned()),
            (50e6, true),
            "the first, even above the start"
        );
        pooled.learn(60e6);
        assert_eq!(pooled.estimate_ns(), 50e6);
        pooled.learn(0.0);
        pooled.learn(1e3);
        assert_eq!(pooled.estimate_ns(), 0.0, "the lowest");
        let fixed = ColdStart::new(&LoadMetric::PeakEwma(PeakEwmaConfig {
            default_rtt: DefaultRtt::Fixed(Duration::from_millis(5)),
            ..PeakEwmaConfig::default()
        }));
        fixed.learn(1e3);
        fixed.learn(0.0);
        assert_eq!((fixed.estimate_ns(), fixed.learned()), (5e6, false));
    }

    #[test]
    fn a_penalty_counts_as_a_peak() {
        let (state, _time) = ewma_state(Duration::from_millis(10));
        state.record_penalty(now(&state));
        assert_eq!(state.rtt_estimate(), Duration::from_secs(1));
    }

    #[test]
    fn load_is_estimate_times_in_flight_plus_one() {
        let (state, _time) = ewma_state(Duration::from_millis(10));
        let metric = LoadMetric::PeakEwma(PeakEwmaConfig::default());
        let at = now(&state);
        assert_eq!(metric.load(&state, at), 10_000_000.0);
        state.start();
        state.start();
        assert_eq!(metric.load(&state, at), 30_000_000.0);
        assert_eq!(LoadMetric::InFlight.load(&state, at), 2.0);
    }
}
