//! `duet-open-loop HOST PORT PATH RATE SECONDS SOURCE_IP`: GETs at a fixed rate from one source
//! address (the benches' open-loop client, [`duet_testbed::fixed_rate`]); prints one JSON line:
//! requests sent, answers by status, 200s per second, p50/p99 of the 200s in milliseconds.

use duet_testbed::fixed_rate::{run, Plan};
use std::{process::ExitCode, time::Duration};

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let Some(plan) = plan(&arguments) else {
        eprintln!("usage: duet-open-loop HOST PORT PATH RATE SECONDS SOURCE_IP");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("duet-open-loop: {error}");
            return ExitCode::FAILURE;
        }
    };
    let report = tokio::task::LocalSet::new().block_on(&runtime, run(plan));
    println!("{}", report.to_json());
    ExitCode::SUCCESS
}

/// The plan the arguments describe, `None` if they do not.
fn plan(arguments: &[String]) -> Option<Plan> {
    let [host, port, path, rate, seconds, source] = arguments else {
        return None;
    };
    let rate: f64 = rate
        .parse()
        .ok()
        .filter(|r: &f64| *r > 0.0 && r.is_finite())?;
    let seconds: f64 = seconds
        .parse()
        .ok()
        .filter(|s: &f64| *s > 0.0 && s.is_finite())?;
    Some(Plan {
        target: (host.parse::<std::net::IpAddr>().ok()?, port.parse().ok()?).into(),
        path: path.clone(),
        rate,
        duration: Duration::from_secs_f64(seconds),
        source: source.parse().ok()?,
        timeout: Duration::from_secs(5),
    })
}
