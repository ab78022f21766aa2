//! The Prometheus exposition: every metric family duet exports, described as data in [`FAMILIES`]
//! (name, type, help, labels, and where its value is in the cells), and the one renderer that walks the
//! table over the workers' cells. The filters' counter families are described by the filters
//! ([`CounterFamily`]) and published with the workers' cells; they are rendered where
//! [`Read::Filters`] stands in the table.
//!
//! A family's series come from one level of the cells — the process, each worker, each worker's
//! clusters or their backends — which fixes its labels (`worker`, then `cluster`, then `backend`),
//! optionally followed by one label of fixed values (`class`, `reason`, `kind`...). With
//! `?aggregate=worker` the `worker` label is summed away on the values, before anything is written.
//! Latency histograms are always summed over workers: a latency distribution is the process's, and
//! per-worker series would multiply bucket series by workers.

use crate::{
    grpc,
    outcome::Failure,
    telemetry::histogram::{Exposition, Histogram, Sum, Summed, SummedAttempts},
    telemetry::metrics::{
        BackendCell, BackendStats, ClusterCells, ClusterCounters, CounterFamily, DiscoveryCounters,
        ListenerHandshakes, ProcessState, Registry, RouteCounters, RouteTimings, WorkerCounters,
        WorkerEntry, HANDSHAKE_RESULTS,
    },
    telemetry::process_stats::ProcessStats,
    telemetry::trace::DROP_REASONS,
};
use std::{
    borrow::{Borrow, Cow},
    collections::{BTreeMap, HashMap},
    fmt::{self, Write},
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

/// One metric family: its `# HELP`/`# TYPE` lines and where its samples come from.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    /// The last label, one series per value, read by its index (`class` → `1xx` … `5xx`).
    by: Option<(&'static str, &'static [&'static str])>,
    /// Series of the `by` label still at 0 are left out: for labels of many values of which a
    /// cluster sees few (17 gRPC codes, in every cluster, most never gRPC).
    sparse: bool,
    read: Read,
}

/// Where a family's values are, and so which labels its series have.
#[derive(Clone, Copy)]
enum Read {
    /// The process's (no label; the index is the `by` value's).
    Process(fn(&Scrape<'_>, usize) -> Value),
    /// The process's resources as the system counts them (no label); no sample where they cannot
    /// be read.
    Resources(fn(&ProcessStats) -> Value),
    /// Always 1; its one label, named here, says it all.
    Info(&'static str, fn(&Scrape<'_>) -> String),
    /// Each worker's (`worker`).
    Worker(fn(&WorkerCounters, usize) -> Value),
    /// Each worker's TLS listeners' (`worker`, `listener`).
    Listener(fn(&ListenerHandshakes, usize) -> Value),
    /// Each listener certificate's `notAfter` (`listener`, `certificate`, `names`).
    Certificates,
    /// Each worker's clusters' (`worker`, `cluster`).
    Cluster(fn(&ClusterCounters, usize) -> Value),
    /// Each worker's backends' (`worker`, `cluster`, `backend`).
    Backend(fn(&BackendCell, usize) -> Value),
    /// The families of the filters' counters, in their order ([`CounterFamily`]), each rendered
    /// where this entry stands.
    Filters,
    /// One filter's counters of each worker's routes (`worker`, `cluster`, `route`).
    RouteCounters(&'static CounterFamily),
    /// A histogram of each route, summed over workers (`cluster`, `route`).
    RouteLatency(fn(&RouteTimings) -> &Histogram),
    /// Responses of each route by status code, summed over workers (`cluster`, `route`, `code`):
    /// only the codes sent, so a route's series are its few codes, not 500.
    RouteCodes,
    /// Attempts per request of each cluster, summed over workers (`cluster`).
    Attempts,
    /// A histogram of each backend, summed over workers (`cluster`, `backend`).
    BackendLatency(fn(&BackendStats) -> &Histogram),
}

/// One sample's value, as the plain exposition writes it.
#[derive(Clone, Copy)]
enum Value {
    Count(u64),
    /// Written with this many decimals.
    Fixed(f64, usize),
}

const COUNTER: &str = "counter";
const GAUGE: &str = "gauge";
const HISTOGRAM: &str = "histogram";
const CLASSES: &[&str] = &["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Every family, in the order of the exposition (dashboards and the README's sample follow it).
#[rustfmt::skip]
const FAMILIES: &[Family] = &[
    Family::new("duet_build_info", GAUGE,
        "Always 1; the labels say which duet this is.",
        Read::Info("version", |_| env!("CARGO_PKG_VERSION").to_owned())),
    Family::new("duet_process_start_time_seconds", GAUGE,
        "When the process started, in seconds since the Unix epoch.",
        Read::Process(|s, _| Value::Fixed(s.process.started_unix_seconds, 3))),
    // The standard process families, under the names Prometheus's client libraries give them.
    Family::new("process_cpu_seconds_total", COUNTER,
        "Total user and system CPU time spent in seconds.",
        Read::Resources(|r| Value::Fixed(r.cpu_seconds, 2))),
    Family::new("process_resident_memory_bytes", GAUGE,
        "Resident memory size in bytes.",
        Read::Resources(|r| Value::Count(r.resident_bytes))),
    Family::new("process_virtual_memory_bytes", GAUGE,
        "Virtual memory size in bytes.",
        Read::Resources(|r| Value::Count(r.virtual_bytes))),
    Family::new("process_open_fds", GAUGE,
        "Number of open file descriptors.",
        Read::Resources(|r| Value::Count(r.open_fds))),
    Family::new("process_max_fds", GAUGE,
        "Maximum number of open file descriptors.",
        Read::Resources(|r| Value::Count(r.max_fds))),
    Family::new("process_start_time_seconds", GAUGE,
        "Start time of the process since unix epoch in seconds.",
        Read::Process(|s, _| Value::Fixed(s.process.started_unix_seconds, 3))),
    Family::new("duet_config_reloads_total", COUNTER,
        "Configuration reloads (SIGHUP), by result; a failed one leaves the running configuration in place.",
        Read::Process(|s, i| nth(&[&s.process.reloads_succeeded, &s.process.reloads_failed], i)))
        .by("result", &["success", "failure"]),
    Family::new("duet_tls_certificate_rotations_total", COUNTER,
        "Listener certificate, key and CA files re-read because their content changed, by result; a failure keeps the certificates in use.",
        Read::Process(|s, i| nth(&[&s.process.certificate_rotations[0], &s.process.certificate_rotations[1]], i)))
        .by("result", &["success", "failure"]),
    Family::new("duet_config_last_reload_successful", GAUGE,
        "1 if the last reload (or the start) applied its configuration file, 0 if it was refused.",
        Read::Process(|s, _| Value::Count(u64::from(s.process.last_reload_ok.load(Relaxed))))),
    Family::new("duet_config_last_applied_timestamp_seconds", GAUGE,
        "When the running configuration was applied, in seconds since the Unix epoch.",
        Read::Process(|s, _| Value::Fixed(f64::from_bits(s.process.last_applied_bits.load(Relaxed)), 3))),
    Family::new("duet_config_info", GAUGE,
        "Always 1; `hash` is the FNV-1a (64-bit, hex) of the running configuration file's bytes.",
        Read::Info("hash", |s| format!("{:016x}", s.process.config_hash.load(Relaxed)))),
    Family::new("duet_connections_total", COUNTER,
        "Client connections accepted.",
        Read::Worker(|w, _| count(&w.connections))),
    Family::new("duet_connections_active", GAUGE,
        "Client connections open, parked ones included.",
        Read::Worker(|w, _| count(&w.active))),
    Family::new("duet_connections_parked", GAUGE,
        "Idle keep-alive client connections parked, waiting for their next request (counted in duet_connections_active too).",
        Read::Worker(|w, _| count(&w.parked))),
    Family::new("duet_connections_parked_total", COUNTER,
        "Times an idle keep-alive client connection was parked.",
        Read::Worker(|w, _| count(&w.parks))),
    Family::new("duet_connections_at_capacity_total", COUNTER,
        "Times a connection arrived while its worker held max_connections: an idle one was closed to make room, or it waited until one closed.",
        Read::Worker(|w, _| count(&w.at_capacity))),
    Family::new("duet_connections_refused_total", COUNTER,
        "Client connections closed at accept, before any TLS handshake, over a listener's per-client cap (limits.connections_per_client, limits.new_connections_per_client).",
        Read::Worker(|w, i| nth(&w.client_refused, i)))
        .by("reason", &["connections_per_client", "new_connections_per_client"]),
    Family::new("duet_client_limit_forgotten_total", COUNTER,
        "Client addresses a listener's per-client caps forgot before their new-connection allowance had refilled, its limits.max_clients reached.",
        Read::Worker(|w, _| count(&w.clients_forgotten))),
    Family::new("duet_connections_reclaimed_total", COUNTER,
        "Idle keep-alive client connections closed to make room for a new one at max_connections.",
        Read::Worker(|w, _| count(&w.reclaimed))),
    Family::new("duet_send_timeouts_total", COUNTER,
        "Client connections closed, and HTTP/2 streams reset, because the client read nothing for limits.send_timeout.",
        Read::Worker(|w, _| count(&w.send_timeout))),
    Family::new("duet_buffered_request_bytes", GAUGE,
        "Bytes of request bodies read in full (a route's buffer_request, or kept for retries) held now, against limits.max_buffered_bytes.",
        Read::Worker(|w, _| count(&w.buffered))),
    Family::new("duet_buffer_budget_refusals_total", COUNTER,
        "Requests answered 503 because their worker held limits.max_buffered_bytes of request bodies already.",
        Read::Worker(|w, _| count(&w.buffer_refused))),
    Family::new("duet_tls_handshakes_total", COUNTER,
        "Client TLS handshakes by listener (its name, else its address as configured) and result: success, or why it failed (timeout: not done within limits.header_read_timeout; closed: the client went away; malformed: not TLS; incompatible: no version or cipher in common; no_client_certificate and bad_client_certificate: client_auth refused it).",
        Read::Listener(|l, i| l.results.get(i).map_or(Value::Count(0), count)))
        .by("result", &HANDSHAKE_RESULTS),
    Family::new("duet_tls_certificate_expiry_timestamp_seconds", GAUGE,
        "When each listener certificate's leaf expires (its notAfter), in seconds since the Unix epoch; names are its DNS names. Updated when the files are read again (reload, rotation).",
        Read::Certificates),
    Family::new("duet_rejected_requests_total", COUNTER,
        "Requests refused before routing, by reason.",
        Read::Worker(|w, i| nth(&[&w.no_route, &w.uri_too_long, &w.head_too_large, &w.malformed, &w.header_timeout], i)))
        .by("reason", &["no_route", "uri_too_long", "head_too_large", "malformed", "header_timeout"]),
    Family::new("duet_underscore_headers_dropped_total", COUNTER,
        "Request header fields dropped because their name holds an underscore (a listener's underscores_in_headers: drop, the default).",
        Read::Worker(|w, _| count(&w.underscore_dropped))),
    Family::new("duet_requests_total", COUNTER,
        "Requests received, by the protocol the client spoke.",
        Read::Worker(|w, i| nth(&w.requests, i)))
        .by("protocol", &["HTTP/1.0", "HTTP/1.1", "HTTP/2"]),
    Family::new("duet_dns_unresolved_names", GAUGE,
        "Backend host names that resolve to no address right now.",
        Read::Process(|s, _| count(&s.discovery.unresolved))),
    Family::new("duet_dns_resolution_failures_total", COUNTER,
        "Backend host name lookups that failed.",
        Read::Process(|s, _| count(&s.discovery.failures))),
    Family::new("duet_trace_spans_exported_total", COUNTER,
        "Trace spans the OTLP collector (tracing.otlp) accepted.",
        Read::Process(|s, _| count(&s.process.traces.counters.exported))),
    Family::new("duet_trace_spans_dropped_total", COUNTER,
        "Trace spans dropped, by reason: queue_full (tracing.queue spans were waiting already: never waited for) or export_failed (the collector did not take their batch).",
        Read::Process(|s, i| nth(&s.process.traces.counters.dropped, i)))
        .by("reason", &DROP_REASONS),
    Family::new("duet_responses_total", COUNTER,
        "Responses sent to clients, by cluster and status class.",
        Read::Cluster(|c, i| nth(&c.responses, i)))
        .by("class", CLASSES),
    Family::new("duet_grpc_responses_total", COUNTER,
        "gRPC calls by the status they ended with: the backend's grpc-status, or duet's own for a call no backend answered (UNAVAILABLE, DEADLINE_EXCEEDED...).",
        Read::Cluster(|c, i| nth(&c.grpc, i)))
        .by("code", &grpc::CODES)
        .sparse(),
    Family::new("duet_response_body_bytes_total", COUNTER,
        "Response body bytes passed from the cluster's backends to clients.",
        Read::Cluster(|c, _| count(&c.bytes_sent))),
    Family::new("duet_request_body_bytes_total", COUNTER,
        "Request body bytes read from clients for the cluster's backends.",
        Read::Cluster(|c, _| count(&c.bytes_received))),
    Family::new("duet_retries_total", COUNTER,
        "Attempts retried on another backend.",
        Read::Cluster(|c, _| count(&c.retries))),
    Family::new("duet_read_timeouts_total", COUNTER,
        "Response bodies cut because the backend sent nothing for timeouts.read.",
        Read::Cluster(|c, _| count(&c.read_timeouts))),
    Family::new("duet_upstream_stale_resends_total", COUNTER,
        "Requests sent again because the backend had closed the pooled connection they went out on.",
        Read::Cluster(|c, _| count(&c.stale_resends))),
    Family::new("duet_upstream_tls_handshakes_total", COUNTER,
        "TLS handshakes with backends that completed: new connections (requests over these is the pool's reuse).",
        Read::Cluster(|c, _| count(&c.tls_handshakes))),
    Family::new("duet_upstream_tls_handshake_failures_total", COUNTER,
        "TLS handshakes with backends that failed: a certificate refused, no TLS, or no handshake within timeouts.connect.",
        Read::Cluster(|c, _| count(&c.tls_handshake_failures))),
    Family::new("duet_upstream_tls_handshake_seconds_total", COUNTER,
        "Time spent in completed TLS handshakes with backends (over handshakes: the mean).",
        Read::Cluster(|c, _| Value::Fixed(c.tls_handshake_micros.load(Relaxed) as f64 / 1e6, 6))),
    Family::new("duet_ejections_total", COUNTER,
        "Backends ejected by outlier detection.",
        Read::Cluster(|c, _| count(&c.ejections))),
    // The filters' counter families (`duet_mirrors_total`, `duet_hedges_total`), from their modules.
    Family::new("", COUNTER, "", Read::Filters),
    Family::new("duet_route_responses_total", COUNTER,
        "Responses sent to clients by route and status code (duet's own answers included once the route picked its cluster), summed over workers.",
        Read::RouteCodes),
    Family::new("duet_request_duration_seconds", HISTOGRAM,
        "From a request's arrival to the end of its response (all attempts): the client's view.",
        Read::RouteLatency(|r| &r.request_duration)),
    Family::new("duet_response_head_seconds", HISTOGRAM,
        "From a request's arrival to a backend's response head (retries included).",
        Read::RouteLatency(|r| &r.response_head)),
    Family::new("duet_request_attempts", HISTOGRAM,
        "Attempts per request sent to a backend (1: not retried).",
        Read::Attempts),
    Family::new("duet_upstream_header_seconds", HISTOGRAM,
        "From an attempt's start to the backend's response head, per backend.",
        Read::BackendLatency(|b| &b.header_time)),
    Family::new("duet_backend_picks_total", COUNTER,
        "Times each worker's balancer picked the backend.",
        Read::Backend(|b, _| Value::Count(b.load.picks()))),
    Family::new("duet_backend_in_flight", GAUGE,
        "Requests in flight to the backend from each worker.",
        Read::Backend(|b, _| Value::Count(b.load.in_flight()))),
    Family::new("duet_backend_rtt_estimate_seconds", GAUGE,
        "Each worker's PeakEWMA latency estimate of the backend.",
        Read::Backend(|b, _| Value::Fixed(b.load.rtt_estimate().as_secs_f64(), 6))),
    Family::new("duet_backend_responses_total", COUNTER,
        "Response heads each worker got from the backend, by status class.",
        Read::Backend(|b, i| nth(&b.stats.responses, i)))
        .by("class", CLASSES),
    Family::new("duet_backend_failures_total", COUNTER,
        "Attempts to the backend that failed, by kind: connect, tls (handshake failed), timeout (no response head in time), protocol (closed or not HTTP), body_reset, body_timeout, local (duet's own resources; never held against the backend).",
        Read::Backend(|b, i| nth(&b.stats.failures, i)))
        .by("kind", &Failure::LABELS),
    Family::new("duet_backend_ejections_total", COUNTER,
        "Times each worker's outlier detection ejected the backend.",
        Read::Backend(|b, _| count(&b.stats.ejections))),
    Family::new("duet_backend_eligibility_changes_total", COUNTER,
        "Times the backend became pickable (to=\"eligible\": re-admitted, checks passing) or stopped being (to=\"ineligible\": checks failing, ejected), per worker.",
        Read::Backend(|b, i| nth(&[&b.stats.admitted, &b.stats.removed], i)))
        .by("to", &["eligible", "ineligible"]),
    Family::new("duet_backend_eligible", GAUGE,
        "1 if the worker may pick the backend (healthy, not ejected).",
        Read::Backend(|b, _| Value::Count(u64::from(b.load.is_eligible())))),
];

fn count(cell: &AtomicU64) -> Value {
    Value::Count(cell.load(Relaxed))
}

/// The `index`th of `cells`: the `by` label's values and the cells are listed in the same order.
fn nth<C: Borrow<AtomicU64>>(cells: &[C], index: usize) -> Value {
    Value::Count(
        cells
            .get(index)
            .map_or(0, |cell| cell.borrow().load(Relaxed)),
    )
}

// === impl Registry ===

impl Registry {
    /// The Prometheus text exposition of every worker's cells.
    pub fn render_prometheus(&self) -> String {
        self.render_families(false, Exposition::Prometheus)
    }

    /// Like [`render_prometheus`](Self::render_prometheus) with the `worker` label summed away:
    /// one series per cluster and backend whatever the worker count (`/metrics?aggregate=worker`), for
    /// setups with many backends. Gauges are summed too: `duet_backend_eligible` then counts the
    /// workers that may pick the backend. Each sum adds the values as `/metrics` writes them, so it is
    /// to the digit what `sum without (worker)` over `/metrics` gives.
    pub fn render_prometheus_aggregated(&self) -> String {
        self.render_families(true, Exposition::Prometheus)
    }

    /// The same families and samples in the OpenMetrics 1.0 text format, `aggregate` as
    /// [`render_prometheus_aggregated`](Self::render_prometheus_aggregated): a counter's family is
    /// named without its `_total` (which its samples keep), a name ending in a unit says it in
    /// `# UNIT`, the latency histograms' buckets carry their exemplars (the latest traced request
    /// that fell in each), and `# EOF` ends it. A counter whose family name would be another
    /// family's (`duet_connections_parked_total` beside the gauge `duet_connections_parked`) is
    /// typed `unknown` under its whole name.
    pub fn render_openmetrics(&self, aggregate: bool) -> String {
        let mut out = self.render_families(aggregate, Exposition::OpenMetrics);
        out.push_str("# EOF\n");
        out
    }

    fn render_families(&self, aggregate: bool, exposition: Exposition) -> String {
        let discovery = self.discovery();
        self.inspect(|workers, process, _| {
            let scrape = Scrape {
                workers,
                process,
                discovery,
                resources: (process.resources)(),
                exposition,
            };
            let mut out = String::new();
            for family in FAMILIES {
                family.render(&scrape, aggregate, &mut out);
            }
            out
        })
    }
}

/// The cells one scrape reads, under the registry's lock.
struct Scrape<'a> {
    workers: &'a BTreeMap<usize, WorkerEntry>,
    process: &'a ProcessState,
    discovery: &'a DiscoveryCounters,
    /// The process's resources, read once for the scrape.
    resources: Option<ProcessStats>,
    exposition: Exposition,
}

impl<'a> Scrape<'a> {
    fn clusters(&self) -> impl Iterator<Item = (usize, &'a ClusterCells)> {
        self.workers
            .iter()
            .flat_map(|(w, e)| e.clusters.iter().map(move |c| (*w, c)))
    }

    /// The families of the filters' counters, as the workers published them (all run the same
    /// filters; a worker not yet published has none).
    fn counter_families(&self) -> &'a [&'static CounterFamily] {
        (self.workers.values())
            .map(|w| w.counter_families)
            .find(|families| !families.is_empty())
            .unwrap_or_default()
    }

    fn backends(&self) -> impl Iterator<Item = (usize, &'a ClusterCells, &'a BackendCell)> {
        self.clusters()
            .flat_map(|(w, c)| c.backends.iter().map(move |b| (w, c, b)))
    }
}

// === impl Family ===

impl Family {
    const fn new(name: &'static str, kind: &'static str, help: &'static str, read: Read) -> Self {
        Self {
            name,
            kind,
            help,
            by: None,
            sparse: false,
            read,
        }
    }

    const fn sparse(mut self) -> Self {
        self.sparse = true;
        self
    }

    const fn by(mut self, label: &'static str, values: &'static [&'static str]) -> Self {
        self.by = Some((label, values));
        self
    }

    /// The family of a filter's counters.
    fn of_counters(family: &'static CounterFamily) -> Self {
        Self::new(
            family.name,
            COUNTER,
            family.help,
            Read::RouteCounters(family),
        )
        .by(family.label, family.values)
    }

    fn render(&self, scrape: &Scrape<'_>, aggregate: bool, out: &mut String) {
        if let Read::Filters = self.read {
            for family in scrape.counter_families() {
                Self::of_counters(family).render(scrape, aggregate, out);
            }
            return;
        }
        let name = self.name;
        match scrape.exposition {
            Exposition::Prometheus => {
                let _ = writeln!(
                    out,
                    "# HELP {name} {}\n# TYPE {name} {}",
                    self.help, self.kind
                );
            }
            Exposition::OpenMetrics => self.write_openmetrics_header(out),
        }
        let exposition = scrape.exposition;
        match self.read {
            Read::RouteLatency(cell) => write_summed::<Summed, _>(
                (out, exposition),
                name,
                scrape.clusters().flat_map(|(_, c)| {
                    c.routes
                        .iter()
                        .map(move |r| (Labels::route(&c.name, &r.route), cell(r)))
                }),
            ),
            Read::RouteCodes => write_codes(out, name, scrape),
            Read::Attempts => write_summed::<SummedAttempts, _>(
                (out, exposition),
                name,
                scrape
                    .clusters()
                    .map(|(_, c)| (Labels::cluster(&c.name), &c.counters.attempts)),
            ),
            Read::BackendLatency(cell) => write_summed::<Summed, _>(
                (out, exposition),
                name,
                scrape
                    .backends()
                    .map(|(_, c, b)| (Labels::backend(&c.name, b.address), cell(&b.stats))),
            ),
            Read::Certificates => write_certificates(out, name, scrape),
            Read::Worker(_)
            | Read::Listener(_)
            | Read::Cluster(_)
            | Read::RouteCounters(_)
            | Read::Backend(_)
                if aggregate =>
            {
                let mut sums = WorkerSums::default();
                self.samples(scrape, &mut |labels, value| sums.add(labels, value));
                sums.write(out, name);
            }
            _ => self.samples(scrape, &mut |labels, value| {
                out.push_str(name);
                labels.write(out);
                let _ = writeln!(out, " {value}");
            }),
        }
    }

    /// The family's `# HELP`, `# TYPE` and `# UNIT` lines in OpenMetrics's terms: a counter's
    /// family is named without `_total`, unless that is another family's name (then it is
    /// `unknown` under its whole name); a name ending in `_seconds` or `_bytes` has that unit.
    fn write_openmetrics_header(&self, out: &mut String) {
        let mut name = self.name;
        let mut kind = self.kind;
        if kind == COUNTER {
            match name.strip_suffix("_total") {
                Some(family) if !FAMILIES.iter().any(|f| f.name == family) => name = family,
                _ => kind = "unknown",
            }
        }
        let _ = write!(out, "# HELP {name} ");
        escape_into(out, self.help);
        let _ = writeln!(out, "\n# TYPE {name} {kind}");
        let unit = ["seconds", "bytes"].into_iter().find(|unit| {
            name.strip_suffix(unit)
                .is_some_and(|rest| rest.ends_with('_'))
        });
        if let Some(unit) = unit.filter(|_| kind != "unknown") {
            let _ = writeln!(out, "# UNIT {name} {unit}");
        }
    }

    /// Every series of a family read from counters and gauges, in exposition order: worker, then
    /// cluster, then backend, then the `by` label's values.
    fn samples<'a>(&self, scrape: &Scrape<'a>, emit: &mut dyn FnMut(Labels<'a>, Value)) {
        match self.read {
            Read::Process(read) => self.series(Labels::default(), |i| read(scrape, i), emit),
            Read::Resources(read) => {
                if let Some(resources) = &scrape.resources {
                    emit(Labels::default(), read(resources));
                }
            }
            Read::Info(label, read) => {
                let labels = Labels {
                    by: Some((label, Cow::Owned(read(scrape)))),
                    ..Labels::default()
                };
                emit(labels, Value::Count(1));
            }
            Read::Worker(read) => {
                for (w, entry) in scrape.workers {
                    self.series(Labels::worker(*w), |i| read(&entry.counters, i), emit);
                }
            }
            Read::Listener(read) => {
                for (w, entry) in scrape.workers {
                    for listener in entry.counters.tls_handshakes.iter() {
                        let counted = || listener.results.iter().any(|c| c.load(Relaxed) > 0);
                        if !listener.tls && !counted() {
                            continue;
                        }
                        let labels = Labels::worker(*w).with_listener(&listener.listener);
                        self.series(labels, |i| read(listener, i), emit);
                    }
                }
            }
            Read::Cluster(read) => {
                for (w, c) in scrape.clusters() {
                    let labels = Labels::worker(w).with_cluster(&c.name);
                    self.series(labels, |i| read(&c.counters, i), emit);
                }
            }
            Read::Backend(read) => {
                for (w, c, b) in scrape.backends() {
                    let labels = Labels::worker(w).with_backend(&c.name, b.address);
                    self.series(labels, |i| read(b, i), emit);
                }
            }
            Read::RouteCounters(family) => {
                for (w, c) in scrape.clusters() {
                    let cluster = Labels::worker(w).with_cluster(&c.name);
                    let of_family =
                        (c.route_counters.iter()).filter(|r| r.family.name == family.name);
                    let mut each = |route: &'a str, counters: Option<&RouteCounters>| {
                        let labels = Labels {
                            route: Some(route),
                            ..cluster.clone()
                        };
                        let read = |i| Value::Count(counters.map_or(0, |c| c.get(i)));
                        self.series(labels, read, emit);
                    };
                    if family.every_route {
                        for r in &c.routes {
                            let counters = of_family.clone().find(|c| c.route == r.route);
                            each(&r.route, counters.map(|c| &**c));
                        }
                    } else {
                        of_family.for_each(|counters| each(&counters.route, Some(counters)));
                    }
                }
            }
            Read::RouteLatency(_)
            | Read::RouteCodes
            | Read::Attempts
            | Read::BackendLatency(_)
            | Read::Certificates
            | Read::Filters => {}
        }
    }

    /// One series with `labels`, or one per value of the `by` label.
    fn series<'a>(
        &self,
        labels: Labels<'a>,
        read: impl Fn(usize) -> Value,
        emit: &mut dyn FnMut(Labels<'a>, Value),
    ) {
        let Some((label, values)) = self.by else {
            return emit(labels, read(0));
        };
        for (i, value) in values.iter().enumerate() {
            let sample = read(i);
            if self.sparse && matches!(sample, Value::Count(0)) {
                continue;
            }
            let labels = Labels {
                by: Some((label, Cow::Borrowed(value))),
                ..labels.clone()
            };
            emit(labels, sample);
        }
    }
}

/// Adds up each series' cells over workers and writes the sums in label order (in OpenMetrics,
/// with the newest exemplar of each bucket).
fn write_summed<'a, S: Sum, I>((out, exposition): (&mut String, Exposition), name: &str, cells: I)
where
    I: Iterator<Item = (Labels<'a>, &'a S::Cell)>,
    S::Cell: 'a,
{
    let mut summed: BTreeMap<Labels<'a>, S> = BTreeMap::new();
    for (labels, cell) in cells {
        let sum = summed.entry(labels).or_default();
        sum.add(cell);
        if exposition == Exposition::OpenMetrics {
            sum.add_exemplars(cell);
        }
    }
    let mut inner = String::new();
    for (labels, sum) in &summed {
        inner.clear();
        labels.write_inner(&mut inner);
        sum.write(out, name, &inner, exposition);
    }
}

/// Each route's responses by code, summed over workers, in label order.
fn write_codes(out: &mut String, name: &str, scrape: &Scrape<'_>) {
    let mut summed: BTreeMap<(Labels<'_>, u16), u64> = BTreeMap::new();
    for (_, c) in scrape.clusters() {
        for r in &c.routes {
            for (code, count) in r.codes() {
                *summed
                    .entry((Labels::route(&c.name, &r.route), code))
                    .or_default() += count;
            }
        }
    }
    for ((labels, code), count) in summed {
        let labels = Labels {
            by: Some(("code", Cow::Owned(code.to_string()))),
            ..labels
        };
        out.push_str(name);
        labels.write(out);
        let _ = writeln!(out, " {count}");
    }
}

/// Each listener certificate's expiry, as last loaded.
fn write_certificates(out: &mut String, name: &str, scrape: &Scrape<'_>) {
    let certificates = scrape
        .process
        .certificates
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for certificate in certificates.iter() {
        out.push_str(name);
        out.push_str("{listener=\"");
        escape_into(out, &certificate.listener);
        out.push_str("\",certificate=\"");
        escape_into(out, &certificate.certificate);
        out.push_str("\",names=\"");
        escape_into(out, &certificate.names);
        let _ = writeln!(out, "\"}} {}", certificate.not_after);
    }
}

/// A family's samples with the `worker` label summed away, in the order each series first appeared.
#[derive(Default)]
struct WorkerSums<'a> {
    sums: Vec<(Labels<'a>, f64)>,
    /// Where each series is in `sums`: the option exists for thousands of backends, so no scan per
    /// sample.
    position: HashMap<Labels<'a>, usize>,
}

impl<'a> WorkerSums<'a> {
    fn add(&mut self, labels: Labels<'a>, value: Value) {
        let labels = Labels {
            worker: None,
            ..labels
        };
        let value = value.as_written();
        match self.position.get(&labels) {
            Some(&at) => self.sums[at].1 += value,
            None => {
                self.position.insert(labels.clone(), self.sums.len());
                self.sums.push((labels, value));
            }
        }
    }

    fn write(&self, out: &mut String, name: &str) {
        for (labels, sum) in &self.sums {
            out.push_str(name);
            labels.write(out);
            let _ = writeln!(out, " {sum}");
        }
    }
}

// === impl Value ===

impl Value {
    /// The value as `/metrics` writes it, so that a sum over workers is the sum of what a scraper
    /// of `/metrics` would add up (Prometheus's own numbers are `f64` too).
    fn as_written(self) -> f64 {
        match self {
            Value::Count(n) => n as f64,
            Value::Fixed(..) => self.to_string().parse().unwrap_or(0.0),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Value::Count(n) => write!(f, "{n}"),
            Value::Fixed(value, decimals) => write!(f, "{value:.decimals$}"),
        }
    }
}

/// A series' labels, written in this order; `None`s are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Labels<'a> {
    worker: Option<usize>,
    listener: Option<&'a str>,
    cluster: Option<&'a str>,
    route: Option<&'a str>,
    backend: Option<SocketAddr>,
    by: Option<(&'static str, Cow<'a, str>)>,
}

impl<'a> Labels<'a> {
    fn worker(worker: usize) -> Self {
        Self {
            worker: Some(worker),
            ..Self::default()
        }
    }

    fn cluster(cluster: &'a str) -> Self {
        Self::default().with_cluster(cluster)
    }

    fn route(cluster: &'a str, route: &'a str) -> Self {
        Self {
            route: Some(route),
            ..Self::cluster(cluster)
        }
    }

    fn backend(cluster: &'a str, backend: SocketAddr) -> Self {
        Self::default().with_backend(cluster, backend)
    }

    fn with_listener(self, listener: &'a str) -> Self {
        Self {
            listener: Some(listener),
            ..self
        }
    }

    fn with_cluster(self, cluster: &'a str) -> Self {
        Self {
            cluster: Some(cluster),
            ..self
        }
    }

    fn with_backend(self, cluster: &'a str, backend: SocketAddr) -> Self {
        Self {
            backend: Some(backend),
            ..self.with_cluster(cluster)
        }
    }

    /// Writes `{name="value",...}`, or nothing without labels.
    fn write(&self, out: &mut String) {
        if *self != Labels::default() {
            out.push('{');
            self.write_inner(out);
            out.push('}');
        }
    }

    /// Writes the labels without their braces (histograms add `le`). Straight into `out` rather than
    /// through `Display`: a scrape writes a line per sample, thousands of them with many backends.
    fn write_inner(&self, out: &mut String) {
        let mut separator = "";
        let mut open = |out: &mut String, name: &str| {
            out.push_str(separator);
            out.push_str(name);
            out.push_str("=\"");
            separator = ",";
        };
        if let Some(worker) = self.worker {
            open(out, "worker");
            let _ = write!(out, "{worker}\"");
        }
        for (name, value) in [
            ("listener", self.listener),
            ("cluster", self.cluster),
            ("route", self.route),
        ] {
            if let Some(value) = value {
                open(out, name);
                escape_into(out, value);
                out.push('"');
            }
        }
        if let Some(backend) = self.backend {
            open(out, "backend");
            let _ = write!(out, "{backend}\"");
        }
        if let Some((name, value)) = &self.by {
            open(out, name);
            escape_into(out, value);
            out.push('"');
        }
    }
}

/// Appends a label value as the Prometheus text format wants it: backslash, double quote and line
/// feed escaped (a cluster's name is any YAML string).
fn escape_into(out: &mut String, value: &str) {
    if !value.contains(['\\', '"', '\n']) {
        return out.push_str(value);
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}
