//! A route's `rate_limit:`: how many requests a key (a client, a field's value, the route) may send,
//! as a GCRA / token bucket, and whether the excess is refused or only counted.

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
