//! A route's `hsts:`: how long browsers keep to HTTPS, whether subdomains are included, preload.

use super::{checker::Checker, field::Field};
use crate::{model::Action, model::Hsts, raw::RawHsts};
use serde_saphyr::Spanned;
use std::time::Duration;

/// What `max_age` means when left out: one year, the usual deployment (and the preload list's floor).
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The route's HSTS, or `None` after recording why it is refused. A redirect route sends nothing to a
/// backend, whose responses are the ones that carry the field.
pub(super) fn hsts(
    checker: &mut Checker,
    raw: &Spanned<RawHsts>,
    route: &Field,
    action: &Option<Action>,
) -> Option<Hsts> {
    let field = route.key("hsts");
    let errors = checker.errors.len();
    if matches!(action, Some(Action::Redirect(_))) {
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
