//! A standalone loopback backend for load benchmarks:
//! `duet-backend --listen 127.0.0.1:9001 --name a [--delay-ms 10]`. Runs until killed.

use duet_testbed::{Backend, BackendOptions};
use std::time::Duration;

fn main() {
    let mut options = BackendOptions::named("backend");
    options.record_requests = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        match flag.as_str() {
            "--listen" => match value.parse() {
                Ok(address) => options.address = address,
                Err(_) => fail(&format!("--listen wants IP:PORT, got `{value}`")),
            },
            "--name" => options.name = value,
            "--delay-ms" => match value.parse() {
                Ok(ms) => options.delay = Duration::from_millis(ms),
                Err(_) => fail(&format!("--delay-ms wants a number, got `{value}`")),
            },
            other => fail(&format!("unknown flag `{other}`")),
        }
    }
    match Backend::start(options) {
        Ok(backend) => {
            println!("listening on {}", backend.address());
            loop {
                std::thread::park();
            }
        }
        Err(error) => fail(&format!("cannot start: {error}")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!(
        "duet-backend: {message}\nusage: duet-backend --listen IP:PORT --name NAME [--delay-ms MS]"
    );
    std::process::exit(2)
}
