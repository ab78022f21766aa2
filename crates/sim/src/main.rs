//! `duet-sim`: reproduce the theory of two choices with duet-balance's own selection code.

use duet_sim::{
    balls,
    cluster::{self, Scenario, SimPolicy},
    herd,
    plot::{self, Axes, Series},
    supermarket,
};
use std::{collections::HashMap, path::PathBuf, process::ExitCode};

const USAGE: &str = "\
duet-sim: simulations that run duet-balance's own P2C code on virtual time (deterministic per --seed)

  duet-sim balls [--n 1000000] [--m N] [--choices 1|2] [--seed 1] [--json]
  duet-sim supermarket [--n 1000] [--lambda 0.9] [--choices 1|2] [--arrivals 2000000] [--seed 1] [--json]
  duet-sim herd [--balancers 8] [--workers 4] [--backends 20] [--utilisation 0.9]
                [--staleness 0,0.25,0.5,1,2,4,8] [--arrivals 400000] [--seed 1] [--json] [--svg FILE]
  duet-sim run --policy P [--balancers 1] [--workers 1] [--backends 10 | --capacities 1,1,2]
               [--slots 1] [--utilisation 0.8] [--staleness 0] [--degrade-at T] [--degrade-factor 10] [--weighted]
               [--arrivals 200000] [--paced] [--ewma-decay 10] [--seed 1] [--json]
  policies: random round_robin least_loaded_stale p2c_stale p2c_inflight p2c_peak_ewma
            p2c_memory_inflight p2c_memory_peak_ewma p2c_sed p2c_memory_sed p2c_memory_ties
            least_inflight least_peak_ewma least_inflight_draw least_inflight_peak_ties (full scans: n reads per pick)";

/// Writes a line to stdout; a reader that went away (`duet-sim ... | head -1`) ends the program
/// quietly, where `println!` would panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

/// `out!` without the line end.
macro_rules! out_inline {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if write!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

struct Args {
    flags: HashMap<String, String>,
}

/// The flags each command reads (a scenario's flags are shared by `run` and `herd`).
const SCENARIO_FLAGS: &[&str] = &[
    "policy",
    "balancers",
    "workers",
    "backends",
    "capacities",
    "slots",
    "utilisation",
    "arrivals",
    "staleness",
    "degrade-at",
    "degrade-factor",
    "weighted",
    "ewma-decay",
    "seed",
    "paced",
    "json",
];

fn known_flags(command: &str) -> &'static [&'static str] {
    match command {
        "balls" => &["n", "m", "choices", "seed", "json"],
        "supermarket" => &["n", "lambda", "choices", "arrivals", "seed", "json"],
        "herd" => &[
            "balancers",
            "workers",
            "backends",
            "capacities",
            "utilisation",
            "staleness",
            "arrivals",
            "seed",
            "json",
            "svg",
            "policy",
            "degrade-at",
            "degrade-factor",
            "weighted",
            "ewma-decay",
        ],
        _ => SCENARIO_FLAGS,
    }
}

