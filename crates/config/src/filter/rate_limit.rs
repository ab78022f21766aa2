//! `rate_limit:`: how many requests a key (a client, a field's value, the route) may send, as a
//! GCRA / token bucket, and whether the excess is refused or only counted.

use super::{RouteContext, Section};
use crate::{
    checker::{token, Checker},
    field::Field,
    raw::{leaf, Scalar, Shape},
};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{fmt, time::Duration};

/// `rate_limit: { rate: 100/s, burst: 200, key: client_ip, mode: enforce, max_keys: 100000 }`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// `requests` per `per`: the rate the bucket refills at (`100/s` is 100 per second).
    pub requests: u32,
    /// The period `requests` are counted over: a second, a minute or an hour.
    pub per: Duration,
    /// How many requests a key may send at once after a quiet spell (the bucket's size). Default:
    /// the rate's number, a period's worth.
    pub burst: u32,
    /// What a bucket is kept for.
    pub key: RateKey,
    /// Whether the excess is refused.
    pub mode: RateMode,
    /// The most keys held at once; past it, the buckets that have refilled longest ago are dropped
    /// (a dropped key starts again with a full bucket, which it nearly had).
    pub max_keys: u32,
}

impl RateLimit {
    /// `max_keys` when left out.
    pub const DEFAULT_MAX_KEYS: u32 = 100_000;

    /// The time one request's share of the bucket takes to refill: `per / requests`.
    pub fn interval(&self) -> Duration {
        self.per / self.requests.max(1)
    }
}

/// What a rate limit keeps one bucket for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateKey {
    /// Each client address (the one the access log names: the peer, or a trusted proxy's
    /// `X-Forwarded-For`).
    ClientIp,
    /// Each value of this request field (lowercase name); a request without it is not limited.
    Header(String),
    /// The route as a whole: one bucket for every request it takes.
    Route,
}

/// Whether a rate limit refuses the excess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateMode {
    /// The excess gets 429.
    Enforce,
    /// The excess is counted (`would_limit`) and goes on: for rolling a limit out (Envoy's shadow
    /// mode).
    Log,
}

impl fmt::Display for RateLimit {
    /// As `check` shows it: `100/s burst 200 client_ip`, with ` log` for a limit that only counts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            3600 => "h",
            60 => "m",
            _ => "s",
        };
        write!(f, "{}/{unit} burst {} ", self.requests, self.burst)?;
        match &self.key {
            RateKey::ClientIp => f.write_str("client_ip")?,
            RateKey::Header(name) => write!(f, "header:{name}")?,
            RateKey::Route => f.write_str("route")?,
        }
        if self.mode == RateMode::Log {
            f.write_str(" log")?;
        }
        Ok(())
    }
}

/// `rate_limit: { rate, burst, key, mode, max_keys }`: `rate` is required.
#[derive(Debug, Deserialize)]
struct RawRateLimit {
    #[serde(default)]
    rate: Option<Spanned<Scalar>>,
    #[serde(default)]
    burst: Option<Spanned<Scalar>>,
    #[serde(default)]
    key: Option<Spanned<Scalar>>,
    #[serde(default)]
    mode: Option<Spanned<Scalar>>,
    #[serde(default)]
    max_keys: Option<Spanned<Scalar>>,
}

/// The route key `rate_limit:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    rate_limit: Option<Spanned<RawRateLimit>>,
}

impl Section for RateLimit {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static Shape)] =
        &[("rate_limit", &leaf::<RawRateLimit>())];

    fn check(checker: &mut Checker, keys: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, keys.rate_limit.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("rate_limit {self}")
    }
}

/// The route's rate limit, or `None` after recording why it is refused; refused on a redirect route,
/// which answers itself and whose counts would be under no cluster.
fn check(
    checker: &mut Checker,
    raw: &Spanned<RawRateLimit>,
    route: &RouteContext<'_>,
) -> Option<RateLimit> {
    let field = route.field.key("rate_limit");
    let errors = checker.errors.len();
    if route.redirects {
        let e = checker.error(
            raw,
            &field,
            "a redirect route answers itself, and counts under no cluster",
        );
        checker.push(e.hint("set `rate_limit` on the route the redirect leads to"));
    }
    let written = &raw.value;
    let (requests, per) = match &written.rate {
        Some(rate) => parse_rate(checker, rate, &field.key("rate"))?,
        None => {
            let e = checker.error(raw, &field, "no `rate`");
            checker.push(
                e.hint("write the rate as requests per second, minute or hour: `rate: 100/s`"),
            );
            return None;
        }
    };
    let burst = checker.count(
        written.burst.as_ref(),
        &field.key("burst"),
        requests,
        (1, 1_000_000_000),
    );
    let key = match &written.key {
        None => RateKey::ClientIp,
        Some(key) => parse_key(checker, key, &field.key("key"))?,
    };
    let mode = match &written.mode {
        None => RateMode::Enforce,
        Some(mode) => match mode.value.0.trim() {
            "enforce" => RateMode::Enforce,
            "log" => RateMode::Log,
            other => {
                let message = format!("`{other}` is not a mode: expected `enforce` or `log`");
                checker.reject(mode, field.key("mode"), message);
                return None;
            }
        },
    };
    let max_keys = checker.count(
        written.max_keys.as_ref(),
        &field.key("max_keys"),
        RateLimit::DEFAULT_MAX_KEYS,
        (1, 10_000_000),
    );
    (checker.errors.len() == errors).then_some(RateLimit {
        requests,
        per,
        burst,
        key,
        mode,
        max_keys,
    })
}

/// `100/s`, `6000/m`, `10/h`: a whole number of requests per second, minute or hour.
pub(crate) fn parse_rate(
    checker: &mut Checker,
    rate: &Spanned<Scalar>,
    field: &Field,
) -> Option<(u32, Duration)> {
    let text = rate.value.0.trim();
    let parsed = text.split_once('/').and_then(|(count, unit)| {
        let per = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return None,
        };
        let count: u32 = count.trim().parse().ok()?;
        (1..=1_000_000_000).contains(&count).then_some((count, per))
    });
    if parsed.is_none() {
        let message = format!(
            "`{text}` is not a rate: expected a whole number of requests (1 or more) per second, \
             minute or hour"
        );
        let e = checker.error(rate, field, message);
        checker.push(e.hint("write `100/s`, `6000/m` or `10/h`"));
    }
    parsed
}

/// `client_ip`, `route`, or `header:NAME`.
fn parse_key(checker: &mut Checker, key: &Spanned<Scalar>, field: &Field) -> Option<RateKey> {
    let text = key.value.0.trim();
    match text {
        "client_ip" => return Some(RateKey::ClientIp),
        "route" => return Some(RateKey::Route),
        _ => {}
    }
    let Some(name) = text.strip_prefix("header:") else {
        let message =
            format!("`{text}` is not a key: expected `client_ip`, `route` or `header:NAME`");
        checker.reject(key, field, message);
        return None;
    };
    let name = name.trim().to_ascii_lowercase();
    if name.is_empty() || !token(&name) {
        let message = if name.is_empty() {
            "a `header:` key without a field name".to_owned()
        } else {
            format!("`{name}` is not a header name")
        };
        let e = checker.error(key, field, message);
        checker.push(e.hint("name the request field whose values are limited: `header:x-api-key`"));
        return None;
    }
    Some(RateKey::Header(name))
}
