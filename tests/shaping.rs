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
