//! Edge protection through the real binary: address lists (`allow:` / `deny:`) judged on the peer
//! or a trusted proxy's `X-Forwarded-For`, over IPv4 and IPv6.

use crate::{admin, support::Duet};
use duet_testbed::{raw::read_until_closed, Backend, BackendOptions};
use std::{
    io::Write,
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

/// `GET path` from a socket bound to `source` (127.0.0.2 is as much loopback as 127.0.0.1), with
/// `fields` added; the whole response.
fn get_from(source: IpAddr, to: SocketAddr, path: &str, fields: &str) -> String {
    let domain = socket2::Domain::for_address(to);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::new(source, 0).into())
        .expect("bind the source address");
    socket.connect(&to.into()).expect("connect");
    let mut stream: TcpStream = socket.into();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{fields}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("write");
    let (response, _) = read_until_closed(&mut stream, Duration::from_secs(5));
    String::from_utf8_lossy(&response).into_owned()
}

/// The status code of a whole response.
fn status(response: &str) -> &str {
    response.get(9..12).unwrap_or_default()
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}

/// A config listening on `listen`, trusting `trusted`, with `routes` (YAML list items) to `web`.
fn config(listen: &str, trusted: &str, routes: &str, backend: SocketAddr) -> String {
    format!(
        "workers: 1
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: '{listen}', trusted_proxies: [{trusted}] }} ]
routes:
{routes}
clusters:
  - {{ name: web, backends: [ {{ address: {backend} }} ] }}
"
    )
}

#[test]
fn an_allow_list_takes_listed_v4_peers_and_refuses_the_others_with_403_counted_and_logged() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let routes =
        "  - { name: partners, match: { path_prefix: /p }, cluster: web, allow: [127.0.0.1/32] }
  - { name: open, cluster: web, deny: [127.0.0.3] }";
    let duet = Duet::start(&config("127.0.0.1:0", "", routes, backend.address()));
    let listed = get_from(ip("127.0.0.1"), duet.address, "/p", "");
    assert_eq!(status(&listed), "200", "{listed}");
    let other = get_from(ip("127.0.0.2"), duet.address, "/p", "");
    assert_eq!(status(&other), "403", "{other}");
    assert!(other.ends_with("this route does not take requests from your address\n"));
    assert_eq!(
        status(&get_from(ip("127.0.0.2"), duet.address, "/x", "")),
        "200"
    );
    assert_eq!(
        status(&get_from(ip("127.0.0.3"), duet.address, "/x", "")),
        "403"
    );
    assert_eq!(
        backend.requests(),
        2,
        "a refused request reaches no backend"
    );
    let metrics = admin::get(duet.admin_address(), "/metrics");
    let count = |route: &str, outcome: &str| {
        let labels = format!("route=\"{route}\",outcome=\"{outcome}\"");
        admin::sum(&metrics, "duet_ip_list_requests_total", &labels)
    };
    assert_eq!(count("partners", "allowed"), 1.0, "{metrics}");
    assert_eq!(count("partners", "denied"), 1.0);
    assert_eq!(
        (count("open", "allowed"), count("open", "denied")),
        (1.0, 1.0)
    );
    let denied = |l: &&String| l.contains("duet::access") && l.contains("outcome=client_denied");
    let logged = crate::support::eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().filter(denied).count() == 2
    });
    assert!(logged, "{:#?}", duet.log_lines());
    let line = duet
        .log_lines()
        .into_iter()
        .find(|l| denied(&l))
        .unwrap_or_default();
    assert!(
        line.contains("client=127.0.0.2 ") && line.contains("status=403"),
        "{line}"
    );
}

#[test]
fn v6_peers_are_judged_by_v6_networks() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let routes = "  - { name: in, match: { path_prefix: /in }, cluster: web, allow: ['::1/128'] }
  - { name: out, match: { path_prefix: /out }, cluster: web, deny: ['::1'] }
  - { name: v4, match: { path_prefix: /v4 }, cluster: web, allow: [127.0.0.0/8] }";
    let duet = Duet::start(&config("[::1]:0", "", routes, backend.address()));
    let v6 = ip("::1");
    assert_eq!(status(&get_from(v6, duet.address, "/in", "")), "200");
    assert_eq!(status(&get_from(v6, duet.address, "/out", "")), "403");
    assert_eq!(status(&get_from(v6, duet.address, "/v4", "")), "403");
}

