//! OpenTelemetry traces end to end: duet exports to a real OTLP/HTTP receiver (`tests/otlp_receiver.py`,
//! which decodes each batch with the OpenTelemetry protos), and real backends record the
//! `traceparent` each attempt sends them.

use crate::support::{eventually, raw_exchange, Duet};
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use serde_json::Value;
use std::{
    io::{BufRead, BufReader},
    net::{SocketAddr, TcpListener},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

/// The W3C specification's example parent, sampled.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// The receiver, and the spans it decoded so far.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    /// `None` (the test is skipped) when python3 lacks `opentelemetry-proto`, unless
    /// `DUET_REQUIRE_PYTHON_OTLP` says CI installed it.
    fn start() -> Option<Self> {
        let present = Command::new("python3")
            .args(["-c", "import opentelemetry.proto"])
            .status()
            .is_ok_and(|s| s.success());
        if !present {
            assert!(
                std::env::var_os("DUET_REQUIRE_PYTHON_OTLP").is_none(),
                "python3's opentelemetry-proto is required here"
            );
            eprintln!(
                "SKIPPED: python3 lacks opentelemetry-proto (pip install opentelemetry-proto)"
            );
            return None;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp_receiver.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the OTLP receiver");
        let stdout = child.stdout.take().expect("its stdout");
        let (port_tx, port_rx) = mpsc::channel();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let seen = spans.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            if let Some(port) = lines.next() {
                let _ = port_tx.send(port);
            }
            for line in lines {
                let span: Value = serde_json::from_str(&line).expect("a JSON span");
                seen.lock().expect("spans").push(span);
            }
        });
        let port = port_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("its port");
        let port = port.trim().parse().expect("a port number");
        Some(Self { child, port, spans })
    }

    /// The spans of `trace`'s request once its server span has arrived (within ten seconds): it
    /// ends after its attempts', which the one exporter thread sends before it.
    fn request(&self, trace: &str) -> Vec<Value> {
        let mut spans = Vec::new();
        let arrived = eventually(Duration::from_secs(10), || {
            spans = (self.spans.lock().expect("spans").iter())
                .filter(|s| s["trace_id"] == trace)
                .cloned()
                .collect();
            spans.iter().any(|s| s["kind"] == 2)
        });
        assert!(arrived, "no server span of {trace}: {spans:#?}");
        spans
    }

    fn all(&self) -> Vec<Value> {
        self.spans.lock().expect("spans").clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A GET of `path` with these extra header lines; the response's status line's code.
fn get(duet: SocketAddr, path: &str, fields: &str) -> u16 {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: shop.example\r\n{fields}Connection: close\r\n\r\n");
    let (response, _) = raw_exchange(duet, request.as_bytes(), Duration::from_secs(5));
    response[9..12].parse().expect("a status")
}

fn with_tracing(config: DuetConfig, port: u16, sample: &str) -> String {
    let tracing =
        format!("{{ otlp: http://127.0.0.1:{port}, sample: {sample}, service_name: edge }}");
    config.section("tracing", &tracing).to_yaml()
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// The server span and the client spans, these sorted by attempt.
fn split(spans: Vec<Value>) -> (Value, Vec<Value>) {
    let (mut servers, mut clients): (Vec<_>, Vec<_>) =
        spans.into_iter().partition(|s| s["kind"] == 2);
    assert_eq!(servers.len(), 1, "one server span: {servers:?}");
    clients.sort_by_key(|s| attribute(s, "duet.attempt").as_i64());
    (servers.remove(0), clients)
}

/// `TRACE` with its first byte `n`: one trace per request of a test.
fn trace(n: u8) -> String {
    format!("{n:02x}{}", &TRACE[2..])
}

#[test]
fn a_sampled_parent_is_joined_and_each_attempt_of_a_retried_request_is_its_own_span() {
    let Some(receiver) = Receiver::start() else {
        return;
    };
    let good = Backend::start(BackendOptions::named("good")).expect("backend");
    let refused = closed_port();
    // Round robin over a refused port and a backend: of two requests in a row one at least meets
    // the refused port first and is retried on the other.
    let config = DuetConfig::single("round_robin", &[refused, good.address()])
        .workers(1)
        .with_cluster("app", |c| {
            c.set("outlier_detection", "{ consecutive_failures: 0 }")
        });
    // Sample 0%: the requests are traced because their parent is sampled.
    let duet = Duet::start(&with_tracing(config, receiver.port, "0%"));
    let mut retried = None;
    for n in 1..=2 {
        let fields = format!(
            "traceparent: 00-{}-{PARENT}-01\r\ntracestate: vendor=opaque{n}\r\n",
            trace(n)
        );
        assert_eq!(get(duet.address, "/cart?item=1", &fields), 200);
        let (server, clients) = split(receiver.request(&trace(n)));
        assert_eq!(server["parent"], PARENT, "the client's span is its parent");
        assert_eq!(server["trace_state"], format!("vendor=opaque{n}"));
        let route = attribute(&server, "duet.route").as_str().expect("a route");
        assert_eq!(server["name"], format!("GET {route}"));
        assert_eq!(server["service"], "edge");
        assert_eq!(server["path"], "/v1/traces");
        assert_eq!(server["content_type"], "application/x-protobuf");
        assert_eq!(attribute(&server, "http.request.method"), "GET");
        assert_eq!(attribute(&server, "url.path"), "/cart");
        assert_eq!(attribute(&server, "url.scheme"), "http");
        assert_eq!(attribute(&server, "http.response.status_code"), 200);
        assert_eq!(attribute(&server, "duet.cluster"), "app");
        assert_eq!(attribute(&server, "server.address"), "shop.example");
        for client in &clients {
            assert_eq!(
                client["parent"], server["span_id"],
                "attempts are its children"
            );
            assert!(client["start"].as_u64() >= server["start"].as_u64());
            assert!(client["end"].as_u64() <= server["end"].as_u64());
        }
        if clients.len() == 2 {
            retried = Some((server.clone(), clients.clone(), trace(n)));
        }
    }
    let (server, clients, trace) = retried.expect("a request was retried");
    let (first, second) = (&clients[0], &clients[1]);
    assert_eq!(attribute(first, "duet.attempt"), 1);
    assert_eq!(
        attribute(first, "duet.backend"),
        refused.to_string().as_str()
    );
    assert_eq!(attribute(first, "duet.outcome"), "backend_error");
    assert_eq!(attribute(first, "error.type"), "backend_error");
    assert_eq!(first["status"], 2, "STATUS_CODE_ERROR");
    assert_eq!(attribute(second, "duet.attempt"), 2);
    assert_eq!(
        attribute(second, "duet.backend"),
        good.address().to_string().as_str()
    );
    assert_eq!(attribute(second, "http.response.status_code"), 200);
    assert_eq!(attribute(second, "duet.outcome"), "complete");
    assert_eq!(attribute(second, "duet.hedged"), false);
    assert_eq!(second["status"], 0, "unset on success");
    // The backend heard of the answering attempt as its parent; the tracestate passed on as sent.
    let answering = format!(
        "00-{trace}-{}-01",
        second["span_id"].as_str().expect("an id")
    );
    let heard = good
        .recorded()
        .into_iter()
        .find(|r| r.headers["traceparent"] == answering.as_str());
    let heard = heard.expect("the backend heard the answering attempt's traceparent");
    assert!(heard.headers["tracestate"]
        .to_str()
        .is_ok_and(|s| s.starts_with("vendor=opaque")));
    // The access log names the trace and duet's span of it.
    let line = format!(
        "trace_id={trace} span_id={}",
        server["span_id"].as_str().expect("id")
    );
    let logged = eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().any(|l| l.contains(&line))
    });
    assert!(logged, "no access-log line with {line}");
}

