//! A route's `limit_methods:`: the methods as written, upper-cased, `HEAD` beside `GET`, each
//! mistake located.

use duet_config::parse;

mod support;
use support::{errors, with_routes};

#[test]
fn methods_are_upper_cased_once_each_with_head_beside_get() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, limit_methods: [get, POST, Get] }\n  \
         - { match: { path_prefix: /b }, cluster: web, limit_methods: [POST, HEAD, GET] }\n  \
         - { match: { path_prefix: /c }, cluster: web, limit_methods: [DELETE] }\n  \
         - { cluster: web }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let written: Vec<String> = (config.routes.iter())
        .map(|r| (r.filters.limit_methods.as_ref()).map_or_else(String::new, ToString::to_string))
        .collect();
    assert_eq!(
        written,
        ["GET, HEAD, POST", "POST, HEAD, GET", "DELETE", ""]
    );
    assert!(config.routes[0]
        .describe_filters()
        .contains(" limit_methods GET,HEAD,POST"));
}

#[test]
fn an_empty_list_a_bad_name_connect_and_a_redirect_are_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, limit_methods: [] }\n  \
         - { match: { path_prefix: /b }, cluster: web, limit_methods: [GET, \"P OST\"] }\n  \
         - { match: { path_prefix: /c }, cluster: web, limit_methods: [GET, connect] }\n  \
         - { match: { path_prefix: /d }, redirect: { scheme: https }, limit_methods: [GET] }",
    ));
    assert_eq!(found.len(), 4, "{found:#?}");
    let starts = [
        "bad.yaml:3:64: routes[0].limit_methods: an empty list serves no method",
        "bad.yaml:4:70: routes[1].limit_methods[1]: `P OST` is not an HTTP method",
        "bad.yaml:5:70: routes[2].limit_methods[1]: duet never forwards CONNECT",
        "bad.yaml:6:79: routes[3].limit_methods: `limit_methods` on a redirect route",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
}
