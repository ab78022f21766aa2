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

/// A page with `intercept: true` also replaces a backend's own response of its statuses: the status
/// stays, the backend's fields and body go (read to the end, so its connection serves the next
/// request). Statuses the page does not list, and pages without `intercept`, pass as the backend
/// wrote them.
#[test]
fn an_intercepting_page_replaces_a_backend_s_answer_and_keeps_its_connection() {
    let web =
        duet_testbed::Backend::start(duet_testbed::BackendOptions::named("web")).expect("web");
    let dir = std::env::temp_dir().join(format!("duet-shaping-intercept-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("folder");
    std::fs::write(dir.join("5xx.html"), "<h1>sorry</h1>").expect("page");
    std::fs::write(dir.join("5xx.json"), r#"{"error":"sorry"}"#).expect("page");
    let d = dir.display();
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - match: {{ path_prefix: /own }}
    cluster: web
    rewrite: {{ path_prefix: / }}
    error_pages: [ {{ status: 5xx, html: {d}/5xx.html }} ]
  - match: {{ path_prefix: / }}
    cluster: web
    error_pages: [ {{ status: 502-504, html: {d}/5xx.html, json: {d}/5xx.json, intercept: true }} ]
clusters:
  - {{ name: web, backends: [ {{ address: {} }} ] }}
",
        web.address()
    );
    let duet = Duet::start(&yaml);
    let get = |path: &str, accept: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\nAccept: {accept}\r\n");
        exchange(&duet, &request)
    };
    let (status, fields, body) = get("/status/503", "text/html");
    assert_eq!((status.as_str(), body.as_str()), ("503", "<h1>sorry</h1>"));
    assert!(
        fields.contains(&"content-type: text/html; charset=utf-8".to_owned()),
        "{fields:?}"
    );
    assert!(
        fields.contains(&"content-length: 14".to_owned()),
        "{fields:?}"
    );
    assert!(
        !fields.iter().any(|f| f.starts_with("x-backend:")),
        "the backend's fields go with its body: {fields:?}"
    );
    let (status, _, body) = get("/status/502", "application/json");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("502", r#"{"error":"sorry"}"#)
    );
    let (status, fields, body) = get("/status/500", "text/html");
    assert_eq!((status.as_str(), body.as_str()), ("500", "status 500\n"));
    assert!(fields.contains(&"x-backend: web".to_owned()), "{fields:?}");
    let (status, _, body) = get("/own/status/503", "text/html");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("503", "status 503\n"),
        "a page without intercept leaves a backend's answer alone"
    );
    assert_eq!(web.requests(), 4);
    assert_eq!(
        web.connections(),
        1,
        "each intercepted body was read to its end and its connection pooled again"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A canned response: its status, its fields, its body, and whether it is sent chunked.
type Canned = (u16, Vec<(&'static str, String)>, Vec<u8>, bool);

/// A backend that answers each request (one per connection) with the canned response for its path:
/// the status line's code, the head's fields and the body; `Content-Length` is added unless
/// `chunked`, then the body goes in 4 KiB chunks.
fn canned_backend(answer: fn(&str) -> Canned) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(500) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            for _ in 0..100 {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let path = first.split(' ').nth(1).unwrap_or("/").to_owned();
            let head_only = first.starts_with("HEAD ");
            let (status, fields, body, chunked) = answer(&path);
            let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n").into_bytes();
            for (name, value) in &fields {
                out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
            }
            let framing = if chunked {
                "Transfer-Encoding: chunked".to_owned()
            } else {
                format!("Content-Length: {}", body.len())
            };
            let no_body = head_only || matches!(status, 204 | 304);
            if !matches!(status, 204 | 304) {
                out.extend_from_slice(format!("{framing}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            if !no_body {
                if chunked {
                    for chunk in body.chunks(4096) {
                        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                        out.extend_from_slice(chunk);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"0\r\n\r\n");
                } else {
                    out.extend_from_slice(&body);
                }
            }
            let _ = stream.write_all(&out);
        }
    });
    address
}

/// Text that compresses as a page does: words repeating in varying order.
fn page_text(len: usize) -> Vec<u8> {
    let words = [
        "duet", "balances", "requests", "over", "backends", "<p>", "</p>", "and", "streams",
        "bodies",
    ];
    let mut text = Vec::with_capacity(len + 16);
    let mut seed = 7u64;
    while text.len() < len {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.extend_from_slice(words[(seed >> 33) as usize % words.len()].as_bytes());
        text.push(if seed.is_multiple_of(5) { b'\n' } else { b' ' });
    }
    text.truncate(len);
    text
}

fn shaped_answer(path: &str) -> Canned {
    let html = ("Content-Type", "text/html; charset=utf-8".to_owned());
    let page = page_text(20_000);
    match path {
        "/text" => (200, vec![html, ("ETag", "\"v1\"".to_owned())], page, false),
        "/stream" => (
            200,
            vec![("Content-Type", "application/json".to_owned())],
            page_text(1 << 20),
            true,
        ),
        "/small" => (200, vec![html], page_text(100), false),
        "/encoded" => (
            200,
            vec![html, ("Content-Encoding", "gzip".to_owned())],
            page,
            false,
        ),
        "/no-transform" => (
            200,
            vec![html, ("Cache-Control", "public, no-transform".to_owned())],
            page,
            false,
        ),
        "/image" => (
            200,
            vec![("Content-Type", "image/png".to_owned())],
            page,
            false,
        ),
        "/range" => (
            206,
            vec![html, ("Content-Range", "bytes 0-19999/40000".to_owned())],
            page,
            false,
        ),
        "/empty" => (204, vec![html], Vec::new(), false),
        "/unchanged" => (304, vec![html], Vec::new(), false),
        "/grpc" => (
            200,
            vec![("Content-Type", "application/grpc".to_owned())],
            page,
            false,
        ),
        _ => (404, vec![html], b"none".to_vec(), false),
    }
}

/// `data` decoded from `coding` by Python's own decoders (`gzip`, `brotli`, `zstandard`).
fn python_decoded(coding: &str, data: &[u8]) -> Vec<u8> {
    let file = std::env::temp_dir().join(format!("duet-shaping-{}-{coding}", std::process::id()));
    std::fs::write(&file, data).expect("write");
    let script = "import sys, gzip\n\
                  data = open(sys.argv[2], 'rb').read()\n\
                  if sys.argv[1] == 'gzip': out = gzip.decompress(data)\n\
                  elif sys.argv[1] == 'br':\n    import brotli; out = brotli.decompress(data)\n\
                  else:\n    import zstandard; out = zstandard.ZstdDecompressor().decompressobj().decompress(data)\n\
                  sys.stdout.buffer.write(out)\n";
    let output = std::process::Command::new("python3")
        .args(["-c", script, coding])
        .arg(&file)
        .output()
        .expect("python3");
    let _ = std::fs::remove_file(&file);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Whether python3 has `brotli` and `zstandard`; without them the test is skipped with a note, unless
/// `DUET_REQUIRE_PYTHON_CODECS` says CI installed them.
fn python_codecs() -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", "import brotli, zstandard"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("DUET_REQUIRE_PYTHON_CODECS").is_none(),
            "python3 brotli and zstandard are required here"
        );
        eprintln!("SKIPPED: python3 lacks brotli or zstandard (pip install brotli zstandard)");
    }
    found
}

/// Whether curl is here and decodes brotli and zstd; without it the curl check is skipped with a
/// note, unless `DUET_REQUIRE_CURL_CODECS` says CI installed it.
fn curl_codecs() -> bool {
    let version = std::process::Command::new("curl").arg("-V").output();
    let features = version.map_or_else(
        |_| String::new(),
        |o| String::from_utf8_lossy(&o.stdout).into_owned(),
    );
    let found = ["brotli", "zstd"].iter().all(|f| features.contains(f));
    if !found {
        assert!(
            std::env::var_os("DUET_REQUIRE_CURL_CODECS").is_none(),
            "curl with brotli and zstd is required here"
        );
        eprintln!("SKIPPED: curl is missing or lacks brotli/zstd (apt-get install curl)");
    }
    found
}

/// The body curl's `--compressed` decodes from `url` when it offers only `coding`, and the coding
/// the answer carried.
fn curl_decoded(url: &str, coding: &str) -> (String, Vec<u8>) {
    let output = std::process::Command::new("curl")
        .args(["-s", "--compressed", "-D", "/dev/stderr", "-H"])
        .arg(format!("Accept-Encoding: {coding}"))
        .arg(url)
        .output()
        .expect("curl");
    assert!(output.status.success(), "curl {url}: {:?}", output.status);
    let head = String::from_utf8_lossy(&output.stderr).to_ascii_lowercase();
    let sent = (head.lines())
        .find_map(|l| l.strip_prefix("content-encoding:"))
        .map_or_else(String::new, |v| v.trim().to_owned());
    (sent, output.stdout)
}

fn field<'a>(headers: &'a http::HeaderMap, name: &str) -> Vec<&'a str> {
    (headers.get_all(name).iter())
        .map(|v| v.to_str().unwrap_or_default())
        .collect()
}