#[test]
fn only_a_trusted_proxy_s_x_forwarded_for_changes_a_decision() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let routes =
        "  - { name: partners, match: { path_prefix: /p }, cluster: web, allow: [10.0.0.0/8] }
  - { name: open, cluster: web, deny: [127.0.0.2, 192.0.2.0/24] }";
    let duet = Duet::start(&config(
        "127.0.0.1:0",
        "127.0.0.1",
        routes,
        backend.address(),
    ));
    let (proxy, untrusted) = (ip("127.0.0.1"), ip("127.0.0.2"));
    let from = |source, path, xff: &str| {
        let field = format!("X-Forwarded-For: {xff}\r\n");
        status(&get_from(source, duet.address, path, &field)).to_owned()
    };
    // Through the trusted proxy, the client it names (the last entry) is judged.
    assert_eq!(from(proxy, "/p", "192.0.2.9, 10.1.2.3"), "200");
    assert_eq!(from(proxy, "/p", "10.1.2.3, 192.0.2.9"), "403");
    assert_eq!(from(proxy, "/x", "192.0.2.9"), "403");
    assert_eq!(from(proxy, "/x", "10.1.2.3"), "200");
    // From a peer that is not trusted, its own address, whatever it claims.
    assert_eq!(from(untrusted, "/p", "10.1.2.3"), "403");
    assert_eq!(from(untrusted, "/x", "10.1.2.3"), "403");
}

/// The value of the field `name` in a whole response's head.
fn field<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// A config on one listener with `workers`, one route `limited` on `/` with `rule`, and `extra`
/// routes before it.
fn limited(workers: usize, listen: &str, extra: &str, rule: &str, backend: SocketAddr) -> String {
    format!(
        "workers: {workers}
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: '{listen}' }} ]
routes:
{extra}  - {{ name: limited, cluster: web, rate_limit: {rule} }}
clusters:
  - {{ name: web, backends: [ {{ address: {backend} }} ] }}
"
    )
}

/// The route's `duet_rate_limit_requests_total` by outcome: allowed, limited, would_limit.
fn decisions(duet: &Duet, route: &str) -> [f64; 3] {
    let metrics = admin::get(duet.admin_address(), "/metrics");
    ["allowed", "limited", "would_limit"].map(|outcome| {
        let labels = format!("route=\"{route}\",outcome=\"{outcome}\"");
        admin::sum(&metrics, "duet_rate_limit_requests_total", &labels)
    })
}

#[test]
fn over_its_limit_a_client_gets_429_with_exact_fields_and_another_client_has_its_own_bucket() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let rule = "{ rate: 1/m, burst: 2, key: client_ip }";
    let duet = Duet::start(&limited(1, "127.0.0.1:0", "", rule, backend.address()));
    let (one, two) = (ip("127.0.0.1"), ip("127.0.0.2"));
    assert_eq!(status(&get_from(one, duet.address, "/", "")), "200");
    assert_eq!(status(&get_from(one, duet.address, "/", "")), "200");
    let refused = get_from(one, duet.address, "/", "");
    assert_eq!(status(&refused), "429", "{refused}");
    // One request's share refills in a minute; the bucket of two, in two.
    assert_eq!(field(&refused, "retry-after"), Some("60"), "{refused}");
    assert_eq!(
        field(&refused, "ratelimit-policy"),
        Some("\"default\";q=2;w=120")
    );
    assert_eq!(field(&refused, "ratelimit"), Some("\"default\";r=0;t=60"));
    assert!(refused.ends_with("too many requests; try again later\n"));
    let grpc = get_from(one, duet.address, "/", "Content-Type: application/grpc\r\n");
    assert_eq!(status(&grpc), "200", "{grpc}");
    assert_eq!(field(&grpc, "grpc-status"), Some("8"), "RESOURCE_EXHAUSTED");
    assert_eq!(field(&grpc, "retry-after"), Some("60"));
    // Another client, its own bucket.
    assert_eq!(status(&get_from(two, duet.address, "/", "")), "200");
    assert_eq!(backend.requests(), 3);
    assert_eq!(decisions(&duet, "limited"), [3.0, 2.0, 0.0]);
    let logged = crate::support::eventually(Duration::from_secs(5), || {
        (duet.log_lines().iter())
            .filter(|l| l.contains("duet::access") && l.contains("outcome=rate_limited"))
            .count()
            == 2
    });
    assert!(logged, "{:#?}", duet.log_lines());
}

#[test]
fn mode_log_refuses_nothing_and_counts_what_it_would_refuse() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let rule = "{ rate: 1/m, burst: 1, key: route, mode: log }";
    let duet = Duet::start(&limited(1, "127.0.0.1:0", "", rule, backend.address()));
    for source in [
        "127.0.0.1",
        "127.0.0.2",
        "127.0.0.1",
        "127.0.0.3",
        "127.0.0.1",
    ] {
        assert_eq!(status(&get_from(ip(source), duet.address, "/", "")), "200");
    }
    assert_eq!(backend.requests(), 5);
    assert_eq!(decisions(&duet, "limited"), [1.0, 0.0, 4.0]);
}

