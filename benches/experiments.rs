//! Real-traffic experiments through the real `duet` binary and real loopback backends, reproducing
//! published setups. Writes tables to stdout, JSON and SVG plots under `docs/src/figures/`.
//!
//! ```sh
//! cargo bench --bench experiments -- tower      # tower PR #76: 10 backends of very different latency
//! cargo bench --bench experiments -- linkerd    # Linkerd "beyond round robin": one backend goes slow
//! cargo bench --bench experiments -- capacity   # finite-capacity backends at 85% and 95%, 1 and 2 workers
//! DUET_REPEAT=3 DUET_TARGETS=least_inflight,nginx,haproxy cargo bench --bench experiments -- capacity
//!                                               # medians of 3 interleaved rounds, three targets
//! cargo bench --bench experiments -- stalls     # random stalls on every backend, hedged or not
//! cargo bench --bench experiments -- hedge-slow # one slow backend, one degrading: hedged or not
//! cargo bench --bench experiments -- --quick    # all of them, scaled down
//! ```

#[path = "experiments/machine.rs"]
mod machine;

use duet_sim::plot::{self, Axes, Series};
use duet_testbed::{
    config::DuetConfig,
    load::{closed_loop, open_loop, Sample},
    Backend, BackendOptions,
};
use serde_json::json;
use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

const POLICIES: [&str; 3] = ["round_robin", "p2c_inflight", "p2c_peak_ewma"];

/// The policies to run: all, or those named in `DUET_POLICIES` (comma-separated).
fn policies() -> Vec<&'static str> {
    let wanted = std::env::var("DUET_POLICIES").unwrap_or_default();
    POLICIES
        .into_iter()
        .filter(|p| wanted.is_empty() || wanted.split(',').any(|w| w.trim() == *p))
        .collect()
}

struct Duet {
    child: Child,
    address: SocketAddr,
    _config: PathBuf,
}

impl Duet {
    fn start(workers: usize, policy: &str, backends: &[SocketAddr]) -> Self {
        Self::start_checked(workers, policy, backends, None)
    }

    /// Like `start`, with the route's `hedge:` set to `hedge` (the YAML of one).
    fn start_hedged(workers: usize, policy: &str, backends: &[SocketAddr], hedge: &str) -> Self {
        let yaml = Self::yaml(workers, policy, backends, None).replace(
            "cluster: app }",
            &format!("cluster: app, hedge: {hedge} }}"),
        );
        Self::run(&yaml, &format!("{policy}-hedged-{workers}"))
    }

    /// Balancing alone: no retries, no ejection, so each policy is measured by its choices; with
    /// `health_check` (the YAML of one), active checks as an operator would run them.
    fn start_checked(
        workers: usize,
        policy: &str,
        backends: &[SocketAddr],
        health_check: Option<&str>,
    ) -> Self {
        let yaml = Self::yaml(workers, policy, backends, health_check);
        Self::run(&yaml, &format!("{policy}-{workers}"))
    }

    fn yaml(
        workers: usize,
        policy: &str,
        backends: &[SocketAddr],
        health_check: Option<&str>,
    ) -> String {
        DuetConfig::single(policy, backends)
            .workers(workers)
            .with_cluster("app", |c| {
                let c = c
                    .set("retries", "{ attempts: 1 }")
                    .set("outlier_detection", "{ consecutive_failures: 0 }");
                match health_check {
                    Some(check) => c.set("health_check", check),
                    None => c,
                }
            })
            .to_yaml()
    }

    /// The binary on `yaml`, once it listens (`label` names its config file).
    fn run(yaml: &str, label: &str) -> Self {
        let config = std::env::temp_dir().join(format!(
            "duet-experiment-{}-{label}.yaml",
            std::process::id()
        ));
        std::fs::write(&config, yaml).expect("write config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_duet"))
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "error,duet::cli=info")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn duet");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let address = loop {
            let line = lines.next().expect("duet exited").expect("read");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .parse()
                    .expect("address");
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            address,
            _config: config,
        }
    }
}

impl Drop for Duet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self._config);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// An open-loop run's success rate, and its latency quantiles in milliseconds (timed-out requests
/// count at the timeout).
fn summary(samples: &[Sample]) -> (f64, impl Fn(f64) -> f64) {
    let ok = samples.iter().filter(|s| s.ok).count();
    let success = ok as f64 / samples.len().max(1) as f64;
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let quantile = move |x: f64| {
        let at = ((latencies.len() as f64 * x) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(at).map_or(0.0, |d| ms(*d))
    };
    (success, quantile)
}

fn docs() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/figures");
    std::fs::create_dir_all(dir.join("experiments")).expect("docs dir");
    dir
}

