//! What a balancer shares with the outside: its counters, a snapshot of its endpoints, and updates
//! queued for it; read and written through a cloneable [`BalanceHandle`].

use crate::load::EndpointLoad;
use std::{
    collections::VecDeque,
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex, MutexGuard, PoisonError,
    },
};

/// Counters of a balancer's selections, for telemetry ([`Balancer::stats`](crate::Balancer::stats),
/// [`BalanceHandle::stats`]).
///
/// ```
/// use duet_balance::{Balancer, Strategy};
///
/// let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 1);
/// for key in ["a", "b", "c"] {
///     balance.insert(key, 1, ());
/// }
/// for _ in 0..10 {
///     balance.pick()?;
/// }
/// let stats = balance.stats();
/// assert_eq!((stats.picks, stats.load_reads), (10, 20), "two loads read per pick");
/// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PickStats {
    /// Endpoints picked.
    pub picks: u64,
    /// Loads read to make those picks (exactly two per P2C pick among two or more endpoints; one per
    /// candidate under a full scan, `least_inflight` and `least_peak_ewma`).
    pub load_reads: u64,
    /// Picks decided by a coin flip between equal loads (a draw among equal minimums under a full
    /// scan).
    pub ties: u64,
    /// Picks where both candidates had zero load: too little concurrency for the metric to mean much.
    pub both_zero: u64,
    /// Requests refused because no endpoint was eligible.
    pub no_eligible: u64,
    /// Endpoints removed because their service's `poll_ready` failed (tower's balancer evicts them too:
    /// a service whose readiness fails is closed for good, e.g. a dropped connection).
    pub evicted: u64,
    /// Picks given up because the endpoint's service was not ready, and made again elsewhere.
    pub repicks: u64,
    /// Keyed picks ([`Affinity`](crate::Affinity)) sent to another endpoint than the key's home: its
    /// home was over the bound, or tried already.
    pub walked: u64,
}

/// One endpoint as a [`BalanceHandle`] reads it ([`BalanceHandle::endpoints`]), and as
/// [`Balancer::endpoints`](crate::Balancer::endpoints) lists it (with `K` a reference to the key there).
#[derive(Clone)]
pub struct EndpointStats<K> {
    /// Its key.
    pub key: K,
    /// Its configured weight (slow start ramps what picks use; this is where it ramps to).
    pub weight: u32,
    /// Its load state, live: eligibility, in flight, picks, latency estimate.
    pub load: Arc<EndpointLoad>,
}

impl<K: fmt::Debug> fmt::Debug for EndpointStats<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointStats")
            .field("key", &self.key)
            .field("weight", &self.weight)
            .field("load", &self.load)
            .finish()
    }
}

/// A cloneable, `Send + Sync` handle on a balancer ([`Balancer::handle`](crate::Balancer::handle),
/// [`DiscoverBalancer::handle`](crate::DiscoverBalancer::handle)) that still works once the balancer has
/// moved into a `tower::buffer::Buffer` or another task: it reads the selection counters and each
/// endpoint's state, and sets weights and eligibility.
///
/// Reads are live: the counters are the balancer's own (atomics it alone writes), and each endpoint's
/// [`EndpointLoad`] is shared; the list of endpoints is the one as of the last membership change.
/// Updates are queued and applied by the balancer at its next pick, in the order they were made (after
/// a [`DiscoverBalancer`](crate::DiscoverBalancer)'s stream changes). Reading costs a lock on the endpoint
/// list and a copy of it, nothing on the balancer's side: poll it for metrics as often as you like. A
/// balancer without a handle pays for none of it.
///
/// ```
/// use duet_balance::{Balancer, Strategy};
///
/// let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 1);
/// balance.insert("a", 1, ());
/// balance.insert("b", 1, ());
/// let handle = balance.handle(); // clone it, move it to a metrics task...
///
/// handle.set_weight("a", 3);
/// balance.pick()?; // the balancer applies queued updates at its next pick
/// let endpoints: Vec<(&str, u32, u64)> =
///     handle.endpoints().iter().map(|e| (e.key, e.weight, e.load.in_flight())).collect();
/// assert_eq!(endpoints, [("a", 3, 0), ("b", 1, 0)]);
/// assert_eq!(handle.stats().picks, 1);
/// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
/// ```
pub struct BalanceHandle<K> {
    shared: Arc<Shared<K>>,
}

