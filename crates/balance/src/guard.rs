use crate::{
    load::{EndpointLoad, SampleAt},
    memory::LastFreed,
};
use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    Arc,
};

/// One request's claim on an endpoint's load.
///
/// Created when the balancer hands a request to an endpoint (its in-flight count has just been
/// incremented), and released exactly once: the decrement lives in `Drop`, so whatever path ends the
/// request — body end, body error, body dropped, response future dropped, inner service error — releases
/// it, and nothing else can. Under PeakEWMA it also records the request's latency sample once.
///
/// ```
/// use duet_balance::{Balancer, Strategy};
///
/// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cPeakEwma);
/// balance.insert("a", 1, ());
/// let (_, _, guard) = balance.pick_and_claim()?;
/// assert_eq!(guard.endpoint_load().in_flight(), 1);
/// let load = guard.endpoint_load().clone();
/// drop(guard); // released once, whatever ended the request; its latency is the sample
/// assert_eq!(load.in_flight(), 0);
/// assert!(load.is_measured());
/// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
/// ```
pub struct LoadGuard {
    load: Arc<EndpointLoad>,
    /// The clock reading at the request's start, when the metric uses latency.
    started: u64,
    /// The latency sample is still to come: the request counts among the endpoint's waiting ones
    /// (see [`PeakEwmaConfig`](crate::PeakEwmaConfig)).
    waiting: bool,
    /// Under P2C with memory: where to record, on release, that this
    /// endpoint freed a slot, and the endpoint's token there.
    freed: Option<(Arc<LastFreed>, u64)>,
    /// Under [`Affinity`](crate::Affinity): the balancer's count of requests in flight, which this
    /// request is one of until released.
    pool: Option<Arc<AtomicU64>>,
}

/// The endpoint's load and whether the sample is still to come; the start is a clock reading (ticks),
/// which says nothing to a reader, and is left out.
impl std::fmt::Debug for LoadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadGuard")
            .field("load", &self.load)
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}

impl LoadGuard {
    /// `started` is the request's start (a reading of the endpoint's clock) when the metric uses
    /// latency, `None` otherwise.
    pub(crate) fn new(load: Arc<EndpointLoad>, started: Option<u64>) -> Self {
        match started {
            Some(at) => load.start_waiting(at),
            None => load.start(),
        }
        Self {
            load,
            started: started.unwrap_or(0),
            waiting: started.is_some(),
            freed: None,
            pool: None,
        }
    }

    /// Counts the request in `pool` (the balancer's requests in flight) until released.
    pub(crate) fn counted_in(mut self, pool: Arc<AtomicU64>) -> Self {
        pool.fetch_add(1, Relaxed);
        self.pool = Some(pool);
        self
    }

    /// Records `token` in `freed` when the request releases its endpoint.
    pub(crate) fn remembered_in(mut self, freed: Arc<LastFreed>, token: u64) -> Self {
        self.freed = Some((freed, token));
        self
    }

    /// The sample is taken (or will never be): the request no longer counts as waiting for it.
    fn settle(&mut self) {
        if self.waiting {
            self.waiting = false;
            self.load.stop_waiting(self.started);
        }
    }

    /// The response head arrived. Records the latency sample now if samples are taken at headers, or a
    /// penalty if the response status is one the caller counts as a failure.
    pub fn on_response_head(&mut self, penalised: bool) {
        if !self.waiting {
            return;
        }
        if penalised {
            self.load.record_penalty(self.load.clock().now());
            self.settle();
        } else if self.load.sample_at() == SampleAt::ResponseHeaders {
            self.load
                .record_since(self.started, self.load.clock().now());
            self.settle();
        }
    }

    /// The attempt failed before a response (e.g. the connection was refused): record the penalty.
    pub fn on_failure(&mut self) {
        if self.waiting {
            self.load.record_penalty(self.load.clock().now());
            self.settle();
        }
    }

    /// The attempt ended through no fault of the endpoint (say, the client's request body broke or
    /// stalled): release the load without recording a latency sample or a penalty for it.
    pub fn discard_sample(&mut self) {
        self.settle();
    }

    /// The endpoint state this guard holds.
    pub fn endpoint_load(&self) -> &Arc<EndpointLoad> {
        &self.load
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if self.waiting {
            self.load
                .record_since(self.started, self.load.clock().now());
            self.load.finish_waiting(self.started);
        } else {
            self.load.finish();
        }
        if let Some((freed, token)) = &self.freed {
            freed.record(*token);
        }
        if let Some(pool) = &self.pool {
            pool.fetch_sub(1, Relaxed);
        }
    }
}
