//! An open-loop HTTP/1.1 client: GETs sent at a fixed rate whatever the answers do, from one source
//! address, over keep-alive connections opened as needed, each request's latency timed from the
//! moment its bytes are written to the end of its answer.
//!
//! A closed-loop client (wrk) slows down when the server does and would hide a limiter that lets
//! too much through; the Python client this replaces had milliseconds of its own jitter, more than
//! the 0.2 ms a rate limit's latency is held to. This one writes raw requests on its own sockets
//! (no client library's pool or task hops between the timer and the write), one request in flight
//! per connection, on one thread.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    fmt::Write as _,
    io,
    net::{IpAddr, SocketAddr},
    rc::Rc,
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
};

/// What to send.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The server.
    pub target: SocketAddr,
    /// The request target (`/`, `/free`).
    pub path: String,
    /// Requests per second.
    pub rate: f64,
    /// How long to send for.
    pub duration: Duration,
    /// The address every connection is bound to (127.0.0.2: a client of its own to a limit keyed
    /// by address).
    pub source: IpAddr,
    /// How long a request may take before it counts as status 0.
    pub timeout: Duration,
}

/// What a run saw.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Requests sent.
    pub sent: u64,
    /// Wall time from the first send to the last answer.
    pub elapsed: Duration,
    /// Answers by status (0: no answer: refused connection, reset, timeout, unreadable head).
    pub statuses: BTreeMap<u16, u64>,
    /// Answers with status 200, by the second (since the start) their request was due in.
    pub ok_per_second: Vec<u64>,
    /// Latencies of the 200s, sorted.
    pub ok_latencies: Vec<Duration>,
}

impl Report {
    /// The `q`-quantile latency of the 200s (the element at `q * len`, as the Python client
    /// took it), `None` without any.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        let last = self.ok_latencies.len().checked_sub(1)?;
        let at = ((q * self.ok_latencies.len() as f64) as usize).min(last);
        self.ok_latencies.get(at).copied()
    }

    /// One JSON line: `sent`, `elapsed`, `statuses`, `ok_per_second`, `p50_ms`, `p99_ms` (in
    /// milliseconds, to the microsecond; `null` without a 200).
    pub fn to_json(&self) -> String {
        let statuses = (self.statuses.iter())
            .map(|(status, count)| format!("\"{status}\": {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        let per_second = (self.ok_per_second.iter())
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let millis = |q| match self.percentile(q) {
            Some(latency) => format!("{:.3}", latency.as_secs_f64() * 1e3),
            None => "null".to_owned(),
        };
        let mut json = String::new();
        let _ = write!(
            json,
            "{{\"sent\": {}, \"elapsed\": {:.3}, \"statuses\": {{{statuses}}}, \
             \"ok_per_second\": [{per_second}], \"p50_ms\": {}, \"p99_ms\": {}}}",
            self.sent,
            self.elapsed.as_secs_f64(),
            millis(0.50),
            millis(0.99),
        );
        json
    }
}

/// The idle keep-alive connections, shared by the run's requests (one thread).
type Idle = Rc<RefCell<Vec<TcpStream>>>;

/// Sends `plan`'s requests on schedule and waits for every answer. Runs on a current-thread
/// runtime inside a `LocalSet` (its requests are local tasks).
pub async fn run(plan: Plan) -> Report {
    let request = format!("GET {} HTTP/1.1\r\nHost: bench\r\n\r\n", plan.path).into_bytes();
    let request: Rc<[u8]> = request.into();
    let idle: Idle = Rc::default();
    let total = (plan.rate * plan.duration.as_secs_f64()).round() as u64;
    let seconds = plan.duration.as_secs_f64().ceil() as usize;
    let mut requests = tokio::task::JoinSet::new();
    let start = Instant::now();
    for i in 0..total {
        // Due at a fixed offset from the start: a late wake-up sends what is due at once, so the
        // rate holds on average whatever the timer's granularity.
        let due = start + Duration::from_secs_f64(i as f64 / plan.rate);
        tokio::time::sleep_until(due.into()).await;
        let second = (i as f64 / plan.rate) as usize;
        let (request, idle, plan) = (request.clone(), idle.clone(), plan.clone());
        requests.spawn_local(async move {
            let (status, latency) = exchange(&plan, &request, &idle).await;
            (second, status, latency)
        });
    }
    let mut report = Report {
        sent: total,
        ok_per_second: vec![0; seconds],
        ..Report::default()
    };
    while let Some(done) = requests.join_next().await {
        let (second, status, latency) = done.unwrap_or((0, 0, Duration::ZERO));
        *report.statuses.entry(status).or_default() += 1;
        if status == 200 {
            if let Some(count) = report.ok_per_second.get_mut(second) {
                *count += 1;
            }
            report.ok_latencies.push(latency);
        }
    }
    report.elapsed = start.elapsed();
    report.ok_latencies.sort_unstable();
    report
}

/// One request on an idle connection (a new one if none is idle): its status (0 if none came in
/// time) and its latency from the write to the last byte of the answer.
async fn exchange(plan: &Plan, request: &[u8], idle: &Idle) -> (u16, Duration) {
    let taken = idle.borrow_mut().pop();
    let mut stream = match taken {
        Some(stream) => stream,
        None => match connect(plan.source, plan.target).await {
            Ok(stream) => stream,
            Err(_) => return (0, Duration::ZERO),
        },
    };
    let sent = Instant::now();
    let answered = tokio::time::timeout(plan.timeout, async {
        stream.write_all(request).await?;
        read_answer(&mut stream).await
    })
    .await;
    let latency = sent.elapsed();
    match answered {
        Ok(Ok(answer)) => {
            if answer.keep_alive {
                idle.borrow_mut().push(stream);
            }
            (answer.status, latency)
        }
        _ => (0, latency),
    }
}

/// A TCP connection to `target` from `source` (port chosen by the OS), Nagle off.
async fn connect(source: IpAddr, target: SocketAddr) -> io::Result<TcpStream> {
    let socket = match target {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0))?;
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// What an answer said of itself.
struct Answer {
    status: u16,
    /// The connection may carry the next request (no `Connection: close`, a framed body).
    keep_alive: bool,
}

/// Reads one answer to its end: the head, then its `Content-Length` body or its chunked body (up to
/// the last chunk; trailers are not expected from these servers).
async fn read_answer(stream: &mut TcpStream) -> io::Result<Answer> {
    let mut buffer = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(end) = crate::raw::head_end(&buffer) {
            break end;
        }
        read_more(stream, &mut buffer).await?;
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let field = |name: &str| {
        (head.lines()).find_map(|line| Some(line.strip_prefix(name)?.strip_prefix(':')?.trim()))
    };
    let status = crate::raw::status(&head);
    let close = field("connection").is_some_and(|v| v.contains("close"));
    if field("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while !buffer[head_end..].ends_with(b"0\r\n\r\n") {
            read_more(stream, &mut buffer).await?;
        }
    } else {
        let length: usize = field("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            read_more(stream, &mut buffer).await?;
        }
    }
    Ok(Answer {
        status,
        keep_alive: !close,
    })
}

