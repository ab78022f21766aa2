//! The endpoints a pick may choose from, as one value: built by the endpoint set when membership,
//! eligibility or a slow-start weight changes, read by every policy's selection, never changed by a pick.

use crate::{alias::AliasTable, p2c::WeightedPool};

/// The candidates of a pick: a dense list of endpoint positions (so a pick is O(1) in the pool size)
/// and, when they differ, their weights as they stand now (slow start included).
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    /// The candidates' endpoint positions, in endpoint order. A candidate's index here is its slot.
    positions: Vec<usize>,
    /// Each endpoint position's slot, or [`NOT_A_CANDIDATE`]: finds an excluded key's slot in O(1).
    slot_of: Vec<u32>,
    /// `None` when every candidate weighs the same.
    weights: Option<Weights>,
    /// Changes with every rebuild, so that state kept against one list (a reserved pick, round robin's
    /// running weights) knows when it is stale.
    generation: u64,
}

const NOT_A_CANDIDATE: u32 = u32::MAX;

/// The candidates' weights, in thousandths of a unit so that slow start can ramp them smoothly.
#[derive(Debug)]
pub(crate) struct Weights {
    /// Draws a slot in proportion to its weight, in O(1).
    table: AliasTable,
    /// Each slot's weight in units: what divides its concurrency in the load comparison.
    units: Vec<f64>,
    /// Each slot's weight in thousandths.
    thousandths: Vec<u64>,
    /// Where each slot's weight ends on the line of all weights laid end to end: with exclusions, a
    /// weighted draw is a point on what is left of that line.
    ends: Vec<u64>,
}

impl Candidates {
    /// The candidates at `positions`, weighing `thousandths` each (same length). Equal weights are
    /// dropped: the unweighted rules apply.
    pub(crate) fn new(
        positions: Vec<usize>,
        thousandths: &[u32],
        endpoints: usize,
        generation: u64,
    ) -> Self {
        let mut slot_of = vec![NOT_A_CANDIDATE; endpoints];
        for (slot, &at) in positions.iter().enumerate() {
            slot_of[at] = slot as u32;
        }
        let uniform = thousandths.windows(2).all(|w| w[0] == w[1]);
        Self {
            positions,
            slot_of,
            weights: (!uniform).then(|| Weights::new(thousandths)),
            generation,
        }
    }

    /// How many candidates there are.
    pub(crate) fn len(&self) -> usize {
        self.positions.len()
    }

    /// The endpoint position of `slot`.
    #[inline]
    pub(crate) fn position(&self, slot: usize) -> usize {
        self.positions[slot]
    }

    /// The slot of the endpoint at `position`, if it is a candidate.
    pub(crate) fn slot(&self, position: usize) -> Option<u32> {
        self.slot_of
            .get(position)
            .copied()
            .filter(|&slot| slot != NOT_A_CANDIDATE)
    }

    /// The candidates' weights, if they differ.
    #[inline]
    pub(crate) fn weights(&self) -> Option<&Weights> {
        self.weights.as_ref()
    }

    /// Which rebuild this list came from.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }
}

impl Weights {
    fn new(thousandths: &[u32]) -> Self {
        let ends = thousandths
            .iter()
            .scan(0u64, |end, &w| {
                *end += u64::from(w);
                Some(*end)
            })
            .collect();
        Self {
            table: AliasTable::new(thousandths),
            units: thousandths.iter().map(|&w| f64::from(w) / 1000.0).collect(),
            thousandths: thousandths.iter().map(|&w| u64::from(w)).collect(),
            ends,
        }
    }

    /// The alias table over every candidate.
    #[inline]
    pub(crate) fn table(&self) -> &AliasTable {
        &self.table
    }

    /// The weight of `slot`, in units.
    #[inline]
    pub(crate) fn unit(&self, slot: usize) -> f64 {
        self.units[slot]
    }

    /// The weight of `slot`, in thousandths.
    pub(crate) fn thousandths(&self) -> &[u64] {
        &self.thousandths
    }

    fn start(&self, slot: usize) -> u64 {
        self.ends[slot] - self.thousandths[slot]
    }

    /// The candidates' weights summed, in thousandths.
    pub(crate) fn total(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }
}

/// The candidates left once some slots are excluded (the endpoints a retry has already tried).
///
/// Slots are addressed by rank among those left; mapping a rank to its slot costs O(excluded), and a
/// weighted draw O(excluded + log n): nothing is copied, so a retry picks among exactly the weights a
/// first pick would use, minus the excluded ones.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remaining<'a> {
    candidates: &'a Candidates,
    /// Excluded slots, ascending, distinct, each a candidate.
    excluded: &'a [u32],
    /// The weight left, in thousandths (0 when the candidates are unweighted).
    weight_left: u64,
}

