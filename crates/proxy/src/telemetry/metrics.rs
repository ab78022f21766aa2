//! Per-worker metric cells and the [`Registry`] the admin endpoints read them from.
//!
//! Workers only touch their own atomics on the request path (no lock, nothing shared with another
//! worker); the registry's lock is taken when a worker publishes its cells (start, reload) and when the
//! admin endpoint renders them: `/metrics` in `metrics_families.rs` (the Prometheus text format,
//! written directly: the cells are plain atomics summed at scrape time, which a metrics library's
//! registry would only wrap), `/status` in `status.rs`.

use crate::{
    outcome::Failure,
    telemetry::histogram::{AttemptCounts, Histogram},
    telemetry::process_stats::{self, ProcessStats},
    telemetry::route_cells::RouteCells,
    telemetry::trace,
};
use duet_balance::EndpointLoad;
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
};

/// Counters of one cluster in one worker.
#[derive(Debug, Default)]
pub(crate) struct ClusterCounters {
    /// Responses sent to clients by status class (1xx … 5xx).
    pub(crate) responses: [AtomicU64; 5],
    /// Attempts retried on another backend.
    pub(crate) retries: AtomicU64,
    /// Backends ejected by this worker's outlier detection.
    pub(crate) ejections: AtomicU64,
    /// Response bodies cut because the backend sent nothing for `timeouts.read`.
    pub(crate) read_timeouts: AtomicU64,
    /// Requests sent again because the pooled connection they went out on had been closed by the
    /// backend (the keep-alive close race).
    pub(crate) stale_resends: AtomicU64,
    /// TLS handshakes with backends that completed (each a new connection: the pool's reuse rate is
    /// requests over these).
    pub(crate) tls_handshakes: AtomicU64,
    /// TLS handshakes with backends that failed (a certificate refused, a timeout, no TLS at all).
    pub(crate) tls_handshake_failures: AtomicU64,
    /// Time spent in completed TLS handshakes, in microseconds.
    pub(crate) tls_handshake_micros: AtomicU64,
    /// Response body bytes passed from backends to clients.
    pub(crate) bytes_sent: AtomicU64,
    /// Request body bytes read from clients (buffered for replay, or passed on as they stream).
    pub(crate) bytes_received: AtomicU64,
    /// Attempts per request that reached the retry stage.
    pub(crate) attempts: AttemptCounts,
    /// gRPC calls by the status they ended with (0 … 16), the backend's or duet's own.
    pub(crate) grpc: [AtomicU64; 17],
}