/// tower PR #76: 10 backends whose latency is uniform in [0, max), max = 1, 10×4, 100×4, 1000 ms, each
/// limited to 50 concurrent requests; 50 concurrent clients.
fn tower(requests: usize) {
    let maxes = [1u64, 10, 10, 10, 10, 100, 100, 100, 100, 1000];
    let backends: Vec<Backend> = maxes
        .iter()
        .enumerate()
        .map(|(i, &max)| {
            Backend::start(
                BackendOptions::named(&format!("b{i}-{max}ms"))
                    .uniform_delay(Duration::ZERO, Duration::from_millis(max))
                    .max_concurrency(50),
            )
            .expect("backend")
        })
        .collect();
    let addresses: Vec<_> = backends.iter().map(Backend::address).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    println!("tower PR #76 setup: {requests} requests, 50 concurrent clients, 1 duet worker");
    println!(
        "{:<15} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "policy", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "errors"
    );
    let mut results = Vec::new();
    let mut cdf = Vec::new();
    for policy in policies() {
        let duet = Duet::start(1, policy, &addresses);
        let uri = format!("http://{}/", duet.address).parse().expect("uri");
        let report = runtime.block_on(closed_loop(uri, requests, 50, Duration::from_secs(30)));
        let q = |x| ms(report.percentile(x));
        println!(
            "{policy:<15} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8}",
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            report.errors
        );
        results.push(json!({
            "policy": policy, "requests": requests, "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99),
            "p999_ms": q(0.999), "errors": report.errors, "shares": report.by_backend,
        }));
        let n = report.latencies.len().max(1) as f64;
        let step = (report.latencies.len() / 400).max(1);
        cdf.push(Series {
            name: policy.to_owned(),
            points: report
                .latencies
                .iter()
                .enumerate()
                .step_by(step)
                .map(|(i, l)| (ms(*l).max(0.01), (i + 1) as f64 / n))
                .collect(),
        });
    }
    println!("tower's published figures: PeakEWMA p99 96 ms, p99.9 105 ms; least-loaded p99.9 857 ms; round robin p99 906 ms");
    let docs = docs();
    let _ = std::fs::write(
        docs.join("experiments/tower.json"),
        serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
    if let Err(e) = plot::line_chart(
        &docs.join("latency-cdf.svg"),
        "Latency CDF, tower PR #76 setup through duet",
        "latency (ms, log scale)",
        "fraction of requests",
        &cdf,
        Axes {
            log_x: true,
            log_y: false,
        },
    ) {
        eprintln!("plot: {e}");
    }
}

/// Health checks for the `+hc` run of the Linkerd experiment: `/`, the path clients use (the testbed's
/// `/healthz` answers at once whatever the backend's delay), every 500 ms, failing past 1 s.
const LINKERD_CHECK: &str =
    "{ path: /, interval: 500ms, timeout: 1s, unhealthy_threshold: 2, healthy_threshold: 1 }";

/// Linkerd "beyond round robin", scaled to a 2-core machine: 11 backends around 167 ms, one held at 2 s
/// for the middle half of the run, open-loop fixed rate, 1 s client timeout.
fn linkerd(seconds: u64, rate: f64) {
    let duration = Duration::from_secs(seconds);
    println!("\nLinkerd setup: 11 backends ~167 ms (117-217), b0 at 2 s from {}s to {}s; {rate} req/s open loop for {seconds} s; 1 s timeout", seconds / 4, 3 * seconds / 4);
    println!(
        "{:<17} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "policy", "workers", "success", "p50 ms", "p99 ms", "p99.9 ms"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut results = Vec::new();
    let mut shares = Vec::new();
    let mut every_backend: Vec<Series> = Vec::new();
    let mut recovery = Vec::new();
    // The same runs for the recommended policy with active health checks on the path clients use:
    // probes that cost no client request are what can see a starved backend recover.
    let mut variants: Vec<(String, &str, Option<&str>)> = policies()
        .into_iter()
        .map(|p| (p.to_owned(), p, None))
        .collect();
    if policies().contains(&"p2c_peak_ewma") {
        variants.push((
            "p2c_peak_ewma+hc".to_owned(),
            "p2c_peak_ewma",
            Some(LINKERD_CHECK),
        ));
    }
    for workers in [1usize, 2, 4] {
        for (label, policy, check) in &variants {
            let (label, policy) = (label.as_str(), *policy);
            let backends: Vec<Backend> = (0..11)
                .map(|i| {
                    let mut options = BackendOptions::named(&format!("b{i}"))
                        .uniform_delay(Duration::from_millis(117), Duration::from_millis(217));
                    if i == 0 {
                        options = options.slow_between(
                            duration / 4,
                            duration * 3 / 4,
                            Duration::from_secs(2),
                        );
                    }
                    Backend::start(options).expect("backend")
                })
                .collect();
            let addresses: Vec<_> = backends.iter().map(Backend::address).collect();
            let duet = Duet::start_checked(workers, policy, &addresses, *check);
            let uri = format!("http://{}/", duet.address).parse().expect("uri");
            let samples = runtime.block_on(open_loop(uri, rate, duration, Duration::from_secs(1)));
            let (success, q) = summary(&samples);
            println!(
                "{label:<17} {workers:>7} {:>8.2}% {:>9.1} {:>9.1} {:>9.1}",
                success * 100.0,
                q(0.5),
                q(0.99),
                q(0.999)
            );
            // When the failed requests were sent: at the onset of the slowness, or spread over it.
            let failed_at: Vec<f64> = samples
                .iter()
                .filter(|s| !s.ok)
                .map(|s| (s.sent_at.as_secs_f64() * 10.0).round() / 10.0)
                .collect();
            if policy == "p2c_peak_ewma" {
                println!("{:>23} failed requests sent at (s): {failed_at:?}", "");
            }
            results.push(json!({
                "policy": label, "workers": workers, "requests": samples.len(), "success_rate": success,
                "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "failed_sent_at_s": failed_at,
            }));
            let slow = backends[0].requests_per_second();
            let all: Vec<Vec<u64>> = backends.iter().map(Backend::requests_per_second).collect();
            // Seconds after b0 recovers until its share is back within 20% of its fair share (1/11).
            let recovered_at = 3 * seconds as usize / 4;
            let back = (recovered_at..seconds as usize).find(|&t| {
                let total: u64 = all.iter().map(|b| b.get(t).copied().unwrap_or(0)).sum();
                slow.get(t).copied().unwrap_or(0) as f64 / total.max(1) as f64 >= 0.8 / 11.0
            });
            let back_in = back.map(|t| (t - recovered_at) as f64);
            recovery.push(format!(
                "{label} ({workers} worker{}): {}",
                if workers == 1 { "" } else { "s" },
                back_in.map_or("not within the run".to_owned(), |s| format!("{s} s"))
            ));
            if let Some(last) = results.last_mut() {
                last["recovered_within_s"] = json!(back_in);
            }
            if workers == 1 {
                // The degraded backend's share of what reached the backends, second by second.
                let points = (0..seconds as usize)
                    .map(|t| {
                        let total: u64 = all.iter().map(|b| b.get(t).copied().unwrap_or(0)).sum();
                        (
                            t as f64,
                            slow.get(t).copied().unwrap_or(0) as f64 / total.max(1) as f64,
                        )
                    })
                    .collect();
                shares.push(Series {
                    name: label.to_owned(),
                    points,
                });
                if label == "p2c_peak_ewma" {
                    // Every backend's share, second by second, for the policy duet recommends.
                    let share = |counts: &Vec<u64>, t: usize| {
                        let total: u64 = all.iter().map(|b| b.get(t).copied().unwrap_or(0)).sum();
                        counts.get(t).copied().unwrap_or(0) as f64 / total.max(1) as f64
                    };
                    every_backend = all
                        .iter()
                        .enumerate()
                        .map(|(i, counts)| Series {
                            name: format!("b{i}{}", if i == 0 { " (slow mid-run)" } else { "" }),
                            points: (0..seconds as usize)
                                .map(|t| (t as f64, share(counts, t)))
                                .collect(),
                        })
                        .collect();
                }
            }
        }
    }
    println!("Linkerd reported success rates of ~95% (round robin), ~99% (least loaded), ~99.9% (PeakEWMA)");
    println!("b0 back to within 20% of its fair share after it recovers (whole seconds, from the backends' per-second counts):");
    for line in &recovery {
        println!("  {line}");
    }
    let docs = docs();
    let _ = std::fs::write(
        docs.join("experiments/linkerd.json"),
        serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
    if let Err(e) = plot::line_chart(
        &docs.join("degraded-share.svg"),
        "Share of requests sent to the backend that turns slow (1 worker)",
        "seconds (slow during the middle half)",
        "share of requests",
        &shares,
        Axes::default(),
    ) {
        eprintln!("plot: {e}");
    }
    if let Err(e) = plot::line_chart(
        &docs.join("backend-shares.svg"),
        "Each backend's share over time, p2c_peak_ewma, 1 worker",
        "seconds (b0 slow during the middle half)",
        "share of requests",
        &every_backend,
        Axes::default(),
    ) {
        eprintln!("plot: {e}");
    }
}

/// An anchor proxy (nginx or HAProxy) at its best balancing settings over `backends`, with `workers`
/// processes (nginx, whose upstream `zone` then shares the connection counts between them) or threads
/// (HAProxy).
struct Anchor {
    child: Child,
    address: SocketAddr,
    dir: PathBuf,
}

impl Anchor {
    /// `None` when the proxy is not installed (`apt-get install nginx-light haproxy`).
    fn start(kind: &str, workers: usize, backends: &[SocketAddr]) -> Option<Self> {
        let binary = format!("/usr/sbin/{kind}");
        if !Path::new(&binary).exists() {
            return None;
        }
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?;
        let dir = std::env::temp_dir().join(format!(
            "duet-anchor-{kind}-{}-{workers}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("logs")).ok()?;
        let (config, args) = match kind {
            "nginx" => Self::nginx(&dir, address, workers, backends),
            _ => Self::haproxy(&dir, address, workers, backends),
        };
        std::fs::write(dir.join("proxy.conf"), config).ok()?;
        let child = Command::new(binary)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let anchor = Self {
            child,
            address,
            dir,
        };
        let ready = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            std::net::TcpStream::connect(address).is_ok()
        });
        ready.then_some(anchor)
    }

    /// nginx `least_conn` with upstream keepalive. One worker runs without a master (as before); more
    /// need one, and a `zone` so that every worker sees the others' connections.
    fn nginx(
        dir: &Path,
        address: SocketAddr,
        workers: usize,
        backends: &[SocketAddr],
    ) -> (String, Vec<String>) {
        let servers: String = backends
            .iter()
            .map(|b| format!("    server {b} max_fails=0;\n"))
            .collect();
        let (master, zone) = match workers {
            1 => ("off", ""),
            _ => ("on", "    zone app 256k;\n"),
        };
        let config = format!(
            "worker_processes {workers};\ndaemon off;\nmaster_process {master};\npid {dir}/nginx.pid;\n\
             error_log {dir}/logs/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  upstream app {{\n    least_conn;\n{zone}{servers}    keepalive 64;\n  }}\n\
             server {{\n    listen {address};\n    location / {{ proxy_pass http://app; \
             proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_read_timeout 60s; }}\n  }}\n}}\n",
            dir = dir.display()
        );
        let args = vec![
            "-p".into(),
            dir.display().to_string(),
            "-c".into(),
            dir.join("proxy.conf").display().to_string(),
        ];
        (config, args)
    }

    /// HAProxy `leastconn` with `http-reuse always`, `workers` threads.
    fn haproxy(
        dir: &Path,
        address: SocketAddr,
        workers: usize,
        backends: &[SocketAddr],
    ) -> (String, Vec<String>) {
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("  server b{i} {b}\n"))
            .collect();
        let config = format!(
            "global\n  nbthread {workers}\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 1s\n\
             timeout client 60s\n  timeout server 60s\n  http-reuse always\nfrontend app\n\
             bind {address}\n  default_backend app\nbackend app\n  balance leastconn\n{servers}"
        );
        let args = vec![
            "-f".into(),
            dir.join("proxy.conf").display().to_string(),
            "-db".into(),
        ];
        (config, args)
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        // SIGTERM first: an nginx master killed outright would leave its workers listening.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let exited = (0..40).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A proxy under test: duet, or an anchor.
enum Proxy {
    Duet(Duet),
    Anchor(Anchor),
}

impl Proxy {
    /// `target` is `nginx`, `haproxy` or a duet policy, with `workers` workers, hedged when `hedge` is
    /// the YAML of a `hedge:`. `None`, after saying so, when an anchor is not installed.
    fn start(
        target: &str,
        workers: usize,
        addresses: &[SocketAddr],
        hedge: Option<&str>,
    ) -> Option<Self> {
        match (target, hedge) {
            ("nginx" | "haproxy", _) => {
                let anchor = Anchor::start(target, workers, addresses);
                if anchor.is_none() {
                    println!("{target:<22} not installed: apt-get install nginx-light haproxy");
                }
                anchor.map(Self::Anchor)
            }
            (policy, Some(hedge)) => Some(Self::Duet(Duet::start_hedged(
                workers, policy, addresses, hedge,
            ))),
            (policy, None) => Some(Self::Duet(Duet::start(workers, policy, addresses))),
        }
    }

    fn address(&self) -> SocketAddr {
        match self {
            Self::Duet(duet) => duet.address,
            Self::Anchor(anchor) => anchor.address,
        }
    }
}

/// `values`, or those of them listed in the environment variable `name` (comma-separated), to run one
/// cell of a table alone.
fn chosen_values<T: Copy + PartialEq + std::str::FromStr>(name: &str, values: &[T]) -> Vec<T> {
    let wanted: Vec<T> = std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    values
        .iter()
        .copied()
        .filter(|v| wanted.is_empty() || wanted.contains(v))
        .collect()
}

/// `targets`, or those of them named in `DUET_TARGETS` (comma-separated), to bound a run's time.
fn chosen<'a>(targets: &[&'a str]) -> Vec<&'a str> {
    let wanted = std::env::var("DUET_TARGETS").unwrap_or_default();
    targets
        .iter()
        .copied()
        .filter(|t| wanted.is_empty() || wanted.split(',').any(|w| w.trim() == *t))
        .collect()
}

/// Finite-capacity backends near saturation (the supermarket model in real traffic): 10 backends with 4
/// request slots each and a FIFO queue behind them, exponential service times of mean 40 ms (one of them
/// at half that speed, 80 ms), so the pool serves 950 requests/s at most; open-loop arrivals at 85% and
/// 95% of that, through duet under each policy and through nginx `least_conn` and HAProxy `leastconn`,
/// each with 1 and 2 workers (nginx processes sharing an upstream zone, HAProxy threads).
///
/// `DUET_REPEAT=N` runs every cell N times, the rounds interleaved so that a machine's drift touches
/// every target alike, and reports each cell's median: one 20 s run cannot tell a 3% difference of p99
/// from run-to-run spread. `DUET_WORKERS=2 DUET_LOADS=0.95` runs one cell alone. Each run also records
/// what the machine did meanwhile (`machine::Watch`: CPU stolen by the hypervisor, the latest wake-up of
/// a sleeping thread), and the medians are given twice: over every round, and over the calm rounds.
fn capacity(seconds: u64) {
    const SLOTS: usize = 4;
    let mean = Duration::from_millis(40);
    let capacity =
        9.0 * SLOTS as f64 / mean.as_secs_f64() + SLOTS as f64 / (2.0 * mean.as_secs_f64());
    let rounds: usize = std::env::var("DUET_REPEAT")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
        .max(1);
    println!(
        "\nFinite capacity: 10 backends x {SLOTS} slots + FIFO queue, exponential service 40 ms (b0: 80 ms), \
         capacity {capacity:.0} req/s; open loop {seconds} s; 10 s timeout; {rounds} round(s)"
    );
    let header = || {
        println!(
            "{:<22} {:>7} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8}",
            "balancer",
            "workers",
            "load",
            "success",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "b0 share",
            "steal ms",
            "late ms"
        )
    };
    header();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let targets = chosen(&[
        "round_robin",
        "random",
        "p2c_inflight",
        "p2c_peak_ewma",
        "p2c_memory_inflight",
        "p2c_memory_peak_ewma",
        "least_inflight",
        "least_peak_ewma",
        "nginx",
        "haproxy",
    ]);
    let mut cells: Vec<(CapacityCell, Vec<CapacityRun>)> = Vec::new();
    for round in 0..rounds {
        if rounds > 1 {
            println!("-- round {}", round + 1);
        }
        for workers in chosen_values("DUET_WORKERS", &[1usize, 2]) {
            for utilisation in chosen_values("DUET_LOADS", &[0.85, 0.95]) {
                for &target in &targets {
                    let backends: Vec<Backend> = (0..10)
                        .map(|i| {
                            let service = if i == 0 { mean * 2 } else { mean };
                            Backend::start(
                                BackendOptions::named(&format!("b{i}"))
                                    .exponential_delay(service)
                                    .max_concurrency(SLOTS),
                            )
                            .expect("backend")
                        })
                        .collect();
                    let addresses: Vec<_> = backends.iter().map(Backend::address).collect();
                    let Some(proxy) = Proxy::start(target, workers, &addresses, None) else {
                        continue;
                    };
                    let uri = format!("http://{}/", proxy.address()).parse().expect("uri");
                    let watch = machine::Watch::start();
                    let samples = runtime.block_on(open_loop(
                        uri,
                        capacity * utilisation,
                        Duration::from_secs(seconds),
                        Duration::from_secs(10),
                    ));
                    let machine = watch.finish();
                    drop(proxy);
                    let (success, q) = summary(&samples);
                    let total: u64 = backends.iter().map(Backend::requests).sum();
                    let b0_share = backends[0].requests() as f64 / total.max(1) as f64;
                    let run = [
                        success,
                        q(0.5),
                        q(0.99),
                        q(0.999),
                        b0_share,
                        machine.steal_ms,
                        machine.late_ms,
                    ];
                    print_capacity_row(target, workers, utilisation, &run);
                    if std::env::var_os("DUET_BACKENDS").is_some() {
                        print_backend_detail(&samples);
                    }
                    let key = (target, workers, utilisation);
                    match cells.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, runs)) => runs.push(run),
                        None => cells.push((key, vec![run])),
                    }
                }
            }
        }
    }
    let mut results = Vec::new();
    let calm = |run: &&CapacityRun| machine::calm(run[5], run[6]);
    for (title, only_calm) in [("every round", false), ("calm rounds", true)] {
        if rounds > 1 {
            println!(
                "-- medians over {title}{}",
                if only_calm {
                    format!(
                        " (< {} ms stolen, no wake-up {} ms late)",
                        machine::CALM_STEAL_MS,
                        machine::CALM_LATE_MS
                    )
                } else {
                    String::new()
                }
            );
            header();
        }
        for ((target, workers, utilisation), runs) in &cells {
            let chosen: Vec<&CapacityRun> = runs.iter().filter(|r| !only_calm || calm(r)).collect();
            let Some(median) = median_run(&chosen) else {
                println!(
                    "{target:<22} {workers:>7} {:>4.0}%  no calm round",
                    utilisation * 100.0
                );
                continue;
            };
            if rounds > 1 {
                print_capacity_row(target, *workers, *utilisation, &median);
            }
            let key = if only_calm { "calm" } else { "all" };
            results.push(json!({
                "balancer": target, "workers": workers, "utilisation": utilisation,
                "rate": capacity * utilisation, "rounds": chosen.len(), "medians_over": key,
                "success_rate": median[0], "p50_ms": median[1], "p99_ms": median[2],
                "p999_ms": median[3], "b0_share": median[4],
                "runs": chosen.iter().map(|r| json!({
                    "success_rate": r[0], "p50_ms": r[1], "p99_ms": r[2], "p999_ms": r[3],
                    "b0_share": r[4], "steal_ms": r[5], "late_ms": r[6],
                })).collect::<Vec<_>>(),
            }));
        }
    }
    println!("b0 serves 50 req/s at most: its fair share of the capacity is 5.3%");
    let _ = std::fs::write(
        docs().join("experiments/capacity.json"),
        serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
}

