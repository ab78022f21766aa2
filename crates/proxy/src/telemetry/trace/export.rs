//! The way out for finished spans: a bounded queue per configuration that a worker pushes to
//! without ever waiting (a full queue drops the span, counted), and an exporter thread that takes
//! them off it, in batches, and posts each batch to the collector (OTLP over HTTP, protobuf).
//!
//! A batch goes when it holds [`MAX_BATCH`] spans or its oldest span has waited [`FLUSH_AFTER`];
//! a post that fails or takes longer than [`POST_TIMEOUT`] drops its batch (counted too): spans
//! are telemetry, not worth a retry that would hold back the next ones. One thread per
//! `tracing:` setting in force: a reload that changes it starts another, and the old one sends
//! what it holds and ends once the workers let go of its queue.

use super::otlp::{self, Span};
use duet_config::Tracing;
use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// The most spans one post carries.
pub(crate) const MAX_BATCH: usize = 512;
/// How long a span waits for its batch to fill before the batch goes anyway.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(500);
/// How long one post may take, connection included.
pub(crate) const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// What the exporters count, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct TraceCounters {
    /// Spans the collector accepted.
    pub(crate) exported: AtomicU64,
    /// Spans dropped because the queue was full, and because their post failed.
    pub(crate) dropped: [AtomicU64; 2],
}

/// [`TraceCounters::dropped`]'s reasons, in order.
pub(crate) const DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// The process's exporters: the queue of the `tracing:` setting in force, and the counters.
#[derive(Debug, Default)]
pub(crate) struct Export {
    pub(crate) counters: Arc<TraceCounters>,
    current: Mutex<Option<(Tracing, SyncSender<Span>)>>,
}

impl Export {
    /// The queue for `settings`: the one in force if the setting is the same, else a new one with
    /// its exporter thread.
    pub(crate) fn queue(&self, settings: &Tracing) -> SpanQueue {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, sender)) = current.as_ref().filter(|(now, _)| now == settings) {
            return self.queue_of(sender.clone());
        }
        let (sender, receiver) = mpsc::sync_channel(settings.queue);
        let exporter = Exporter {
            settings: settings.clone(),
            counters: self.counters.clone(),
        };
        let started = std::thread::Builder::new()
            .name("duet-otlp".to_owned())
            .spawn(move || exporter.run(&receiver));
        if let Err(e) = started {
            tracing::warn!("cannot start the trace exporter's thread: {e}");
        }
        *current = Some((settings.clone(), sender.clone()));
        self.queue_of(sender)
    }

    fn queue_of(&self, sender: SyncSender<Span>) -> SpanQueue {
        SpanQueue {
            sender,
            counters: self.counters.clone(),
        }
    }
}

/// A worker's end of the queue.
#[derive(Clone)]
pub(crate) struct SpanQueue {
    sender: SyncSender<Span>,
    counters: Arc<TraceCounters>,
}

impl SpanQueue {
    /// Queues `span` for export, or drops it (counted) if the queue is full: never waits.
    pub(crate) fn push(&self, span: Span) {
        match self.sender.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped[0].fetch_add(1, Relaxed);
            }
        }
    }
}

/// One exporter thread's work.
struct Exporter {
    settings: Tracing,
    counters: Arc<TraceCounters>,
}

impl Exporter {
    /// Takes spans off the queue until every worker has let go of it, posting them in batches.
    fn run(self, receiver: &Receiver<Span>) {
        let mut batch: Vec<Span> = Vec::new();
        let mut due: Option<Instant> = None;
        let mut failing = false;
        loop {
            let wait = due.map_or(Duration::from_secs(3600), |due| {
                due.saturating_duration_since(Instant::now())
            });
            let ended = match receiver.recv_timeout(wait) {
                Ok(span) => {
                    due.get_or_insert_with(|| Instant::now() + FLUSH_AFTER);
                    batch.push(span);
                    if batch.len() < MAX_BATCH {
                        continue;
                    }
                    false
                }
                Err(RecvTimeoutError::Timeout) => false,
                Err(RecvTimeoutError::Disconnected) => true,
            };
            if !batch.is_empty() {
                failing = self.send(&batch, failing);
                batch.clear();
            }
            due = None;
            if ended {
                return;
            }
        }
    }

