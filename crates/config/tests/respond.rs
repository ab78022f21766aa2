//! A route's `respond:`: a route that answers itself needs no cluster; its body written or read from a
//! file; each mistake located.

use duet_config::{parse, Action};

mod support;
use support::{errors, with_routes};

#[test]
fn a_route_answers_with_its_body_or_file_and_names_no_cluster() {
    let dir = tempfile_dir();
    let page = dir.join("down.html");
    std::fs::write(&page, "<p>back soon</p>").expect("write page");
    let yaml = with_routes(&format!(
        "routes:\n  \
         - {{ match: {{ path: {{ exact: /healthz }} }}, respond: {{ body: ok }} }}\n  \
         - {{ match: {{ path_prefix: /shop }}, respond: {{ status: 503, file: {} }} }}\n  \
         - {{ match: {{ path_prefix: /api }}, respond: {{ status: 404, body: '{{}}', content_type: application/json }} }}\n  \
         - {{ cluster: web }}",
        page.display()
    ));
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let answers: Vec<_> = (config.routes.iter())
        .map(|r| {
            r.filters.respond.as_ref().map(|a| {
                let body = String::from_utf8_lossy(&a.body).into_owned();
                (a.status, a.content_type.clone(), body)
            })
        })
        .collect();
    let answer = |status, content_type: &str, body: &str| {
        Some((status, content_type.to_owned(), body.to_owned()))
    };
    assert_eq!(
        answers,
        [
            answer(200, "text/plain; charset=utf-8", "ok"),
            answer(503, "text/html; charset=utf-8", "<p>back soon</p>"),
            answer(404, "application/json", "{}"),
            None,
        ]
    );
    assert_eq!(config.routes[0].action, Action::Respond);
    assert!(config.routes[1]
        .describe_filters()
        .contains(" respond 503 file "));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_cluster_beside_it_a_missing_file_both_bodies_and_a_bad_status_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, respond: { body: ok } }\n  \
         - { match: { path_prefix: /b }, respond: { file: /nonexistent/duet/page.html } }\n  \
         - { match: { path_prefix: /c }, respond: { body: x, file: /etc/hostname } }\n  \
         - { match: { path_prefix: /d }, respond: { status: 99 } }\n  \
         - { match: { path_prefix: /e }, respond: { status: 204, body: x } }\n  \
         - { match: { path_prefix: /f }, respond: { bdy: x } }",
    ));
    let starts = [
        "bad.yaml:3:44: routes[0].cluster: both `respond` and `cluster`",
        "bad.yaml:4:52: routes[1].respond.file: cannot read `/nonexistent/duet/page.html`",
        "bad.yaml:5:61: routes[2].respond.file: both `body` and `file`",
        "bad.yaml:6:54: routes[3].respond.status: 99 is out of range: expected 200 to 599",
        "bad.yaml:7:65: routes[4].respond.body: a 204 has no body",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    assert!(found.iter().any(|e| e.contains("bdy")), "{found:#?}");
    assert_eq!(found.len(), 6, "{found:#?}");
}

/// A fresh folder for this test's files.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("duet-respond-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create folder");
    dir
}
