//! The admin status page: every cluster and backend at a glance, as HTML (no external assets: the
//! admin port may have no internet), JSON or plain text, all three rendered from one [`Status`]
//! snapshot of the workers' cells.

use crate::{
    outcome::Failure,
    telemetry::histogram::{Sum, Summed},
    telemetry::history::{BackendPoint, Bucket, Ring, RoutePoint, BUCKETS},
    telemetry::metrics::{
        unix_seconds, BackendCell, ClusterCells, ProcessState, Registry, WorkerEntry,
    },
    telemetry::plot::{self, escape, Series},
    telemetry::route_cells::RouteCells,
    view::HealthView,
};
use serde::Serialize;
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    fmt::Write,
    net::SocketAddr,
    sync::atomic::Ordering::Relaxed,
    time::Duration,
};

/// What the status page shows, summed over workers.
#[derive(Debug, Serialize)]
pub struct Status {
    /// The JSON's schema: 3 since the figures over time (`history`, and each backend's and route's
    /// `history`); 2 made every count a named field (1 had positional arrays:
    /// `"responses": [0, 10, 0, 0, 1]`).
    pub schema: u32,
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
    /// Every route, in configuration order (first match wins).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteStatus>,
    /// The buckets the backends' and routes' `history` arrays hold a point of, oldest first.
    pub history: HistoryStatus,
}

/// The buckets of the figures over time.
#[derive(Debug, Serialize)]
pub struct HistoryStatus {
    /// How long each bucket is.
    pub bucket_seconds: f64,
    /// When each bucket closed (seconds since the Unix epoch), oldest first: the `history` arrays
    /// hold one point per bucket, in this order.
    pub bucket_ends_unix: Vec<f64>,
}

/// One route: what it matches, where it sends and what it changes.
#[derive(Debug, Serialize)]
pub struct RouteStatus {
    /// Its name (the `route` label).
    pub name: String,
    /// Its matchers, as `host api.example.com path /v1 method GET`.
    pub matches: String,
    /// The clusters it sends to, each with its weight and share (`split` in the JSON); empty for a
    /// redirect route.
    #[serde(rename = "split")]
    pub shares: Vec<ClusterShare>,
    /// What a redirect route answers, as `redirect 308 scheme https`; `None` for a route that proxies.
    pub redirect: Option<String>,
    /// Its filters, as `request_headers set x-team=api rewrite path_prefix /v2`; empty without any.
    pub filters: String,
    /// Its request rate and error ratio per bucket of `history` (`null` for a bucket before it
    /// existed).
    pub history: Vec<Option<RoutePoint>>,
}

/// One cluster of a route.
#[derive(Debug, Serialize)]
pub struct ClusterShare {
    /// The cluster's name.
    pub cluster: String,
    /// Its weight among the route's clusters (1 for a route's only cluster).
    pub weight: u32,
    /// Its configured share: its weight over the route's total.
    pub share: f64,
    /// Requests of the route it took in the window, all workers.
    pub requests: u64,
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
    /// What its routes' filters counted since start, summed over workers, under each counter family's
    /// name without `duet_` and `_total`, one count per value of its label (`"hedges": {"won": 3,
    /// "lost": 1, "cancelled": 0}`): the families shown on the status page, for the clusters whose routes use them
    /// (a family every route has, for every cluster).
    #[serde(flatten)]
    pub counts: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    /// The same, for people: `hedges since start: 3 won, 1 lost, 0 cancelled`, for those with any.
    #[serde(skip)]
    count_lines: Vec<String>,
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
    /// Response heads in the window by class: 1xx, 2xx, 3xx, 4xx, 5xx (in the JSON an object,
    /// `{"1xx": 0, "2xx": 10, ...}`).
    #[serde(serialize_with = "by_class")]
    pub responses: [u64; 5],
    /// Attempts in the window that failed without a usable response.
    pub failures: u64,
    /// (5xx + failures) / (responses + failures).
    pub error_rate: f64,
    /// Upper bound of the bucket holding the 99th percentile of its response-head time, in ms.
    pub p99_ms: Option<f64>,
    /// Its share of picks, in flight and p50/p99 per bucket of `history` (`null` for a bucket before
    /// it was in the configuration).
    pub history: Vec<Option<BackendPoint>>,
}

