//! Soak: the release binary with 2 workers under every kind of traffic and fault at once, for a bounded
//! time, watching that nothing leaks and that every failure has a cause that was injected.
//!
//! ```sh
//! cargo bench --bench soak                      # 10 minutes (the full run)
//! SOAK_SECONDS=60 cargo bench --bench soak      # a short run
//! ```
//!
//! Traffic: keep-alive clients, a new connection per request, slow writers and slow readers, clients
//! that abort mid-body, pipelined requests, uploads, WebSocket tunnels. Faults: two backend processes
//! (`duet-backend`) killed and restarted in turn, a backend that never answers (504 by the route's
//! timeout), one that answers garbage (502), and a SIGHUP every few seconds with a rewritten config
//! (backends and routes change). Sampled each second: duet's open file descriptors and resident memory.
//! At the end: SIGTERM while requests are in flight, and the exit code and time. Writes `docs/src/lab/soak.md`.

use duet_testbed::{
    config::{Cluster, DuetConfig},
    raw::{read_head, read_response_async},
    Backend, BackendOptions, Misbehaviour, RawBackend,
};
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every kill-restart cycle: a backend dies, stays down this long, comes back.
const DOWN_FOR: Duration = Duration::from_secs(2);
/// Time between two backend kills.
const KILL_EVERY: Duration = Duration::from_secs(7);
/// Time between two reloads.
const RELOAD_EVERY: Duration = Duration::from_secs(3);
/// After a backend comes back, failures still caused by its death (pooled connections it reset,
/// an ejection that outlasts it) are counted against it for this long.
const KILL_AFTERMATH: Duration = Duration::from_secs(3);
/// A reload's effects (a worker switching routing tables mid-request) last at most this long.
const RELOAD_AFTERMATH: Duration = Duration::from_secs(1);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const UPLOAD_BYTES: usize = 256 * 1024;

/// One client kind's requests.
#[derive(Default)]
struct Tally {
    requests: u64,
    as_expected: u64,
    /// Each failure: when (seconds since the start) and what.
    failures: Vec<(f64, String)>,
}

/// What happened and when, shared by every task of the run.
struct Record {
    started: Instant,
    stop: AtomicBool,
    /// Per client kind.
    outcomes: Mutex<BTreeMap<&'static str, Tally>>,
    /// Keep-alive requests per answering backend (`x-backend`).
    served_by: Mutex<BTreeMap<String, u64>>,
    /// When SIGTERM was sent, in seconds since the start.
    term_at: Mutex<Option<f64>>,
    /// Requests that ended after SIGTERM (they were in flight when it came): as expected, failed.
    after_term: Mutex<(u64, u64)>,
    /// Injected faults: (kind, from, to) in seconds since the start.
    faults: Mutex<Vec<(&'static str, f64, f64)>>,
}

impl Record {
    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn outcome(&self, client: &'static str, result: Result<(), String>) {
        let at = self.now();
        let mut outcomes = self.outcomes.lock().expect("outcomes");
        let term_at = *self.term_at.lock().expect("term_at");
        if term_at.is_some_and(|term| at > term) {
            let mut after = self.after_term.lock().expect("after_term");
            match result {
                Ok(()) => after.0 += 1,
                Err(_) => after.1 += 1,
            }
        }
        let entry = outcomes.entry(client).or_default();
        entry.requests += 1;
        match result {
            Ok(()) => entry.as_expected += 1,
            Err(reason) => entry.failures.push((at, reason)),
        }
    }