impl ClusterCounters {
    /// A gRPC call ended with `code`.
    pub(crate) fn grpc_status(&self, code: u8) {
        if let Some(cell) = self.grpc.get(usize::from(code)) {
            cell.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn response(&self, status: u16) {
        if let Some(cell) = self
            .responses
            .get(usize::from(status / 100).wrapping_sub(1))
        {
            cell.fetch_add(1, Relaxed);
        }
    }
}

/// Latency of the requests one route sent to its cluster, in one worker.
#[derive(Debug)]
pub(crate) struct RouteTimings {
    /// The route's name (`route` label).
    pub(crate) route: Arc<str>,
    /// From a request's arrival to the end of its response, all attempts included: what the client saw.
    pub(crate) request_duration: Histogram,
    /// From a request's arrival to its response head from a backend (retries included).
    pub(crate) response_head: Histogram,
    /// Responses sent to clients by status code, 100 to 599 (`duet_route_responses_total`).
    codes: Box<[AtomicU64]>,
}

/// The status codes counted per route: 100 to 599, one cell each.
const CODES: std::ops::Range<u16> = 100..600;

impl RouteTimings {
    pub(crate) fn new(route: &str) -> Self {
        Self {
            route: route.into(),
            request_duration: Histogram::default(),
            response_head: Histogram::default(),
            codes: CODES.map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// One more response of `status` sent to a client.
    pub(crate) fn response(&self, status: http::StatusCode) {
        let index = usize::from(status.as_u16().wrapping_sub(CODES.start));
        if let Some(cell) = self.codes.get(index) {
            cell.fetch_add(1, Relaxed);
        }
    }

    /// The codes sent so far with their counts, in code order (none of those never sent).
    pub(crate) fn codes(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        (CODES.zip(self.codes.iter()))
            .map(|(code, count)| (code, count.load(Relaxed)))
            .filter(|(_, count)| *count > 0)
    }
}

/// What a filter counts for each route, exported as one counter family: `NAME{worker, cluster,
/// route, LABEL}` with one series per value of `LABEL`.
#[derive(Debug)]
pub(crate) struct CounterFamily {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    /// The last label, and its values (each counted by [`RouteCounters::add`] with its index).
    pub(crate) label: &'static str,
    pub(crate) values: &'static [&'static str],
    /// Whether every route has the family's series for each of its clusters, at 0 where it does not
    /// use the filter (so a rate over them never starts from nothing); otherwise only the routes
    /// with the filter have them.
    pub(crate) every_route: bool,
    /// The status page's summary of a cluster's counts, under this noun (`hedges since start: 3
    /// won, 1 lost, 0 cancelled`), shown once there are any; `None`: not on the status page.
    pub(crate) status: Option<&'static str>,
}

/// A filter's counters for one route and one cluster, in one worker: one per value of its family's
/// label (the family says what they count and how they are exported).
#[derive(Debug)]
pub(crate) struct RouteCounters {
    pub(crate) family: &'static CounterFamily,
    /// The route's name (`route` label).
    pub(crate) route: Arc<str>,
    counts: Box<[AtomicU64]>,
}

impl RouteCounters {
    pub(crate) fn new(family: &'static CounterFamily, route: &str) -> Self {
        Self {
            family,
            route: route.into(),
            counts: (0..family.values.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Counts one more of the family's `index`th value.
    pub(crate) fn add(&self, index: usize) {
        self.add_many(index, 1);
    }

    /// Counts `n` more of the family's `index`th value.
    pub(crate) fn add_many(&self, index: usize, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(cell) = self.counts.get(index) {
            cell.fetch_add(n, Relaxed);
        }
    }

    /// The count of the family's `index`th value (0 past the last).
    pub(crate) fn get(&self, index: usize) -> u64 {
        self.counts.get(index).map_or(0, |cell| cell.load(Relaxed))
    }
}

/// Counters of one worker that belong to no cluster.
#[derive(Debug, Default)]
pub(crate) struct WorkerCounters {
    pub(crate) connections: AtomicU64,
    pub(crate) no_route: AtomicU64,
    pub(crate) uri_too_long: AtomicU64,
    pub(crate) head_too_large: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) header_timeout: AtomicU64,
    /// Connections closed, and HTTP/2 streams reset, because the client read nothing for
    /// `limits.send_timeout`.
    pub(crate) send_timeout: AtomicU64,
    /// Client connections open now (parked ones included).
    pub(crate) active: AtomicU64,
    /// Idle keep-alive connections parked now (`parking.rs`).
    pub(crate) parked: AtomicU64,
    /// Times a connection parked.
    pub(crate) parks: AtomicU64,
    /// Times this worker reached its share of `limits.max_connections` and stopped accepting.
    pub(crate) at_capacity: AtomicU64,
    /// Idle parked connections closed to make room for a new one at `limits.max_connections`.
    pub(crate) reclaimed: AtomicU64,
    /// Requests by the protocol the client spoke: HTTP/1.0 (or 0.9), HTTP/1.1, HTTP/2.
    pub(crate) requests: [AtomicU64; 3],
    /// Request fields dropped for an underscore in their name (`underscores_in_headers: drop`).
    pub(crate) underscore_dropped: AtomicU64,
    /// Bytes of request bodies read in full held now (reserved as each starts to be read).
    pub(crate) buffered: AtomicU64,
    /// Requests answered 503 because `limits.max_buffered_bytes` was held already.
    pub(crate) buffer_refused: AtomicU64,
    /// Connections closed at accept over a listener's per-client cap: `connections_per_client`,
    /// `new_connections_per_client`.
    pub(crate) client_refused: [AtomicU64; 2],
    /// Client addresses forgotten with their connection allowance spent, the listener's
    /// `limits.max_clients` reached.
    pub(crate) clients_forgotten: AtomicU64,
    /// Client TLS handshakes of each listener (by its index in the config), by result.
    pub(crate) tls_handshakes: Box<[ListenerHandshakes]>,
}

/// Client TLS handshakes on one listener, by result, in the order of [`HANDSHAKE_RESULTS`].
#[derive(Debug)]
pub(crate) struct ListenerHandshakes {
    /// The `listener` label ([`listener_label`]).
    pub(crate) listener: Box<str>,
    /// Whether the listener terminated TLS when the worker started: a plain one is left out of the
    /// exposition until it counts a handshake (a reload gave it `tls:`).
    pub(crate) tls: bool,
    pub(crate) results: [AtomicU64; HANDSHAKE_RESULTS.len()],
}

/// How a listener is named in the metrics: its `name`, else its address as configured.
pub fn listener_label(listener: &duet_config::Listener) -> String {
    listener
        .name
        .clone()
        .unwrap_or_else(|| listener.address.to_string())
}

/// One listener certificate's expiry, as `duet_tls_certificate_expiry_timestamp_seconds` exports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateExpiry {
    /// The listener ([`listener_label`]).
    pub listener: String,
    /// The certificate file, as the config names it.
    pub certificate: String,
    /// The DNS names it covers, comma-separated.
    pub names: String,
    /// Its leaf's `notAfter`, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// The `result` label of `duet_tls_handshakes_total`: how a client's TLS handshake ended.
pub(crate) const HANDSHAKE_RESULTS: [&str; 8] = [
    "success",
    "timeout",
    "closed",
    "malformed",
    "incompatible",
    "no_client_certificate",
    "bad_client_certificate",
    "other",
];

impl WorkerCounters {
    /// A worker's counters, with a handshake table for each of `listeners`.
    pub(crate) fn for_listeners(listeners: &[duet_config::Listener]) -> Self {
        let tls_handshakes = listeners
            .iter()
            .map(|listener| ListenerHandshakes {
                listener: listener_label(listener).into(),
                tls: listener.tls.is_some(),
                results: Default::default(),
            })
            .collect();
        Self {
            tls_handshakes,
            ..Self::default()
        }
    }

    /// A client's TLS handshake on listener `listener` (its index) ended with `result` (one of
    /// [`HANDSHAKE_RESULTS`]; any other counts as `other`).
    pub(crate) fn tls_handshake(&self, listener: usize, result: &str) {
        let index = HANDSHAKE_RESULTS
            .iter()
            .position(|r| *r == result)
            .unwrap_or(HANDSHAKE_RESULTS.len() - 1);
        if let Some(counts) = self.tls_handshakes.get(listener) {
            counts.results[index].fetch_add(1, Relaxed);
        }
    }
}

impl WorkerCounters {
    /// A request arrived over `version`.
    pub(crate) fn request(&self, version: http::Version) {
        let index = match version {
            http::Version::HTTP_2 => 2,
            http::Version::HTTP_11 => 1,
            _ => 0,
        };
        self.requests[index].fetch_add(1, Relaxed);
    }
}

/// What one worker saw of one backend's answers.
#[derive(Debug)]
pub(crate) struct BackendStats {
    /// The backend's address as the access log writes it (`backend=`), formatted once here rather
    /// than on every request's line.
    pub(crate) address_text: Box<str>,
    /// From an attempt's start to the backend's response head.
    pub(crate) header_time: Histogram,
    /// Response heads by status class (1xx … 5xx).
    pub(crate) responses: [AtomicU64; 5],
    /// Attempts that failed, by [`Failure`].
    pub(crate) failures: [AtomicU64; Failure::ALL.len()],
    /// Times this worker's outlier detection ejected it.
    pub(crate) ejections: AtomicU64,
    /// Times it became pickable again (re-admitted: health checks passing, ejection over).
    pub(crate) admitted: AtomicU64,
    /// Times it stopped being pickable (health checks failing, or ejected).
    pub(crate) removed: AtomicU64,
}

impl BackendStats {
    /// Empty cells for `address`.
    pub(crate) fn new(address: SocketAddr) -> Self {
        Self {
            address_text: address.to_string().into(),
            header_time: Histogram::default(),
            responses: Default::default(),
            failures: Default::default(),
            ejections: AtomicU64::default(),
            admitted: AtomicU64::default(),
            removed: AtomicU64::default(),
        }
    }

    pub(crate) fn response(&self, status: u16) {
        if let Some(cell) = self
            .responses
            .get(usize::from(status / 100).wrapping_sub(1))
        {
            cell.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn failure(&self, kind: Failure) {
        if let Some(position) = Failure::ALL.iter().position(|k| *k == kind) {
            self.failures[position].fetch_add(1, Relaxed);
        }
    }
}

/// One backend as one worker sees it.
#[derive(Debug, Clone)]
pub(crate) struct BackendCell {
    pub(crate) address: SocketAddr,
    pub(crate) weight: u32,
    pub(crate) load: Arc<EndpointLoad>,
    pub(crate) stats: Arc<BackendStats>,
}

/// One cluster as one worker sees it.
#[derive(Debug, Clone)]
pub(crate) struct ClusterCells {
    pub(crate) name: String,
    pub(crate) policy: &'static str,
    pub(crate) counters: Arc<ClusterCounters>,
    pub(crate) backends: Vec<BackendCell>,
    /// The timings of the routes that lead to this cluster.
    pub(crate) routes: Vec<Arc<RouteTimings>>,
    /// The filters' counters of the routes that act on this cluster, each under its family.
    pub(crate) route_counters: Vec<Arc<RouteCounters>>,
}

#[derive(Debug, Default)]
pub(crate) struct WorkerEntry {
    pub(crate) counters: Arc<WorkerCounters>,
    pub(crate) clusters: Vec<ClusterCells>,
    /// The routes of the worker's table, described for the status page.
    pub(crate) routes: Vec<RouteCells>,
    /// The families of the filters' counters ([`RouteCounters`]), in the order they are exported.
    pub(crate) counter_families: &'static [&'static CounterFamily],
}

/// What the control plane's discovery counts.
#[derive(Debug, Default)]
pub struct DiscoveryCounters {
    /// Host names that resolve to no address right now (their endpoints are empty or stale).
    pub unresolved: AtomicU64,
    /// Lookups that failed, since start.
    pub failures: AtomicU64,
}

/// Where workers publish their cells and the admin endpoint reads them.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    workers: Arc<Mutex<BTreeMap<usize, WorkerEntry>>>,
    discovery: Arc<DiscoveryCounters>,
    readiness: Arc<Readiness>,
    process: Arc<ProcessState>,
}

/// The process's own facts: when it started, and the configuration it runs.
#[derive(Debug)]
pub(crate) struct ProcessState {
    pub(crate) started_unix_seconds: f64,
    pub(crate) reloads_succeeded: AtomicU64,
    pub(crate) reloads_failed: AtomicU64,
    /// Listener certificate files re-read because their content changed: applied, and refused.
    pub(crate) certificate_rotations: [AtomicU64; 2],
    /// Whether the last reload (or the start) applied its file.
    pub(crate) last_reload_ok: std::sync::atomic::AtomicBool,
    /// When a configuration was last applied (seconds since the epoch, as `f64` bits).
    pub(crate) last_applied_bits: AtomicU64,
    /// FNV-1a of the configuration file's bytes as last applied: compare it with the file you meant.
    pub(crate) config_hash: AtomicU64,
    /// The listeners' certificates as last loaded (start, reload, rotation).
    pub(crate) certificates: Mutex<Vec<CertificateExpiry>>,
    /// Reads the process's resources at a scrape (fixed in tests).
    pub(crate) resources: fn() -> Option<ProcessStats>,
    /// The trace exporters and what they count.
    pub(crate) traces: Arc<trace::Export>,
}

impl Default for ProcessState {
    fn default() -> Self {
        let now = unix_seconds();
        Self {
            started_unix_seconds: now,
            reloads_succeeded: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            certificate_rotations: Default::default(),
            last_reload_ok: std::sync::atomic::AtomicBool::new(true),
            last_applied_bits: AtomicU64::new(now.to_bits()),
            config_hash: AtomicU64::new(0),
            certificates: Mutex::default(),
            resources: process_stats::read,
            traces: Arc::default(),
        }
    }
}

pub(crate) fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// FNV-1a (64 bits) of a configuration file's bytes: stable across builds and platforms, which a
/// `std` hasher does not promise.
pub fn config_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[derive(Debug, Default)]
pub(crate) struct Readiness {
    expected_workers: AtomicU64,
    draining: std::sync::atomic::AtomicBool,
}

impl Readiness {
    /// Whether duet is draining: responses then ask clients to close their connections.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Relaxed)
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Discovery's counters, for the control plane to update.
    pub fn discovery(&self) -> &DiscoveryCounters {
        &self.discovery
    }

    /// Sets how many workers must have started before duet is ready.
    pub fn expect_workers(&self, workers: usize) {
        self.readiness
            .expected_workers
            .store(workers as u64, Relaxed);
    }

    /// The process's trace exporters, which every worker's tracer sends through.
    pub(crate) fn trace_export(&self) -> Arc<trace::Export> {
        self.process.traces.clone()
    }

    pub(crate) fn readiness_flags(&self) -> Arc<Readiness> {
        self.readiness.clone()
    }

    /// Runs `f` over every worker's cells and the process's state, under the registry's lock.
    pub(crate) fn inspect<T>(
        &self,
        f: impl FnOnce(&BTreeMap<usize, WorkerEntry>, &ProcessState, bool) -> T,
    ) -> T {
        let workers = self
            .workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&workers, &self.process, self.readiness.draining())
    }

    /// Records the configuration applied at start or by a reload (`hash`: [`config_hash`] of its file).
    pub fn note_config_applied(&self, hash: u64, reload: bool) {
        let process = &self.process;
        if reload {
            process.reloads_succeeded.fetch_add(1, Relaxed);
        }
        process.last_reload_ok.store(true, Relaxed);
        process
            .last_applied_bits
            .store(unix_seconds().to_bits(), Relaxed);
        process.config_hash.store(hash, Relaxed);
    }

    /// Records a reload that was refused (the running configuration stays).
    pub fn note_reload_failed(&self) {
        self.process.reloads_failed.fetch_add(1, Relaxed);
        self.process.last_reload_ok.store(false, Relaxed);
    }

    /// Records listener certificate files re-read because their content changed: `applied`, or
    /// refused (a file that does not load; the certificates in use stay).
    pub fn note_certificate_rotation(&self, applied: bool) {
        let index = usize::from(!applied);
        self.process.certificate_rotations[index].fetch_add(1, Relaxed);
    }

    /// Records the listeners' certificates now served (at start, and whenever they are loaded
    /// again), replacing those recorded before.
    pub fn note_certificates(&self, certificates: Vec<CertificateExpiry>) {
        *self
            .process
            .certificates
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = certificates;
    }

    /// Marks duet as draining: no longer ready for new traffic.
    pub fn set_draining(&self) {
        self.readiness.draining.store(true, Relaxed);
    }

    /// Ready for traffic: every worker has built its routing table and duet is not draining. `Err` says
    /// why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.readiness.draining.load(Relaxed) {
            return Err("draining");
        }
        let started = self
            .workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len() as u64;
        if started < self.readiness.expected_workers.load(Relaxed) {
            return Err("workers starting");
        }
        Ok(())
    }

    /// `worker`'s counters, made for `listeners` if it has none yet.
    pub(crate) fn worker(
        &self,
        worker: usize,
        listeners: &[duet_config::Listener],
    ) -> Arc<WorkerCounters> {
        let mut workers = self
            .workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = workers.entry(worker).or_insert_with(|| WorkerEntry {
            counters: Arc::new(WorkerCounters::for_listeners(listeners)),
            ..WorkerEntry::default()
        });
        entry.counters.clone()
    }

    /// `worker`'s cells (after a start or a reload), with the families its filters' counters
    /// belong to.
    pub(crate) fn publish(
        &self,
        worker: usize,
        clusters: Vec<ClusterCells>,
        counter_families: &'static [&'static CounterFamily],
    ) {
        let mut workers = self
            .workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = workers.entry(worker).or_default();
        entry.clusters = clusters;
        entry.counter_families = counter_families;
    }

    /// The routes of `worker`'s table (after a start or a reload).
    pub(crate) fn publish_routes(&self, worker: usize, routes: Vec<RouteCells>) {
        let mut workers = self
            .workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        workers.entry(worker).or_default().routes = routes;
    }
}

/// A registry with fixed contents, for the admin renderings' golden tests (here and in `status.rs`).
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;
    use duet_balance::{
        Balancer, Clock, DefaultRtt, LoadGuard, MockTime, PeakEwmaConfig, Strategy,
    };
    use std::time::Duration;