/// Counts that grow, read from every worker and added up: the status page shows what they grew by
/// over the last minute.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    clusters: HashMap<String, Summed>,
    /// Request durations and responses by (cluster, route).
    routes: HashMap<(String, String), RouteTotals>,
    backends: HashMap<(String, SocketAddr), Counts>,
}

impl Totals {
    /// The growing counts of `workers`, added up.
    fn of<'a>(workers: impl IntoIterator<Item = &'a WorkerEntry>) -> Self {
        let mut totals = Totals::default();
        for cluster in workers.into_iter().flat_map(|entry| &entry.clusters) {
            let summed = totals.clusters.entry(cluster.name.clone()).or_default();
            for route in &cluster.routes {
                summed.add(&route.request_duration);
                let key = (cluster.name.clone(), route.route.to_string());
                let sums = totals.routes.entry(key).or_default();
                sums.duration.add(&route.request_duration);
                for (code, count) in route.codes() {
                    sums.responses += count;
                    sums.errors_5xx += if code >= 500 { count } else { 0 };
                }
            }
            for backend in &cluster.backends {
                let counts = totals
                    .backends
                    .entry((cluster.name.clone(), backend.address))
                    .or_default();
                counts.add(backend);
            }
        }
        totals
    }
}

/// One route's counts toward one cluster, all workers.
#[derive(Debug, Clone, Default)]
struct RouteTotals {
    duration: Summed,
    /// Responses sent to clients, and of them 5xx.
    responses: u64,
    errors_5xx: u64,
}

#[derive(Debug, Clone, Default)]
struct Counts {
    picks: u64,
    /// Requests in flight at the reading (a gauge: [`Counts::since`] keeps the newer).
    in_flight: u64,
    responses: [u64; 5],
    failures: u64,
    tls_failures: u64,
    head_time: Summed,
}

impl Counts {
    fn add(&mut self, backend: &BackendCell) {
        self.picks += backend.load.picks();
        self.in_flight += backend.load.in_flight();
        for (total, cell) in self.responses.iter_mut().zip(&backend.stats.responses) {
            *total += cell.load(Relaxed);
        }
        self.failures += backend
            .stats
            .failures
            .iter()
            .map(|f| f.load(Relaxed))
            .sum::<u64>();
        if let Some(tls) = Failure::ALL.iter().position(|k| *k == Failure::Tls) {
            self.tls_failures += backend.stats.failures[tls].load(Relaxed);
        }
        self.head_time.add(&backend.stats.header_time);
    }

    /// (5xx + failures) / (responses + failures), 0 without any.
    fn error_rate(&self) -> f64 {
        let attempts = self.responses.iter().sum::<u64>() + self.failures;
        if attempts == 0 {
            return 0.0;
        }
        (self.responses[4] + self.failures) as f64 / attempts as f64
    }

    fn since(&self, earlier: &Counts) -> Counts {
        let mut responses = self.responses;
        for (now, then) in responses.iter_mut().zip(earlier.responses) {
            *now = now.saturating_sub(then);
        }
        Counts {
            picks: self.picks.saturating_sub(earlier.picks),
            in_flight: self.in_flight,
            responses,
            failures: self.failures.saturating_sub(earlier.failures),
            tls_failures: self.tls_failures.saturating_sub(earlier.tls_failures),
            head_time: self.head_time.since(&earlier.head_time),
        }
    }
}

/// How far back the status page looks.
const WINDOW: Duration = Duration::from_secs(60);

/// How long a bucket of the figures over time is, unless `admin.status_bucket` says.
pub(crate) const DEFAULT_BUCKET: Duration = Duration::from_secs(10);

