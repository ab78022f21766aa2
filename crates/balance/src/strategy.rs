//! The balancing strategies by the names duet's config gives them: each a selection policy paired
//! with the load metric it is meant for.

use crate::{
    load::{LoadMetric, PeakEwmaConfig},
    policy::Policy,
};
use std::{error::Error, fmt, str::FromStr};

/// How a balancer chooses, by the name duet's config uses (`policy: p2c_peak_ewma`): which endpoints
/// are compared and on what load. The one choice a [`Balancer`](crate::Balancer) is built with
/// ([`Balancer::new`](crate::Balancer::new)); the latency settings of the strategies that measure
/// latency are [`Balancer::with_latency_config`](crate::Balancer::with_latency_config)'s.
///
/// Each name pairs a selection rule with the load it is meant to compare. Pairs advised against have
/// no name, and so cannot be built:
///
/// * a baseline (`round_robin`, `random`) with a latency metric: the metric is never compared, yet
///   every request would pay its clock reads;
/// * a full scan on plain in-flight counts: equal counts, the common case for a worker that carries a
///   share of the traffic, would be left to a draw; `least_inflight` orders them by latency, which cut
///   duet-sim's mean time in system by 31% in the 32-worker herd setup;
/// * P2C on in-flight counts ordered by latency: made for the full scan, where counts tie often; two
///   samples rarely tie, and it then reads as `p2c_inflight` with extra clock reads.
///
/// ```
/// use duet_balance::{Balancer, Strategy};
///
/// let strategy: Strategy = "least_inflight".parse()?;
/// assert_eq!(strategy, Strategy::LeastInflight);
/// let balance: Balancer<&str, ()> = Balancer::new(strategy);
/// assert_eq!(balance.strategy().name(), "least_inflight");
/// assert!("least_conn".parse::<Strategy>().is_err());
/// # Ok::<(), duet_balance::UnknownStrategy>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// `p2c_inflight`: power of two choices on requests in flight (tower's `PendingRequests`).
    P2cInflight,
    /// `p2c_peak_ewma`: power of two choices on PeakEWMA latency × (in flight + 1), Finagle's and
    /// Linkerd's load. The default.
    #[default]
    P2cPeakEwma,
    /// `p2c_memory_inflight`: power of two choices with memory (Mitzenmacher, Prabhakar and Shah,
    /// *Load balancing with memory*, 2002) on requests in flight: the endpoints this balancer's requests
    /// completed on since its last pick (the last two; each has just freed a request slot) take the place
    /// of fresh random candidates. Still two load reads per pick; plain P2C with differing weights, on a
    /// retry, or with nothing remembered. Opt-in: for backends with a few request slots each, run near
    /// saturation.
    P2cMemoryInflight,
    /// `p2c_memory_peak_ewma`: P2C with memory on PeakEWMA.
    P2cMemoryPeakEwma,
    /// `least_inflight`: a full scan, **every** eligible endpoint's load read on every pick (nginx's
    /// `least_conn`, HAProxy's `leastconn`): the fewest requests in flight (÷ weight) wins, and equal
    /// counts go to the lower plain latency average (drawn by weight when weights differ). Opt-in, and the
    /// exception to two load reads per pick; see the crate docs' "Full scan".
    LeastInflight,
    /// `least_peak_ewma`: a full scan of PeakEWMA loads (the same exception).
    LeastPeakEwma,
    /// `round_robin`: each endpoint in turn, by weight (smooth weighted round robin; a baseline).
    RoundRobin,
    /// `random`: uniformly, or by weight, at random (a baseline).
    Random,
}

/// A name that is not a [`Strategy`]'s; its message lists the names there are.
///
/// ```
/// use duet_balance::Strategy;
///
/// let error = "least_conn".parse::<Strategy>().err().map(|e| e.to_string()).unwrap_or_default();
/// assert!(error.starts_with("unknown balancing strategy \"least_conn\": use one of p2c_inflight, "));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStrategy {
    name: String,
}

