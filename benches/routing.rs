//! Cost of one route lookup (Host check, path normalisation, first match), by table size:
//! `cargo bench --bench routing`.
//!
//! Two kinds of table of 1, 100 and 1,000 routes, each request taking the table's last route (the
//! worst case of a scan):
//! - `host_prefix`: each route an exact host and a path prefix (`svcN.example.com` + `/apiN`): the
//!   route index finds a host's routes by hash, so the cost stays flat.
//! - `wildcard_prefix`: each route a wildcard host (`*.svcN.example.com`) and a prefix: the index finds
//!   a host's wildcards by its dot-suffixes (`svcN.example.com`), so the cost stays flat too. Only
//!   routes without a host are still checked in order.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use duet_proxy::{route_lookup, RouteIndex};
use std::hint::black_box;

const SIZES: [usize; 3] = [1, 100, 1_000];

fn table(routes: usize, host: impl Fn(usize) -> String) -> Vec<duet_config::Route> {
    let mut yaml = String::from("listeners: [ { address: 127.0.0.1:0 } ]\nroutes:\n");
    for i in 0..routes {
        yaml.push_str(&format!(
            "  - {{ match: {{ host: '{}', path_prefix: /api{i}/ }}, cluster: app }}\n",
            host(i)
        ));
    }
    yaml.push_str("clusters:\n  - { name: app, backends: [ { address: 127.0.0.1:9 } ] }\n");
    duet_config::parse(&yaml, "bench.yaml")
        .expect("a valid table")
        .routes
}

/// A kind of table: its name, route `i`'s host pattern, and a host that route `i` matches.
type Kind = (&'static str, fn(usize) -> String, fn(usize) -> String);

fn lookups(c: &mut Criterion) {
    let kinds: [Kind; 2] = [
        (
            "host_prefix",
            |i| format!("svc{i}.example.com"),
            |i| format!("svc{i}.example.com"),
        ),
        (
            "wildcard_prefix",
            |i| format!("*.svc{i}.example.com"),
            |i| format!("a.svc{i}.example.com"),
        ),
    ];
    for (kind, pattern, host) in kinds {
        let mut group = c.benchmark_group(format!("route_lookup/{kind}"));
        for size in SIZES {
            let routes = table(size, pattern);
            let index = RouteIndex::new(&routes);
            let last = size - 1;
            let mut request = http::Request::get(format!("/api{last}/users/42?x=1"))
                .header(http::header::HOST, host(last))
                .body(())
                .expect("request");
            assert_eq!(
                route_lookup(&routes, &index, 0, &mut request),
                Some(last),
                "the last route"
            );
            group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
                b.iter(|| route_lookup(black_box(&routes), &index, 0, black_box(&mut request)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, lookups);
criterion_main!(benches);