/// Readings of [`Totals`] over the last minute or so, so the page can show rates over it rather than
/// since start (which after a week says nothing about now), and the figures over time: a bucket
/// closed every `bucket`, the last 30 kept. Record one reading every few seconds
/// ([`StatusWindow::record`]) and close a bucket every `bucket` ([`StatusWindow::close_bucket`]).
#[derive(Debug)]
pub struct StatusWindow {
    readings: VecDeque<(std::time::Instant, Totals)>,
    bucket: Duration,
    history: Ring,
    /// The reading the next bucket is the difference from, and when it was taken.
    last_close: Option<(std::time::Instant, Totals)>,
}

impl Default for StatusWindow {
    fn default() -> Self {
        Self::with_bucket(DEFAULT_BUCKET)
    }
}

impl StatusWindow {
    /// An empty window: until its first reading, the page shows figures since start.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty window whose buckets over time are `bucket` long.
    pub fn with_bucket(bucket: Duration) -> Self {
        Self {
            readings: VecDeque::new(),
            bucket,
            history: Ring::default(),
            last_close: None,
        }
    }

    /// How long a bucket over time is: close one this often.
    pub fn bucket(&self) -> Duration {
        self.bucket
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

    /// Closes a bucket of the figures over time: what every backend and route did since the last
    /// one (the first call only takes the reading the next bucket starts from).
    pub fn close_bucket(&mut self, registry: &Registry) {
        let now = std::time::Instant::now();
        let totals = registry.totals();
        if let Some((then, earlier)) = &self.last_close {
            let seconds = now.duration_since(*then).as_secs_f64();
            self.history.push(bucket_between(&totals, earlier, seconds));
        }
        self.last_close = Some((now, totals));
    }

    /// The oldest reading kept (about a minute old once the window has filled).
    fn baseline(&self) -> Option<&(std::time::Instant, Totals)> {
        self.readings.front()
    }
}

/// What grew from `earlier` to `now`, `seconds` apart, as a bucket of the figures over time.
fn bucket_between(now: &Totals, earlier: &Totals, seconds: f64) -> Bucket {
    let zero = Counts::default();
    let mut bucket = Bucket {
        end_unix: unix_seconds(),
        ..Bucket::default()
    };
    let mut cluster_picks: HashMap<&str, u64> = HashMap::new();
    let grown: Vec<_> = (now.backends.iter())
        .map(|(key, counts)| {
            (
                key,
                counts.since(earlier.backends.get(key).unwrap_or(&zero)),
            )
        })
        .collect();
    for ((cluster, _), counts) in &grown {
        *cluster_picks.entry(cluster.as_str()).or_default() += counts.picks;
    }
    for (key, counts) in grown {
        let picks_of_cluster = cluster_picks.get(key.0.as_str()).copied().unwrap_or(0);
        let millis = |q| counts.head_time.quantile_bound(q).map(|s| s * 1000.0);
        let point = BackendPoint {
            picks: counts.picks,
            share: (picks_of_cluster > 0).then(|| counts.picks as f64 / picks_of_cluster as f64),
            in_flight: counts.in_flight,
            p50_ms: millis(0.5).filter(|ms| ms.is_finite()),
            p99_ms: millis(0.99).filter(|ms| ms.is_finite()),
        };
        bucket.backends.insert(key.clone(), point);
    }
    let mut routes: HashMap<&str, (u64, u64)> = HashMap::new();
    for (key, sums) in &now.routes {
        let then = earlier.routes.get(key);
        let sum = routes.entry(key.1.as_str()).or_default();
        sum.0 += sums
            .responses
            .saturating_sub(then.map_or(0, |t| t.responses));
        sum.1 += sums
            .errors_5xx
            .saturating_sub(then.map_or(0, |t| t.errors_5xx));
    }
    for (route, (responses, errors)) in routes {
        let point = RoutePoint::of(responses, errors, seconds);
        bucket.routes.insert(route.to_owned(), point);
    }
    bucket
}

impl Registry {
    /// Every worker's growing counts, added up.
    pub fn totals(&self) -> Totals {
        self.inspect(|workers, _, _| Totals::of(workers.values()))
    }

