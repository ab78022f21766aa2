//! Consistent hashing with bounded loads: a keyed pick's home is the endpoint of its Maglev entry (or
//! its point on a hash ring), taken while that endpoint is under the load bound, else the key walks on
//! to its next candidates.

use crate::{candidates::Remaining, maglev::Maglev, ring::Ring, stable_hash::stable_hash};

/// Keyed picks by consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
/// *Consistent Hashing with Bounded Loads*, SODA 2018), on a Maglev table or a hash ring; set with
/// [`Balancer::with_affinity`](crate::Balancer::with_affinity), used by
/// [`Balancer::pick_and_claim_for`](crate::Balancer::pick_and_claim_for).
///
/// * **Home.** A key's home is the endpoint of its entry in a Maglev table of the eligible endpoints,
///   weighted (Eisenbud et al., NSDI 2016; 65,537 entries by default): one array read. Or, with
///   [`Affinity::ring`], of its point on a hash ring ([`Ring`](crate::algo::Ring)): an index read and
///   a few points. Maglev spreads keys evenly (entries differ by one) but a rebuild moves some keys of
///   endpoints that stayed (up to 1.7/n for one of 100 leaving, at 65,537 entries); the ring moves
///   only the keys of the endpoint that left or joined, and its shares vary by about 3%. The table is
///   rebuilt when membership, eligibility or a weight changes (a slow-start step included), at the
///   change when the balancer's owner makes it and at the next pick when a
///   [`BalanceHandle`](crate::BalanceHandle) queued it; never per request.
/// * **Bound.** An endpoint takes a key only while its requests in flight are under
///   `⌈c · (m + 1) · w / W⌉`: `m` the requests this balancer has in flight, `w/W` the endpoint's share of
///   the weight, `c` the bound (1.25 by default, at least 1). So no endpoint carries more than `c` times
///   its share, whatever the keys: one hot key spills onto its next candidates instead of swamping its
///   home. [`Affinity::unbounded`] is plain consistent hashing.
/// * **Walk.** Past an endpoint over the bound, the key's next candidates are the endpoints of the
///   entries that follow its own in the table, each once ([`Maglev::walk`](crate::algo::Maglev::walk)).
///   [`Walk::Next`] takes the first under the bound (HAProxy's `hash-balance-factor`);
///   [`Walk::P2c`] (the default) compares the first two under the bound and takes the one with fewer
///   requests in flight per weight, the earlier on equal loads, so the spill of a hot key goes where
///   there is room and still lands on few endpoints.
/// * **Retries.** Endpoints a retry excludes are skipped: the retry goes to the key's next candidate,
///   never back to one tried.
/// * **No seed.** Endpoint ids and keys are hashed with [`stable_hash`](crate::algo::stable_hash),
///   which no process, worker or start-up changes: every worker and every instance with the same
///   endpoints sends a key to the same endpoint, and so does the next process after a restart. P2C's
///   tie-breaks are the opposite on purpose: they are seeded per balancer from the operating system
///   because a pick with no key has nothing to agree on, and identical draws would herd every worker
///   onto the same endpoint at each cold start. A keyed pick must agree: that is what a key is for.
///   The bound breaks the agreement only where it must, per worker on its own loads.
///
/// A pick with no key (`None`) is made by the balancer's [`Strategy`](crate::Strategy), P2C by default.
///
/// With tower endpoints, pick for the request's key, then drive the endpoint's service; the guard holds
/// the load until the response is done:
///
/// ```
/// use duet_balance::{algo::stable_hash, Affinity, Balancer, Strategy};
/// use std::convert::Infallible;
/// use tower::{service_fn, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), duet_balance::BoxError> {
/// let mut balance = Balancer::new(Strategy::P2cInflight).with_affinity(Affinity::maglev());
/// for name in ["a", "b", "c"] {
///     let backend = service_fn(move |user: &'static str| async move { Ok::<_, Infallible>((name, user)) });
///     balance.insert(name, 1, backend);
/// }
/// let mut served = Vec::new();
/// for _ in 0..3 {
///     let user = "user-42";
///     let (_, service, guard) = balance.pick_and_claim_for(Some(stable_hash(user)), &[])?;
///     let (name, _) = service.ready().await?.call(user).await?;
///     drop(guard);
///     served.push(name);
/// }
/// assert!(served.iter().all(|name| *name == served[0]), "one key, one backend: {served:?}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Affinity {
    bound: Option<f64>,
    walk: Walk,
    table_size: u32,
    algorithm: Algorithm,
}

