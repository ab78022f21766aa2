//! CORS at the edge, through the real binary to a real backend: duet answers an allowed origin's
//! preflight itself, adds the fields to the backend's answers for an allowed origin only, and marks
//! every answer `Vary: Origin`; a disallowed origin is served without them.

use crate::support::{self, raw_exchange, Duet};
use duet_testbed::{Backend, BackendOptions};
use std::{net::SocketAddr, time::Duration};

/// `request` sent on its own connection (`Connection: close` is added): the status and the head's
/// CORS and `Vary` field lines, names lowercased, in order.
fn exchange(duet: &Duet, request: &str) -> (String, Vec<String>) {
    let request = format!("{request}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let status = response.get(9..12).unwrap_or_default().to_owned();
    let fields = (head.lines().skip(1))
        .filter_map(|l| l.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim()))
        .filter(|(name, _)| name.starts_with("access-control-") || name == "vary")
        .map(|(name, value)| format!("{name}: {value}"))
        .collect();
    (status, fields)
}

/// An address nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address")
}

fn config(app: SocketAddr) -> String {
    format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - match: {{ path_prefix: /api }}
    cluster: app
    cors:
      allow_origins: [https://a.example, \"https://*.example.com\"]
      allow_methods: [GET, PUT, DELETE]
      allow_headers: [Content-Type, X-Token]
      expose_headers: [X-Request-Id]
      allow_credentials: true
      max_age: 10m
  - match: {{ path_prefix: /down }}
    cluster: down
    cors: {{ allow_origins: [https://a.example] }}
  - match: {{ path_prefix: /public }}
    cluster: app
    cors: {{ allow_origins: [\"*\"] }}
clusters:
  - {{ name: app, backends: [ {{ address: {app} }} ] }}
  - {{ name: down, backends: [ {{ address: {} }} ], retries: {{ attempts: 1 }} }}
",
        closed_port()
    )
}

const PREFLIGHT: &str = "OPTIONS /api/items HTTP/1.1\r\nHost: h\r\n\
    Access-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: x-token\r\n";

#[test]
fn an_allowed_origin_s_preflight_is_answered_by_duet_and_a_disallowed_one_reaches_the_backend() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let duet = Duet::start(&config(app.address()));
    let policy = |origin: &str| {
        vec![
            format!("access-control-allow-origin: {origin}"),
            "access-control-allow-credentials: true".to_owned(),
            "vary: Origin".to_owned(),
            "access-control-allow-methods: GET, PUT, DELETE".to_owned(),
            "access-control-allow-headers: content-type, x-token".to_owned(),
            "access-control-max-age: 600".to_owned(),
        ]
    };
    for origin in ["https://a.example", "https://deep.sub.example.com"] {
        let (status, fields) = exchange(&duet, &format!("{PREFLIGHT}Origin: {origin}\r\n"));
        assert_eq!(
            (status.as_str(), fields),
            ("204", policy(origin)),
            "{origin}"
        );
    }
    assert_eq!(
        app.requests(),
        0,
        "no preflight from an allowed origin reaches the backend"
    );

    for origin in [
        "https://b.example",
        "https://example.com",
        "http://a.example",
        "null",
    ] {
        let (status, fields) = exchange(&duet, &format!("{PREFLIGHT}Origin: {origin}\r\n"));
        assert_eq!(
            (status.as_str(), fields),
            ("200", vec!["vary: Origin".to_owned()]),
            "{origin}"
        );
    }
    assert_eq!(
        app.requests(),
        4,
        "each disallowed preflight is the backend's to answer"
    );
    assert!(app.recorded().iter().all(|r| r.method == "OPTIONS"));
    let preflights = || {
        (duet.log_lines().iter())
            .filter(|l| l.contains("duet::access") && l.contains("outcome=cors_preflight"))
            .count()
    };
    assert!(
        support::eventually(Duration::from_secs(5), || preflights() == 2),
        "{:#?}",
        duet.log_lines()
    );
}

#[test]
fn an_allowed_origin_s_request_gets_the_fields_on_the_backend_s_answer_and_duet_s_own() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let duet = Duet::start(&config(app.address()));
    let get = |path: &str, origin: Option<&str>| {
        let origin = origin
            .map(|o| format!("Origin: {o}\r\n"))
            .unwrap_or_default();
        exchange(
            &duet,
            &format!("GET {path} HTTP/1.1\r\nHost: h\r\n{origin}"),
        )
    };
    let vary = || vec!["vary: Origin".to_owned()];
    let (status, fields) = get("/api/items", Some("https://x.example.com"));
    assert_eq!(status, "200");
    assert_eq!(
        fields,
        [
            "vary: Origin",
            "access-control-allow-origin: https://x.example.com",
            "access-control-allow-credentials: true",
            "access-control-expose-headers: x-request-id",
        ]
    );
    // Served as usual, without the fields the browser would need to show it to the page.
    assert_eq!(
        get("/api/items", Some("https://evil.example")),
        ("200".to_owned(), vary())
    );
    assert_eq!(get("/api/items", None), ("200".to_owned(), vary()));
    assert_eq!(app.requests(), 3, "the backend served all three");
    // Any origin, no credentials: `*`, the same for every page.
    let (status, fields) = get("/public/x", Some("https://anyone.example"));
    assert_eq!(status, "200");
    assert_eq!(fields, ["vary: Origin", "access-control-allow-origin: *"]);
    // duet's own answer for a cluster that cannot answer carries them too, so the page can read why.
    let (status, fields) = get("/down/x", Some("https://a.example"));
    assert_eq!(status, "502");
    assert_eq!(
        fields,
        [
            "access-control-allow-origin: https://a.example",
            "vary: Origin"
        ]
    );
}

/// A page of another origin calling the route through `fetch` in headless Chromium (skipped with a
/// note where none is installed).
#[test]
fn a_browser_lets_an_allowed_page_read_the_answers_and_blocks_a_disallowed_one() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let dir = std::env::temp_dir().join(format!("duet-cors-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("folder");
    let page = dir.join("page.html");
    std::fs::write(&page, crate::browser::CORS_PAGE).expect("page");
    // The allowed origin names the port, so the port is chosen before duet binds it.
    let port = closed_port().port();
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:{port} }} ]
routes:
  - {{ match: {{ host: \"*.localhost\", path_prefix: /page }}, respond: {{ file: {} }} }}
  - match: {{ host: 127.0.0.1, path_prefix: /api }}
    cluster: app
    cors: {{ allow_origins: [\"http://page.localhost:{port}\"], allow_methods: [GET, PUT], allow_headers: [x-token], allow_credentials: true }}
clusters:
  - {{ name: app, backends: [ {{ address: {} }} ] }}
",
        page.display(),
        app.address()
    );
    let duet = Duet::start(&yaml);
    crate::browser::check_cors(duet.address, || app.requests());
    drop(duet);
    let _ = std::fs::remove_dir_all(&dir);
}
