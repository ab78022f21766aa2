//! Routing and header rules, through the real binary to real backends.

use crate::support;

use crate::support::{get, raw_exchange, Duet};
use duet_testbed::config::{Cluster, DuetConfig};
use duet_testbed::{Backend, BackendOptions};
use std::time::Duration;

fn routed_setup() -> (Backend, Backend, Backend, Duet) {
    let api = Backend::start(BackendOptions::named("api")).expect("api");
    let wild = Backend::start(BackendOptions::named("wild")).expect("wild");
    let web = Backend::start(BackendOptions::named("web")).expect("web");
    let config = DuetConfig::new()
        .workers(2)
        .route(Some("api.example.com"), "/v1", "api")
        .route(Some("*.example.org"), "/", "wild")
        .route(None, "/site", "web")
        .cluster(Cluster::new("api").backend(api.address()))
        .cluster(Cluster::new("wild").backend(wild.address()))
        .cluster(Cluster::new("web").backend(web.address()));
    let duet = Duet::start(&config.to_yaml());
    (api, wild, web, duet)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_matching_route_wins() {
    let (api, wild, web, duet) = routed_setup();
    let cases: &[(&str, &str, u16, &str)] = &[
        ("API.Example.com:8080", "/v1/users", 200, "api"),
        ("api.example.com", "/v2/users", 404, ""),
        ("x.example.org", "/anything", 200, "wild"),
        ("x.y.EXAMPLE.org", "/site", 200, "wild"),
        ("example.org", "/site/page", 200, "web"),
        ("other.test", "/elsewhere", 404, ""),
    ];
    for &(host, path, status, backend) in cases {
        let (got, headers, body) = get(&duet.url(path), &[("host", host)]).await;
        assert_eq!(got, status, "{host}{path}");
        if status == 200 {
            assert_eq!(headers["x-backend"], backend, "{host}{path}");
            assert_eq!(body, backend.as_bytes());
        } else {
            assert_eq!(&body[..], b"no route matches this host and path\n");
        }
    }
    assert_eq!((api.requests(), wild.requests(), web.requests()), (1, 2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_forwarded_by_the_rules() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    let (status, response_headers, _) = get(
        &duet.url("/path?q=1"),
        &[
            ("host", "Shop.Example.com"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("connection", "x-hop, keep-alive"),
            ("x-hop", "secret"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("x-end-to-end", "kept"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let seen = backend.recorded().pop().expect("one request");
    let h = &seen.headers;
    assert_eq!(seen.uri, "/path?q=1", "origin-form target to the backend");
    assert_eq!(seen.version, hyper::Version::HTTP_11);
    assert_eq!(h["host"], "Shop.Example.com", "Host passes unchanged");
    assert_eq!(
        h["x-forwarded-for"], "127.0.0.1",
        "a peer that is no trusted proxy cannot forge the chain"
    );
    assert_eq!(h["x-forwarded-proto"], "http", "set to what duet saw");
    assert_eq!(h["x-forwarded-host"], "Shop.Example.com");
    assert_eq!(h["x-end-to-end"], "kept");
    for hop in [
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "transfer-encoding",
    ] {
        assert!(
            !h.contains_key(hop),
            "{hop} must not reach the backend: {h:?}"
        );
    }
    assert!(h.get("connection").is_none_or(|c| c != "x-hop, keep-alive"));
    // Hop-by-hop headers from the backend do not reach the client either.
    assert_eq!(
        response_headers["keep-alive"], "timeout=75",
        "duet's own keep-alive promise, nothing of the backend's"
    );
    assert_eq!(response_headers["x-backend"], "b");
}

/// What a client claims about earlier hops is kept only when the peer is a trusted proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_fields_are_kept_only_from_trusted_proxies() {
    let forged = [
        ("host", "a.test"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "evil.test"),
        ("x-forwarded-port", "1"),
        ("forwarded", "for=6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
    ];
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let untrusting =
        Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    assert_eq!(get(&untrusting.url("/"), &forged).await.0, 200);
    let seen = backend.recorded().pop().expect("request").headers;
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "rebuilt from what duet saw"
    );
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "a.test");
    for field in ["x-forwarded-port", "forwarded", "x-real-ip"] {
        assert!(!seen.contains_key(field), "{field}: {seen:?}");
    }

    let trusting = Duet::start(
        &DuetConfig::single("p2c_inflight", &[backend.address()])
            .trusted_proxies(&["127.0.0.0/8"])
            .to_yaml(),
    );
    assert_eq!(get(&trusting.url("/"), &forged).await.0, 200);
    let seen = backend.recorded().pop().expect("request").headers;
    assert_eq!(
        seen["x-forwarded-for"], "6.6.6.6, 127.0.0.1",
        "the chain extended"
    );
    assert_eq!(seen["forwarded"], "for=6.6.6.6");
    // A TLS front proxy says how its client came in: duet's own plain hop must not overwrite it.
    assert_eq!(
        seen["x-forwarded-proto"], "https",
        "as the trusted proxy sent it"
    );
    assert_eq!(
        seen["x-forwarded-host"], "evil.test",
        "as the trusted proxy sent it"
    );
    // A trusted proxy that sends neither gets them set from what duet saw.
    assert_eq!(get(&trusting.url("/"), &[("host", "a.test")]).await.0, 200);
    let seen = backend.recorded().pop().expect("request").headers;
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "a.test");
}

#[test]
fn absolute_form_is_routed_by_config_never_proxied_elsewhere() {
    let backend = Backend::start(BackendOptions::named("only")).expect("backend");
    let config = DuetConfig::new()
        .route(Some("internal.test"), "/", "app")
        .cluster(Cluster::new("app").backend(backend.address()));
    let duet = Duet::start(&config.to_yaml());
    // Asking duet to fetch an arbitrary site: no route matches, nothing is contacted.
    let (response, _) = raw_exchange(
        duet.address,
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    // An absolute-form target naming a configured host goes to that host's configured backend only.
    let (response, _) = raw_exchange(
        duet.address,
        b"GET http://internal.test/x HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("only"), "{response}");
    let seen = backend.recorded();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uri, "/x");
}

#[test]
fn http10_head_204_304_and_expect_continue() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_peak_ewma", &[backend.address()]).to_yaml());
    // HTTP/1.0 without keep-alive: answered, then closed.
    let (response, closed) = raw_exchange(
        duet.address,
        b"GET / HTTP/1.0\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    assert!(response.ends_with("\r\n\r\nb"), "{response}");
    assert!(closed);
    // HEAD: headers with the length, no body.
    let (response, _) = raw_exchange(
        duet.address,
        b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("content-length: 1"), "{response}");
    assert!(
        response.ends_with("\r\n\r\n"),
        "no body after HEAD: {response:?}"
    );
    // 204 and 304 carry no body.
    for code in [204, 304] {
        let request =
            format!("GET /status/{code} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(
            response.starts_with(&format!("HTTP/1.1 {code}")),
            "{response}"
        );
        assert!(response.ends_with("\r\n\r\n"), "{response:?}");
    }
    // Expect: 100-continue: the client hears 100 before sending its body.
    let mut stream = std::net::TcpStream::connect(duet.address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    use std::io::{Read, Write};
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
        .expect("head");
    let mut buffer = [0u8; 1024];
    let n = stream.read(&mut buffer).expect("100");
    assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 100 Continue"));
    stream.write_all(b"hello").expect("body");
    let mut rest = String::new();
    let _ = stream.read_to_string(&mut rest);
    assert!(
        rest.contains("200 OK") && rest.ends_with("\r\n\r\n5"),
        "{rest}"
    );
}

#[test]
fn one_access_log_line_per_request() {
    let backend = Backend::start(BackendOptions::named("logged")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    let (response, _) = raw_exchange(
        duet.address,
        b"GET /bytes/1234 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 200"));
    let expected = format!(
        "duet::access: client=127.0.0.1 method=GET host=x path=/bytes/1234 protocol=HTTP/1.1 \
         status=200 cluster=app route=*/ backend={} tried=- attempts=1 ",
        backend.address()
    );
    let found = support::eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().any(|l| {
            l.contains(&expected) && l.contains(" bytes=1234 bytes_received=0 outcome=complete")
        })
    });
    assert!(
        found,
        "no line with `{expected}` in {:#?}",
        duet.log_lines()
    );
    let access_lines = duet
        .log_lines()
        .iter()
        .filter(|l| l.contains("duet::access"))
        .count();
    assert_eq!(access_lines, 1);
}

/// Splits a text access-log line's fields (` name=value`, the value bare or quoted) the way a log
/// parser would: a quoted value ends at the first `"`, since one inside it is written `\x22`.
fn access_fields(line: &str) -> Vec<(String, String)> {
    let mut rest = line.split_once("duet::access: ").expect("an access line").1;
    let mut fields = Vec::new();
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=').expect("name=value");
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => quoted.split_once('"').expect("a closing quote"),
            None => after.split_once(' ').unwrap_or((after, "")),
        };
        fields.push((name.to_owned(), value.to_owned()));
        rest = after.strip_prefix(' ').unwrap_or(after);
    }
    fields
}

/// Undoes nginx's `\xHH` escapes.
fn unescape(value: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut bytes = value.bytes();
    while let Some(byte) = bytes.next() {
        if byte == b'\\' {
            assert_eq!(bytes.next(), Some(b'x'), "{value}");
            let hex = [bytes.next().expect("hex"), bytes.next().expect("hex")];
            let hex = std::str::from_utf8(&hex).expect("ascii");
            out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
        } else {
            out.push(byte);
        }
    }
    out
}

#[test]
fn client_supplied_text_is_quoted_and_escaped_in_the_access_log() {
    let backend = Backend::start(BackendOptions::named("logged")).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    // Spaces, `=`, quotes, a backslash, a tab, U+2028 (a line separator to some readers) and `é`.
    let agent: &[u8] = b"x status=200 client=6.6.6.6 \"q\" \\ \t\xe2\x80\xa8\xc3\xa9";
    let mut request = b"GET /ua HTTP/1.1\r\nHost: x\r\nUser-Agent: ".to_vec();
    request.extend_from_slice(agent);
    request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, &request, Duration::from_secs(5));
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let line = || {
        duet.log_lines()
            .into_iter()
            .find(|l| l.contains("duet::access") && l.contains("path=/ua"))
    };
    assert!(support::eventually(Duration::from_secs(5), || line().is_some()));
    let line = line().expect("the line");
    let written = r#" user_agent="x status=200 client=6.6.6.6 \x22q\x22 \x5C \x09\xE2\x80\xA8\xC3\xA9" request_id="#;
    assert!(line.contains(written), "{line}");
    let fields = access_fields(&line);
    let names: Vec<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "client",
            "method",
            "host",
            "path",
            "protocol",
            "status",
            "cluster",
            "route",
            "backend",
            "tried",
            "attempts",
            "hedged",
            "duration_ms",
            "upstream_head_ms",
            "bytes",
            "bytes_received",
            "outcome",
            "user_agent",
            "request_id"
        ],
        "{line}"
    );
    let field = |name: &str| &fields.iter().find(|(n, _)| n == name).expect(name).1;
    assert_eq!(field("client"), "127.0.0.1");
    assert_eq!(field("status"), "200");
    assert_eq!(unescape(field("user_agent")), agent, "{line}");
}

