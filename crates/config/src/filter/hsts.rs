//! `hsts:`: the `Strict-Transport-Security` field a route adds to responses over TLS: how long
//! browsers keep to HTTPS, whether subdomains are included, preload.

use super::{RouteContext, Section};
use crate::{checker::Checker, raw::leaf, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{fmt, time::Duration};

/// `hsts:`: tells browsers to reach the route's host over HTTPS only, for `max_age` (RFC 6797).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hsts {
    /// How long a browser remembers it (whole seconds on the wire).
    pub max_age: Duration,
    /// The subdomains of the host too.
    pub include_subdomains: bool,
    /// Asks to be listed in browsers' preload lists.
    pub preload: bool,
}

impl fmt::Display for Hsts {
    /// The field's value: `max-age=31536000; includeSubDomains; preload`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "max-age={}", self.max_age.as_secs())?;
        if self.include_subdomains {
            f.write_str("; includeSubDomains")?;
        }
        if self.preload {
            f.write_str("; preload")?;
        }
        Ok(())
    }
}

/// `hsts: { max_age, include_subdomains, preload }`: each part left out takes its default.
#[derive(Debug, Deserialize)]
struct RawHsts {
    #[serde(default)]
    max_age: Option<Spanned<Scalar>>,
    #[serde(default)]
    include_subdomains: Option<Spanned<Scalar>>,
    #[serde(default)]
    preload: Option<Spanned<Scalar>>,
}

/// The route key `hsts:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    hsts: Option<Spanned<RawHsts>>,
}

impl Section for Hsts {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static crate::raw::Shape)] =
        &[("hsts", &leaf::<RawHsts>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, raw.hsts.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("hsts {self}")
    }
}

/// What `max_age` means when left out: one year, the usual deployment (and the preload list's floor).
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The route's HSTS, or `None` after recording why it is refused. A redirect route sends nothing to a
/// backend, whose responses are the ones that carry the field.
fn check(checker: &mut Checker, raw: &Spanned<RawHsts>, route: &RouteContext<'_>) -> Option<Hsts> {
    let field = route.field.key("hsts");
    let errors = checker.errors.len();
    if route.redirects {
        let e = checker.error(
            raw,
            &field,
            "a redirect route answers itself: no backend response carries the field",
        );
        checker.push(e.hint(
            "leave `hsts` out of redirect routes, and set it on the route the redirect leads to",
        ));
    }
    let written = &raw.value;
    let max_age = checker.duration(
        written.max_age.as_ref(),
        &field.key("max_age"),
        DEFAULT_MAX_AGE,
    );
    if let Some(value) = written.max_age.as_ref().filter(|_| max_age.as_secs() == 0) {
        let message = format!(
            "`{}` tells browsers to forget the host's HSTS at once",
            value.value.0.trim()
        );
        let e = checker.error(value, field.key("max_age"), message);
        checker.push(e.hint("write a lasting age such as `8760h` (a year), or leave `hsts` out"));
    }
    let include_subdomains = checker.boolean(
        written.include_subdomains.as_ref(),
        &field.key("include_subdomains"),
        false,
    );
    let preload = checker.boolean(written.preload.as_ref(), &field.key("preload"), false);
    if let (true, Some(value)) = (preload, written.preload.as_ref()) {
        if !include_subdomains || max_age < DEFAULT_MAX_AGE {
            let e = checker.error(value, field.key("preload"), "the browsers' preload lists take only a `max_age` of a year or more with `include_subdomains: true`");
            checker.push(e.hint(
                "set `include_subdomains: true` and `max_age: 8760h`, or leave `preload` out",
            ));
        }
    }
    (checker.errors.len() == errors).then_some(Hsts {
        max_age,
        include_subdomains,
        preload,
    })
}
