//! Weighted splits, header edits, rewrites and per-route retries, through the real binary to real
//! backends: which cluster took each request, and exactly what the backend and the client saw.

use crate::support::{self, raw_exchange, Duet};
use duet_testbed::{Backend, BackendOptions, Recorded};
use std::{net::SocketAddr, time::Duration};

/// An address nothing listens on: connecting to it is refused at once.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address")
}

/// `request` sent on its own connection (`Connection: close` is added); the status and the response's
/// head lines.
fn exchange(duet: &Duet, request: &str) -> (String, Vec<String>) {
    let request = format!("{request}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet.address, request.as_bytes(), Duration::from_secs(5));
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let status = response.get(9..12).unwrap_or_default().to_owned();
    (status, head.lines().skip(1).map(str::to_owned).collect())
}

/// Every value of `name` in what the backend received, in order.
fn values(seen: &Recorded, name: &str) -> Vec<String> {
    (seen.headers.get_all(name).iter())
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .collect()
}

/// 2,000 requests on a 95/5 split, one worker: smooth weighted round robin gives each cluster exactly
/// its share (well inside ±1.5 points), and the access log and the route's series name the cluster
/// that took each request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_split_sends_each_cluster_exactly_its_share() {
    let v1 = Backend::start(BackendOptions::named("v1")).expect("v1");
    let v2 = Backend::start(BackendOptions::named("v2")).expect("v2");
    let yaml = format!(
        "workers: 1
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - name: canary
    backends: [ {{ cluster: api-v1, weight: 95 }}, {{ cluster: api-v2, weight: 5 }} ]
clusters:
  - {{ name: api-v1, backends: [ {{ address: {} }} ] }}
  - {{ name: api-v2, backends: [ {{ address: {} }} ] }}
",
        v1.address(),
        v2.address()
    );
    let duet = Duet::start(&yaml);
    let client = support::client();
    let mut to_v2 = Vec::new();
    for i in 0..2000 {
        let response = client
            .get(duet.url("/x").parse().expect("url"))
            .await
            .expect("response");
        assert_eq!(response.status(), 200);
        if response.headers()["x-backend"] == "v2" {
            to_v2.push(i);
        }
        let _ = http_body_util::BodyExt::collect(response.into_body()).await;
    }
    assert_eq!((v1.requests(), v2.requests()), (1900, 100));
    assert_eq!(to_v2.len(), 100);
    assert!(
        to_v2.windows(2).all(|w| w[1] - w[0] == 20),
        "spread one in twenty: {to_v2:?}"
    );
    let logged = |cluster: &str| {
        let field = format!(" cluster={cluster} ");
        (duet.log_lines().iter())
            .filter(|l| l.contains("duet::access") && l.contains(&field))
            .count()
    };
    assert!(
        support::eventually(Duration::from_secs(10), || logged("api-v1") == 1900
            && logged("api-v2") == 100),
        "access log: {} to api-v1, {} to api-v2",
        logged("api-v1"),
        logged("api-v2")
    );
    let admin = duet.admin_address();
    let metrics = || {
        let request = "GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";
        raw_exchange(admin, request.as_bytes(), Duration::from_secs(5)).0
    };
    let counted = |text: &str| {
        [
            "duet_request_duration_seconds_count{cluster=\"api-v1\",route=\"canary\"} 1900",
            "duet_request_duration_seconds_count{cluster=\"api-v2\",route=\"canary\"} 100",
        ]
        .iter()
        .all(|line| text.lines().any(|l| l == *line))
    };
    assert!(
        support::eventually(Duration::from_secs(10), || counted(&metrics())),
        "{}",
        metrics()
    );
    // The status page lists the route with its split: weights, configured shares, requests taken.
    let request = "GET /status?format=text HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";
    let page = raw_exchange(admin, request.as_bytes(), Duration::from_secs(5)).0;
    let words: Vec<String> = (page.lines())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .skip_while(|l| !l.starts_with("route canary"))
        .take(3)
        .collect();
    assert_eq!(
        words,
        [
            "route canary (host * path /)",
            "-> api-v1 weight 95 95.0% 1900 requests",
            "-> api-v2 weight 5 5.0% 100 requests",
        ],
        "{page}"
    );
    let request = "GET /status?format=json HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";
    let page = raw_exchange(admin, request.as_bytes(), Duration::from_secs(5)).0;
    let json = page.split("\r\n\r\n").nth(1).unwrap_or_default();
    let mut status: serde_json::Value = serde_json::from_str(json).expect("JSON");
    // Requests there cover the page's window, which may start after the first requests: the text page
    // above counts them since start. The route's history over time is `status_over_time`'s to pin.
    status["routes"][0]
        .as_object_mut()
        .map(|route| route.remove("history"));
    for share in status["routes"][0]["split"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        share.as_object_mut().map(|s| s.remove("requests"));
    }
    assert_eq!(
        status["routes"],
        serde_json::json!([{
            "name": "canary",
            "matches": "host * path /",
            "split": [
                { "cluster": "api-v1", "weight": 95, "share": 0.95 },
                { "cluster": "api-v2", "weight": 5, "share": 0.05 },
            ],
            "redirect": null,
            "filters": "",
        }])
    );
}