/// Each coding by `Accept-Encoding` with q-values, decoded by Python and by `curl --compressed` to
/// the exact bytes, a streamed response of unknown length included, with `Vary`, a weak `ETag` and no `Content-Length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_compresses_by_accept_encoding_to_the_exact_bytes() {
    if !python_codecs() {
        return;
    }
    let backend = canned_backend(shaped_answer);
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ cluster: web, compress: {{ gzip_level: 6 }} }}
clusters:
  - {{ name: web, backends: [ {{ address: {backend} }} ] }}
"
    );
    let duet = Duet::start(&yaml);
    let rows = [
        ("gzip", Some("gzip")),
        ("br", Some("br")),
        ("zstd", Some("zstd")),
        ("gzip;q=0.5, br;q=0.9", Some("br")),
        ("gzip, zstd;q=0", Some("gzip")),
        ("*;q=0.1, gzip;q=0", Some("zstd")),
        ("gzip, deflate, br, zstd", Some("zstd")),
        ("identity", None),
        ("br;q=0, gzip;q=0", None),
    ];
    let expected = page_text(20_000);
    for (accept, coding) in rows {
        let (status, headers, body) =
            support::get(&duet.url("/text"), &[("accept-encoding", accept)]).await;
        assert_eq!(status, 200, "{accept}");
        assert_eq!(field(&headers, "vary"), ["Accept-Encoding"], "{accept}");
        match coding {
            Some(coding) => {
                assert_eq!(field(&headers, "content-encoding"), [coding], "{accept}");
                assert_eq!(field(&headers, "etag"), ["W/\"v1\""], "{accept}");
                assert!(headers.get("content-length").is_none(), "{accept}");
                assert!(
                    body.len() < expected.len() / 2,
                    "{accept}: {} bytes",
                    body.len()
                );
                assert!(
                    python_decoded(coding, &body) == expected,
                    "{accept}: decoded differs"
                );
            }
            None => {
                assert!(headers.get("content-encoding").is_none(), "{accept}");
                assert_eq!(field(&headers, "etag"), ["\"v1\""], "{accept}");
                assert_eq!(&body[..], &expected[..], "{accept}");
            }
        }
    }
    let streamed = page_text(1 << 20);
    if curl_codecs() {
        for (path, body) in [("/text", &expected), ("/stream", &streamed)] {
            for coding in ["gzip", "br", "zstd"] {
                let (sent, decoded) = curl_decoded(&duet.url(path), coding);
                assert_eq!(sent, coding, "curl {path}");
                assert!(
                    &decoded == body,
                    "curl --compressed {path} {coding}: decoded differs"
                );
            }
        }
    }
    for coding in ["gzip", "br", "zstd"] {
        let (status, headers, body) =
            support::get(&duet.url("/stream"), &[("accept-encoding", coding)]).await;
        assert_eq!(
            (status, field(&headers, "content-encoding")),
            (200, vec![coding])
        );
        assert!(
            python_decoded(coding, &body) == streamed,
            "{coding}: decoded differs"
        );
    }
}

