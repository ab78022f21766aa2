//! A route's `rate_limit:`: the rule as read, defaults where left out, each mistake located.

use duet_config::{
    filter::rate_limit::{RateKey, RateMode},
    parse,
};

mod support;
use support::{errors, with_routes};

#[test]
fn a_rule_reads_its_rate_burst_key_and_mode_with_defaults() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, rate_limit: { rate: 100/s } }\n  \
         - { match: { path_prefix: /b }, cluster: web, rate_limit: { rate: 6000/m, burst: 50, key: 'header:X-Api-Key', mode: log, max_keys: 10 } }\n  \
         - { cluster: web, rate_limit: { rate: 10/h, key: route } }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let shown: Vec<String> = (config.routes.iter())
        .map(|r| {
            r.filters
                .rate_limit
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        shown,
        [
            "100/s burst 100 client_ip",
            "6000/m burst 50 header:x-api-key log",
            "10/h burst 10 route",
        ]
    );
    let b = config.routes[1].filters.rate_limit.as_ref().expect("rule");
    assert_eq!(b.key, RateKey::Header("x-api-key".into()));
    assert_eq!((b.mode, b.max_keys), (RateMode::Log, 10));
    assert_eq!(b.interval(), std::time::Duration::from_millis(10));
    assert_eq!(
        config.routes[0]
            .filters
            .rate_limit
            .as_ref()
            .map(|r| r.max_keys),
        Some(100_000)
    );
}

#[test]
fn a_bad_rate_a_nameless_header_key_a_bad_mode_and_a_redirect_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, rate_limit: { rate: 100 } }\n  \
         - { match: { path_prefix: /b }, cluster: web, rate_limit: { rate: 0/s } }\n  \
         - { match: { path_prefix: /c }, cluster: web, rate_limit: { rate: 1/s, key: 'header:' } }\n  \
         - { match: { path_prefix: /d }, cluster: web, rate_limit: { rate: 1/s, mode: shadow, burst: 0 } }\n  \
         - { match: { path_prefix: /e }, cluster: web, rate_limit: { burst: 5 } }\n  \
         - { match: { path_prefix: /f }, redirect: { scheme: https }, rate_limit: { rate: 1/s } }",
    ));
    let messages = [
        "routes[0].rate_limit.rate: `100` is not a rate",
        "routes[1].rate_limit.rate: `0/s` is not a rate",
        "routes[2].rate_limit.key: a `header:` key without a field name",
        "routes[3].rate_limit.mode: `shadow` is not a mode",
        "routes[3].rate_limit.burst: 0 is out of range",
        "routes[4].rate_limit: no `rate`",
        "routes[5].rate_limit: a redirect route answers itself",
    ];
    for message in messages {
        assert!(
            found.iter().any(|e| e.contains(message)),
            "{message}\n{found:#?}"
        );
    }
    assert_eq!(found.len(), messages.len(), "{found:#?}");
    let located: Vec<&str> = found.iter().filter_map(|e| e.split(": ").next()).collect();
    let expected = [
        "bad.yaml:3:69",
        "bad.yaml:4:69",
        "bad.yaml:5:79",
        "bad.yaml:6:80",
        "bad.yaml:6:95",
        "bad.yaml:7:61",
        "bad.yaml:8:76",
    ];
    assert_eq!(located, expected, "each at its value");
}
