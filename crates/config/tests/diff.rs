//! `duet check --diff`: what a reload from one file to another would change.

use duet_config::{diff, parse};

const OLD: &str = "\
workers: 2
listeners: [ { address: 127.0.0.1:8080 } ]
routes:
  - match: { path_prefix: /api }
    cluster: api
  - cluster: web
clusters:
  - name: web
    backends:
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9002
  - name: api
    backends: [ { address: 127.0.0.1:9003 } ]
    timeouts: { connect: 1s }
";

#[test]
fn every_kind_of_change_is_named_and_restarts_are_flagged() {
    let new = "\
workers: 4
listeners: [ { address: 127.0.0.1:8080 }, { address: 127.0.0.1:8443 } ]
routes:
  - cluster: web
  - match: { path_prefix: /api }
    cluster: api
clusters:
  - name: web
    policy: round_robin
    backends:
      - address: 127.0.0.1:9001
        weight: 3
      - address: 127.0.0.1:9004
  - name: api
    backends: [ { address: 127.0.0.1:9003 } ]
    timeouts: { connect: 250ms }
    panic_threshold: 30%
  - name: admin-ui
    backends: [ { address: 127.0.0.1:9005 } ]
limits: { max_connections: 5000 }
";
    let (old, new) = (
        parse(OLD, "old.yaml").expect("old"),
        parse(new, "new.yaml").expect("new"),
    );
    let lines: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "~ workers: 2 -> 4   (needs a restart: a reload refuses it)",
            "+ listener 127.0.0.1:8443   (needs a restart: a reload refuses it)",
            "~ routes: the same routes in another order (the first match wins)",
            "~ cluster web: policy p2c_peak_ewma -> round_robin",
            "~ cluster web: backend 127.0.0.1:9001 weight 1 -> 3",
            "+ cluster web: backend 127.0.0.1:9004 weight 1",
            "- cluster web: backend 127.0.0.1:9002",
            "~ cluster api.timeouts.connect: 1s -> 250ms",
            "~ cluster api.panic_threshold: 50% -> 30%",
            "+ cluster admin-ui (p2c_peak_ewma, 1 backend)",
            "~ limits.max_connections: 10000 -> 5000",
        ]
    );
    assert!(diff(&old, &old).is_empty(), "a file against itself");
}

/// Limiting a route to a listener, or naming a listener, is a change a reload applies.
#[test]
fn a_route_limited_to_a_listener_is_a_route_change() {
    let new = OLD
        .replace(
            "listeners: [ { address: 127.0.0.1:8080 } ]",
            "listeners: [ { name: public, address: 127.0.0.1:8080 } ]",
        )
        .replace(
            "    cluster: api\n",
            "    cluster: api\n    listeners: [public]\n",
        );
    let (old, new) = (
        parse(OLD, "old.yaml").expect("old"),
        parse(&new, "new.yaml").expect("new"),
    );
    let changes = diff(&old, &new);
    let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "~ listener 127.0.0.1:8080.name: none -> public",
            "~ route */api: was host * path /api -> api; now host * path /api -> api (listeners public)",
        ]
    );
    assert!(changes.iter().all(|c| !c.needs_restart));
}

#[test]
fn request_buffering_and_the_upload_floor_show_in_the_plan() {
    let new = OLD.replace(
        "    cluster: api\n",
        "    cluster: api\n    buffer_request: 1MiB\n",
    ) + "limits: { min_upload_rate: 1KiB/s }\n";
    let (old, new) = (
        parse(OLD, "old.yaml").expect("old"),
        parse(&new, "new.yaml").expect("new"),
    );
    let lines: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "~ route */api: was host * path /api -> api; now host * path /api -> api (buffer_request 1048576 bytes)",
            "~ limits.min_upload_rate: 0 -> 1024",
        ]
    );
}

#[test]
fn tls_to_backends_shows_as_written_and_parses_from_old_files_unchanged() {
    let with_tls = |tls: &str| {
        OLD.replace(
            "    timeouts: { connect: 1s }\n",
            &format!("    timeouts: {{ connect: 1s }}\n    tls: {tls}\n"),
        )
    };
    let old = parse(OLD, "old.yaml").expect("old files load unchanged");
    assert!(old.clusters.iter().all(|c| c.tls.is_none()));
    let on = parse(
        &with_tls("{ ca: /etc/duet/ca.pem, server_name: api.internal }"),
        "x.yaml",
    )
    .expect("tls");
    let rotated = parse(
        &with_tls("{ server_name: api.internal, cert: c.pem, key: c.key, verify: false }"),
        "/etc/duet/y.yaml",
    )
    .expect("tls");
    let lines = |a, b| -> Vec<String> { diff(a, b).iter().map(ToString::to_string).collect() };
    assert_eq!(
        lines(&old, &on),
        ["~ cluster api.tls: off -> ca /etc/duet/ca.pem, server_name api.internal"]
    );
    assert_eq!(
        lines(&on, &rotated),
        [
            "~ cluster api.tls: ca /etc/duet/ca.pem, server_name api.internal -> system roots, \
          server_name api.internal, client cert /etc/duet/c.pem, verify false"
        ]
    );
    assert!(diff(&on, &on).is_empty());
}