// === impl Strategy ===

impl Strategy {
    /// Every strategy, in the order of the docs.
    pub const ALL: [Strategy; 8] = [
        Self::P2cInflight,
        Self::P2cPeakEwma,
        Self::P2cMemoryInflight,
        Self::P2cMemoryPeakEwma,
        Self::LeastInflight,
        Self::LeastPeakEwma,
        Self::RoundRobin,
        Self::Random,
    ];

    /// The name, as duet's config writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::P2cInflight => "p2c_inflight",
            Self::P2cPeakEwma => "p2c_peak_ewma",
            Self::P2cMemoryInflight => "p2c_memory_inflight",
            Self::P2cMemoryPeakEwma => "p2c_memory_peak_ewma",
            Self::LeastInflight => "least_inflight",
            Self::LeastPeakEwma => "least_peak_ewma",
            Self::RoundRobin => "round_robin",
            Self::Random => "random",
        }
    }

    /// How it chooses.
    pub(crate) fn policy(self) -> Policy {
        match self {
            Self::P2cInflight | Self::P2cPeakEwma => Policy::P2c,
            Self::P2cMemoryInflight | Self::P2cMemoryPeakEwma => Policy::P2cMemory,
            Self::LeastInflight | Self::LeastPeakEwma => Policy::LeastLoaded,
            Self::RoundRobin => Policy::RoundRobin,
            Self::Random => Policy::Random,
        }
    }

    /// What it compares, with the default latency settings.
    pub(crate) fn metric(self) -> LoadMetric {
        match self {
            Self::P2cInflight | Self::P2cMemoryInflight | Self::RoundRobin | Self::Random => {
                LoadMetric::InFlight
            }
            Self::P2cPeakEwma | Self::P2cMemoryPeakEwma | Self::LeastPeakEwma => {
                LoadMetric::PeakEwma(PeakEwmaConfig::default())
            }
            Self::LeastInflight => LoadMetric::InFlightThenLatency(PeakEwmaConfig::default()),
        }
    }
}

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(name: &str) -> Result<Self, UnknownStrategy> {
        Self::ALL
            .into_iter()
            .find(|strategy| strategy.name() == name)
            .ok_or_else(|| UnknownStrategy {
                name: name.to_owned(),
            })
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// === impl UnknownStrategy ===

impl fmt::Display for UnknownStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown balancing strategy {:?}: use one of ", self.name)?;
        for (i, strategy) in Strategy::ALL.iter().enumerate() {
            let separator = if i == 0 { "" } else { ", " };
            write!(f, "{separator}{strategy}")?;
        }
        Ok(())
    }
}

impl Error for UnknownStrategy {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_an_unknown_one_lists_them_all() {
        for strategy in Strategy::ALL {
            assert_eq!(strategy.name().parse(), Ok(strategy));
        }
        let error = "least_conn"
            .parse::<Strategy>()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "unknown balancing strategy \"least_conn\": use one of p2c_inflight, p2c_peak_ewma, \
                 p2c_memory_inflight, p2c_memory_peak_ewma, least_inflight, least_peak_ewma, \
                 round_robin, random"
            )
        );
    }

    #[test]
    fn no_strategy_pairs_a_baseline_with_latency_or_a_scan_with_drawn_ties() {
        for strategy in Strategy::ALL {
            let (policy, metric) = (strategy.policy(), strategy.metric());
            if matches!(policy, Policy::RoundRobin | Policy::Random) {
                assert_eq!(metric, LoadMetric::InFlight, "{strategy}");
            }
            if policy == Policy::LeastLoaded {
                assert_ne!(metric, LoadMetric::InFlight, "{strategy}");
            } else {
                assert!(
                    !matches!(metric, LoadMetric::InFlightThenLatency(_)),
                    "{strategy}"
                );
            }
        }
    }
}