#[test]
fn an_interim_1xx_from_the_backend_does_not_break_the_response() {
    let backend =
        duet_testbed::RawBackend::start(duet_testbed::Misbehaviour::EarlyHints).expect("backend");
    let duet = Duet::start(&DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml());
    for _ in 0..3 {
        let response = support::get_root(duet.address);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("\r\n\r\nok"), "{response}");
    }
}

#[test]
fn the_json_access_log_is_flat_with_numbers_and_names_every_backend_tried() {
    let good = Backend::start(BackendOptions::named("good")).expect("backend");
    let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = refused.local_addr().expect("address");
    drop(refused);
    // Round robin over [gone, good]: every other request's first attempt is refused, then retried.
    let duet = Duet::start_with_args(
        &DuetConfig::single("round_robin", &[gone, good.address()]).to_yaml(),
        &["--log-format", "json"],
    );
    for _ in 0..6 {
        let (response, _) = raw_exchange(
            duet.address,
            b"GET /bytes/10 HTTP/1.1\r\nHost: x\r\nUser-Agent: t/1\r\nX-Request-Id: spoofed\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    let (response, _) = raw_exchange(
        duet.address,
        b"POST /bytes/10 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        Duration::from_secs(5),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let entries = || -> Vec<serde_json::Value> {
        duet.log_lines()
            .iter()
            .filter(|l| l.contains("\"target\":\"duet::access\""))
            .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
            .collect()
    };
    assert!(support::eventually(Duration::from_secs(5), || entries()
        .len()
        == 7));
    let post = entries()
        .into_iter()
        .find(|e| e["method"] == "POST")
        .expect("the POST's line");
    assert_eq!(post["bytes_received"], 5, "{post}");
    assert_eq!(post["bytes"], 10, "{post}");
    let entry = entries()
        .into_iter()
        .find(|e| e["attempts"] == 2)
        .expect("a request retried after the refused backend");
    assert!(entry.get("fields").is_none(), "flat: {entry}");
    assert_eq!(entry["status"], 200);
    assert_eq!(entry["attempts"], 2);
    assert_eq!(entry["tried"], gone.to_string());
    assert_eq!(entry["backend"], good.address().to_string());
    assert_eq!(entry["user_agent"], "t/1");
    assert_eq!(entry["outcome"], "complete");
    assert_eq!(entry["bytes"], 10);
    assert_eq!(entry["bytes_received"], 0);
    assert!(entry["duration_ms"].is_f64(), "a number: {entry}");
    assert!(entry["upstream_head_ms"]
        .as_f64()
        .is_some_and(|ms| ms >= 0.0));
    // Not a trusted peer: its id is replaced, and the backend saw the one in the log.
    let id = entry["request_id"].as_str().expect("request id").to_owned();
    assert_eq!(id.len(), 32, "{id}");
    assert!(
        good.recorded()
            .iter()
            .any(|r| r.headers.get("x-request-id").and_then(|v| v.to_str().ok()) == Some(&id)),
        "forwarded to the backend"
    );
}

#[test]
fn the_access_log_goes_to_its_file_and_sigusr1_reopens_it_after_a_rotation() {
    let backend = Backend::start(BackendOptions::named("logged")).expect("backend");
    let dir = std::env::temp_dir().join(format!("duet-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("access.log");
    let duet = Duet::start_with_args(
        &DuetConfig::single("p2c_inflight", &[backend.address()]).to_yaml(),
        &["--access-log", &file.to_string_lossy()],
    );
    let get = |path: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    };
    let lines = |path: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    get("/before");
    assert!(support::eventually(Duration::from_secs(5), || lines(&file)
        .len()
        == 1));
    assert!(
        lines(&file)[0].contains("path=/before"),
        "{:?}",
        lines(&file)
    );
    // logrotate: move the file away, then tell duet.
    let rotated = dir.join("access.log.1");
    std::fs::rename(&file, &rotated).expect("rotate");
    duet.signal("USR1");
    assert!(support::eventually(Duration::from_secs(5), || duet
        .log_lines()
        .iter()
        .any(|l| l.contains("SIGUSR1: reopened the access log"))));
    get("/after");
    assert!(support::eventually(Duration::from_secs(5), || lines(&file)
        .len()
        == 1));
    assert!(lines(&file)[0].contains("path=/after"));
    assert_eq!(
        lines(&rotated).len(),
        1,
        "the old file keeps only what came before"
    );
    assert!(
        !duet.log_lines().iter().any(|l| l.contains("duet::access")),
        "access lines go to the file, not stderr"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #31: a path spelled differently from a route's prefix, but read by the backend as under it,
/// is routed (and forwarded) as the backend reads it, never to a catch-all route in front of the app.
#[test]
fn a_path_is_routed_as_the_backend_decodes_it() {
    let admin = Backend::start(BackendOptions::named("admin")).expect("admin");
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let config = DuetConfig::new()
        .route(None, "/admin", "admin")
        .route(None, "/", "app")
        .cluster(Cluster::new("admin").backend(admin.address()))
        .cluster(Cluster::new("app").backend(app.address()));
    let duet = Duet::start(&config.to_yaml());
    let send = |target: &str| {
        let request = format!("GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5)).0
    };
    for (target, forwarded) in [
        ("/%61dmin/users", "/admin/users"),
        ("/adm%69n/users", "/admin/users"),
        ("/ADM%69n/../%61dmin/users?q=%61", "/admin/users?q=%61"),
        ("//admin/users", "/admin/users"),
        ("/x/../admin", "/admin"),
        ("/x//..//admin//users/", "/admin/users/"),
        ("/%2e%2e/../x/%2E%2e/admin/users", ""),
        ("/x/%2e%2e/admin/%c3%a9", "/admin/%C3%A9"),
    ] {
        let response = send(target);
        if forwarded.is_empty() {
            assert!(response.starts_with("HTTP/1.1 400"), "{target}: {response}");
            continue;
        }
        assert!(response.starts_with("HTTP/1.1 200"), "{target}: {response}");
        assert!(response.ends_with("admin"), "{target}: {response}");
        let seen = admin.recorded().pop().expect("forwarded");
        assert_eq!(seen.uri, forwarded, "{target}");
    }
    assert_eq!(app.requests(), 0, "nothing reached the catch-all route");
}

/// What some backends read as a separator or a dot segment (Tomcat's `;` path parameters, IIS's
/// backslash, an encoded slash, NUL, an overlong UTF-8 dot) cannot be routed unambiguously: 400.
#[test]
fn paths_a_backend_may_read_differently_are_refused() {
    let admin = Backend::start(BackendOptions::named("admin")).expect("admin");
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let config = DuetConfig::new()
        .route(None, "/admin/", "admin")
        .route(None, "/", "app")
        .cluster(Cluster::new("admin").backend(admin.address()))
        .cluster(Cluster::new("app").backend(app.address()));
    let duet = Duet::start(&config.to_yaml());
    let targets = [
        "/..;/admin/users",
        "/public/..;/admin/users",
        "/public/.;/../admin/users",
        "/public/%2e%2E;x=1/admin/users",
        "/admin;x=1/users",
        "/public/;x/admin/users",
        "/public%2f..%2fadmin/users",
        "/public%5c..%5cadmin/users",
        "/public\\..\\admin/users",
        "/public/%00/admin/users",
        "/public/%c0%ae%c0%ae/admin/users",
        "/public/%zz/admin/users",
    ];
    for target in targets {
        let request = format!("GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 400"), "{target}: {response}");
        assert!(response.ends_with("request path\n"), "{target}: {response}");
    }
    assert_eq!((admin.requests(), app.requests()), (0, 0));
    let found = support::eventually(Duration::from_secs(5), || {
        let lines = duet.log_lines();
        let refused = |path: &str, outcome: &str| {
            lines.iter().any(|l| {
                l.contains(&format!(" path={path} "))
                    && l.contains(" status=400 ")
                    && l.contains(&format!(" outcome={outcome}"))
            })
        };
        refused("/..;/admin/users", "ambiguous_path")
            && refused("/public/%zz/admin/users", "invalid_path")
    });
    assert!(found, "{:#?}", duet.log_lines());
    // A path parameter on the last segment (a session id) is no separator: it passes as sent.
    let (response, _) = raw_exchange(
        duet.address,
        b"GET /admin/page;jsessionid=A1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.ends_with("admin"), "{response}");
    assert_eq!(
        admin.recorded().pop().expect("forwarded").uri,
        "/admin/page;jsessionid=A1"
    );
}

/// `api.example.com.` is the same name as `api.example.com` (a fully qualified name, RFC 1034 §3.1).
#[test]
fn a_host_with_a_trailing_dot_routes_like_the_name_without_it() {
    let api = Backend::start(BackendOptions::named("api")).expect("api");
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let config = DuetConfig::new()
        .route(Some("api.example.com"), "/", "api")
        .route(Some("*.example.org"), "/", "api")
        .route(None, "/", "app")
        .cluster(Cluster::new("api").backend(api.address()))
        .cluster(Cluster::new("app").backend(app.address()));
    let duet = Duet::start(&config.to_yaml());
    for host in [
        "api.example.com.",
        "API.Example.Com.:8080",
        "x.example.org.",
    ] {
        let request = format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.ends_with("api"), "{host}: {response}");
    }
    assert_eq!((api.requests(), app.requests()), (3, 0));
}

/// A route limited to one listener does not exist on another: an internal route never answers on the
/// public listener, where the request falls through to the routes that listener has (here none: 404).
#[test]
fn a_route_limited_to_one_listener_is_404_on_the_other() {
    let internal = Backend::start(BackendOptions::named("internal")).expect("internal");
    let web = Backend::start(BackendOptions::named("web")).expect("web");
    let yaml = format!(
        "workers: 2
listeners:
  - {{ name: internal, address: 127.0.0.1:0 }}
  - {{ address: 127.0.0.1:0 }}
routes:
  - {{ match: {{ path_prefix: /admin }}, cluster: internal, listeners: [internal] }}
  - {{ match: {{ path_prefix: /site }}, cluster: web }}
clusters:
  - {{ name: internal, backends: [ {{ address: {} }} ] }}
  - {{ name: web, backends: [ {{ address: {} }} ] }}
",
        internal.address(),
        web.address()
    );
    let duet = Duet::start(&yaml);
    let listening = || -> Vec<std::net::SocketAddr> {
        duet.log_lines()
            .iter()
            .filter_map(|l| l.split("listening on http://").nth(1))
            .filter_map(|rest| rest.split(' ').next()?.parse().ok())
            .collect()
    };
    assert!(
        support::eventually(Duration::from_secs(5), || listening().len() == 2),
        "{:#?}",
        duet.log_lines()
    );
    let listening = listening();
    assert_eq!(listening[0], duet.address);
    let (first, second) = (listening[0], listening[1]);
    let status = |address, path: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(address, request.as_bytes(), Duration::from_secs(5));
        response.get(..12).unwrap_or_default().to_owned()
    };
    // Several connections each, so both workers' sockets answer.
    for _ in 0..4 {
        assert_eq!(status(first, "/admin/users"), "HTTP/1.1 200");
        assert_eq!(status(second, "/admin/users"), "HTTP/1.1 404");
        assert_eq!(status(first, "/site"), "HTTP/1.1 200");
        assert_eq!(status(second, "/site"), "HTTP/1.1 200");
    }
    assert_eq!(internal.requests(), 4, "only the first listener's requests");
    assert_eq!(web.requests(), 8);
}

/// Each matcher beyond host and prefix sends its requests to its own backend, and anything that
/// misses them all falls through to the catch-all.
#[test]
fn exact_regex_method_header_and_query_matchers_each_pick_their_route() {
    let names = [
        "exact", "prefix", "regex", "method", "header", "query", "rest",
    ];
    let backends: Vec<Backend> = names
        .iter()
        .map(|n| Backend::start(BackendOptions::named(n)).expect("backend"))
        .collect();
    let clusters: String = names
        .iter()
        .zip(&backends)
        .map(|(n, b)| {
            format!(
                "  - {{ name: {n}, backends: [ {{ address: {} }} ] }}\n",
                b.address()
            )
        })
        .collect();
    let yaml = format!(
        "workers: 2
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path: {{ exact: /healthz }} }}, cluster: exact }}
  - {{ match: {{ path: {{ prefix: /healthz }} }}, cluster: prefix }}
  - {{ match: {{ path: {{ regex: '^/users/[0-9]+$' }} }}, cluster: regex }}
  - {{ match: {{ method: [DELETE, PUT] }}, cluster: method }}
  - {{ match: {{ headers: {{ x-env: canary, x-user: {{ regex: '^u[0-9]+$' }} }} }}, cluster: header }}
  - {{ match: {{ query: {{ debug: \"1\" }} }}, cluster: query }}
  - {{ cluster: rest }}
clusters:
{clusters}"
    );
    let duet = Duet::start(&yaml);
    let backend_of = |method: &str, target: &str, headers: &str| {
        let request = format!(
            "{method} {target} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.starts_with("HTTP/1.1 200"), "{target}: {response}");
        response
            .lines()
            .find_map(|l| l.strip_prefix("x-backend: "))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let cases = [
        ("GET", "/healthz", "", "exact"),
        ("GET", "/healthz?x=1", "", "exact"),
        ("GET", "/healthz/live", "", "prefix"),
        ("GET", "/users/42", "", "regex"),
        ("GET", "/users/./7", "", "regex"),
        ("GET", "/users/42/x", "", "rest"),
        ("DELETE", "/users/x", "", "method"),
        ("GET", "/a", "X-Env: canary\r\nX-User: u12\r\n", "header"),
        ("GET", "/a", "X-Env: canary\r\nX-User: admin\r\n", "rest"),
        ("GET", "/a", "X-Env: canary\r\n", "rest"),
        ("GET", "/a?b=2&debug=1", "", "query"),
        ("GET", "/a?debug=2", "", "rest"),
    ];
    for (method, target, headers, want) in cases {
        assert_eq!(
            backend_of(method, target, headers),
            want,
            "{method} {target} {headers:?}"
        );
    }
    let counts: Vec<u64> = backends.iter().map(Backend::requests).collect();
    assert_eq!(counts, [2, 1, 2, 1, 1, 1, 4]);
}

/// A redirect route answers itself: the status and `Location` it is written with, the query kept, no
/// backend asked, and one access-log line with outcome `redirect`.
#[test]
fn a_redirect_answers_without_a_backend_and_keeps_the_query() {
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let yaml = format!(
        "workers: 2
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path_prefix: /old/ }}, redirect: {{ path_prefix: /new/, status: 301 }} }}
  - {{ match: {{ host: plain.example.com }}, redirect: {{ scheme: https, status: 308 }} }}
  - {{ match: {{ path: {{ exact: /moved }} }}, redirect: {{ host: other.example.com, port: 8443, path: /here }} }}
  - {{ cluster: app }}
clusters:
  - {{ name: app, backends: [ {{ address: {} }} ] }}
",
        backend.address()
    );
    let duet = Duet::start(&yaml);
    let exchange = |host: &str, target: &str| {
        let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        let status = response.get(9..12).unwrap_or_default().to_owned();
        let location = response
            .lines()
            .find_map(|l| l.strip_prefix("location: "))
            .map(str::to_owned);
        (status, location)
    };
    let cases = [
        (
            "shop.test:8080",
            "/old/a/b?x=1&y",
            "301",
            "http://shop.test:8080/new/a/b?x=1&y",
        ),
        (
            "plain.example.com:80",
            "/cart?id=7",
            "308",
            "https://plain.example.com/cart?id=7",
        ),
        (
            "shop.test",
            "/moved?q=%20",
            "302",
            "http://other.example.com:8443/here?q=%20",
        ),
        (
            "shop.test",
            "/old/../moved",
            "302",
            "http://other.example.com:8443/here",
        ),
    ];
    for (host, target, status, location) in cases {
        let got = exchange(host, target);
        assert_eq!(
            got,
            (status.to_owned(), Some(location.to_owned())),
            "{host}{target}"
        );
    }
    assert_eq!(exchange("shop.test", "/other"), ("200".to_owned(), None));
    assert_eq!(
        backend.requests(),
        1,
        "only the request no redirect matched"
    );
    let redirected = || {
        duet.log_lines()
            .iter()
            .filter(|l| l.contains("duet::access") && l.contains("outcome=redirect"))
            .count()
    };
    assert!(
        support::eventually(Duration::from_secs(5), || redirected() == 4),
        "{:#?}",
        duet.log_lines()
    );
    let lines = duet.log_lines();
    assert!(
        lines.iter().any(|l| l.contains(
            "path=/cart protocol=HTTP/1.1 status=308 cluster=- backend=- tried=- attempts=0 "
        )),
        "{lines:#?}"
    );
}

#[test]
fn an_absolute_target_is_logged_with_the_host_it_was_routed_by() {
    let admin = Backend::start(BackendOptions::named("admin")).expect("admin");
    let www = Backend::start(BackendOptions::named("www")).expect("www");
    let config = DuetConfig::new()
        .route(Some("admin.internal"), "/", "admin")
        .route(None, "/", "www")
        .cluster(Cluster::new("admin").backend(admin.address()))
        .cluster(Cluster::new("www").backend(www.address()));
    let duet = Duet::start(&config.to_yaml());
    let (response, _) = raw_exchange(
        duet.address,
        b"GET http://admin.internal/x HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(response.ends_with("admin"), "{response}");
    let logged = support::eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().any(|l| {
            l.contains("duet::access")
                && l.contains(" host=admin.internal path=/x ")
                && l.contains(" cluster=admin ")
        })
    });
    assert!(logged, "{:#?}", duet.log_lines());
}

#[test]
fn path_parameters_on_the_last_segment_reach_exact_and_regex_routes_as_the_backend_reads_them() {
    // Tomcat and Spring drop `;` parameters from each segment: `/actuator/env;x` is `/actuator/env` to
    // them, so it must take the route `/actuator/env` takes, whatever the route's kind.
    let actuator = Backend::start(BackendOptions::named("actuator")).expect("actuator");
    let users = Backend::start(BackendOptions::named("users")).expect("users");
    let other = Backend::start(BackendOptions::named("other")).expect("other");
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n\
         \x20 - {{ match: {{ path: {{ exact: /actuator/env }} }}, cluster: actuator }}\n\
         \x20 - {{ match: {{ path: {{ regex: '^/users/[0-9]+$' }} }}, cluster: users }}\n\
         \x20 - {{ cluster: other }}\nclusters:\n\
         \x20 - {{ name: actuator, backends: [ {{ address: {} }} ] }}\n\
         \x20 - {{ name: users, backends: [ {{ address: {} }} ] }}\n\
         \x20 - {{ name: other, backends: [ {{ address: {} }} ] }}\n",
        actuator.address(),
        users.address(),
        other.address()
    );
    let duet = Duet::start(&yaml);
    let cases = [
        ("/actuator/env;x", "actuator"),
        ("/actuator/env;", "actuator"),
        ("/actuator/env;a=1?q=2", "actuator"),
        ("/users/42;jsessionid=1", "users"),
        ("/users/42x;jsessionid=1", "other"),
        ("/actuator/env%3Bx", "other"),
    ];
    for (target, backend) in cases {
        let request = format!("GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
        assert!(response.ends_with(backend), "{target}: {response}");
    }
    // The backend gets the path as sent, parameters included, as a prefix route's backend does.
    let seen: Vec<String> = actuator.recorded().into_iter().map(|r| r.uri).collect();
    assert_eq!(
        seen,
        ["/actuator/env;x", "/actuator/env;", "/actuator/env;a=1?q=2"]
    );
}
