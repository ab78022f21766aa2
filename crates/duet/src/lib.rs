//! The `duet` binary's code: command line, workers, and the demo.
//!
//! Each worker is one OS thread with its own single-threaded tokio runtime, its own `SO_REUSEPORT`
//! listener per configured address, its own pooled client and its own balancer per cluster. Workers
//! share no load counters: each balances from its local view, so they cannot herd.

mod discovery;
mod listener;
mod tls;
mod worker;

pub mod cli;
pub mod demo;
pub mod server;

pub use discovery::{system_resolver, Resolver};
pub use server::Server;
