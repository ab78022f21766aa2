//! A route's `cors:`: the policy as written, defaults where left out, each mistake located.

use duet_config::parse;

mod support;
use support::{errors, with_routes};

#[test]
fn the_policy_is_read_with_safelisted_methods_by_default() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, cors: { allow_origins: [\"https://A.example\", \"https://*.example.com:8443\"] } }\n  \
         - { match: { path_prefix: /b }, cluster: web, cors: { allow_origins: [\"*\"], allow_headers: [\"*\"], max_age: 1h, expose_headers: [X-Total] } }\n  \
         - { cluster: web }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let described: Vec<String> = (config.routes.iter())
        .map(|r| r.describe_filters())
        .collect();
    assert_eq!(
        described,
        [
            " cors https://a.example,https://*.example.com:8443 methods GET,HEAD,POST",
            " cors * methods GET,HEAD,POST headers * expose x-total max-age 3600",
            "",
        ]
    );
}

#[test]
fn star_with_credentials_bad_origins_and_a_missing_list_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, cors: { allow_origins: [\"*\"], allow_credentials: true } }\n  \
         - { match: { path_prefix: /b }, cluster: web, cors: { allow_origins: [https://a.example/] } }\n  \
         - { match: { path_prefix: /c }, cluster: web, cors: { allow_methods: [GET] } }\n  \
         - { match: { path_prefix: /d }, cluster: web, cors: { allow_origins: [\"https://a.*.example\"], allow_methods: [\"G T\"] } }\n  \
         - { cluster: web, cors: { allow_origin: [https://a.example] } }",
    ));
    let starts = [
        "bad.yaml:3:73: routes[0].cors.allow_origins[0]: `*` with `allow_credentials: true`",
        "bad.yaml:4:73: routes[1].cors.allow_origins[0]: `https://a.example/` is not an origin",
        "bad.yaml:5:55: routes[2].cors: `allow_origins` is missing",
        "bad.yaml:6:73: routes[3].cors.allow_origins[0]: `https://a.*.example` is not an origin",
        "bad.yaml:6:113: routes[3].cors.allow_methods[0]: `G T` is not a method",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    assert!(
        found.iter().any(|e| e.contains("allow_origin")),
        "{found:#?}"
    );
}
