//! `max_request_body` on a route and in `limits`: which applies, and a bad size located.

use duet_config::parse;

mod support;
use support::{errors, with_routes};

#[test]
fn max_request_body_on_a_route_overrides_the_limits_default_and_0_lifts_it() {
    let yaml = with_routes(
        "limits: { max_request_body: 10MiB }\nroutes:\n  \
         - { match: { path_prefix: /a }, cluster: web, max_request_body: 1KiB }\n  \
         - { match: { path_prefix: /b }, cluster: web, max_request_body: 0 }\n  \
         - { cluster: web }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let limits: Vec<Option<u64>> = (config.routes.iter())
        .map(|r| r.body_limit(&config.limits))
        .collect();
    assert_eq!(limits, [Some(1024), None, Some(10 << 20)]);
    assert!(config.routes[0]
        .describe_filters()
        .ends_with(" max_request_body 1024"));
    assert_eq!(
        config.routes[2].describe_filters(),
        "",
        "the limits default is not the route's"
    );
    let found = errors(&with_routes(
        "routes:\n  - { cluster: web, max_request_body: 10 GB }",
    ));
    assert!(
        found[0].starts_with("bad.yaml:3:39: routes[0].max_request_body: `10 GB`"),
        "{found:#?}"
    );
}