/// A capacity run's target, workers and utilisation.
type CapacityCell<'a> = (&'a str, usize, f64);

/// What one round of a capacity cell measured: success, p50, p99, p99.9, b0's share, then the machine's
/// stolen CPU and latest wake-up (ms) meanwhile.
type CapacityRun = [f64; 7];

/// Each field's median over `runs` (None for no run).
fn median_run(runs: &[&CapacityRun]) -> Option<CapacityRun> {
    if runs.is_empty() {
        return None;
    }
    Some(std::array::from_fn(|field| {
        let mut values: Vec<f64> = runs.iter().map(|run| run[field]).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }))
}

/// Each backend's share of the requests, its own p50 and p99, and its share of the requests slower
/// than the run's p99 (`DUET_BACKENDS=1`): where a tail comes from.
fn print_backend_detail(samples: &[Sample]) {
    let mut all: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    all.sort_unstable();
    let Some(&p99) = all.get(all.len() * 99 / 100) else {
        return;
    };
    let slow = samples.iter().filter(|s| s.latency > p99).count().max(1);
    let mut names: Vec<&str> = samples.iter().map(|s| s.backend.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let mut mine: Vec<Duration> = samples
            .iter()
            .filter(|s| s.backend == name)
            .map(|s| s.latency)
            .collect();
        mine.sort_unstable();
        let at = |q: f64| ms(mine[((mine.len() as f64 * q) as usize).min(mine.len() - 1)]);
        let tail = mine.iter().filter(|l| **l > p99).count();
        println!(
            "    {name:<4} share {:>5.2}%  p50 {:>6.1}  p99 {:>6.1}  of the slowest 1% {:>5.1}%",
            100.0 * mine.len() as f64 / samples.len() as f64,
            at(0.5),
            at(0.99),
            100.0 * tail as f64 / slow as f64
        );
    }
}

