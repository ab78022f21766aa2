//! `hedge:`: when a request that has waited too long for its first response head is sent once more
//! to another backend, and how many such extra attempts a route may send.

use super::{RouteContext, Section};
use crate::{
    checker::Checker,
    field::Field,
    raw::{leaf, Scalar, Shape},
    units,
};
use serde::Deserialize;
use serde_saphyr::Spanned;
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

/// `hedge: { after, max_extra, methods }`: each part left out takes its default.
#[derive(Debug, Deserialize)]
struct RawHedge {
    #[serde(default)]
    after: Option<Spanned<Scalar>>,
    #[serde(default)]
    max_extra: Option<Spanned<Scalar>>,
    #[serde(default)]
    methods: Option<Vec<Spanned<Scalar>>>,
}

/// The route key `hedge:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    hedge: Option<Spanned<RawHedge>>,
}

impl Section for Hedge {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static Shape)] = &[("hedge", &leaf::<RawHedge>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, raw.hedge.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("hedge {self}")
    }
}

/// What `after` means when left out: Dean and Barroso's p95. Measured on a quiet machine
/// (`cargo bench --bench experiments -- stalls`, 1% stalls of 100 ms), p95 with the default 5% budget
/// keeps p99 and p99.9 at the stall-free floor (0.98x, 0.96x) for 4.3% extra requests, where p99
/// leaves them at 1.40x and 1.43x; p99 was also worse than no hedging with one slow or degrading
/// backend. A budget saved up to 10 hedges carries p95 through stalls (an earlier run on a loaded
/// machine suggested otherwise and set p99; the quiet runs overturned it).
const DEFAULT_AFTER: HedgeAfter = HedgeAfter::Percentile(950);
/// What `max_extra` means when left out.
const DEFAULT_MAX_EXTRA: f64 = 0.05;

/// The route's hedging, or `None` after recording why it is refused (a route that answers itself
/// has nothing to hedge).
fn check(
    checker: &mut Checker,
    raw: &Spanned<RawHedge>,
    route: &RouteContext<'_>,
) -> Option<Hedge> {
    let field = route.field.key("hedge");
    let errors = checker.errors.len();
    if route.redirects {
        let e = checker.error(
            raw,
            &field,
            "a redirect sends nothing to a backend to hedge",
        );
        checker.push(e.hint("leave `hedge` out of redirect routes"));
    }
    let written = &raw.value;
    let after = match &written.after {
        None => DEFAULT_AFTER,
        Some(after) => self::after(checker, after, &field.key("after")),
    };
    let max_extra = checker.percent(
        written.max_extra.as_ref(),
        &field.key("max_extra"),
        DEFAULT_MAX_EXTRA,
    );
    if let Some(value) = written.max_extra.as_ref().filter(|_| max_extra == 0.0) {
        let message = format!("`{}` would never hedge", value.value.0.trim());
        let e = checker.error(value, field.key("max_extra"), message);
        checker.push(e.hint("leave `hedge` out to never hedge, or allow a share such as `5%`"));
    }
    let methods = match &written.methods {
        None => Hedge::default_methods(),
        Some(list) => checker.methods(list, &field.key("methods")),
    };
    (checker.errors.len() == errors).then(|| Hedge {
        after,
        max_extra_ppm: (max_extra * 1e6).round() as u32,
        methods,
    })
}

/// `p95`, `p99.9` (above 0, below 100, to a tenth), or a duration above 0 such as `20ms`.
fn after(checker: &mut Checker, value: &Spanned<Scalar>, field: &Field) -> HedgeAfter {
    let text = value.value.0.trim();
    let Some(number) = text.strip_prefix(['p', 'P']) else {
        let message = match units::parse_duration(text) {
            Ok(after) if !after.is_zero() => return HedgeAfter::Fixed(after),
            Ok(_) => format!("`{text}` would hedge every request at once"),
            Err(message) => message,
        };
        let e = checker.error(value, field, message);
        checker
            .push(e.hint("write a duration above 0 such as `20ms`, or a percentile such as `p95`"));
        return DEFAULT_AFTER;
    };
    // Read as digits, not as a float: `p99.9` is exactly 999 tenths.
    let (whole, tenth) = number.split_once('.').unwrap_or((number, "0"));
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let tenths = (digits(whole) && digits(tenth) && tenth.len() == 1 && whole.len() <= 2)
        .then(|| whole.parse::<u16>().ok().zip(tenth.parse::<u16>().ok()))
        .flatten()
        .map(|(whole, tenth)| whole * 10 + tenth)
        .filter(|&t| t > 0);
    match tenths {
        Some(tenths) => HedgeAfter::Percentile(tenths),
        None => {
            let message = format!(
                "`{text}` is not a percentile: expected `p` and a number above 0 and below 100, \
                 to a tenth at most, such as `p95` or `p99.9`"
            );
            checker.reject(value, field, message);
            DEFAULT_AFTER
        }
    }
}
