//! A route's `error_pages:`: statuses, classes and ranges, files read with the config, each mistake
//! located.

use duet_config::parse;

mod support;
use support::{errors, with_routes};

#[test]
fn pages_are_read_with_their_statuses_in_the_order_written() {
    let dir = std::env::temp_dir().join(format!("duet-error-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("folder");
    std::fs::write(dir.join("5xx.html"), "<h1>down</h1>").expect("page");
    std::fs::write(dir.join("5xx.json"), "{}").expect("page");
    let yaml = with_routes(&format!(
        "routes:\n  \
         - {{ cluster: web, error_pages: [ {{ status: 502-504, json: {d}/5xx.json }}, {{ status: 5xx, html: {d}/5xx.html, json: {d}/5xx.json }}, {{ status: 429, html: {d}/5xx.html, intercept: true }} ] }}",
        d = dir.display()
    ));
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let pages = &config.routes[0]
        .filters
        .error_pages
        .as_ref()
        .expect("pages")
        .pages;
    let written: Vec<_> = (pages.iter())
        .map(|p| {
            let body = |page: &Option<duet_config::filter::error_pages::Page>| {
                page.as_ref().map(|p| {
                    (
                        String::from_utf8_lossy(&p.body).into_owned(),
                        p.content_type,
                    )
                })
            };
            (p.statuses, body(&p.html), body(&p.json))
        })
        .collect();
    let html = Some(("<h1>down</h1>".to_owned(), "text/html; charset=utf-8"));
    let json = Some(("{}".to_owned(), "application/json"));
    assert_eq!(
        written,
        [
            ((502, 504), None, json.clone()),
            ((500, 599), html.clone(), json),
            ((429, 429), html, None),
        ]
    );
    assert!(pages[1].covers(599) && !pages[1].covers(499));
    let intercepting: Vec<bool> = pages.iter().map(|p| p.intercept).collect();
    assert_eq!(intercepting, [false, false, true], "off unless written");
    assert!(config.routes[0]
        .describe_filters()
        .ends_with(" error_pages 502-504,5xx,429+backend"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_bad_status_a_missing_file_no_format_and_an_empty_list_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, error_pages: [ { status: 302, html: /etc/hostname } ] }\n  \
         - { match: { path_prefix: /b }, cluster: web, error_pages: [ { status: 5xx, html: /nonexistent/duet/5xx.html } ] }\n  \
         - { match: { path_prefix: /c }, cluster: web, error_pages: [ { status: 6xx, json: /etc/hostname } ] }\n  \
         - { match: { path_prefix: /d }, cluster: web, error_pages: [ { status: 404 } ] }\n  \
         - { match: { path_prefix: /e }, cluster: web, error_pages: [] }\n  \
         - { match: { path_prefix: /f }, cluster: web, error_pages: [ { status: 502, html: /etc/hostname, intercept: maybe } ] }",
    ));
    let starts = [
        "bad.yaml:3:74: routes[0].error_pages[0].status: `302` is not an error status",
        "bad.yaml:4:85: routes[1].error_pages[0].html: cannot read `/nonexistent/duet/5xx.html`",
        "bad.yaml:5:74: routes[2].error_pages[0].status: `6xx` is not an error status",
        "bad.yaml:6:64: routes[3].error_pages[0]: a page needs `html`, `json` or both",
        "bad.yaml:7:62: routes[4].error_pages: an empty list",
        "bad.yaml:8:111: routes[5].error_pages[0].intercept: `maybe` is not a boolean",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    assert_eq!(found.len(), 6, "{found:#?}");
}
