//! One selection per policy, each a function of the candidates left and a draw source: no balancer
//! state, no load bookkeeping. The same candidates and weights serve a first pick and a retry that
//! excludes what it has tried.

use crate::{
    candidates::{Remaining, Weights},
    p2c::{P2c, Selection, WeightedPool},
};
use std::cmp::Ordering;

/// How a [`Balancer`](crate::Balancer) chooses among its eligible endpoints.
///
/// One half of a choice whose other half is the [`LoadMetric`](crate::LoadMetric): the pairs duet's
/// config names (`p2c_peak_ewma`, `least_inflight`...) are the [`Strategy`](crate::Strategy)s, which
/// also say which pairs are advised against and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub(crate) enum Policy {
    /// Power of two choices on the configured [`LoadMetric`](crate::LoadMetric). The product.
    #[default]
    P2c,
    /// Power of two choices with memory (Mitzenmacher, Prabhakar and Shah, *Load balancing with memory*,
    /// 2002), still exactly two load reads per pick: the endpoints that requests of this balancer
    /// completed on since the last pick (each has just freed a request slot; the last two distinct ones)
    /// take the place of fresh random candidates, and the lighter of the two wins, equal loads going to
    /// the coin. With one remembered, it meets one candidate drawn at random among the others; with none,
    /// or with weights that differ (memory would bend the weight shares), or on a retry that excludes
    /// endpoints, the pick is plain [`P2c`](Self::P2c). A completion vouches for one pick.
    ///
    /// Opt-in. In duet-sim's finite-capacity model (10 backends of 4 request slots, one at half speed,
    /// near saturation) it cuts plain P2C's p50 and p99 under either metric and keeps the
    /// slow-backend, degraded-backend and many-worker results (`cargo test -p duet-sim --test memory`
    /// pins this); on real traffic it closes most of P2C's p50 gap to a full scan. Remembering the last
    /// *winner* instead (the classic memory) did worse than plain P2C there. The figures are dated
    /// records in the book's lab (`docs/src/lab/balance-quality.md`).
    P2cMemory,
    /// Least loaded, by a full scan: **every** eligible endpoint's load is read on every pick (n reads
    /// where every other load-aware policy reads two), and the minimum wins, loads divided by weight when
    /// weights differ (nginx's `least_conn`, HAProxy's `leastconn`). Equal minimums are settled by one
    /// draw, in proportion to weight; a pick without a tie draws nothing.
    ///
    /// **The exception to the two-read rule, and opt-in for that reason.** A scan costs O(n) per pick,
    /// and it makes every balancer that sees the same loads agree on the same minimum: many workers or
    /// many duet instances sharing a view would herd onto it. duet's workers each see only their own
    /// requests, so they do not share a view, but each also knows only its own share of the traffic: with
    /// many of them a scan of what one knows is worth little more than two samples of it (duet-sim's
    /// herd table). Where it pays is one worker, or a few, carrying a pool of backends that each serve a
    /// handful of requests at once near saturation: there a scan knows strictly more than two samples
    /// (duet-sim's finite-capacity model, and the capacity experiment against nginx and HAProxy).
    LeastLoaded,
    /// Each eligible endpoint in turn, ignoring load, in proportion to weight (smooth weighted round
    /// robin). A baseline for benchmarks.
    RoundRobin,
    /// One uniformly random (or weight-proportional) endpoint, ignoring load. A baseline.
    Random,
}

/// Power of two choices among `left`; `load(slot)` is read exactly twice when two or more are left.
/// Indices in the selection are slots of the candidates. `None` when nothing is left.
///
/// With nothing excluded the draws are the plain algorithm's ([`P2c::select`],
/// [`P2c::select_weighted`]); with exclusions they are the same rules over the ranks of what is left.
#[inline]
pub(crate) fn p2c(
    left: Remaining<'_>,
    p2c: &mut P2c,
    load: impl FnMut(usize) -> f64,
) -> Option<Selection> {
    let selection = match left.candidates().weights() {
        Some(weights) if left.is_all() => p2c.select_weighted(weights.table(), load),
        Some(_) => p2c.select_weighted_in(&left, load),
        None if left.is_all() => p2c.select(left.len(), load),
        None => p2c.select_mapped(left.len(), |rank| left.nth(rank), load),
    };
    selection.ok()
}

/// [`p2c`] with the `remembered` slots of `left`'s candidates in place of fresh draws
/// ([`P2c::select_with_memory`]) when nothing is excluded and the candidates weigh the same; otherwise
/// plain [`p2c`].
#[inline]
pub(crate) fn p2c_remembering(
    left: Remaining<'_>,
    p2c: &mut P2c,
    remembered: [Option<usize>; 2],
    load: impl FnMut(usize) -> f64,
) -> Option<Selection> {
    if left.is_all() && left.candidates().weights().is_none() {
        p2c.select_with_memory(left.len(), remembered, load).ok()
    } else {
        self::p2c(left, p2c, load)
    }
}

