//! Route splits and filters: how each is read, and each mistake located.

use duet_config::{Action, HeaderEdits, PathRewrite, Rewrite, Route, WeightedCluster};

const CLUSTERS: &str = "clusters:\n  \
     - { name: v1, backends: [ { address: 127.0.0.1:9001 } ] }\n  \
     - { name: v2, backends: [ { address: 127.0.0.1:9002 } ] }\n";

fn yaml(routes: &str) -> String {
    format!("listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n{routes}{CLUSTERS}")
}

fn routes(routes: &str) -> Vec<Route> {
    match duet_config::parse(&yaml(routes), "f.yaml") {
        Ok(config) => config.routes,
        Err(errors) => panic!("{errors}"),
    }
}

/// Each error's first line: `file:line:column: field: message`.
fn errors(routes: &str) -> Vec<String> {
    match duet_config::parse(&yaml(routes), "f.yaml") {
        Ok(_) => panic!("expected errors for:\n{routes}"),
        Err(errors) => errors
            .errors
            .iter()
            .map(|e| e.to_string().lines().next().unwrap_or_default().to_owned())
            .collect(),
    }
}

#[test]
fn a_split_is_read_with_its_weights() {
    let found = routes(
        "  - { backends: [ { cluster: v1, weight: 95 }, { cluster: v2, weight: 5 } ] }\n  \
         - { backends: [ { cluster: v1 }, { cluster: v2, weight: 0 } ] }\n  \
         - { backends: [ { cluster: v2, weight: 7 } ] }\n",
    );
    let weighted = |cluster, weight| WeightedCluster { cluster, weight };
    assert_eq!(
        found[0].action,
        Action::Split(vec![weighted(0, 95), weighted(1, 5)])
    );
    assert_eq!(
        found[1].action,
        Action::Split(vec![weighted(0, 1), weighted(1, 0)]),
        "weight 1 by default; 0 stages a cluster without traffic"
    );
    assert_eq!(
        found[2].action,
        Action::Cluster(1),
        "one cluster is `cluster:`"
    );
    let clusters = duet_config::parse(&yaml("  - { cluster: v1 }\n"), "f.yaml")
        .expect("valid")
        .clusters;
    assert_eq!(found[0].target(&clusters), "v1:95 v2:5");
    assert_eq!(found[0].action.clusters().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(found[0].action.cluster(), None);
}

#[test]
fn split_mistakes_are_located() {
    let found = errors(
        "  - { cluster: v1, backends: [ { cluster: v2 } ] }\n  \
         - { backends: [ { cluster: v3 }, { cluster: v1, weight: 1000001 } ] }\n  \
         - { backends: [ { cluster: v1, weight: 0 }, { cluster: v2, weight: 0 } ] }\n  \
         - { backends: [ { cluster: v1 }, { cluster: v1, weight: 2 } ] }\n  \
         - { backends: [] }\n  \
         - { match: { path_prefix: /x } }\n",
    );
    assert_eq!(
        found,
        [
            "f.yaml:3:30: routes[0].backends: both `cluster` and `backends`: write `cluster: NAME` for one cluster, `backends:` to split over several",
            "f.yaml:4:30: routes[1].backends[0].cluster: no cluster is named `v3`",
            "f.yaml:4:59: routes[1].backends[1].weight: 1000001 is out of range: expected 0 to 1000000",
            "f.yaml:5:17: routes[2].backends: every weight is 0: the route would send nowhere",
            "f.yaml:6:47: routes[3].backends[1].cluster: `v1` is listed twice in one split",
            "f.yaml:7:17: routes[4].backends: an empty list: the route would send nowhere",
            "f.yaml:8:5: routes[5]: neither `cluster`, `backends` nor `redirect`",
        ]
    );
}

#[test]
fn header_edits_rewrite_and_retries_are_read() {
    let found = routes(
        "  - match: { path_prefix: /v1 }\n    cluster: v1\n    \
         request_headers: { set: { X-Team: api }, add: { x-via: duet }, remove: [X-Debug] }\n    \
         response_headers: { set: { strict-transport-security: \"max-age=63072000\" }, remove: [server] }\n    \
         rewrite: { path_prefix: /v2, host: Internal.Example.com:8080 }\n    \
         retries: { attempts: 1 }\n  \
         - { cluster: v2, rewrite: { path: /fixed, host: '[::1]' } }\n",
    );
    let route = &found[0];
    assert_eq!(
        route.request_headers,
        HeaderEdits {
            set: vec![("x-team".into(), "api".into())],
            add: vec![("x-via".into(), "duet".into())],
            remove: vec!["x-debug".into()],
        }
    );
    assert_eq!(route.response_headers.remove, ["server"]);
    assert_eq!(
        route.rewrite,
        Rewrite {
            path: Some(PathRewrite::Prefix("/v2".into())),
            host: Some("internal.example.com:8080".into()),
        }
    );
    assert_eq!(route.retry_attempts, Some(1));
    assert_eq!(
        route.describe_filters(),
        " request_headers set x-team=api add x-via=duet remove x-debug \
         response_headers set strict-transport-security=max-age=63072000 remove server \
         rewrite path_prefix /v2 host internal.example.com:8080 retries 1"
    );
    assert_eq!(
        found[1].rewrite,
        Rewrite {
            path: Some(PathRewrite::Full("/fixed".into())),
            host: Some("[::1]".into()),
        }
    );
    assert_eq!(found[1].retry_attempts, None, "the cluster's");
    assert_eq!(
        found[1].describe_filters(),
        " rewrite path /fixed host [::1]"
    );
}

#[test]
fn header_edits_of_hop_by_hop_framing_or_host_fields_are_refused() {
    let found = errors(
        "  - cluster: v1\n    \
         request_headers: { set: { Host: a.test, x-ok: \"1\" }, add: { Transfer-Encoding: chunked }, remove: [connection, te] }\n    \
         response_headers: { set: { content-length: \"5\", \"x y\": v, x-bad: \"a\\u0001b\", x-pad: \" v\" } }\n  \
         - cluster: v1\n    \
         request_headers: { set: { x-a: \"1\", X-A: \"2\" }, remove: [x-a] }\n    \
         response_headers: {}\n",
    );
    assert_eq!(
        found,
        [
            "f.yaml:4:31: routes[0].request_headers.set.Host: `host` is a hop-by-hop or framing field: duet sets it for each connection",
            "f.yaml:4:65: routes[0].request_headers.add.Transfer-Encoding: `transfer-encoding` is a hop-by-hop or framing field: duet sets it for each connection",
            "f.yaml:4:104: routes[0].request_headers.remove[0]: `connection` is a hop-by-hop or framing field: duet sets it for each connection",
            "f.yaml:4:116: routes[0].request_headers.remove[1]: `te` is a hop-by-hop or framing field: duet sets it for each connection",
            "f.yaml:5:32: routes[0].response_headers.set.content-length: `content-length` is a hop-by-hop or framing field: duet sets it for each connection",
            "f.yaml:5:53: routes[0].response_headers.set.x y: `x y` is not a header name",
            "f.yaml:5:70: routes[0].response_headers.set.x-bad: `a\u{1}b` holds '\\u{1}': a header value is printable ASCII",
            "f.yaml:5:89: routes[0].response_headers.set.x-pad: ` v` starts or ends with white space, which a field value cannot",
            "f.yaml:7:41: routes[1].request_headers.set.X-A: `x-a` is given twice (names are case-insensitive)",
            "f.yaml:7:62: routes[1].request_headers.remove[0]: `x-a` is both removed and set or added",
            "f.yaml:8:23: routes[1].response_headers: changes nothing",
        ]
    );
    let host = duet_config::parse(
        &yaml("  - { cluster: v1, request_headers: { set: { host: a.test } } }\n"),
        "f.yaml",
    )
    .expect_err("refused")
    .to_string();
    assert!(
        host.contains("hint: change the Host a backend gets with `rewrite: { host: NAME }`"),
        "{host}"
    );
}

#[test]
fn rewrite_and_retry_mistakes_are_located() {
    let found = errors(
        "  - { match: { path: { exact: /a } }, cluster: v1, rewrite: { path_prefix: /b } }\n  \
         - { cluster: v1, rewrite: { path: /a, path_prefix: /b } }\n  \
         - { cluster: v1, rewrite: { path: b/../c } }\n  \
         - { cluster: v1, rewrite: { path: /b/../c } }\n  \
         - { cluster: v1, rewrite: { host: '*.example.com' } }\n  \
         - { cluster: v1, rewrite: { host: 'a.test:0' } }\n  \
         - { cluster: v1, rewrite: {} }\n  \
         - { cluster: v1, retries: { attempts: 11 } }\n  \
         - { redirect: { path: /x }, rewrite: { path: /y }, retries: { attempts: 2 } }\n",
    );
    assert_eq!(
        found,
        [
            "f.yaml:3:76: routes[0].rewrite.path_prefix: the route matches no prefix to replace",
            "f.yaml:4:54: routes[1].rewrite.path_prefix: both `path` and `path_prefix`: write one",
            "f.yaml:5:37: routes[2].rewrite.path: `b/../c` must start with `/`",
            "f.yaml:6:37: routes[3].rewrite.path: `/b/../c` is not a normalised path prefix: it has a dot segment (`.` or `..`), which duet resolves in request paths before matching",
            "f.yaml:7:37: routes[4].rewrite.host: a rewrite needs one host, not a pattern",
            "f.yaml:8:37: routes[5].rewrite.host: `0` is not a port: expected 1 to 65535",
            "f.yaml:9:29: routes[6].rewrite: changes nothing",
            "f.yaml:10:41: routes[7].retries.attempts: 11 is out of range: expected 1 to 10",
            "f.yaml:11:40: routes[8].rewrite: `rewrite` on a redirect route: nothing is sent to a backend for it to change",
            "f.yaml:11:75: routes[8].retries.attempts: `retries` on a redirect route: nothing is sent to a backend for it to change",
        ]
    );
}

#[test]
fn a_mirror_into_one_of_its_splits_clusters_is_refused_where_written() {
    let found = errors(
        "  - { backends: [ { cluster: v1, weight: 95 }, { cluster: v2, weight: 5 } ], mirror: { cluster: v2 } }\n  \
         - { backends: [ { cluster: v1 }, { cluster: v2, weight: 0 } ], mirror: { cluster: v2, percent: 5 } }\n  \
         - { cluster: v1, mirror: { cluster: v1 } }\n",
    );
    assert_eq!(
        found,
        [
            "f.yaml:3:97: routes[0].mirror.cluster: `v2` is one of the clusters the route splits over: the requests it takes would reach it twice",
            "f.yaml:4:85: routes[1].mirror.cluster: `v2` is one of the clusters the route splits over: the requests it takes would reach it twice",
            "f.yaml:5:39: routes[2].mirror.cluster: `v1` is the cluster the route proxies to: it would get each request twice",
        ]
    );
    let split = routes("  - { backends: [ { cluster: v1 } ], mirror: { cluster: v2 } }\n");
    assert_eq!(split[0].filters.mirror.as_ref().map(|m| m.cluster), Some(1));
}