impl<'a> Remaining<'a> {
    /// The candidates but `excluded` (ascending, distinct slots of `candidates`).
    pub(crate) fn new(candidates: &'a Candidates, excluded: &'a [u32]) -> Self {
        let weight_left = candidates.weights.as_ref().map_or(0, |weights| {
            let gone: u64 = excluded
                .iter()
                .map(|&slot| weights.thousandths[slot as usize])
                .sum();
            weights.total() - gone
        });
        Self {
            candidates,
            excluded,
            weight_left,
        }
    }

    /// How many candidates are left.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.candidates.len() - self.excluded.len()
    }

    /// Whether nothing is excluded.
    #[inline]
    pub(crate) fn is_all(&self) -> bool {
        self.excluded.is_empty()
    }

    /// The candidates, excluded ones included.
    #[inline]
    pub(crate) fn candidates(&self) -> &'a Candidates {
        self.candidates
    }

    /// Whether `slot` is excluded.
    pub(crate) fn excludes(&self, slot: usize) -> bool {
        self.excluded.binary_search(&(slot as u32)).is_ok()
    }

    /// The slot of the `rank`-th candidate left (`rank < len()`).
    #[inline]
    pub(crate) fn nth(&self, rank: usize) -> usize {
        skip(rank, self.excluded.iter().map(|&slot| slot as usize))
    }
}

/// The `rank`-th index not in `skipped` (ascending): each skipped index at or below the running answer
/// pushes it one further.
#[inline]
fn skip(mut rank: usize, skipped: impl Iterator<Item = usize>) -> usize {
    for slot in skipped {
        if slot > rank {
            break;
        }
        rank += 1;
    }
    rank
}

/// Weighted P2C over what is left: candidates drawn in proportion to the same weights a first pick
/// uses, challengers uniformly among the others left.
impl WeightedPool for Remaining<'_> {
    fn len(&self) -> usize {
        Remaining::len(self)
    }

    fn only(&self) -> usize {
        self.nth(0)
    }

    /// A point on what is left of the line of weights, moved past each excluded weight it reaches.
    fn sample(&self, draw: u64) -> usize {
        let Some(weights) = &self.candidates.weights else {
            return self.nth((draw % self.len() as u64) as usize);
        };
        let mut point = ((u128::from(draw) * u128::from(self.weight_left)) >> 64) as u64;
        for &slot in self.excluded {
            let slot = slot as usize;
            if point < weights.start(slot) {
                break;
            }
            point += weights.thousandths[slot];
        }
        weights.ends.partition_point(|&end| end <= point)
    }

    fn other_than(&self, chosen: usize, draw: u64) -> usize {
        let rank = (draw % (self.len() as u64 - 1)) as usize;
        let at = self
            .excluded
            .partition_point(|&slot| (slot as usize) < chosen);
        let (before, after) = self.excluded.split_at(at);
        let skipped = before
            .iter()
            .map(|&slot| slot as usize)
            .chain(std::iter::once(chosen))
            .chain(after.iter().map(|&slot| slot as usize));
        skip(rank, skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weighted(thousandths: &[u32]) -> Candidates {
        let n = thousandths.len();
        Candidates::new((0..n).collect(), thousandths, n, 1)
    }

    #[test]
    fn ranks_skip_the_excluded_slots() {
        let candidates = weighted(&[1, 1, 1, 1, 1, 1]);
        let left = Remaining::new(&candidates, &[0, 2, 3]);
        assert_eq!(left.len(), 3);
        assert_eq!((0..3).map(|r| left.nth(r)).collect::<Vec<_>>(), [1, 4, 5]);
        assert!(left.excludes(2) && !left.excludes(4));
    }

    #[test]
    fn a_challenger_is_neither_excluded_nor_the_candidate() {
        let candidates = weighted(&[1000, 2000, 3000, 4000, 5000]);
        let left = Remaining::new(&candidates, &[1, 3]);
        let challengers: Vec<_> = (0..2).map(|d| left.other_than(2, d)).collect();
        assert_eq!(challengers, [0, 4]);
        let challengers: Vec<_> = (0..2).map(|d| left.other_than(0, d)).collect();
        assert_eq!(challengers, [2, 4]);
    }

    #[test]
    fn weighted_draws_follow_the_weights_left() {
        let candidates = weighted(&[1000, 5000, 100, 3000]);
        let left = Remaining::new(&candidates, &[1]);
        let mut counts = [0u32; 4];
        let draws = 41_000u64;
        for k in 0..draws {
            // Evenly spread over the 64-bit range: the shares are exact up to rounding.
            let draw = ((u128::from(k) << 64) / u128::from(draws) + 1) as u64;
            counts[left.sample(draw)] += 1;
        }
        assert_eq!(counts, [10_000, 0, 1_000, 30_000]);
    }
}