    /// A snapshot for the status page: `health` is the control plane's current health-check view;
    /// counts and rates cover `window` (the last minute), or everything since start without one.
    /// Read under one hold of the registry's lock, so its figures are of one moment.
    pub fn status(&self, health: &HealthView, window: Option<&StatusWindow>) -> Status {
        let empty = Totals::default();
        // Without a reading the figures run from the start, and so does the window.
        let (baseline, window_seconds) = match window.and_then(StatusWindow::baseline) {
            Some((at, reading)) => (reading, Some(at.elapsed().as_secs_f64())),
            None => (&empty, None),
        };
        self.inspect(|workers, process, draining| {
            let entries: Vec<&WorkerEntry> = workers.values().collect();
            let totals = Totals::of(entries.iter().copied());
            let view = View {
                health,
                entries: &entries,
                totals: &totals,
                baseline,
                history: window.map(|w| &w.history),
            };
            let clusters = entries.first().map_or_else(Vec::new, |first| {
                first.clusters.iter().map(|c| view.cluster(c)).collect()
            });
            let routes = entries.first().map_or_else(Vec::new, |first| {
                first.routes.iter().map(|r| view.route(r)).collect()
            });
            let uptime = (unix_seconds() - process.started_unix_seconds).max(0.0);
            Status {
                schema: 3,
                version: env!("CARGO_PKG_VERSION"),
                uptime_seconds: uptime,
                window_seconds: window_seconds.unwrap_or(uptime),
                workers: entries.len(),
                draining,
                config: ConfigStatus::of(process),
                clusters,
                routes,
                history: HistoryStatus {
                    bucket_seconds: window.map_or(DEFAULT_BUCKET, |w| w.bucket).as_secs_f64(),
                    bucket_ends_unix: (window.iter())
                        .flat_map(|w| w.history.buckets().map(|b| b.end_unix))
                        .collect(),
                },
            }
        })
    }

    /// The plain-text status page (`/status?format=text`): every cluster and backend, summed over
    /// workers, counts since start.
    pub fn render_status(&self) -> String {
        self.status(&HealthView::default(), None).to_text()
    }
}

impl ConfigStatus {
    fn of(process: &ProcessState) -> Self {
        ConfigStatus {
            hash: format!("{:016x}", process.config_hash.load(Relaxed)),
            applied_seconds_ago: (unix_seconds()
                - f64::from_bits(process.last_applied_bits.load(Relaxed)))
            .max(0.0),
            last_reload_ok: process.last_reload_ok.load(Relaxed),
            reloads_succeeded: process.reloads_succeeded.load(Relaxed),
            reloads_failed: process.reloads_failed.load(Relaxed),
        }
    }
}

/// What a cluster's figures are computed from: every worker's cells, and the counts now and at the
/// window's start.
struct View<'a> {
    health: &'a HealthView,
    entries: &'a [&'a WorkerEntry],
    totals: &'a Totals,
    baseline: &'a Totals,
    /// The figures over time, when the admin side keeps them.
    history: Option<&'a Ring>,
}

