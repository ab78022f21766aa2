//! A route's `hsts:`: the field's value as written, defaults where left out, each mistake located.

use duet_config::parse;

mod support;
use support::{errors, with_routes};

#[test]
fn the_field_is_written_as_configured_with_a_year_by_default() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, hsts: {} }\n  \
         - { match: { path_prefix: /b }, cluster: web, hsts: { max_age: 10m, include_subdomains: true } }\n  \
         - { match: { path_prefix: /c }, cluster: web, hsts: { max_age: 8760h, include_subdomains: true, preload: true } }\n  \
         - { cluster: web }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let written: Vec<String> = (config.routes.iter())
        .map(|r| r.filters.hsts.map(|h| h.to_string()).unwrap_or_default())
        .collect();
    assert_eq!(
        written,
        [
            "max-age=31536000",
            "max-age=600; includeSubDomains",
            "max-age=31536000; includeSubDomains; preload",
            "",
        ]
    );
    assert!(config.routes[1]
        .describe_filters()
        .contains(" hsts max-age=600"));
}

#[test]
fn a_zero_age_a_premature_preload_a_redirect_and_an_unknown_key_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, hsts: { max_age: 0 } }\n  \
         - { match: { path_prefix: /b }, cluster: web, hsts: { preload: true } }\n  \
         - { match: { path_prefix: /c }, redirect: { scheme: https }, hsts: {} }\n  \
         - { cluster: web, hsts: { maxage: 1h } }",
    ));
    assert_eq!(found.len(), 4, "{found:#?}");
    let starts = [
        "bad.yaml:3:66: routes[0].hsts.max_age: `0` tells browsers to forget",
        "bad.yaml:4:66: routes[1].hsts.preload: the browsers' preload lists take only",
        "bad.yaml:5:70: routes[2].hsts: a redirect route answers itself",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    assert!(found.iter().any(|e| e.contains("maxage")), "{found:#?}");
}
