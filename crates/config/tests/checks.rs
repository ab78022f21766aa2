//! Checks added after the split into one function per section: each pins a located error.

use duet_config::HostPattern;

fn errors(yaml: &str) -> Vec<String> {
    match duet_config::parse(yaml, "bad.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
    }
}

const BASE: &str = "\
listeners: [ { address: 127.0.0.1:0 } ]
routes: [ { cluster: web } ]
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 } ]
";

#[test]
fn a_cluster_setting_is_named_with_its_cluster() {
    let found = errors(&format!(
        "{BASE}  - name: api\n    backends: [ {{ address: 127.0.0.1:9002 }} ]\n    \
         retries: {{ replay_body_limit: 1 parsec }}\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with("bad.yaml:8:35: clusters[1].retries.replay_body_limit: `1 parsec`"),
        "{}",
        found[0]
    );
}

/// Each timeout that 0 would make expire at once, written as 0 (in its three spellings).
#[test]
fn a_zero_timeout_is_refused_with_what_to_write_instead() {
    let found = errors(
        "\
listeners: [ { address: 127.0.0.1:0 } ]
routes: [ { cluster: web } ]
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 } ]
    timeouts: { connect: 0, response_headers: 0s, read: 0ms, tunnel_idle: 0 }
    health_check: { interval: 0s, timeout: 0 }
    outlier_detection: { base_ejection_time: 0s }
limits: { header_read_timeout: 0, body_read_timeout: 0s, send_timeout: 0, keepalive_timeout: 0s }
shutdown: { drain_timeout: 0s }
",
    );
    let expect = [
        (
            "6:26: clusters[0].timeouts.connect",
            "`0` would give backends no time to accept a connection",
            "`1s` (the default)",
        ),
        (
            "6:47: clusters[0].timeouts.response_headers",
            "`0s` would give backends no time to answer",
            "`15s` (the default)",
        ),
        (
            "6:57: clusters[0].timeouts.read",
            "`0ms` would cut every response body that pauses",
            "`60s` (the default)",
        ),
        (
            "6:75: clusters[0].timeouts.tunnel_idle",
            "`0` would close every WebSocket tunnel at once",
            "`1h` (the default)",
        ),
        (
            "7:31: clusters[0].health_check.interval",
            "`0s` would check every backend without pause",
            "`2s` (the default)",
        ),
        (
            "7:44: clusters[0].health_check.timeout",
            "`0` would fail every check",
            "to stop checking, remove `health_check`; otherwise",
        ),
        (
            "8:46: clusters[0].outlier_detection.base_ejection_time",
            "`0s` would eject failing backends for no time at all",
            "to turn ejection off, set `consecutive_failures: 0`; otherwise",
        ),
        (
            "9:32: limits.header_read_timeout",
            "`0` would give clients no time to send a request head",
            "`10s` (the default)",
        ),
        (
            "9:54: limits.body_read_timeout",
            "`0s` would give clients no time to send a request body",
            "`60s` (the default)",
        ),
        (
            "9:72: limits.send_timeout",
            "`0` would cut every response a client does not read at once",
            "`60s` (the default)",
        ),
        (
            "9:94: limits.keepalive_timeout",
            "`0s` would close every kept-alive connection at once",
            "to close each connection after one request, set `keepalive_requests: 1`; otherwise",
        ),
        (
            "10:28: shutdown.drain_timeout",
            "`0s` would cut every request in flight at SIGTERM",
            "`30s` (the default)",
        ),
    ];
    assert_eq!(found.len(), expect.len(), "{found:#?}");
    for (got, (at, message, hint)) in found.iter().zip(expect) {
        let start = format!("bad.yaml:{at}: {message}: expected a duration above 0");
        assert!(got.starts_with(&start), "expected `{start}`, got:\n{got}");
        assert!(got.contains(hint), "expected `{hint}` in:\n{got}");
        assert!(got.contains("write a duration such as `"), "{got}");
    }
}

