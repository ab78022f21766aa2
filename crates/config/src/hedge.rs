//! A route's `hedge:`: when a request that has waited too long for its first response head is sent
//! once more to another backend, and how many such extra attempts a route may send.

use std::{fmt, time::Duration};

/// `hedge: { after: p95 | 20ms, max_extra: 5%, methods: [GET, HEAD] }` on a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hedge {
    /// How long the first attempt may go without a response head before the hedge is sent.
    pub after: HedgeAfter,
    /// The most extra attempts hedging may add, as a share of the route's requests, in parts per
    /// million (`5%` is 50,000): whole numbers, so that a route stays comparable (`Eq`) across reloads.
    pub max_extra_ppm: u32,
    /// The methods that may be hedged (upper case). Default: GET, HEAD, OPTIONS, which are safe to
    /// send twice and rarely carry a body.
    pub methods: Vec<String>,
}

impl Hedge {
    /// `max_extra` as a fraction (0.05 for `5%`).
    pub fn max_extra(&self) -> f64 {
        f64::from(self.max_extra_ppm) / 1e6
    }

    /// The methods hedged when `methods` is left out.
    pub fn default_methods() -> Vec<String> {
        ["GET", "HEAD", "OPTIONS"].map(String::from).to_vec()
    }
}

/// When the hedge is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeAfter {
    /// Once the first attempt has waited longer than this percentile of the route's recent
    /// response-head times (as each worker measures them), in tenths of a percent: `p95` is 950.
    Percentile(u16),
    /// Once the first attempt has waited this long.
    Fixed(Duration),
}

impl HedgeAfter {
    /// The percentile as a fraction (0.95 for `p95`), if it is one.
    pub fn quantile(self) -> Option<f64> {
        match self {
            Self::Percentile(tenths) => Some(f64::from(tenths) / 1000.0),
            Self::Fixed(_) => None,
        }
    }
}

impl fmt::Display for HedgeAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Percentile(tenths) if tenths % 10 == 0 => write!(f, "p{}", tenths / 10),
            Self::Percentile(tenths) => write!(f, "p{}.{}", tenths / 10, tenths % 10),
            Self::Fixed(after) => write!(f, "{after:?}"),
        }
    }
}

impl fmt::Display for Hedge {
    /// As `check --diff` shows it: `after p95, max_extra 5%, GET,HEAD`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "after {}, max_extra {}%, {}",
            self.after,
            f64::from(self.max_extra_ppm) / 1e4,
            self.methods.join(",")
        )
    }
}
