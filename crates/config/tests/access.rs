//! A route's `allow:` / `deny:`: the networks as read, and each mistake located.

use duet_config::{filter::ip_list::Access, parse};

mod support;
use support::{errors, with_routes};

#[test]
fn lists_read_v4_v6_bare_addresses_and_v4_mapped_networks() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, allow: [10.0.0.0/8, 2001:db8::/32, 127.0.0.2] }\n  \
         - { match: { path_prefix: /b }, cluster: web, deny: ['::ffff:192.0.2.0/120', '::1'] }\n  \
         - { cluster: web }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let shown: Vec<String> = (config.routes.iter())
        .map(|r| {
            r.filters
                .access
                .as_ref()
                .map(Access::to_string)
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        shown,
        [
            "allow 10.0.0.0/8,2001:db8::/32,127.0.0.2/32",
            "deny 192.0.2.0/24,::1/128",
            "",
        ]
    );
    assert!(config.routes[0]
        .describe_filters()
        .contains(" allow 10.0.0.0/8"));
}

#[test]
fn a_bad_cidr_host_bits_both_lists_an_empty_list_and_a_redirect_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, allow: [10.0.0.0/8, 10.0.0.0/33, nonsense] }\n  \
         - { match: { path_prefix: /b }, cluster: web, deny: [10.1.2.3/8] }\n  \
         - { match: { path_prefix: /c }, cluster: web, allow: [10.0.0.0/8], deny: [::1] }\n  \
         - { match: { path_prefix: /d }, cluster: web, allow: [] }\n  \
         - { match: { path_prefix: /e }, redirect: { scheme: https }, deny: [::1] }",
    ));
    let starts = [
        "bad.yaml:3:69: routes[0].allow[1]: `10.0.0.0/33` is not an address or network",
        "bad.yaml:3:82: routes[0].allow[2]: `nonsense` is not an address or network",
        "bad.yaml:4:56: routes[1].deny[0]: `10.1.2.3/8` has bits set past its prefix length",
        "bad.yaml:5:76: routes[2].deny: both `allow` and `deny`",
        "bad.yaml:6:56: routes[3].allow: an empty list",
        "bad.yaml:7:70: routes[4].deny: `deny` on a redirect route",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    assert!(
        found
            .iter()
            .any(|e| e.contains("write the network, `10.0.0.0/8`")),
        "{found:#?}"
    );
    assert_eq!(found.len(), starts.len(), "{found:#?}");
}
