//! Responses shaped at the edge: direct responses, error pages and compression, through the real
//! binary to real backends, byte for byte.

use crate::support::{self, raw_exchange, Duet};
use std::time::Duration;

/// `request` sent on its own connection (`Connection: close` is added): the status, the head's field
/// lines (lowercased names) and the body.
fn exchange(duet: &Duet, request: &str) -> (String, Vec<String>, String) {
    let request = format!("{request}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.get(9..12).unwrap_or_default().to_owned();
    let fields = (head.lines().skip(1))
        .map(|l| match l.split_once(':') {
            Some((name, value)) => format!("{}:{value}", name.to_ascii_lowercase()),
            None => l.to_owned(),
        })
        .collect();
    (status, fields, body.to_owned())
}

/// A direct response needs no cluster: the body as written or read from a file, its length to a
/// `HEAD` without the body, and a file read again on reload.
#[test]
fn a_route_answers_itself_and_a_reload_reads_its_file_again() {
    let dir = std::env::temp_dir().join(format!("duet-shaping-respond-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("folder");
    let page = dir.join("down.html");
    std::fs::write(&page, "<p>back soon</p>").expect("page");
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path: {{ exact: /healthz }} }}, respond: {{ body: ok }} }}
  - {{ match: {{ path_prefix: / }}, respond: {{ status: 503, file: {} }} }}
",
        page.display()
    );
    let duet = Duet::start(&yaml);
    let (status, fields, body) = exchange(&duet, "GET /healthz HTTP/1.1\r\nHost: a\r\n");
    assert_eq!((status.as_str(), body.as_str()), ("200", "ok"));
    assert!(
        fields.contains(&"content-type: text/plain; charset=utf-8".to_owned()),
        "{fields:?}"
    );
    assert!(
        fields.contains(&"content-length: 2".to_owned()),
        "{fields:?}"
    );
    let (status, fields, body) = exchange(&duet, "HEAD /healthz HTTP/1.1\r\nHost: a\r\n");
    assert_eq!((status.as_str(), body.as_str()), ("200", ""));
    assert!(
        fields.contains(&"content-length: 2".to_owned()),
        "{fields:?}"
    );
    let (status, fields, body) = exchange(&duet, "GET /shop HTTP/1.1\r\nHost: a\r\n");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("503", "<p>back soon</p>")
    );
    assert!(
        fields.contains(&"content-type: text/html; charset=utf-8".to_owned()),
        "{fields:?}"
    );
    std::fs::write(&page, "<p>open</p>").expect("page");
    duet.signal("HUP");
    let reread = support::eventually(Duration::from_secs(5), || {
        exchange(&duet, "GET /shop HTTP/1.1\r\nHost: a\r\n").2 == "<p>open</p>"
    });
    assert!(reread, "{:#?}", duet.log_lines());
    let logged = || {
        (duet.log_lines().iter())
            .filter(|l| l.contains("duet::access") && l.contains("outcome=respond"))
            .count()
    };
    assert!(
        support::eventually(Duration::from_secs(5), || logged() >= 4),
        "{:#?}",
        duet.log_lines()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// duet's own errors on a route with `error_pages:` take the page for their status in the format the
/// request's `Accept` prefers; a backend's answer, a route without pages and a gRPC call keep theirs;
/// a reload reads the pages again.
#[test]
fn duet_s_own_errors_take_the_route_s_page_by_status_and_accept() {
    let web =
        duet_testbed::Backend::start(duet_testbed::BackendOptions::named("web")).expect("web");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let dir = std::env::temp_dir().join(format!("duet-shaping-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("folder");
    std::fs::write(dir.join("5xx.html"), "<h1>down</h1>").expect("page");
    std::fs::write(dir.join("5xx.json"), r#"{"error":"down"}"#).expect("page");
    std::fs::write(dir.join("403.html"), "<h1>not you</h1>").expect("page");
    let d = dir.display();
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - match: {{ path_prefix: /down }}
    cluster: gone
    error_pages: [ {{ status: 5xx, html: {d}/5xx.html, json: {d}/5xx.json }} ]
  - match: {{ path_prefix: /denied }}
    cluster: web
    deny: [ 127.0.0.1 ]
    error_pages: [ {{ status: 403, html: {d}/403.html }}, {{ status: 4xx, json: {d}/5xx.json }} ]
  - match: {{ path_prefix: /plain }}
    cluster: gone
  - match: {{ path_prefix: / }}
    cluster: web
    error_pages: [ {{ status: 5xx, html: {d}/5xx.html }} ]
clusters:
  - {{ name: gone, backends: [ {{ address: {closed} }} ] }}
  - {{ name: web, backends: [ {{ address: {} }} ] }}
",
        web.address()
    );
    let duet = Duet::start(&yaml);
    let get = |path: &str, accept: &str| {
        let accept = match accept {
            "" => String::new(),
            accept => format!("Accept: {accept}\r\n"),
        };
        exchange(
            &duet,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\n{accept}"),
        )
    };
    let has = |fields: &[String], field: &str| fields.iter().any(|f| f == field);
    let (status, fields, body) = get("/down", "text/html,*/*;q=0.8");
    assert_eq!((status.as_str(), body.as_str()), ("502", "<h1>down</h1>"));
    assert!(
        has(&fields, "content-type: text/html; charset=utf-8"),
        "{fields:?}"
    );
    assert!(has(&fields, "content-length: 13"), "{fields:?}");
    let (status, fields, body) = get("/down", "application/json");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("502", r#"{"error":"down"}"#)
    );
    assert!(has(&fields, "content-type: application/json"), "{fields:?}");
    assert_eq!(get("/down", "").2, "<h1>down</h1>", "no Accept: HTML");
    // The first page listing the status, in its one format whatever the client prefers.
    let (status, _, body) = get("/denied", "application/json");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("403", "<h1>not you</h1>")
    );
    let (status, _, body) = get("/plain", "text/html");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("502", "backend unreachable\n")
    );
    let (status, _, body) = get("/ok", "text/html");
    assert_eq!(status, "200");
    assert!(!body.contains("down"), "{body}");
    let grpc = "POST /down/x.Svc/Call HTTP/1.1\r\nHost: a\r\nContent-Type: application/grpc\r\n\
                TE: trailers\r\nContent-Length: 0\r\n";
    let (status, fields, body) = exchange(&duet, grpc);
    assert_eq!(status, "200", "{fields:?}");
    assert!(
        fields.iter().any(|f| f.starts_with("grpc-status:")),
        "{fields:?}"
    );
    assert!(!body.contains("down"), "{body}");
    std::fs::write(dir.join("5xx.html"), "<h1>still down</h1>").expect("page");
    duet.signal("HUP");
    let reread = support::eventually(Duration::from_secs(5), || {
        get("/down", "text/html").2 == "<h1>still down</h1>"
    });
    assert!(reread, "{:#?}", duet.log_lines());
    let _ = std::fs::remove_dir_all(dir);
}
