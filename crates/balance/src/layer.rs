use crate::{balancer::Balance, load::LoadMetric, policy::Policy};
use std::{
    hash::Hash,
    task::{Context, Poll},
};
use tower::load::CompleteOnResponse;
use tower_layer::Layer;
use tower_service::Service;

/// Balances over a fixed list of endpoints that all share one inner HTTP service, such as a pooled
/// client that dials whatever address the request names.
///
/// Each endpoint's service is a [`SharedEndpoint`]: a clone of the inner service that stamps the chosen key into
/// the request's extensions as [`Picked<K>`] before calling it; the inner service reads it to know where
/// to send. Every [`Layer::layer`] call builds a new, independent balancer (its own state and generator).
///
/// ```
/// use duet_balance::{BalanceLayer, LoadMetric, Picked};
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), duet_balance::BoxError> {
/// let client = service_fn(|request: http::Request<()>| async move {
///     let Picked(address) = request.extensions().get::<Picked<&str>>().copied().ok_or("no pick")?;
///     Ok::<_, duet_balance::BoxError>(address)
/// });
/// let layer = BalanceLayer::new(LoadMetric::InFlight, [("10.0.0.1:80", 1), ("10.0.0.2:80", 1)]);
/// let mut balance = layer.layer(client);
/// let sent_to = balance.ready().await?.call(http::Request::new(())).await?;
/// assert!(sent_to.starts_with("10.0.0."));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct BalanceLayer<K, C = CompleteOnResponse> {
    endpoints: Vec<(K, u32)>,
    metric: LoadMetric,
    policy: Policy,
    completion: C,
}

/// The key of the endpoint a [`SharedEndpoint`] sent the request to, in `http::Request::extensions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Picked<K>(pub K);

/// An endpoint served by a shared inner service (a pooled client that dials whatever address the
/// request names): tags each request with [`Picked`] and forwards it.
#[derive(Debug, Clone)]
pub struct SharedEndpoint<K, S> {
    key: K,
    inner: S,
}

// === impl BalanceLayer ===

impl<K> BalanceLayer<K> {
    /// A layer balancing over `endpoints`, given as `(key, weight)`.
    pub fn new(metric: LoadMetric, endpoints: impl IntoIterator<Item = (K, u32)>) -> Self {
        Self {
            endpoints: endpoints.into_iter().collect(),
            metric,
            policy: Policy::P2c,
            completion: CompleteOnResponse::default(),
        }
    }
}

impl<K, C> BalanceLayer<K, C> {
    /// Uses `completion` (e.g. [`CompleteOnBodyEnd`](crate::CompleteOnBodyEnd)) in the balancers it builds.
    pub fn with_completion<C2>(self, completion: C2) -> BalanceLayer<K, C2> {
        BalanceLayer {
            endpoints: self.endpoints,
            metric: self.metric,
            policy: self.policy,
            completion,
        }
    }

    /// Uses `policy` in the balancers it builds.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }
}

impl<K, C, S> Layer<S> for BalanceLayer<K, C>
where
    K: Hash + Eq + Clone,
    C: Clone,
    S: Clone,
{
    type Service = Balance<K, SharedEndpoint<K, S>, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut balance = Balance::new(self.metric.clone())
            .with_policy(self.policy)
            .with_completion(self.completion.clone());
        for (key, weight) in &self.endpoints {
            let endpoint = SharedEndpoint::new(key.clone(), inner.clone());
            balance.insert(key.clone(), *weight, endpoint);
        }
        balance
    }
}

// === impl SharedEndpoint ===

impl<K, S> SharedEndpoint<K, S> {
    /// The endpoint `key`, served by `inner`: what to [`Balance::insert`] to add an endpoint to a balancer
    /// a [`BalanceLayer`] built.
    pub fn new(key: K, inner: S) -> Self {
        Self { key, inner }
    }

    /// The endpoint's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The shared inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<K, S, B> Service<http::Request<B>> for SharedEndpoint<K, S>
where
    K: Clone + Send + Sync + 'static,
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(Picked(self.key.clone()));
        self.inner.call(request)
    }
}