/// Where 0 means "none" or "off", it stays allowed.
#[test]
fn zero_stays_allowed_where_it_means_off() {
    let yaml = format!(
        "{BASE}    timeouts: {{ idle: 0s }}\n    \
         outlier_detection: {{ max_ejection_time: 0s }}\n    slow_start: 0s\n    \
         dns_refresh: 0\nshutdown: {{ drain_delay: 0s }}\n"
    )
    .replace(
        "routes: [ { cluster: web } ]",
        "routes: [ { cluster: web, timeout: 0s } ]",
    );
    let config = duet_config::parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let cluster = &config.clusters[0];
    assert!(
        cluster.timeouts.idle.is_zero(),
        "no pooled connection is reused"
    );
    assert!(cluster.outlier_detection.max_ejection_time.is_zero());
    assert!(cluster.slow_start.is_zero(), "no ramp");
    assert!(cluster.dns_refresh.is_zero(), "resolved at load only");
    assert!(config.shutdown.drain_delay.is_zero());
    assert_eq!(config.routes[0].timeout, None, "no route deadline");
}

/// Host patterns and path prefixes no request could match, and ports no socket has, in one run.
#[test]
fn patterns_that_can_never_match_and_ports_past_65535_are_refused() {
    let found = errors(
        "\
listeners: [ { address: 127.0.0.1:0 }, { address: '0.0.0.0:99999' } ]
routes:
  - { match: { host: 'api.example.com:8080' }, cluster: web }
  - { match: { host: a b }, cluster: web }
  - { match: { path_prefix: /api/../admin }, cluster: web }
  - { match: { path_prefix: /api/./x }, cluster: web }
  - { match: { path_prefix: //x }, cluster: web }
  - { match: { path_prefix: /%61dmin }, cluster: web }
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 }, { address: '127.0.0.1:0' }, { address: 'api.internal:70000' } ]
admin: { address: '[::1]:65536' }
",
    );
    let no_port = "has no valid port: expected a port from 0 to 65535 (0 lets the system pick)";
    let no_backend_port =
        "has no valid port: expected IP:PORT or HOST:PORT with a port from 1 to 65535";
    let not_normalised = "is not a normalised path prefix: it";
    let expect = [
        (
            "1:51: listeners[1].address",
            "`0.0.0.0:99999`",
            no_port,
            None,
        ),
        (
            "3:22: routes[0].match.host",
            "`api.example.com:8080`",
            "has a port: a route matches the host name alone",
            Some("hint: write `api.example.com`"),
        ),
        (
            "4:22: routes[1].match.host",
            "`a b`",
            "is not a host pattern: expected a name such as api.example.com",
            Some("hint: a host name holds only letters, digits, `-`, `_` and dots"),
        ),
        (
            "5:29: routes[2].match.path_prefix",
            "`/api/../admin`",
            not_normalised,
            Some("hint: write `/admin`"),
        ),
        (
            "6:29: routes[3].match.path_prefix",
            "`/api/./x`",
            not_normalised,
            Some("hint: write `/api/x`"),
        ),
        (
            "7:29: routes[4].match.path_prefix",
            "`//x`",
            not_normalised,
            Some("hint: write `/x`"),
        ),
        (
            "8:29: routes[5].match.path_prefix",
            "`/%61dmin`",
            "is not a normalised path prefix: it writes `a` as `%61`",
            Some("hint: write `/admin`"),
        ),
        (
            "11:57: clusters[0].backends[1].address",
            "`127.0.0.1:0`",
            no_backend_port,
            None,
        ),
        (
            "11:85: clusters[0].backends[2].address",
            "`api.internal:70000`",
            no_backend_port,
            None,
        ),
        ("12:19: admin.address", "`[::1]:65536`", no_port, None),
    ];
    assert_eq!(found.len(), expect.len(), "{found:#?}");
    for (got, (at, value, message, hint)) in found.iter().zip(expect) {
        let start = format!("bad.yaml:{at}: {value} {message}");
        assert!(got.starts_with(&start), "expected `{start}`, got:\n{got}");
        if let Some(hint) = hint {
            assert!(got.contains(hint), "expected `{hint}` in:\n{got}");
        }
    }
}