#[test]
fn an_unsampled_parent_is_passed_through_untouched_and_never_exported() {
    let Some(receiver) = Receiver::start() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = DuetConfig::single("p2c_inflight", &[backend.address()]);
    let duet = Duet::start(&with_tracing(config, receiver.port, "100%"));
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let fields = format!("traceparent: {unsampled}\r\ntracestate: a=1\r\n");
    assert_eq!(get(duet.address, "/", &fields), 200);
    // A sampled request after it: once its spans are in, the first one's would be too.
    let sampled = format!("traceparent: 00-{TRACE}-{PARENT}-01\r\n");
    assert_eq!(get(duet.address, "/", &sampled), 200);
    assert_eq!(receiver.request(TRACE).len(), 2);
    let recorded = backend.recorded();
    assert_eq!(recorded[0].headers["traceparent"], unsampled, "untouched");
    assert_eq!(recorded[0].headers["tracestate"], "a=1");
    let exported = receiver.all();
    assert!(
        exported.iter().all(|s| s["trace_id"] == TRACE),
        "only the sampled request's spans: {exported:#?}"
    );
}

#[test]
fn without_a_parent_100_percent_starts_every_trace_and_0_percent_none() {
    let Some(receiver) = Receiver::start() else {
        return;
    };
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = |sample| {
        let config = DuetConfig::single("p2c_inflight", &[backend.address()]).admin();
        with_tracing(config, receiver.port, sample)
    };
    let all = Duet::start(&config("100%"));
    for _ in 0..3 {
        assert_eq!(get(all.address, "/", ""), 200);
    }
    let heard: Vec<String> = (backend.recorded().iter())
        .map(|r| r.headers["traceparent"].to_str().expect("text").to_owned())
        .collect();
    assert_eq!(heard.len(), 3);
    for traceparent in &heard {
        let trace = &traceparent[3..35];
        let (server, clients) = split(receiver.request(trace));
        assert_eq!(server["parent"], "", "a root span");
        assert_eq!(clients.len(), 1);
        assert_eq!(
            traceparent[36..52],
            *clients[0]["span_id"].as_str().expect("id")
        );
    }
    let none = Duet::start(&config("0%"));
    let before = receiver.all().len();
    for _ in 0..20 {
        assert_eq!(get(none.address, "/", ""), 200);
    }
    let recorded = backend.recorded();
    assert!(recorded[3..]
        .iter()
        .all(|r| r.headers.get("traceparent").is_none()));
    let metrics = crate::admin::get(none.admin_address(), "/metrics");
    assert_eq!(
        crate::admin::sum(&metrics, "duet_trace_spans_exported_total", ""),
        0.0
    );
    assert_eq!(receiver.all().len(), before, "nothing exported");
}

