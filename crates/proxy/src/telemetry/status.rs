//! The admin status page: every cluster and backend at a glance, as HTML (no external assets: the
//! admin port may have no internet) or JSON, from the same snapshot of the workers' cells.

use crate::{
    telemetry::histogram::Summed,
    telemetry::metrics::{unix_seconds, ClusterCells, Registry},
    view::HealthView,
};
use serde::Serialize;
use std::{
    collections::{HashMap, VecDeque},
    fmt::Write,
    net::SocketAddr,
    sync::atomic::Ordering::Relaxed,
    time::Duration,
};

/// What the status page shows, summed over workers.
#[derive(Debug, Serialize)]
pub struct Status {
    /// duet's version.
    pub version: &'static str,
    /// Seconds since the process started.
    pub uptime_seconds: f64,
    /// Seconds the counts and rates below cover (about the last minute; since start until then).
    pub window_seconds: f64,
    /// Workers serving.
    pub workers: usize,
    /// Whether duet is draining (SIGTERM received).
    pub draining: bool,
    /// The running configuration.
    pub config: ConfigStatus,
    /// Every cluster, in configuration order.
    pub clusters: Vec<ClusterStatus>,
}

/// The running configuration and its reloads.
#[derive(Debug, Serialize)]
pub struct ConfigStatus {
    /// FNV-1a (64-bit, hex) of the file's bytes.
    pub hash: String,
    /// Seconds since it was applied.
    pub applied_seconds_ago: f64,
    /// Whether the last reload applied its file (a refused one leaves this configuration running).
    pub last_reload_ok: bool,
    /// Reloads applied since start.
    pub reloads_succeeded: u64,
    /// Reloads refused since start.
    pub reloads_failed: u64,
}

/// One cluster.
#[derive(Debug, Serialize)]
pub struct ClusterStatus {
    /// Its name.
    pub name: String,
    /// Its balancing policy.
    pub policy: &'static str,
    /// Requests answered (or failed) in the window.
    pub requests: u64,
    /// Upper bound of the bucket holding the 99th percentile of request durations, in ms.
    pub p99_ms: Option<f64>,
    /// Its backends.
    pub backends: Vec<BackendStatus>,
}

/// One backend, as the workers see it together.
#[derive(Debug, Serialize)]
pub struct BackendStatus {
    /// Its address.
    pub address: String,
    /// Its configured weight.
    pub weight: u32,
    /// `up`, `down` (failing health checks) or `ejected` (by some or all workers).
    pub state: &'static str,
    /// Why, in words.
    pub reason: String,
    /// Health checks: `passing`, `failing`, or `not checked`.
    pub health: &'static str,
    /// Workers that may pick it now.
    pub eligible_workers: usize,
    /// Requests in flight to it, all workers.
    pub in_flight: u64,
    /// The workers' PeakEWMA latency estimate, averaged, in ms.
    pub rtt_estimate_ms: f64,
    /// Times picked in the window, all workers.
    pub picks: u64,
    /// Its share of the cluster's picks.
    pub pick_share: f64,
    /// Response heads in the window by class: 1xx, 2xx, 3xx, 4xx, 5xx.
    pub responses: [u64; 5],
    /// Attempts in the window that failed without a usable response.
    pub failures: u64,
    /// (5xx + failures) / (responses + failures).
    pub error_rate: f64,
    /// Upper bound of the bucket holding the 99th percentile of its response-head time, in ms.
    pub p99_ms: Option<f64>,
}

/// Counts that grow, read from every worker and added up: the status page shows what they grew by
/// over the last minute.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    clusters: HashMap<String, Summed>,
    backends: HashMap<(String, SocketAddr), Counts>,
}

#[derive(Debug, Clone, Default)]
struct Counts {
    picks: u64,
    responses: [u64; 5],
    failures: u64,
    head_time: Summed,
}

impl Counts {
    fn since(&self, earlier: &Counts) -> Counts {
        let mut responses = self.responses;
        for (now, then) in responses.iter_mut().zip(earlier.responses) {
            *now = now.saturating_sub(then);
        }
        Counts {
            picks: self.picks.saturating_sub(earlier.picks),
            responses,
            failures: self.failures.saturating_sub(earlier.failures),
            head_time: self.head_time.since(&earlier.head_time),
        }
    }
}

/// How far back the status page looks.
const WINDOW: Duration = Duration::from_secs(60);

/// Readings of [`Totals`] over the last minute or so, so the page can show rates over it rather than
/// since start (which after a week says nothing about now). Record one every few seconds.
#[derive(Debug, Default)]
pub struct StatusWindow {
    readings: VecDeque<(std::time::Instant, Totals)>,
}

impl StatusWindow {
    /// An empty window: until its first reading, the page shows figures since start.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a reading now, keeping the newest one at least a minute old and everything after it.
    pub fn record(&mut self, registry: &Registry) {
        let now = std::time::Instant::now();
        self.readings.push_back((now, registry.totals()));
        while self.readings.len() > 1
            && self
                .readings
                .get(1)
                .is_some_and(|(at, _)| now.duration_since(*at) >= WINDOW)
        {
            self.readings.pop_front();
        }
    }

