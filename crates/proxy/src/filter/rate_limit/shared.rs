//! One limiter per route and rule for the whole process: every worker's filter for the route holds
//! the same one, so a client meets one limit however its connections spread over the workers (a
//! limit is not a load figure, whose per-worker view is the balancers' design).
//!
//! The same table is the reload carry-over: a route of the same name with the same rule finds the
//! limiter the workers still hold from before the reload, its buckets as they were; a changed rule
//! (or name) gets a new one, and the old one goes when the last worker drops its old table.
//!
//! A `key: route` rule has one bucket, governor's direct limiter (one atomic): no map, no hash.

use super::keys::{
    client_hashing, ClientHashing, ClientKey, FieldHashing, FieldKey, Keys, SharedKeys,
};
use duet_config::filter::rate_limit::{RateKey, RateLimit};
use governor::{
    clock::{Clock, QuantaClock, QuantaInstant},
    state::{InMemoryState, NotKeyed},
    NotUntil, Quota, RateLimiter,
};
use std::{
    num::NonZeroU32,
    sync::{Arc, Mutex, Weak},
};

/// A rule's GCRA over its buckets, by what the rule keys them on.
pub(crate) enum Limiter {
    /// `key: route`: the route's one bucket.
    Route(RateLimiter<NotKeyed, InMemoryState, QuantaClock>),
    /// `key: client_ip`.
    Client(RateLimiter<ClientKey, SharedKeys<ClientKey, ClientHashing>, QuantaClock>),
    /// `key: header:NAME`.
    Field(RateLimiter<FieldKey, SharedKeys<FieldKey, FieldHashing>, QuantaClock>),
}

/// Why a request was not let through: the time from which one more would be.
pub(crate) type Refused = NotUntil<QuantaInstant>;

impl Limiter {
    /// The time now on the limiter's clock.
    pub(crate) fn now(&self) -> QuantaInstant {
        match self {
            Self::Route(gcra) => gcra.clock().now(),
            Self::Client(gcra) => gcra.clock().now(),
            Self::Field(gcra) => gcra.clock().now(),
        }
    }
}

/// A limiter some worker holds, under its route's name and rule.
struct Held {
    route: Arc<str>,
    rule: RateLimit,
    limiter: Weak<Limiter>,
}

/// The limiters some worker holds.
static LIMITERS: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// The process's limiter for `rule` on the route named `route`: the one held already, or a new one.
pub(crate) fn limiter(route: &str, rule: &RateLimit) -> Arc<Limiter> {
    let mut all = LIMITERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    all.retain(|held| held.limiter.strong_count() > 0);
    let found = (all.iter())
        .filter(|held| *held.route == *route && held.rule == *rule)
        .find_map(|held| held.limiter.upgrade());
    if let Some(limiter) = found {
        return limiter;
    }
    let limiter = Arc::new(new_limiter(rule));
    all.push(Held {
        route: route.into(),
        rule: rule.clone(),
        limiter: Arc::downgrade(&limiter),
    });
    limiter
}

/// A limiter for `rule`, its buckets all full.
fn new_limiter(rule: &RateLimit) -> Limiter {
    let (quota, clock) = (quota(rule), QuantaClock::default());
    let cap = rule.max_keys as usize;
    match rule.key {
        RateKey::Route => Limiter::Route(RateLimiter::direct_with_clock(quota, clock)),
        RateKey::ClientIp => {
            let keys = SharedKeys(Arc::new(Keys::new(cap, client_hashing())));
            Limiter::Client(RateLimiter::new(quota, keys, clock))
        }
        RateKey::Header(_) => {
            let keys = SharedKeys(Arc::new(Keys::new(cap, FieldHashing::new())));
            Limiter::Field(RateLimiter::new(quota, keys, clock))
        }
    }
}

/// The rule as governor's quota: a request's share refills every `per / requests`, up to `burst`.
fn quota(rule: &RateLimit) -> Quota {
    let burst = NonZeroU32::new(rule.burst).unwrap_or(NonZeroU32::MIN);
    // The interval is never zero: the config allows at most 1e9 requests per second.
    let interval = rule.interval().max(std::time::Duration::from_nanos(1));
    Quota::with_period(interval)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX))
        .allow_burst(burst)
}
