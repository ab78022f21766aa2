//! An endpoint that says its weight, for membership streams.

use std::{
    fmt,
    task::{Context, Poll},
};
use tower::load::Load;
use tower_service::Service;

/// A service together with its weight (its capacity: an endpoint of weight 3 is meant to take three
/// times the requests of one of weight 1), as a [`Discover`](tower::discover::Discover) stream announces
/// it: `Change::Insert(key, Weighted::new(service, 3))`.
///
/// [`DiscoverBalancer::with_weights`](crate::DiscoverBalancer::with_weights) makes a balancer take each
/// inserted endpoint's weight from it. Inserting a key again with another weight changes the weight
/// and keeps the endpoint's load state (in flight, latency estimate, picks): no need to remove it
/// first. Weight 0 takes the endpoint out of rotation.
///
/// It is a service itself (calls go to the inner service), so the balancer keeps it as the endpoint.
///
/// ```
/// use duet_balance::Weighted;
/// use tower::service_fn;
///
/// let backend = Weighted::new(service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) }), 3);
/// assert_eq!(backend.weight(), 3);
/// ```
#[derive(Clone)]
pub struct Weighted<S> {
    service: S,
    weight: u32,
}

impl<S> Weighted<S> {
    /// `service` with `weight`.
    pub fn new(service: S, weight: u32) -> Self {
        Self { service, weight }
    }

    /// The weight it was announced with (the balancer's copy may since have been changed through a
    /// [`BalanceHandle`](crate::BalanceHandle)).
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.service
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.service
    }

    /// The inner service, taken out.
    pub fn into_inner(self) -> S {
        self.service
    }
}

impl<S, Req> Service<Req> for Weighted<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.service.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Req) -> S::Future {
        self.service.call(request)
    }
}

/// The inner service's load, for [`Balancer::with_service_load`](crate::Balancer::with_service_load).
impl<S: Load> Load for Weighted<S> {
    type Metric = S::Metric;

    fn load(&self) -> S::Metric {
        self.service.load()
    }
}

impl<S> fmt::Debug for Weighted<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Weighted")
            .field("weight", &self.weight)
            .finish_non_exhaustive()
    }
}