#[test]
fn a_header_key_limits_each_value_apart_and_leaves_requests_without_it_alone() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let rule = "{ rate: 1/h, burst: 1, key: 'header:X-Api-Key' }";
    let duet = Duet::start(&limited(1, "127.0.0.1:0", "", rule, backend.address()));
    let with = |key: &str| {
        let fields = if key.is_empty() {
            String::new()
        } else {
            format!("X-Api-Key: {key}\r\n")
        };
        status(&get_from(ip("127.0.0.1"), duet.address, "/", &fields)).to_owned()
    };
    assert_eq!(with("a"), "200");
    assert_eq!(with("a"), "429");
    assert_eq!(with("b"), "200");
    assert_eq!(with("b"), "429");
    assert_eq!(with(""), "200", "no key, no limit");
    assert_eq!(with(""), "200");
    assert_eq!(decisions(&duet, "limited"), [4.0, 2.0, 0.0]);
}

#[test]
fn two_workers_share_one_bucket_and_a_reload_keeps_it_while_the_rule_stays() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let rule = "{ rate: 1/h, burst: 3, key: route }";
    let duet = Duet::start(&limited(2, "127.0.0.1:0", "", rule, backend.address()));
    let ok = |path: &str| status(&get_from(ip("127.0.0.1"), duet.address, path, "")) == "200";
    // Fresh connections spread over both workers (SO_REUSEPORT): three in all go through.
    let through = (0..20).filter(|_| ok("/")).count();
    assert_eq!(through, 3);
    assert_eq!(decisions(&duet, "limited"), [3.0, 17.0, 0.0]);
    let metrics = admin::get(duet.admin_address(), "/metrics");
    let of_worker = |w: &str| {
        let labels = format!("worker=\"{w}\",cluster=\"web\",route=\"limited\"");
        admin::sum(&metrics, "duet_rate_limit_requests_total", &labels)
    };
    assert!(
        of_worker("0") > 0.0 && of_worker("1") > 0.0,
        "both workers: {metrics}"
    );
    // A reload that adds a route and keeps the rule keeps the bucket (empty).
    let listen = duet.address.to_string();
    let marker = "  - { name: marker, match: { path_prefix: /marker }, cluster: web }\n";
    let rewrite = |extra: &str, rule: &str| {
        let yaml = limited(2, &listen, extra, rule, backend.address());
        std::fs::write(duet.config_path(), yaml).expect("rewrite");
        duet.signal("HUP");
    };
    rewrite(marker, rule);
    let applied = || (0..8).all(|_| ok("/marker"));
    assert!(crate::support::eventually(Duration::from_secs(10), applied));
    assert!((0..8).all(|_| !ok("/")), "still empty on every worker");
    // A changed rule starts from a full bucket. (Until a worker applies it, `/second` is the
    // limited route's, empty: nothing is taken from the new bucket while waiting. Not `/marker2`:
    // the first reload's `/marker` prefix would take it, and the wait would end before the reload.)
    let marker = "  - { name: marker, match: { path_prefix: /second }, cluster: web }\n";
    rewrite(marker, "{ rate: 1/h, burst: 4, key: route }");
    let applied = || (0..8).all(|_| ok("/second"));
    assert!(crate::support::eventually(Duration::from_secs(10), applied));
    assert_eq!((0..20).filter(|_| ok("/")).count(), 4);
}

#[test]
fn past_max_keys_the_bucket_that_refilled_longest_ago_is_forgotten_and_counted() {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let rule = "{ rate: 1/h, burst: 1, key: 'header:x-k', max_keys: 8 }";
    let duet = Duet::start(&limited(1, "127.0.0.1:0", "", rule, backend.address()));
    let with = |key: usize| {
        let fields = format!("X-K: k{key}\r\n");
        status(&get_from(ip("127.0.0.1"), duet.address, "/", &fields)).to_owned()
    };
    // Eight keys fill the map; the ninth evicts an eighth of it: the earliest, k0.
    for key in 0..9 {
        assert_eq!(with(key), "200", "k{key}");
    }
    let metrics = admin::get(duet.admin_address(), "/metrics");
    let evicted = admin::sum(
        &metrics,
        "duet_rate_limit_keys_evicted_total",
        "route=\"limited\"",
    );
    assert_eq!(evicted, 1.0, "{metrics}");
    assert_eq!(with(1), "429", "k1 is still held, its bucket empty");
    assert_eq!(with(0), "200", "k0 was forgotten: a full bucket again");
}