/// What a backend receives: the route's rewrite of path and Host (query kept, on the normalised path),
/// and its request edits made after duet's own forwarding fields, so a client cannot undo them.
#[test]
fn the_backend_gets_the_rewritten_path_and_host_and_the_edited_headers() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - match: {{ path_prefix: /api/ }}
    cluster: app
    rewrite: {{ path_prefix: /v2/, host: internal.example.com }}
    request_headers:
      set: {{ x-team: api, x-forwarded-host: edge.example.com }}
      add: {{ x-via: duet }}
      remove: [ x-debug ]
  - {{ match: {{ path: {{ exact: /old }} }}, cluster: app, rewrite: {{ path: /fixed }} }}
  - {{ match: {{ path_prefix: /v1 }}, cluster: app, rewrite: {{ path_prefix: / }} }}
  - {{ cluster: app }}
clusters:
  - {{ name: app, backends: [ {{ address: {} }} ] }}
",
        app.address()
    );
    let duet = Duet::start(&yaml);
    let (status, _) = exchange(
        &duet,
        "GET /api/users/../items/7?x=1&y HTTP/1.1\r\nHost: shop.test\r\nX-Team: client\r\n\
         X-Via: client\r\nX-Debug: 1\r\n",
    );
    assert_eq!(status, "200");
    let seen = app.recorded().pop().expect("one request");
    assert_eq!(seen.uri, "/v2/items/7?x=1&y");
    assert_eq!(values(&seen, "host"), ["internal.example.com"]);
    assert_eq!(
        values(&seen, "x-team"),
        ["api"],
        "set replaces the client's"
    );
    assert_eq!(values(&seen, "x-via"), ["client", "duet"], "add appends");
    assert_eq!(values(&seen, "x-debug"), Vec::<String>::new());
    assert_eq!(
        values(&seen, "x-forwarded-host"),
        ["edge.example.com"],
        "edits come after duet's own fields"
    );
    assert_eq!(values(&seen, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values(&seen, "x-request-id").len(), 1);

    let cases = [
        ("/old?q=%20", "/fixed?q=%20"),
        ("/v1", "/"),
        ("/v1/a/b", "/a/b"),
        ("/v1x", "/x"),
        ("/other/./page", "/other/page"),
    ];
    for (target, want) in cases {
        let request = format!("GET {target} HTTP/1.1\r\nHost: shop.test\r\nX-Debug: 1\r\n");
        assert_eq!(exchange(&duet, &request).0, "200", "{target}");
        let seen = app.recorded().pop().expect("request");
        assert_eq!(seen.uri, want, "{target}");
        assert_eq!(values(&seen, "host"), ["shop.test"], "{target}");
        assert_eq!(values(&seen, "x-debug"), ["1"], "no edits on {target}");
        assert!(!seen.headers.contains_key("x-team"), "{target}");
    }
    assert_eq!(app.requests(), 6);
}

/// The route's response edits apply to what its backend answers; duet's own answer (here a 502 from
/// a cluster whose backend refuses connections) is left as duet writes it.
#[test]
fn response_edits_apply_to_backend_responses_not_to_duets_own() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let edits = "response_headers: { set: { strict-transport-security: \"max-age=63072000\" }, \
                 add: { x-via: duet }, remove: [ x-backend ] }";
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path_prefix: /down }}, cluster: down, {edits} }}
  - {{ cluster: app, {edits} }}