impl View<'_> {
    /// `cluster` (the first worker's cells) with its backends, as all workers see them together.
    fn cluster(&self, cluster: &ClusterCells) -> ClusterStatus {
        let same: Vec<&ClusterCells> = self
            .entries
            .iter()
            .filter_map(|e| e.clusters.iter().find(|c| c.name == cluster.name))
            .collect();
        let empty = Summed::default();
        let durations = self
            .totals
            .clusters
            .get(&cluster.name)
            .unwrap_or(&empty)
            .since(self.baseline.clusters.get(&cluster.name).unwrap_or(&empty));
        let mut backends: Vec<BackendStatus> = cluster
            .backends
            .iter()
            .map(|backend| self.backend(&cluster.name, backend, &same))
            .collect();
        let picks: u64 = backends.iter().map(|b| b.picks).sum();
        for backend in &mut backends {
            backend.pick_share = if picks == 0 {
                0.0
            } else {
                backend.picks as f64 / picks as f64
            };
        }
        let (counts, count_lines) = self.counts(&same);
        ClusterStatus {
            name: cluster.name.clone(),
            policy: cluster.policy,
            requests: durations.count(),
            p99_ms: durations.quantile_bound(0.99).map(|s| s * 1000.0),
            counts,
            count_lines,
            backends,
        }
    }

    /// The counts of the filter counter families shown on the status page, summed over `same` (one
    /// cluster in every worker), by family noun; and those with any as lines.
    #[allow(clippy::type_complexity)]
    fn counts(
        &self,
        same: &[&ClusterCells],
    ) -> (
        BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
        Vec<String>,
    ) {
        let families = (self.entries.iter())
            .map(|e| e.counter_families)
            .find(|families| !families.is_empty())
            .unwrap_or_default();
        let mut counts = BTreeMap::new();
        let mut lines = Vec::new();
        for family in families {
            let Some(noun) = family.status else { continue };
            let mut sums = vec![0; family.values.len()];
            let of_family = same.iter().flat_map(|c| &c.route_counters);
            let mut any = family.every_route;
            for counters in of_family.filter(|c| c.family.name == family.name) {
                any = true;
                for (i, sum) in sums.iter_mut().enumerate() {
                    *sum += counters.get(i);
                }
            }
            if !any {
                continue;
            }
            if sums.iter().any(|&n| n > 0) {
                let each = (sums.iter().zip(family.values))
                    .map(|(n, value)| format!("{n} {value}"))
                    .collect::<Vec<_>>();
                lines.push(format!("{noun} since start: {}", each.join(", ")));
            }
            let key = family.name.trim_start_matches("duet_");
            let named = family.values.iter().copied().zip(sums).collect();
            counts.insert(key.trim_end_matches("_total"), named);
        }
        (counts, lines)
    }

    /// A route (the first worker's description) with the requests each of its clusters took.
    fn route(&self, route: &RouteCells) -> RouteStatus {
        let total: u64 = route.clusters.iter().map(|(_, w)| u64::from(*w)).sum();
        let empty = Summed::default();
        let shares = (route.clusters.iter())
            .map(|(cluster, weight)| {
                let key = (cluster.clone(), route.name.clone());
                let now = self.totals.routes.get(&key).map_or(&empty, |r| &r.duration);
                let then = self
                    .baseline
                    .routes
                    .get(&key)
                    .map_or(&empty, |r| &r.duration);
                ClusterShare {
                    cluster: cluster.clone(),
                    weight: *weight,
                    share: u64::from(*weight) as f64 / total.max(1) as f64,
                    requests: now.since(then).count(),
                }
            })
            .collect();
        RouteStatus {
            name: route.name.clone(),
            matches: route.matches.clone(),
            shares,
            redirect: (!route.redirect.is_empty()).then(|| route.redirect.clone()),
            filters: route.filters.trim_start().to_owned(),
            history: self
                .history
                .map_or_else(Vec::new, |ring| ring.route(&route.name)),
        }
    }

    /// One backend of `cluster` as the workers that have it (`same`: their cells of the cluster) see
    /// it; `pick_share` is left for the cluster to fill in.
    fn backend(
        &self,
        cluster: &str,
        backend: &BackendCell,
        same: &[&ClusterCells],
    ) -> BackendStatus {
        let cells: Vec<&BackendCell> = same
            .iter()
            .filter_map(|c| c.backends.iter().find(|b| b.address == backend.address))
            .collect();
        let eligible_workers = cells.iter().filter(|b| b.load.is_eligible()).count();
        let health = match self.health.healthy(cluster, backend.address) {
            Some(true) => "passing",
            Some(false) => "failing",
            None => "not checked",
        };
        let key = (cluster.to_owned(), backend.address);
        let zero = Counts::default();
        let counts = self
            .totals
            .backends
            .get(&key)
            .unwrap_or(&zero)
            .since(self.baseline.backends.get(&key).unwrap_or(&zero));
        let (state, mut reason) = state(health, eligible_workers, self.entries.len());
        if state == "ejected" && counts.tls_failures > 0 {
            reason = reason.replace(
                "(consecutive failures)",
                &format!(
                    "(consecutive failures; {} TLS handshakes failed)",
                    counts.tls_failures
                ),
            );
        }
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
            error_rate: counts.error_rate(),
            p99_ms: counts.head_time.quantile_bound(0.99).map(|s| s * 1000.0),
            history: (self.history)
                .map_or_else(Vec::new, |ring| ring.backend(cluster, backend.address)),
        }
    }
}

