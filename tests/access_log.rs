//! The access log as `access_log:` shapes it, through the real binary and real clients: the exact
//! line for a chosen field list, the sample of successes (errors always written), the user a route's
//! auth let in, the TLS version and server name of a TLS listener, and what a pooled connection's
//! `connect_ms` is (null).

use crate::support::{self, raw_exchange, Duet, TempDir};
use duet_testbed::{config::DuetConfig, Backend, BackendOptions};
use std::{net::SocketAddr, time::Duration};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The access-log lines written so far, each from its first field on (the time and level cut off).
fn access_lines(duet: &Duet) -> Vec<String> {
    (duet.log_lines().iter())
        .filter_map(|line| line.split_once(" duet::access: "))
        .map(|(_, fields)| fields.to_owned())
        .collect()
}

/// The JSON access-log entries written so far, each as its text from its first field on.
fn json_lines(duet: &Duet) -> Vec<String> {
    (duet.log_lines().iter())
        .filter(|line| line.ends_with(",\"target\":\"duet::access\"}"))
        .filter_map(|line| line.split_once(",\"level\":\"INFO\","))
        .map(|(_, fields)| fields.to_owned())
        .collect()
}

/// Waits until `lines` has `count` entries; then they are returned.
fn wait_for(count: usize, lines: impl Fn() -> Vec<String>) -> Vec<String> {
    support::eventually(Duration::from_secs(5), || lines().len() >= count);
    lines()
}

/// `GET target` over a connection of its own with `fields`; the status.
fn get(duet: &Duet, target: &str, fields: &str) -> String {
    let request =
        format!("GET {target} HTTP/1.1\r\nHost: shop.test\r\n{fields}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    response.get(9..12).unwrap_or_default().to_owned()
}

fn backend(name: &str) -> Backend {
    Backend::start(BackendOptions::named(name)).expect("backend")
}

/// One worker, a route named `shop` to `backend`, and `access_log` set to `log`.
fn shop(backend: SocketAddr, log: &str) -> String {
    DuetConfig::single("p2c_inflight", &[backend])
        .route_set("name", "shop")
        .section("access_log", log)
        .to_yaml()
}

#[test]
fn a_chosen_field_list_is_written_exactly_in_its_order_in_text_and_json() {
    let web = backend("web");
    let fields = "[method, path, query, status, route, backend, referer, user_agent, user, tls_version, sni, hedged]";
    let duet = Duet::start(&shop(web.address(), &format!("{{ fields: {fields} }}")));
    let referer = "Referer: https://shop.test/cart?id=7\r\nUser-Agent: t/1\r\n";
    assert_eq!(get(&duet, "/basket?token=abc&n=2", referer), "200");
    assert_eq!(get(&duet, "/plain", ""), "200");
    let lines = wait_for(2, || access_lines(&duet));
    let at = web.address();
    assert_eq!(
        lines,
        [
            format!(
                "method=GET path=/basket query=token=abc&n=2 status=200 route=shop backend={at} \
                 referer=\"https://shop.test/cart?id=7\" user_agent=\"t/1\" user=- tls_version=- \
                 sni=- hedged=-"
            ),
            format!(
                "method=GET path=/plain query=- status=200 route=shop backend={at} referer=\"-\" \
                 user_agent=\"-\" user=- tls_version=- sni=- hedged=-"
            ),
        ]
    );

    let json = format!("{{ format: json, fields: {fields} }}");
    let duet = Duet::start(&shop(web.address(), &json));
    assert_eq!(get(&duet, "/basket?token=abc&n=2", referer), "200");
    assert_eq!(get(&duet, "/plain", ""), "200");
    let lines = wait_for(2, || json_lines(&duet));
    assert_eq!(
        lines,
        [
            format!(
                "\"method\":\"GET\",\"path\":\"/basket\",\"query\":\"token=abc&n=2\",\"status\":200,\
                 \"route\":\"shop\",\"backend\":\"{at}\",\"referer\":\"https://shop.test/cart?id=7\",\
                 \"user_agent\":\"t/1\",\"user\":null,\"tls_version\":null,\"sni\":null,\"hedged\":null,\
                 \"target\":\"duet::access\"}}"
            ),
            format!(
                "\"method\":\"GET\",\"path\":\"/plain\",\"query\":null,\"status\":200,\
                 \"route\":\"shop\",\"backend\":\"{at}\",\"referer\":null,\"user_agent\":null,\
                 \"user\":null,\"tls_version\":null,\"sni\":null,\"hedged\":null,\
                 \"target\":\"duet::access\"}}"
            ),
        ]
    );
}

#[test]
fn the_default_json_line_has_nulls_where_no_backend_answered() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = refused.local_addr().expect("address");
    drop(refused);
    let duet = Duet::start_with_args(
        &DuetConfig::single("p2c_inflight", &[gone]).to_yaml(),
        &["--log-format", "json"],
    );
    assert_eq!(get(&duet, "/down", ""), "502");
    let lines = wait_for(1, || {
        (duet.log_lines().into_iter())
            .filter(|l| l.contains("\"target\":\"duet::access\""))
            .collect()
    });
    let entry: serde_json::Value = serde_json::from_str(&lines[0]).expect("one JSON object");
    assert_eq!(entry["status"], 502);
    assert_eq!(entry["outcome"], "connect_failed");
    assert_eq!(entry["upstream_head_ms"], serde_json::Value::Null);
    assert_eq!(entry["hedged"], serde_json::Value::Null);
    assert_eq!(entry["user_agent"], serde_json::Value::Null);
    assert_eq!(entry["tried"], serde_json::Value::Null);
    // The one backend, tried and failed, is named by its error.
    assert_eq!(entry["backend"], gone.to_string());
    assert!(entry.get("connect_ms").is_none(), "not asked for: {entry}");
}

