//! A route's `hedge:`: a percentile or a duration to wait, a share of extra attempts, the methods.

use super::route_match;
use crate::{
    checker::Checker,
    field::Field,
    hedge::{Hedge, HedgeAfter},
    raw::{RawHedge, Scalar},
    units,
};
use serde_saphyr::Spanned;

/// What `after` means when left out: Dean and Barroso's p95. Measured on a quiet machine
/// (`cargo bench --bench experiments -- stalls`, 1% stalls of 100 ms), p95 with the default 5% budget
/// keeps p99 and p99.9 at the stall-free floor (0.98x, 0.96x) for 4.3% extra requests, where p99
/// leaves them at 1.40x and 1.43x; p99 was also worse than no hedging with one slow or degrading
/// backend. A budget saved up to 10 hedges carries p95 through stalls (an earlier run on a loaded
/// machine suggested otherwise and set p99; the quiet runs overturned it).
const DEFAULT_AFTER: HedgeAfter = HedgeAfter::Percentile(950);
/// What `max_extra` means when left out.
const DEFAULT_MAX_EXTRA: f64 = 0.05;

/// The route's hedging, or `None` after recording why it is refused. `proxies`: the route sends to a
/// cluster (a redirect has nothing to hedge).
pub(super) fn hedge(
    checker: &mut Checker,
    raw: &Spanned<RawHedge>,
    route: &Field,
    proxies: bool,
) -> Option<Hedge> {
    let field = route.key("hedge");
    let errors = checker.errors.len();
    if !proxies {
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
        Some(list) => route_match::methods(checker, list, &field.key("methods")),
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