#[test]
fn a_host_with_a_trailing_dot_is_the_same_host() {
    let yaml = BASE.replace(
        "routes: [ { cluster: web } ]",
        "routes:\n  - { match: { host: API.Example.com. }, cluster: web }\n  \
         - { match: { host: '*.Example.org.' }, cluster: web }\n  \
         - { match: { host: '[::1]' }, cluster: web }",
    );
    let config = duet_config::parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let hosts: Vec<_> = config.routes.iter().map(|r| r.host.clone()).collect();
    assert_eq!(
        hosts,
        [
            Some(HostPattern::Exact("api.example.com".into())),
            Some(HostPattern::Wildcard(".example.org".into())),
            // The proxy matches a request's `[::1]:8080` as `::1`.
            Some(HostPattern::Exact("::1".into())),
        ]
    );
    assert_eq!(
        config.routes[0].name, "api.example.com/",
        "the metrics label too"
    );
}

/// By default only a backend's own failures eject it, from at most 10% of a cluster; 5xx responses eject
/// only when `consecutive_5xx` asks for it.
#[test]
fn responses_eject_only_when_asked_and_at_most_ten_percent_by_default() {
    let config = duet_config::parse(BASE, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let defaults = config.clusters[0].outlier_detection;
    assert_eq!(
        (defaults.consecutive_failures, defaults.consecutive_5xx),
        (5, 0)
    );
    assert_eq!(defaults.max_ejection_fraction, 0.1);
    let yaml = format!("{BASE}    outlier_detection: {{ consecutive_5xx: 3 }}\n");
    let config = duet_config::parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.clusters[0].outlier_detection.consecutive_5xx, 3);
    let yaml = format!("{BASE}    outlier_detection: {{ consecutive_5xx: many }}\n");
    let found = errors(&yaml);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:6:43: clusters[0].outlier_detection.consecutive_5xx: `many` is not a whole number"
        ),
        "{found:?}"
    );
}

/// A route may be limited to some listeners, named or written as their address; an unknown one is
/// named with its place in the file.
#[test]
fn a_route_names_its_listeners_and_an_unknown_one_is_refused_where_it_stands() {
    let yaml = "\
listeners:
  - { name: public, address: 127.0.0.1:8080 }
  - { name: internal, address: 127.0.0.1:8081 }
  - { address: '[::1]:8082' }
routes:
  - { match: { path_prefix: /admin }, cluster: web, listeners: [internal, '[::1]:8082'] }
  - { cluster: web }
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 } ]
";
    let config = duet_config::parse(yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.routes[0].listeners, Some(vec![1, 2]));
    assert_eq!(config.routes[1].listeners, None, "every listener");
    assert!(config.routes[0].serves(1) && !config.routes[0].serves(0));
    assert_eq!(config.listeners[1].name.as_deref(), Some("internal"));

    let found = errors(
        &yaml
            .replace("[internal, '[::1]:8082']", "[internl, 127.0.0.1:9]")
            .replace(
                "{ address: '[::1]:8082' }",
                "{ name: public, address: '[::1]:8082' }",
            ),
    );
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].starts_with("bad.yaml:4:13: listeners[2].name: listener `public` is named twice"),
        "{found:#?}"
    );
    assert!(
        found[1].starts_with(
            "bad.yaml:6:65: routes[0].listeners[0]: no listener is named `internl` or listens on it"
        ) && found[1].contains("did you mean `internal`?"),
        "{found:#?}"
    );
    assert!(
        found[2].starts_with(
            "bad.yaml:6:74: routes[0].listeners[1]: no listener is named `127.0.0.1:9` or listens on it"
        ) && found[2].contains("listeners: public (127.0.0.1:8080), internal (127.0.0.1:8081)"),
        "{found:#?}"
    );
    let found = errors(&yaml.replace("[internal, '[::1]:8082']", "[]"));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:6:64: routes[0].listeners: an empty list: the route would match nothing"
        ) && found[0].ends_with("hint: leave `listeners` out for a route on every listener"),
        "{found:#?}"
    );
}