#[test]
fn at_a_zero_sample_errors_are_written_and_successes_are_not() {
    let web = backend("web");
    let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = refused.local_addr().expect("address");
    drop(refused);
    let yaml = DuetConfig::new()
        .route(None, "/down", "down")
        .route(None, "/shop", "web")
        .cluster(duet_testbed::config::Cluster::new("web").backend(web.address()))
        .cluster(duet_testbed::config::Cluster::new("down").backend(gone))
        .section(
            "access_log",
            "{ fields: [method, path, status, outcome], sample_success: 0% }",
        )
        .to_yaml();
    let duet = Duet::start(&yaml);
    for i in 0..5 {
        assert_eq!(get(&duet, &format!("/shop/{i}"), ""), "200");
    }
    assert_eq!(get(&duet, "/nowhere", ""), "404");
    assert_eq!(get(&duet, "/down", ""), "502");
    assert_eq!(get(&duet, "/shop/last", ""), "200");
    // One worker writes its lines in order: once the 502's is out, the successes' would be too.
    let lines = wait_for(2, || access_lines(&duet));
    assert_eq!(
        lines,
        [
            "method=GET path=/nowhere status=404 outcome=no_route",
            "method=GET path=/down status=502 outcome=connect_failed",
        ]
    );
    assert_eq!(web.requests(), 6, "every success was served, unlogged");
}

