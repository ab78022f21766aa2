//! The buckets of one rate limit, one per key, in bounded memory: governor's GCRA state (a
//! theoretical arrival time per key, in nanoseconds since the limiter started) in a `DashMap` of at
//! most `max_keys` entries.
//!
//! governor's own keyed store has no bound (its `retain_recent` drops the keys at rest, when asked);
//! a key per client address, or per value of a field a client writes, would let a client fill memory.
//! Here a new key past the cap first evicts the eighth of the keys with the earliest theoretical
//! arrival times: the buckets that refilled longest ago, which a key dropped and seen again would
//! find (nearly) full anyway. One eviction scans the map once, so its cost spread over the next
//! `max_keys / 8` new keys is a few operations each.

use dashmap::DashMap;
use governor::{nanos::Nanos, state::StateStore};
use std::{
    cell::Cell,
    hash::{Hash, Hasher},
    net::IpAddr,
    num::NonZeroU64,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

/// What a bucket is kept for: a client address, a field's value, or the one bucket of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key {
    Client(IpAddr),
    Value(Box<[u8]>),
    Route,
}

impl Hash for Key {
    /// One write per key: SipHash pays per write, and the derived hash made five of a client
    /// address (the variant, the address's variant, the octets' length, the octets). Keys of
    /// different variants may hash alike; equality still tells them apart.
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            Self::Client(IpAddr::V4(ip)) => state.write_u32(ip.to_bits()),
            Self::Client(IpAddr::V6(ip)) => state.write_u128(ip.to_bits()),
            Self::Value(value) => state.write(value),
            Self::Route => state.write_u8(0),
        }
    }
}

/// A rate limit's buckets, shared by the workers of the process.
#[derive(Debug)]
pub(crate) struct Keys {
    /// SipHash (`RandomState`): the keys are the clients' to choose.
    map: DashMap<Key, AtomicU64>,
    cap: usize,
    /// Held by the one thread evicting; the others go on meanwhile (the map may pass its cap by
    /// the keys they add until the eviction ends).
    evicting: Mutex<()>,
}

thread_local! {
    /// Keys this thread evicted since the filter last took the count (an eviction runs on the
    /// worker whose request added the key past the cap, and is counted in that worker's cells).
    static EVICTED: Cell<u64> = const { Cell::new(0) };
}

/// The keys evicted by this thread since the last call.
pub(crate) fn take_evicted() -> u64 {
    EVICTED.with(|evicted| evicted.replace(0))
}

impl Keys {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            map: DashMap::new(),
            cap: cap.max(1),
            evicting: Mutex::new(()),
        }
    }

    /// Drops the eighth of the keys with the earliest theoretical arrival times (at least one; those
    /// tied with the last of them too).
    fn evict_oldest(&self) {
        let Ok(_evicting) = self.evicting.try_lock() else {
            return;
        };
        let mut times: Vec<u64> = (self.map.iter())
            .map(|entry| entry.value().load(Ordering::Relaxed))
            .collect();
        if times.is_empty() {
            return;
        }
        let nth = (times.len() / 8).saturating_sub(1);
        let (_, &mut threshold, _) = times.select_nth_unstable(nth);
        let before = self.map.len();
        self.map
            .retain(|_, time| time.load(Ordering::Relaxed) > threshold);
        let evicted = before.saturating_sub(self.map.len()) as u64;
        EVICTED.with(|count| count.set(count.get() + evicted));
    }
}

/// The limiter's handle on the shared buckets.
#[derive(Debug, Clone)]
pub(crate) struct SharedKeys(pub(crate) Arc<Keys>);

impl StateStore for SharedKeys {
    type Key = Key;

    fn measure_and_replace<T, F, E>(&self, key: &Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let keys = &self.0;
        if let Some(time) = keys.map.get(key) {
            return measure_and_replace(&time, f);
        }
        if keys.map.len() >= keys.cap {
            keys.evict_oldest();
        }
        let time = keys.map.entry(key.clone()).or_default();
        measure_and_replace(&time, f)
    }
}

/// governor's `InMemoryState::measure_and_replace_one` (crate-private there): the decision `f`
/// takes on the key's theoretical arrival time (0: a new key), stored if it lets the request
/// through and no other thread changed the time meanwhile, else taken again on the new time.
fn measure_and_replace<T, F, E>(time: &AtomicU64, f: F) -> Result<T, E>
where
    F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
{
    let read = |raw: u64| NonZeroU64::new(raw).map(|n| Nanos::from(n.get()));
    let mut previous = time.load(Ordering::Acquire);
    let mut decision = f(read(previous));
    while let Ok((result, next)) = decision {
        let next = u64::from(next);
        match time.compare_exchange_weak(previous, next, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return Ok(result),
            Err(changed) => previous = changed,
        }
        decision = f(read(previous));
    }
    decision.map(|(result, _)| result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_the_buckets_that_refilled_longest_ago_go_first() {
        let keys = SharedKeys(Arc::new(Keys::new(16)));
        take_evicted();
        for i in 0..16u8 {
            let key = Key::Client(IpAddr::from([10, 0, 0, i]));
            // Later keys, later theoretical arrival times.
            let _ = keys
                .measure_and_replace(&key, |_| Ok::<_, ()>(((), Nanos::from(u64::from(i) + 1))));
        }
        assert_eq!(keys.0.map.len(), 16);
        let new = Key::Value(b"new".to_vec().into_boxed_slice());
        let _ = keys.measure_and_replace(&new, |_| Ok::<_, ()>(((), Nanos::from(100))));
        assert_eq!(
            take_evicted(),
            2,
            "the eighth of 16 with the earliest times"
        );
        assert_eq!(keys.0.map.len(), 15);
        assert!(!keys
            .0
            .map
            .contains_key(&Key::Client(IpAddr::from([10, 0, 0, 0]))));
        assert!(keys
            .0
            .map
            .contains_key(&Key::Client(IpAddr::from([10, 0, 0, 15]))));
        assert!(keys.0.map.contains_key(&new));
    }
}