/// Where a key goes when its home is over the bound: see [`Affinity`].
///
/// ```
/// use duet_balance::{Affinity, Walk};
///
/// let affinity = Affinity::maglev().with_bound(1.5).with_walk(Walk::Next);
/// assert_eq!((affinity.bound(), affinity.walk()), (Some(1.5), Walk::Next));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Walk {
    /// The first of the key's next candidates under the bound.
    Next,
    /// The one with fewer requests in flight (per weight) of the first two under the bound.
    #[default]
    P2c,
}

impl Affinity {
    /// Maglev with 65,537 entries, bound 1.25, [`Walk::P2c`].
    pub fn maglev() -> Self {
        Self {
            bound: Some(1.25),
            walk: Walk::P2c,
            table_size: crate::maglev::DEFAULT_TABLE_SIZE,
            algorithm: Algorithm::Maglev,
        }
    }

    /// A hash ring with 1,024 points per endpoint (of the heaviest weight), bound 1.25, [`Walk::P2c`].
    ///
    /// ```
    /// use duet_balance::{algo::stable_hash, Affinity, Balancer, Strategy};
    ///
    /// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cInflight).with_affinity(Affinity::ring());
    /// for name in ["a", "b", "c"] {
    ///     balance.insert(name, 1, ());
    /// }
    /// let home = *balance.pick_for(Some(stable_hash("user-42")))?;
    /// balance.remove(&if home == "a" { "b" } else { "a" });
    /// assert_eq!(*balance.pick_for(Some(stable_hash("user-42")))?, home, "only the leaver's keys move");
    /// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
    /// ```
    pub fn ring() -> Self {
        Self {
            table_size: crate::ring::DEFAULT_POINTS,
            algorithm: Algorithm::Ring,
            ..Self::maglev()
        }
    }

    /// Bounds each endpoint to `c` times its share of the requests in flight (at least 1; a value
    /// under 1, or not a number, is taken as 1).
    pub fn with_bound(mut self, c: f64) -> Self {
        self.bound = Some(if c >= 1.0 { c } else { 1.0 });
        self
    }

    /// No bound: plain consistent hashing, every key at its home whatever the load.
    pub fn unbounded(mut self) -> Self {
        self.bound = None;
        self
    }

    /// Walks past a full home with `walk`.
    pub fn with_walk(mut self, walk: Walk) -> Self {
        self.walk = walk;
        self
    }

    /// A Maglev table of `size` entries: use a prime (65,537 by default; 655,373 for pools of
    /// thousands). On a ring, `size` points for an endpoint of the heaviest weight (1,024 by default).
    pub fn with_table_size(mut self, size: u32) -> Self {
        self.table_size = size.max(1);
        self
    }

    /// The bound `c`, if any.
    pub fn bound(&self) -> Option<f64> {
        self.bound
    }

    /// The walk past a full home.
    pub fn walk(&self) -> Walk {
        self.walk
    }

    /// The table's entries (Maglev), or an endpoint's points (ring).
    pub fn table_size(&self) -> u32 {
        self.table_size
    }

    /// The table's kind: `maglev` or `ring`.
    pub fn algorithm(&self) -> &'static str {
        match self.algorithm {
            Algorithm::Maglev => "maglev",
            Algorithm::Ring => "ring",
        }
    }
}

impl Default for Affinity {
    fn default() -> Self {
        Self::maglev()
    }
}

/// Which table an [`Affinity`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Maglev,
    Ring,
}

/// A key's table: what a keyed pick reads and walks, whichever the algorithm.
#[derive(Debug)]
enum Table {
    Maglev(Maglev),
    Ring(Ring),
}