impl Args {
    /// Reads `--flag value` pairs (a flag followed by another flag, or by nothing, is a switch). An
    /// unknown or repeated flag is an error: a typo must not silently run the default experiment.
    fn parse(raw: &[String], known: &[&str]) -> Result<Self, String> {
        let mut flags = HashMap::new();
        let mut it = raw.iter().peekable();
        while let Some(flag) = it.next() {
            let Some(name) = flag.strip_prefix("--") else {
                return Err(format!("unexpected argument `{flag}`"));
            };
            if !known.contains(&name) {
                return Err(format!("unknown flag `--{name}` for this command"));
            }
            let value = match it.peek() {
                Some(v) if !v.starts_with("--") => it.next().cloned().unwrap_or_default(),
                _ => "true".to_owned(),
            };
            if flags.insert(name.to_owned(), value).is_some() {
                return Err(format!("`--{name}` given twice"));
            }
        }
        Ok(Self { flags })
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.flags.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name}: cannot read `{v}`")),
        }
    }

    /// `--choices d`, or both 1 and 2 when not given.
    fn choices(&self) -> Result<Vec<u32>, String> {
        if self.has("choices") {
            Ok(vec![self.get("choices", 2)?])
        } else {
            Ok(vec![1, 2])
        }
    }

    fn has(&self, name: &str) -> bool {
        self.flags.contains_key(name)
    }

    fn list(&self, name: &str, default: &[f64]) -> Result<Vec<f64>, String> {
        match self.flags.get(name) {
            None => Ok(default.to_vec()),
            Some(v) => v
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse()
                        .map_err(|_| format!("--{name}: cannot read `{x}`"))
                })
                .collect(),
        }
    }
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = raw.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = Args::parse(rest, known_flags(command)).and_then(|args| match command.as_str() {
        "balls" => run_balls(&args),
        "supermarket" => run_supermarket(&args),
        "herd" => run_herd(&args),
        "run" => run_scenario(&args),
        "help" | "--help" | "-h" => {
            out!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`")),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("duet-sim: {error}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<(), String> {
    out!(
        "{}",
        serde_json::to_string_pretty(value).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// A single report as an object (the documented `--choices 2 --json` form), several as an array.
fn print_one_or_all<T: serde::Serialize>(reports: &[T]) -> Result<(), String> {
    match reports {
        [one] => print_json(one),
        all => print_json(&all),
    }
}

fn run_balls(args: &Args) -> Result<(), String> {
    let n = args.get("n", 1_000_000usize)?;
    let m = args.get("m", n)?;
    let seed = args.get("seed", 1u64)?;
    let choices = args.choices()?;
    let reports = choices
        .iter()
        .map(|&d| balls::run(n, m, d, seed))
        .collect::<Result<Vec<_>, _>>()?;
    if args.has("json") {
        return print_one_or_all(&reports);
    }
    out!("balls into bins: n = {n} bins, m = {m} balls, seed {seed}");
    out!(
        "{:>8} {:>9} {:>28}",
        "choices",
        "max load",
        "theory (leading order)"
    );
    for r in &reports {
        let formula = if r.choices == 1 {
            "ln n / ln ln n"
        } else {
            "ln ln n / ln 2"
        };
        out!(
            "{:>8} {:>9} {:>13.2} {formula:>14}",
            r.choices,
            r.max_load,
            r.theory
        );
    }
    Ok(())
}

fn run_supermarket(args: &Args) -> Result<(), String> {
    let n = args.get("n", 1000usize)?;
    let lambda = args.get("lambda", 0.9f64)?;
    let arrivals = args.get("arrivals", 2_000_000usize)?;
    let seed = args.get("seed", 1u64)?;
    let choices = args.choices()?;
    let reports = choices
        .iter()
        .map(|&d| supermarket::run(n, lambda, d, arrivals, seed))
        .collect::<Result<Vec<_>, _>>()?;
    if args.has("json") {
        return print_one_or_all(&reports);
    }
    out!("supermarket model: n = {n}, lambda = {lambda}, {arrivals} arrivals, seed {seed}");
    out!(
        "{:>8} {:>20} {:>10} {:>10}",
        "choices",
        "mean time in system",
        "theory",
        "max queue"
    );
    for r in &reports {
        out!(
            "{:>8} {:>20.3} {:>10.3} {:>10}",
            r.choices,
            r.mean_time_in_system,
            r.theory,
            r.max_queue
        );
    }
    Ok(())
}

fn base_scenario(args: &Args) -> Result<Scenario, String> {
    let capacities = match args.flags.get("capacities") {
        Some(_) => args.list("capacities", &[])?,
        None => vec![1.0; args.get("backends", 10usize)?],
    };
    let policy = match args.flags.get("policy") {
        None => SimPolicy::P2cInflight,
        Some(name) => SimPolicy::ALL
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| format!("unknown policy `{name}`"))?,
    };
    Ok(Scenario {
        balancers: args.get("balancers", 1)?,
        workers: args.get("workers", 1)?,
        capacities,
        slots: args.get("slots", 1)?,
        utilisation: args.get("utilisation", 0.8)?,
        arrivals: args.get("arrivals", 200_000)?,
        // `herd` takes a list here; a single scenario uses the first value.
        staleness: args
            .list("staleness", &[0.0])?
            .first()
            .copied()
            .unwrap_or(0.0),
        degrade_at: args
            .flags
            .get("degrade-at")
            .map(|v| v.parse())
            .transpose()
            .map_err(|_| "--degrade-at: not a number".to_owned())?,
        degrade_factor: args.get("degrade-factor", 10.0)?,
        weighted: args.has("weighted"),
        ewma_decay: args.get("ewma-decay", 10.0)?,
        policy,
        seed: args.get("seed", 1)?,
        paced: args.has("paced"),
    })
}

fn run_scenario(args: &Args) -> Result<(), String> {
    let scenario = base_scenario(args)?;
    let report = cluster::run(&scenario)?;
    if args.has("json") {
        return print_json(&report);
    }
    out!(
        "{}: mean {:.3}, p50 {:.3}, p99 {:.3}, p99.9 {:.3}, max queue {}",
        report.policy.name(),
        report.mean,
        report.p50,
        report.p99,
        report.p999,
        report.max_queue
    );
    let shares: Vec<String> = report.shares.iter().map(|s| format!("{:.3}", s)).collect();
    out!("shares: {}", shares.join(" "));
    let tail: Vec<String> = report
        .tail_shares
        .iter()
        .map(|s| format!("{:.3}", s))
        .collect();
    out!("slowest 1%: {}", tail.join(" "));
    Ok(())
}

fn run_herd(args: &Args) -> Result<(), String> {
    let mut base = base_scenario(args)?;
    if !args.has("balancers") {
        base.balancers = 8;
    }
    if !args.has("workers") {
        base.workers = 4;
    }
    if !args.has("backends") && !args.has("capacities") {
        base.capacities = vec![1.0; 20];
    }
    if !args.has("utilisation") {
        base.utilisation = 0.9;
    }
    if !args.has("arrivals") {
        base.arrivals = 400_000;
    }
    let staleness = args.list("staleness", &[0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0])?;
    let report = herd::run(&base, &staleness)?;
    if let Some(path) = args.flags.get("svg") {
        let series: Vec<Series> = report
            .runs
            .iter()
            .map(|row| Series {
                name: row.first().map_or("?", |r| r.policy.name()).to_owned(),
                points: row
                    .iter()
                    .map(|r| (r.staleness.max(0.05), f64::from(r.max_queue)))
                    .collect(),
            })
            .collect();
        plot::line_chart(
            &PathBuf::from(path),
            &format!(
                "Herd effect: {} balancers x {} workers, {} backends, {:.0}% load",
                base.balancers,
                base.workers,
                base.capacities.len(),
                base.utilisation * 100.0
            ),
            "staleness of the shared view (mean service times; 0 plotted at 0.05)",
            "longest queue seen",
            &series,
            Axes {
                log_x: true,
                log_y: true,
            },
        )?;
    }
    if args.has("json") {
        return print_json(&report);
    }
    out!(
        "herd: {} balancers x {} workers, {} backends at {:.0}% load, {} arrivals, seed {}",
        base.balancers,
        base.workers,
        base.capacities.len(),
        base.utilisation * 100.0,
        base.arrivals,
        base.seed
    );
    out!("longest queue (mean time in system) by staleness of the shared view:");
    out_inline!("{:>20}", "policy \\ staleness");
    for s in &staleness {
        out_inline!(" {s:>13}");
    }
    out!("");
    for row in &report.runs {
        out_inline!("{:>20}", row.first().map_or("?", |r| r.policy.name()));
        for r in row {
            out_inline!(" {:>5} ({:>5.2})", r.max_queue, r.mean);
        }
        out!("");
    }
    Ok(())
}
