//! What the per-section config tests share: a small valid file whose routes a test replaces, and the
//! errors a file gets.

use duet_config::parse;

/// One listener, one route to `web`, and `web` with two backends.
pub(crate) const BASE: &str = "\
listeners: [ { address: 127.0.0.1:0 } ]
routes: [ { cluster: web } ]
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:9001 }, { address: 127.0.0.1:9002 } ]
";

/// [`BASE`] with its `routes:` line replaced by `routes`.
pub(crate) fn with_routes(routes: &str) -> String {
    BASE.replace("routes: [ { cluster: web } ]", routes)
}

/// The errors `yaml` gets, as written for people; panics if it loads.
pub(crate) fn errors(yaml: &str) -> Vec<String> {
    match parse(yaml, "bad.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
    }
}
