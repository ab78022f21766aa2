//! The simulation's own randomness (arrivals, service times), separate from the balancers' draws.

use rand::{rngs::SmallRng, Rng, SeedableRng};

/// A seeded source of uniform and exponential samples.
pub(crate) struct Random(SmallRng);

impl Random {
    pub(crate) fn new(seed: u64) -> Self {
        Self(SmallRng::seed_from_u64(seed ^ 0x5eed_d0e7))
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with the given rate.
    pub(crate) fn exponential(&mut self, rate: f64) -> f64 {
        -(1.0 - self.uniform()).ln() / rate
    }

    /// Uniform index below `n`.
    pub(crate) fn index(&mut self, n: usize) -> usize {
        ((self.0.next_u64() as u128 * n as u128) >> 64) as usize
    }
}
