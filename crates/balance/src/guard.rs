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
    /// Under P2C with memory or [`Affinity`](crate::Affinity): what the balancer's guards also do on
    /// release, and the endpoint's token in its memory. One field for both, so a guard of a balancer
    /// with neither checks one word on release.
    also: Option<(Arc<OnRelease>, u64)>,
}

/// What the guards of one balancer do on release besides giving back their endpoint's load, shared by
/// them: under P2C with memory, record that the endpoint freed a slot; under
/// [`Affinity`](crate::Affinity), give the request back to the balancer's count of requests in flight
/// (the bound on a keyed pick is over it).
#[derive(Debug)]
pub(crate) struct OnRelease {
    freed: Option<LastFreed>,
    in_flight: Option<AtomicU64>,
}

impl OnRelease {
    /// For a balancer that `remembers` (P2C with memory) and/or `counts` (affinity); `None` for one
    /// that does neither, whose guards then do nothing more.
    pub(crate) fn new(remembers: bool, counts: bool) -> Option<Arc<Self>> {
        (remembers || counts).then(|| {
            Arc::new(Self {
                freed: remembers.then(LastFreed::new),
                in_flight: counts.then(AtomicU64::default),
            })
        })
    }

    /// As `previous`, counting requests in flight from now on (they start at zero): what
    /// `previous` remembers is kept.
    pub(crate) fn counting(previous: Option<&Self>, remembers: bool) -> Arc<Self> {
        let freed = match previous.and_then(|previous| previous.freed.as_ref()) {
            Some(freed) => Some(freed.copy()),
            None => remembers.then(LastFreed::new),
        };
        Arc::new(Self {
            freed,
            in_flight: Some(AtomicU64::default()),
        })
    }

    /// The endpoints requests last completed on, under P2C with memory.
    pub(crate) fn freed(&self) -> Option<&LastFreed> {
        self.freed.as_ref()
    }

    /// The balancer's requests in flight, all endpoints together (0 when it does not count them).
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight
            .as_ref()
            .map_or(0, |count| count.load(Relaxed))
    }

    fn claimed(&self) {
        if let Some(count) = &self.in_flight {
            count.fetch_add(1, Relaxed);
        }
    }

    fn released(&self, token: u64) {
        if let Some(freed) = &self.freed {
            freed.record(token);
        }
        if let Some(count) = &self.in_flight {
            count.fetch_sub(1, Relaxed);
        }
    }
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
            also: None,
        }
    }

    /// Counts the request in `also`'s requests in flight until released, and has `also` remember
    /// `token` (the endpoint's; [`NOTHING`](crate::memory::NOTHING) for none) then.
    pub(crate) fn releasing_to(mut self, also: Arc<OnRelease>, token: u64) -> Self {
        also.claimed();
        self.also = Some((also, token));
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
        if let Some((also, token)) = &self.also {
            also.released(*token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::Clock, load::LoadMetric, memory::NOTHING};
    use std::time::Duration;

    fn load() -> Arc<EndpointLoad> {
        let metric = LoadMetric::InFlight;
        Arc::new(EndpointLoad::new(
            Clock::mock().0,
            &metric,
            Duration::from_millis(1),
        ))
    }

    #[test]
    fn a_balancer_with_neither_memory_nor_affinity_gives_its_guards_nothing_more_to_do() {
        assert!(OnRelease::new(false, false).is_none());
    }

    #[test]
    fn guards_count_in_flight_and_remember_what_they_freed_once_each() {
        let also = OnRelease::new(true, true).expect("remembers and counts");
        let token = LastFreed::token(3, 1);
        let first = LoadGuard::new(load(), None).releasing_to(also.clone(), token);
        let unknown = LoadGuard::new(load(), None).releasing_to(also.clone(), NOTHING);
        assert_eq!(also.in_flight(), 2);
        drop(unknown);
        let freed = also.freed().expect("remembers");
        assert_eq!((also.in_flight(), freed.take(3)), (1, [None, None]));
        drop(first);
        assert_eq!((also.in_flight(), freed.take(3)), (0, [Some(1), None]));
    }

    #[test]
    fn counting_from_a_balancer_with_memory_keeps_what_it_remembers() {
        let remembering = OnRelease::new(true, false).expect("remembers");
        drop(
            LoadGuard::new(load(), None).releasing_to(remembering.clone(), LastFreed::token(5, 2)),
        );
        assert_eq!(remembering.in_flight(), 0, "counts nothing");
        let counting = OnRelease::counting(Some(&remembering), true);
        let freed = counting.freed().expect("still remembers");
        assert_eq!(freed.take(5), [Some(2), None]);
        assert!(OnRelease::counting(None, false).freed().is_none());
    }
}
