//! The `duet` binary's code: command line, workers, and the demo.
//!
//! Each worker is one OS thread with its own single-threaded tokio runtime, its own `SO_REUSEPORT`
//! listener per configured address, its own pooled client and its own balancer per cluster. Workers
//! share no load counters: each balances from its local view, so they cannot herd.

mod control;
mod listener;
mod tls;
mod worker;

pub mod cli;
pub mod demo;
pub mod server;

pub use control::discovery::{system_resolver, Resolver};
pub use server::{worker_count, Server};
