//! What every connection of a worker shares: the proxy that handles its requests, its counters, the
//! parking lot and the count of open tunnels.

use crate::{conn::parking::ParkingLot, handler::WorkerProxy, telemetry::metrics::WorkerCounters};
use std::{
    cell::{Cell, OnceCell},
    rc::Rc,
    sync::Arc,
};
use tokio::sync::{watch, Notify};

/// One worker's connection-layer state, behind the [`Connections`](super::connections::Connections)
/// handle.
pub(crate) struct Shared {
    pub(crate) proxy: Rc<WorkerProxy>,
    pub(crate) counters: Arc<WorkerCounters>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Held by every open tunnel: its strong count, less one, is how many are open.
    pub(crate) tunnels: Rc<()>,
    /// Idle keep-alive connections parked outside their tasks; made by the first connection to park
    /// (it needs the worker's reactor), `None` if the system refused one.
    pub(crate) parking: OnceCell<Option<ParkingLot>>,
    pub(crate) parking_made: Notify,
    /// Connections served in tasks now (not parked), and the most since the worker last asked.
    pub(crate) tasks: Cell<usize>,
    pub(crate) tasks_high: Cell<usize>,
}

impl Shared {
    /// The proxy that handles this worker's requests.
    pub(crate) fn proxy(&self) -> &Rc<WorkerProxy> {
        &self.proxy
    }

    pub(crate) fn counters(&self) -> &WorkerCounters {
        &self.counters
    }

    /// Held while a tunnel is open.
    pub(crate) fn tunnel_opened(&self) -> Rc<()> {
        self.tunnels.clone()
    }

    /// The worker's parking lot, made on first use; `None` when the system gives no epoll set (idle
    /// connections then park in their tasks).
    pub(crate) fn parking_lot(&self) -> Option<&ParkingLot> {
        self.parking
            .get_or_init(|| match ParkingLot::new(self.counters.clone()) {
                Ok(lot) => {
                    self.parking_made.notify_one();
                    Some(lot)
                }
                Err(error) => {
                    tracing::warn!("idle connections park in their tasks (more memory each): no epoll set: {error}");
                    None
                }
            })
            .as_ref()
    }
}
