//! `duet demo`: three loopback backends (two fast, one fifty times slower), duet in front of them, and a
//! bounded burst of requests for each policy, with each backend's share and the latency percentiles.
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

/// Runs the demo, printing a table to stdout.
pub fn run() -> Result<(), Box<dyn Error>> {
    let backends = [
        TestBackend::start(BackendOptions::named("fast-1").delay(FAST))?,
        TestBackend::start(BackendOptions::named("fast-2").delay(FAST))?,
        TestBackend::start(BackendOptions::named("slow").delay(SLOW))?,
    ];
    println!(
        "duet demo: backends fast-1, fast-2 ({} ms) and slow ({} ms) on loopback;",
        FAST.as_millis(),
        SLOW.as_millis()
    );
    println!("{REQUESTS} GETs per policy from {CONCURRENCY} concurrent keep-alive clients through 2 duet workers.\n");
    println!(
        "{:<15} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7}",
        "policy", "fast-1", "fast-2", "slow", "p50 ms", "p99 ms", "errors"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for policy in [
        Policy::RoundRobin,
        Policy::Random,
        Policy::P2cInflight,
        Policy::P2cPeakEwma,
    ] {
        let addresses: Vec<SocketAddr> = backends.iter().map(TestBackend::address).collect();
        let server = Server::start(config(policy, &addresses)?)?;
        let address = server.local_addrs().first().copied().ok_or("no listener")?;
        let uri = format!("http://{address}/").parse()?;
        let report = runtime.block_on(closed_loop(
            uri,
            REQUESTS,
            CONCURRENCY,
            Duration::from_secs(10),
        ));
        server.shutdown()?;
        println!(
            "{:<15} {:>7.1}% {:>7.1}% {:>7.1}% {:>9.2} {:>9.2} {:>7}",
            policy.name(),
            100.0 * report.share("fast-1"),
            100.0 * report.share("fast-2"),
            100.0 * report.share("slow"),
            report.percentile(0.50).as_secs_f64() * 1000.0,
            report.percentile(0.99).as_secs_f64() * 1000.0,
            report.errors,
        );
    }
    println!("\nRound robin and random give the slow backend a third of the requests; P2C compares load and steers away.");
    Ok(())
}

fn config(policy: Policy, backends: &[SocketAddr]) -> Result<Config, Box<dyn Error>> {
    let yaml = DuetConfig::single(policy.name(), backends)
        .workers(2)
        .section("shutdown", "{ drain_timeout: 5s }")
        .to_yaml();
    Ok(duet_config::parse(&yaml, "demo")?)
}
