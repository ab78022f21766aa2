//! The simulator reproduces the theory, deterministically, through duet-balance's selection code.

use duet_sim::{
    balls,
    cluster::{self, Scenario, SimPolicy},
    herd, supermarket,
};

#[test]
fn two_choices_collapse_the_fullest_bin() {
    let one = balls::run(100_000, 100_000, 1, 3).expect("one choice");
    let two = balls::run(100_000, 100_000, 2, 3).expect("two choices");
    // ln n / ln ln n ≈ 4.7 at this n, and the true maximum sits a few above it; two choices give ≈ 3.
    assert!(one.max_load >= 6, "one choice: {}", one.max_load);
    assert!(two.max_load <= 4, "two choices: {}", two.max_load);
}

#[test]
fn the_supermarket_model_matches_mitzenmacher() {
    let two = supermarket::run(1000, 0.9, 2, 1_000_000, 1).expect("d = 2");
    assert!((two.theory - 2.614).abs() < 0.001, "{}", two.theory);
    assert!(
        (two.mean_time_in_system - two.theory).abs() < 0.06,
        "{two:?}"
    );
    let one = supermarket::run(1000, 0.5, 1, 400_000, 1).expect("d = 1");
    assert!((one.theory - 2.0).abs() < 1e-12);
    assert!((one.mean_time_in_system - 2.0).abs() < 0.06, "{one:?}");
}

#[test]
fn the_documented_invocation_prints_json_with_the_mean() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_duet-sim"))
        .args([
            "supermarket",
            "--n",
            "1000",
            "--lambda",
            "0.9",
            "--choices",
            "2",
            "--seed",
            "1",
            "--json",
        ])
        .output()
        .expect("run duet-sim");
    assert!(output.status.success());
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let mean = json["mean_time_in_system"].as_f64().expect("field");
    assert!((mean - 2.61).abs() < 0.05, "{mean}");
}

#[test]
fn runs_are_deterministic_per_seed() {
    let scenario = Scenario {
        arrivals: 20_000,
        balancers: 3,
        workers: 2,
        policy: SimPolicy::P2cPeakEwma,
        ..Scenario::default()
    };
    let a = serde_json::to_string(&cluster::run(&scenario).expect("a")).expect("json");
    let b = serde_json::to_string(&cluster::run(&scenario).expect("b")).expect("json");
    assert_eq!(a, b);
    let other = Scenario {
        seed: 2,
        ..scenario
    };
    let c = serde_json::to_string(&cluster::run(&other).expect("c")).expect("json");
    assert_ne!(a, c);
}

#[test]
fn least_loaded_on_a_stale_view_herds_p2c_does_not() {
    let base = Scenario {
        balancers: 8,
        workers: 4,
        capacities: vec![1.0; 20],
        utilisation: 0.9,
        arrivals: 150_000,
        ..Scenario::default()
    };
    let report = herd::run(&base, &[0.0, 8.0]).expect("herd");
    let max_queue = |policy: SimPolicy, at: usize| {
        report
            .runs
            .iter()
            .flatten()
            .filter(|r| r.policy == policy)
            .nth(at)
            .map(|r| r.max_queue)
            .expect("run")
    };
    let fresh = max_queue(SimPolicy::LeastLoadedStale, 0);
    let stale = max_queue(SimPolicy::LeastLoadedStale, 1);
    assert!(
        stale > 10 * fresh,
        "least-loaded piles up as the view ages: {fresh} -> {stale}"
    );
    assert!(
        max_queue(SimPolicy::P2cStale, 1) * 3 < stale,
        "P2C on the same stale view spreads the herd"
    );
    assert_eq!(
        max_queue(SimPolicy::P2cInflight, 0),
        max_queue(SimPolicy::P2cInflight, 1),
        "P2C on local views does not depend on a shared view at all"
    );
}

#[test]
fn peak_ewma_steers_away_from_a_backend_that_degrades() {
    let run = |policy| {
        cluster::run(&Scenario {
            balancers: 2,
            workers: 2,
            utilisation: 0.7,
            degrade_at: Some(40.0),
            degrade_factor: 10.0,
            arrivals: 100_000,
            policy,
            ..Scenario::default()
        })
        .expect("run")
    };
    let round_robin = run(SimPolicy::RoundRobin);
    let peak_ewma = run(SimPolicy::P2cPeakEwma);
    assert!(peak_ewma.shares[0] < 0.03, "{:?}", peak_ewma.shares);
    assert!(
        peak_ewma.p99 * 100.0 < round_robin.p99,
        "{} vs {}",
        peak_ewma.p99,
        round_robin.p99
    );
}

#[test]
fn weights_follow_capacity() {
    let report = cluster::run(&Scenario {
        capacities: vec![4.0, 1.0, 1.0, 1.0, 1.0],
        weighted: true,
        utilisation: 0.3,
        arrivals: 100_000,
        policy: SimPolicy::P2cInflight,
        ..Scenario::default()
    })
    .expect("run");
    assert!((report.shares[0] - 0.5).abs() < 0.03, "{:?}", report.shares);
}

/// Erlang's C formula: mean time in an M/M/k system with arrival rate `lambda` and per-slot rate 1.
fn erlang_c_time_in_system(k: u32, lambda: f64) -> f64 {
    let a = lambda;
    let rho = a / f64::from(k);
    let term = |i: u32| a.powi(i as i32) / (1..=i).map(f64::from).product::<f64>();
    let queued = term(k) / (1.0 - rho);
    let waits = queued / ((0..k).map(term).sum::<f64>() + queued);
    waits / (f64::from(k) - lambda) + 1.0
}

#[test]
fn backends_with_several_slots_queue_as_erlang_c_predicts() {
    // Random routing splits Poisson arrivals into independent Poisson streams: each backend is M/M/4.
    let scenario = Scenario {
        capacities: vec![1.0; 4],
        slots: 4,
        utilisation: 0.8,
        arrivals: 800_000,
        policy: SimPolicy::Random,
        ..Scenario::default()
    };
    let report = cluster::run(&scenario).expect("run");
    let theory = erlang_c_time_in_system(4, 3.2);
    assert!((theory - 1.7455).abs() < 0.001, "{theory}");
    assert!(
        (report.mean - theory).abs() < 0.04,
        "{report:?} vs {theory}"
    );
}

#[test]
fn near_saturation_two_samples_trail_a_full_scan_by_the_gap_the_capacity_experiment_shows() {
    // The capacity experiment's backends (4 slots, one at half speed) at 95%: a full scan of in-flight
    // counts (least_loaded on a fresh view: nginx's and HAProxy's least-connections) against P2C.
    let at = |policy| {
        cluster::run(&Scenario {
            capacities: [0.5].into_iter().chain([1.0; 9]).collect(),
            slots: 4,
            utilisation: 0.95,
            arrivals: 300_000,
            policy,
            ..Scenario::default()
        })
        .expect("run")
    };
    let scan = at(SimPolicy::LeastLoadedStale);
    let p2c = at(SimPolicy::P2cInflight);
    let random = at(SimPolicy::Random);
    assert!(scan.p50 < p2c.p50 && scan.p99 < p2c.p99, "{scan:?} {p2c:?}");
    let p99_gap = p2c.p99 / scan.p99;
    assert!(
        (1.05..1.2).contains(&p99_gap),
        "P2C p99 / scan p99 = {p99_gap}"
    );
    // Random sends the half-speed backend a tenth of the traffic, more than it can serve: its queue grows.
    assert!(random.p99 > 20.0 * p2c.p99, "{random:?}");
}
