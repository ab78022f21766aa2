//! Heap allocations per proxied request through duet's real server (`duet::Server`, in this process, one
//! worker), counted by a counting global allocator: the request path's allocation budget, pinned so that a
//! change adding an allocation per request is seen.
//!
//! Kept alone in its own test binary, since the allocator counts every thread of the process. The backend
//! and the client are this test's own threads and mark themselves uncounted: what is counted is duet's
//! (its worker, its control plane). No tracing subscriber is installed, so the access log is off.

use duet_testbed::{
    alloc::{allocations, uncount_this_thread, CountingAllocator},
    raw::{head_end, read_response},
};
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

/// A keep-alive HTTP/1.1 backend answering every request head with `RESPONSE`, on uncounted threads.
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the backend");
    let address = listener.local_addr().expect("backend address");
    std::thread::spawn(move || {
        uncount_this_thread();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                uncount_this_thread();
                let mut pending = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut buffer) else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    pending.extend_from_slice(&buffer[..n]);
                    while let Some(end) = head_end(&pending) {
                        pending.drain(..end);
                        if stream.write_all(RESPONSE).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    address
}

/// One request on `stream` and its whole response (head and a `Content-Length` body).
fn exchange(stream: &mut TcpStream, pending: &mut Vec<u8>) {
    stream
        .write_all(b"GET /api/x HTTP/1.1\r\nHost: example.test\r\n\r\n")
        .expect("send the request");
    let response = read_response(stream, pending).expect("read the response");
    assert!(
        response.head.starts_with("HTTP/1.1 200"),
        "{}",
        response.head
    );
    assert_eq!(response.body, b"ok", "{}", response.head);
}

/// Allocations per proxied request, measured after a warm-up, over `requests` keep-alive requests.
fn allocations_per_request(requests: u64) -> f64 {
    uncount_this_thread();
    let backends = [backend(), backend()];
    let yaml = format!(
        "workers: 1\n\
         listeners: [ {{ address: 127.0.0.1:0 }} ]\n\
         routes: [ {{ match: {{ path_prefix: / }}, cluster: app }} ]\n\
         clusters:\n  - name: app\n    policy: p2c_peak_ewma\n    backends: [ {{ address: {} }}, {{ address: {} }} ]\n    \
         retries: {{ attempts: 3, budget_percent: 20%, min_retries_per_second: 10 }}\n\
         limits: {{ keepalive_requests: 100000 }}\n",
        backends[0], backends[1]
    );
    let config = duet_config::parse(&yaml, "allocations test").expect("a valid config");
    let server = duet::Server::start(config).expect("duet starts");
    let mut stream = TcpStream::connect(server.local_addrs()[0]).expect("connect to duet");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut pending = Vec::new();
    // Warm-up: connections to both backends, buffers grown, lazily initialised state.
    for _ in 0..500 {
        exchange(&mut stream, &mut pending);
    }
    let before = allocations();
    for _ in 0..requests {
        exchange(&mut stream, &mut pending);
    }
    let after = allocations();
    drop(stream);
    server.shutdown().expect("shutdown");
    (after - before) as f64 / requests as f64
}

#[test]
fn a_proxied_request_stays_within_its_allocation_budget() {
    // 5.03 measured (7.03 while a GET's headers were kept for a resend or a retry as a cloned map,
    // 9.03 while hyper's header-read timer allocated one per head and each request's service future
    // got a box of its own; 13.00 before request ids were cut from shared blocks, 11.03 while hyper
    // parsed responses into two heap arrays sized for 128 header fields). They are hyper's: the
    // response body's channel, the client dispatch's callback, buffer splits.
    const BUDGET: f64 = 5.5;
    let per_request = allocations_per_request(2_000);
    println!("allocations per proxied request: {per_request:.2}");
    assert!(
        per_request <= BUDGET,
        "{per_request:.2} allocations per proxied request, over the budget of {BUDGET}: find the new one \
         (valgrind --tool=callgrind, callers of __rust_alloc) or raise the budget with a reason"
    );
}