/// Each response that must not be compressed, one by one: it arrives byte for byte as the backend
/// sent it, with no `Content-Encoding` added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_must_not_be_compressed_passes_as_it_came() {
    let backend = canned_backend(shaped_answer);
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ cluster: web, compress: {{}} }}
clusters:
  - {{ name: web, backends: [ {{ address: {backend} }} ] }}
"
    );
    let duet = Duet::start(&yaml);
    let gzip = ("accept-encoding", "gzip, br, zstd");
    type Fields<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, Fields<'_>, u16, &[&str]); 9] = [
        ("/small", &[gzip], 200, &[]),
        ("/encoded", &[gzip], 200, &["gzip"]),
        ("/no-transform", &[gzip], 200, &[]),
        (
            "/text",
            &[gzip, ("cache-control", "no-transform")],
            200,
            &[],
        ),
        ("/image", &[gzip], 200, &[]),
        ("/range", &[gzip], 206, &[]),
        ("/text", &[gzip, ("range", "bytes=0-99")], 200, &[]),
        ("/empty", &[gzip], 204, &[]),
        ("/unchanged", &[gzip], 304, &[]),
    ];
    for (path, headers, status, encoding) in cases {
        let (got, fields, body) = support::get(&duet.url(path), headers).await;
        let (_, _, sent, _) = shaped_answer(path);
        assert_eq!(got, status, "{path} {headers:?}");
        assert_eq!(
            field(&fields, "content-encoding"),
            encoding,
            "{path} {headers:?}"
        );
        assert_eq!(&body[..], &sent[..], "{path} {headers:?}");
        if !matches!(status, 204 | 304) {
            assert_eq!(
                field(&fields, "content-length"),
                [sent.len().to_string()],
                "{path} {headers:?}"
            );
        }
    }
    let grpc = [
        gzip,
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    let (_, fields, body) = support::get(&duet.url("/grpc"), &grpc).await;
    assert!(fields.get("content-encoding").is_none(), "{fields:?}");
    assert_eq!(body.len(), 20_000);
    let (status, fields, body) = exchange(
        &duet,
        "HEAD /text HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n",
    );
    assert_eq!((status.as_str(), body.as_str()), ("200", ""));
    assert!(
        !fields.iter().any(|f| f.starts_with("content-encoding")),
        "{fields:?}"
    );
    assert!(
        fields.contains(&"content-length: 20000".to_owned()),
        "{fields:?}"
    );
}