/// `buffer_request` per route and the upload floor in `limits`: read as written, off when left out or 0.
#[test]
fn request_buffering_and_the_upload_floor_are_read_as_written() {
    let yaml = format!("{BASE}limits: {{ min_upload_rate: 2KiB/s, upload_rate_grace: 250ms }}\n")
        .replace(
            "routes: [ { cluster: web } ]",
            "routes:\n  - { match: { path_prefix: /up }, cluster: web, buffer_request: 1MiB }\n  \
         - { match: { path_prefix: /zero }, cluster: web, buffer_request: 0 }\n  \
         - { cluster: web }",
        );
    let config = duet_config::parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let buffers: Vec<_> = config.routes.iter().map(|r| r.buffer_request).collect();
    assert_eq!(buffers, [Some(1 << 20), None, None]);
    assert_eq!(config.limits.min_upload_rate, 2048);
    assert_eq!(
        config.limits.upload_rate_grace,
        std::time::Duration::from_millis(250)
    );
    let defaults = duet_config::parse(BASE, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(defaults.limits.min_upload_rate, 0, "no floor by default");
    assert_eq!(
        defaults.limits.upload_rate_grace,
        std::time::Duration::from_secs(10)
    );
}

#[test]
fn a_rate_without_its_time_unit_and_a_bad_buffer_size_are_located() {
    let found = errors(
        &format!("{BASE}limits: {{ min_upload_rate: 1KiB }}\n").replace(
            "routes: [ { cluster: web } ]",
            "routes: [ { cluster: web, buffer_request: lots } ]",
        ),
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with("bad.yaml:2:43: routes[0].buffer_request: `lots` is not a size"),
        "{}",
        found[0]
    );
    assert!(
        found[1].starts_with(
            "bad.yaml:6:28: limits.min_upload_rate: `1KiB` has no time unit: write `1KiB/s`"
        ),
        "{}",
        found[1]
    );
}

#[test]
fn a_listener_s_per_client_caps_are_read_and_bad_ones_located() {
    let config = duet_config::parse(
        "listeners: [ { address: 127.0.0.1:0, limits: { connections_per_client: 200, new_connections_per_client: 100/s } } ]
routes: [ { cluster: web } ]
clusters: [ { name: web, backends: [ { address: 127.0.0.1:9001 } ] } ]
",
        "ok.yaml",
    )
    .expect("valid");
    let limits = config.listeners[0].limits;
    assert_eq!(limits.connections, Some(200));
    assert_eq!(
        limits.new_connections,
        Some((100, std::time::Duration::from_secs(1)))
    );
    let errors = match duet_config::parse(
        "listeners: [ { address: 127.0.0.1:0, limits: { connections_per_client: 0, new_connections_per_client: 5/d } } ]
routes: [ { cluster: web } ]
clusters: [ { name: web, backends: [ { address: 127.0.0.1:9001 } ] } ]
",
        "bad.yaml",
    ) {
        Ok(_) => panic!("expected errors"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    for start in [
        "bad.yaml:1:72: listeners[0].limits.connections_per_client: 0 is out of range",
        "bad.yaml:1:103: listeners[0].limits.new_connections_per_client: `5/d` is not a rate",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(start)),
            "{start}\n{errors:#?}"
        );
    }
}

#[test]
fn the_status_page_s_bucket_is_10s_unless_set_and_from_1s_to_10m() {
    use std::time::Duration;
    let config = duet_config::parse(BASE, "ok.yaml").expect("valid");
    assert_eq!(config.admin_status_bucket, Duration::from_secs(10));
    let yaml = format!("{BASE}admin: {{ address: 127.0.0.1:9901, status_bucket: 1s }}\n");
    let config = duet_config::parse(&yaml, "ok.yaml").expect("valid");
    assert_eq!(config.admin_status_bucket, Duration::from_secs(1));
    let found = errors(&format!(
        "{BASE}admin: {{ address: 127.0.0.1:9901, status_bucket: 500ms }}\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:6:50: admin.status_bucket: `500ms` is out of range: expected a duration \
             from 1s to 10m"
        ),
        "{found:#?}"
    );
    assert!(found[0].contains("hint: the default, `10s`"), "{found:#?}");
}
