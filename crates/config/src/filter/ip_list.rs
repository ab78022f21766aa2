//! `allow:` and `deny:`: the client networks a route takes, one kind of list per route.

use super::{RouteContext, Section};
use crate::{checker::Checker, field::Field, networks, raw::Scalar};
use ipnet::IpNet;
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{fmt, net::IpAddr};

/// `allow: [10.0.0.0/8, 2001:db8::/32]` or `deny: [...]` on a route: one list, never both (which of
/// two overlapping lists wins would be a rule to learn; an allow list already refuses the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Only clients in these networks; the others get 403.
    Allow(Vec<IpNet>),
    /// Every client but those in these networks, which get 403.
    Deny(Vec<IpNet>),
}

impl Access {
    /// Whether a request from `client` may take the route. An IPv4 client reached over IPv6
    /// (`::ffff:10.1.2.3`, on a dual-stack listener) is the IPv4 address it is, so an IPv4 network
    /// lists it.
    pub fn admits(&self, client: IpAddr) -> bool {
        let client = client.to_canonical();
        let listed = |nets: &[IpNet]| nets.iter().any(|net| net.contains(&client));
        match self {
            Self::Allow(nets) => listed(nets),
            Self::Deny(nets) => !listed(nets),
        }
    }
}

impl fmt::Display for Access {
    /// As `check` shows it: `allow 10.0.0.0/8,2001:db8::/32`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, nets) = match self {
            Self::Allow(nets) => ("allow", nets),
            Self::Deny(nets) => ("deny", nets),
        };
        let nets: Vec<String> = nets.iter().map(IpNet::to_string).collect();
        write!(f, "{word} {}", nets.join(","))
    }
}

/// The route keys `allow:` and `deny:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    allow: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    deny: Option<Spanned<Vec<Spanned<Scalar>>>>,
}

impl Section for Access {
    type Raw = Keys;

    fn check(checker: &mut Checker, keys: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, keys, route)
    }

    fn describe(&self) -> String {
        self.to_string()
    }
}

/// The route's access list, or `None` when it has none or after recording why it is refused.
fn check(checker: &mut Checker, keys: &Keys, route: &RouteContext<'_>) -> Option<Access> {
    let field = route.field;
    let (allow, deny) = (keys.allow.as_ref(), keys.deny.as_ref());
    if route.redirect_written {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().expect("net")).collect()
    }

    #[test]
    fn v4_v6_and_v4_mapped_clients_are_judged_by_the_networks_they_are_in() {
        let allow = Access::Allow(nets(&["10.0.0.0/8", "2001:db8::/32"]));
        let admits = |ip: &str| allow.admits(ip.parse().expect("ip"));
        assert!(admits("10.1.2.3"));
        assert!(admits("::ffff:10.1.2.3"), "v4-mapped");
        assert!(admits("2001:db8::7"));
        assert!(!admits("11.0.0.1"));
        assert!(!admits("::1"));
        let deny = Access::Deny(nets(&["127.0.0.2/32", "::1/128"]));
        assert!(!deny.admits("127.0.0.2".parse().expect("ip")));
        assert!(!deny.admits("::1".parse().expect("ip")));
        assert!(deny.admits("127.0.0.1".parse().expect("ip")));
        assert_eq!(allow.to_string(), "allow 10.0.0.0/8,2001:db8::/32");
    }
}