    /// One backend's balancer state, on a clock that never moves: what it reports is fixed.
    pub(crate) struct Load {
        load: Arc<EndpointLoad>,
        _in_flight: Vec<LoadGuard>,
        _balance: Balancer<u8, ()>,
        _time: MockTime,
    }

    fn load(rtt_micros: u64, picks: usize, in_flight: usize, eligible: bool) -> Load {
        let (clock, time) = Clock::mock();
        let config = PeakEwmaConfig {
            default_rtt: DefaultRtt::Fixed(Duration::from_micros(rtt_micros)),
            ..PeakEwmaConfig::default()
        };
        let mut balance: Balancer<u8, ()> = Balancer::with_seed(Strategy::P2cPeakEwma, 7)
            .with_latency_config(config)
            .with_clock(clock);
        balance.insert(0, 1, ());
        let mut held = Vec::new();
        for pick in 0..picks {
            let Ok((_, _, mut guard)) = balance.pick_and_claim() else {
                panic!("the one endpoint is eligible");
            };
            if pick < in_flight {
                held.push(guard);
            } else {
                guard.discard_sample();
            }
        }
        balance.set_eligible(&0, eligible);
        let load = balance.endpoint_load(&0).expect("inserted").clone();
        Load {
            load,
            _in_flight: held,
            _balance: balance,
            _time: time,
        }
    }

