//! `policy: least_inflight` through the binary: a full scan of the worker's own in-flight counts sends
//! nothing to a backend holding requests while another is idle. Backends here answer only when the test
//! opens their gate, so every count is set by the test, never by timing.

use crate::admin::{get, sum};
use crate::support::{raw_exchange, served_by, Duet};
use duet_testbed::{config::DuetConfig, wait::wait_for};
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

/// Held requests on the busy backend.
const HELD: usize = 4;

/// How long any one wait may take: generous, since each ends as soon as its event happens.
const LIMIT: Duration = Duration::from_secs(20);

/// A backend that reads each request (keep-alive, no bodies), counts it, and answers with its name only
/// once its gate is open.
struct GatedBackend {
    address: SocketAddr,
    received: Arc<AtomicU64>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl GatedBackend {
    fn start(name: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let received = Arc::new(AtomicU64::new(0));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (count, wait) = (received.clone(), gate.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (count, wait) = (count.clone(), wait.clone());
                std::thread::spawn(move || serve(stream, name, &count, &wait));
            }
        });
        Self {
            address,
            received,
            gate,
        }
    }

    fn received(&self) -> u64 {
        self.received.load(SeqCst)
    }

    fn open(&self) {
        let (open, changed) = &*self.gate;
        *open.lock().expect("gate") = true;
        changed.notify_all();
    }
}

/// One connection: each request head counted as it arrives, answered once the gate opens (or after
/// [`LIMIT`] three times over, so no thread outlives a failed test by long).
fn serve(mut stream: TcpStream, name: &str, count: &AtomicU64, gate: &(Mutex<bool>, Condvar)) {
    let mut pending = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        while !pending.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            }
        }
        let end = pending
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(pending.len(), |at| at + 4);
        pending.drain(..end);
        count.fetch_add(1, SeqCst);
        let (open, changed) = gate;
        let guard = open.lock().expect("gate");
        let _opened = changed
            .wait_timeout_while(guard, LIMIT * 3, |open| !*open)
            .expect("gate");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}",
            name.len()
        );
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// `GET /` through duet on a thread of its own: the response, whenever it comes.
fn send(address: SocketAddr) -> JoinHandle<String> {
    std::thread::spawn(move || {
        raw_exchange(
            address,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            LIMIT * 3,
        )
        .0
    })
}

/// What duet's worker says it has in flight to `backend`.
fn in_flight(duet: &Duet, backend: SocketAddr) -> f64 {
    let metrics = get(duet.admin_address(), "/metrics");
    sum(
        &metrics,
        "duet_backend_in_flight",
        &format!("backend=\"{backend}\""),
    )
}

#[test]
fn least_inflight_sends_nothing_to_a_backend_holding_requests_while_another_is_idle() {
    let (busy, idle) = (GatedBackend::start("busy"), GatedBackend::start("idle"));
    let both = [busy.address, idle.address];
    let yaml = DuetConfig::single("least_inflight", &both)
        .workers(1)
        .admin()
        .with_cluster("app", |c| {
            c.set("retries", "{ attempts: 1 }")
                .set("outlier_detection", "{ consecutive_failures: 0 }")
                .set("timeouts", "{ response_headers: 5m, read: 5m }")
        })
        .to_yaml();
    let duet = Duet::start_with(&yaml, "warn,duet::cli=info");

    // Both gates shut: each request goes to the emptier backend (a draw when they are level), so
    // 2 × HELD requests, each sent once the one before has arrived, leave HELD on each.
    let mut held = Vec::new();
    for sent in 1..=2 * HELD as u64 {
        held.push(send(duet.address));
        wait_for("the request to reach a backend", LIMIT, || {
            busy.received() + idle.received() == sent
        });
        let (a, b) = (busy.received(), idle.received());
        assert!(a.abs_diff(b) <= 1, "{a} and {b} after {sent}");
    }
    assert_eq!(
        (busy.received(), idle.received()),
        (HELD as u64, HELD as u64)
    );

    // One backend answers what it holds and goes idle; the other still holds HELD.
    idle.open();
    wait_for("the idle backend's requests to complete", LIMIT, || {
        in_flight(&duet, idle.address) == 0.0
    });
    assert_eq!(in_flight(&duet, busy.address), HELD as f64);

    // Every new request, sent when the worker counts the idle backend at zero, goes to it.
    for _ in 0..20 {
        wait_for("the idle backend's last request to complete", LIMIT, || {
            in_flight(&duet, idle.address) == 0.0
        });
        assert_eq!(served_by(duet.address), "idle");
    }
    assert_eq!(
        (busy.received(), idle.received()),
        (HELD as u64, HELD as u64 + 20)
    );

    busy.open();
    let answers: Vec<String> = held
        .into_iter()
        .map(|request| request.join().expect("client thread"))
        .collect();
    let by = |name: &str| answers.iter().filter(|a| a.ends_with(name)).count();
    assert_eq!((by("busy"), by("idle")), (HELD, HELD), "{answers:?}");
}