/// A backend's state and why, from its health checks and the workers that may pick it.
fn state(health: &str, eligible_workers: usize, workers: usize) -> (&'static str, String) {
    if health == "failing" {
        ("down", "failing its health checks".to_owned())
    } else if eligible_workers < workers {
        (
            "ejected",
            format!(
                "ejected by {} of {workers} workers (consecutive failures)",
                workers - eligible_workers
            ),
        )
    } else {
        ("up", String::new())
    }
}

/// Counts by status class as named fields.
fn by_class<S: serde::Serializer>(counts: &[u64; 5], serializer: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(Some(counts.len()))?;
    for (class, count) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().zip(counts) {
        map.serialize_entry(class, count)?;
    }
    map.end()
}

impl Status {
    /// The same data as JSON (`/status?format=json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
    }

    /// The plain-text page (`/status?format=text`): per backend its weight, the workers that may
    /// pick it, in flight, picks (over the snapshot's window) and the latency estimate.
    pub fn to_text(&self) -> String {
        let mut out = format!("duet {}: {} workers\n", self.version, self.workers);
        for cluster in &self.clusters {
            let _ = writeln!(out, "\ncluster {} ({})", cluster.name, cluster.policy);
            let _ = writeln!(
                out,
                "  {:<22} {:>6} {:>8} {:>9} {:>10} {:>12}",
                "backend", "weight", "eligible", "in flight", "picks", "rtt estimate"
            );
            for b in &cluster.backends {
                let _ = writeln!(
                    out,
                    "  {:<22} {:>6} {:>6}/{:<1} {:>9} {:>10} {:>10.1}ms",
                    b.address,
                    b.weight,
                    b.eligible_workers,
                    self.workers,
                    b.in_flight,
                    b.picks,
                    b.rtt_estimate_ms
                );
            }
            for line in &cluster.count_lines {
                let _ = writeln!(out, "  {line}");
            }
        }
        for route in &self.routes {
            let _ = writeln!(out, "\nroute {} ({})", route.name, route.matches);
            if let Some(redirect) = &route.redirect {
                let _ = writeln!(out, "  {redirect}");
            }
            for s in &route.shares {
                let _ = writeln!(
                    out,
                    "  -> {:<20} weight {:>7} {:>6.1}% {:>10} requests",
                    s.cluster,
                    s.weight,
                    s.share * 100.0,
                    s.requests
                );
            }
            if !route.filters.is_empty() {
                let _ = writeln!(out, "  filters: {}", route.filters);
            }
        }
        out
    }

    /// The page: one table per cluster, refreshing itself every 5 s; no scripts, no external assets.
    pub fn to_html(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.write_html_head(&mut out);
        for cluster in &self.clusters {
            let _ = write!(
                out,
                "<h2>{} <span class=\"meta\">{} · {} requests · p99 {}{}</span></h2>\n<table>\
                 <tr><th>backend</th><th>state</th><th>weight</th><th>health checks</th>\
                 <th>eligible</th><th>in flight</th><th>PeakEWMA</th><th>picks</th><th>share</th>\
                 <th>2xx</th><th>4xx</th><th>5xx</th><th>failed</th><th>error rate</th>\
                 <th>p99 head</th></tr>\n",
                escape(&cluster.name),
                cluster.policy,
                cluster.requests,
                millis(cluster.p99_ms),
                (cluster.count_lines.iter())
                    .map(|line| format!(" · {line}"))
                    .collect::<String>(),
            );
            for backend in &cluster.backends {
                self.write_html_row(&mut out, backend);
            }
            out.push_str("</table>\n");
            self.write_cluster_plots(&mut out, cluster);
        }
        self.write_html_routes(&mut out);
        out.push_str(
            "<p class=\"meta\">Counts, shares, error rates and p99 over the window above, summed over \
             workers; p99 is the upper bound of the histogram bucket that holds it. \
             <a href=\"/status?format=json\">JSON</a> · <a href=\"/metrics\">metrics</a></p>\n\
             </body></html>\n",
        );
        out
    }

    /// The page's head, style and the line about the process and its configuration.
    fn write_html_head(&self, out: &mut String) {
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"refresh\" content=\"5\"><title>duet status</title><style>\
             body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}\
             table{{border-collapse:collapse;margin:.5em 0 1.5em}}\
             th,td{{padding:.3em .7em;border-bottom:1px solid #ddd;text-align:right}}\
             th:first-child,td:first-child,th:nth-child(2),td:nth-child(2){{text-align:left}}th{{background:#f4f4f4}}\
             .up{{color:#1a7f37}}.down{{color:#cf222e;font-weight:bold}}.ejected{{color:#bf8700;font-weight:bold}}\
             .meta{{color:#555}}.plots{{display:flex;flex-wrap:wrap;gap:1em;margin:-1em 0 1.5em}}\
             .plots p{{flex-basis:100%;margin:0}}\
             .key{{margin-right:1em;white-space:nowrap}}.swatch{{display:inline-block;width:.8em;\
             height:.8em;margin-right:.3em;vertical-align:middle}}</style></head><body>\n\
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
    }

    /// The cluster's backends over time, one plot per figure and one line per backend in each (in
    /// the order of the table), with a key of the lines' colours.
    fn write_cluster_plots(&self, out: &mut String, cluster: &ClusterStatus) {
        let figure = |pick: fn(&BackendPoint) -> Option<f64>| -> Vec<Series<'_>> {
            (cluster.backends.iter())
                .map(|b| Series {
                    name: &b.address,
                    values: b
                        .history
                        .iter()
                        .map(|p| p.as_ref().and_then(pick))
                        .collect(),
                })
                .collect()
        };
        let plots = [
            (
                "share of picks",
                " %",
                figure(|p| p.share.map(|share| share * 100.0)),
            ),
            ("in flight", "", figure(|p| Some(p.in_flight as f64))),
            ("p50 response head", " ms", figure(|p| p.p50_ms)),
            ("p99 response head", " ms", figure(|p| p.p99_ms)),
        ];
        let names: Vec<&str> = cluster
            .backends
            .iter()
            .map(|b| b.address.as_str())
            .collect();
        self.write_plots(out, &escape(&cluster.name), &names, plots);
    }

    /// A row of plots over the buckets of `history`, with the key of the series `names`.
    fn write_plots<const N: usize>(
        &self,
        out: &mut String,
        of: &str,
        names: &[&str],
        plots: [(&str, &str, Vec<Series<'_>>); N],
    ) {
        let _ = write!(
            out,
            "<div class=\"plots\" data-of=\"{of}\"><p class=\"meta\">the last {} in {} s \
             buckets: ",
            duration(BUCKETS as f64 * self.history.bucket_seconds),
            self.history.bucket_seconds,
        );
        for (i, name) in names.iter().enumerate() {
            let _ = write!(
                out,
                "<span class=\"key\"><span class=\"swatch\" style=\"background:{}\"></span>{}\
                 </span>",
                plot::COLOURS[i % plot::COLOURS.len()],
                escape(name),
            );
        }
        out.push_str("</p>");
        for (title, unit, series) in &plots {
            out.push_str(&plot::svg(title, unit, series, BUCKETS));
        }
        out.push_str("</div>\n");
    }

    /// The routes over time: request rate and error ratio, one line per route.
    fn write_route_plots(&self, out: &mut String) {
        let figure = |pick: fn(&RoutePoint) -> f64| -> Vec<Series<'_>> {
            (self.routes.iter())
                .filter(|r| r.redirect.is_none())
                .map(|r| Series {
                    name: &r.name,
                    values: r.history.iter().map(|p| p.as_ref().map(pick)).collect(),
                })
                .collect()
        };
        let plots = [
            ("requests", "/s", figure(|p| p.requests_per_second)),
            ("5xx ratio", " %", figure(|p| p.error_ratio * 100.0)),
        ];
        let names: Vec<&str> = (self.routes.iter())
            .filter(|r| r.redirect.is_none())
            .map(|r| r.name.as_str())
            .collect();
        self.write_plots(out, "routes", &names, plots);
    }

    /// The routes' table, in match order: each route's matchers, where it sends (each of its clusters
    /// with its weight, configured share and requests in the window) and its filters.
    fn write_html_routes(&self, out: &mut String) {
        if self.routes.is_empty() {
            return;
        }
        out.push_str(
            "<h2>routes <span class=\"meta\">first match wins</span></h2>\n<table>\
             <tr><th>route</th><th>matches</th><th>sends to</th><th>filters</th></tr>\n",
        );
        for route in &self.routes {
            let to = match &route.redirect {
                Some(redirect) => escape(redirect),
                None => (route.shares.iter())
                    .map(|s| {
                        format!(
                            "{} (weight {}, {:.1}%): {} requests",
                            escape(&s.cluster),
                            s.weight,
                            s.share * 100.0,
                            s.requests
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("<br>"),
            };
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{to}</td><td>{}</td></tr>",
                escape(&route.name),
                escape(&route.matches),
                escape(&route.filters),
            );
        }
        out.push_str("</table>\n");
        self.write_route_plots(out);
    }

    /// One backend's row of its cluster's table.
    fn write_html_row(&self, out: &mut String, b: &BackendStatus) {
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

/// The status page of a fixed registry (`metrics::fixture`), compared byte for byte with captures.
#[cfg(test)]
mod golden_tests {
    use super::*;
    use crate::{
        telemetry::metrics::fixture::{check, fixture},
        view::ResolvedNames,
    };
    use duet_testbed::config::DuetConfig;

    /// `app` is health-checked: 8001 passes, 8002 and 8003 fail their checks.
    fn health() -> HealthView {
        let backends: Vec<SocketAddr> = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]
            .iter()
            .map(|a| a.parse().expect("address"))
            .collect();
        let yaml = DuetConfig::single("p2c_peak_ewma", &backends)
            .with_cluster("app", |c| {
                c.set("health_check", "{ path: /healthz, interval: 1s }")
            })
            .to_yaml();
        let config = duet_config::parse(&yaml, "golden.yaml").expect("valid config");
        let mut health =
            HealthView::for_config(&config, &ResolvedNames::new(), &HealthView::default());
        health.set("app", backends[0], true);
        health
    }

    /// The status snapshot with its clock-dependent figures pinned.
    fn status(registry: &Registry) -> Status {
        let mut status = registry.status(&health(), None);
        status.uptime_seconds = 9_000.0;
        status.window_seconds = 61.5;
        status.config.applied_seconds_ago = 130.0;
        status
    }

    #[test]
    fn status_text_is_byte_identical_to_its_capture() {
        let (registry, _loads) = fixture(false);
        check(
            "status.txt",
            include_str!("golden/status.txt"),
            &registry.render_status(),
        );
    }

    #[test]
    fn status_json_and_html_are_byte_identical_to_their_captures() {
        let (registry, _loads) = fixture(true);
        let status = status(&registry);
        check(
            "status.json",
            include_str!("golden/status.json"),
            &status.to_json(),
        );
        check(
            "status.html",
            include_str!("golden/status.html"),
            &status.to_html(),
        );
    }

    #[test]
    fn mid_reload_the_text_page_adds_up_each_backend_by_address_as_json_and_html_do() {
        // Worker 1 lists 8003 second and 8002 third: 8002's row is worker 0's 8002 (3 picks, none in
        // flight, ineligible, 1.234 ms) with worker 1's (1 pick, 0.777 ms), never worker 1's 8003; the
        // estimate is averaged over those two, not over worker 2, which has no cells yet.
        let (registry, _loads) = fixture(true);
        let text = registry.render_status();
        let row = |address: &str| {
            text.lines()
                .find(|line| line.trim_start().starts_with(address))
                .map(str::to_owned)
        };
        assert_eq!(
            row("127.0.0.1:8002").as_deref(),
            Some("  127.0.0.1:8002              3      1/3         0          4        1.0ms"),
            "{text}"
        );
        assert_eq!(
            row("127.0.0.1:8003"),
            None,
            "not in the first worker's table: {text}"
        );
    }
}
