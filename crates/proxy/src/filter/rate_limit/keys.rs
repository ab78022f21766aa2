//! The buckets of one keyed rate limit, one per key, in bounded memory: governor's GCRA state (a
//! theoretical arrival time per key, in nanoseconds since the limiter started) in a `DashMap` of at
//! most `max_keys` entries.
//!
//! governor's own keyed store has no bound (its `retain_recent` drops the keys at rest, when asked);
//! a key per client address, or per value of a field a client writes, would let a client fill memory.
//! Here a new key past the cap first evicts the eighth of the keys with the earliest theoretical
//! arrival times: the buckets that refilled longest ago, which a key dropped and seen again would
//! find (nearly) full anyway. One eviction scans the map once, so its cost spread over the next
//! `max_keys / 8` new keys is a few operations each.
//!
//! **Hashing.** A client may choose its keys (a field's value outright; an address through a trusted
//! proxy's `X-Forwarded-For`), so the map's hash is keyed per process, against keys made to
//! collide. A field's value, any bytes of any length, gets SipHash (std's `RandomState`). An
//! address, 4 or 16 bytes, gets foldhash (`quality`) seeded from std's random keys: SipHash was
//! ~155 instructions of a ~240-instruction decision, foldhash on one integer is a few multiplies,
//! and the seed the client cannot see is what keeps it from precomputing collisions.

use dashmap::DashMap;
use governor::{nanos::Nanos, state::StateStore};
use std::{
    cell::Cell,
    hash::{BuildHasher, Hash, Hasher},
    net::IpAddr,
    num::NonZeroU64,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, LazyLock, Mutex,
    },
};

/// A client address key: the address as the access log names it, IPv4-mapped IPv6 as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientKey(IpAddr);

impl ClientKey {
    pub(crate) fn new(client: IpAddr) -> Self {
        Self(client.to_canonical())
    }
}

impl Hash for ClientKey {
    /// One write: the derived hash made four (the variant, the octets' length, the octets).
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self.0 {
            IpAddr::V4(ip) => state.write_u32(ip.to_bits()),
            IpAddr::V6(ip) => state.write_u128(ip.to_bits()),
        }
    }
}

/// A field's value as a key (`key: header:NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldKey(Box<[u8]>);

impl FieldKey {
    pub(crate) fn new(value: &[u8]) -> Self {
        Self(value.into())
    }
}

impl Hash for FieldKey {
    /// One write (no length prefix: the value is the whole key, nothing follows it to be confused
    /// with): SipHash pays per write.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

/// The hash of client address keys: foldhash, seeded once per process.
pub(crate) type ClientHashing = foldhash::quality::SeedableRandomState;

/// The hash of field value keys: SipHash, randomly keyed.
pub(crate) type FieldHashing = std::hash::RandomState;

/// A foldhash state seeded from the process's secret random keys (std's `RandomState` draws them
/// from the OS): foldhash's own `RandomState` seeds from addresses and the clock, which it does not
/// claim to be unpredictable.
pub(crate) fn client_hashing() -> ClientHashing {
    static SHARED: LazyLock<foldhash::SharedSeed> =
        LazyLock::new(|| foldhash::SharedSeed::from_u64(std::hash::RandomState::new().hash_one(0)));
    let per_map = std::hash::RandomState::new().hash_one(1);
    ClientHashing::with_seed(per_map, &SHARED)
}

/// A rate limit's buckets, shared by the workers of the process.
pub(crate) struct Keys<K, S> {
    map: DashMap<K, AtomicU64, S>,
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

impl<K: Hash + Eq, S: BuildHasher + Clone> Keys<K, S> {
    pub(crate) fn new(cap: usize, hashing: S) -> Self {
        Self {
            map: DashMap::with_hasher(hashing),
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
pub(crate) struct SharedKeys<K, S>(pub(crate) Arc<Keys<K, S>>);

impl<K: Hash + Eq + Clone, S: BuildHasher + Clone> StateStore for SharedKeys<K, S> {
    type Key = K;

    fn measure_and_replace<T, F, E>(&self, key: &K, f: F) -> Result<T, E>
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

    fn client(last: u8) -> ClientKey {
        ClientKey::new(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn past_the_cap_the_buckets_that_refilled_longest_ago_go_first() {
        let keys = SharedKeys(Arc::new(Keys::new(16, client_hashing())));
        take_evicted();
        for i in 0..16u8 {
            // Later keys, later theoretical arrival times.
            let _ = keys.measure_and_replace(&client(i), |_| {
                Ok::<_, ()>(((), Nanos::from(u64::from(i) + 1)))
            });
        }
        assert_eq!(keys.0.map.len(), 16);
        let new = client(200);
        let _ = keys.measure_and_replace(&new, |_| Ok::<_, ()>(((), Nanos::from(100))));
        assert_eq!(
            take_evicted(),
            2,
            "the eighth of 16 with the earliest times"
        );
        assert_eq!(keys.0.map.len(), 15);
        assert!(!keys.0.map.contains_key(&client(0)));
        assert!(!keys.0.map.contains_key(&client(1)));
        assert!(keys.0.map.contains_key(&client(15)));
        assert!(keys.0.map.contains_key(&new));
    }

    #[test]
    fn an_ipv4_mapped_address_is_the_ipv4_client() {
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().expect("address");
        assert_eq!(ClientKey::new(mapped), client(7));
        let keys = SharedKeys(Arc::new(Keys::new(4, client_hashing())));
        let _ = keys.measure_and_replace(&client(7), |_| Ok::<_, ()>(((), Nanos::from(5))));
        let seen = keys.measure_and_replace(&ClientKey::new(mapped), |time| {
            Ok::<_, ()>((time.map(u64::from), Nanos::from(6)))
        });
        assert_eq!(seen, Ok(Some(5)), "the same bucket");
    }

    #[test]
    fn each_map_hashes_with_its_own_secret_seed() {
        let key = client(1);
        let (first, second) = (client_hashing(), client_hashing());
        assert_ne!(first.hash_one(key), second.hash_one(key));
        assert_eq!(first.hash_one(key), first.hash_one(key));
    }
}
