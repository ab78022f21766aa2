//! Passive outlier ejection: each worker ejects the backends that keep failing its own requests.
//!
//! Two streaks, each with its own threshold: failures of the backend's own making (connect, timeout,
//! reset, garbage) and, only when `consecutive_5xx` is set, 5xx responses, which one client's requests
//! can provoke. Nothing else ejects: a `429` or a `Retry-After` is about one client, not the backend.

use duet_config::OutlierDetection;
use rustc_hash::FxBuildHasher;
use std::{collections::HashMap, net::SocketAddr, time::Duration};
use tokio::time::Instant;

#[derive(Debug, Default, Clone, Copy)]
struct State {
    consecutive_failures: u32,
    consecutive_5xx: u32,
    /// Ejections in a row, for the exponential back-off; reset once the backend serves well again.
    ejections: u32,
    ejected_until: Option<Instant>,
}

/// One worker's view of which backends of a cluster are failing.
#[derive(Debug)]
pub(crate) struct Outliers {
    config: OutlierDetection,
    backends: usize,
    states: HashMap<SocketAddr, State, FxBuildHasher>,
}

impl Outliers {
    pub(crate) fn new(config: OutlierDetection, backends: usize) -> Self {
        Self {
            config,
            backends,
            states: HashMap::default(),
        }
    }

    /// The most backends that may be ejected at once: `max_ejection_percent` of the cluster rounded down,
    /// but at least one when there are two or more (as Envoy: a dead backend among a few is still shed),
    /// and never the last one.
    fn max_ejected(&self) -> usize {
        // The epsilon keeps 29% of 100 at 29 (the product is 28.999...).
        let by_fraction =
            (self.backends as f64 * self.config.max_ejection_fraction + 1e-9).floor() as usize;
        let floor = usize::from(self.backends >= 2 && self.config.max_ejection_fraction > 0.0);
        by_fraction.max(floor).min(self.backends.saturating_sub(1))
    }

    fn ejected_now(&self, now: Instant) -> usize {
        self.states
            .values()
            .filter(|s| s.ejected_until.is_some_and(|t| t > now))
            .count()
    }

    /// The same view under new settings (after a reload).
    pub(crate) fn configured(mut self, config: OutlierDetection) -> Self {
        self.config = config;
        self
    }

    /// Forgets backends that left the cluster; `backends` is the new cluster size.
    pub(crate) fn retain(&mut self, keep: impl Fn(&SocketAddr) -> bool, backends: usize) {
        self.states.retain(|address, _| keep(address));
        self.backends = backends;
    }

    /// The backends ejected at `now`, with when their ejection ends.
    pub(crate) fn ejected(&self, now: Instant) -> impl Iterator<Item = (SocketAddr, Instant)> + '_ {
        self.states
            .iter()
            .filter_map(move |(&address, s)| Some((address, s.ejected_until.filter(|&t| t > now)?)))
    }

    pub(crate) fn is_ejected(&self, backend: SocketAddr, now: Instant) -> bool {
        self.states
            .get(&backend)
            .and_then(|s| s.ejected_until)
            .is_some_and(|t| t > now)
    }

    /// Records a response that was not a 5xx (and whose body, if any, ended cleanly): both streaks end.
    pub(crate) fn record_success(&mut self, backend: SocketAddr, now: Instant) {
        if let Some(state) = self.states.get_mut(&backend) {
            state.consecutive_failures = 0;
            state.consecutive_5xx = 0;
            let calm_since = state
                .ejected_until
                .map(|t| t + self.config.base_ejection_time);
            if calm_since.is_none_or(|t| now >= t) {
                state.ejections = 0;
            }
        }
    }

    /// Records a failure of the backend's own making; returns how long the backend is ejected for, if
    /// this failure ejects it.
    pub(crate) fn record_failure(&mut self, backend: SocketAddr, now: Instant) -> Option<Duration> {
        let threshold = self.config.consecutive_failures;
        self.record(backend, now, threshold, |state| {
            &mut state.consecutive_failures
        })
    }

    /// Records a 5xx response; ejects only when `consecutive_5xx` is set and reached.
    pub(crate) fn record_server_error(
        &mut self,
        backend: SocketAddr,
        now: Instant,
    ) -> Option<Duration> {
        let threshold = self.config.consecutive_5xx;
        self.record(backend, now, threshold, |state| &mut state.consecutive_5xx)
    }

    /// Extends one streak; ejects once it reaches `threshold` (0: that streak never ejects).
    fn record(
        &mut self,
        backend: SocketAddr,
        now: Instant,
        threshold: u32,
        streak: fn(&mut State) -> &mut u32,
    ) -> Option<Duration> {
        if threshold == 0 {
            return None;
        }
        let state = self.states.entry(backend).or_default();
        let count = streak(state);
        *count += 1;
        if *count < threshold {
            return None;
        }
        let base = self.config.base_ejection_time;
        let ejections = state.ejections;
        let time = base
            .saturating_mul(1u32 << ejections.min(16))
            .min(self.config.max_ejection_time.max(base));
        self.eject(backend, time, now)
    }

    /// Ejects `backend` for `time` unless that would exceed the ejection cap. Returns the time if ejected.
    fn eject(&mut self, backend: SocketAddr, time: Duration, now: Instant) -> Option<Duration> {
        if self.is_ejected(backend, now)
            || self.ejected_now(now) >= self.max_ejected()
            || time.is_zero()
        {
            return None;
        }
        let state = self.states.entry(backend).or_default();
        state.consecutive_failures = 0;
        state.consecutive_5xx = 0;
        state.ejections = state.ejections.saturating_add(1);
        state.ejected_until = Some(now + time);
        Some(time)
    }
}

