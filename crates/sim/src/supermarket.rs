//! Mitzenmacher's supermarket model: Poisson arrivals at rate λn to n FIFO servers with exp(1) service;
//! each customer joins the shortest of d queues sampled at random.

use crate::random::Random;
use duet_balance::algo::P2c;
use serde::Serialize;
use std::collections::VecDeque;

/// The outcome of one supermarket run.
#[derive(Debug, Clone, Serialize)]
pub struct SupermarketReport {
    /// Servers.
    pub n: usize,
    /// Arrival rate per server.
    pub lambda: f64,
    /// Queues sampled per arrival.
    pub choices: u32,
    /// Customers simulated (the first 20% are warm-up and not measured).
    pub arrivals: usize,
    /// Mean time from arrival to departure of the measured customers.
    pub mean_time_in_system: f64,
    /// Mitzenmacher's fixed point for n → ∞: `Σᵢ λ^((dⁱ − d)/(d − 1))`, or `1/(1 − λ)` for d = 1.
    pub theory: f64,
    /// The longest queue seen.
    pub max_queue: usize,
    /// Seed.
    pub seed: u64,
}

/// The expected time in system as n → ∞.
pub fn theory(lambda: f64, choices: u32) -> f64 {
    if choices <= 1 {
        return 1.0 / (1.0 - lambda);
    }
    let d = f64::from(choices);
    (1..64)
        .map(|i| lambda.powf((d.powi(i) - d) / (d - 1.0)))
        .take_while(|term| *term > 1e-15)
        .sum()
}

/// Runs the model. Two choices use duet-balance's `P2c::select` on queue lengths.
pub fn run(
    n: usize,
    lambda: f64,
    choices: u32,
    arrivals: usize,
    seed: u64,
) -> Result<SupermarketReport, String> {
    if n < 2 || !(0.0..1.0).contains(&lambda) || lambda == 0.0 {
        return Err("supermarket needs n >= 2 and 0 < lambda < 1".into());
    }
    if !(1..=2).contains(&choices) {
        return Err(format!(
            "--choices {choices}: the supermarket model supports 1 or 2"
        ));
    }
    let mut random = Random::new(seed);
    let mut p2c = P2c::with_seed(seed);
    // Each queue as the departure times of its customers, oldest first (FIFO: departures are ordered).
    let mut queues: Vec<VecDeque<f64>> = vec![VecDeque::new(); n];
    let warmup = arrivals / 5;
    let (mut now, mut total, mut measured, mut max_queue) = (0.0f64, 0.0f64, 0usize, 0usize);
    for k in 0..arrivals {
        now += random.exponential(lambda * n as f64);
        let queue = if choices == 1 {
            (p2c.draw() % n as u64) as usize
        } else {
            p2c.select(n, |i| {
                let q = &mut queues[i];
                while q.front().is_some_and(|&d| d <= now) {
                    q.pop_front();
                }
                q.len() as f64
            })
            .map_err(|e| e.to_string())?
            .chosen
        };
        let q = &mut queues[queue];
        while q.front().is_some_and(|&d| d <= now) {
            q.pop_front();
        }
        let start = q.back().copied().unwrap_or(now).max(now);
        let departure = start + random.exponential(1.0);
        q.push_back(departure);
        max_queue = max_queue.max(q.len());
        if k >= warmup {
            total += departure - now;
            measured += 1;
        }
    }
    Ok(SupermarketReport {
        n,
        lambda,
        choices,
        arrivals,
        mean_time_in_system: total / measured.max(1) as f64,
        theory: theory(lambda, choices),
        max_queue,
        seed,
    })
}
