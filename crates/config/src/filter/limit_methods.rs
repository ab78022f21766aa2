//! `limit_methods:`: the methods a route serves; any other gets 405 with `Allow` naming these.

use super::{RouteContext, Section};
use crate::{checker::Checker, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::fmt;

/// `limit_methods: [GET, POST]`: the methods a route serves, in the order written, `HEAD` added
/// after `GET` when left out (RFC 9110 §9.3.2: a `GET` resource answers `HEAD` too). A request of
/// any other method is answered 405 by duet with `Allow` listing these (RFC 9110 §15.5.6), where
/// `match: { method }` would pass it on to the next route or a 404. nginx's `limit_except`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitMethods {
    /// Upper-case method names, each once.
    pub methods: Vec<String>,
}

impl fmt::Display for LimitMethods {
    /// As an `Allow` field lists them: `GET, HEAD, POST`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.methods.join(", "))
    }
}

/// The route key `limit_methods:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    limit_methods: Option<Spanned<Vec<Spanned<Scalar>>>>,
}

impl Section for LimitMethods {
    type Raw = Keys;

    fn check(checker: &mut Checker, keys: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, keys.limit_methods.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("limit_methods {}", self.methods.join(","))
    }
}

/// The route's methods, or `None` after recording why they are refused.
fn check(
    checker: &mut Checker,
    written: &Spanned<Vec<Spanned<Scalar>>>,
    route: &RouteContext<'_>,
) -> Option<LimitMethods> {
    let field = route.field.key("limit_methods");
    let errors = checker.errors.len();
    if route.redirect_written {
        let message =
            "`limit_methods` on a redirect route: it answers every method with its redirect";
        let e = checker.error(written, &field, message);
        checker.push(e.hint("set `limit_methods` on the route the redirect leads to"));
    }
    if written.value.is_empty() {
        let e = checker.error(
            written,
            &field,
            "an empty list serves no method: every request would get 405",
        );
        checker.push(e.hint("list the methods the route serves, such as `[GET, POST]`, or leave `limit_methods` out"));
    }
    let listed = checker.methods(&written.value, &field);
    for (i, raw) in written.value.iter().enumerate() {
        if raw.value.0.trim().eq_ignore_ascii_case("CONNECT") {
            let message =
                "duet never forwards CONNECT (it is no forward proxy): every CONNECT gets 405";
            checker.reject(raw, field.index(i), message);
        }
    }
    let mut methods: Vec<String> = Vec::new();
    for method in listed {
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    if let Some(get) = methods.iter().position(|m| m == "GET") {
        if !methods.iter().any(|m| m == "HEAD") {
            methods.insert(get + 1, "HEAD".to_owned());
        }
    }
    (checker.errors.len() == errors).then_some(LimitMethods { methods })
}
