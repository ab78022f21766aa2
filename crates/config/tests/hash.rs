//! A cluster's `policy: hash` and its `hash:`: read as written, defaults where left out, each mistake
//! located.

use duet_config::{parse, HashAlgorithm, HashKey, HashPolicy, HashWalk, Policy};

mod support;
use support::{errors, with_routes};

/// The support file with `clusters` in place of its own.
fn clusters(clusters: &str) -> String {
    let base = with_routes("routes: [ { cluster: web } ]");
    let head = base.split("clusters:").next().unwrap_or_default();
    format!("{head}clusters:\n{clusters}")
}

#[test]
fn hash_settings_are_read_with_defaults() {
    let yaml = clusters(
        "  - { name: web, policy: hash, hash: { key: \"header:X-User\", bound: 1.5, walk: next }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: b, policy: hash, hash: { key: client_ip, algorithm: ring }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: c, policy: hash, hash: { key: \"cookie:sid\" }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: d, policy: hash, hash: { key: \"query:u\" }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: e, policy: hash, hash: { key: path }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: f, backends: [ { address: 127.0.0.1:9001 } ] }",
    );
    let config = parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let hashes: Vec<Option<HashPolicy>> = config.clusters.iter().map(|c| c.hash.clone()).collect();
    let with = |key, bound, walk| {
        Some(HashPolicy {
            key,
            bound,
            walk,
            algorithm: HashAlgorithm::Maglev,
        })
    };
    assert_eq!(
        hashes,
        [
            with(HashKey::Header("x-user".into()), 1.5, HashWalk::Next),
            Some(HashPolicy {
                key: HashKey::ClientIp,
                bound: 1.25,
                walk: HashWalk::P2c,
                algorithm: HashAlgorithm::Ring,
            }),
            with(HashKey::Cookie("sid".into()), 1.25, HashWalk::P2c),
            with(HashKey::Query("u".into()), 1.25, HashWalk::P2c),
            with(HashKey::Path, 1.25, HashWalk::P2c),
            None,
        ]
    );
    assert_eq!(config.clusters[0].policy, Policy::Hash);
    assert_eq!(config.clusters[0].policy.name(), "hash");
}

#[test]
fn a_bad_key_bound_walk_or_algorithm_is_located() {
    let found = errors(&clusters(
        "  - { name: web, policy: hash, hash: { key: \"header:\", bound: 0.9, walk: far, algorithm: rendezvous }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: b, policy: hash, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: c, hash: { key: path }, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
         - { name: d, policy: hash, hash: { key: ip }, backends: [ { address: 127.0.0.1:9001 } ] }",
    ));
    let expected = [
        "bad.yaml:4:45: clusters[0].hash.key: `header:` is not a hash key",
        "bad.yaml:4:63: clusters[0].hash.bound: `0.9` is not a load bound",
        "bad.yaml:4:74: clusters[0].hash.walk: `far` is not a walk: expected `p2c` or `next`",
        "bad.yaml:4:90: clusters[0].hash.algorithm: `rendezvous` is not a hash algorithm: expected `maglev` or `ring`",
        "bad.yaml:5:24: clusters[1].policy: `policy: hash` needs a `hash:` mapping",
        "bad.yaml:6:22: clusters[2].hash: `hash:` is read only with `policy: hash`",
        "bad.yaml:7:43: clusters[3].hash.key: `ip` is not a hash key",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(found.starts_with(expected), "{found}\nexpected: {expected}");
    }
}
