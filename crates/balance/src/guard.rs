use crate::load::{EndpointLoad, SampleAt};
use std::sync::Arc;
use tokio::time::Instant;

/// One request's claim on an endpoint's load.
///
/// Created when the balancer hands a request to an endpoint (its in-flight count has just been
/// incremented), and released exactly once: the decrement lives in `Drop`, so whatever path ends the
/// request — body end, body error, body dropped, response future dropped, inner service error — releases
/// it, and nothing else can. Under PeakEWMA it also records the request's latency sample once.
#[derive(Debug)]
pub struct LoadGuard {
    load: Arc<EndpointLoad>,
    /// `Some` when the metric uses latency.
    started: Option<Instant>,
    sampled: bool,
    /// While the sample is still to come: the start as the endpoint counts it among its waiting
    /// requests (see [`PeakEwmaConfig`](crate::PeakEwma)).
    awaiting: Option<u64>,
}

impl LoadGuard {
    /// `started` is the request's start when the metric uses latency, `None` otherwise.
    pub(crate) fn new(load: Arc<EndpointLoad>, started: Option<Instant>) -> Self {
        load.start();
        let awaiting = started.map(|at| load.await_sample(at));
        Self {
            load,
            started,
            sampled: false,
            awaiting,
        }
    }

    /// The sample is taken (or will never be): the request no longer counts as waiting for it.
    fn settle(&mut self) {
        self.sampled = true;
        if let Some(started_ns) = self.awaiting.take() {
            self.load.stop_awaiting(started_ns);
        }
    }

    /// The response head arrived. Records the latency sample now if samples are taken at headers, or a
    /// penalty if the response status is one the caller counts as a failure.
    pub fn on_response_head(&mut self, penalised: bool) {
        if self.sampled {
            return;
        }
        let Some(started) = self.started else { return };
        let now = Instant::now();
        if penalised {
            self.load.record_penalty(now);
            self.settle();
        } else if self.load.sample_at() == SampleAt::ResponseHeaders {
            self.load
                .record(now.saturating_duration_since(started), now);
            self.settle();
        }
    }

    /// The attempt failed before a response (e.g. the connection was refused): record the penalty.
    pub fn on_failure(&mut self) {
        if self.started.is_some() && !self.sampled {
            self.load.record_penalty(Instant::now());
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
        if let (Some(started), false) = (self.started, self.sampled) {
            let now = Instant::now();
            self.load
                .record(now.saturating_duration_since(started), now);
        }
        self.settle();
        self.load.finish();
    }
}
