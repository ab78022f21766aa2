//! Simulations of duet's balancing, driving duet-balance's own selection code (`P2c::with_seed`,
//! `select`, `select_weighted`, and the `peak_ewma` arithmetic) on virtual time, so that what is
//! simulated is what ships. Every run is deterministic for its seed.
//!
//! * [`balls`]: balls into bins, one choice against two (Azar, Broder, Karlin, Upfal 1994).
//! * [`supermarket`]: Mitzenmacher's supermarket model, against his fixed-point formula.
//! * [`cluster`]: K balancers × W workers with local views in front of n backends (heterogeneous
//!   capacity, request slots, a backend that degrades at time t), under each policy, P2C with memory
//!   (`P2c::select_with_memory`) included.
//! * [`herd`]: least-loaded on a stale shared view piles onto one backend as the view ages; P2C on
//!   local views does not.
//! * [`affinity`]: consistent hashing with bounded loads: keys moved by a membership change, and the
//!   busiest backend and requests away from their key's home under Zipf keys.
//!
//! ```
//! let report = duet_sim::supermarket::run(200, 0.5, 2, 50_000, 7).expect("valid");
//! assert!((report.mean_time_in_system - report.theory).abs() < 0.1);
//! ```

#![warn(missing_docs)]

// Top layer first (blank lines separate layers): each module uses only modules declared after it.
pub mod herd;

pub mod affinity;

pub mod balls;
pub mod cluster;
pub mod plot;
pub mod supermarket;

mod random;