impl Table {
    fn new(config: &Affinity, members: &[(u64, u32)]) -> Self {
        match config.algorithm {
            Algorithm::Maglev => Self::Maglev(Maglev::new(members, config.table_size)),
            Algorithm::Ring => Self::Ring(Ring::new(members, config.table_size)),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Self::Maglev(table) => table.is_empty(),
            Self::Ring(ring) => ring.is_empty(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Maglev(table) => table.len(),
            Self::Ring(ring) => ring.len(),
        }
    }

    /// The member of entry (or point) `at`, taken modulo the length.
    #[inline]
    fn entry(&self, at: usize) -> u32 {
        match self {
            Self::Maglev(table) => table.entry(at),
            Self::Ring(ring) => ring.entry(at),
        }
    }

    /// The entry (or point) `key` lands on.
    #[inline]
    fn entry_of(&self, key: u64) -> usize {
        match self {
            Self::Maglev(table) => table.entry_of(key),
            Self::Ring(ring) => ring.entry_of(key),
        }
    }
}

/// A balancer's keyed-pick state: the table of its endpoints and the requests it has in flight.
///
/// The table is over every endpoint of non-zero weight, eligible or not, by position, and rebuilt only
/// when the members or their weights change: an endpoint that turns ineligible (unhealthy, ejected) is
/// skipped by the walk, so exactly its keys move, each to its own next candidate, and all come back
/// with it. Slow start's ramp is not in the table (it would move keys every step); the bound caps what
/// a newcomer takes.
#[derive(Debug)]
pub(crate) struct Hashing {
    config: Affinity,
    /// Over endpoint positions, for `members`.
    table: Table,
    /// `(id, weight)` by endpoint position, as the table was built for.
    members: Vec<(u64, u32)>,
    built: bool,
    /// `seen[slot] == epoch`: the slot was met in this pick's walk (no clearing per pick).
    seen: Vec<u32>,
    epoch: u32,
}

/// A keyed pick: the slot, and whether the key's home took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keyed {
    pub(crate) slot: usize,
    pub(crate) home: bool,
}

impl Hashing {
    pub(crate) fn new(config: Affinity) -> Self {
        Self {
            config,
            table: Table::Maglev(Maglev::default()),
            members: Vec::new(),
            built: false,
            seen: Vec::new(),
            epoch: 0,
        }
    }

    /// Rebuilds the table if the members changed: `members` are the endpoints' keys by position with
    /// their configured weights. O(n) to check; the rebuild only on a change.
    pub(crate) fn sync<'k, K: std::hash::Hash + 'k>(
        &mut self,
        members: impl Iterator<Item = (&'k K, u32)>,
    ) {
        let members: Vec<(u64, u32)> = members
            .map(|(key, weight)| (stable_hash(key), weight))
            .collect();
        if self.built && members == self.members {
            return;
        }
        self.table = Table::new(&self.config, &members);
        self.seen = vec![0; members.len()];
        self.epoch = 0;
        self.members = members;
        self.built = true;
    }

    /// The slot for `key` among `left`, with `in_flight` requests in flight through the balancer, all
    /// endpoints together; `left`'s loads are `load(slot)` (requests in flight) and shares
    /// `share(slot)` (weight over total weight); `slot(position)` is an endpoint's slot if it is a
    /// candidate. `None` when nothing is left.
    pub(crate) fn select(
        &mut self,
        key: u64,
        left: &Remaining<'_>,
        in_flight: u64,
        slot: impl Fn(usize) -> Option<usize>,
        load: impl Fn(usize) -> u64,
        share: impl Fn(usize) -> f64,
    ) -> Option<Keyed> {
        if self.table.is_empty() || left.len() == 0 {
            return None;
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
        let total = in_flight + 1;
        let under = |slot: usize| match self.config.bound {
            None => true,
            Some(c) => (load(slot) as f64) < (c * total as f64 * share(slot)).ceil(),
        };
        let start = self.table.entry_of(key);
        let (mut first, mut found, mut met) = (None, None, 0);
        for step in 0..self.table.len() {
            let position = self.table.entry(start + step) as usize;
            if self.seen[position] == self.epoch {
                continue;
            }
            self.seen[position] = self.epoch;
            met += 1;
            let candidate = slot(position).filter(|&s| left.is_all() || !left.excludes(s));
            if let Some(slot) = candidate {
                let home = step == 0;
                first.get_or_insert(Keyed { slot, home });
                if under(slot) {
                    let keyed = Keyed { slot, home };
                    match (self.config.walk, found) {
                        // The key's first candidate left (its home on a first pick) is taken while
                        // under the bound, whatever the walk.
                        _ if first == Some(keyed) => return Some(keyed),
                        (Walk::Next, _) => return Some(keyed),
                        (Walk::P2c, None) => found = Some(keyed),
                        (Walk::P2c, Some(earlier)) => {
                            let per_weight = |s: usize| load(s) as f64 / share(s);
                            let lighter = per_weight(slot) < per_weight(earlier.slot);
                            return Some(if lighter { keyed } else { earlier });
                        }
                    }
                }
            }
            if met == self.seen.len() {
                break;
            }
        }
        // With a bound of at least 1 some candidate is always under it, unless it has no entry (a
        // weight far below the others') or the walk met only members that are no candidates (panic
        // mode off, all the table's members out): the key's first candidate serves, or none.
        found.or(first)
    }
}
