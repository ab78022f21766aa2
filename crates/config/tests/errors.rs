//! Config errors name the file, line, column, field and what was expected; semantic ones come all at once.

use duet_config::{
    parse, Action, HostPattern, Http2Limits, Http2Windows, PathMatch, Policy, SendProxyProtocol,
    Underscores, UpstreamProtocol, Workers,
};
use std::time::Duration;

const VALID: &str = "\
workers: 2
listeners:
  - address: 127.0.0.1:0
routes:
  - match: { host: '*.example.com', path_prefix: /v1 }
    cluster: api
  - cluster: web
clusters:
  - name: web
    backends:
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9002
        weight: 3
  - name: api
    policy: round_robin
    backends:
      - address: 127.0.0.1:9003
    timeouts: { connect: 250ms }
";

#[test]
fn a_valid_file_gives_the_checked_model() {
    let config = parse(VALID, "valid.yaml").expect("valid");
    assert_eq!(
        config.workers,
        Workers::Count(std::num::NonZeroUsize::new(2).expect("2"))
    );
    assert_eq!(config.routes.len(), 2);
    assert_eq!(
        config.routes[0].host,
        Some(HostPattern::Wildcard(".example.com".into()))
    );
    assert_eq!(config.routes[0].action, Action::Cluster(1));
    assert_eq!(config.routes[1].path, PathMatch::Prefix("/".into()));
    assert_eq!(
        config.clusters[0].policy,
        Policy::P2cPeakEwma,
        "the default policy"
    );
    assert_eq!(config.clusters[0].backends[1].weight, 3);
    assert_eq!(
        config.clusters[1].timeouts.connect,
        Duration::from_millis(250)
    );
    assert_eq!(
        config.clusters[1].timeouts.response_headers,
        Duration::from_secs(15)
    );
    assert_eq!(config.limits.max_request_head, 65536);
}

fn errors(yaml: &str) -> Vec<String> {
    match parse(yaml, "bad.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_misspelt_field_gets_its_location_and_a_hint() {
    let yaml = VALID.replace("        weight: 3", "        wieght: 3");
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("bad.yaml:13:9: unknown field `wieght`"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains("hint: did you mean `weight`?"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains("13 |         wieght: 3"),
        "shows the line: {}",
        errors[0]
    );
}

#[test]
fn the_full_scan_policies_load_by_name() {
    for (name, policy) in [
        ("least_inflight", Policy::LeastInflight),
        ("least_peak_ewma", Policy::LeastPeakEwma),
    ] {
        let yaml = VALID.replace("policy: round_robin", &format!("policy: {name}"));
        let config = parse(&yaml, "scan.yaml").expect("valid");
        assert_eq!(config.clusters[1].policy, policy);
        assert_eq!(policy.name(), name);
    }
}

#[test]
fn the_memory_policies_load_by_name() {
    for (name, policy) in [
        ("p2c_memory_inflight", Policy::P2cMemoryInflight),
        ("p2c_memory_peak_ewma", Policy::P2cMemoryPeakEwma),
    ] {
        let yaml = VALID.replace("policy: round_robin", &format!("policy: {name}"));
        let config = parse(&yaml, "memory.yaml").expect("valid");
        assert_eq!(config.clusters[1].policy, policy);
        assert_eq!(policy.name(), name);
    }
}

#[test]
fn a_cluster_speaks_http1_to_its_backends_unless_it_says_h2() {
    let config = parse(VALID, "valid.yaml").expect("valid");
    assert_eq!(config.clusters[0].protocol, UpstreamProtocol::Http1);
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    protocol: h2",
    );
    let config = parse(&yaml, "valid.yaml").expect("valid");
    assert_eq!(config.clusters[1].protocol, UpstreamProtocol::H2);
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    protocol: http2",
    );
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "bad.yaml:16:15: clusters[1].protocol: `http2` is not a backend protocol: expected one \
             of http1, h2"
        ),
        "{}",
        errors[0]
    );
}

#[test]
fn a_cluster_sends_a_proxy_header_of_v1_or_v2_and_only_over_http1() {
    let config = parse(VALID, "valid.yaml").expect("valid");
    assert_eq!(config.clusters[1].send_proxy_protocol, None);
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    send_proxy_protocol: v2",
    );
    let config = parse(&yaml, "valid.yaml").expect("valid");
    assert_eq!(
        config.clusters[1].send_proxy_protocol,
        Some(SendProxyProtocol::V2)
    );
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    send_proxy_protocol: any",
    );
    let found = errors(&yaml);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:16:26: clusters[1].send_proxy_protocol: `any` is not a PROXY protocol \
             version to send: expected v1 or v2"
        ),
        "{}",
        found[0]
    );
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    protocol: h2\n    send_proxy_protocol: v1",
    );
    let found = errors(&yaml);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:17:26: clusters[1].send_proxy_protocol: a PROXY header names one client, \
             but an HTTP/2 connection carries many clients' requests"
        ),
        "{}",
        found[0]
    );
}