    fn fault(&self, kind: &'static str, from: f64, to: f64) {
        self.faults.lock().expect("faults").push((kind, from, to));
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The fault windows closest to `at`, to look into an unexplained failure.
    fn nearest(&self, at: f64) -> String {
        let faults = self.faults.lock().expect("faults");
        let mut by_distance: Vec<_> = faults
            .iter()
            .map(|(kind, from, to)| ((at - from).abs().min((at - to).abs()), kind, from, to))
            .collect();
        by_distance.sort_by(|a, b| a.0.total_cmp(&b.0));
        let near: Vec<String> = by_distance
            .iter()
            .take(2)
            .map(|(_, kind, from, to)| format!("{kind} {from:.3}–{to:.3} s"))
            .collect();
        format!("nearest faults: {}", near.join(", "))
    }

    /// The injected fault a failure at `at` is explained by, if any.
    fn cause(&self, at: f64) -> &'static str {
        let faults = self.faults.lock().expect("faults");
        faults
            .iter()
            .rev()
            .find(|(_, from, to)| at >= *from && at <= *to)
            .map_or("unexplained", |(kind, _, _)| kind)
    }
}

/// A `duet-backend` process on a fixed address, so that it can be killed and started again there.
struct BackendProcess {
    name: String,
    address: SocketAddr,
    child: Option<Child>,
}

impl BackendProcess {
    fn start(name: &str, address: SocketAddr) -> Self {
        let mut process = Self {
            name: name.to_owned(),
            address,
            child: None,
        };
        process.restart();
        process
    }

    fn restart(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_duet-backend"))
            .args(["--listen", &self.address.to_string(), "--name", &self.name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn duet-backend");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("listening line");
        assert!(line.starts_with("listening on"), "{line}");
        self.child = Some(child);
    }

    /// SIGKILL: its connections are reset, as when a process crashes.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for BackendProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address")
}

/// The backends duet is configured with.
struct Backends {
    killable: [SocketAddr; 2],
    steady: SocketAddr,
    extra: SocketAddr,
    stall: SocketAddr,
    garbage: SocketAddr,
}

/// The config, in two variants that reloads alternate between: `b` adds a backend to `main` and a
/// route.
fn config(listen: SocketAddr, backends: &Backends, b: bool) -> String {
    let mut main = Cluster::new("main")
        .policy("p2c_peak_ewma")
        .backend(backends.killable[0])
        .backend(backends.killable[1])
        .backend(backends.steady)
        .set("health_check", "{ interval: 500ms, timeout: 300ms }");
    if b {
        main = main.backend(backends.extra);
    }
    let mut config = DuetConfig::new()
        .workers(2)
        .listen(listen)
        .route(None, "/stall/", "stall")
        .route(None, "/errors/", "errors");
    if b {
        config = config.route(None, "/more-errors/", "errors");
    }
    config
        .route(None, "/", "main")
        .cluster(main)
        .cluster(
            Cluster::new("stall")
                .backend(backends.stall)
                .set("timeouts", "{ response_headers: 300ms }")
                .set("retries", "{ attempts: 1 }"),
        )
        .cluster(
            Cluster::new("errors")
                .backend(backends.garbage)
                .set("retries", "{ attempts: 1 }")
                .set("outlier_detection", "{ consecutive_failures: 0 }"),
        )
        .section(
            "shutdown",
            &format!("{{ drain_timeout: {}s }}", DRAIN_TIMEOUT.as_secs()),
        )
        .to_yaml()
}

/// The duet process, its stderr scanned for panics and reloads.
struct Duet {
    child: Child,
    log: Arc<Mutex<Log>>,
}

#[derive(Default)]
struct Log {
    lines: u64,
    panics: Vec<String>,
    reloads: u64,
    errors: Vec<String>,
    /// Lines per level and message (numbers blanked), to say what duet complained about.
    kinds: BTreeMap<String, u64>,
}

impl Duet {
    fn start(config: &PathBuf) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_duet"))
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn,duet::cli=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn duet");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Log::default()));
        let (ready, listening) = std::sync::mpsc::channel();
        let shared = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = shared.lock().expect("log");
                log.lines += 1;
                if line.contains("panicked") {
                    log.panics.push(line.clone());
                }
                if line.contains("SIGHUP: reloaded") {
                    log.reloads += 1;
                }
                if let Some(kind) = kind_of(&line) {
                    *log.kinds.entry(kind).or_default() += 1;
                }
                if line.contains("ERROR") && log.errors.len() < 20 {
                    log.errors.push(line.clone());
                }
                if line.contains("listening on http://") {
                    let _ = ready.send(());
                }
            }
        });
        listening
            .recv_timeout(Duration::from_secs(20))
            .expect("duet listening");
        Self { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    }
}

