//! The memory of [`Policy::P2cMemory`](crate::Policy::P2cMemory): the endpoint a request of this
//! balancer completed on last, written by the request's guard and taken by the next pick.

use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    Arc,
};

/// Nothing remembered (no slot is `u32::MAX`: a candidate list that long cannot be built).
const NOTHING: u64 = u64::MAX;

/// Which endpoint freed a request slot last, named by its slot in the candidate list and the list's
/// generation (the low 32 bits of each in one word), so that a slot of a list rebuilt since (membership,
/// eligibility or a slow-start weight changed) is never taken for another endpoint's.
#[derive(Debug)]
pub(crate) struct LastFreed(AtomicU64);

impl LastFreed {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self(AtomicU64::new(NOTHING)))
    }

    /// What a guard records for the endpoint at `slot` of the candidates of `generation`.
    pub(crate) fn token(generation: u64, slot: u32) -> u64 {
        (generation << 32) | u64::from(slot)
    }

    /// The request of `token` released its endpoint.
    pub(crate) fn record(&self, token: u64) {
        self.0.store(token, Relaxed);
    }

    /// The slot remembered for the candidates of `generation`, forgotten as it is taken: a completion
    /// frees one slot, so it vouches for one pick. A load and, only when something was remembered, a
    /// store: a guard recording in between on another thread loses its hint, which costs one pick its
    /// memory and nothing else.
    pub(crate) fn take(&self, generation: u64) -> Option<usize> {
        let token = self.0.load(Relaxed);
        if token == NOTHING {
            return None;
        }
        self.0.store(NOTHING, Relaxed);
        let slot = token & u64::from(u32::MAX);
        (token >> 32 == generation & u64::from(u32::MAX)).then_some(slot as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_taken_once_and_only_for_its_generation() {
        let freed = LastFreed::new();
        assert_eq!(freed.take(7), None);
        freed.record(LastFreed::token(7, 3));
        assert_eq!(freed.take(7), Some(3));
        assert_eq!(freed.take(7), None, "one completion vouches for one pick");
        freed.record(LastFreed::token(7, 3));
        assert_eq!(
            freed.take(8),
            None,
            "the list was rebuilt: slot 3 may be another endpoint"
        );
        assert_eq!(freed.take(7), None);
        freed.record(LastFreed::token(u64::from(u32::MAX) + 9, 1));
        assert_eq!(freed.take(u64::from(u32::MAX) + 9), Some(1));
    }
}