    fn add(cell: &AtomicU64, n: u64) {
        cell.fetch_add(n, Relaxed);
    }

    fn backend(address: &str, weight: u32, load: &Load, seed: u64) -> BackendCell {
        let address = address.parse().expect("address");
        let stats = BackendStats::new(address);
        for (i, cell) in stats.responses.iter().enumerate() {
            add(cell, seed * 10 + i as u64);
        }
        for (i, cell) in stats.failures.iter().enumerate() {
            add(cell, (seed + i as u64) % 4);
        }
        add(&stats.ejections, seed % 3);
        add(&stats.admitted, seed);
        add(&stats.removed, seed + 1);
        for micros in [300, 800 * seed, 42_000, 70_000_000] {
            stats.header_time.observe(Duration::from_micros(micros));
        }
        // A traced request's, in OpenMetrics only: the later worker's (seed) is the newest.
        let at = 1_700_000_000_000 + seed * 1_001;
        let id = [seed as u8 | 0x10; 16];
        (stats.header_time).set_exemplar(Duration::from_micros(41_000), &id, at);
        BackendCell {
            address,
            weight,
            load: load.load.clone(),
            stats: Arc::new(stats),
        }
    }

    fn cluster(
        name: &str,
        policy: &'static str,
        seed: u64,
        routes: &[&str],
        backends: Vec<BackendCell>,
    ) -> ClusterCells {
        let counters = ClusterCounters::default();
        for status in [200, 200, 204, 301, 404, 503, 101] {
            counters.response(status);
        }
        for (i, cell) in [
            &counters.retries,
            &counters.ejections,
            &counters.read_timeouts,
            &counters.stale_resends,
            &counters.tls_handshakes,
            &counters.tls_handshake_failures,
            &counters.tls_handshake_micros,
        ]
        .into_iter()
        .enumerate()
        {
            add(cell, seed + i as u64);
        }
        add(&counters.bytes_sent, 1_000_000 * seed + 17);
        add(&counters.bytes_received, 4_096 * seed);
        for attempts in [1, 1, 2, 3, 7] {
            counters.attempts.observe(attempts);
        }
        // gRPC: OK twice, one UNAVAILABLE; the other codes stay out of the exposition.
        for code in [0, 0, 14] {
            counters.grpc_status(code);
        }
        let routes: Vec<Arc<RouteTimings>> = routes
            .iter()
            .enumerate()
            .map(|(i, route)| {
                let timings = RouteTimings::new(route);
                for micros in [450, 1_200 * (seed + i as u64), 260_000] {
                    timings
                        .request_duration
                        .observe(Duration::from_micros(micros));
                    timings
                        .response_head
                        .observe(Duration::from_micros(micros / 2));
                }
                // Traced requests', in OpenMetrics only: the later worker's (seed) is the newest
                // of a bucket both have.
                let at = 1_700_000_000_000 + seed * 1_000 + i as u64;
                let id = [(seed * 16 + i as u64) as u8; 16];
                let duration = &timings.request_duration;
                duration.set_exemplar(Duration::from_micros(450), &id, at);
                duration.set_exemplar(Duration::from_micros(250_000 + seed), &id, at);
                (timings.response_head).set_exemplar(Duration::from_micros(130_000), &id, at);
                // Codes out of order, one twice, one in no worker's other cells.
                for code in [503, 200, 200, 404 + i as u16] {
                    timings.response(http::StatusCode::from_u16(code).expect("a status"));
                }
                Arc::new(timings)
            })
            .collect();
        // Every route has a family's counters that every route has; the first route has another's.
        let (outcomes_family, copies_family) =
            (family("duet_hedges_total"), family("duet_mirrors_total"));
        let mut route_counters = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let outcomes = RouteCounters::new(outcomes_family, &route.route);
            for j in 0..outcomes_family.values.len() {
                (0..seed * 10 + (i + j) as u64).for_each(|_| outcomes.add(j));
            }
            route_counters.push(Arc::new(outcomes));
        }
        for route in routes.iter().take(1) {
            let copies = RouteCounters::new(copies_family, &route.route);
            for j in 0..copies_family.values.len() {
                (0..seed * 100 + j as u64).for_each(|_| copies.add(j));
            }
            route_counters.push(Arc::new(copies));
        }
        ClusterCells {
            name: name.to_owned(),
            policy,
            counters: Arc::new(counters),
            backends,
            routes,
            route_counters,
        }
    }

    /// The filters' counter families, as the workers publish them.
    pub(crate) fn families() -> &'static [&'static CounterFamily] {
        crate::filter::counter_families()
    }

    /// The family named `name` (one that every route has, `duet_hedges_total`, or one that only
    /// the routes with the filter have, `duet_mirrors_total`).
    fn family(name: &str) -> &'static CounterFamily {
        let found = families().iter().find(|family| family.name == name);
        found.unwrap_or_else(|| panic!("no counter family {name}"))
    }

    /// The process's resources, fixed so that a rendering can be compared with its capture.
    pub(crate) fn fixed_resources() -> Option<crate::telemetry::process_stats::ProcessStats> {
        Some(crate::telemetry::process_stats::ProcessStats {
            cpu_seconds: 12.34,
            resident_bytes: 25_165_824,
            virtual_bytes: 1_073_741_824,
            open_fds: 42,
            max_fds: 1_048_576,
        })
    }

    pub(crate) const WEIRD: &str = "we\"ird\\name\n<&>";

    /// Two workers with the same clusters (`idle` has no backend and no route); `reloading`: worker 1
    /// already has a third backend in `app`, listed before one it shares with worker 0, and worker 2
    /// has started but not published its cells yet. Loads are returned so the in-flight guards live as
    /// long as the registry is read.
    pub(crate) fn fixture(reloading: bool) -> (Registry, Vec<Load>) {
        let registry = Registry {
            process: Arc::new(ProcessState {
                started_unix_seconds: 1_700_000_000.123_456,
                reloads_succeeded: AtomicU64::new(2),
                reloads_failed: AtomicU64::new(1),
                certificate_rotations: [AtomicU64::new(3), AtomicU64::new(1)],
                last_reload_ok: std::sync::atomic::AtomicBool::new(false),
                last_applied_bits: AtomicU64::new(1_700_000_100.5_f64.to_bits()),
                config_hash: AtomicU64::new(config_hash(b"clusters: []\n")),
                certificates: Mutex::new(vec![CertificateExpiry {
                    listener: "public".to_owned(),
                    certificate: "certs/shop.pem".to_owned(),
                    names: "shop.example,*.shop.example".to_owned(),
                    not_after: 1_767_225_600,
                }]),
                resources: fixed_resources,
                traces: Arc::default(),
            }),
            ..Registry::default()
        };
        let listeners = duet_config::parse(
            "listeners:\n  - address: 127.0.0.1:8080\n  - name: public\n    address: 0.0.0.0:8443\n    \
             tls: { cert: shop.pem, key: shop.key }\nroutes: [ { cluster: app } ]\n\
             clusters: [ { name: app, backends: [ { address: 127.0.0.1:1 } ] } ]\n",
            "fixture.yaml",
        )
        .expect("listeners")
        .listeners;
        let traces = &registry.process.traces.counters;
        add(&traces.exported, 40);
        add(&traces.dropped[0], 2);
        add(&traces.dropped[1], 5);
        add(&registry.discovery().unresolved, 1);
        add(&registry.discovery().failures, 3);
        let loads = vec![
            load(100_000, 5, 1, true),
            load(1_234, 3, 0, false),
            load(250, 9, 2, true),
            load(200_000, 4, 0, true),
            load(1_234, 6, 1, true),
            load(777, 1, 0, true),
            load(250, 2, 0, false),
        ];
        let workers: &[usize] = if reloading { &[1, 0, 2] } else { &[1, 0] };
        for &worker in workers {
            let counters = registry.worker(worker, &listeners);
            let seed = worker as u64 + 1;
            for (i, result) in HANDSHAKE_RESULTS.iter().enumerate() {
                for _ in 0..(seed + i as u64) % 3 {
                    counters.tls_handshake(1, result);
                }
            }
            for (i, cell) in [
                &counters.connections,
                &counters.no_route,
                &counters.uri_too_long,
                &counters.head_too_large,
                &counters.malformed,
                &counters.header_timeout,
                &counters.send_timeout,
                &counters.active,
                &counters.parked,
                &counters.parks,
                &counters.at_capacity,
                &counters.reclaimed,
                &counters.requests[0],
                &counters.requests[1],
                &counters.requests[2],
            ]
            .into_iter()
            .enumerate()
            {
                add(cell, seed * 100 + i as u64);
            }
        }
        let l = &loads;
        registry.publish(
            0,
            vec![
                cluster(
                    "app",
                    "p2c_peak_ewma",
                    1,
                    &["*/", "api/"],
                    vec![
                        backend("127.0.0.1:8001", 1, &l[0], 1),
                        backend("127.0.0.1:8002", 3, &l[1], 2),
                    ],
                ),
                cluster(
                    WEIRD,
                    "round_robin",
                    2,
                    &["*/w"],
                    vec![backend("[::1]:9000", 1, &l[2], 3)],
                ),
                cluster("idle", "p2c_inflight", 5, &[], Vec::new()),
            ],
            families(),
        );
        registry.publish(
            1,
            vec![
                cluster("app", "p2c_peak_ewma", 3, &["*/", "api/"], {
                    let mut backends = vec![
                        backend("127.0.0.1:8001", 1, &l[3], 4),
                        backend("127.0.0.1:8003", 1, &l[4], 5),
                        backend("127.0.0.1:8002", 3, &l[5], 6),
                    ];
                    if !reloading {
                        backends.remove(1);
                    }
                    backends
                }),
                cluster(
                    WEIRD,
                    "round_robin",
                    4,
                    &["*/w"],
                    vec![backend("[::1]:9000", 1, &l[6], 7)],
                ),
                cluster("idle", "p2c_inflight", 6, &[], Vec::new()),
            ],
            families(),
        );
        (registry, loads)
    }

    /// Compares a rendering with its capture in `src/telemetry/golden/` (the directory beside this file);
    /// `DUET_BLESS_GOLDEN=1` rewrites the captures instead (then review their diff).
    pub(crate) fn check(name: &str, expected: &str, actual: &str) {
        let path = format!("{}/src/telemetry/golden/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("DUET_BLESS_GOLDEN").is_some() {
            std::fs::write(&path, actual).expect("write the golden capture");
            return;
        }
        if expected != actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(e, a)| e != a)
                .unwrap_or(expected.lines().count().min(actual.lines().count()));
            panic!(
                "{name} differs from its capture from line {}:\nexpected: {:?}\nactual:   {:?}\n\
                 whole output:\n{actual}",
                first + 1,
                expected.lines().nth(first),
                actual.lines().nth(first),
            );
        }
    }
}