clusters:
  - {{ name: app, backends: [ {{ address: {} }} ] }}
  - {{ name: down, backends: [ {{ address: {} }} ], retries: {{ attempts: 1 }} }}
",
        app.address(),
        closed_port()
    );
    let duet = Duet::start(&yaml);
    let (status, head) = exchange(&duet, "GET /up HTTP/1.1\r\nHost: shop.test\r\n");
    assert_eq!(status, "200");
    let field = |name: &str| -> Vec<&str> {
        (head.iter())
            .filter_map(|l| l.split_once(": "))
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
            .collect()
    };
    assert_eq!(field("strict-transport-security"), ["max-age=63072000"]);
    assert_eq!(field("x-via"), ["duet"]);
    assert_eq!(field("x-backend"), Vec::<&str>::new(), "{head:?}");
    assert_eq!(field("content-length"), ["3"], "framing untouched");

    let (status, head) = exchange(&duet, "GET /down HTTP/1.1\r\nHost: shop.test\r\n");
    assert_eq!(status, "502", "{head:?}");
    let edited = head.iter().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("strict-transport-security") || l.starts_with("x-via")
    });
    assert!(!edited, "{head:?}");
}

/// `limit_methods:` answers a method the route does not list with 405 and the route's own `Allow`,
/// without asking the backend; the listed ones (and `HEAD`, beside `GET`) reach it.
#[test]
fn a_method_the_route_does_not_list_gets_405_with_its_allow_and_never_reaches_the_backend() {
    let app = Backend::start(BackendOptions::named("app")).expect("app");
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path_prefix: /api }}, cluster: app, limit_methods: [GET, POST] }}
  - {{ cluster: app }}
clusters:
  - {{ name: app, backends: [ {{ address: {} }} ] }}
",
        app.address()
    );
    let duet = Duet::start(&yaml);
    let allow = |head: &[String]| -> Vec<String> {
        (head.iter())
            .filter_map(|l| l.split_once(": "))
            .filter(|(n, _)| n.eq_ignore_ascii_case("allow"))
            .map(|(_, v)| v.to_owned())
            .collect()
    };
    for method in ["GET", "HEAD", "POST"] {
        let request = format!("{method} /api/x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n");
        let (status, head) = exchange(&duet, &request);
        assert_eq!((method, status.as_str()), (method, "200"), "{head:?}");
    }
    assert_eq!(app.requests(), 3);
    for method in ["DELETE", "OPTIONS", "PUT"] {
        let request = format!("{method} /api/x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n");
        let (status, head) = exchange(&duet, &request);
        assert_eq!((method, status.as_str()), (method, "405"), "{head:?}");
        assert_eq!(allow(&head), ["GET, HEAD, POST"], "{method}: {head:?}");
    }
    assert_eq!(app.requests(), 3, "no refused method reached the backend");
    let (status, _) = exchange(&duet, "DELETE /other HTTP/1.1\r\nHost: h\r\n");
    assert_eq!(
        status, "200",
        "a route without the list serves every method"
    );
    assert_eq!(app.requests(), 4);
}

/// A route's `retries.attempts` replaces its cluster's: on a round-robin cluster of one refusing and
/// one live backend that never retries, the route allowing two attempts always gets an answer, the
/// route left to the cluster fails every other request.
#[test]
fn a_routes_retry_attempts_override_its_clusters() {
    let live = Backend::start(BackendOptions::named("live")).expect("live");
    let yaml = format!(
        "workers: 1
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
  - {{ match: {{ path_prefix: /retried }}, cluster: pair, retries: {{ attempts: 2 }} }}
  - {{ cluster: pair }}
clusters:
  - name: pair
    policy: round_robin
    backends: [ {{ address: {} }}, {{ address: {} }} ]
    retries: {{ attempts: 1 }}
    outlier_detection: {{ consecutive_failures: 0 }}
",
        closed_port(),
        live.address()
    );
    let duet = Duet::start(&yaml);
    let statuses = |target: &str| -> Vec<String> {
        let request = format!("GET {target} HTTP/1.1\r\nHost: shop.test\r\n");
        (0..10).map(|_| exchange(&duet, &request).0).collect()
    };
    let once = statuses("/once");
    assert_eq!(once.iter().filter(|s| *s == "502").count(), 5, "{once:?}");
    assert_eq!(once.iter().filter(|s| *s == "200").count(), 5, "{once:?}");
    assert_eq!(statuses("/retried"), vec!["200"; 10]);
    assert_eq!(live.requests(), 15);
}