/// One line of the capacity table.
fn print_capacity_row(target: &str, workers: usize, utilisation: f64, run: &CapacityRun) {
    let [success, p50, p99, p999, b0_share, steal, late] = *run;
    println!(
        "{target:<22} {workers:>7} {:>4.0}% {:>8.2}% {:>9.1} {:>9.1} {:>9.1} {:>7.1}% {steal:>9.0} {late:>8.1}",
        utilisation * 100.0,
        success * 100.0,
        p50,
        p99,
        p999,
        b0_share * 100.0
    );
}

/// What the tail experiments run: a label, and the target and `hedge:` it stands for.
fn tail_target(label: &str) -> (&str, Option<String>) {
    match label {
        "nginx" | "haproxy" => (label, None),
        hedged if hedged.starts_with("duet hedge ") => {
            let after = hedged.trim_start_matches("duet hedge ");
            (
                "p2c_peak_ewma",
                Some(format!("{{ after: {after}, max_extra: 5% }}")),
            )
        }
        _ => ("p2c_peak_ewma", None),
    }
}

/// One open-loop run of the tail experiments through `label`'s proxy over `backends`: the table row
/// (printed), the JSON result, and the latencies (ms, sorted). `extra` is the backend requests beyond
/// one per client request.
fn tail_run(
    runtime: &tokio::runtime::Runtime,
    label: &str,
    backends: &[Backend],
    rate: f64,
    seconds: u64,
) -> Option<(serde_json::Value, Vec<f64>)> {
    let addresses: Vec<_> = backends.iter().map(Backend::address).collect();
    let (target, hedge) = tail_target(label);
    let proxy = Proxy::start(target, 1, &addresses, hedge.as_deref())?;
    let uri = format!("http://{}/", proxy.address()).parse().expect("uri");
    let samples = runtime.block_on(open_loop(
        uri,
        rate,
        Duration::from_secs(seconds),
        Duration::from_secs(10),
    ));
    drop(proxy);
    let (success, q) = summary(&samples);
    let sent: u64 = backends.iter().map(Backend::requests).sum();
    let extra = sent as f64 / samples.len().max(1) as f64 - 1.0;
    println!(
        "{label:<22} {:>8.2}% {:>9.1} {:>9.1} {:>9.1} {:>7.2}%",
        success * 100.0,
        q(0.5),
        q(0.99),
        q(0.999),
        extra * 100.0
    );
    let result = json!({
        "balancer": label, "rate": rate, "requests": samples.len(), "success_rate": success,
        "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "extra_requests": extra,
    });
    let mut latencies: Vec<f64> = samples.iter().map(|s| ms(s.latency)).collect();
    latencies.sort_unstable_by(f64::total_cmp);
    Some((result, latencies))
}