impl Drop for Duet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A log line's level and message with its numbers and addresses blanked, for counting by kind.
fn kind_of(line: &str) -> Option<String> {
    let level = ["ERROR", "WARN", "INFO"]
        .into_iter()
        .find(|level| line.contains(level))?;
    let message = line.split_once(level).map_or(line, |(_, rest)| rest);
    let blanked: String = message
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    let mut words: Vec<&str> = blanked.split_whitespace().collect();
    words.truncate(12);
    Some(format!("{level} {}", words.join(" ")))
}

/// `/proc/PID/fd` entries and `VmRSS` (KiB).
fn sample(pid: u32) -> Option<(usize, u64)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    Some((fds, rss))
}

fn seconds() -> u64 {
    std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let duration = Duration::from_secs(seconds());
    let steady = Backend::start(BackendOptions {
        record_requests: false,
        ..BackendOptions::named("steady")
    })
    .expect("steady");
    let extra = Backend::start(BackendOptions {
        record_requests: false,
        ..BackendOptions::named("extra")
    })
    .expect("extra");
    let stall = RawBackend::start(Misbehaviour::Hang).expect("stall");
    let garbage = RawBackend::start(Misbehaviour::Garbage).expect("garbage");
    let mut killable = [
        BackendProcess::start("k1", free_address()),
        BackendProcess::start("k2", free_address()),
    ];
    let backends = Backends {
        killable: [killable[0].address, killable[1].address],
        steady: steady.address(),
        extra: extra.address(),
        stall: stall.address(),
        garbage: garbage.address(),
    };
    let listen = free_address();
    let path = std::env::temp_dir().join(format!("duet-soak-{}.yaml", std::process::id()));
    std::fs::write(&path, config(listen, &backends, false)).expect("write config");
    let mut duet = Duet::start(&path);
    let record = Arc::new(Record {
        started: Instant::now(),
        stop: AtomicBool::new(false),
        outcomes: Mutex::new(BTreeMap::new()),
        term_at: Mutex::new(None),
        after_term: Mutex::new((0, 0)),
        served_by: Mutex::new(BTreeMap::new()),
        faults: Mutex::new(Vec::new()),
    });
    eprintln!(
        "soak: {} s against duet pid {} on {listen}",
        duration.as_secs(),
        duet.pid()
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let clients = runtime.block_on(async { spawn_clients(listen, &record) });
    let samples = drive_faults(
        &duet,
        &mut killable,
        &backends,
        listen,
        &path,
        duration,
        &record,
    );

    // Drain: SIGTERM while the last requests (slow clients, tunnels) are still in flight.
    record.stop.store(true, Ordering::Relaxed);
    let term_at = record.now();
    *record.term_at.lock().expect("term_at") = Some(term_at);
    record.fault("drain (SIGTERM)", term_at, f64::MAX);
    duet.signal("TERM");
    let terminated = Instant::now();
    let exit = duet_testbed::wait::poll_until(DRAIN_TIMEOUT + Duration::from_secs(5), || {
        duet.child.try_wait().ok().flatten()
    });
    let drained_in = terminated.elapsed();
    runtime.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            for client in clients {
                let _ = client.await;
            }
        })
        .await;
    });
    let report = report(&record, &duet, &samples, exit, drained_in, duration);
    println!("{report}");
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/lab/soak.md");
    std::fs::write(&docs, report).expect("write docs/src/lab/soak.md");
    eprintln!("soak: wrote {}", docs.display());
    let _ = std::fs::remove_file(&path);
}