#[test]
fn http2_limits_have_defaults_and_their_errors_name_the_nested_field() {
    let config = parse(VALID, "valid.yaml").expect("valid");
    assert_eq!(config.limits.http2, Http2Limits::default());
    assert_eq!(config.limits.http2.max_concurrent_streams, 100);
    let yaml = format!(
        "{VALID}limits:\n  http2: {{ max_concurrent_streams: 7, max_header_list_size: 16KiB, \
         keepalive_interval: 30s }}\n"
    );
    let config = parse(&yaml, "valid.yaml").expect("valid");
    let h2 = config.limits.http2;
    assert_eq!(h2.max_concurrent_streams, 7);
    assert_eq!(h2.max_header_list_size, Some(16 * 1024));
    assert_eq!(h2.keepalive_interval, Duration::from_secs(30));
    assert_eq!(h2.keepalive_timeout, Duration::from_secs(20));
    let yaml = format!("{VALID}limits:\n  http2: {{ max_concurrent_streams: 0, pings: 1 }}\n");
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0]
            .starts_with("bad.yaml:20:36: limits.http2.max_concurrent_streams: 0 is out of range"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].starts_with("bad.yaml:20:39: unknown field `pings`"),
        "{}",
        errors[1]
    );
}

#[test]
fn http2_windows_default_to_bounded_sizes_and_refuse_what_rfc_9113_cannot_carry() {
    let config = parse(VALID, "valid.yaml").expect("valid");
    assert_eq!(config.limits.http2.windows, Http2Windows::CLIENT);
    assert_eq!(Http2Windows::CLIENT.initial_stream_window_size, 256 * 1024);
    assert_eq!(
        Http2Windows::CLIENT.initial_connection_window_size,
        1024 * 1024
    );
    assert_eq!(config.clusters[0].http2, Http2Windows::BACKEND);
    let yaml = format!(
        "{VALID}limits:\n  http2: {{ initial_stream_window_size: 64KiB, \
         initial_connection_window_size: 2147483647, adaptive_window: true }}\n"
    );
    let windows = parse(&yaml, "valid.yaml")
        .expect("valid")
        .limits
        .http2
        .windows;
    assert_eq!(
        windows,
        Http2Windows {
            initial_stream_window_size: 65536,
            initial_connection_window_size: (1 << 31) - 1,
            adaptive_window: true,
        }
    );
    let yaml = format!(
        "{VALID}limits:\n  http2: {{ initial_stream_window_size: 2048MiB, \
         initial_connection_window_size: 1KiB, adaptive_window: maybe }}\n"
    );
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "bad.yaml:20:40: limits.http2.initial_stream_window_size: 2147483648 bytes is out of \
             range: expected 16384 to 2147483647"
        ),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].starts_with(
            "bad.yaml:20:81: limits.http2.initial_connection_window_size: 1024 bytes is out of \
             range: expected 65535 to 2147483647"
        ),
        "{}",
        errors[1]
    );
    assert!(
        errors[2]
            .starts_with("bad.yaml:20:104: limits.http2.adaptive_window: `maybe` is not a boolean"),
        "{}",
        errors[2]
    );
}

#[test]
fn a_cluster_sets_its_backend_windows_only_when_it_speaks_h2() {
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    protocol: h2\n    http2: { initial_stream_window_size: 1MiB }",
    );
    let config = parse(&yaml, "valid.yaml").expect("valid");
    assert_eq!(
        config.clusters[1].http2,
        Http2Windows {
            initial_stream_window_size: 1024 * 1024,
            ..Http2Windows::BACKEND
        }
    );
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    http2: { initial_stream_window_size: 4KiB }",
    );
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "bad.yaml:16:12: clusters[1].http2: sets HTTP/2 windows, but this \
             cluster speaks HTTP/1.1"
        ),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].starts_with(
            "bad.yaml:16:42: clusters[1].http2.initial_stream_window_size: 4096 bytes is out of \
             range: expected 16384"
        ),
        "{}",
        errors[1]
    );
}

#[test]
fn an_unknown_policy_lists_the_choices() {
    let yaml = VALID.replace("policy: round_robin", "policy: round_robbin");
    let errors = errors(&yaml);
    assert!(
        errors[0].starts_with(
            "bad.yaml:15:13: clusters[1].policy: `round_robbin` is not a policy: expected one of \
             p2c_inflight, p2c_peak_ewma, p2c_memory_inflight, p2c_memory_peak_ewma, least_inflight, \
             least_peak_ewma, round_robin, random"
        ),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains("did you mean `round_robin`?"),
        "{}",
        errors[0]
    );
}

