//! Load metrics and the per-endpoint state they read.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    time::Duration,
};
use tokio::time::Instant;

/// What "lighter" means when two candidates are compared.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LoadMetric {
    /// Requests this balancer has in flight to the endpoint (tower's `PendingRequests`).
    InFlight,
    /// Peak-sensitive EWMA of latency times (in flight + 1): Finagle's and Linkerd's `PeakEWMA`.
    PeakEwma(PeakEwmaConfig),
}

impl Default for LoadMetric {
    fn default() -> Self {
        Self::PeakEwma(PeakEwmaConfig::default())
    }
}

impl LoadMetric {
    pub(crate) fn uses_clock(&self) -> bool {
        matches!(self, Self::PeakEwma(_))
    }

    /// The load of `state` at `now`. Reading never changes the state.
    #[inline]
    pub(crate) fn load(&self, state: &EndpointLoad, now: Instant) -> f64 {
        match self {
            Self::InFlight => state.in_flight() as f64,
            Self::PeakEwma(_) => {
                let in_flight = state.in_flight();
                peak_ewma::load(state.estimate_ns(now, in_flight), in_flight)
            }
        }
    }

    /// The load of an endpoint of `weight` (its capacity, in units): weight divides the concurrency, never
    /// the latency. In flight: `in_flight / weight`. PeakEWMA: `estimate × (1 + in_flight / weight)`, which
    /// is [`load`](Self::load) at weight 1. See the crate docs for why.
    #[inline]
    pub(crate) fn weighted_load(&self, state: &EndpointLoad, now: Instant, weight: f64) -> f64 {
        let in_flight = state.in_flight();
        let concurrency = in_flight as f64 / weight;
        match self {
            Self::InFlight => concurrency,
            Self::PeakEwma(_) => state.estimate_ns(now, in_flight) * (1.0 + concurrency),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DefaultRtt {
    /// The median of the current endpoints' estimates, or 30 ms when there are none. A newcomer then
    /// neither looks idle (and gets stampeded) nor looks slow (and gets starved).
    #[default]
    PoolMedian,
    /// A fixed estimate.
    Fixed(Duration),
}

/// Settings of the [`LoadMetric::PeakEwma`] metric.
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
    /// Estimate of a new endpoint. Default: the pool median.
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

pub(crate) const FALLBACK_RTT: Duration = Duration::from_millis(30);

/// The load state of one endpoint in one balancer.
///
/// Shared (by `Arc`) between the balancer and the guards of requests in flight, which may complete on
/// other threads; all fields are atomics. Each balancer has its own: nothing here is shared between
/// duet's workers. A control plane may hold the `Arc` to read it for metrics.
#[derive(Debug)]
pub struct EndpointLoad {
    in_flight: AtomicU64,
    /// Whether the balancer may pick it: the one copy of that flag, kept by the balancer.
    eligible: AtomicBool,
    picks: AtomicU64,
    /// Requests whose latency sample is still to come, and the sum of their start times (nanoseconds
    /// since `epoch`): their mean age is a lower bound on the latency now.
    awaiting: AtomicU64,
    awaiting_since_ns: AtomicU64,
    /// f64 bits of the estimate in nanoseconds.
    ewma_ns: AtomicU64,
    /// Nanoseconds since `epoch` of the last sample.
    stamp_ns: AtomicU64,
    epoch: Instant,
    tau_ns: f64,
    penalty_ns: f64,
    sample_at: SampleAt,
}

impl EndpointLoad {
    pub(crate) fn new(
        epoch: Instant,
        now: Instant,
        metric: &LoadMetric,
        initial_rtt: Duration,
    ) -> Self {
        let (tau, penalty, sample_at) = match metric {
            LoadMetric::PeakEwma(cfg) => (cfg.decay, cfg.penalty, cfg.sample_at),
            LoadMetric::InFlight => (
                Duration::from_secs(10),
                Duration::from_secs(1),
                SampleAt::default(),
            ),
        };
        Self {
            in_flight: AtomicU64::new(0),
            eligible: AtomicBool::new(true),
            picks: AtomicU64::new(0),
            awaiting: AtomicU64::new(0),
            awaiting_since_ns: AtomicU64::new(0),
            ewma_ns: AtomicU64::new((initial_rtt.as_nanos() as u64 as f64).to_bits()),
            stamp_ns: AtomicU64::new(since(epoch, now)),
            epoch,
            tau_ns: (tau.as_nanos() as u64 as f64).max(1.0),
            penalty_ns: penalty.as_nanos() as u64 as f64,
            sample_at,
        }
    }

    /// Whether the balancer may pick this endpoint (healthy, not ejected; see
    /// [`Balance::set_eligible`](crate::Balance::set_eligible)).
    pub fn is_eligible(&self) -> bool {
        self.eligible.load(Relaxed)
    }

    pub(crate) fn set_eligible(&self, eligible: bool) {
        self.eligible.store(eligible, Relaxed);
    }

    /// Requests in flight to this endpoint through this balancer.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    /// Requests in flight whose latency sample is still to come (at most [`in_flight`](Self::in_flight)).
    pub fn waiting(&self) -> u64 {
        self.awaiting.load(Relaxed)
    }

    /// How many times this endpoint was picked.
    pub fn picks(&self) -> u64 {
        self.picks.load(Relaxed)
    }

    /// The latency estimate as seen at `now`: decayed toward zero since the last sample, and never below
    /// the mean age of the requests still waiting for their sample. Computed, not stored.
    pub fn rtt_estimate(&self, now: Instant) -> Duration {
        Duration::from_nanos(self.estimate_ns(now, self.in_flight()) as u64)
    }

    /// The estimate at `now`, given the in-flight count the caller has read (once per load read).
    #[inline]
    pub(crate) fn estimate_ns(&self, now: Instant, in_flight: u64) -> f64 {
        let now_ns = since(self.epoch, now);
        let ewma = f64::from_bits(self.ewma_ns.load(Relaxed));
        let elapsed = now_ns.saturating_sub(self.stamp_ns.load(Relaxed));
        let projected = peak_ewma::project(ewma, elapsed as f64, self.tau_ns, in_flight);
        if in_flight == 0 {
            return projected;
        }
        projected.max(self.awaiting_age_ns(now_ns))
    }

    /// The mean age of the requests waiting for their sample; 0 when there are none.
    #[inline]
    fn awaiting_age_ns(&self, now_ns: u64) -> f64 {
        // The count and the sum are two atomics: a read between a guard's two updates (only possible
        // when guards settle on other threads) sees one request more or less in one of them, an error
        // that lasts one update and is bounded by one request's share of the mean.
        let waiting = self.awaiting.load(Relaxed);
        if waiting == 0 {
            return 0.0;
        }
        let mean_start = self.awaiting_since_ns.load(Relaxed) / waiting;
        now_ns.saturating_sub(mean_start) as f64
    }

    /// A request started at `started` waits for its sample; returns its start as the guard keeps it.
    pub(crate) fn await_sample(&self, started: Instant) -> u64 {
        let started_ns = since(self.epoch, started);
        self.awaiting_since_ns.fetch_add(started_ns, Relaxed);
        self.awaiting.fetch_add(1, Relaxed);
        started_ns
    }

    /// The request that [`await_sample`](Self::await_sample) returned `started_ns` for no longer waits.
    pub(crate) fn stop_awaiting(&self, started_ns: u64) {
        self.awaiting.fetch_sub(1, Relaxed);
        self.awaiting_since_ns.fetch_sub(started_ns, Relaxed);
    }

    pub(crate) fn start(&self) {
        self.in_flight.fetch_add(1, Relaxed);
        self.picks.fetch_add(1, Relaxed);
    }

    pub(crate) fn finish(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    pub(crate) fn sample_at(&self) -> SampleAt {
        self.sample_at
    }

    /// Replaces the estimate (re-admission after ejection or failed health checks).
    pub(crate) fn reset_estimate(&self, rtt: Duration, now: Instant) {
        self.ewma_ns
            .store((rtt.as_nanos() as u64 as f64).to_bits(), Relaxed);
        self.stamp_ns.store(since(self.epoch, now), Relaxed);
    }

    pub(crate) fn record_penalty(&self, now: Instant) {
        self.record_ns(self.penalty_ns, now);
    }

    pub(crate) fn record(&self, rtt: Duration, now: Instant) {
        self.record_ns(rtt.as_nanos() as u64 as f64, now);
    }

    fn record_ns(&self, rtt_ns: f64, now: Instant) {
        let now_ns = since(self.epoch, now);
        let elapsed = now_ns.saturating_sub(self.stamp_ns.load(Relaxed)) as f64;
        let tau = self.tau_ns;
        // The pair (estimate, stamp) is not updated as one: two samples completing at the same instant on
        // two threads may each decay from the other's stamp. The error is bounded by one sample's weight
        // and cannot happen in duet's single-threaded workers.
        let _ = self.ewma_ns.fetch_update(Relaxed, Relaxed, |bits| {
            Some(peak_ewma::update(f64::from_bits(bits), rtt_ns, elapsed, tau).to_bits())
        });
        if now_ns > self.stamp_ns.load(Relaxed) {
            self.stamp_ns.store(now_ns, Relaxed);
        }
    }
}

/// The PeakEWMA arithmetic on plain numbers (any time unit, used consistently), shared by the balancer
/// and by simulations that run on virtual time.
pub mod peak_ewma {
    /// The estimate after a sample `rtt` taken `elapsed` after the previous one: a higher sample replaces
    /// it (peak); otherwise `ewma·w + rtt·(1 − w)` with `w = exp(−elapsed/τ)`.
    #[inline]
    pub fn update(ewma: f64, rtt: f64, elapsed: f64, tau: f64) -> f64 {
        if rtt > ewma {
            rtt
        } else {
            let w = decay(elapsed / tau);
            ewma * w + rtt * (1.0 - w)
        }
    }

    /// `exp(-x)`, by its Taylor polynomial when `x` is tiny: samples and reads microseconds apart with τ
    /// in seconds are the common case, and the polynomial's error there (below x³/6 < 2·10⁻¹⁰) is far
    /// under anything a load comparison can notice, at a fraction of `exp`'s cost.
    #[inline]
    fn decay(x: f64) -> f64 {
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
        if elapsed <= 0.0 || in_flight > 0 {
            ewma
        } else {
            ewma * decay(elapsed / tau)
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

fn since(epoch: Instant, now: Instant) -> u64 {
    let elapsed = now.saturating_duration_since(epoch);
    elapsed.as_secs() * 1_000_000_000 + u64::from(elapsed.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ewma_state(now: Instant, initial: Duration) -> EndpointLoad {
        EndpointLoad::new(
            now,
            now,
            &LoadMetric::PeakEwma(PeakEwmaConfig::default()),
            initial,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_sample_is_taken_at_once() {
        let now = Instant::now();
        let state = ewma_state(now, Duration::from_millis(10));
        state.record(Duration::from_millis(500), now);
        assert_eq!(state.rtt_estimate(now), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn lower_samples_pull_the_estimate_down_with_time_constant() {
        let start = Instant::now();
        let state = ewma_state(start, Duration::from_millis(100));
        tokio::time::advance(Duration::from_secs(10)).await;
        let now = Instant::now();
        state.record(Duration::from_millis(10), now);
        // w = e^-1: 100·0.3679 + 10·0.6321 = 43.11 ms
        let got = state.rtt_estimate(now).as_secs_f64() * 1000.0;
        assert!((got - 43.11).abs() < 0.05, "{got}");
    }

    #[tokio::test(start_paused = true)]
    async fn reading_does_not_change_the_estimate() {
        let start = Instant::now();
        let a = ewma_state(start, Duration::from_millis(100));
        let b = ewma_state(start, Duration::from_millis(100));
        for _ in 0..100 {
            tokio::time::advance(Duration::from_millis(50)).await;
            let _ = a.rtt_estimate(Instant::now());
        }
        let now = Instant::now();
        assert_eq!(a.rtt_estimate(now), b.rtt_estimate(now));
        // Idle decay is projected: 5 s at τ = 10 s leaves e^-0.5 of the estimate.
        let got = a.rtt_estimate(now).as_secs_f64() * 1000.0;
        assert!((got - 100.0 * (-0.5f64).exp()).abs() < 0.01, "{got}");
        a.record(Duration::from_millis(20), now);
        b.record(Duration::from_millis(20), now);
        assert_eq!(a.rtt_estimate(now), b.rtt_estimate(now));
    }

    #[tokio::test(start_paused = true)]
    async fn no_idle_decay_while_requests_are_in_flight() {
        let start = Instant::now();
        let state = ewma_state(start, Duration::from_millis(100));
        state.start();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(
            state.rtt_estimate(Instant::now()),
            Duration::from_millis(100),
            "a stuck request is no idleness"
        );
        state.finish();
        let decayed = state.rtt_estimate(Instant::now()).as_secs_f64() * 1000.0;
        assert!(
            (decayed - 100.0 * (-3.0f64).exp()).abs() < 0.01,
            "{decayed}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_waiting_longer_than_the_estimate_raise_it_before_any_completes() {
        let ms = |state: &EndpointLoad| state.rtt_estimate(Instant::now()).as_secs_f64() * 1e3;
        let start = Instant::now();
        let state = ewma_state(start, Duration::from_millis(100));
        state.start();
        let first = state.await_sample(start);
        tokio::time::advance(Duration::from_millis(50)).await;
        state.start();
        let second = state.await_sample(Instant::now());
        assert_eq!(
            ms(&state),
            100.0,
            "ages 50 and 0 ms: younger than the estimate"
        );
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(
            ms(&state),
            275.0,
            "ages 300 and 250 ms: their mean is a lower bound"
        );
        state.stop_awaiting(first);
        assert_eq!(ms(&state), 250.0, "the one still waiting");
        state.stop_awaiting(second);
        assert_eq!(
            ms(&state),
            100.0,
            "sampled: back to the estimate, not decayed while in flight"
        );
        state.finish();
        state.finish();
        let idle = ms(&state);
        assert!((idle - 100.0 * (-0.03f64).exp()).abs() < 1e-6, "{idle}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_penalty_counts_as_a_peak() {
        let now = Instant::now();
        let state = ewma_state(now, Duration::from_millis(10));
        state.record_penalty(now);
        assert_eq!(state.rtt_estimate(now), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn load_is_estimate_times_in_flight_plus_one() {
        let now = Instant::now();
        let state = ewma_state(now, Duration::from_millis(10));
        let metric = LoadMetric::PeakEwma(PeakEwmaConfig::default());
        assert_eq!(metric.load(&state, now), 10_000_000.0);
        state.start();
        state.start();
        assert_eq!(metric.load(&state, now), 30_000_000.0);
        assert_eq!(LoadMetric::InFlight.load(&state, now), 2.0);
    }
}