#[test]
fn a_hedged_request_has_two_attempt_spans_and_the_loser_is_cancelled() {
    let Some(receiver) = Receiver::start() else {
        return;
    };
    let slow =
        Backend::start(BackendOptions::named("slow").delay(Duration::from_secs(2))).expect("slow");
    let fast = Backend::start(BackendOptions::named("fast")).expect("fast");
    // Round robin: of two requests in a row one goes to the slow backend first, and is hedged.
    let config = DuetConfig::single("round_robin", &[slow.address(), fast.address()])
        .workers(1)
        .route_set("hedge", "{ after: 50ms, max_extra: 100% }");
    let duet = Duet::start(&with_tracing(config, receiver.port, "0%"));
    let mut hedged = 0;
    for n in 1..=2 {
        let fields = format!("traceparent: 00-{}-{PARENT}-01\r\n", trace(n));
        assert_eq!(get(duet.address, "/", &fields), 200);
        let (_, clients) = split(receiver.request(&trace(n)));
        if clients.len() == 2 {
            hedged += 1;
            assert_eq!(
                attribute(&clients[0], "duet.backend"),
                slow.address().to_string().as_str()
            );
            assert_eq!(attribute(&clients[0], "duet.outcome"), "cancelled");
            assert_eq!(attribute(&clients[0], "duet.hedged"), false);
            assert_eq!(
                attribute(&clients[1], "duet.backend"),
                fast.address().to_string().as_str()
            );
            assert_eq!(attribute(&clients[1], "duet.hedged"), true);
            assert_eq!(attribute(&clients[1], "duet.outcome"), "complete");
        }
    }
    assert_eq!(hedged, 1, "one request went to the slow backend first");
}

