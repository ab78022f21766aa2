//! `rate_limit:`, a filter of the request phase: how fast each client (or each value of a field, or
//! the route as a whole) may send, as nginx's `limit_req`, Envoy's local rate limit and Traefik's
//! `RateLimit` do. GCRA (governor's), the token bucket without a timer: a key's state is one
//! theoretical arrival time, a request goes through when it is at most `burst` intervals ahead.
//!
//! - **Shared by the workers** ([`shared`]): one limiter per route and rule for the process.
//! - **Bounded** ([`keys`]): at most `max_keys` buckets, the longest-refilled evicted past it, counted
//!   in `duet_rate_limit_keys_evicted_total`.
//! - **Refused**: 429 (a gRPC call `RESOURCE_EXHAUSTED`, 8) with `Retry-After` and the IETF draft's
//!   `RateLimit-Policy` (the bucket: `q` requests over `w` seconds) and `RateLimit` (`r=0`, and `t`,
//!   the seconds until one more request goes through). Only refusals carry the fields: an allowed
//!   request pays for the decision alone.
//! - **`mode: log`** lets the excess through and counts it as `would_limit`; a request let through
//!   so takes nothing from the bucket (GCRA changes a key's state only for what it admits), so the
//!   count is what `enforce` would refuse.
//! - **Keys**: the client address is the access log's (the peer, or a trusted proxy's
//!   `X-Forwarded-For`); a `header:NAME` key with the field absent is not limited (nginx's empty key).

mod shared;
mod keys;

use crate::{
    error::{ErrorKind, ProxyError},
    filter::phase::{Arrival, Build, Decision, Phase, Phases},
    peer::original_client,
    telemetry::access_log::AccessLog,
    telemetry::metrics::{ClusterCells, CounterFamily, RouteCounters},
};
use duet_config::{
    filter::rate_limit::{RateKey, RateLimit, RateMode},
    Route,
};
use http::{header, HeaderMap, HeaderName, HeaderValue};
use keys::{ClientKey, FieldKey};
use shared::{Limiter, Refused};
use std::{sync::Arc, time::Duration};

/// A route's rate limit in one worker: the process's limiter, and this worker's counts.
pub(crate) struct RouteRateLimit {
    rule: RateLimit,
    header: Option<HeaderName>,
    limiter: Arc<Limiter>,
    /// `RateLimit-Policy`, written once per config.
    policy: HeaderValue,
    /// The route's first cluster (in `config.clusters`), whose series carry the counts.
    cluster: usize,
    cluster_name: Arc<str>,
    decisions: Arc<RouteCounters>,
    evictions: Arc<RouteCounters>,
}

/// What a route's rate limit decided, by `outcome`.
static DECISIONS: CounterFamily = CounterFamily {
    name: "duet_rate_limit_requests_total",
    help: "Requests a route's rate_limit judged (under the route's first cluster), by outcome: allowed, limited (answered 429), would_limit (over the limit, let through by mode: log).",
    label: "outcome",
    values: &["allowed", "limited", "would_limit"],
    every_route: false,
    status: Some("rate limit decisions"),
};
const ALLOWED: usize = 0;
const LIMITED: usize = 1;
const WOULD_LIMIT: usize = 2;

/// Keys a route's rate limit dropped to stay within `max_keys`.
static EVICTIONS: CounterFamily = CounterFamily {
    name: "duet_rate_limit_keys_evicted_total",
    help: "Keys (clients, field values) a route's rate_limit forgot to hold at most max_keys, the buckets that refilled longest ago first (under the route's first cluster).",
    label: "reason",
    values: &["max_keys"],
    every_route: false,
    status: None,
};

impl Phases for RouteRateLimit {
    const PHASES: Phase = Phase::REQUEST;
    const COUNTERS: &'static [&'static CounterFamily] = &[&DECISIONS, &EVICTIONS];

    /// The route of the same name keeps its counts across a reload while its first cluster keeps
    /// its name, and its buckets while its rule stays the same ([`shared`]).
    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self> {
        let rule = route.filters.rate_limit.clone()?;
        let cluster = route.action.clusters().next()?;
        let cluster_name = build.clusters.get(cluster)?.name.clone();
        let header = match &rule.key {
            RateKey::Header(name) => Some(HeaderName::from_bytes(name.as_bytes()).ok()?),
            RateKey::ClientIp | RateKey::Route => None,
        };
        let (decisions, evictions) = match previous {
            Some(old) if old.cluster_name == cluster_name => {
                (old.decisions.clone(), old.evictions.clone())
            }
            _ => (
                Arc::new(RouteCounters::new(&DECISIONS, &route.name)),
                Arc::new(RouteCounters::new(&EVICTIONS, &route.name)),
            ),
        };
        Some(Self {
            policy: policy(&rule),
            limiter: shared::limiter(&route.name, &rule),
            rule,
            header,
            cluster,
            cluster_name,
            decisions,
            evictions,
        })
    }

    fn on_request(&self, arrival: &Arrival<'_>, _: &mut Option<Box<AccessLog>>) -> Decision {
        let Some(Err(refused)) = self.check(arrival) else {
            // Let through, or not judged (a `header:` key's field absent).
            self.decisions.add(ALLOWED);
            return Decision::Continue;
        };
        if self.rule.mode == RateMode::Log {
            self.decisions.add(WOULD_LIMIT);
            return Decision::Continue;
        }
        self.decisions.add(LIMITED);
        let wait = refused.wait_time_from(self.limiter.now());
        let error = ProxyError::new(ErrorKind::TooManyRequests);
        Decision::RefuseWith(error, self.fields(wait))
    }

    fn publish(&self, cells: &mut [ClusterCells]) {
        if let Some(cells) = cells.get_mut(self.cluster) {
            cells.route_counters.push(self.decisions.clone());
            cells.route_counters.push(self.evictions.clone());
        }
    }
}

