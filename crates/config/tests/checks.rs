//! Checks added after the split into one function per section: each pins a located error.

fn errors(yaml: &str) -> Vec<String> {
    match duet_config::parse(yaml, "bad.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
    }
}

const BASE: &str = "\
listeners: [ { address: 127.0.0.1:0 } ]
routes: [ { cluster: web } ]
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 } ]
";

#[test]
fn a_cluster_setting_is_named_with_its_cluster() {
    let found = errors(&format!(
        "{BASE}  - name: api\n    backends: [ {{ address: 127.0.0.1:9002 }} ]\n    retries: {{ replay_body_limit: 1 parsec }}\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with("bad.yaml:8:35: clusters[1].retries.replay_body_limit: `1 parsec`"),
        "{}",
        found[0]
    );
}
