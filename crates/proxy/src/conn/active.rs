//! A connection's place in the worker's open-connection gauge.

use crate::telemetry::metrics::WorkerCounters;
use std::sync::{atomic::Ordering::Relaxed, Arc};

/// Counts a connection as open (and accepted) while it lives, parked or not.
pub(crate) struct Active(Arc<WorkerCounters>);

impl Active {
    pub(crate) fn new(counters: Arc<WorkerCounters>) -> Self {
        counters.connections.fetch_add(1, Relaxed);
        counters.active.fetch_add(1, Relaxed);
        Self(counters)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}