#[test]
fn the_user_is_the_basic_auth_user_and_unknown_before_auth_let_anyone_in() {
    let web = backend("web");
    let dir = TempDir::new();
    let users = dir.0.join("users.htpasswd");
    // `openssl passwd -6 -salt abcdefgh s3cret`: SHA-512 crypt, as `htpasswd -5` writes it.
    let hash = "$6$abcdefgh$Z7KfoKnKTSZrzo5VZ0YubGLQOj9ov6sHo9TmE3zIU/LHKhpE30zCnZ0mcIXYf9r9rQ4DYaXoxAFSPFlcWdxjB.";
    std::fs::write(&users, format!("ann:{hash}\n")).expect("users");
    let yaml = DuetConfig::single("p2c_inflight", &[web.address()])
        .route_set("name", "admin")
        .route_set(
            "auth",
            &format!(
                "{{ basic: {{ users: '{}', realm: admin }} }}",
                users.display()
            ),
        )
        .section("access_log", "{ fields: [path, status, user, outcome] }")
        .to_yaml();
    let duet = Duet::start(&yaml);
    // "ann:s3cret" and "ann:wrong" in base64.
    assert_eq!(
        get(&duet, "/in", "Authorization: Basic YW5uOnMzY3JldA==\r\n"),
        "200"
    );
    assert_eq!(
        get(&duet, "/out", "Authorization: Basic YW5uOndyb25n\r\n"),
        "401"
    );
    let lines = wait_for(2, || access_lines(&duet));
    assert_eq!(
        lines,
        [
            "path=/in status=200 user=ann outcome=complete",
            "path=/out status=401 user=- outcome=unauthorized",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_logs_its_version_and_the_server_name_asked_for() {
    let certificate = support::TestCertificate::localhost();
    let web = backend("web");
    let yaml = DuetConfig::single("p2c_inflight", &[web.address()])
        .tls(&certificate.cert, &certificate.key)
        .section(
            "access_log",
            "{ format: json, fields: [path, tls_version, sni] }",
        )
        .to_yaml();
    let duet = Duet::start(&yaml);
    let mut tls = support::tls_connect(duet.address, certificate.client_config())
        .await
        .expect("handshake");
    tls.write_all(b"GET /secure HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response));
    let _ = read.await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let lines = wait_for(1, || json_lines(&duet));
    assert_eq!(
        lines,
        ["\"path\":\"/secure\",\"tls_version\":\"TLSv1.3\",\"sni\":\"localhost\",\"target\":\"duet::access\"}"]
    );
}

#[test]
fn connect_ms_is_the_new_connection_s_and_null_on_a_pooled_one() {
    let web = backend("web");
    let duet = Duet::start(&shop(
        web.address(),
        "{ format: json, fields: [path, connect_ms] }",
    ));
    assert_eq!(get(&duet, "/first", ""), "200");
    assert_eq!(get(&duet, "/second", ""), "200");
    let lines = wait_for(2, || {
        (duet.log_lines().into_iter())
            .filter(|l| l.contains("\"target\":\"duet::access\""))
            .collect()
    });
    let entries: Vec<serde_json::Value> = (lines.iter())
        .map(|l| serde_json::from_str(l).expect("one JSON object"))
        .collect();
    assert_eq!(entries[0]["path"], "/first");
    let connect = entries[0]["connect_ms"].as_f64().expect("a number");
    assert!((0.0..1000.0).contains(&connect), "{connect}");
    assert_eq!(entries[1]["path"], "/second");
    assert_eq!(entries[1]["connect_ms"], serde_json::Value::Null, "pooled");
}

#[test]
fn format_combined_writes_nginx_s_combined_line() {
    let web = backend("web");
    let duet = Duet::start(&shop(web.address(), "{ format: combined }"));
    let sent = "Referer: https://shop.test/cart?id=7\r\nUser-Agent: t/1 \"x\"\r\n";
    assert_eq!(get(&duet, "/bytes/5?n=2", sent), "200");
    let combined = |duet: &Duet| -> Vec<String> {
        (duet.log_lines().into_iter())
            .filter(|line| line.starts_with("127.0.0.1 - - ["))
            .collect()
    };
    let lines = wait_for(1, || combined(&duet));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    // `127.0.0.1 - - [05/Dec/2026:17:11:59 +0000] "GET ..."`: the time between the brackets.
    let (time, rest) = lines[0]["127.0.0.1 - - [".len()..]
        .split_once("] ")
        .expect("a bracketed time");
    let bytes = time.as_bytes();
    assert_eq!(time.len(), 26, "{time}");
    assert_eq!(
        (bytes[2], bytes[6], bytes[11]),
        (b'/', b'/', b':'),
        "{time}"
    );
    assert!(time.ends_with(" +0000"), "{time}");
    assert_eq!(
        rest,
        "\"GET /bytes/5?n=2 HTTP/1.1\" 200 5 \"https://shop.test/cart?id=7\" \"t/1 \\x22x\\x22\""
    );
    // No duet field line besides it.
    assert!(access_lines(&duet).is_empty(), "{:#?}", duet.log_lines());
}
