//! Passive outlier ejection: each worker ejects the backends that keep failing its own requests.

use duet_config::OutlierDetection;
use rustc_hash::FxBuildHasher;
use std::{collections::HashMap, net::SocketAddr, time::Duration};
use tokio::time::Instant;

#[derive(Debug, Default, Clone, Copy)]
struct State {
    consecutive_failures: u32,
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

    /// The most backends that may be ejected at once: `max_ejection_percent` of the cluster, but at least
    /// one when there are two or more (so a pair can still shed its bad half), and never the last one.
    fn max_ejected(&self) -> usize {
        let by_fraction =
            (self.backends as f64 * self.config.max_ejection_fraction).floor() as usize;
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

    pub(crate) fn record_success(&mut self, backend: SocketAddr, now: Instant) {
        if let Some(state) = self.states.get_mut(&backend) {
            state.consecutive_failures = 0;
            let calm_since = state
                .ejected_until
                .map(|t| t + self.config.base_ejection_time);
            if calm_since.is_none_or(|t| now >= t) {
                state.ejections = 0;
            }
        }
    }

    /// Records a failure; returns how long the backend is ejected for, if this failure ejects it.
    pub(crate) fn record_failure(&mut self, backend: SocketAddr, now: Instant) -> Option<Duration> {
        if self.config.consecutive_failures == 0 {
            return None;
        }
        let state = self.states.entry(backend).or_default();
        state.consecutive_failures += 1;
        if state.consecutive_failures < self.config.consecutive_failures {
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
    pub(crate) fn eject(
        &mut self,
        backend: SocketAddr,
        time: Duration,
        now: Instant,
    ) -> Option<Duration> {
        if self.is_ejected(backend, now)
            || self.ejected_now(now) >= self.max_ejected()
            || time.is_zero()
        {
            return None;
        }
        let state = self.states.entry(backend).or_default();
        state.consecutive_failures = 0;
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
}
