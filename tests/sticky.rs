//! `sticky:` through the real binary: the first answer sets a signed cookie naming its backend, later
//! requests with it go there from either worker, a forged one is ignored, and a cookie whose backend is
//! gone is re-picked and set again; with a shared `secret` a cookie survives a restart.

use crate::support::{raw_exchange, Duet};
use duet_testbed::config::{Cluster, DuetConfig};
use duet_testbed::{Backend, BackendOptions};
use std::{net::SocketAddr, time::Duration};

/// What one `GET /` on a new connection came to: the backend that answered (its name is the body)
/// and the `Set-Cookie` duet sent, if any.
struct Answer {
    served_by: String,
    set_cookie: Option<String>,
}

fn get(address: SocketAddr, cookie: Option<&str>) -> Answer {
    let field = cookie.map_or_else(String::new, |c| format!("Cookie: theme=dark; {c}\r\n"));
    let request = format!("GET / HTTP/1.1\r\nHost: x\r\n{field}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(address, request.as_bytes(), Duration::from_secs(5));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_default();
    assert!(head.starts_with("HTTP/1.1 200"), "{response}");
    let set_cookie = (head.lines())
        .find_map(|line| line.strip_prefix("set-cookie: "))
        .map(str::to_owned);
    Answer {
        served_by: body.to_owned(),
        set_cookie,
    }
}

/// The `name=value` a client sends back for a `Set-Cookie`.
fn pair(set_cookie: &str) -> &str {
    set_cookie.split(';').next().unwrap_or_default()
}

fn backends(n: usize) -> Vec<Backend> {
    (0..n)
        .map(|i| Backend::start(BackendOptions::named(&format!("b{i}"))).expect("backend"))
        .collect()
}

fn start(backends: &[Backend], sticky: &str) -> Duet {
    let mut cluster = Cluster::new("web").set("sticky", sticky);
    for backend in backends {
        cluster = cluster.backend(backend.address());
    }
    let yaml = DuetConfig::new()
        .workers(2)
        .admin()
        .route(None, "/", "web")
        .cluster(cluster)
        .to_yaml();
    Duet::start(&yaml)
}

#[test]
fn the_first_answer_sets_the_cookie_and_every_worker_honours_it() {
    let backends = backends(3);
    let duet = start(&backends, "{ cookie: sid, ttl: 30m }");
    let first = get(duet.address, None);
    let set = first.set_cookie.expect("a Set-Cookie on the first answer");
    assert!(set.starts_with("sid="), "{set}");
    assert!(set.ends_with("; Path=/; HttpOnly; Max-Age=1800"), "{set}");
    for backend in &backends {
        let port = backend.address().port().to_string();
        assert!(!set.contains(&port), "the cookie names no address: {set}");
    }
    // New connections: SO_REUSEPORT spreads them over both workers, which share the process's key.
    for i in 0..30 {
        let again = get(duet.address, Some(pair(&set)));
        assert_eq!(again.served_by, first.served_by, "request {i}");
        assert_eq!(again.set_cookie, None, "request {i}: already bound");
    }
    let served: u64 = backends.iter().map(Backend::requests).sum();
    let home = backends.iter().find(|b| b.name() == first.served_by);
    assert_eq!(
        home.map(Backend::requests),
        Some(31),
        "all on one of {served}"
    );
    // Both workers took some of the 31 connections (all on one: a chance of 2 in 2^31).
    let request = b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let (metrics, _) = raw_exchange(duet.admin_address(), request, Duration::from_secs(5));
    for worker in ["0", "1"] {
        let accepted = (metrics.lines())
            .filter(|l| l.starts_with("duet_connections_total{"))
            .filter(|l| l.contains(&format!("worker=\"{worker}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        assert!(
            accepted > 0.0,
            "worker {worker} took no connection:\n{metrics}"
        );
    }
}

#[test]
fn a_forged_or_garbled_cookie_is_ignored_and_replaced() {
    let backends = backends(3);
    let duet = start(&backends, "{ cookie: sid }");
    let set = get(duet.address, None).set_cookie.expect("a cookie");
    let (id, tag) = pair(&set)
        .trim_start_matches("sid=")
        .split_once('.')
        .expect("id.tag");
    // The other backends' ids are unknown to a client, but any other id with this tag is a forgery,
    // and so is this id with another tag.
    let forged_id = format!(
        "sid={:016x}.{tag}",
        u64::from_str_radix(id, 16).expect("hex") ^ 1
    );
    let forged_tag = format!("sid={id}.{}", tag.replace(|c: char| c != 'A', "A"));
    for cookie in [
        forged_id.as_str(),
        forged_tag.as_str(),
        "sid=garbage",
        "sid=",
    ] {
        let answer = get(duet.address, Some(cookie));
        let renewed = answer
            .set_cookie
            .unwrap_or_else(|| panic!("{cookie}: no new cookie"));
        assert!(renewed.starts_with("sid="), "{renewed}");
        // The new cookie is a valid one: it binds.
        let again = get(duet.address, Some(pair(&renewed)));
        assert_eq!(again.served_by, answer.served_by, "{cookie}");
        assert_eq!(again.set_cookie, None, "{cookie}");
    }
}

#[test]
fn a_cookie_whose_backend_is_gone_is_re_picked_and_reset() {
    let mut backends = backends(3);
    let duet = start(&backends, "{ cookie: sid, ttl: 1h }");
    let first = get(duet.address, None);
    let set = first.set_cookie.expect("a cookie");
    let at = (backends.iter())
        .position(|b| b.name() == first.served_by)
        .expect("a backend of ours");
    // Its backend stops: the attempt fails to connect, the retry goes elsewhere (never back), and the
    // answer binds the session to the backend that gave it.
    backends.remove(at).stop();
    let moved = get(duet.address, Some(pair(&set)));
    assert_ne!(moved.served_by, first.served_by);
    let reset = moved.set_cookie.expect("the cookie set again");
    assert_ne!(pair(&reset), pair(&set));
    for i in 0..10 {
        let again = get(duet.address, Some(pair(&reset)));
        assert_eq!(again.served_by, moved.served_by, "request {i}");
        assert_eq!(again.set_cookie, None, "request {i}");
    }
}

#[test]
fn with_a_shared_secret_a_cookie_survives_a_restart_and_without_one_it_does_not() {
    let backends = backends(4);
    let shared = "{ cookie: sid, secret: 'k3y-0f-at-least-16-bytes' }";
    let (set, home) = {
        let duet = start(&backends, shared);
        let first = get(duet.address, None);
        (first.set_cookie.expect("a cookie"), first.served_by)
    };
    // A new process with the same secret (another instance behind an L4 balancer, or a restart).
    let duet = start(&backends, shared);
    for i in 0..8 {
        let again = get(duet.address, Some(pair(&set)));
        assert_eq!(
            (again.served_by.as_str(), again.set_cookie),
            (home.as_str(), None),
            "{i}"
        );
    }
    drop(duet);
    // Random keys, one per process: the first process's cookie does not verify in the second.
    let random = "{ cookie: sid }";
    let set = {
        let duet = start(&backends, random);
        get(duet.address, None).set_cookie.expect("a cookie")
    };
    let duet = start(&backends, random);
    let answer = get(duet.address, Some(pair(&set)));
    assert!(
        answer.set_cookie.is_some(),
        "a new cookie: the old key is gone"
    );
}
