//! Following a membership stream: tower's [`Discover`], applied inside `poll_ready`, plus a handle for
//! what `Discover` cannot say (weights, eligibility).

use crate::{
    balancer::Balancer,
    error::BoxError,
    future::ResponseFuture,
    guard::LoadGuard,
    handle::{BalanceHandle, PickStats},
    strategy::Strategy,
    weighted::Weighted,
};
use std::{
    fmt,
    hash::Hash,
    pin::Pin,
    task::{Context, Poll},
};
use tower::{
    discover::{Change, Discover},
    load::{CompleteOnResponse, Load, TrackCompletion},
};
use tower_service::Service;

/// A [`Balancer`] whose endpoints come from a [`Discover`] stream: each `poll_ready` first applies every
/// change the stream has ready (`Change::Insert` adds an endpoint, or replaces the service of an
/// existing key, keeping its load state; `Change::Remove` removes it), then picks. So a balancer behind
/// [`tower::buffer::Buffer`](https://docs.rs/tower/latest/tower/buffer/struct.Buffer.html) keeps
/// following its membership: the buffer's worker polls it.
///
/// **Weights** come with the endpoints when the stream announces [`Weighted`] services and the balancer
/// is built [`with_weights`](Self::with_weights): each insert sets the weight it carries, and inserting
/// a key again with another weight changes it in place (load state kept). Otherwise a new endpoint has
/// weight 1 and a re-inserted one keeps its weight. A [`BalanceHandle`] (cloneable, kept before the
/// balancer is moved into a `Buffer`) also sets weights and eligibility; its updates are applied at the
/// next `poll_ready`, in the order they were made, after the stream's changes.
///
/// **What else an endpoint carries.** Its key is its id: the one [`Affinity`](crate::Affinity)
/// hashes for keyed picks ([`balance_mut`](Self::balance_mut) shows them over a discovered set), so
/// announce endpoints under an id that stays when it should keep its keys (a replica's name rather
/// than an address that changes on restart). Weight and id are all the balancer uses of an endpoint:
/// it has no notion of zone or locality, so a stream has none to carry. Zones sit a level above: a
/// balancer per zone, each an endpoint of an outer balancer that compares their loads
/// ([`Balancer::with_service_load`]; a balancer is a [`Load`]).
///
/// A stream that ends leaves the last membership in place; a stream that fails makes `poll_ready` fail
/// with its error (as tower's balancer does), and the next `poll_ready` polls the stream again.
///
/// ```
/// use duet_balance::{DiscoverBalancer, Strategy};
/// use std::convert::Infallible;
/// use tower::{buffer::Buffer, discover::Change, service_fn, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), duet_balance::BoxError> {
/// let backend = |name: &'static str| service_fn(move |_: ()| async move { Ok::<_, Infallible>(name) });
/// let (changes, mut announced) = tokio::sync::mpsc::unbounded_channel();
/// let discover = futures_util::stream::poll_fn(move |cx| announced.poll_recv(cx));
/// let balance = DiscoverBalancer::new(discover, Strategy::P2cInflight);
/// let handle = balance.handle();
/// // Shared by every clone of the Buffer; the buffer's worker task drives the balancer.
/// let mut shared = Buffer::new(balance, 64);
///
/// changes.send(Ok::<_, Infallible>(Change::Insert("a", backend("a"))))?;
/// assert_eq!(shared.ready().await?.call(()).await?, "a");
///
/// changes.send(Ok(Change::Insert("b", backend("b"))))?;
/// handle.set_eligible("a", false);
/// assert_eq!(shared.ready().await?.call(()).await?, "b");
/// # Ok(())
/// # }
/// ```
pub struct DiscoverBalancer<D, C = CompleteOnResponse>
where
    D: Discover,
{
    discover: D,
    /// The stream ended: never polled again.
    ended: bool,
    balance: Balancer<D::Key, D::Service, C>,
    /// The weight an inserted service carries, if the balancer honours it ([`Self::with_weights`]).
    weigh: fn(&D::Service) -> Option<u32>,
}

impl<D> DiscoverBalancer<D, CompleteOnResponse>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone,
{
    /// A balancer over the endpoints `discover` announces, choosing by `strategy`.
    pub fn new(discover: D, strategy: Strategy) -> Self {
        Self::from_balance(discover, Balancer::new(strategy))
    }
}

impl<D, C> DiscoverBalancer<D, C>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone,
{
    /// Follows `discover` with a balancer configured beforehand (completion, policy, slow start...); its
    /// existing endpoints stay until the stream removes them.
    pub fn from_balance(discover: D, balance: Balancer<D::Key, D::Service, C>) -> Self {
        Self {
            discover,
            ended: false,
            balance,
            weigh: |_| None,
        }
    }

    /// A cloneable handle that reads the balancer's counters and endpoints and sets weights and
    /// eligibility, also once it has moved into a `Buffer` (see [`Balancer::handle`]).
    pub fn handle(&self) -> BalanceHandle<D::Key> {
        self.balance.handle()
    }

    /// The balancer, as of the last `poll_ready`.
    pub fn balance(&self) -> &Balancer<D::Key, D::Service, C> {
        &self.balance
    }