/// The fault schedule and the sampling, on the main thread, until `duration` has passed: a kill every
/// `KILL_EVERY` (alternating backends, each down for `DOWN_FOR`), a reload every `RELOAD_EVERY`, a
/// sample of duet's fds and RSS every second.
fn drive_faults(
    duet: &Duet,
    killable: &mut [BackendProcess; 2],
    backends: &Backends,
    listen: SocketAddr,
    path: &PathBuf,
    duration: Duration,
    record: &Record,
) -> Vec<(f64, usize, u64)> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let (mut next_kill, mut next_reload, mut next_sample) =
        (KILL_EVERY, RELOAD_EVERY, Duration::ZERO);
    let mut down: Option<(usize, Duration, f64)> = None;
    let (mut kills, mut variant_b) = (0usize, false);
    while started.elapsed() < duration {
        let now = started.elapsed();
        if now >= next_sample {
            if let Some((fds, rss)) = sample(duet.pid()) {
                samples.push((record.now(), fds, rss));
            }
            next_sample += Duration::from_secs(1);
        }
        if let Some((which, until, killed_at)) = down {
            if now >= until {
                killable[which].restart();
                let back = record.now();
                record.fault(
                    "backend killed",
                    killed_at,
                    back + KILL_AFTERMATH.as_secs_f64(),
                );
                down = None;
            }
        } else if now >= next_kill {
            let which = kills % 2;
            // The fault starts before the signal: a tunnel may see its EOF before `kill` returns.
            let killed_at = record.now();
            killable[which].kill();
            down = Some((which, now + DOWN_FOR, killed_at));
            kills += 1;
            next_kill += KILL_EVERY;
        }
        if now >= next_reload {
            variant_b = !variant_b;
            std::fs::write(path, config(listen, backends, variant_b)).expect("rewrite config");
            let at = record.now();
            duet.signal("HUP");
            record.fault("reload", at, at + RELOAD_AFTERMATH.as_secs_f64());
            next_reload += RELOAD_EVERY;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some((which, _, killed_at)) = down {
        killable[which].restart();
        record.fault(
            "backend killed",
            killed_at,
            record.now() + KILL_AFTERMATH.as_secs_f64(),
        );
    }
    samples
}

type Task = tokio::task::JoinHandle<()>;

/// Every client kind, each in its own task(s), until the record says stop.
fn spawn_clients(listen: SocketAddr, record: &Arc<Record>) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut spawn = |future: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
        tasks.push(tokio::spawn(future));
    };
    for _ in 0..3 {
        spawn(Box::pin(keep_alive(listen, record.clone())));
    }
    for _ in 0..2 {
        spawn(Box::pin(new_connections(listen, record.clone())));
    }
    spawn(Box::pin(pipelined(listen, record.clone())));
    spawn(Box::pin(slow_writer(listen, record.clone())));
    spawn(Box::pin(slow_reader(listen, record.clone())));
    spawn(Box::pin(aborted_uploads(listen, record.clone())));
    spawn(Box::pin(uploads(listen, record.clone())));
    spawn(Box::pin(tunnels(listen, record.clone())));
    spawn(Box::pin(expected_status(
        listen,
        record.clone(),
        "stalling backend",
        "/stall/x",
        504,
    )));
    spawn(Box::pin(expected_status(
        listen,
        record.clone(),
        "garbage backend",
        "/errors/x",
        502,
    )));
    tasks
}

/// A short name for what went wrong with an I/O operation.
fn io_failure(what: &str, error: &std::io::Error) -> String {
    format!("{what}: {:?}", error.kind())
}

/// One request on a new connection: its response, within 10 s.
async fn exchange(
    listen: SocketAddr,
    request: &[u8],
) -> Result<duet_testbed::raw::RawResponse, String> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(listen)
            .await
            .map_err(|e| io_failure("connect", &e))?;
        stream
            .write_all(request)
            .await
            .map_err(|e| io_failure("write", &e))?;
        read_response_async(&mut stream, &mut Vec::new())
            .await
            .map_err(|e| io_failure("read", &e))
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .unwrap_or_else(|_| Err("no response in 10 s".to_owned()))
}

fn expect_status(response: &duet_testbed::raw::RawResponse, status: u16) -> Result<(), String> {
    if response.status() == status {
        Ok(())
    } else {
        Err(format!("status {}", response.status()))
    }
}