#[test]
fn a_collector_down_or_stuck_holds_no_request_back_and_drops_are_counted() {
    // Down: nothing listens, every batch fails.
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = |port: u16, queue: &str| {
        let tracing = format!("{{ otlp: http://127.0.0.1:{port}, sample: 100%, queue: {queue} }}");
        DuetConfig::single("p2c_inflight", &[backend.address()])
            .admin()
            .section("tracing", &tracing)
            .to_yaml()
    };
    let down = Duet::start(&config(closed_port().port(), "64"));
    for _ in 0..5 {
        assert_eq!(get(down.address, "/", ""), 200);
    }
    let dropped = |duet: &Duet, reason: &str| {
        let metrics = crate::admin::get(duet.admin_address(), "/metrics");
        let labels = format!("reason=\"{reason}\"");
        crate::admin::sum(&metrics, "duet_trace_spans_dropped_total", &labels)
    };
    let counted = eventually(Duration::from_secs(10), || {
        dropped(&down, "export_failed") == 10.0
    });
    assert!(
        counted,
        "ten spans dropped: {}",
        dropped(&down, "export_failed")
    );
    // Stuck: a collector that takes the connection and never answers holds the exporter in its
    // post; the queue (of one span) fills, and the rest are dropped at once.
    let stuck = TcpListener::bind("127.0.0.1:0").expect("bind");
    let duet = Duet::start(&config(stuck.local_addr().expect("addr").port(), "1"));
    assert_eq!(get(duet.address, "/", ""), 200);
    let (_held, _) = stuck.accept().expect("the exporter's post");
    // (The first request's two spans may have met a full queue already.)
    let before = dropped(&duet, "queue_full");
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(get(duet.address, "/", ""), 200);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    let after = dropped(&duet, "queue_full");
    assert_eq!(after - before, 9.0, "ten spans, one queued");
}

/// Parses an OpenMetrics exposition with Prometheus's Python client's strict parser
/// (`prometheus_client.openmetrics.parser`), which refuses anything the format does not allow;
/// returns its exemplars, or `None` (the test is skipped) when python3 lacks `prometheus_client`,
/// unless `DUET_REQUIRE_PYTHON_OPENMETRICS` says CI installed it.
fn openmetrics_exemplars(text: &str) -> Option<Vec<Value>> {
    use std::io::Write;
    const PARSE: &str = "
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
exemplars = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        if sample.exemplar is not None:
            exemplars.append({'family': family.name, 'type': family.type, 'labels': sample.labels,
                'exemplar': sample.exemplar.labels, 'value': sample.exemplar.value,
                'timestamp': float(sample.exemplar.timestamp)})
print(json.dumps(exemplars))
";
    let present = Command::new("python3")
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        assert!(
            std::env::var_os("DUET_REQUIRE_PYTHON_OPENMETRICS").is_none(),
            "python3's prometheus_client is required here"
        );
        eprintln!("SKIPPED: python3 lacks prometheus_client (pip install prometheus_client)");
        return None;
    }
    let mut child = Command::new("python3")
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().expect("its stdin");
    stdin
        .write_all(text.as_bytes())
        .expect("write the exposition");
    drop(stdin);
    let output = child.wait_with_output().expect("python3 ran");
    assert!(
        output.status.success(),
        "the OpenMetrics parser refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(serde_json::from_slice(&output.stdout).expect("the parser's JSON"))
}