    /// The oldest reading kept (about a minute old once the window has filled).
    fn baseline(&self) -> Option<&(std::time::Instant, Totals)> {
        self.readings.front()
    }
}

impl Registry {
    /// Every worker's growing counts, added up.
    pub fn totals(&self) -> Totals {
        self.inspect(|workers, _, _| {
            let mut totals = Totals::default();
            for entry in workers.values() {
                for cluster in &entry.clusters {
                    let summed = totals.clusters.entry(cluster.name.clone()).or_default();
                    for route in &cluster.routes {
                        summed.add(&route.request_duration);
                    }
                    for backend in &cluster.backends {
                        let counts = totals
                            .backends
                            .entry((cluster.name.clone(), backend.address))
                            .or_default();
                        counts.picks += backend.load.picks();
                        for (total, cell) in
                            counts.responses.iter_mut().zip(&backend.stats.responses)
                        {
                            *total += cell.load(Relaxed);
                        }
                        counts.failures += backend
                            .stats
                            .failures
                            .iter()
                            .map(|f| f.load(Relaxed))
                            .sum::<u64>();
                        counts.head_time.add(&backend.stats.header_time);
                    }
                }
            }
            totals
        })
    }

    /// A snapshot for the status page: `health` is the control plane's current health-check view;
    /// counts and rates cover `window` (the last minute), or everything since start without one.
    pub fn status(&self, health: &HealthView, window: Option<&StatusWindow>) -> Status {
        let totals = self.totals();
        let empty = Totals::default();
        // Without a reading the figures run from the start, and so does the window.
        let (baseline, window_seconds) = match window.and_then(StatusWindow::baseline) {
            Some((at, reading)) => (reading, Some(at.elapsed().as_secs_f64())),
            None => (&empty, None),
        };
        self.inspect(|workers, process, draining| {
            let entries: Vec<_> = workers.values().collect();
            let worker_count = entries.len();
            let uptime = (unix_seconds() - process.started_unix_seconds).max(0.0);
            let clusters = entries
                .first()
                .map(|first| {
                    first
                        .clusters
                        .iter()
                        .map(|cluster| {
                            let same: Vec<&ClusterCells> = entries
                                .iter()
                                .filter_map(|e| e.clusters.iter().find(|c| c.name == cluster.name))
                                .collect();
                            let view = View {
                                health,
                                workers: worker_count,
                                totals: &totals,
                                baseline,
                            };
                            cluster_status(cluster, &same, &view)
                        })
                        .collect()
                })
                .unwrap_or_default();
            Status {
                version: env!("CARGO_PKG_VERSION"),
                uptime_seconds: uptime,
                window_seconds: window_seconds.unwrap_or(uptime),
                workers: worker_count,
                draining,
                config: ConfigStatus {
                    hash: format!("{:016x}", process.config_hash.load(Relaxed)),
                    applied_seconds_ago: (unix_seconds()
                        - f64::from_bits(process.last_applied_bits.load(Relaxed)))
                    .max(0.0),
                    last_reload_ok: process.last_reload_ok.load(Relaxed),
                    reloads_succeeded: process.reloads_succeeded.load(Relaxed),
                    reloads_failed: process.reloads_failed.load(Relaxed),
                },
                clusters,
            }
        })
    }
}

/// What a cluster's figures are computed against.
struct View<'a> {
    health: &'a HealthView,
    workers: usize,
    totals: &'a Totals,
    baseline: &'a Totals,
}

fn cluster_status(
    cluster: &ClusterCells,
    same: &[&ClusterCells],
    view: &View<'_>,
) -> ClusterStatus {
    let empty = Summed::default();
    let durations = view
        .totals
        .clusters
        .get(&cluster.name)
        .unwrap_or(&empty)
        .since(view.baseline.clusters.get(&cluster.name).unwrap_or(&empty));
    let workers = view.workers;
    let mut backends: Vec<BackendStatus> = cluster
        .backends
        .iter()
        .map(|backend| {
            let cells: Vec<_> = same
                .iter()
                .filter_map(|c| c.backends.iter().find(|b| b.address == backend.address))
                .collect();
            let eligible_workers = cells.iter().filter(|b| b.load.is_eligible()).count();
            let health = match view.health.healthy(&cluster.name, backend.address) {
                Some(true) => "passing",
                Some(false) => "failing",
                None => "not checked",
            };
            let (state, reason) = if health == "failing" {
                ("down", "failing its health checks".to_owned())
            } else if eligible_workers < workers {
                (
                    "ejected",
                    format!(
                        "ejected by {} of {workers} workers (consecutive failures, or a Retry-After)",
                        workers - eligible_workers
                    ),
                )
            } else {
                ("up", String::new())
            };
            let key = (cluster.name.clone(), backend.address);
            let zero = Counts::default();
            let counts = view
                .totals
                .backends
                .get(&key)
                .unwrap_or(&zero)
                .since(view.baseline.backends.get(&key).unwrap_or(&zero));
            let answered: u64 = counts.responses.iter().sum();
            let attempts = answered + counts.failures;
            let error_rate = if attempts == 0 {
                0.0
            } else {
                (counts.responses[4] + counts.failures) as f64 / attempts as f64
            };
            BackendStatus {
                address: backend.address.to_string(),
                weight: backend.weight,
                state,
                reason,
                health,
                eligible_workers,
                in_flight: cells.iter().map(|b| b.load.in_flight()).sum(),
                rtt_estimate_ms: cells
                    .iter()
                    .map(|b| b.load.rtt_estimate().as_secs_f64() * 1000.0)
                    .sum::<f64>()
                    / cells.len().max(1) as f64,
                picks: counts.picks,
                pick_share: 0.0,
                responses: counts.responses,
                failures: counts.failures,
                error_rate,
                p99_ms: counts.head_time.quantile_bound(0.99).map(|s| s * 1000.0),
            }
        })
        .collect();
    let picks: u64 = backends.iter().map(|b| b.picks).sum();
    for backend in &mut backends {
        backend.pick_share = if picks == 0 {
            0.0
        } else {
            backend.picks as f64 / picks as f64
        };
    }
    ClusterStatus {
        name: cluster.name.clone(),
        policy: cluster.policy,
        requests: durations.count(),
        p99_ms: durations.quantile_bound(0.99).map(|s| s * 1000.0),
        backends,
    }
}

