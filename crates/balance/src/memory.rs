//! The memory of P2C with memory (`Policy::P2cMemory`): the last two endpoints a request of
//! this balancer completed on, written by the requests' guards and taken by the next pick.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Nothing remembered (no slot is `u32::MAX`: a candidate list that long cannot be built); as a
/// guard's token, an endpoint that was no candidate, which nothing remembers.
pub(crate) const NOTHING: u64 = u64::MAX;

/// The last two distinct endpoints that freed a request slot, each named by its slot in the candidate
/// list and the list's generation (the low 32 bits of each in one word), so that a slot of a list rebuilt
/// since (membership, eligibility or a slow-start weight changed) is never taken for another endpoint's.
#[derive(Debug)]
pub(crate) struct LastFreed {
    last: AtomicU64,
    before: AtomicU64,
}

impl LastFreed {
    pub(crate) fn new() -> Self {
        Self {
            last: AtomicU64::new(NOTHING),
            before: AtomicU64::new(NOTHING),
        }
    }

    /// A copy of what `self` remembers now.
    pub(crate) fn copy(&self) -> Self {
        Self {
            last: AtomicU64::new(self.last.load(Relaxed)),
            before: AtomicU64::new(self.before.load(Relaxed)),
        }
    }

    /// What a guard records for the endpoint at `slot` of the candidates of `generation`.
    pub(crate) fn token(generation: u64, slot: u32) -> u64 {
        (generation << 32) | u64::from(slot)
    }

    /// The request of `token` released its endpoint. An endpoint completing twice in a row stays one
    /// memory: the one before it is kept. [`NOTHING`] is not recorded.
    pub(crate) fn record(&self, token: u64) {
        if token == NOTHING {
            return;
        }
        let previous = self.last.swap(token, Relaxed);
        if previous != token && previous != NOTHING {
            self.before.store(previous, Relaxed);
        }
    }

    /// The slots remembered for the candidates of `generation`, latest first, forgotten as they are
    /// taken: a completion frees one slot, so it vouches for one pick. Loads, and stores only when
    /// something was remembered; a guard recording in between on another thread loses its memory, which
    /// costs one pick a remembered candidate and nothing else.
    pub(crate) fn take(&self, generation: u64) -> [Option<usize>; 2] {
        [&self.last, &self.before].map(|cell| {
            let token = cell.load(Relaxed);
            if token == NOTHING {
                return None;
            }
            cell.store(NOTHING, Relaxed);
            let slot = token & u64::from(u32::MAX);
            (token >> 32 == generation & u64::from(u32::MAX)).then_some(slot as usize)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_two_distinct_slots_are_taken_once_and_only_for_their_generation() {
        let freed = LastFreed::new();
        assert_eq!(freed.take(7), [None, None]);
        freed.record(LastFreed::token(7, 3));
        assert_eq!(freed.take(7), [Some(3), None]);
        assert_eq!(
            freed.take(7),
            [None, None],
            "one completion vouches for one pick"
        );
        for slot in [1, 3, 2, 2] {
            freed.record(LastFreed::token(7, slot));
        }
        assert_eq!(
            freed.take(7),
            [Some(2), Some(3)],
            "latest first, repeats merged"
        );
        freed.record(LastFreed::token(7, 3));
        assert_eq!(
            freed.take(8),
            [None, None],
            "rebuilt: slot 3 may be another endpoint"
        );
        assert_eq!(freed.take(7), [None, None]);
        freed.record(LastFreed::token(u64::from(u32::MAX) + 9, 1));
        assert_eq!(freed.take(u64::from(u32::MAX) + 9), [Some(1), None]);
    }
}
