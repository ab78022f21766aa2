//! A route's `hedge:`: read as written, defaults where left out, each mistake located.

use duet_config::{parse, Hedge, HedgeAfter};

mod support;
use std::time::Duration;
use support::{errors, with_routes, BASE};

#[test]
fn hedging_is_read_as_written_with_defaults_for_what_is_left_out() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, hedge: { after: p99.9, max_extra: 2%, methods: [get] } }\n  \
         - { match: { path_prefix: /b }, cluster: web, hedge: { after: 20ms } }\n  \
         - { match: { path_prefix: /c }, cluster: web, hedge: {} }\n  \
         - { cluster: web }",
    );
    let config = parse(&yaml, "ok.yaml").unwrap_or_else(|e| panic!("{e}"));
    let hedges: Vec<Option<Hedge>> = config
        .routes
        .iter()
        .map(|r| r.filters.hedge.clone())
        .collect();
    let defaults = Hedge::default_methods();
    assert_eq!(
        hedges,
        [
            Some(Hedge {
                after: HedgeAfter::Percentile(999),
                max_extra_ppm: 20_000,
                methods: vec!["GET".to_owned()],
            }),
            Some(Hedge {
                after: HedgeAfter::Fixed(Duration::from_millis(20)),
                max_extra_ppm: 50_000,
                methods: defaults.clone(),
            }),
            Some(Hedge {
                after: HedgeAfter::Percentile(950),
                max_extra_ppm: 50_000,
                methods: defaults,
            }),
            None,
        ]
    );
    assert_eq!(
        defaults_of(&hedges[2]),
        "after p95, max_extra 5%, GET,HEAD,OPTIONS"
    );
    assert_eq!(HedgeAfter::Percentile(999).quantile(), Some(0.999));
}

fn defaults_of(hedge: &Option<Hedge>) -> String {
    hedge.as_ref().map(ToString::to_string).unwrap_or_default()
}

#[test]
fn a_bad_percentile_share_or_method_is_located() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { cluster: web, hedge: { after: p100, max_extra: 0%, methods: [G3T] } }\n  \
         - { match: { path_prefix: /z }, cluster: web, hedge: { after: 0 } }\n  \
         - { match: { path_prefix: /y }, cluster: web, hedge: { after: p95.55, max_extra: 150% } }",
    ));
    let expected = [
        "bad.yaml:3:37: routes[0].hedge.after: `p100` is not a percentile",
        "bad.yaml:3:54: routes[0].hedge.max_extra: `0%` would never hedge",
        "bad.yaml:3:68: routes[0].hedge.methods[0]: `G3T` is not an HTTP method",
        "bad.yaml:4:65: routes[1].hedge.after: `0` would hedge every request at once",
        "bad.yaml:5:65: routes[2].hedge.after: `p95.55` is not a percentile",
        "bad.yaml:5:84: routes[2].hedge.max_extra: `150%` is not a percentage",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(found.starts_with(expected), "{found}\nexpected: {expected}");
    }
}

#[test]
fn a_redirect_has_nothing_to_hedge_and_unknown_keys_are_named() {
    let found = errors(&with_routes(
        "routes:\n  \
         - { redirect: { scheme: https }, hedge: { after: p95 } }\n  \
         - { cluster: web, hedge: { afterr: p95 } }",
    ));
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|e| e.contains("unknown") && e.contains("afterr")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|e| e.starts_with("bad.yaml:3:43: routes[0].hedge: a redirect sends nothing")),
        "{found:#?}"
    );
}

#[test]
fn hedging_shows_in_the_reload_plan() {
    let old = parse(BASE, "old.yaml").expect("old");
    let new = with_routes("routes: [ { cluster: web, hedge: { after: 5ms, max_extra: 0.5% } } ]");
    let new = parse(&new, "new.yaml").expect("new");
    let lines: Vec<String> = duet_config::diff(&old, &new)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            "~ route */: was host * path / -> web; now host * path / -> web hedge after 5ms, \
          max_extra 0.5%, GET,HEAD,OPTIONS"
        ]
    );
}
