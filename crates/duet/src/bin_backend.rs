//! A standalone loopback backend for load benchmarks:
//! `duet-backend --listen 127.0.0.1:9001 --name a [--delay-ms 10] [--max-concurrency 8]`. Runs until killed.

use clap::Parser;
use duet_testbed::{Backend, BackendOptions};
use std::{net::SocketAddr, time::Duration};

/// A test backend: answers every request (after an optional delay) with its name in `x-backend`.
#[derive(Debug, Parser)]
#[command(name = "duet-backend", version)]
struct Cli {
    /// Where to listen.
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,
    /// Sent back in the `x-backend` header.
    #[arg(long, default_value = "backend")]
    name: String,
    /// How long each response waits before it is sent.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    delay_ms: u64,
    /// At most this many answers in progress at once; the rest wait their turn (a backend of finite
    /// capacity, where sending it more than its share shows in latency).
    #[arg(long, value_name = "N")]
    max_concurrency: Option<usize>,
}

fn main() {
    let cli = Cli::parse();
    let mut options = BackendOptions::named(&cli.name);
    options.record_requests = false;
    options.address = cli.listen;
    options.delay = Duration::from_millis(cli.delay_ms);
    options.max_concurrency = cli.max_concurrency;
    match Backend::start(options) {
        Ok(backend) => {
            println!("listening on {}", backend.address());
            loop {
                std::thread::park();
            }
        }
        Err(error) => {
            eprintln!("duet-backend: cannot start: {error}");
            std::process::exit(1)
        }
    }
}