#[test]
fn semantic_errors_are_reported_all_at_once() {
    let yaml = "\
workers: many
listeners:
  - address: localhost
routes:
  - match: { path_prefix: v1 }
    cluster: wbe
clusters:
  - name: web
    backends:
      - address: 127.0.0.1:99999
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9001
    timeouts: { connect: 5 parsecs }
  - name: web
    backends: []
";
    let errors = errors(yaml);
    let expect = [
        ("bad.yaml:1:10: workers: `many` is not a worker count", None),
        ("bad.yaml:3:14: listeners[0].address: `localhost` is not a listen address", None),
        ("bad.yaml:5:27: routes[0].match.path_prefix: `v1` must start with `/`", Some("did you mean `/v1`?")),
        ("bad.yaml:6:14: routes[0].cluster: no cluster is named `wbe`", Some("did you mean `web`?")),
        ("bad.yaml:10:18: clusters[0].backends[0].address: `127.0.0.1:99999` has no valid port", None),
        ("bad.yaml:12:18: clusters[0].backends[2].address: backend 127.0.0.1:9001 is listed twice", None),
        ("bad.yaml:13:26: clusters[0].timeouts.connect: `5 parsecs` has unknown unit `parsecs`", None),
        ("bad.yaml:14:11: clusters[1].name: cluster `web` is defined twice", None),
        ("bad.yaml:14:11: clusters[1].backends: cluster `web` has no backends", None),
    ];
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    for (got, (prefix, hint)) in errors.iter().zip(expect) {
        assert!(got.starts_with(prefix), "expected `{prefix}`, got:\n{got}");
        if let Some(hint) = hint {
            assert!(got.contains(hint), "expected hint `{hint}` in:\n{got}");
        }
    }
}

#[test]
fn missing_sections_are_explained() {
    let errors = errors("clusters: []\n");
    assert!(
        errors.iter().any(|e| e.contains("no listeners")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no routes: every request would get 404")),
        "{errors:?}"
    );
}

#[test]
fn a_missing_file_names_the_file() {
    let error =
        duet_config::load(std::path::Path::new("/nonexistent/duet.yaml")).expect_err("missing");
    let text = error.to_string();
    assert!(
        text.contains("/nonexistent/duet.yaml: cannot read the configuration file"),
        "{text}"
    );
}

#[test]
fn every_file_in_config_dir_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("config/ exists") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            if let Err(errors) = duet_config::load(&path) {
                panic!("{errors}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 1, "no configs found in {}", dir.display());
}

#[test]
fn host_names_stay_names_for_discovery() {
    // `.invalid` never resolves (RFC 6761): parsing must not ask, so this loads anywhere.
    let yaml = VALID.replace("127.0.0.1:9003", "API.example.invalid:9003");
    let config = duet_config::parse(&yaml, "ok.yaml").expect("a name is valid without DNS");
    assert_eq!(
        config.clusters[1].backends[0].address,
        duet_config::BackendAddress::Name {
            host: "api.example.invalid".into(),
            port: 9003
        }
    );
    assert!(config.clusters[1].has_named_backends());
    assert!(!config.clusters[0].has_named_backends());
}

#[test]
fn a_malformed_host_name_is_an_error_at_its_field() {
    let yaml = VALID.replace("127.0.0.1:9003", "api internal:9003");
    let errors = duet_config::parse(&yaml, "bad.yaml").expect_err("a space");
    assert!(
        errors.to_string().contains(
            "bad.yaml:17:18: clusters[1].backends[0].address: `api internal:9003` is not a backend address"
        ),
        "{errors}"
    );
}

#[test]
fn trusted_proxies_are_addresses_or_networks() {
    let yaml = "listeners:\n  - address: 127.0.0.1:0\n    trusted_proxies: [10.0.0.0/8, 192.168.1.7, fd00::/8, ten-dot-zero]\nroutes: [ { cluster: app } ]\nclusters:\n  - name: app\n    backends: [ { address: 127.0.0.1:9 } ]\n";
    let errors = duet_config::parse(yaml, "t.yaml").expect_err("one bad entry");
    assert!(
        errors.to_string().contains(
            "t.yaml:3:58: listeners[0].trusted_proxies[3]: `ten-dot-zero` is not an address or network"
        ),
        "{errors}"
    );
    let config = duet_config::parse(&yaml.replace(", ten-dot-zero", ""), "t.yaml").expect("valid");
    let listener = &config.listeners[0];
    for (peer, trusted) in [
        ("10.1.2.3", true),
        ("192.168.1.7", true),
        ("192.168.1.8", false),
        ("fd12::1", true),
        ("127.0.0.1", false),
    ] {
        assert_eq!(
            listener.trusts(peer.parse().expect("ip")),
            trusted,
            "{peer}"
        );
    }
}

#[test]
fn the_kubernetes_config_map_holds_a_valid_config() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes/base/duet.yaml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    // The block scalar under `duet.yaml: |`, indented four spaces.
    let config: String = text
        .lines()
        .skip_while(|l| l.trim() != "duet.yaml: |")
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| format!("{}\n", l.get(4..).unwrap_or_default()))
        .collect();
    assert!(config.contains("listeners:"), "{config}");
    let parsed = duet_config::parse(&config, "duet.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.limits.max_connections, 10_000);
    assert!(
        parsed.clusters[0].has_named_backends(),
        "a headless Service by name"
    );
}

#[test]
fn every_address_clash_is_caught_before_run_fails_to_bind() {
    let found = errors(
        "\
listeners:
  - address: 0.0.0.0:8080
  - address: 127.0.0.1:8080
  - address: 127.0.0.1:8081
routes: [ { cluster: web } ]
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 } ]
admin: { address: 127.0.0.1:8081 }
",
    );
    assert!(
        found
            .iter()
            .any(|e| e.contains("bad.yaml:3:14")
                && e.contains("127.0.0.1:8080 overlaps 0.0.0.0:8080")),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|e| e.contains("bad.yaml:9:19")
            && e.contains("127.0.0.1:8081 is also a traffic listener's")),
        "{found:#?}"
    );
    // Port 0 is the system's pick: never a clash.
    let fine = VALID.replace("workers: 2", "workers: 2\nadmin: { address: 127.0.0.1:0 }");
    assert!(parse(&fine, "ok.yaml").is_ok());
}

