//! The power-of-two-choices selection rule, free of any service: the part a simulator reuses.

use crate::{alias::AliasTable, draw::Draws, error::NoEligibleEndpoint};
use std::cmp::Ordering;

/// One of the two sampled candidates and the load it was compared at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Index into the candidate list the selection was made over.
    pub index: usize,
    /// The load read for it (weighted when weights differ: see the crate docs).
    pub load: f64,
}

/// The outcome of one selection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    /// The index to send to.
    pub chosen: usize,
    /// The two candidates in draw order; `None` when there was a single candidate and nothing was compared.
    pub candidates: Option<[Candidate; 2]>,
    /// The two loads were equal and a coin flip decided.
    pub tie: bool,
}

impl Selection {
    /// Both candidates were read at zero load: too little concurrency for the metric to say anything
    /// (Finagle counts this).
    pub fn both_zero(&self) -> bool {
        matches!(self.candidates, Some([a, b]) if a.load == 0.0 && b.load == 0.0)
    }
}

/// Between weighted candidates, loads within this ratio of each other compare as equal. Two equally fast
/// endpoints' latency estimates are never equal: jitter, and PeakEWMA's peak sensitivity (the endpoint
/// sampled more often, the heavier one, keeps a higher estimate) would tilt every comparison toward the
/// lighter weight.
pub const LIKE_LOADS: f64 = 0.75;

/// A challenger displaces a candidate drawn twice only if its load is below this fraction of the
/// candidate's: far enough that the noise between equally fast endpoints never does, close enough that a
/// degraded endpoint (several times slower) always does.
pub const CLEARLY_LIGHTER: f64 = 0.5;

/// Power of two choices over a list of `n` candidates.
///
/// * `n == 0`: [`NoEligibleEndpoint`].
/// * `n == 1`: that candidate; no draw is consumed and no load is read.
/// * `n >= 2`: two distinct indices from two draws, `i = d1 % n`, `j = d2 % (n - 1)`, `j += 1 if j >= i`;
///   exactly two load reads; the lighter wins (loads are ordered with [`f64::total_cmp`], so a NaN
///   cannot bias the choice); equal loads are settled by a third draw used as a fair coin.
///
/// ```
/// use duet_balance::algo::P2c;
///
/// let loads = [5.0, 1.0, 3.0, 8.0];
/// let mut p2c = P2c::with_seed(7);
/// let selection = p2c.select(loads.len(), |i| loads[i])?;
/// let [a, b] = selection.candidates.ok_or("two drawn")?;
/// assert_ne!(a.index, b.index);
/// let lighter = if a.load < b.load { a.index } else { b.index };
/// assert_eq!(selection.chosen, lighter);
/// assert!(!selection.tie);
/// # Ok::<(), duet_balance::BoxError>(())
/// ```
#[derive(Debug)]
pub struct P2c {
    draws: Draws,
}

impl Default for P2c {
    fn default() -> Self {
        Self::new()
    }
}

impl P2c {
    /// A selector whose generator is seeded from the operating system.
    pub fn new() -> Self {
        Self {
            draws: Draws::from_os(),
        }
    }

