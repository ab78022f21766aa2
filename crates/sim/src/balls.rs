//! Balls into bins: m balls, n bins, each ball to the emptier of d random bins.

use duet_balance::algo::P2c;
use serde::Serialize;

/// The outcome of one balls-into-bins run.
#[derive(Debug, Clone, Serialize)]
pub struct BallsReport {
    /// Bins.
    pub n: usize,
    /// Balls.
    pub m: usize,
    /// Bins sampled per ball (1 or 2).
    pub choices: u32,
    /// The fullest bin at the end.
    pub max_load: u32,
    /// The leading-order theory: `ln n / ln ln n` for one choice, `ln ln n / ln 2` for two.
    pub theory: f64,
    /// Seed of the balancer's draws.
    pub seed: u64,
}

/// Throws `m` balls into `n` bins with duet-balance's own selector (`P2c::with_seed`): one uniform draw
/// for one choice, a P2C selection on bin counts for two.
pub fn run(n: usize, m: usize, choices: u32, seed: u64) -> Result<BallsReport, String> {
    if n < 2 {
        return Err("balls needs at least 2 bins".into());
    }
    let mut p2c = P2c::with_seed(seed);
    let mut bins = vec![0u32; n];
    for _ in 0..m {
        let bin = match choices {
            1 => (p2c.draw() % n as u64) as usize,
            2 => {
                p2c.select(n, |i| f64::from(bins[i]))
                    .map_err(|e| e.to_string())?
                    .chosen
            }
            d => return Err(format!("--choices {d}: the balls model supports 1 or 2")),
        };
        bins[bin] += 1;
    }
    let ln_n = (n as f64).ln();
    let theory = if choices == 1 {
        ln_n / ln_n.ln()
    } else {
        ln_n.ln() / 2f64.ln()
    };
    Ok(BallsReport {
        n,
        m,
        choices,
        max_load: bins.iter().copied().max().unwrap_or(0),
        theory,
        seed,
    })
}
