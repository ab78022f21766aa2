//! The `duet` binary's code: command line, workers, the control plane, and the demo.
//!
//! Each worker (`worker.rs`) is one OS thread with its own single-threaded tokio runtime, its own
//! `SO_REUSEPORT` listener per configured address, and its own [`duet_proxy::WorkerProxy`]: pooled
//! clients and a balancer per cluster. Workers share no load counters: each balances from its local
//! view, so they cannot herd.
//!
//! The control plane (`control/`) is one more thread: it resolves backend host names (discovery), runs
//! health checks once per process, and serves the admin listener. It publishes what it learns on watch
//! channels; workers apply it between requests. [`Server`] starts and stops all of them.

// Top layer first (blank lines separate layers): each module uses only modules declared after it.
pub mod cli;

pub mod demo;
mod probe;

pub mod server;

mod auth_files;
mod control;
mod listener;
mod tls;
mod worker;
mod client_limits;

mod log_buffer;
mod log_file;
mod memory;

pub use control::discovery::{system_resolver, Resolver};
pub use server::{worker_count, Server};