impl Status {
    /// The same data as JSON (`/status?format=json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
    }

    /// The page: one table per cluster, refreshing itself every 5 s; no scripts, no external assets.
    pub fn to_html(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"refresh\" content=\"5\"><title>duet status</title><style>\
             body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}\
             table{{border-collapse:collapse;margin:.5em 0 1.5em}}\
             th,td{{padding:.3em .7em;border-bottom:1px solid #ddd;text-align:right}}\
             th:first-child,td:first-child,th:nth-child(2),td:nth-child(2){{text-align:left}}th{{background:#f4f4f4}}\
             .up{{color:#1a7f37}}.down{{color:#cf222e;font-weight:bold}}.ejected{{color:#bf8700;font-weight:bold}}\
             .meta{{color:#555}}</style></head><body>\n\
             <h1>duet {}</h1>\n<p class=\"meta\">up {} · figures over the last {} · {} workers{} · \
             configuration {} applied {} ago{} · reloads {} applied, {} refused</p>\n",
            escape(self.version),
            duration(self.uptime_seconds),
            duration(self.window_seconds),
            self.workers,
            if self.draining { " · <b>draining</b>" } else { "" },
            escape(&self.config.hash),
            duration(self.config.applied_seconds_ago),
            if self.config.last_reload_ok {
                ""
            } else {
                " · <b class=\"down\">the last reload was refused</b>"
            },
            self.config.reloads_succeeded,
            self.config.reloads_failed,
        );
        for cluster in &self.clusters {
            let _ = write!(
                out,
                "<h2>{} <span class=\"meta\">{} · {} requests · p99 {}</span></h2>\n<table>\
                 <tr><th>backend</th><th>state</th><th>weight</th><th>health checks</th>\
                 <th>eligible</th><th>in flight</th><th>PeakEWMA</th><th>picks</th><th>share</th>\
                 <th>2xx</th><th>4xx</th><th>5xx</th><th>failed</th><th>error rate</th>\
                 <th>p99 head</th></tr>\n",
                escape(&cluster.name),
                cluster.policy,
                cluster.requests,
                millis(cluster.p99_ms),
            );
            for b in &cluster.backends {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td class=\"{}\" title=\"{}\">{}{}</td><td>{}</td><td>{}</td>\
                     <td>{}/{}</td><td>{}</td><td>{:.1} ms</td><td>{}</td><td>{:.1}%</td><td>{}</td>\
                     <td>{}</td><td>{}</td><td>{}</td><td>{:.2}%</td><td>{}</td></tr>",
                    escape(&b.address),
                    b.state,
                    escape(&b.reason),
                    b.state,
                    if b.reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", escape(&b.reason))
                    },
                    b.weight,
                    b.health,
                    b.eligible_workers,
                    self.workers,
                    b.in_flight,
                    b.rtt_estimate_ms,
                    b.picks,
                    b.pick_share * 100.0,
                    b.responses[1],
                    b.responses[3],
                    b.responses[4],
                    b.failures,
                    b.error_rate * 100.0,
                    millis(b.p99_ms),
                );
            }
            out.push_str("</table>\n");
        }
        out.push_str(
            "<p class=\"meta\">Counts, shares, error rates and p99 over the window above, summed over \
             workers; p99 is the upper bound of the histogram bucket that holds it. \
             <a href=\"/status?format=json\">JSON</a> · <a href=\"/metrics\">metrics</a></p>\n\
             </body></html>\n",
        );
        out
    }
}

fn millis(value: Option<f64>) -> String {
    match value {
        None => "–".to_owned(),
        Some(ms) if ms.is_infinite() => "> 60 s".to_owned(),
        Some(ms) => format!("≤ {ms} ms"),
    }
}

fn duration(seconds: f64) -> String {
    let seconds = seconds as u64;
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        _ => format!("{} h", seconds / 3600),
    }
}

/// Text for HTML: a cluster's name is any YAML string.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
