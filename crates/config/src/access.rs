//! A route's `allow:` or `deny:`: the client addresses it takes.

use ipnet::IpNet;
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
