//! One route's hedging in one worker: how long a first attempt may wait before it is hedged (from the
//! route's recent response-head times, as this worker saw them) and the budget that bounds hedges to
//! `max_extra` of the route's hedgeable requests. Nothing here is shared with another worker, nor with
//! the retry budget: a retry replaces a failed attempt, a hedge adds one beside a slow one.

use duet_config::{Hedge, HedgeAfter};
use std::{cell::RefCell, time::Duration};

/// Response-head times kept: the percentile is of the route's last this many first attempts.
const WINDOW: usize = 1024;
/// Samples needed before a percentile is trusted enough to hedge on.
const WARM_UP: u64 = 100;
/// The percentile is computed again after this many new samples, not on every request.
const REFRESH_EVERY: u64 = 32;
/// No hedge sooner than this, whatever the percentile says: below it a second attempt is noise.
const FLOOR: Duration = Duration::from_millis(1);
/// Most hedges the budget saves up while none is needed (a burst after a quiet spell).
const MAX_TOKENS: u64 = 10;
/// One hedge's worth of budget, in the unit `max_extra_ppm` is written in: whole numbers, so 20
/// requests at 5% earn exactly one hedge.
const TOKEN: u64 = 1_000_000;

/// A route's hedging in one worker.
#[derive(Debug)]
pub(crate) struct RouteHedging {
    pub(crate) config: Hedge,
    state: RefCell<State>,
}

#[derive(Debug)]
struct State {
    /// The last [`WINDOW`] first attempts' response-head times, in microseconds, as a ring.
    samples: Vec<u32>,
    /// Samples ever recorded: where the ring's next one goes, and whether warm-up is over.
    recorded: u64,
    /// The current hedge delay (`None` until warmed up, for a percentile).
    delay: Option<Duration>,
    /// Hedges the route may still send, in millionths: each hedgeable request earns `max_extra`, a
    /// hedge spends a whole one.
    tokens: u64,
}

impl RouteHedging {
    pub(crate) fn new(config: Hedge) -> Self {
        let delay = match config.after {
            HedgeAfter::Fixed(after) => Some(after),
            HedgeAfter::Percentile(_) => None,
        };
        Self {
            config,
            state: RefCell::new(State {
                samples: Vec::new(),
                recorded: 0,
                delay,
                tokens: 0,
            }),
        }
    }

    /// Whether the route hedges requests with `method`.
    pub(crate) fn hedges(&self, method: &http::Method) -> bool {
        self.config.methods.iter().any(|m| m == method.as_str())
    }

    /// A hedgeable request arrived: it earns its share of a hedge. Returns how long its first attempt
    /// may wait before being hedged (`None` while a percentile is still warming up).
    pub(crate) fn arrived(&self) -> Option<Duration> {
        let mut state = self.state.borrow_mut();
        let earned = state.tokens + u64::from(self.config.max_extra_ppm);
        state.tokens = earned.min(MAX_TOKENS * TOKEN);
        state.delay
    }

    /// Spends one token for a hedge, if the budget has one.
    pub(crate) fn withdraw(&self) -> bool {
        let mut state = self.state.borrow_mut();
        if state.tokens < TOKEN {
            return false;
        }
        state.tokens -= TOKEN;
        true
    }

    /// Whether the budget has a token now (checked before a backend is claimed for the hedge).
    pub(crate) fn can_withdraw(&self) -> bool {
        self.state.borrow().tokens >= TOKEN
    }

    /// A first attempt's response-head time (or, for one dropped because its hedge answered first,
    /// the time it had waited: a lower bound above the delay, which is all a percentile at or above
    /// the delay needs to know of it).
    pub(crate) fn record(&self, head_time: Duration) {
        let HedgeAfter::Percentile(tenths) = self.config.after else {
            return;
        };
        let mut state = self.state.borrow_mut();
        let micros = u32::try_from(head_time.as_micros()).unwrap_or(u32::MAX);
        let at = (state.recorded % WINDOW as u64) as usize;
        if at < state.samples.len() {
            state.samples[at] = micros;
        } else {
            state.samples.push(micros);
        }
        state.recorded += 1;
        let due = state.recorded == WARM_UP
            || state.recorded > WARM_UP && state.recorded.is_multiple_of(REFRESH_EVERY);
        if due {
            state.delay = Some(percentile(&state.samples, tenths).max(FLOOR));
        }
    }
}

/// The percentile (in tenths of a percent) of `samples` (microseconds), by rank: the smallest sample
/// with at least that share of the samples at or below it.
fn percentile(samples: &[u32], tenths: u16) -> Duration {
    if samples.is_empty() {
        return FLOOR;
    }
    let mut sorted = samples.to_vec();
    let rank = (usize::from(tenths) * sorted.len())
        .div_ceil(1000)
        .clamp(1, sorted.len())
        - 1;
    let (_, value, _) = sorted.select_nth_unstable(rank);
    Duration::from_micros(u64::from(*value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hedging(after: HedgeAfter, max_extra_ppm: u32) -> RouteHedging {
        RouteHedging::new(Hedge {
            after,
            max_extra_ppm,
            methods: Hedge::default_methods(),
        })
    }

    #[test]
    fn a_percentile_waits_for_its_warm_up_then_follows_the_window_with_a_floor() {
        let route = hedging(HedgeAfter::Percentile(950), 50_000);
        for i in 0..WARM_UP - 1 {
            route.record(Duration::from_millis(i % 100 + 1));
            assert_eq!(route.arrived(), None, "warming up at {i}");
        }
        route.record(Duration::from_millis(100));
        // 1..=100 ms once each: the 95th percentile is 95 ms.
        assert_eq!(route.arrived(), Some(Duration::from_millis(95)));
        // A window of fast answers brings it down, never below the floor.
        for _ in 0..WINDOW {
            route.record(Duration::from_micros(40));
        }
        assert_eq!(route.arrived(), Some(FLOOR));
    }

    #[test]
    fn a_fixed_delay_needs_no_warm_up_and_ignores_samples() {
        let route = hedging(HedgeAfter::Fixed(Duration::from_millis(20)), 50_000);
        assert_eq!(route.arrived(), Some(Duration::from_millis(20)));
        route.record(Duration::from_secs(1));
        assert_eq!(route.arrived(), Some(Duration::from_millis(20)));
    }

    #[test]
    fn the_budget_allows_max_extra_of_requests_and_saves_up_only_a_few() {
        let route = hedging(HedgeAfter::Fixed(Duration::from_millis(1)), 50_000);
        let mut hedges = 0;
        for _ in 0..1_000 {
            route.arrived();
            if route.can_withdraw() && route.withdraw() {
                hedges += 1;
            }
        }
        assert_eq!(hedges, 50, "5% of 1,000, every one wanted");
        // A long quiet spell saves up at most MAX_TOKENS.
        for _ in 0..10_000 {
            route.arrived();
        }
        let burst = (0..100).take_while(|_| route.withdraw()).count();
        assert_eq!(burst, MAX_TOKENS as usize);
    }
}