/// The CDF of sorted `latencies` as `<dir>/<name>.csv` (`latency_ms,fraction`: the fraction of requests
/// answered within that latency, one row per request), and two series for `label`: the CDF, and the
/// fraction slower than each latency (every point of the slowest 2%, where the tail is).
fn cdf_out(dir: &Path, name: &str, label: &str, latencies: &[f64]) -> (Series, Series) {
    let n = latencies.len().max(1) as f64;
    let mut csv = String::from("latency_ms,fraction\n");
    for (i, l) in latencies.iter().enumerate() {
        csv.push_str(&format!("{l:.3},{:.6}\n", (i + 1) as f64 / n));
    }
    if let Err(e) = std::fs::write(dir.join(format!("{name}.csv")), csv) {
        eprintln!("csv: {e}");
    }
    let step = (latencies.len() / 400).max(1);
    let cdf = latencies
        .iter()
        .enumerate()
        .step_by(step)
        .map(|(i, l)| (l.max(0.01), (i + 1) as f64 / n))
        .collect();
    let tail = latencies
        .iter()
        .enumerate()
        .filter(|&(i, _)| i % step == 0 || i as f64 >= 0.98 * n)
        .map(|(i, l)| (l.max(0.01), 1.0 - (i + 1) as f64 / n))
        .filter(|&(_, slower)| slower > 0.0)
        .collect();
    let series = |points| Series {
        name: label.to_owned(),
        points,
    };
    (series(cdf), series(tail))
}