impl RouteRateLimit {
    /// The request's decision, on its key's bucket; `None`: the field a `header:` key names is
    /// absent. Only the keyed limiters may evict keys, and count them here.
    fn check(&self, arrival: &Arrival<'_>) -> Option<Result<(), Refused>> {
        let headers = arrival.request.headers();
        let checked = match &*self.limiter {
            Limiter::Route(gcra) => return Some(gcra.check()),
            Limiter::Client(gcra) => {
                let client = original_client(headers, arrival.client);
                gcra.check_key(&ClientKey::new(client))
            }
            Limiter::Field(gcra) => {
                let value = headers.get(self.header.as_ref()?)?;
                gcra.check_key(&FieldKey::new(value.as_bytes()))
            }
        };
        self.evictions.add_many(0, keys::take_evicted());
        Some(checked)
    }

    /// The fields of a 429: `Retry-After`, `RateLimit-Policy` and `RateLimit`, in whole seconds
    /// (rounded up: a client that waits that long is let through).
    fn fields(&self, wait: Duration) -> HeaderMap {
        let seconds = whole_seconds(wait);
        let mut fields = HeaderMap::with_capacity(3);
        fields.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        fields.insert(RATELIMIT_POLICY, self.policy.clone());
        let remaining = format!("\"default\";r=0;t={seconds}");
        if let Ok(value) = HeaderValue::from_str(&remaining) {
            fields.insert(RATELIMIT, value);
        }
        fields
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `RateLimit-Policy` for `rule`: its bucket, `burst` requests (`q`) refilled over `w` seconds.
fn policy(rule: &RateLimit) -> HeaderValue {
    let window = whole_seconds(rule.interval() * rule.burst);
    let text = format!("\"default\";q={};w={window}", rule.burst);
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("\"default\""))
}

/// `wait` in whole seconds, rounded up, at least 1 (`Retry-After: 0` would invite a retry at once).
fn whole_seconds(wait: Duration) -> u64 {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    seconds.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(requests: u32, per: u64, burst: u32) -> RateLimit {
        RateLimit {
            requests,
            per: Duration::from_secs(per),
            burst,
            key: RateKey::ClientIp,
            mode: RateMode::Enforce,
            max_keys: 10,
        }
    }

    #[test]
    fn the_policy_is_the_bucket_and_waits_round_up_to_whole_seconds() {
        assert_eq!(policy(&rule(200, 1, 200)), "\"default\";q=200;w=1");
        assert_eq!(policy(&rule(100, 1, 250)), "\"default\";q=250;w=3");
        assert_eq!(policy(&rule(10, 60, 10)), "\"default\";q=10;w=60");
        assert_eq!(whole_seconds(Duration::from_millis(5)), 1);
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn workers_share_a_route_s_limiter_while_its_rule_stays_the_same() {
        let route_key = |requests| RateLimit {
            key: RateKey::Route,
            ..rule(requests, 1, 5)
        };
        let first = shared::limiter("shared-test", &route_key(5));
        let again = shared::limiter("shared-test", &route_key(5));
        assert!(Arc::ptr_eq(&first, &again));
        let changed = shared::limiter("shared-test", &route_key(6));
        assert!(!Arc::ptr_eq(&first, &changed));
        let other_route = shared::limiter("shared-test-2", &route_key(5));
        assert!(!Arc::ptr_eq(&first, &other_route));
        let Limiter::Route(gcra) = &*first else {
            panic!("key: route has the one bucket");
        };
        let allowed = (0..20).filter(|_| gcra.check().is_ok()).count();
        assert_eq!(allowed, 5, "the burst, then the rate");
        let Limiter::Route(same) = &*again else {
            panic!("key: route has the one bucket");
        };
        assert!(same.check().is_err(), "the same bucket");
    }

    #[test]
    fn each_key_kind_gets_its_own_store() {
        let keyed = |key| RateLimit {
            key,
            ..rule(5, 1, 5)
        };
        let client = shared::limiter("kinds-client", &keyed(RateKey::ClientIp));
        let field = shared::limiter("kinds-field", &keyed(RateKey::Header("x-key".into())));
        let route = shared::limiter("kinds-route", &keyed(RateKey::Route));
        assert!(matches!(*client, Limiter::Client(_)));
        assert!(matches!(*field, Limiter::Field(_)));
        assert!(matches!(*route, Limiter::Route(_)));
    }
}
