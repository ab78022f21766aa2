//! The tower layer: `poll_ready` picks and polls the picked endpoint's readiness (passing over one that
//! is not ready, evicting one that failed), `call` claims the reserved endpoint and sends; and a
//! balancer is a [`Load`], so balancers nest.

use crate::{
    balancer::{Balancer, Reserved},
    error::{BoxError, NoEligibleEndpoint, NotReady},
    future::ResponseFuture,
    guard::LoadGuard,
};
use std::{
    hash::Hash,
    task::{Context, Poll},
};
use tower::load::{Load, TrackCompletion};
use tower_service::Service;

/// Picks one `poll_ready` makes before it waits on an endpoint that is not ready.
pub(crate) const MAX_PICKS: u32 = 3;

impl<K, S, C> Balancer<K, S, C>
where
    K: Hash + Eq + Clone,
{
    /// Like `poll_ready`, but never picks an endpoint whose key is in `exclude`: a retry re-picks with
    /// P2C among the endpoints not tried yet, with the weights a first pick would use. Then `call` sends
    /// to the endpoint picked. A pick already reserved by `poll_ready` is kept only if its endpoint is
    /// not excluded.
    pub fn poll_ready_excluding<Req>(
        &mut self,
        cx: &mut Context<'_>,
        exclude: &[K],
    ) -> Poll<Result<(), BoxError>>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        C: TrackCompletion<LoadGuard, S::Response>,
    {
        // A pick reserved by an earlier `poll_ready` that names an excluded endpoint is given up: the
        // caller asked for anything but it.
        if let Reserved::Endpoint { position, .. } = self.reserved_now() {
            if exclude.contains(&self.endpoints.at(position).key) {
                self.reserved = Reserved::None;
            }
        }
        self.poll_pick::<Req>(cx, exclude)
    }

    /// The reserved pick, if the candidates have not changed since it was made (a membership change
    /// moves positions and may rule the endpoint out: the pick is made again).
    #[inline]
    fn reserved_now(&self) -> Reserved {
        let made_for = match self.reserved {
            // The common case (every `poll_ready` after a `call`) answered first and alone.
            Reserved::None => return Reserved::None,
            Reserved::Endpoint { generation, .. } | Reserved::NoEligible { generation } => {
                generation
            }
        };
        if made_for == self.endpoints.candidates().generation() {
            self.reserved
        } else {
            Reserved::None
        }
    }

    fn reserve(&mut self, position: usize, picked_at: Option<u64>) {
        self.reserved = Reserved::Endpoint {
            position,
            picked_at,
            generation: self.endpoints.candidates().generation(),
        };
    }

    /// Picks an endpoint not in `exclude` and polls its service's readiness. One that is not ready is
    /// passed over for another pick among the rest (up to three picks per call, after which, or
    /// when no other candidate is left, the last one's readiness is awaited: its waker is registered).
    /// One whose readiness fails is evicted ([`PickStats::evicted`](crate::PickStats::evicted)) and
    /// another is picked. With nothing eligible it is ready, and `call` fails with
    /// [`NoEligibleEndpoint`].
    fn poll_pick<Req>(&mut self, cx: &mut Context<'_>, exclude: &[K]) -> Poll<Result<(), BoxError>>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        // Endpoints found not ready in this call, left out of the next pick (allocated only then).
        let mut pending: Vec<K> = Vec::new();
        loop {
            let (at, picked_at) = match self.reserved_now() {
                Reserved::Endpoint { position, .. } => (position, None),
                Reserved::NoEligible { .. } => return Poll::Ready(Ok(())),
                Reserved::None => match self.pick_excluding(exclude, &pending) {
                    Ok(picked) => picked,
                    Err(NoEligibleEndpoint) => return self.settle(pending.last()),
                },
            };
            match self.endpoints.at_mut(at).service.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    self.reserve(at, picked_at);
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending if pending.len() + 1 >= MAX_PICKS as usize => {
                    self.reserve(at, None);
                    return Poll::Pending;
                }
                Poll::Pending => {
                    self.shared.counters.repicks.add(1);
                    pending.push(self.endpoints.at(at).key.clone());
                    self.reserved = Reserved::None;
                }
                Poll::Ready(Err(_)) => {
                    self.shared.counters.evicted.add(1);
                    let key = self.endpoints.at(at).key.clone();
                    self.remove(&key);
                }
            }
        }
    }

    /// No candidate is left: wait for the last one found not ready, if any.
    fn settle(&mut self, last_pending: Option<&K>) -> Poll<Result<(), BoxError>> {
        if let Some(at) = last_pending.and_then(|key| self.endpoints.position(key)) {
            self.reserve(at, None);
            return Poll::Pending;
        }
        // Ready, so that `call` can answer this request with the error; the next request picks again
        // and may find an endpoint re-admitted.
        self.reserved = Reserved::NoEligible {
            generation: self.endpoints.candidates().generation(),
        };
        Poll::Ready(Ok(()))
    }
}

impl<K, S, C, Req> Service<Req> for Balancer<K, S, C>
where
    K: Hash + Eq + Clone,
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: TrackCompletion<LoadGuard, S::Response>,
{
    type Response = C::Output;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    /// See [`Balancer::poll_ready_excluding`] with nothing excluded: a pending endpoint is passed over
    /// for another pick (up to three), a failed one evicted.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_pick::<Req>(cx, &[])
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let reserved = self.reserved_now();
        self.reserved = Reserved::None;
        let completion = self.completion.clone();
        match reserved {
            Reserved::Endpoint {
                position,
                picked_at,
                ..
            } => {
                let (_, service, guard) = self.claim((position, picked_at));
                ResponseFuture::called(service.call(request), guard, completion)
            }
            Reserved::NoEligible { .. } => {
                ResponseFuture::failed(NoEligibleEndpoint.into(), completion)
            }
            Reserved::None => ResponseFuture::failed(NotReady.into(), completion),
        }
    }
}

/// The balancer's load, so that a balancer can be an endpoint of another (zones of clusters): the mean
/// over its eligible endpoints of the load it compares them on (weighted as in a pick, or their own
/// [`Balancer::with_service_load`]), `f64::INFINITY` when none is eligible.
///
/// The mean, because a request sent to this balancer lands on one of two randomly drawn endpoints, not on
/// its least loaded one: the minimum would make a pool with one idle endpoint look idle however busy the
/// rest are. Not the sum, which would make a large pool look busier than a small one at the same load
/// per endpoint. Reading it costs O(n).
impl<K, S, C> Load for Balancer<K, S, C> {
    type Metric = f64;

    fn load(&self) -> f64 {
        let candidates = self.endpoints.candidates();
        if candidates.len() == 0 {
            return f64::INFINITY;
        }
        let (metric, now) = (self.endpoints.metric(), self.endpoints.clock().now());
        let total: f64 = (0..candidates.len())
            .map(|slot| {
                let endpoint = self.endpoints.at(candidates.position(slot));
                if let Some(service_load) = self.service_load {
                    return service_load(&endpoint.service);
                }
                match candidates.weights() {
                    Some(weights) => metric.weighted_load(&endpoint.load, now, weights.unit(slot)),
                    None => metric.load(&endpoint.load, now),
                }
            })
            .sum();
        total / candidates.len() as f64
    }
}
