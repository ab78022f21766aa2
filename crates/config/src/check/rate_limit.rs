//! A route's `rate_limit:`: the rate, the burst, what is keyed, and whether the excess is refused.

use super::{checker::Checker, field::Field, route_match};
use crate::{
    rate_limit::{RateKey, RateLimit, RateMode},
    raw::{RawRateLimit, Scalar},
};
use serde_saphyr::Spanned;
use std::time::Duration;

/// The route's rate limit, or `None` after recording why it is refused. `proxies`: the route sends
/// to a cluster (a redirect route answers itself, and its counts would be under no cluster).
pub(super) fn rate_limit(
    checker: &mut Checker,
    raw: &Spanned<RawRateLimit>,
    route: &Field,
    proxies: bool,
) -> Option<RateLimit> {
    let field = route.key("rate_limit");
    let errors = checker.errors.len();
    if !proxies {
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
fn parse_rate(
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
    if name.is_empty() || !route_match::token(&name) {
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