/// Where the tail experiments write their CSVs: `target/experiments/`.
fn csv_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
        PathBuf::from,
    );
    let dir = target.join("experiments");
    std::fs::create_dir_all(&dir).expect("target/experiments");
    dir
}

/// The CDF (linear fraction) and the tail (fraction slower, log-log) of `name` as SVGs under `docs/src/figures/`.
fn tail_plots(name: &str, title: &str, cdf: &[Series], tail: &[Series]) {
    let docs = docs();
    let x = "latency (ms, log scale)";
    let plots = [
        (
            format!("{name}-cdf.svg"),
            "fraction of requests",
            cdf,
            false,
        ),
        (
            format!("{name}-tail.svg"),
            "fraction of requests slower (log scale)",
            tail,
            true,
        ),
    ];
    for (file, y, series, log_y) in plots {
        let axes = Axes { log_x: true, log_y };
        if let Err(e) = plot::line_chart(&docs.join(file), title, x, y, series, axes) {
            eprintln!("plot: {e}");
        }
    }
}

/// Stalls that hit any backend at random (issue #29): 6 backends, exponential service of mean 5 ms, 1%
/// of requests stalling 100 ms more; open loop at 1,500 req/s, 1 worker. duet over the same backends
/// without stalls (the floor), then with stalls unhedged and hedged (`after: p95` or `p99`, `max_extra:
/// 5%`), and nginx and HAProxy when installed. Latency CDFs: a CSV per balancer under
/// `target/experiments/`, SVGs under `docs/src/figures/`.
fn stalls(seconds: u64) {
    let rate = 1500.0;
    println!(
        "\nRandom stalls: 6 backends, exponential 5 ms, 1% stall +100 ms; open loop {rate} req/s, \
         {seconds} s; 1 worker each; p2c_peak_ewma; hedged: max_extra 5%"
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "balancer", "success", "p50 ms", "p99 ms", "p99.9 ms", "extra"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut results, mut cdf, mut tail) = (Vec::new(), Vec::new(), Vec::new());
    let targets = chosen(&[
        "no stalls",
        "duet",
        "duet hedge p99",
        "duet hedge p95",
        "nginx",
        "haproxy",
    ]);
    let dir = csv_dir();
    for target in targets {
        let backends: Vec<Backend> = (0..6)
            .map(|i| {
                let options = BackendOptions::named(&format!("b{i}"))
                    .exponential_delay(Duration::from_millis(5));
                let options = match target {
                    "no stalls" => options,
                    _ => options.random_stalls(0.01, Duration::from_millis(100)),
                };
                Backend::start(options).expect("backend")
            })
            .collect();
        let Some((result, latencies)) = tail_run(&runtime, target, &backends, rate, seconds) else {
            continue;
        };
        results.push(result);
        let name = format!("stalls-{}", target.replace(' ', "-"));
        let (c, t) = cdf_out(&dir, &name, target, &latencies);
        cdf.push(c);
        tail.push(t);
    }
    let _ = std::fs::write(
        docs().join("experiments/stalls.json"),
        serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
    let title = "Latency, 6 backends, 1% random stalls of 100 ms, 1,500 req/s";
    tail_plots("stalls", title, &cdf, &tail);
}

/// Hedging where choosing well already helps (issue #29: "no worse with hedging on"), on the stalls
/// experiment's pool without stalls: S2, b0 ten times slower (exponential 50 ms) all run; S3, b0 answering
/// in 200 ms for the middle half of the run. duet unhedged and hedged, nginx, HAProxy.
fn hedge_slow(seconds: u64) {
    let rate = 1500.0;
    let run = Duration::from_secs(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let targets = chosen(&[
        "duet",
        "duet hedge p99",
        "duet hedge p95",
        "nginx",
        "haproxy",
    ]);
    let mut results = Vec::new();
    for scenario in ["S2 one slow", "S3 degrades"] {
        println!(
            "\n{scenario}: 6 backends, exponential 5 ms, b0 {}; open loop {rate} req/s, {seconds} s; 1 worker",
            match scenario {
                "S2 one slow" => "exponential 50 ms".to_owned(),
                _ => format!("200 ms from {} s to {} s", seconds / 4, 3 * seconds / 4),
            }
        );
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "balancer", "success", "p50 ms", "p99 ms", "p99.9 ms", "extra"
        );
        for &target in &targets {
            let backends: Vec<Backend> = (0..6)
                .map(|i| {
                    let options = BackendOptions::named(&format!("b{i}"));
                    let options = match (i, scenario) {
                        (0, "S2 one slow") => options.exponential_delay(Duration::from_millis(50)),
                        (0, _) => options
                            .exponential_delay(Duration::from_millis(5))
                            .slow_between(run / 4, run * 3 / 4, Duration::from_millis(200)),
                        _ => options.exponential_delay(Duration::from_millis(5)),
                    };
                    Backend::start(options).expect("backend")
                })
                .collect();
            if let Some((mut result, _)) = tail_run(&runtime, target, &backends, rate, seconds) {
                result["scenario"] = json!(scenario);
                results.push(result);
            }
        }
    }
    let _ = std::fs::write(
        docs().join("experiments/hedge-slow.json"),
        serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let quick = args.iter().any(|a| a == "--quick");
    let which: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let run_all = which.is_empty();
    if run_all || which.contains(&"tower") {
        tower(if quick { 10_000 } else { 50_000 });
    }
    if run_all || which.contains(&"linkerd") {
        linkerd(if quick { 16 } else { 40 }, 200.0);
    }
    if run_all || which.contains(&"capacity") {
        capacity(if quick { 8 } else { 20 });
    }
    if run_all || which.contains(&"stalls") {
        stalls(if quick { 8 } else { 30 });
    }
    if run_all || which.contains(&"hedge-slow") {
        hedge_slow(if quick { 8 } else { 20 });
    }
}