/// `/metrics` of a fixed registry, compared byte for byte with captures: the families, their order,
/// labels and number formatting are an interface (dashboards, alerts, the README's sample), so a
/// refactor of the renderer must not move a byte.
#[cfg(test)]
mod golden_tests {
    use super::fixture::{check, fixture};

    #[test]
    fn prometheus_text_is_byte_identical_to_its_capture() {
        let (registry, _loads) = fixture(true);
        check(
            "metrics.prom",
            include_str!("golden/metrics.prom"),
            &registry.render_prometheus(),
        );
    }

    #[test]
    fn aggregated_prometheus_text_is_byte_identical_to_its_capture() {
        let (registry, _loads) = fixture(true);
        check(
            "metrics_aggregated.prom",
            include_str!("golden/metrics_aggregated.prom"),
            &registry.render_prometheus_aggregated(),
        );
    }

    #[test]
    fn openmetrics_text_is_byte_identical_to_its_capture() {
        let (registry, _loads) = fixture(true);
        check(
            "metrics.om",
            include_str!("golden/metrics.om"),
            &registry.render_openmetrics(false),
        );
    }

    #[test]
    fn aggregated_openmetrics_text_is_byte_identical_to_its_capture() {
        let (registry, _loads) = fixture(true);
        check(
            "metrics_aggregated.om",
            include_str!("golden/metrics_aggregated.om"),
            &registry.render_openmetrics(true),
        );
    }

