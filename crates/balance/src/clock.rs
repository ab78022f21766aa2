//! The clock latency is measured with.

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

/// The clock a balancer measures latency with (PeakEWMA reads it twice per request: at the pick, which
/// is also the request's start, and when the sample is taken).
///
/// It reads the CPU's time-stamp counter where that counter is invariant (calibrated once per process
/// against the operating system's monotonic clock, by the [`quanta`] crate), and the monotonic clock
/// itself elsewhere. On the virtual machines duet is measured on, a counter read costs ~12 ns against
/// ~30 ns for `Instant::now()` and its conversion; at two reads per request that is a third of what
/// PeakEWMA adds to a pick.
///
/// Tokio's paused time (`tokio::time::pause`) does not move this clock: a test that pauses tokio's time
/// gives the balancer [`Clock::tokio`], and one that wants exact latencies without a runtime a
/// [`Clock::mock`], with [`Balancer::with_clock`](crate::Balancer::with_clock).
///
/// ```
/// use duet_balance::{Balancer, Clock, Strategy};
/// use std::time::Duration;
///
/// let (clock, time) = Clock::mock();
/// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cPeakEwma).with_clock(clock);
/// balance.insert("a", 1, ());
/// // A request that takes 20 ms: the endpoint's first answer replaces the 30 ms start estimate.
/// let (_, _, guard) = balance.pick_and_claim().expect("one endpoint");
/// time.advance(Duration::from_millis(20));
/// drop(guard);
/// time.advance(Duration::from_secs(10));
/// // An idle endpoint's estimate decays with τ = 10 s: e^-1 of it is left.
/// let estimate = balance.endpoint_load(&"a").map(|load| load.rtt_estimate());
/// assert_eq!(estimate.map(|e| e.as_micros()), Some(7_357));
/// ```
#[derive(Clone)]
pub struct Clock {
    source: Source,
    /// Nanoseconds per tick: differences are scaled with one multiplication.
    ns_per_tick: f64,
}

#[derive(Clone)]
enum Source {
    /// The counter, the monotonic clock or a mock, as quanta decides.
    Quanta(quanta::Clock),
    /// Tokio's clock, from this instant on: readings are nanoseconds since it.
    Tokio(tokio::time::Instant),
}

/// The hand that moves a [`Clock::mock`]: time stands still until [`advance`](Self::advance) is called.
#[derive(Clone)]
pub struct MockTime {
    inner: Arc<quanta::Mock>,
}

impl Clock {
    /// The process's clock: the time-stamp counter where it can be trusted, else the monotonic clock.
    /// The first call calibrates (about a millisecond); later ones share the calibration.
    pub fn new() -> Self {
        static PROCESS: OnceLock<quanta::Clock> = OnceLock::new();
        Self::quanta(PROCESS.get_or_init(quanta::Clock::new).clone())
    }

    fn quanta(clock: quanta::Clock) -> Self {
        // The counter's calibration is a linear scale: read it once as a factor.
        const SPAN: u64 = 1 << 40;
        let ns_per_tick = clock.delta_as_nanos(0, SPAN) as f64 / SPAN as f64;
        Self {
            source: Source::Quanta(clock),
            ns_per_tick,
        }
    }

    /// Tokio's clock (`tokio::time::Instant`), which `tokio::time::pause` stops and
    /// `tokio::time::advance` moves: for tests that drive time through tokio. Costs a clock read and a
    /// look-up of the runtime's context per reading.
    pub fn tokio() -> Self {
        Self {
            source: Source::Tokio(tokio::time::Instant::now()),
            ns_per_tick: 1.0,
        }
    }

    /// A clock that only moves when the returned [`MockTime`] is advanced: for tests and simulations
    /// that need exact latencies.
    pub fn mock() -> (Self, MockTime) {
        let (inner, mock) = quanta::Clock::mock();
        (Self::quanta(inner), MockTime { inner: mock })
    }

    /// A reading, in the clock's own ticks: only differences taken with [`nanos`](Self::nanos) mean
    /// anything.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match &self.source {
            Source::Quanta(clock) => clock.raw(),
            Source::Tokio(origin) => {
                let elapsed = tokio::time::Instant::now().saturating_duration_since(*origin);
                elapsed.as_secs() * 1_000_000_000 + u64::from(elapsed.subsec_nanos())
            }
        }
    }

    /// Nanoseconds from the reading `from` to the reading `to`; 0 if `to` is not later.
    #[inline]
    pub(crate) fn nanos(&self, from: u64, to: u64) -> f64 {
        self.ticks_as_nanos(to.saturating_sub(from))
    }

    /// A span of `ticks` in nanoseconds.
    #[inline]
    pub(crate) fn ticks_as_nanos(&self, ticks: u64) -> f64 {
        ticks as f64 * self.ns_per_tick
    }

    /// Nanoseconds per tick.
    #[inline]
    pub(crate) fn ns_per_tick(&self) -> f64 {
        self.ns_per_tick
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Clock").finish_non_exhaustive()
    }
}

impl MockTime {
    /// Moves the mock clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.inner.increment(by);
    }
}

impl fmt::Debug for MockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockTime").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_clock_measures_in_nanoseconds() {
        use std::time::Instant;
        let clock = Clock::new();
        // Each counter reading is bracketed by two monotonic ones: a preemption between a pair only
        // widens the bracket, so the check holds on a loaded machine.
        let outer_start = Instant::now();
        let before = clock.now();
        let inner_start = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let inner_end = Instant::now();
        let after = clock.now();
        let outer_end = Instant::now();
        let measured = clock.nanos(before, after);
        // The calibration against the monotonic clock is good to well under a percent.
        let low = (inner_end - inner_start).as_nanos() as f64 * 0.99;
        let high = (outer_end - outer_start).as_nanos() as f64 * 1.01;
        assert!(
            (low..=high).contains(&measured),
            "{measured} ns, outside [{low}, {high}]"
        );
        assert_eq!(
            clock.nanos(after, before),
            0.0,
            "a later reading first is no time"
        );
    }

    #[test]
    fn a_mock_clock_moves_only_when_advanced() {
        let (clock, time) = Clock::mock();
        let start = clock.now();
        assert_eq!(clock.nanos(start, clock.now()), 0.0);
        time.advance(Duration::from_micros(1500));
        assert_eq!(clock.nanos(start, clock.now()), 1_500_000.0);
    }
}