async fn keep_alive(listen: SocketAddr, record: Arc<Record>) {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let uri: hyper::Uri = format!("http://{listen}/keep-alive").parse().expect("uri");
    while !record.stopping() {
        let result = async {
            let response = client.get(uri.clone()).await.map_err(|e| {
                if e.is_connect() {
                    "connect".to_owned()
                } else {
                    "connection closed".to_owned()
                }
            })?;
            let status = response.status().as_u16();
            let backend = response
                .headers()
                .get("x-backend")
                .and_then(|v| v.to_str().ok());
            if let Some(backend) = backend {
                *record
                    .served_by
                    .lock()
                    .expect("served_by")
                    .entry(backend.to_owned())
                    .or_default() += 1;
            }
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|_| "body cut".to_owned())?;
            match (status, body.to_bytes().is_empty()) {
                (200, false) => Ok(()),
                (status, _) => Err(format!("status {status}")),
            }
        };
        let result = tokio::time::timeout(Duration::from_secs(10), result)
            .await
            .unwrap_or_else(|_| Err("no response in 10 s".to_owned()));
        record.outcome("keep-alive", result);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn new_connections(listen: SocketAddr, record: Arc<Record>) {
    let request = b"GET /new HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n";
    while !record.stopping() {
        let result = exchange(listen, request)
            .await
            .and_then(|r| expect_status(&r, 200));
        record.outcome("new connection", result);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Eight requests written at once, the last asking to close; eight responses in order.
async fn pipelined(listen: SocketAddr, record: Arc<Record>) {
    let mut batch = Vec::new();
    for i in 0..8 {
        let close = if i == 7 { "Connection: close\r\n" } else { "" };
        batch.extend_from_slice(
            format!("GET /pipe/{i} HTTP/1.1\r\nHost: soak\r\n{close}\r\n").as_bytes(),
        );
    }
    while !record.stopping() {
        let results = async {
            let mut stream = tokio::net::TcpStream::connect(listen)
                .await
                .map_err(|e| io_failure("connect", &e))?;
            stream
                .write_all(&batch)
                .await
                .map_err(|e| io_failure("write", &e))?;
            let mut pending = Vec::new();
            let mut results = Vec::new();
            for _ in 0..8 {
                let response = read_response_async(&mut stream, &mut pending).await;
                results.push(
                    response
                        .map_err(|e| io_failure("read", &e))
                        .and_then(|r| expect_status(&r, 200)),
                );
            }
            Ok::<_, String>(results)
        };
        match tokio::time::timeout(Duration::from_secs(10), results).await {
            Ok(Ok(results)) => results
                .into_iter()
                .for_each(|r| record.outcome("pipelined", r)),
            Ok(Err(reason)) => {
                (0..8).for_each(|_| record.outcome("pipelined", Err(reason.clone())))
            }
            Err(_) => (0..8)
                .for_each(|_| record.outcome("pipelined", Err("no response in 10 s".to_owned()))),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A head written in four pieces 150 ms apart.
async fn slow_writer(listen: SocketAddr, record: Arc<Record>) {
    let request =
        b"GET /slow-writer HTTP/1.1\r\nHost: soak\r\nX-Slow: yes\r\nConnection: close\r\n\r\n";
    while !record.stopping() {
        let result = async {
            let mut stream = tokio::net::TcpStream::connect(listen)
                .await
                .map_err(|e| io_failure("connect", &e))?;
            for piece in request.chunks(request.len().div_ceil(4)) {
                stream
                    .write_all(piece)
                    .await
                    .map_err(|e| io_failure("write", &e))?;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            let response = read_response_async(&mut stream, &mut Vec::new())
                .await
                .map_err(|e| io_failure("read", &e))?;
            expect_status(&response, 200)
        };
        let result = tokio::time::timeout(Duration::from_secs(10), result)
            .await
            .unwrap_or_else(|_| Err("no response in 10 s".to_owned()));
        record.outcome("slow writer", result);
    }
}

/// 32 MiB read 64 KiB at a time, 2 ms apart: more than loopback's socket buffers hold, so duet holds
/// the rest and waits on the client.
async fn slow_reader(listen: SocketAddr, record: Arc<Record>) {
    const SIZE: usize = 32 * 1024 * 1024;
    let request = format!("GET /bytes/{SIZE} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n");
    while !record.stopping() {
        let result = async {
            let mut stream = tokio::net::TcpStream::connect(listen)
                .await
                .map_err(|e| io_failure("connect", &e))?;
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| io_failure("write", &e))?;
            let mut received = Vec::new();
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = stream
                    .read(&mut buffer)
                    .await
                    .map_err(|e| io_failure("read", &e))?;
                if n == 0 {
                    break;
                }
                received.extend_from_slice(&buffer[..n]);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let head = duet_testbed::raw::head_end(&received).ok_or("no head")?;
            let status = duet_testbed::raw::status(&String::from_utf8_lossy(&received[..head]));
            match (status, received.len() - head) {
                (200, SIZE) => Ok(()),
                (200, n) => Err(format!("body cut at {n} bytes")),
                (status, _) => Err(format!("status {status}")),
            }
        };
        let result = tokio::time::timeout(Duration::from_secs(20), result)
            .await
            .unwrap_or_else(|_| Err("no response in 20 s".to_owned()));
        record.outcome("slow reader", result);
    }
}

/// Announces 1 MiB, sends 64 KiB, hangs up: the abort is the injected fault, counted as sent.
async fn aborted_uploads(listen: SocketAddr, record: Arc<Record>) {
    let head = b"POST /upload HTTP/1.1\r\nHost: soak\r\nContent-Length: 1048576\r\n\r\n";
    let part = vec![b'u'; 64 * 1024];
    while !record.stopping() {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(listen).await {
            let _ = stream.write_all(head).await;
            let _ = stream.write_all(&part).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        record.outcome("aborted mid-body", Ok(()));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// 256 KiB uploads, alternately with a Content-Length and chunked; the backend answers the length.
async fn uploads(listen: SocketAddr, record: Arc<Record>) {
    let body = vec![b'u'; UPLOAD_BYTES];
    let mut chunked = false;
    while !record.stopping() {
        let mut request = if chunked {
            let mut r = b"POST /upload HTTP/1.1\r\nHost: soak\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
            for chunk in body.chunks(64 * 1024) {
                r.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                r.extend_from_slice(chunk);
                r.extend_from_slice(b"\r\n");
            }
            r.extend_from_slice(b"0\r\n\r\n");
            r
        } else {
            format!("POST /upload HTTP/1.1\r\nHost: soak\r\nContent-Length: {UPLOAD_BYTES}\r\nConnection: close\r\n\r\n").into_bytes()
        };
        if !chunked {
            request.extend_from_slice(&body);
        }
        let result = exchange(listen, &request).await.and_then(|r| {
            expect_status(&r, 200)?;
            (r.body == UPLOAD_BYTES.to_string().as_bytes())
                .then_some(())
                .ok_or_else(|| format!("backend read {}", String::from_utf8_lossy(&r.body)))
        });
        record.outcome(
            if chunked {
                "upload (chunked)"
            } else {
                "upload (length)"
            },
            result,
        );
        chunked = !chunked;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A WebSocket upgrade, then 20 messages echoed through the tunnel, then a close.
async fn tunnels(listen: SocketAddr, record: Arc<Record>) {
    let request = b"GET /upgrade HTTP/1.1\r\nHost: soak\r\nConnection: upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    while !record.stopping() {
        // The tunnel is checked with blocking reads on a blocking thread, byte-exact.
        let result = tokio::task::spawn_blocking(move || {
            let mut stream =
                std::net::TcpStream::connect(listen).map_err(|e| io_failure("connect", &e))?;
            tunnel_round_trips(&mut stream, request)
        })
        .await
        .unwrap_or_else(|_| Err("tunnel task".to_owned()));
        record.outcome("websocket tunnel", result);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tunnel_round_trips(stream: &mut std::net::TcpStream, request: &[u8]) -> Result<(), String> {
    use std::io::{Read, Write};
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| io_failure("socket", &e))?;
    stream
        .write_all(request)
        .map_err(|e| io_failure("write", &e))?;
    let head = read_head(stream).map_err(|e| io_failure("read head", &e))?;
    if duet_testbed::raw::status(&head) != 101 {
        return Err(format!("status {}", duet_testbed::raw::status(&head)));
    }
    let mut echoed = [0u8; 32];
    for i in 0..20u8 {
        let message = [i; 32];
        stream
            .write_all(&message)
            .map_err(|e| io_failure("tunnel write", &e))?;
        stream
            .read_exact(&mut echoed)
            .map_err(|e| io_failure("tunnel read", &e))?;
        if echoed != message {
            return Err("tunnel echoed other bytes".to_owned());
        }
    }
    Ok(())
}

/// Requests whose failure is the point: success is the status the fault should produce.
async fn expected_status(
    listen: SocketAddr,
    record: Arc<Record>,
    client: &'static str,
    path: &'static str,
    status: u16,
) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n");
    while !record.stopping() {
        let result = exchange(listen, request.as_bytes())
            .await
            .and_then(|r| expect_status(&r, status));
        record.outcome(client, result);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The report as Markdown: traffic and failures by cause, faults, resources over time, drain.
fn report(
    record: &Record,
    duet: &Duet,
    samples: &[(f64, usize, u64)],
    exit: Option<std::process::ExitStatus>,
    drained_in: Duration,
    duration: Duration,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Soak run\n");
    let _ = writeln!(
        out,
        "`benches/soak.rs`: the release `duet` with 2 workers under every kind of traffic and fault at \
         once (see the bench's docs). This run: **{} s** (`SOAK_SECONDS={}`) on a shared 2-core machine \
         (other builds and tests ran at the same time, so rates are not a throughput figure). The full \
         run is 10 minutes:\n\n```sh\ncargo bench --bench soak                  # 10 minutes\nSOAK_SECONDS=60 cargo bench --bench soak  # this run\n```\n",
        duration.as_secs(),
        duration.as_secs()
    );
    traffic_table(&mut out, record);
    faults_section(&mut out, record, duet);
    resources_table(&mut out, samples);
    let log = duet.log.lock().expect("log");
    let code = exit.and_then(|e| e.code());
    let _ = writeln!(out, "## End\n");
    let (drained, cut) = *record.after_term.lock().expect("after_term");
    let _ = writeln!(
        out,
        "- Drain: SIGTERM while clients were mid-request; duet exited with code {} in {:.2} s (drain \
         timeout {} s). Requests that ended after the SIGTERM: {drained} as expected, {cut} failed \
         (refused or cut by the drain).",
        code.map_or_else(|| "none (still running or killed)".to_owned(), |c| c.to_string()),
        drained_in.as_secs_f64(),
        DRAIN_TIMEOUT.as_secs()
    );
    let _ = writeln!(
        out,
        "- Panics in duet's stderr: {} ({} lines scanned at `RUST_LOG=warn,duet::cli=info`).",
        log.panics.len(),
        log.lines
    );
    for line in log.panics.iter().chain(&log.errors).take(10) {
        let _ = writeln!(out, "  - `{line}`");
    }
    let _ = writeln!(out, "- duet's log lines by kind (numbers shown as `#`):");
    let mut kinds: Vec<_> = log.kinds.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1));
    for (kind, n) in kinds.into_iter().take(12) {
        let _ = writeln!(out, "  - {n} × `{}`", kind.replace('`', "'"));
    }
    out
}

fn traffic_table(out: &mut String, record: &Record) {
    let outcomes = record.outcomes.lock().expect("outcomes");
    let _ = writeln!(out, "## Traffic\n");
    let _ = writeln!(
        out,
        "| client | requests | as expected | failed | failures by cause |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    let (mut sent, mut failed, mut unexplained) = (0, 0, Vec::new());
    for (client, tally) in outcomes.iter() {
        let failures = &tally.failures;
        let mut by_cause: BTreeMap<(String, &str), u64> = BTreeMap::new();
        for (at, reason) in failures {
            let cause = record.cause(*at);
            if cause == "unexplained" {
                unexplained.push((client, *at, reason.clone()));
            }
            *by_cause.entry((reason.clone(), cause)).or_default() += 1;
        }
        let causes: Vec<String> = by_cause
            .iter()
            .map(|((reason, cause), n)| format!("{n} × {reason} ({cause})"))
            .collect();
        let _ = writeln!(
            out,
            "| {client} | {} | {} | {} | {} |",
            tally.requests,
            tally.as_expected,
            failures.len(),
            causes.join("; ")
        );
        sent += tally.requests;
        failed += failures.len();
    }
    let _ = writeln!(
        out,
        "| **total** | **{sent}** | | **{failed}** | **{} not explained by an injected fault** |\n",
        unexplained.len()
    );
    for (client, at, reason) in &unexplained {
        let _ = writeln!(
            out,
            "- Not explained: {client} at {at:.3} s: {reason}; {}",
            record.nearest(*at)
        );
    }
    let _ = writeln!(
        out,
        "\"As expected\" is a 200 (a 101 and 20 echoes for a tunnel, the length for an upload), a 504 from the \
         stalling backend and a 502 from the garbage one; an aborted upload counts when it was sent. A \
         failure's cause is the injected fault whose window it falls in: a backend kill (from the kill to \
         {} s after the restart), a reload ({} s after the SIGHUP), or the final drain.\n",
        KILL_AFTERMATH.as_secs(),
        RELOAD_AFTERMATH.as_secs()
    );
}

fn faults_section(out: &mut String, record: &Record, duet: &Duet) {
    let faults = record.faults.lock().expect("faults");
    let kills = faults.iter().filter(|f| f.0 == "backend killed").count();
    let reloads = faults.iter().filter(|f| f.0 == "reload").count();
    let applied = duet.log.lock().expect("log").reloads;
    let _ = writeln!(out, "## Faults\n");
    let _ = writeln!(
        out,
        "- {kills} backend kills (SIGKILL of a `duet-backend` process, alternating between two, each down {} s, one every {} s).",
        DOWN_FOR.as_secs(),
        KILL_EVERY.as_secs()
    );
    let _ = writeln!(
        out,
        "- {reloads} reloads sent (SIGHUP every {} s, alternating two configs: `main` gains and loses a backend, a route comes and goes); {applied} logged as applied.",
        RELOAD_EVERY.as_secs()
    );
    let served: Vec<String> = record
        .served_by
        .lock()
        .expect("served_by")
        .iter()
        .map(|(backend, n)| format!("{backend} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "- Keep-alive requests by answering backend (k1 and k2 are the ones killed; extra is in `main` \
         only in every other config): {}.",
        served.join(", ")
    );
    let _ = writeln!(
        out,
        "- Throughout: a backend that never answers (`/stall/`, 300 ms `response_headers` timeout) and one that answers garbage (`/errors/`).\n"
    );
}

fn resources_table(out: &mut String, samples: &[(f64, usize, u64)]) {
    let _ = writeln!(out, "## Resources (duet process, sampled every second)\n");
    if samples.is_empty() {
        let _ = writeln!(out, "No samples.\n");
        return;
    }
    let _ = writeln!(out, "| t (s) | open fds | RSS (MiB) |");
    let _ = writeln!(out, "|---:|---:|---:|");
    let rows = 12.min(samples.len());
    for i in 0..rows {
        let (t, fds, rss) = samples[i * (samples.len() - 1) / (rows - 1).max(1)];
        let _ = writeln!(out, "| {t:.0} | {fds} | {:.1} |", rss as f64 / 1024.0);
    }
    let fds = samples.iter().map(|s| s.1);
    let rss = samples.iter().map(|s| s.2);
    let (fd_min, fd_max) = (fds.clone().min().unwrap_or(0), fds.max().unwrap_or(0));
    let (rss_min, rss_max) = (rss.clone().min().unwrap_or(0), rss.max().unwrap_or(0));
    // Warm-up (pools and buffers filling) is the first tenth of the run; after it, growth is a leak.
    let warm = &samples[samples.len() / 10..];
    let half = warm.len() / 2;
    let mean = |s: &[(f64, usize, u64)]| {
        s.iter().map(|x| x.2 as f64).sum::<f64>() / s.len().max(1) as f64 / 1024.0
    };
    let _ = writeln!(
        out,
        "\nOpen fds ranged {fd_min}–{fd_max}; RSS {:.1}–{:.1} MiB. After warm-up, mean RSS was {:.1} MiB in the first half and {:.1} MiB in the second.\n",
        rss_min as f64 / 1024.0,
        rss_max as f64 / 1024.0,
        mean(&warm[..half]),
        mean(&warm[half..])
    );
}