    /// Posts `batch`, counting its spans as exported or dropped; says whether the post failed (a
    /// failure is logged when the previous post did not fail: once per outage).
    fn send(&self, batch: &[Span], failing: bool) -> bool {
        let body = otlp::encode(batch, &self.settings.service_name);
        let n = batch.len() as u64;
        match post(&self.settings, &body) {
            Ok(()) => {
                self.counters.exported.fetch_add(n, Relaxed);
                false
            }
            Err(why) => {
                self.counters.dropped[1].fetch_add(n, Relaxed);
                if !failing {
                    tracing::warn!(collector = %self.settings.otlp, "spans not exported: {why}");
                }
                true
            }
        }
    }
}

/// One OTLP/HTTP post of `body`; `Err` says why it failed (a status other than 2xx included).
fn post(settings: &Tracing, body: &[u8]) -> Result<(), String> {
    let endpoint = &settings.otlp;
    let address = (endpoint.host.as_str(), endpoint.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", endpoint.host))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", endpoint.host))?;
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&address, POST_TIMEOUT)
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    let left = POST_TIMEOUT
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    let timeouts = stream
        .set_write_timeout(Some(left))
        .and_then(|()| stream.set_read_timeout(Some(left)));
    timeouts.map_err(|e| e.to_string())?;
    let host = if endpoint.host.contains(':') {
        format!("[{}]:{}", endpoint.host, endpoint.port)
    } else {
        format!("{}:{}", endpoint.host, endpoint.port)
    };
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/x-protobuf\r\n\
         content-length: {}\r\nconnection: close\r\nuser-agent: duet/{}\r\n\r\n",
        endpoint.path,
        body.len(),
        env!("CARGO_PKG_VERSION"),
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body))
        .map_err(|e| format!("cannot send to {address}: {e}"))?;
    // The status line is all that is read: `HTTP/1.1 200 OK`.
    let mut status = [0u8; 12];
    stream
        .read_exact(&mut status)
        .map_err(|e| format!("no answer from {address}: {e}"))?;
    match &status[9..10] {
        b"2" => Ok(()),
        _ => Err(format!(
            "the collector answered {}",
            String::from_utf8_lossy(&status[9..12])
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::trace::otlp::Kind;

    fn span(n: u8) -> Span {
        Span {
            trace_id: [n; 16],
            span_id: [n; 8],
            parent: None,
            trace_state: None,
            name: "GET".to_owned(),
            kind: Kind::Server,
            start: 1,
            end: 2,
            attributes: Vec::new(),
            error: false,
        }
    }

    fn settings(port: u16, queue: usize) -> Tracing {
        Tracing {
            otlp: duet_config::OtlpEndpoint {
                host: "127.0.0.1".to_owned(),
                port,
                path: "/v1/traces".to_owned(),
            },
            sample: 1.0,
            queue,
            service_name: "test".to_owned(),
        }
    }

    #[test]
    fn a_full_queue_drops_at_once_and_counts_the_drop() {
        // A collector that accepts a connection and never answers: once it holds the exporter's
        // first post, the queue (of two) fills behind it.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = silent.local_addr().expect("its address").port();
        let export = Export::default();
        let queue = export.queue(&settings(port, 2));
        queue.push(span(0));
        let (_held, _) = silent.accept().expect("the exporter's post");
        let started = Instant::now();
        for n in 1..=10 {
            queue.push(span(n));
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "pushing never waits"
        );
        assert_eq!(
            export.counters.dropped[0].load(Relaxed),
            8,
            "two queued, eight dropped"
        );
        assert_eq!(export.counters.exported.load(Relaxed), 0);
    }

    #[test]
    fn a_batch_the_collector_refuses_is_counted_as_dropped() {
        // Nothing listens on the port (bound, then closed): every post fails to connect.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port")
            .port();
        let export = Export::default();
        let queue = export.queue(&settings(port, 8));
        for n in 0..3 {
            queue.push(span(n));
        }
        drop(queue);
        let counters = export.counters.clone();
        // The thread ends once every queue is dropped: the one in `export` too.
        drop(export);
        let deadline = Instant::now() + Duration::from_secs(10);
        while counters.dropped[1].load(Relaxed) < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(counters.dropped[1].load(Relaxed), 3);
    }
}
