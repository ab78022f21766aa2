//! A route's `allow:` or `deny:`: lists of client networks, one kind per route.

use super::{checker::Checker, field::Field, networks};
use crate::{access::Access, raw::RawRoute, raw::Scalar};
use ipnet::IpNet;
use serde_saphyr::Spanned;

/// The route's access list, or `None` when it has none or after recording why it is refused.
pub(super) fn access(checker: &mut Checker, route: &RawRoute, field: &Field) -> Option<Access> {
    let (allow, deny) = (route.allow.as_ref(), route.deny.as_ref());
    if route.redirect.is_some() {
        for (key, given) in [("allow", allow), ("deny", deny)] {
            if let Some(given) = given {
                let message = format!("`{key}` on a redirect route: it answers without a backend, and counts under none");
                let e = checker.error(given, field.key(key), message);
                checker.push(e.hint(format!("set `{key}` on the route the redirect leads to")));
            }
        }
        return None;
    }
    match (allow, deny) {
        (None, None) => None,
        (Some(_), Some(deny)) => {
            let e = checker.error(
                deny,
                field.key("deny"),
                "both `allow` and `deny`: write one",
            );
            checker.push(e.hint(
                "`allow` already refuses every address it does not list; to refuse part of an \
                 allowed network, list the parts that stay allowed",
            ));
            None
        }
        (Some(allow), None) => list(checker, allow, &field.key("allow")).map(Access::Allow),
        (None, Some(deny)) => list(checker, deny, &field.key("deny")).map(Access::Deny),
    }
}

/// The networks of one list, each a CIDR without host bits or a bare address; `None` after
/// recording every refused entry.
fn list(
    checker: &mut Checker,
    raw: &Spanned<Vec<Spanned<Scalar>>>,
    field: &Field,
) -> Option<Vec<IpNet>> {
    if raw.value.is_empty() {
        let e = checker.error(raw, field, "an empty list");
        checker.push(e.hint("list networks such as `[10.0.0.0/8]`, or leave the key out"));
        return None;
    }
    let errors = checker.errors.len();
    let mut nets = Vec::new();
    for (i, written) in raw.value.iter().enumerate() {
        let at = field.index(i);
        match networks::network(&written.value.0) {
            Ok(net) if net.trunc() != net => {
                let text = written.value.0.trim();
                let message = format!("`{text}` has bits set past its prefix length");
                let e = checker.error(written, at, message);
                checker.push(e.hint(format!(
                    "write the network, `{}`, or the one address, `{}`",
                    net.trunc(),
                    net.addr()
                )));
            }
            Ok(net) => nets.push(networks::canonical(net)),
            Err(message) => checker.reject(written, at, message),
        }
    }
    (checker.errors.len() == errors).then_some(nets)
}