    /// A reproducible selector. For tests and simulation: never share a constant seed in production.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            draws: Draws::with_seed(seed),
        }
    }

    /// A selector over the given draws.
    pub fn with_draws(draws: Draws) -> Self {
        Self { draws }
    }

    /// Selects among `n` equally weighted candidates; `load(i)` is called exactly twice when `n >= 2`.
    #[inline]
    pub fn select(
        &mut self,
        n: usize,
        load: impl FnMut(usize) -> f64,
    ) -> Result<Selection, NoEligibleEndpoint> {
        self.select_mapped(n, |rank| rank, load)
    }

    /// [`select`](Self::select) over `n` ranks, each naming the index `index(rank)`: the pair is drawn
    /// among the ranks, loads are read and the selection reported by index. A retry selects among the
    /// candidates left this way, with the same draws as among that many candidates.
    #[inline]
    pub(crate) fn select_mapped(
        &mut self,
        n: usize,
        index: impl Fn(usize) -> usize,
        mut load: impl FnMut(usize) -> f64,
    ) -> Result<Selection, NoEligibleEndpoint> {
        match n {
            0 => Err(NoEligibleEndpoint),
            1 => Ok(Selection {
                chosen: index(0),
                candidates: None,
                tie: false,
            }),
            _ => {
                let n64 = n as u64;
                let i = (self.draws.next_draw() % n64) as usize;
                let mut j = (self.draws.next_draw() % (n64 - 1)) as usize;
                if j >= i {
                    j += 1;
                }
                let (i, j) = (index(i), index(j));
                Ok(self.compare(i, load(i), j, load(j)))
            }
        }
    }

    /// P2C with memory: candidates the caller remembers take the place of fresh draws. Two distinct
    /// remembered indices below `n` are compared with no draw; one is compared with a candidate drawn
    /// uniformly among the others (`j = d % (n - 1)`, `j += 1` if `j >= m`); none is
    /// [`select`](Self::select), draws included. Either way `load(i)` is called exactly twice when
    /// `n >= 2`, the lighter wins, equal loads go to a fair coin, and the remembered candidates come first
    /// in [`Selection::candidates`]. A remembered index not below `n`, or repeated, is ignored.
    ///
    /// Memory here means Mitzenmacher, Prabhakar and Shah's *Load balancing with memory* (2002): some of
    /// the candidates are not fresh samples but good bets kept from before, at no extra load read. What to
    /// remember is the caller's choice; [`Strategy::P2cMemoryInflight`](crate::Strategy::P2cMemoryInflight) remembers the
    /// last two endpoints that a request completed on, each of which has just freed a request slot.
    #[inline]
    pub fn select_with_memory(
        &mut self,
        n: usize,
        remembered: [Option<usize>; 2],
        mut load: impl FnMut(usize) -> f64,
    ) -> Result<Selection, NoEligibleEndpoint> {
        let valid = |m: Option<usize>| m.filter(|&m| m < n && n >= 2);
        let (m, other) = match (valid(remembered[0]), valid(remembered[1])) {
            (Some(a), Some(b)) if a != b => (a, Some(b)),
            (Some(a), _) | (None, Some(a)) => (a, None),
            (None, None) => return self.select(n, load),
        };
        let j = other.unwrap_or_else(|| {
            let j = (self.draws.next_draw() % (n as u64 - 1)) as usize;
            j + usize::from(j >= m)
        });
        Ok(self.compare(m, load(m), j, load(j)))
    }

    /// Selects among weighted candidates: both are drawn independently in proportion to weight through
    /// `table`, and `load(i)` (the weighted load) is called exactly twice when the table has two or more
    /// columns. A candidate drawn twice faces a challenger drawn uniformly among the others, which wins
    /// only if its load is under [`CLEARLY_LIGHTER`] of the candidate's: one more draw, still two load
    /// reads. See the crate docs for why this gives each candidate `w / Σw` among equals and keeps a
    /// slow candidate out whatever its weight.
    #[inline]
    pub fn select_weighted(
        &mut self,
        table: &AliasTable,
        load: impl FnMut(usize) -> f64,
    ) -> Result<Selection, NoEligibleEndpoint> {
        self.select_weighted_in(table, load)
    }

    /// [`select_weighted`](Self::select_weighted) over any [`WeightedPool`].
    #[inline]
    pub(crate) fn select_weighted_in(
        &mut self,
        pool: &impl WeightedPool,
        mut load: impl FnMut(usize) -> f64,
    ) -> Result<Selection, NoEligibleEndpoint> {
        match pool.len() {
            0 => Err(NoEligibleEndpoint),
            1 => Ok(Selection {
                chosen: pool.only(),
                candidates: None,
                tie: false,
            }),
            _ => {
                let i = pool.sample(self.draws.next_draw());
                let j = pool.sample(self.draws.next_draw());
                if i != j {
                    let (load_i, load_j) = (load(i), load(j));
                    // Loads this close are equals: the fair coin keeps the weight shares exact.
                    let (low, high) = (load_i.min(load_j), load_i.max(load_j));
                    return Ok(if low >= high * LIKE_LOADS {
                        self.coin(i, load_i, j, load_j)
                    } else {
                        self.compare(i, load_i, j, load_j)
                    });
                }
                let challenger = pool.other_than(i, self.draws.next_draw());
                let (load_i, load_c) = (load(i), load(challenger));
                let chosen = if load_c < load_i * CLEARLY_LIGHTER {
                    challenger
                } else {
                    i
                };
                Ok(pair(chosen, [(i, load_i), (challenger, load_c)], false))
            }
        }
    }

    /// One draw, for callers that need randomness from the same stream (uniform random baselines).
    #[inline]
    pub fn draw(&mut self) -> u64 {
        self.draws.next_draw()
    }

    /// A fair coin between two candidates whose loads count as equal.
    fn coin(&mut self, i: usize, load_i: f64, j: usize, load_j: f64) -> Selection {
        let chosen = if self.draws.next_draw() & 1 == 0 {
            i
        } else {
            j
        };
        pair(chosen, [(i, load_i), (j, load_j)], true)
    }

    #[inline]
    fn compare(&mut self, i: usize, load_i: f64, j: usize, load_j: f64) -> Selection {
        match load_i.total_cmp(&load_j) {
            Ordering::Less => pair(i, [(i, load_i), (j, load_j)], false),
            Ordering::Greater => pair(j, [(i, load_i), (j, load_j)], false),
            Ordering::Equal => self.coin(i, load_i, j, load_j),
        }
    }
}