/// The least loaded of `left`, by a full scan: `load(slot)` is read exactly once for every candidate
/// left (none when only one is left), and the minimum wins ([`f64::total_cmp`], so a NaN never does).
/// Equal minimums are settled by exactly one draw, in proportion to weight when weights differ (so that
/// idle endpoints, all at zero, share sequential traffic by weight, as nginx's tie-break does); no tie,
/// no draw. `tied` is scratch space, kept by the caller so a pick allocates nothing once warm. The
/// selection names no pair (`candidates` is `None`); `tie` says whether a draw decided.
pub(crate) fn least_loaded(
    left: Remaining<'_>,
    p2c: &mut P2c,
    tied: &mut Vec<usize>,
    mut load: impl FnMut(usize) -> f64,
) -> Option<Selection> {
    let candidates = left.candidates();
    let only = |slot: usize| Selection {
        chosen: slot,
        candidates: None,
        tie: false,
    };
    match left.len() {
        0 => return None,
        1 => return Some(only(left.nth(0))),
        _ => {}
    }
    tied.clear();
    let mut lightest: Option<f64> = None;
    for slot in (0..candidates.len()).filter(|&slot| left.is_all() || !left.excludes(slot)) {
        let load = load(slot);
        match lightest.map(|lightest| load.total_cmp(&lightest)) {
            None | Some(Ordering::Less) => {
                lightest = Some(load);
                tied.clear();
                tied.push(slot);
            }
            Some(Ordering::Equal) => tied.push(slot),
            Some(Ordering::Greater) => {}
        }
    }
    Some(match tied.as_slice() {
        [] => return None,
        [slot] => only(*slot),
        many => Selection {
            chosen: settle(many, candidates.weights(), p2c.draw()),
            candidates: None,
            tie: true,
        },
    })
}

/// One of the `tied` slots, from one draw: uniformly, or in proportion to weight.
fn settle(tied: &[usize], weights: Option<&Weights>, draw: u64) -> usize {
    let Some(weights) = weights else {
        return tied[(draw % tied.len() as u64) as usize];
    };
    let weight = |slot: usize| weights.thousandths()[slot];
    let total: u64 = tied.iter().map(|&slot| weight(slot)).sum();
    let mut point = draw % total.max(1);
    for &slot in tied {
        if point < weight(slot) {
            return slot;
        }
        point -= weight(slot);
    }
    tied[tied.len() - 1]
}

/// One endpoint of `left` at random, in proportion to weight; one left takes no draw.
pub(crate) fn random(left: Remaining<'_>, p2c: &mut P2c) -> Option<usize> {
    match left.len() {
        0 => None,
        1 => Some(left.nth(0)),
        n => Some(match left.candidates().weights() {
            Some(weights) if left.is_all() => weights.table().sample(p2c.draw()),
            Some(_) => left.sample(p2c.draw()),
            None => left.nth((p2c.draw() % n as u64) as usize),
        }),
    }
}

/// Round robin's position: a turn counter, and smooth weighted round robin's running weights for one
/// list of candidates (started afresh when the list is rebuilt).
#[derive(Debug, Default)]
pub(crate) struct Turns {
    turn: usize,
    running: Vec<i64>,
    /// The [`generation`](crate::candidates::Candidates::generation) `running` belongs to.
    generation: Option<u64>,
}

impl Turns {
    /// The next endpoint of `left` in turn. `None` when nothing is left.
    pub(crate) fn select(&mut self, left: Remaining<'_>) -> Option<usize> {
        if left.len() == 0 {
            return None;
        }
        Some(match left.candidates().weights() {
            Some(weights) => self.smooth(left, weights),
            None => {
                self.turn = self.turn.wrapping_add(1);
                left.nth(self.turn % left.len())
            }
        })
    }

    /// Smooth weighted round robin (nginx's): every candidate left gains its weight, the richest is
    /// chosen and pays what they gained. Weights 3:1 give `a a b a`, never a burst longer than the
    /// weights require; an excluded candidate sits the turn out, neither gaining nor paying. O(n) with no
    /// allocation once the list is known (round robin is a baseline, n is small).
    fn smooth(&mut self, left: Remaining<'_>, weights: &Weights) -> usize {
        let generation = left.candidates().generation();
        if self.generation != Some(generation) {
            self.running.clear();
            self.running.resize(left.candidates().len(), 0);
            self.generation = Some(generation);
        }
        let (mut chosen, mut richest, mut total) = (0, i64::MIN, 0);
        let gains = weights.thousandths().iter().map(|&w| w as i64);
        for (slot, (running, gain)) in self.running.iter_mut().zip(gains).enumerate() {
            if !left.is_all() && left.excludes(slot) {
                continue;
            }
            *running += gain;
            total += gain;
            if *running > richest {
                (chosen, richest) = (slot, *running);
            }
        }
        self.running[chosen] -= total;
        chosen
    }
}