    /// The balancer, mutably: for what the tower interface cannot ask, such as a keyed pick
    /// ([`Balancer::pick_and_claim_for`]) over the discovered endpoints. Apply the stream's changes
    /// first ([`poll_changes`](Self::poll_changes)); `poll_ready` does so before its own pick.
    ///
    /// The keys the stream announces are the endpoints' ids, and the ones [`Affinity`](crate::Affinity)
    /// hashes: every balancer that discovers the same keys (and weights) sends a request key to the
    /// same endpoint, whatever the order they were announced in.
    ///
    /// ```
    /// use duet_balance::{algo::stable_hash, Affinity, Balancer, DiscoverBalancer, Strategy};
    /// use std::convert::Infallible;
    /// use tower::{discover::Change, service_fn, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), duet_balance::BoxError> {
    /// let backend = |name: &'static str| service_fn(move |_: ()| async move { Ok::<_, Infallible>(name) });
    /// let changes = futures_util::stream::iter(
    ///     ["a", "b", "c"].map(|name| Ok::<_, Infallible>(Change::Insert(name, backend(name)))),
    /// );
    /// let keyed = Balancer::new(Strategy::P2cPeakEwma).with_affinity(Affinity::maglev());
    /// let mut balance = DiscoverBalancer::from_balance(changes, keyed);
    ///
    /// std::future::poll_fn(|cx| balance.poll_changes(cx)).await?;
    /// let mut served = Vec::new();
    /// for _ in 0..3 {
    ///     let (_, service, guard) = balance.balance_mut().pick_and_claim_for(Some(stable_hash("user-42")), &[])?;
    ///     served.push(service.ready().await?.call(()).await?);
    ///     drop(guard); // the request is done: its load is released
    /// }
    /// assert!(served.iter().all(|name| *name == served[0]), "one key, one endpoint: {served:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn balance_mut(&mut self) -> &mut Balancer<D::Key, D::Service, C> {
        &mut self.balance
    }

    /// The selection counters.
    pub fn stats(&self) -> PickStats {
        self.balance.stats()
    }

    /// Applies every change the stream has ready, without picking (`poll_ready` does this, then
    /// picks): for picks made through [`balance_mut`](Self::balance_mut). Always ready: what the
    /// stream has not announced yet waits for the next call, which `cx` is woken for. Fails with the
    /// stream's error, as `poll_ready` does.
    pub fn poll_changes(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>>
    where
        D::Error: Into<BoxError>,
    {
        Poll::Ready(self.follow(cx))
    }

    /// Applies every change the stream has ready (the pick that follows applies the handles' updates,
    /// so a handle may set the weight of an endpoint the stream has just announced).
    fn follow(&mut self, cx: &mut Context<'_>) -> Result<(), BoxError>
    where
        D::Error: Into<BoxError>,
    {
        while !self.ended {
            match Pin::new(&mut self.discover).poll_discover(cx) {
                Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                    let weight = (self.weigh)(&service).unwrap_or_else(|| {
                        self.balance
                            .endpoints()
                            .find(|e| *e.key == key)
                            .map_or(1, |e| e.weight)
                    });
                    self.balance.insert(key, weight, service);
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    self.balance.remove(&key);
                }
                Poll::Ready(Some(Err(error))) => return Err(error.into()),
                Poll::Ready(None) => self.ended = true,
                Poll::Pending => break,
            }
        }
        Ok(())
    }
}

impl<D, S, C> DiscoverBalancer<D, C>
where
    D: Discover<Service = Weighted<S>> + Unpin,
    D::Key: Hash + Eq + Clone,
{
    /// Takes each inserted endpoint's weight from the [`Weighted`] value the stream announces (without
    /// this, every new endpoint has weight 1). An insert of a known key with another weight changes its
    /// weight without resetting its load state.
    ///
    /// ```
    /// use duet_balance::{DiscoverBalancer, Strategy, Weighted};
    /// use std::convert::Infallible;
    /// use tower::{discover::Change, service_fn, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), duet_balance::BoxError> {
    /// let backend = |name: &'static str| service_fn(move |_: ()| async move { Ok::<_, Infallible>(name) });
    /// let changes = futures_util::stream::iter([
    ///     Ok::<_, Infallible>(Change::Insert("big", Weighted::new(backend("big"), 3))),
    ///     Ok(Change::Insert("small", Weighted::new(backend("small"), 1))),
    /// ]);
    /// let mut balance = DiscoverBalancer::new(changes, Strategy::P2cInflight).with_weights();
    /// balance.ready().await?;
    /// let weights: Vec<_> = balance.balance().endpoints().map(|e| (*e.key, e.weight)).collect();
    /// assert_eq!(weights, [("big", 3), ("small", 1)]);
    /// # let _ = balance.call(()).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_weights(mut self) -> Self {
        self.weigh = |service| Some(service.weight());
        self
    }
}

impl<D, C, Req> Service<Req> for DiscoverBalancer<D, C>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone,
    D::Error: Into<BoxError>,
    D::Service: Service<Req>,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
    C: TrackCompletion<LoadGuard, <D::Service as Service<Req>>::Response>,
{
    type Response = C::Output;
    type Error = BoxError;
    type Future = ResponseFuture<<D::Service as Service<Req>>::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.follow(cx)?;
        Service::<Req>::poll_ready(&mut self.balance, cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.balance.call(request)
    }
}

/// The balancer's load ([`Balancer`]'s: the mean over its eligible endpoints), as of the last `poll_ready`:
/// so a balancer built from a `Discover` stream can be an endpoint of another balancer that compares
/// `Load`, such as tower's own, which polls every endpoint's readiness (and so this one's stream) before
/// it reads their loads. `f64::INFINITY` while no endpoint is eligible, as before the first `poll_ready`.
impl<D, C> Load for DiscoverBalancer<D, C>
where
    D: Discover,
{
    type Metric = f64;

    fn load(&self) -> f64 {
        self.balance.load()
    }
}

impl<D> fmt::Debug for DiscoverBalancer<D>
where
    D: Discover,
    D::Key: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscoverBalancer")
            .field("balance", &self.balance)
            .finish_non_exhaustive()
    }
}