/// What weighted P2C draws from: the whole weighted candidate list (an [`AliasTable`]), or what a retry
/// has left of it.
pub(crate) trait WeightedPool {
    /// How many candidates there are.
    fn len(&self) -> usize;
    /// The candidate when there is only one.
    fn only(&self) -> usize;
    /// A candidate drawn in proportion to weight, from one draw.
    fn sample(&self, draw: u64) -> usize;
    /// A candidate other than `chosen`, drawn uniformly from one draw (`len() >= 2`).
    fn other_than(&self, chosen: usize, draw: u64) -> usize;
}

impl WeightedPool for AliasTable {
    fn len(&self) -> usize {
        AliasTable::len(self)
    }

    fn only(&self) -> usize {
        0
    }

    #[inline]
    fn sample(&self, draw: u64) -> usize {
        AliasTable::sample(self, draw)
    }

    #[inline]
    fn other_than(&self, chosen: usize, draw: u64) -> usize {
        let mut challenger = (draw % (AliasTable::len(self) as u64 - 1)) as usize;
        if challenger >= chosen {
            challenger += 1;
        }
        challenger
    }
}

/// The selection of `chosen` after comparing `candidates` (index, load) in draw order.
#[inline]
fn pair(chosen: usize, candidates: [(usize, f64); 2], tie: bool) -> Selection {
    Selection {
        chosen,
        candidates: Some(candidates.map(|(index, load)| Candidate { index, load })),
        tie,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::Lcg31;
    use proptest::prelude::*;
    use std::cell::Cell;

    fn scripted(draws: Vec<u64>) -> P2c {
        let mut it = draws.into_iter();
        P2c::with_draws(Draws::from_source(move || {
            it.next().expect("test ran out of draws")
        }))
    }

    #[test]
    fn empty_pool_is_an_error() {
        let mut p2c = P2c::with_seed(1);
        assert_eq!(p2c.select(0, |_| 0.0), Err(NoEligibleEndpoint));
    }

    #[test]
    fn one_candidate_takes_no_draw_and_reads_no_load() {
        // A source that panics on use proves no draw is consumed.
        let mut p2c = P2c::with_draws(Draws::from_source(|| -> u64 {
            panic!("drew for one candidate")
        }));
        let reads = Cell::new(0);
        let sel = p2c
            .select(1, |_| {
                reads.set(reads.get() + 1);
                0.0
            })
            .expect("one candidate");
        assert_eq!(sel.chosen, 0);
        assert_eq!(reads.get(), 0);
    }

    #[test]
    fn exactly_two_load_reads_for_any_pool_size() {
        let mut p2c = P2c::with_seed(9);
        for n in [2, 3, 10, 4096] {
            for _ in 0..100 {
                let reads = Cell::new(0);
                p2c.select(n, |i| {
                    reads.set(reads.get() + 1);
                    i as f64
                })
                .expect("non-empty");
                assert_eq!(reads.get(), 2, "n = {n}");
            }
        }
    }

    #[test]
    fn seed_002_vector_picks_indices_2_and_1() {
        let mut p2c = P2c::with_draws(Draws::from_source(Lcg31::new(1)));
        let sel = p2c
            .select(4, |i| [9.0, 5.0, 3.0, 8.0][i])
            .expect("pool of 4");
        let [a, b] = sel.candidates.expect("two candidates");
        assert_eq!((a.index, b.index), (2, 1));
        assert_eq!(sel.chosen, 2, "load 3 beats load 5");
    }

    #[test]
    fn lighter_candidate_wins_in_either_draw_order() {
        // Draws 0 then 1 over n = 3 sample i = 0, j = 1 + 1 = 2.
        let mut p2c = scripted(vec![0, 1]);
        let sel = p2c.select(3, |i| [5.0, 1.0, 3.0][i]).expect("three");
        assert_eq!(sel.chosen, 2);
        let mut p2c = scripted(vec![2, 0]);
        let sel = p2c.select(3, |i| [5.0, 1.0, 3.0][i]).expect("three");
        assert_eq!(
            sel.candidates.map(|c| (c[0].index, c[1].index)),
            Some((2, 0))
        );
        assert_eq!(sel.chosen, 2, "3 beats 5");
    }

    #[test]
    fn a_tie_takes_a_third_draw_as_coin() {
        let mut p2c = scripted(vec![0, 0, 1]);
        let sel = p2c.select(2, |_| 4.0).expect("two");
        assert!(sel.tie);
        assert_eq!(sel.chosen, 1, "odd coin takes the second candidate");
        let mut p2c = scripted(vec![0, 0, 2]);
        assert_eq!(p2c.select(2, |_| 4.0).expect("two").chosen, 0);
    }

    #[test]
    fn nan_loads_are_totally_ordered() {
        // total_cmp puts positive NaN above every number: a NaN load never wins against a real one.
        let mut p2c = P2c::with_seed(5);
        for _ in 0..1000 {
            let sel = p2c
                .select(2, |i| if i == 0 { f64::NAN } else { 7.0 })
                .expect("two");
            assert_eq!(sel.chosen, 1);
        }
    }

    /// With n candidates of distinct loads, P2C over distinct pairs picks the k-th lightest (k = 1..n)
    /// with probability 2(n-k)/(n(n-1)): it must be the lighter of a pair containing it. A full scan
    /// would always pick k = 1, random would give 1/n each; both fail this.
    #[test]
    fn sample_size_is_two_seen_from_the_distribution() {
        let n = 8usize;
        let trials = 200_000u32;
        let mut p2c = P2c::with_seed(11);
        let mut wins = vec![0u32; n];
        for _ in 0..trials {
            let sel = p2c.select(n, |i| i as f64).expect("n = 8");
            wins[sel.chosen] += 1;
        }
        for (idx, &w) in wins.iter().enumerate() {
            let k = idx + 1;
            let expected = 2.0 * (n - k) as f64 / (n * (n - 1)) as f64;
            let got = f64::from(w) / f64::from(trials);
            assert!(
                (got - expected).abs() < 0.006,
                "k = {k}: {got:.4} vs {expected:.4}"
            );
        }
        assert_eq!(wins[n - 1], 0, "the heaviest never wins");
    }

    #[test]
    fn ties_split_evenly() {
        let mut p2c = P2c::with_seed(2);
        let mut first = 0u32;
        let trials = 100_000u32;
        for _ in 0..trials {
            let sel = p2c.select(2, |_| 1.0).expect("two");
            let [a, _] = sel.candidates.expect("two");
            if sel.chosen == a.index {
                first += 1;
            }
        }
        let share = f64::from(first) / f64::from(trials);
        assert!((share - 0.5).abs() < 0.01, "first candidate won {share}");
    }

    #[test]
    fn unseeded_selectors_break_ties_differently() {
        let run = || {
            let mut p2c = P2c::new();
            (0..64)
                .map(|_| p2c.select(16, |_| 0.0).expect("16").chosen)
                .collect::<Vec<_>>()
        };
        assert_ne!(run(), run());
    }

    #[test]
    fn memory_reads_exactly_two_loads_and_never_pairs_a_candidate_with_itself() {
        let mut p2c = P2c::with_seed(21);
        for n in [2, 3, 10, 4096] {
            for memory in [
                [Some(n - 1), None],
                [None, Some(n / 2)],
                [Some(0), Some(n - 1)],
                [Some(1), Some(1)],
            ] {
                for _ in 0..100 {
                    let reads = Cell::new(0);
                    let sel = p2c
                        .select_with_memory(n, memory, |i| {
                            reads.set(reads.get() + 1);
                            i as f64
                        })
                        .expect("n >= 2");
                    assert_eq!(reads.get(), 2, "n = {n}");
                    let [a, b] = sel.candidates.expect("two");
                    assert_ne!(a.index, b.index);
                    assert_eq!(Some(a.index), memory[0].or(memory[1]), "remembered first");
                }
            }
        }
    }

    #[test]
    fn one_remembered_candidate_meets_one_fresh_draw() {
        // Remembered 2 of 4, draw 2: 2 % 3 = 2 >= 2, so the fresh candidate is 3.
        let loads = [4.0, 1.0, 2.0, 3.0];
        let mut p2c = scripted(vec![2]);
        let sel = p2c
            .select_with_memory(4, [Some(2), None], |i| loads[i])
            .expect("four");
        assert_eq!(
            sel.candidates.map(|c| (c[0].index, c[1].index)),
            Some((2, 3))
        );
        assert_eq!(sel.chosen, 2, "load 2 beats load 3");
        // Draw 1: 1 % 3 = 1 < 2, the fresh candidate is 1, lighter than the remembered one.
        let mut p2c = scripted(vec![1]);
        let sel = p2c
            .select_with_memory(4, [Some(2), None], |i| loads[i])
            .expect("four");
        assert_eq!(sel.chosen, 1, "load 1 beats the remembered load 2");
        // Equal loads: the draw after the fresh one is the coin, and an even coin keeps the first.
        let mut p2c = scripted(vec![0, 2]);
        let sel = p2c
            .select_with_memory(3, [Some(1), None], |_| 5.0)
            .expect("three");
        assert!(sel.tie);
        assert_eq!(sel.chosen, 1);
    }

    #[test]
    fn two_remembered_candidates_take_no_draw() {
        let loads = [4.0, 1.0, 2.0, 3.0];
        let mut p2c = P2c::with_draws(Draws::from_source(|| -> u64 { panic!("drew") }));
        let sel = p2c
            .select_with_memory(4, [Some(3), Some(2)], |i| loads[i])
            .expect("four");
        assert_eq!(
            sel.candidates.map(|c| (c[0].index, c[1].index)),
            Some((3, 2))
        );
        assert_eq!(
            sel.chosen, 2,
            "load 2 beats load 3, and endpoint 1 was never read"
        );
        // A tie takes the coin, and only the coin.
        let mut p2c = scripted(vec![1]);
        let sel = p2c
            .select_with_memory(4, [Some(0), Some(3)], |_| 1.0)
            .expect("four");
        assert_eq!((sel.tie, sel.chosen), (true, 3));
    }

    #[test]
    fn without_a_usable_memory_it_is_plain_p2c() {
        let mut plain = P2c::with_seed(8);
        let mut with = P2c::with_seed(8);
        for n in [2, 5, 9] {
            for remembered in [[None, None], [Some(n), None], [None, Some(n + 3)]] {
                let a = plain.select(n, |i| (i % 3) as f64).expect("n");
                let b = with
                    .select_with_memory(n, remembered, |i| (i % 3) as f64)
                    .expect("n");
                assert_eq!(a, b);
            }
        }
        let mut one = P2c::with_draws(Draws::from_source(|| -> u64 { panic!("drew") }));
        let sel = one
            .select_with_memory(1, [Some(0), None], |_| 0.0)
            .expect("one");
        assert_eq!((sel.chosen, sel.candidates), (0, None));
    }

    proptest! {
        #[test]
        fn pair_is_always_distinct_and_in_range(n in 2usize..10_000, d1: u64, d2: u64) {
            let mut p2c = scripted(vec![d1, d2, 0]);
            let sel = p2c.select(n, |_| 0.0).expect("n >= 2");
            let [a, b] = sel.candidates.expect("two");
            prop_assert!(a.index < n && b.index < n);
            prop_assert_ne!(a.index, b.index);
        }
    }
}
