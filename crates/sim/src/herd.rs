//! The herd effect: least-loaded on a stale shared view against P2C, as the view grows staler; and a
//! full scan of each worker's own view (duet's opt-in `least_*` policies), which shares nothing.

use crate::cluster::{self, RunReport, Scenario, SimPolicy};
use serde::Serialize;

/// One row per staleness: each policy's result.
#[derive(Debug, Clone, Serialize)]
pub struct HerdReport {
    /// The setup (its policy and staleness vary per run).
    pub scenario: Scenario,
    /// Staleness values, in mean service times.
    pub staleness: Vec<f64>,
    /// `runs[p][s]`: policy p at staleness s.
    pub runs: Vec<Vec<RunReport>>,
}

/// The policies compared.
pub const POLICIES: [SimPolicy; 10] = [
    SimPolicy::LeastLoadedStale,
    SimPolicy::P2cStale,
    SimPolicy::P2cInflight,
    SimPolicy::P2cPeakEwma,
    SimPolicy::P2cMemoryInflight,
    SimPolicy::P2cMemoryPeakEwma,
    SimPolicy::LeastInflight,
    SimPolicy::LeastInflightDraw,
    SimPolicy::LeastPeakEwma,
    SimPolicy::Random,
];

/// Runs every policy at every staleness.
pub fn run(base: &Scenario, staleness: &[f64]) -> Result<HerdReport, String> {
    let mut runs = Vec::new();
    for policy in POLICIES {
        let mut row = Vec::new();
        for &delta in staleness {
            let scenario = Scenario {
                policy,
                staleness: delta,
                ..base.clone()
            };
            row.push(cluster::run(&scenario)?);
        }
        runs.push(row);
    }
    Ok(HerdReport {
        scenario: base.clone(),
        staleness: staleness.to_vec(),
        runs,
    })
}
