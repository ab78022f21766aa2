//! `duet demo`: three loopback backends (two fast, one fifty times slower), duet in front of them, and a
//! bounded burst of requests for each policy, with each backend's share and the latency percentiles;
//! then PeakEWMA again, warm, beside the floor (the fast backends alone): the tail duet is built for.
//!
//! The slow backend is far slower than the fast ones so that the steering shows on a busy machine too:
//! there every request also waits for the scheduler, and at 20 ms against 2 ms the fast backends' measured
//! latency came close enough to the slow one's (p50 15 ms on a loaded 2-core machine) that P2C gave it
//! 21-23% instead of a few percent. The burst is sized so that round robin's third on the slow backend
//! stays under two seconds.

use crate::server::Server;
use duet_config::{Config, Policy};
use duet_testbed::{config::DuetConfig, load::closed_loop, Backend as TestBackend, BackendOptions};
use std::{error::Error, net::SocketAddr, time::Duration};

const REQUESTS: usize = 1200;
const CONCURRENCY: usize = 24;
const FAST: Duration = Duration::from_millis(2);
const SLOW: Duration = Duration::from_millis(100);

/// One row of the demo's table.
#[derive(Debug)]
pub struct Row {
    /// What ran: a policy's name, or a note beside it.
    pub label: String,
    /// The share of each backend (`fast-1`, `fast-2`, `slow`), in that order.
    pub shares: [f64; 3],
    pub p50: Duration,
    pub p99: Duration,
    pub errors: u64,
}

/// The rows: each policy from a cold start; PeakEWMA again once it has seen every backend answer,
/// then warm with hedging; and the floor, the two fast backends alone.
pub fn rows() -> Result<Vec<Row>, Box<dyn Error>> {
    let backends = [
        TestBackend::start(BackendOptions::named("fast-1").delay(FAST))?,
        TestBackend::start(BackendOptions::named("fast-2").delay(FAST))?,
        TestBackend::start(BackendOptions::named("slow").delay(SLOW))?,
    ];
    let all: Vec<SocketAddr> = backends.iter().map(TestBackend::address).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for policy in [
        Policy::RoundRobin,
        Policy::Random,
        Policy::P2cInflight,
        Policy::P2cPeakEwma,
    ] {
        let server = Server::start(config(policy, &all, None)?)?;
        let address = listening(&server)?;
        rows.push(runtime.block_on(burst(policy.name(), address))?);
        if policy == Policy::P2cPeakEwma {
            let warm = format!("{} warm", policy.name());
            rows.push(runtime.block_on(burst(&warm, address))?);
        }
        server.shutdown()?;
    }
    // Hedged after the route's p95, once the first burst has warmed the percentile up.
    let raced = Server::start(config(
        Policy::P2cPeakEwma,
        &all,
        Some(("hedge", "{ after: p95 }")),
    )?)?;
    let address = listening(&raced)?;
    runtime.block_on(burst("warm-up", address))?;
    rows.push(runtime.block_on(burst("+ hedge p95, warm", address))?);
    raced.shutdown()?;
    let fast = &all[..2];
    let server = Server::start(config(Policy::P2cPeakEwma, fast, None)?)?;
    let address = listening(&server)?;
    rows.push(runtime.block_on(burst("fast only", address))?);
    server.shutdown()?;
    Ok(rows)
}

/// Where `server` listens.
fn listening(server: &Server) -> Result<SocketAddr, Box<dyn Error>> {
    Ok(server.local_addrs().first().copied().ok_or("no listener")?)
}

/// [`REQUESTS`] GETs from [`CONCURRENCY`] clients through duet at `address`.
async fn burst(label: &str, address: SocketAddr) -> Result<Row, Box<dyn Error>> {
    let uri = format!("http://{address}/").parse()?;
    let report = closed_loop(uri, REQUESTS, CONCURRENCY, Duration::from_secs(10)).await;
    Ok(Row {
        label: label.to_owned(),
        shares: ["fast-1", "fast-2", "slow"].map(|name| report.share(name)),
        p50: report.percentile(0.50),
        p99: report.percentile(0.99),
        errors: report.errors,
    })
}

/// Runs the demo, printing a table to stdout.
pub fn run() -> Result<(), Box<dyn Error>> {
    println!(
        "duet demo: backends fast-1, fast-2 ({} ms) and slow ({} ms) on loopback;",
        FAST.as_millis(),
        SLOW.as_millis()
    );
    println!("{REQUESTS} GETs per row from {CONCURRENCY} concurrent keep-alive clients through 2 duet workers.\n");
    println!(
        "{:<19} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7}",
        "policy", "fast-1", "fast-2", "slow", "p50 ms", "p99 ms", "errors"
    );
    for row in rows()? {
        let [fast_1, fast_2, slow] = row.shares.map(|share| 100.0 * share);
        println!(
            "{:<19} {fast_1:>7.1}% {fast_2:>7.1}% {slow:>7.1}% {:>9.2} {:>9.2} {:>7}",
            row.label,
            row.p50.as_secs_f64() * 1000.0,
            row.p99.as_secs_f64() * 1000.0,
            row.errors,
        );
    }
    println!("\nRound robin and random give the slow backend a third of the requests; P2C compares load and steers away.");
    println!("Warm, PeakEWMA has seen every backend answer and sends the slow one only the odd probe; hedged");
    println!("after the route's p95, those few answer from a fast backend too: the p99 is the fast backends' (`fast only`).");
    Ok(())
}

fn config(
    policy: Policy,
    backends: &[SocketAddr],
    route_key: Option<(&str, &str)>,
) -> Result<Config, Box<dyn Error>> {
    let mut config = DuetConfig::single(policy.name(), backends)
        .workers(2)
        .section("shutdown", "{ drain_timeout: 5s }");
    if let Some((key, value)) = route_key {
        config = config.route_set(key, value);
    }
    let yaml = config.to_yaml();
    Ok(duet_config::parse(&yaml, "demo")?)
}
