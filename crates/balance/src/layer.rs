//! A balancer over a fixed list of endpoints that share one inner service, built as a tower `Layer`.

use crate::{balancer::Balancer, strategy::Strategy};
use std::{
    hash::Hash,
    task::{Context, Poll},
};
use tower::load::CompleteOnResponse;
use tower_layer::Layer;
use tower_service::Service;

/// Balances over a fixed list of endpoints that all share one inner service, such as a pooled client
/// that dials whatever address the request names.
///
/// Each endpoint's service is a [`SharedEndpoint`]: a clone of the inner service that [`Stamp`]s the
/// chosen key on the request before calling it; the inner service reads it to know where to send. An
/// `http::Request` carries it in its extensions as [`Picked<K>`]; any other request type that
/// implements [`Stamp`] can be balanced the same way. Every [`Layer::layer`] call builds a new,
/// independent balancer (its own state and generator).
///
/// ```
/// use duet_balance::{BalanceLayer, Picked, Strategy};
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), duet_balance::BoxError> {
/// let client = service_fn(|request: http::Request<()>| async move {
///     let Picked(address) = request.extensions().get::<Picked<&str>>().copied().ok_or("no pick")?;
///     Ok::<_, duet_balance::BoxError>(address)
/// });
/// let layer = BalanceLayer::new(Strategy::P2cInflight, [("10.0.0.1:80", 1), ("10.0.0.2:80", 1)]);
/// let mut balance = layer.layer(client);
/// let sent_to = balance.ready().await?.call(http::Request::new(())).await?;
/// assert!(sent_to.starts_with("10.0.0."));
/// # Ok(())
/// # }
/// ```
///
/// Beyond HTTP, the request says where it goes itself (here a query that names its replica). The
/// balancer counts a request until its response arrives ([`CompleteOnResponse`]); only HTTP has a
/// body whose end can be waited for ([`CompleteOnBodyEnd`](crate::CompleteOnBodyEnd)).
///
/// ```
/// use duet_balance::{BalanceLayer, Stamp, Strategy};
/// use std::convert::Infallible;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// struct Query {
///     sql: &'static str,
///     replica: Option<&'static str>,
/// }
///
/// impl Stamp<&'static str> for Query {
///     fn stamp(&mut self, replica: &&'static str) {
///         self.replica = Some(*replica);
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), duet_balance::BoxError> {
/// let connections = service_fn(|query: Query| async move { Ok::<_, Infallible>(query.replica) });
/// let replicas = BalanceLayer::new(Strategy::P2cPeakEwma, [("replica-a", 3), ("replica-b", 1)]);
/// let mut balance = replicas.layer(connections);
/// let query = Query { sql: "SELECT 1", replica: None };
/// let replica = balance.ready().await?.call(query).await?;
/// assert!(matches!(replica, Some("replica-a" | "replica-b")));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct BalanceLayer<K, C = CompleteOnResponse> {
    endpoints: Vec<(K, u32)>,
    strategy: Strategy,
    completion: C,
}

/// The key of the endpoint a [`SharedEndpoint`] sent the request to, in `http::Request::extensions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Picked<K>(pub K);

/// A request that can carry the key of the endpoint picked for it, so that the inner service shared by
/// a [`BalanceLayer`]'s endpoints knows where to send it. `http::Request` carries it as [`Picked<K>`]
/// in its extensions; implement it for another request type to balance that.
pub trait Stamp<K> {
    /// Records `key` as the endpoint picked for this request.
    fn stamp(&mut self, key: &K);
}

/// An endpoint served by a shared inner service (a pooled client that dials whatever address the
/// request names): [`Stamp`]s each request with its key and forwards it.
#[derive(Debug, Clone)]
pub struct SharedEndpoint<K, S> {
    key: K,
    inner: S,
}

// === impl BalanceLayer ===

impl<K> BalanceLayer<K> {
    /// A layer balancing over `endpoints`, given as `(key, weight)`, by `strategy`.
    pub fn new(strategy: Strategy, endpoints: impl IntoIterator<Item = (K, u32)>) -> Self {
        Self {
            endpoints: endpoints.into_iter().collect(),
            strategy,
            completion: CompleteOnResponse::default(),
        }
    }
}

impl<K, C> BalanceLayer<K, C> {
    /// Uses `completion` (e.g. [`CompleteOnBodyEnd`](crate::CompleteOnBodyEnd)) in the balancers it builds.
    pub fn with_completion<C2>(self, completion: C2) -> BalanceLayer<K, C2> {
        BalanceLayer {
            endpoints: self.endpoints,
            strategy: self.strategy,
            completion,
        }
    }
}

impl<K, C, S> Layer<S> for BalanceLayer<K, C>
where
    K: Hash + Eq + Clone,
    C: Clone,
    S: Clone,
{
    type Service = Balancer<K, SharedEndpoint<K, S>, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut balance = Balancer::new(self.strategy).with_completion(self.completion.clone());
        for (key, weight) in &self.endpoints {
            let endpoint = SharedEndpoint::new(key.clone(), inner.clone());
            balance.insert(key.clone(), *weight, endpoint);
        }
        balance
    }
}

// === impl SharedEndpoint ===

impl<K, S> SharedEndpoint<K, S> {
    /// The endpoint `key`, served by `inner`: what to [`Balancer::insert`] to add an endpoint to a balancer
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

impl<K, S, Req> Service<Req> for SharedEndpoint<K, S>
where
    Req: Stamp<K>,
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Req) -> Self::Future {
        request.stamp(&self.key);
        self.inner.call(request)
    }
}

// === impl Stamp ===

impl<K, B> Stamp<K> for http::Request<B>
where
    K: Clone + Send + Sync + 'static,
{
    fn stamp(&mut self, key: &K) {
        self.extensions_mut().insert(Picked(key.clone()));
    }
}