/// Appends what the stream has to `buffer`; the end of the stream is an error (the answer is cut).
async fn read_more(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk).await? {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        n => {
            buffer.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, BackendOptions};

    #[test]
    fn sends_on_schedule_from_a_bound_source_and_counts_every_answer() {
        let backend = Backend::start(BackendOptions::named("fixed")).expect("backend");
        let plan = Plan {
            target: backend.address(),
            path: "/".to_owned(),
            rate: 200.0,
            duration: Duration::from_millis(500),
            source: IpAddr::from([127, 0, 0, 2]),
            timeout: Duration::from_secs(5),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let report = tokio::task::LocalSet::new().block_on(&runtime, run(plan));
        assert_eq!(report.sent, 100);
        assert_eq!(report.statuses, BTreeMap::from([(200, 100)]));
        assert_eq!(report.ok_per_second, vec![100]);
        assert_eq!(backend.requests(), 100);
        assert!(backend.connections() < 100, "keep-alive connections reused");
        assert!(
            report.elapsed >= Duration::from_millis(495),
            "open loop: on schedule, not as fast as answers come"
        );
        let p50 = report.percentile(0.5).expect("a 200");
        assert!(p50 <= report.percentile(0.99).expect("a 200"));
        assert!(report.to_json().contains("\"statuses\": {\"200\": 100}"));
    }

    #[test]
    fn percentiles_pick_the_element_at_q_times_len() {
        let report = Report {
            ok_latencies: (1..=100).map(Duration::from_millis).collect(),
            ..Report::default()
        };
        assert_eq!(report.percentile(0.5), Some(Duration::from_millis(51)));
        assert_eq!(report.percentile(0.99), Some(Duration::from_millis(100)));
        assert_eq!(Report::default().percentile(0.99), None);
        assert!(Report::default().to_json().contains("\"p99_ms\": null"));
    }
}
