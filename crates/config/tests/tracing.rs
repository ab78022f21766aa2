//! `tracing:`: the collector's address, the sampling share and the queue as written, defaults
//! where left out, each mistake located.

use duet_config::parse;

mod support;
use support::{errors, with_routes, BASE};

#[test]
fn the_section_reads_its_keys_with_defaults_where_left_out() {
    let config = parse(
        &format!("{BASE}tracing: {{ otlp: http://127.0.0.1:4318 }}\n"),
        "ok.yaml",
    )
    .expect("valid");
    let tracing = config.tracing.expect("tracing on");
    assert_eq!(tracing.otlp.to_string(), "http://127.0.0.1:4318/v1/traces");
    assert_eq!(tracing.sample, 0.01);
    assert_eq!(tracing.queue, 2048);
    assert_eq!(tracing.service_name, "duet");

    let yaml = with_routes(
        "routes: [ { cluster: web } ]\n\
         tracing: { otlp: 'http://collector:9000/otlp', sample: 25%, queue: 10, service_name: edge }",
    );
    let tracing = parse(&yaml, "ok.yaml").expect("valid").tracing.expect("on");
    assert_eq!(tracing.otlp.to_string(), "http://collector:9000/otlp");
    assert_eq!(tracing.sample, 0.25);
    assert_eq!(tracing.queue, 10);
    assert_eq!(tracing.service_name, "edge");
    assert!(
        parse(BASE, "ok.yaml").expect("valid").tracing.is_none(),
        "off by default"
    );
}

#[test]
fn https_a_bad_share_an_empty_queue_and_an_unknown_key_are_located() {
    let found = errors(&format!(
        "{BASE}tracing:\n  otlp: https://collector:4318\n  sample: 150%\n  queue: 0\n  exporter: grpc\n"
    ));
    assert_eq!(found.len(), 4, "{found:#?}");
    let starts = [
        "bad.yaml:7:9: tracing.otlp: `https://collector:4318`: duet exports over plain HTTP only",
        "bad.yaml:8:11: tracing.sample: `150%` is not a percentage",
        "bad.yaml:9:10: tracing.queue: 0 is out of range",
        "bad.yaml:10:3: unknown field `exporter`",
    ];
    for start in starts {
        assert!(
            found.iter().any(|e| e.starts_with(start)),
            "{start}\n{found:#?}"
        );
    }
    let missing = errors(&format!("{BASE}tracing: {{ sample: 1% }}\n"));
    assert!(
        missing
            .iter()
            .any(|e| e
                .starts_with("bad.yaml:6:10: tracing.otlp: the collector's address is missing")),
        "{missing:#?}"
    );
}

#[test]
fn a_reload_s_diff_shows_tracing_turned_on_and_changed() {
    let off = parse(BASE, "old.yaml").expect("valid");
    let on = format!("{BASE}tracing: {{ otlp: http://127.0.0.1:4318, sample: 5% }}\n");
    let on = parse(&on, "new.yaml").expect("valid");
    let lines: Vec<String> = duet_config::diff(&off, &on)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        ["~ tracing: off -> otlp http://127.0.0.1:4318/v1/traces, sample 5%, queue 2048, service_name duet"]
    );
}
