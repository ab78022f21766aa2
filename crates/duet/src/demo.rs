//! `duet demo`: three loopback backends (two fast, one ten times slower), duet in front of them, and a
//! bounded burst of requests for each policy, with each backend's share and the latency percentiles.

use crate::Server;
use duet_config::{
    Backend, Cluster, Config, Limits, Listener, Policy, Route, Shutdown, Timeouts, Workers,
};
use duet_testbed::{load::closed_loop, Backend as TestBackend, BackendOptions};
use std::{error::Error, net::SocketAddr, num::NonZeroUsize, time::Duration};

const REQUESTS: usize = 3000;
const CONCURRENCY: usize = 24;
const FAST: Duration = Duration::from_millis(2);
const SLOW: Duration = Duration::from_millis(20);

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
        let server = Server::start(config(
            policy,
            &backends
                .iter()
                .map(TestBackend::address)
                .collect::<Vec<_>>(),
        ))?;
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

fn config(policy: Policy, backends: &[SocketAddr]) -> Config {
    Config {
        workers: Workers::Count(NonZeroUsize::MIN.saturating_add(1)),
        listeners: vec![Listener {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
        }],
        routes: vec![Route {
            host: None,
            path_prefix: "/".into(),
            cluster: 0,
        }],
        clusters: vec![Cluster {
            name: "demo".into(),
            policy,
            backends: backends
                .iter()
                .map(|&address| Backend {
                    name: address.to_string(),
                    address,
                    weight: 1,
                })
                .collect(),
            timeouts: Timeouts::default(),
        }],
        limits: Limits::default(),
        shutdown: Shutdown {
            drain_timeout: Duration::from_secs(5),
        },
    }
}
