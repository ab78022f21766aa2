//! A bounded closed-loop load generator: a fixed number of requests from a fixed number of concurrent
//! clients, recording each latency and which backend answered (its `x-backend` header).

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

/// One GET read to its end: whether it was a 2xx, and which backend answered (`x-backend`, or `-`).
async fn get(client: &Client<HttpConnector, Empty<Bytes>>, uri: Uri) -> Option<(bool, String)> {
    let response = client.get(uri).await.ok()?;
    let ok = response.status().is_success();
    let backend = response
        .headers()
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    response.into_body().collect().await.ok()?;
    Some((ok, backend))
}

/// What a load run measured.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    /// Latency of every successful request, sorted.
    pub latencies: Vec<Duration>,
    /// Requests answered per `x-backend` value.
    pub by_backend: BTreeMap<String, u64>,
    /// Requests that failed or got a non-2xx status.
    pub errors: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl LoadReport {
    /// The `q`-quantile latency (0.5 = median), or zero if nothing succeeded.
    pub fn percentile(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let rank =
            ((self.latencies.len() as f64 * q).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[rank - 1]
    }

    /// The share of successful requests answered by `backend`.
    pub fn share(&self, backend: &str) -> f64 {
        let total: u64 = self.by_backend.values().sum();
        if total == 0 {
            return 0.0;
        }
        self.by_backend.get(backend).copied().unwrap_or(0) as f64 / total as f64
    }
}

/// Sends `requests` GETs to `uri` from `concurrency` concurrent keep-alive clients and waits for all.
/// Every request is bounded by `timeout`.
pub async fn closed_loop(
    uri: Uri,
    requests: usize,
    concurrency: usize,
    timeout: Duration,
) -> LoadReport {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    let per_worker = requests / concurrency.max(1);
    let extra = requests % concurrency.max(1);
    for w in 0..concurrency.max(1) {
        let client = client.clone();
        let uri = uri.clone();
        let count = per_worker + usize::from(w < extra);
        workers.spawn(async move {
            let mut report = LoadReport::default();
            for _ in 0..count {
                let sent = Instant::now();
                let outcome = tokio::time::timeout(timeout, async {
                    match get(&client, uri.clone()).await {
                        Some((true, backend)) => Ok(backend),
                        _ => Err(()),
                    }
                })
                .await;
                match outcome {
                    Ok(Ok(backend)) => {
                        report.latencies.push(sent.elapsed());
                        *report.by_backend.entry(backend).or_default() += 1;
                    }
                    _ => report.errors += 1,
                }
            }
            report
        });
    }
    let mut total = LoadReport::default();
    while let Some(done) = workers.join_next().await {
        if let Ok(report) = done {
            total.latencies.extend(report.latencies);
            total.errors += report.errors;
            for (backend, n) in report.by_backend {
                *total.by_backend.entry(backend).or_default() += n;
            }
        } else {
            total.errors += 1;
        }
    }
    total.latencies.sort_unstable();
    total.elapsed = started.elapsed();
    total
}

/// One request of an open-loop run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was sent, from the start of the run.
    pub sent_at: Duration,
    /// How long it took (the timeout if it timed out).
    pub latency: Duration,
    /// A 2xx within the timeout.
    pub ok: bool,
    /// The answering backend's `x-backend`, or `-`.
    pub backend: String,
}

/// Sends GETs to `uri` at a fixed `rate` per second for `duration`, whatever the responses do (open
/// loop: a slow backend does not slow the offered load), each bounded by `timeout`.
pub async fn open_loop(uri: Uri, rate: f64, duration: Duration, timeout: Duration) -> Vec<Sample> {
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http::<Empty<Bytes>>();
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut requests = tokio::task::JoinSet::new();
    let total = (rate * duration.as_secs_f64()).round() as usize;
    for _ in 0..total {
        ticks.tick().await;
        let client = client.clone();
        let uri = uri.clone();
        let sent_at = started.elapsed();
        requests.spawn(async move {
            let sent = tokio::time::Instant::now();
            let outcome = tokio::time::timeout(timeout, get(&client, uri)).await;
            let (ok, backend) = match outcome {
                Ok(Some(result)) => result,
                _ => (false, "-".to_owned()),
            };
            Sample {
                sent_at,
                latency: sent.elapsed(),
                ok,
                backend,
            }
        });
    }
    let mut samples = Vec::with_capacity(total);
    while let Some(done) = requests.join_next().await {
        if let Ok(sample) = done {
            samples.push(sample);
        }
    }
    samples.sort_by_key(|s| s.sent_at);
    samples
}