    #[test]
    /// The filters' families come with the workers' cells: before any worker has published, they
    /// are not written at all.
    fn before_any_worker_starts_both_expositions_are_every_header_and_the_process_samples() {
        let registry = super::Registry {
            process: std::sync::Arc::new(super::ProcessState {
                resources: super::fixture::fixed_resources,
                ..super::ProcessState::default()
            }),
            ..super::Registry::new()
        };
        let plain = registry.render_prometheus();
        assert_eq!(plain, registry.render_prometheus_aggregated());
        let samples: Vec<&str> = plain
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split([' ', '{']).next())
            .collect();
        assert_eq!(
            samples,
            [
                "duet_build_info",
                "duet_process_start_time_seconds",
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_virtual_memory_bytes",
                "process_open_fds",
                "process_max_fds",
                "process_start_time_seconds",
                "duet_config_reloads_total",
                "duet_config_reloads_total",
                "duet_tls_certificate_rotations_total",
                "duet_tls_certificate_rotations_total",
                "duet_config_last_reload_successful",
                "duet_config_last_applied_timestamp_seconds",
                "duet_config_info",
                "duet_dns_unresolved_names",
                "duet_dns_resolution_failures_total",
                "duet_trace_spans_exported_total",
                "duet_trace_spans_dropped_total",
                "duet_trace_spans_dropped_total",
            ]
        );
        // Every family but the filters' (which come with the workers' cells).
        assert_eq!(plain.matches("# TYPE ").count(), 57, "{plain}");
    }
}
