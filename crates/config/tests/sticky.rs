//! A cluster's `sticky:`: read as written, defaults where left out, each mistake located.

use duet_config::{parse, warnings, Location, Sticky, StickySecret};
use std::time::Duration;

mod support;
use support::{errors, with_routes};

/// The support file with `clusters` in place of its own.
fn clusters(clusters: &str) -> String {
    let base = with_routes("routes: [ { cluster: web } ]");
    let head = base.split("clusters:").next().unwrap_or_default();
    format!("{head}clusters:\n{clusters}")
}

#[test]
fn sticky_settings_are_read_with_defaults_under_any_policy() {
    let yaml = clusters(
        "  - { name: web, sticky: { cookie: sid }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: b, policy: hash, hash: { key: path }, sticky: { cookie: b_id, ttl: 0s, secret: \" 0123456789abcdef \" }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: c, policy: round_robin, backends: [ { address: 127.0.0.1:9001 } ] }",
    );
    let config = parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let sticky: Vec<Option<Sticky>> = config.clusters.iter().map(|c| c.sticky.clone()).collect();
    let web = sticky[0].clone().unwrap_or_else(|| panic!("{sticky:?}"));
    assert_eq!(
        (web.cookie.as_str(), web.ttl, &web.secret),
        ("sid", Duration::from_secs(3600), &StickySecret::Random)
    );
    assert_eq!(
        web.at,
        Location {
            line: 4,
            column: 26
        }
    );
    let b = sticky[1].clone().unwrap_or_else(|| panic!("{sticky:?}"));
    assert_eq!(
        (b.cookie.as_str(), b.ttl, &b.secret),
        (
            "b_id",
            Duration::ZERO,
            &StickySecret::Shared(b"0123456789abcdef".to_vec())
        )
    );
    assert_eq!(sticky[2], None);
    // The secret never shows in a printed config.
    assert!(!format!("{:?}", config.clusters[1]).contains("0123456789"));
}

#[test]
fn a_bad_cookie_name_ttl_or_key_is_located() {
    let found = errors(&clusters(
        "  - { name: web, sticky: { cookie: \"a b\", ttl: soon, secret: short }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: b, sticky: { cookie: sid, secret: 0123456789abcdef, secret_file: k }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: c, sticky: { cookie: sid, secret_file: /nonexistent/sticky.key }, backends: [ { address: 127.0.0.1:9001 } ] }\n ",
    ));
    let expected = [
        "bad.yaml:4:36: clusters[0].sticky.cookie: `a b` is not a cookie name",
        "bad.yaml:4:48: clusters[0].sticky.ttl:",
        "bad.yaml:4:62: clusters[0].sticky.secret: a sticky key of 5 bytes is too short: expected at least 16",
        "bad.yaml:5:",
        "bad.yaml:6:",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(found.starts_with(expected), "{found}\nexpected: {expected}");
    }
    assert!(
        found[3].contains("clusters[1].sticky.secret_file: give the key once"),
        "{found:#?}"
    );
    assert!(
        found[4].contains("clusters[2].sticky.secret_file: cannot read `/nonexistent/sticky.key`"),
        "{found:#?}"
    );
}

#[test]
fn a_sticky_mapping_without_its_cookie_is_located() {
    let found = errors(&clusters(
        "  - { name: d, sticky: { ttl: 1h }, backends: [ { address: 127.0.0.1:9001 } ] }",
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with("bad.yaml:4:26: missing field `cookie`"),
        "{found:#?}"
    );
}

#[test]
fn only_a_random_key_is_warned_of_where_it_is_written() {
    let yaml = clusters(
        "  - { name: web, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: b, sticky: { cookie: b_id, secret: \"0123456789abcdef\" }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: c, sticky: { cookie: sid }, backends: [ { address: 127.0.0.1:9001 } ] }",
    );
    let config = parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let found: Vec<String> = warnings(&config).iter().map(|w| w.to_string()).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "6:24: warning: clusters[2].sticky: cluster `c` signs its cookies with a random key"
        ),
        "{found:?}"
    );
    assert!(
        found[0].ends_with("set `secret_file:` (or `secret:`) to the same key on every instance")
    );
}