#[test]
fn unknown_keys_a_typo_in_a_policy_a_negative_weight_and_a_bad_duration_come_in_one_run() {
    let found = errors(
        "\
listeners: [ { address: 127.0.0.1:0 } ]
routes: [ { cluster: web } ]
clusters:
  - name: web
    policy: p2c_inflght
    backends:
      - address: 127.0.0.1:9001
        weight: -1
    timeouts: { connect: 15, idel: 5s }
    retry: { attempts: 2 }
",
    );
    assert_eq!(found.len(), 5, "{found:#?}");
    assert!(
        found[0].starts_with("bad.yaml:5:13: clusters[0].policy: `p2c_inflght` is not a policy")
    );
    assert!(
        found[0].contains("did you mean `p2c_inflight`?"),
        "{}",
        found[0]
    );
    assert!(found[1]
        .starts_with("bad.yaml:8:17: clusters[0].backends[0].weight: `-1` is not a whole number"));
    assert!(found[2].starts_with("bad.yaml:9:26: clusters[0].timeouts.connect: `15` has no unit"));
    assert!(
        found[3].starts_with("bad.yaml:9:30: unknown field `idel`, expected one of connect,")
            && found[3].contains("did you mean `idle`?"),
        "{}",
        found[3]
    );
    assert!(
        found[4].starts_with("bad.yaml:10:5: unknown field `retry`")
            && found[4].contains("did you mean `retries`?"),
        "{}",
        found[4]
    );
}

#[test]
fn tls_to_h2_backends_loads() {
    let yaml = VALID.replace(
        "policy: round_robin",
        "policy: round_robin\n    protocol: h2\n    tls: { verify: false }",
    );
    let config = duet_config::parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let cluster = &config.clusters[1];
    assert_eq!(cluster.protocol, duet_config::UpstreamProtocol::H2);
    let tls = cluster.tls.as_ref().expect("tls kept");
    assert!(!tls.verify);
}

#[test]
fn underscores_in_header_names_are_dropped_unless_a_listener_keeps_them() {
    let yaml = |setting: &str| {
        format!(
            "listeners:\n  - address: 127.0.0.1:0\n  - address: 127.0.0.1:1\n    {setting}\n\
             routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: 127.0.0.1:9 }} ]\n"
        )
    };
    let config = parse(&yaml("underscores_in_headers: keep"), "t.yaml").expect("valid");
    let choices: Vec<_> = config
        .listeners
        .iter()
        .map(|l| l.underscores_in_headers)
        .collect();
    assert_eq!(
        choices,
        [Underscores::Drop, Underscores::Keep],
        "drop by default"
    );
    let config = parse(&yaml("underscores_in_headers: drop"), "t.yaml").expect("valid");
    assert_eq!(
        config.listeners[1].underscores_in_headers,
        Underscores::Drop
    );
    let found = errors(&yaml("underscores_in_headers: allow"));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:4:29: listeners[1].underscores_in_headers: `allow` is not what to do with them: expected drop or keep"
        ),
        "{}",
        found[0]
    );
}