impl Default for Outliers {
    fn default() -> Self {
        Self::new(OutlierDetection::default(), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn config() -> OutlierDetection {
        OutlierDetection {
            consecutive_failures: 3,
            consecutive_5xx: 0,
            base_ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(60),
            max_ejection_fraction: 0.5,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_eject_with_growing_time() {
        let mut outliers = Outliers::new(config(), 4);
        let now = Instant::now();
        assert_eq!(outliers.record_failure(addr(1), now), None);
        assert_eq!(outliers.record_failure(addr(1), now), None);
        assert_eq!(
            outliers.record_failure(addr(1), now),
            Some(Duration::from_secs(10))
        );
        assert!(outliers.is_ejected(addr(1), now));
        let later = now + Duration::from_secs(11);
        assert!(!outliers.is_ejected(addr(1), later));
        for _ in 0..2 {
            outliers.record_failure(addr(1), later);
        }
        assert_eq!(
            outliers.record_failure(addr(1), later),
            Some(Duration::from_secs(20)),
            "doubled"
        );
        let much_later = later + Duration::from_secs(500);
        outliers.record_success(addr(1), much_later);
        for _ in 0..2 {
            outliers.record_failure(addr(1), much_later);
        }
        assert_eq!(
            outliers.record_failure(addr(1), much_later),
            Some(Duration::from_secs(10)),
            "reset"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_streak() {
        let mut outliers = Outliers::new(config(), 4);
        let now = Instant::now();
        outliers.record_failure(addr(1), now);
        outliers.record_failure(addr(1), now);
        outliers.record_success(addr(1), now);
        assert_eq!(outliers.record_failure(addr(1), now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn never_more_than_the_ejection_cap() {
        let mut outliers = Outliers::new(config(), 4);
        let now = Instant::now();
        let mut ejected = 0;
        for port in 1..=4 {
            for _ in 0..3 {
                if outliers.record_failure(addr(port), now).is_some() {
                    ejected += 1;
                }
            }
        }
        assert_eq!(ejected, 2, "50% of 4");
        let mut single = Outliers::new(config(), 1);
        for _ in 0..10 {
            assert_eq!(
                single.record_failure(addr(9), now),
                None,
                "the only backend is never ejected"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn responses_eject_only_when_consecutive_5xx_is_set() {
        let now = Instant::now();
        let mut off = Outliers::new(config(), 4);
        for _ in 0..100 {
            assert_eq!(off.record_server_error(addr(1), now), None);
        }
        assert!(!off.is_ejected(addr(1), now));
        assert_eq!(
            off.record_failure(addr(1), now),
            None,
            "5xx responses do not extend the failure streak"
        );
        let mut on = Outliers::new(
            OutlierDetection {
                consecutive_5xx: 2,
                ..config()
            },
            4,
        );
        assert_eq!(on.record_server_error(addr(1), now), None);
        on.record_success(addr(1), now);
        assert_eq!(on.record_server_error(addr(1), now), None, "reset");
        assert_eq!(
            on.record_server_error(addr(1), now),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn the_default_cap_is_one_backend_below_twenty() {
        let cap = |backends| Outliers::new(OutlierDetection::default(), backends).max_ejected();
        let caps: Vec<usize> = [1, 2, 4, 10, 19, 20, 29, 30, 100].map(cap).to_vec();
        assert_eq!(caps, [0, 1, 1, 1, 1, 2, 2, 3, 10]);
        let percent = |fraction, backends| {
            Outliers::new(
                OutlierDetection {
                    max_ejection_fraction: fraction,
                    ..config()
                },
                backends,
            )
            .max_ejected()
        };
        assert_eq!(percent(0.29, 100), 29);
        assert_eq!(percent(0.0, 100), 0, "0% turns ejection off");
        assert_eq!(percent(1.0, 4), 3, "never the last one");
    }
}