/// `/metrics` asked for as Prometheus asks when it scrapes with exemplars on: the response's
/// head and body.
fn scrape_openmetrics(admin: SocketAddr, query: &str) -> (String, String) {
    let request = format!(
        "GET /metrics{query} HTTP/1.1\r\nHost: admin\r\nAccept: application/openmetrics-text;\
         version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;\
         version=0.0.4;q=0.5,*/*;q=0.1\r\nConnection: close\r\n\r\n"
    );
    let (response, _) = raw_exchange(admin, request.as_bytes(), Duration::from_secs(5));
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    (head.to_owned(), body.to_owned())
}

#[test]
fn openmetrics_exemplars_on_the_latency_histograms_name_the_trace_the_backend_heard_of() {
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    // Every request traced (none exported: nothing listens), on one worker, so that the last
    // request's observations are the newest of their buckets.
    let config = DuetConfig::single("p2c_inflight", &[backend.address()])
        .workers(1)
        .admin()
        .section(
            "tracing",
            &format!("{{ otlp: http://{}, sample: 100% }}", closed_port()),
        );
    let duet = Duet::start(&config.to_yaml());
    assert_eq!(get(duet.address, "/", ""), 200);
    let fields = format!("traceparent: 00-{TRACE}-{PARENT}-01\r\n");
    assert_eq!(get(duet.address, "/", &fields), 200);
    let heard: Vec<String> = (backend.recorded().iter())
        .map(|r| r.headers["traceparent"].to_str().expect("text")[3..35].to_owned())
        .collect();
    assert_eq!(heard.len(), 2);
    assert_eq!(heard[1], TRACE, "the sampled parent's trace is joined");
    let admin = duet.admin_address();
    let (head, body) = scrape_openmetrics(admin, "");
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let Some(exemplars) = openmetrics_exemplars(&body) else {
        return;
    };
    for family in [
        "duet_request_duration_seconds",
        "duet_response_head_seconds",
        "duet_upstream_header_seconds",
    ] {
        let of_family: Vec<&Value> = exemplars.iter().filter(|e| e["family"] == family).collect();
        let ids: Vec<&str> = (of_family.iter())
            .map(|e| e["exemplar"]["trace_id"].as_str().expect("a trace id"))
            .collect();
        assert!(
            ids.contains(&TRACE),
            "{family}: the last request's trace: {ids:?}"
        );
        assert!(
            ids.iter().all(|id| heard.iter().any(|h| h == id)),
            "{family}: only traces the backend heard of: {ids:?} {heard:?}"
        );
        for exemplar in of_family {
            let value = exemplar["value"].as_f64().expect("a value");
            let le: f64 = (exemplar["labels"]["le"].as_str())
                .and_then(|le| le.parse().ok())
                .expect("a bucket");
            assert!(value <= le && value < 5.0, "in its bucket: {exemplar}");
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            let now = now.expect("after 1970").as_secs_f64();
            let age = now - exemplar["timestamp"].as_f64().expect("a timestamp");
            assert!((0.0..60.0).contains(&age), "recent: {exemplar}");
        }
    }
    // The aggregated exposition parses too; the Prometheus text has no exemplar and no `# EOF`.
    let (_, aggregated) = scrape_openmetrics(admin, "?aggregate=worker");
    let aggregated = openmetrics_exemplars(&aggregated).expect("parsed above");
    assert_eq!(aggregated.len(), exemplars.len(), "{aggregated:?}");
    let plain = crate::admin::get(admin, "/metrics");
    assert!(
        plain.contains("content-type: text/plain; version=0.0.4"),
        "{plain}"
    );
    assert!(
        !plain.contains("# {") && !plain.contains("# EOF"),
        "{plain}"
    );
}