/// `duet check` lists each route with its split (each cluster and its weight) and its filters, and
/// refuses a split naming no cluster at its line and column.
#[test]
fn check_lists_a_routes_split_and_filters_and_locates_a_bad_one() {
    let dir = std::env::temp_dir().join(format!("duet-route-filters-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("duet.yaml");
    let check = |yaml: &str| {
        std::fs::write(&path, yaml).expect("write");
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_duet"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .expect("run duet");
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), text)
    };
    let yaml = "listeners: [ { address: 127.0.0.1:0 } ]
routes:
  - name: canary
    match: { path_prefix: /api }
    backends: [ { cluster: v1, weight: 95 }, { cluster: v2, weight: 5 } ]
    rewrite: { path_prefix: /v2 }
    response_headers: { remove: [ server ] }
clusters:
  - { name: v1, backends: [ { address: 127.0.0.1:9001 } ] }
  - { name: v2, backends: [ { address: 127.0.0.1:9002 } ] }
";
    let (ok, text) = check(yaml);
    assert!(ok, "{text}");
    assert!(
        text.lines().any(|l| l
            == "  route canary host * path /api -> v1:95 v2:5 \
                response_headers remove server rewrite path_prefix /v2"),
        "{text}"
    );
    let (ok, text) = check(&yaml.replace("cluster: v2,", "cluster: v3,"));
    assert!(!ok, "{text}");
    assert!(
        text.contains(":5:57: routes[0].backends[1].cluster: no cluster is named `v3`"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reload that turns a one-cluster route into a 1:1 split applies between requests: from then on
/// the clusters alternate, and the route's series for the cluster it kept goes on counting (not reset).
#[test]
fn a_reload_turns_a_route_into_a_split_and_keeps_its_series() {
    let v1 = Backend::start(BackendOptions::named("v1")).expect("v1");
    let v2 = Backend::start(BackendOptions::named("v2")).expect("v2");
    let yaml = |listener: SocketAddr, to: &str| {
        format!(
            "workers: 1
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: {listener} }} ]
routes:
  - {{ name: canary, {to} }}
clusters:
  - {{ name: v1, backends: [ {{ address: {} }} ] }}
  - {{ name: v2, backends: [ {{ address: {} }} ] }}
",
            v1.address(),
            v2.address()
        )
    };
    let duet = Duet::start(&yaml(
        "127.0.0.1:0".parse().expect("address"),
        "cluster: v1",
    ));
    for _ in 0..10 {
        assert_eq!(support::served_by(duet.address), "v1");
    }
    let split = "backends: [ { cluster: v1 }, { cluster: v2 } ]";
    std::fs::write(duet.config_path(), yaml(duet.address, split)).expect("rewrite");
    duet.signal("HUP");
    assert!(
        support::eventually(Duration::from_secs(10), || support::served_by(duet.address)
            == "v2"),
        "{:#?}",
        duet.log_lines()
    );
    let next: Vec<String> = (0..6).map(|_| support::served_by(duet.address)).collect();
    assert_eq!(next, ["v1", "v2", "v1", "v2", "v1", "v2"]);
    let admin = duet.admin_address();
    let line = |cluster: &str, count: u64| {
        format!(
            "duet_request_duration_seconds_count{{cluster=\"{cluster}\",route=\"canary\"}} {count}"
        )
    };
    let counted = || {
        let request = "GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";
        let text = raw_exchange(admin, request.as_bytes(), Duration::from_secs(5)).0;
        [line("v1", v1.requests()), line("v2", v2.requests())]
            .iter()
            .all(|want| text.lines().any(|l| l == want))
    };
    assert!(v1.requests() > 10 && v2.requests() == 4);
    assert!(
        support::eventually(Duration::from_secs(10), counted),
        "v1 {} v2 {}",
        v1.requests(),
        v2.requests()
    );
}
