//! Where a balancer's randomness comes from.

use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::{
    collections::hash_map::RandomState,
    fmt,
    hash::{BuildHasher, Hasher},
};

/// A source of uniformly distributed 64-bit draws.
///
/// The balancer turns a draw into an index with `draw % n`. Implement this to drive exact draws in a test
/// or to reproduce another system's generator; production code uses [`Draws::from_os`].
pub trait DrawSource {
    /// The next draw.
    fn draw(&mut self) -> u64;
}

impl<F: FnMut() -> u64> DrawSource for F {
    fn draw(&mut self) -> u64 {
        self()
    }
}

/// The linear congruential generator of the P2C exercise (seed `002`):
/// `state = (state * 1103515245 + 12345) mod 2^31`, `draw = state >> 16`.
///
/// Only 15 bits per draw: use it to reproduce published vectors, never in production.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lcg31 {
    state: u64,
}

#[cfg(test)]
impl Lcg31 {
    /// A generator whose first state is `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: seed % (1 << 31),
        }
    }
}

#[cfg(test)]
impl DrawSource for Lcg31 {
    fn draw(&mut self) -> u64 {
        self.state = (self.state.wrapping_mul(1_103_515_245).wrapping_add(12_345)) % (1 << 31);
        self.state >> 16
    }
}

/// A balancer's own generator.
///
/// A small fast PRNG (xoshiro, from `rand`) seeded once: from the operating system for production, so that
/// no two balancers share a tie-break sequence, or from a fixed seed for reproducible simulations. A
/// test may script every draw instead ([`Draws::from_source`] with any [`DrawSource`], a closure too):
///
/// ```
/// use duet_balance::{Balancer, Draws, Strategy};
///
/// let mut script = [0u64, 1].into_iter();
/// let draws = Draws::from_source(move || script.next().expect("two draws"));
/// let mut balance: Balancer<&str, ()> = Balancer::with_draws(Strategy::P2cInflight, draws);
/// for key in ["a", "b", "c"] {
///     balance.insert(key, 1, ());
/// }
/// let (_, _, busy) = balance.pick_and_claim_excluding(&["b", "c"])?; // one left: no draw
/// // Draw 0 makes "a" (0 mod 3) a candidate, draw 1 "c" (1 mod 2, counted past "a"): "c" is idle.
/// assert_eq!(*balance.pick()?, "c");
/// drop(busy);
/// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
/// ```
pub struct Draws {
    inner: Inner,
}

enum Inner {
    Rng(SmallRng),
    Custom(Box<dyn DrawSource + Send>),
}

impl Draws {
    /// A generator seeded from the operating system, once.
    ///
    /// Falls back to the standard library's per-process random hash keys (themselves drawn from the
    /// operating system) if the entropy source cannot be read.
    pub fn from_os() -> Self {
        let rng = SmallRng::try_from_rng(&mut rand::rngs::SysRng).unwrap_or_else(|_| {
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_usize(&hasher as *const _ as usize);
            SmallRng::seed_from_u64(hasher.finish())
        });
        Self {
            inner: Inner::Rng(rng),
        }
    }

    /// A reproducible generator: the same seed gives the same draws. For tests and simulation only.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            inner: Inner::Rng(SmallRng::seed_from_u64(seed)),
        }
    }

    /// Draws from a caller-supplied source (an exact script in a test, another system's generator).
    pub fn from_source(source: impl DrawSource + Send + 'static) -> Self {
        Self {
            inner: Inner::Custom(Box::new(source)),
        }
    }

    /// The next draw.
    #[inline]
    pub fn next_draw(&mut self) -> u64 {
        match &mut self.inner {
            Inner::Rng(rng) => rng.next_u64(),
            Inner::Custom(source) => source.draw(),
        }
    }
}

impl fmt::Debug for Draws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.inner {
            Inner::Rng(_) => f.write_str("Draws(SmallRng)"),
            Inner::Custom(_) => f.write_str("Draws(custom)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lcg31_reproduces_the_published_vector() {
        let mut lcg = Lcg31::new(1);
        assert_eq!(lcg.draw(), 16838);
        assert_eq!(lcg.draw(), 5758);
    }

    #[test]
    fn os_seeded_generators_differ() {
        let a: Vec<u64> = {
            let mut d = Draws::from_os();
            (0..4).map(|_| d.next_draw()).collect()
        };
        let b: Vec<u64> = {
            let mut d = Draws::from_os();
            (0..4).map(|_| d.next_draw()).collect()
        };
        assert_ne!(a, b);
    }

    #[test]
    fn seeded_generators_repeat() {
        let mut a = Draws::with_seed(7);
        let mut b = Draws::with_seed(7);
        for _ in 0..16 {
            assert_eq!(a.next_draw(), b.next_draw());
        }
    }
}