#[test]
fn routes_are_matched_by_name_added_removed_and_changed() {
    let base = "\
listeners: [ { address: 127.0.0.1:8080 } ]
clusters:
  - { name: web, backends: [ { address: 127.0.0.1:9001 } ] }
  - { name: shadow, backends: [ { address: 127.0.0.1:9002 } ] }
routes:
";
    let old = format!(
        "{base}  - {{ name: api, match: {{ path_prefix: /api }}, cluster: web }}\n  - {{ name: old, match: {{ path_prefix: /old }}, cluster: web }}\n"
    );
    let new = format!(
        "{base}  - {{ name: api, match: {{ path_prefix: /api, method: [GET] }}, cluster: web, mirror: {{ cluster: shadow, percent: 10 }} }}\n  - {{ name: fresh, match: {{ path: {{ exact: /new }} }}, redirect: {{ path: /api }} }}\n"
    );
    let (old, new) = (
        parse(&old, "old.yaml").expect("old"),
        parse(&new, "new.yaml").expect("new"),
    );
    let lines: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "~ route api: was host * path /api -> web; now host * path /api method GET -> web mirror shadow 10%",
            "+ route fresh: host * path =/new -> redirect 302 path /api",
            "- route old: host * path /old -> web",
        ]
    );
}

#[test]
fn http2_windows_show_field_by_field() {
    let new = OLD.replace(
        "    timeouts: { connect: 1s }\n",
        "    timeouts: { connect: 1s }\n    protocol: h2\n    http2: { adaptive_window: true }\n",
    ) + "limits: { http2: { initial_stream_window_size: 1MiB } }\n";
    let (old, new) = (
        parse(OLD, "old.yaml").expect("old"),
        parse(&new, "new.yaml").expect("new"),
    );
    let lines: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "~ cluster api: protocol http1 -> h2",
            "~ cluster api.http2.adaptive_window: false -> true",
            "~ limits.http2.initial_stream_window_size: 262144 -> 1048576",
        ]
    );
}

#[test]
fn an_access_log_change_shows_its_format_fields_and_sample() {
    let new =
        format!("{OLD}access_log: {{ format: json, fields: [status, sni], sample_success: 5% }}\n");
    let (old, new) = (
        parse(OLD, "old.yaml").expect("old"),
        parse(&new, "new.yaml").expect("new"),
    );
    let lines: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with("~ access_log: format --log-format, fields [client, method, host, "),
        "{lines:#?}"
    );
    assert!(
        lines[0].ends_with(
            "request_id], sample_success 100% -> format json, fields [status, sni], sample_success 5%"
        ),
        "{lines:#?}"
    );
}

#[test]
fn sticky_shows_its_cookie_and_whether_its_key_changed_never_the_key() {
    let with = |sticky: &str| {
        let yaml = OLD.replace(
            "    timeouts: { connect: 1s }\n",
            &format!("    timeouts: {{ connect: 1s }}\n    sticky: {sticky}\n"),
        );
        parse(&yaml, "x.yaml").expect("sticky")
    };
    let old = parse(OLD, "old.yaml").expect("old");
    let random = with("{ cookie: sid }");
    let shared = with("{ cookie: sid, ttl: 30m, secret: 0123456789abcdef }");
    let rotated = with("{ cookie: sid, ttl: 30m, secret: fedcba9876543210 }");
    let lines = |a, b| -> Vec<String> { diff(a, b).iter().map(ToString::to_string).collect() };
    assert_eq!(
        lines(&old, &random),
        ["~ cluster api: sticky off -> cookie sid ttl 3600s random key"]
    );
    assert_eq!(
        lines(&random, &shared),
        ["~ cluster api: sticky cookie sid ttl 3600s random key -> cookie sid ttl 1800s shared key"]
    );
    let rotation = lines(&shared, &rotated);
    assert_eq!(
        rotation,
        ["~ cluster api: sticky key changed (cookies signed under the old one are re-picked)"]
    );
    assert!(!format!("{rotation:?}").contains("0123"));
    assert!(diff(&shared, &shared).is_empty());
}

#[test]
fn a_hash_policy_shows_its_key_bound_walk_and_table() {
    let with = |hash: &str| {
        let yaml = OLD.replace(
            "    timeouts: { connect: 1s }\n",
            &format!("    timeouts: {{ connect: 1s }}\n    policy: hash\n    hash: {hash}\n"),
        );
        parse(&yaml, "x.yaml").expect("hash")
    };
    let header = with("{ key: header:x-user }");
    let ring = with("{ key: header:x-user, bound: 1.5, walk: next, algorithm: ring }");
    let lines = |a, b| -> Vec<String> { diff(a, b).iter().map(ToString::to_string).collect() };
    assert_eq!(
        lines(&header, &ring),
        ["~ cluster api: hash key header:x-user bound 1.25 walk p2c algorithm maglev -> key header:x-user bound 1.5 walk next algorithm ring"]
    );
    let old = parse(OLD, "old.yaml").expect("old");
    let added = lines(&old, &header);
    assert!(
        added.contains(
            &"~ cluster api: hash off -> key header:x-user bound 1.25 walk p2c algorithm maglev"
                .to_owned()
        ),
        "{added:?}"
    );
    assert!(diff(&ring, &ring).is_empty());
}