/// The state behind a [`BalanceHandle`].
pub(crate) struct Shared<K> {
    pub(crate) counters: Counters,
    /// Whether `updates` may be non-empty: the one thing a pick reads here.
    pending: AtomicBool,
    /// Whether a handle was ever made: the balancer publishes its endpoints only then.
    watched: AtomicBool,
    updates: Mutex<VecDeque<Update<K>>>,
    endpoints: Mutex<Vec<EndpointStats<K>>>,
}

/// An update queued through a handle.
pub(crate) enum Update<K> {
    Weight(K, u32),
    Eligible(K, bool),
}

/// The counters of [`PickStats`], which the owning balancer alone writes (under `&mut`: a load and a
/// store, not a read-modify-write) and anyone may read.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) picks: Counter,
    pub(crate) load_reads: Counter,
    pub(crate) ties: Counter,
    pub(crate) both_zero: Counter,
    pub(crate) no_eligible: Counter,
    pub(crate) evicted: Counter,
    pub(crate) repicks: Counter,
    pub(crate) walked: Counter,
}

#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

// === impl Counter ===

impl Counter {
    /// Adds `n`. Only the balancer that owns the counter calls this.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline]
    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

// === impl Counters ===

impl Counters {
    pub(crate) fn snapshot(&self) -> PickStats {
        PickStats {
            picks: self.picks.get(),
            load_reads: self.load_reads.get(),
            ties: self.ties.get(),
            both_zero: self.both_zero.get(),
            no_eligible: self.no_eligible.get(),
            evicted: self.evicted.get(),
            repicks: self.repicks.get(),
            walked: self.walked.get(),
        }
    }
}

// === impl Shared ===

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoned means a panic elsewhere while it was held; what it holds is plain data, still whole.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K> Default for Shared<K> {
    fn default() -> Self {
        Self {
            counters: Counters::default(),
            pending: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            updates: Mutex::default(),
            endpoints: Mutex::default(),
        }
    }
}

impl<K> Shared<K> {
    /// Whether a handle has queued updates since they were last taken.
    #[inline]
    pub(crate) fn has_updates(&self) -> bool {
        self.pending.load(Relaxed)
    }

    /// The queued updates, in order.
    pub(crate) fn take_updates(&self) -> VecDeque<Update<K>> {
        let mut queue = lock(&self.updates);
        self.pending.store(false, Relaxed);
        std::mem::take(&mut *queue)
    }

    /// Whether a handle exists to read the endpoint list.
    pub(crate) fn is_watched(&self) -> bool {
        self.watched.load(Relaxed)
    }

    /// Replaces the endpoint list handles read.
    pub(crate) fn publish(&self, endpoints: Vec<EndpointStats<K>>) {
        *lock(&self.endpoints) = endpoints;
    }

    /// A new handle; the balancer then publishes its endpoints (`publish`) on every change.
    pub(crate) fn handle(self: &Arc<Self>) -> BalanceHandle<K> {
        self.watched.store(true, Relaxed);
        BalanceHandle {
            shared: self.clone(),
        }
    }
}

// === impl BalanceHandle ===

impl<K> Clone for BalanceHandle<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> BalanceHandle<K> {
    /// The selection counters, now.
    pub fn stats(&self) -> PickStats {
        self.shared.counters.snapshot()
    }

    /// The endpoints as of the last membership change, each with its live load state.
    pub fn endpoints(&self) -> Vec<EndpointStats<K>>
    where
        K: Clone,
    {
        lock(&self.shared.endpoints).clone()
    }

    /// Sets an endpoint's weight (0 takes it out of rotation) at the balancer's next pick. Ignored if
    /// the key is unknown then.
    pub fn set_weight(&self, key: K, weight: u32) {
        self.push(Update::Weight(key, weight));
    }

    /// Marks an endpoint eligible or not at the balancer's next pick, keeping its load state (see
    /// [`Balancer::set_eligible`](crate::Balancer::set_eligible)). Ignored if the key is unknown then.
    pub fn set_eligible(&self, key: K, eligible: bool) {
        self.push(Update::Eligible(key, eligible));
    }

    fn push(&self, update: Update<K>) {
        lock(&self.shared.updates).push_back(update);
        self.shared.pending.store(true, Relaxed);
    }
}

impl<K> fmt::Debug for BalanceHandle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalanceHandle")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
