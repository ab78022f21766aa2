//! The balancer: an endpoint set, a policy, and what a pick leaves behind (the claimed load, the
//! counters, the observer's event). The tower `Service` is built on it (`service.rs`).

use crate::{
    affinity::{Affinity, Hashing, Keyed},
    candidates::{Candidates, Remaining},
    clock::Clock,
    draw::Draws,
    endpoints::EndpointSet,
    error::NoEligibleEndpoint,
    guard::{LoadGuard, OnRelease},
    handle::{BalanceHandle, Counters, EndpointStats, PickStats, Shared, Update},
    load::{EndpointLoad, PeakEwmaConfig},
    memory::{self, LastFreed},
    p2c::{P2c, Selection},
    policy::{self, Policy, Turns},
    strategy::Strategy,
};
use std::{fmt, hash::Hash, sync::Arc, time::Duration};
use tower::load::CompleteOnResponse;

/// One P2C comparison, as passed to an observer set with [`Balancer::with_observer`].
///
/// ```
/// use duet_balance::{Balancer, Strategy};
/// use std::sync::{atomic::{AtomicU64, Ordering::Relaxed}, Arc};
///
/// let ties = Arc::new(AtomicU64::new(0));
/// let seen = ties.clone();
/// let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 1)
///     .with_observer(move |event| {
///         assert!(event.both_zero, "nothing in flight");
///         seen.fetch_add(u64::from(event.tie), Relaxed);
///     });
/// balance.insert("a", 1, ());
/// balance.insert("b", 1, ());
/// balance.pick()?; // both idle: equal loads, settled by a coin
/// assert_eq!(ties.load(Relaxed), 1);
/// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PickEvent<'a, K> {
    /// The two candidates in draw order, with the (weight-normalised) loads they were compared at.
    pub candidates: [(&'a K, f64); 2],
    /// The winner.
    pub chosen: &'a K,
    /// The loads were equal and a coin flip decided.
    pub tie: bool,
    /// Both loads were zero.
    pub both_zero: bool,
}

type Observer<K> = Arc<dyn Fn(&PickEvent<'_, K>) + Send + Sync>;

/// A pick made by `poll_ready` for the next `call`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reserved {
    None,
    /// The endpoint at `position`, valid while the candidates are those of `generation` (a membership
    /// change moves positions). With the pick's clock reading when the metric uses latency, reused as
    /// the request's start (one clock read saved per request).
    Endpoint {
        position: usize,
        picked_at: Option<u64>,
        generation: u64,
    },
    /// Nothing was eligible among the candidates of `generation`: `call` answers with the error.
    NoEligible {
        generation: u64,
    },
}

/// A picked endpoint's position, and the pick's clock reading when the metric uses latency.
pub(crate) type PickedAt = (usize, Option<u64>);

/// A tower [`Service`](tower_service::Service) that sends each request to one of its endpoints, chosen
/// by power of two choices.
///
/// `K` keys an endpoint (e.g. its address): updates that keep a key keep its load state. `S` is the
/// endpoint's service. `C` decides when a request stops counting as load: [`CompleteOnResponse`] for any
/// response type, [`CompleteOnBodyEnd`](crate::CompleteOnBodyEnd) for HTTP responses.
///
/// Each instance owns its state; two balancers share nothing. Membership changes
/// ([`insert`](Self::insert), [`remove`](Self::remove), [`set_eligible`](Self::set_eligible),
/// [`set_weight`](Self::set_weight)) apply at once and cost O(n); a pick costs O(1).
///
/// As a tower service it picks in `poll_ready` and sends in `call` (the crate docs' example); a caller
/// that forwards requests itself picks and claims, and the [`LoadGuard`] it gets holds the load:
///
/// ```
/// use duet_balance::{Balancer, NoEligibleEndpoint, Strategy};
///
/// let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 1);
/// balance.insert("a", 1, ());
/// balance.insert("b", 1, ());
///
/// let (&picked, _, guard) = balance.pick_and_claim()?;
/// assert_eq!(balance.endpoint_load(&picked).map(|l| l.in_flight()), Some(1));
/// drop(guard); // the request is done
/// assert_eq!(balance.endpoint_load(&picked).map(|l| l.in_flight()), Some(0));
///
/// balance.set_eligible(&"a", false);
/// balance.set_weight(&"b", 0);
/// assert_eq!(balance.pick().err(), Some(NoEligibleEndpoint));
/// # Ok::<(), NoEligibleEndpoint>(())
/// ```
pub struct Balancer<K, S, C = CompleteOnResponse> {
    pub(crate) endpoints: EndpointSet<K, S>,
    strategy: Strategy,
    /// The strategy's selection rule.
    policy: Policy,
    p2c: P2c,
    turns: Turns,
    /// Counters, endpoint list and queued updates, shared with [`BalanceHandle`]s.
    pub(crate) shared: Arc<Shared<K>>,
    observer: Option<Observer<K>>,
    /// Set by [`Balancer::with_service_load`]: P2C compares the endpoints' own `Load` instead of the
    /// metric's.
    pub(crate) service_load: Option<fn(&S) -> f64>,
    /// The slots a pick excludes, ascending: kept between picks so a retry allocates nothing.
    excluded: Vec<u32>,
    /// Under [`Policy::P2cMemory`] or with affinity: what the guards also do on release (remember the
    /// endpoints requests completed on last, count the requests in flight).
    on_release: Option<Arc<OnRelease>>,
    /// Under [`Policy::LeastLoaded`]: the slots tied at the minimum, kept between picks so a scan
    /// allocates nothing.
    tied: Vec<usize>,
    /// Set by [`Balancer::with_affinity`]: the table keyed picks use.
    hashing: Option<Hashing>,
    pub(crate) completion: C,
    pub(crate) reserved: Reserved,
}

// === impl Balancer: construction ===

impl<K, S> Balancer<K, S, CompleteOnResponse>
where
    K: Hash + Eq + Clone,
{
    /// An empty balancer choosing by `strategy` (`p2c_peak_ewma`...: the names duet's config uses),
    /// with its generator seeded from the operating system.
    pub fn new(strategy: Strategy) -> Self {
        Self::with_draws(strategy, Draws::from_os())
    }

    /// An empty balancer with reproducible draws. For tests and simulation; see [`Draws`].
    pub fn with_seed(strategy: Strategy, seed: u64) -> Self {
        Self::with_draws(strategy, Draws::with_seed(seed))
    }

    /// An empty balancer drawing from `draws`.
    pub fn with_draws(strategy: Strategy, draws: Draws) -> Self {
        let policy = strategy.policy();
        Self {
            endpoints: EndpointSet::new(strategy.metric()),
            strategy,
            policy,
            p2c: P2c::with_draws(draws),
            turns: Turns::default(),
            shared: Arc::default(),
            observer: None,
            service_load: None,
            excluded: Vec::new(),
            on_release: OnRelease::new(policy == Policy::P2cMemory, false),
            tied: Vec::new(),
            hashing: None,
            completion: CompleteOnResponse::default(),
            reserved: Reserved::None,
        }
    }
}

impl<K, S, C> Balancer<K, S, C>
where
    K: Hash + Eq + Clone,
{
    /// Uses `completion` to decide when a request stops counting as load.
    pub fn with_completion<C2>(self, completion: C2) -> Balancer<K, S, C2> {
        Balancer {
            endpoints: self.endpoints,
            strategy: self.strategy,
            policy: self.policy,
            p2c: self.p2c,
            turns: self.turns,
            shared: self.shared,
            observer: self.observer,
            service_load: self.service_load,
            excluded: self.excluded,
            on_release: self.on_release,
            tied: self.tied,
            hashing: self.hashing,
            completion,
            reserved: Reserved::None,
        }
    }

    /// Compares endpoints on their services' own [`tower::load::Load`] instead of the balancer's
    /// strategy's metric: the open end of the metrics, for endpoints that know their load better (a
    /// connection pool's queue, a server-reported utilisation, a nested balancer). Two loads are still
    /// read per pick (every one under a full scan) and the lighter wins; the balancer keeps
    /// counting in flight and latency (for [`EndpointLoad`] readers) whatever it compares. Weights
    /// divide nothing here: a service's own load is taken as already relative to its capacity.
    pub fn with_service_load(mut self) -> Self
    where
        S: tower::load::Load,
        S::Metric: Into<f64>,
    {
        self.service_load = Some(|service: &S| service.load().into());
        self
    }

    /// Measures latency with `config` (time constant, the estimate of a new endpoint, when the sample
    /// is taken, the penalty for a failure) instead of the defaults, under the strategies that measure
    /// it (PeakEWMA, and `least_inflight`'s latency average); the others measure no latency and ignore
    /// it. Endpoints already added keep their estimates.
    ///
    /// ```
    /// use duet_balance::{Balancer, PeakEwmaConfig, Strategy};
    /// use std::time::Duration;
    ///
    /// let config = PeakEwmaConfig { decay: Duration::from_secs(2), ..PeakEwmaConfig::default() };
    /// let balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cPeakEwma).with_latency_config(config);
    /// assert_eq!(balance.latency_config().map(|c| c.decay), Some(Duration::from_secs(2)));
    /// ```
    pub fn with_latency_config(mut self, config: PeakEwmaConfig) -> Self {
        self.endpoints.set_latency_config(config);
        self.reserved = Reserved::None;
        self.publish();
        self
    }

    /// Makes [`pick_and_claim_for`](Self::pick_and_claim_for) pick by consistent hashing with bounded
    /// loads (see [`Affinity`]); picks without a key keep the policy. The table is built here and
    /// rebuilt on every change of the candidates.
    pub fn with_affinity(mut self, affinity: Affinity) -> Self {
        self.hashing = Some(Hashing::new(affinity));
        let remembers = self.policy == Policy::P2cMemory;
        self.on_release = Some(OnRelease::counting(self.on_release.as_deref(), remembers));
        self.sync_hashing();
        self
    }

    /// Panic mode: when fewer than `fraction` (0.0–1.0) of the endpoints with non-zero weight are
    /// eligible, picks among all of them instead, eligible or not. Health information that rules out most
    /// of a pool is more often wrong (a network partition between checker and backends) than true, and
    /// serving through it beats answering every request with an error. With 0.0 (the default) the
    /// balancer never panics and answers [`NoEligibleEndpoint`] when nothing is eligible; Envoy's
    /// default is 0.5.
    pub fn with_panic_threshold(mut self, fraction: f64) -> Self {
        self.endpoints.set_panic_threshold(fraction);
        self
    }

    /// Slow start: an endpoint that is added or re-admitted takes `window` to reach its full weight,
    /// starting at a tenth of it and growing linearly, so a recovering backend is not stampeded. Retries
    /// ([`pick_and_claim_excluding`](Self::pick_and_claim_excluding)) draw with the same ramped weights.
    pub fn with_slow_start(mut self, window: Duration) -> Self {
        self.endpoints.set_slow_start(window);
        self
    }

    /// Measures latency on `clock` (a [`Clock::mock`] in tests and simulations). Endpoints already
    /// added move to it keeping their estimates.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.endpoints.set_clock(clock);
        self.reserved = Reserved::None;
        self.publish();
        self
    }

    /// Whether the balancer is in panic mode (see [`with_panic_threshold`](Self::with_panic_threshold)).
    pub fn is_panicking(&self) -> bool {
        self.endpoints.is_panicking()
    }

    /// Calls `observer` after every P2C comparison with the two candidates, their loads and the winner.
    /// It runs on the request path: keep it to a few counter updates.
    pub fn with_observer(
        mut self,
        observer: impl Fn(&PickEvent<'_, K>) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }
}

// === impl Balancer: membership ===

impl<K, S, C> Balancer<K, S, C>
where
    K: Hash + Eq + Clone,
{
    /// Adds an endpoint, or replaces the service and weight of the endpoint with this key while keeping
    /// its load state and eligibility. Returns the replaced service.
    pub fn insert(&mut self, key: K, weight: u32, service: S) -> Option<S> {
        let replaced = self.endpoints.insert(key, weight, service);
        self.sync_hashing();
        self.publish();
        replaced
    }

    /// Removes an endpoint. Requests in flight to it complete normally; their guards hold its state.
    /// A pick reserved by `poll_ready` is made again (positions move).
    pub fn remove(&mut self, key: &K) -> Option<S> {
        let removed = self.endpoints.remove(key);
        self.sync_hashing();
        self.publish();
        removed
    }

    /// Keeps only the endpoints for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let doomed: Vec<K> = self
            .endpoints
            .keys()
            .filter(|key| !keep(key))
            .cloned()
            .collect();
        for key in &doomed {
            self.remove(key);
        }
    }

    /// Marks an endpoint eligible or not (unhealthy, ejected, draining) without losing its load state.
    /// Returns whether it was eligible before, or `None` if there is no such endpoint.
    ///
    /// The flag lives in the endpoint's [`EndpointLoad`], so a metrics reader on another thread sees the
    /// same flag the balancer picks by: there is no second copy to fall out of step.
    pub fn set_eligible(&mut self, key: &K, eligible: bool) -> Option<bool> {
        // The affinity table keeps an ineligible endpoint: the walk skips it.
        self.endpoints.set_eligible(key, eligible)
    }

    /// Changes an endpoint's weight (0 makes it ineligible). Returns false if there is no such endpoint.
    pub fn set_weight(&mut self, key: &K, weight: u32) -> bool {
        let known = self.endpoints.set_weight(key, weight);
        self.sync_hashing();
        self.publish();
        known
    }

    /// Number of endpoints, eligible or not.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are no endpoints at all.
    pub fn is_empty(&self) -> bool {
        self.endpoints.len() == 0
    }

    /// Number of endpoints that can be picked.
    pub fn eligible_len(&self) -> usize {
        self.endpoints.candidates().len()
    }

    /// The endpoints in insertion order (removal may reorder), as a [`BalanceHandle`] reads them.
    pub fn endpoints(&self) -> impl Iterator<Item = EndpointStats<&K>> {
        self.endpoints.views().map(|view| EndpointStats {
            key: view.key,
            weight: view.weight,
            load: view.load.clone(),
        })
    }

    /// The load state of the endpoint with this key.
    pub fn endpoint_load(&self, key: &K) -> Option<&Arc<EndpointLoad>> {
        let at = self.endpoints.position(key)?;
        Some(&self.endpoints.at(at).load)
    }

    /// The selection counters.
    pub fn stats(&self) -> PickStats {
        self.shared.counters.snapshot()
    }

    /// A cloneable handle that reads this balancer's counters and endpoints and sets weights and
    /// eligibility from anywhere, also once the balancer has moved into a `tower::buffer::Buffer` (see
    /// [`BalanceHandle`]). Its updates apply at the balancer's next pick.
    ///
    /// ```
    /// use duet_balance::{Balancer, Strategy};
    /// use std::convert::Infallible;
    /// use tower::{buffer::Buffer, service_fn, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), duet_balance::BoxError> {
    /// let mut balance = Balancer::new(Strategy::P2cInflight);
    /// for name in ["a", "b"] {
    ///     balance.insert(name, 1, service_fn(move |_: ()| async move { Ok::<_, Infallible>(name) }));
    /// }
    /// let handle = balance.handle();
    /// let mut shared = Buffer::new(balance, 64);
    ///
    /// handle.set_eligible("a", false);
    /// assert_eq!(shared.ready().await?.call(()).await?, "b");
    /// assert_eq!(handle.stats().picks, 1);
    /// let eligible: Vec<_> = handle.endpoints().iter().map(|e| (e.key, e.load.is_eligible())).collect();
    /// assert_eq!(eligible, [("a", false), ("b", true)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn handle(&self) -> BalanceHandle<K> {
        let handle = self.shared.handle();
        self.publish();
        handle
    }

    /// Rebuilds the affinity table if the candidates changed since it was built.
    fn sync_hashing(&mut self) {
        if let Some(hashing) = &mut self.hashing {
            sync(hashing, &self.endpoints);
        }
    }

    /// Hands the endpoint list to handles, if there are any.
    fn publish(&self) {
        if self.shared.is_watched() {
            let views = self.endpoints.views().map(|view| EndpointStats {
                key: view.key.clone(),
                weight: view.weight,
                load: view.load.clone(),
            });
            self.shared.publish(views.collect());
        }
    }

    /// Applies the updates handles have queued, in order.
    #[cold]
    fn apply_updates(&mut self) {
        for update in self.shared.take_updates() {
            match update {
                Update::Weight(key, weight) => {
                    self.set_weight(&key, weight);
                }
                Update::Eligible(key, eligible) => {
                    self.set_eligible(&key, eligible);
                }
            }
        }
    }

    /// The strategy it chooses by.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The latency settings, under a strategy that measures latency (see
    /// [`with_latency_config`](Self::with_latency_config)).
    pub fn latency_config(&self) -> Option<&PeakEwmaConfig> {
        self.endpoints.metric().latency_config()
    }
}

// === impl Balancer: picks ===

impl<K, S, C> Balancer<K, S, C>
where
    K: Hash + Eq + Clone,
{
    /// Picks an endpoint without sending anything: the selection alone, as a request would make it,
    /// counted in [`stats`](Self::stats) but not as load. For simulations and tests.
    pub fn pick(&mut self) -> Result<&K, NoEligibleEndpoint> {
        let (at, _) = self.pick_excluding(&[], &[])?;
        Ok(&self.endpoints.at(at).key)
    }

    /// Picks an endpoint and claims it as [`pick`](Self::pick) then a call would: its load stays
    /// incremented until the returned guard is dropped. For callers that forward requests themselves.
    pub fn pick_and_claim(&mut self) -> Result<(&K, &mut S, LoadGuard), NoEligibleEndpoint> {
        let picked = self.pick_excluding(&[], &[])?;
        Ok(self.claim(picked))
    }

    /// Like [`pick_and_claim`](Self::pick_and_claim), but never picks an endpoint whose key is in
    /// `exclude`: a retry re-picks with P2C among the endpoints not tried yet, with the weights a first
    /// pick would use (slow start included). Costs O(`exclude.len()`) more than a first pick, with no
    /// allocation once the balancer has made a retry with as many exclusions.
    pub fn pick_and_claim_excluding(
        &mut self,
        exclude: &[K],
    ) -> Result<(&K, &mut S, LoadGuard), NoEligibleEndpoint> {
        let picked = self.pick_excluding(exclude, &[])?;
        Ok(self.claim(picked))
    }

    /// Like [`pick_and_claim_excluding`](Self::pick_and_claim_excluding), for a request whose affinity
    /// key hashes to `key` (see [`Affinity`] and [`algo::stable_hash`](crate::algo::stable_hash)): the
    /// key's home while it is under the bound, else the key's next candidates, skipping `exclude`. With
    /// `None`, or without [`with_affinity`](Self::with_affinity), the policy picks.
    pub fn pick_and_claim_for(
        &mut self,
        key: Option<u64>,
        exclude: &[K],
    ) -> Result<(&K, &mut S, LoadGuard), NoEligibleEndpoint> {
        let picked = self.pick_keyed(key, exclude, &[])?;
        Ok(self.claim(picked))
    }

    /// Like [`pick_and_claim_for`](Self::pick_and_claim_for), but first `prefer`: the endpoint a
    /// session is bound to (a sticky cookie names it). It is taken, and claimed like any pick, while
    /// it is a member, eligible (healthy, not ejected: panic mode does not make it so), of non-zero
    /// weight and not in `exclude`; otherwise the key or the policy picks as usual, so a session whose
    /// endpoint went is moved, and a retry never goes back to the endpoint it tried. Load is not
    /// consulted for a preferred endpoint: a session stays where its state is, as nginx's and
    /// HAProxy's sticky sessions do.
    ///
    /// ```
    /// use duet_balance::{Balancer, Strategy};
    ///
    /// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cInflight);
    /// for name in ["a", "b", "c"] {
    ///     balance.insert(name, 1, ());
    /// }
    /// let (picked, _, _guard) = balance.pick_and_claim_preferring(Some(&"b"), None, &[])?;
    /// assert_eq!(*picked, "b");
    /// balance.set_eligible(&"b", false);
    /// let (picked, _, _guard) = balance.pick_and_claim_preferring(Some(&"b"), None, &[])?;
    /// assert_ne!(*picked, "b", "an ineligible preference is re-picked");
    /// let (picked, _, _guard) = balance.pick_and_claim_preferring(Some(&"a"), None, &["a"])?;
    /// assert_ne!(*picked, "a", "a retry never goes back");
    /// # Ok::<(), duet_balance::NoEligibleEndpoint>(())
    /// ```
    pub fn pick_and_claim_preferring(
        &mut self,
        prefer: Option<&K>,
        key: Option<u64>,
        exclude: &[K],
    ) -> Result<(&K, &mut S, LoadGuard), NoEligibleEndpoint> {
        if let Some(at) = prefer.and_then(|prefer| self.preferred(prefer, exclude)) {
            self.shared.counters.picks.add(1);
            return Ok(self.claim((at, None)));
        }
        self.pick_and_claim_for(key, exclude)
    }

    /// The position of `prefer` if a pick may take it: a candidate, eligible, not excluded.
    fn preferred(&mut self, prefer: &K, exclude: &[K]) -> Option<usize> {
        if self.shared.has_updates() {
            self.apply_updates();
        }
        self.endpoints.refresh();
        let at = self.endpoints.position(prefer)?;
        self.endpoints.candidates().slot(at)?;
        let endpoint = self.endpoints.at(at);
        (endpoint.load.is_eligible() && !exclude.contains(prefer)).then_some(at)
    }

    /// Picks as [`pick_and_claim_for`](Self::pick_and_claim_for) would, without claiming: for
    /// simulations and tests.
    pub fn pick_for(&mut self, key: Option<u64>) -> Result<&K, NoEligibleEndpoint> {
        let (at, _) = self.pick_keyed(key, &[], &[])?;
        Ok(&self.endpoints.at(at).key)
    }

    /// Claims the endpoint at `position`: the returned guard holds its load until dropped.
    pub(crate) fn claim(&mut self, (at, picked_at): PickedAt) -> (&K, &mut S, LoadGuard) {
        let started = self.started(picked_at);
        let candidates = self.endpoints.candidates();
        let also = self.on_release.as_ref().map(|on_release| {
            let token = match candidates.slot(at) {
                Some(slot) => LastFreed::token(candidates.generation(), slot),
                None => memory::NOTHING,
            };
            (on_release.clone(), token)
        });
        let endpoint = self.endpoints.at_mut(at);
        let mut guard = LoadGuard::new(endpoint.load.clone(), started);
        if let Some((on_release, token)) = also {
            guard = guard.releasing_to(on_release, token);
        }
        (&endpoint.key, &mut endpoint.service, guard)
    }

    /// A request's start: the pick's clock reading when it made one (one clock read per request, not
    /// two), else now if the metric measures latency.
    #[inline]
    pub(crate) fn started(&self, picked_at: Option<u64>) -> Option<u64> {
        let clock = self.endpoints.clock();
        picked_at.or_else(|| self.endpoints.metric().uses_clock().then(|| clock.now()))
    }

    /// Picks among the candidates whose keys are in neither `exclude` nor `also`, by the policy, and
    /// counts the pick.
    #[inline]
    pub(crate) fn pick_excluding(
        &mut self,
        exclude: &[K],
        also: &[K],
    ) -> Result<PickedAt, NoEligibleEndpoint> {
        self.pick_keyed(None, exclude, also)
    }

    /// [`pick_excluding`](Self::pick_excluding) for a request with affinity `key`: by the table when
    /// there is one and a key, else by the policy.
    #[inline]
    pub(crate) fn pick_keyed(
        &mut self,
        key: Option<u64>,
        exclude: &[K],
        also: &[K],
    ) -> Result<PickedAt, NoEligibleEndpoint> {
        if self.shared.has_updates() {
            self.apply_updates();
        }
        let Self {
            endpoints,
            policy: rule,
            p2c,
            turns,
            shared,
            observer,
            service_load,
            excluded,
            on_release,
            tied,
            hashing,
            ..
        } = self;
        let stats = &shared.counters;
        endpoints.refresh();
        excluded.clear();
        if !exclude.is_empty() || !also.is_empty() {
            exclude_slots(excluded, endpoints, exclude.iter().chain(also));
        }
        let candidates = endpoints.candidates();
        let left = Remaining::new(candidates, excluded);
        if left.len() == 0 {
            stats.no_eligible.add(1);
            return Err(NoEligibleEndpoint);
        }
        stats.picks.add(1);
        if let (Some(key), Some(hashing)) = (key, hashing.as_mut()) {
            // The table was rebuilt when members or weights changed (a handle's update above too).
            let in_flight = on_release.as_deref().map_or(0, OnRelease::in_flight);
            return keyed(hashing, key, &left, in_flight, endpoints, stats).map(|at| (at, None));
        }
        let (slot, picked_at) = match rule {
            Policy::RoundRobin => (turns.select(left), None),
            Policy::Random => (policy::random(left, p2c), None),
            Policy::LeastLoaded => {
                let now = clock_reading(endpoints);
                let loads = Loads {
                    endpoints,
                    service_load: *service_load,
                    now,
                };
                let selection = scan(left, &loads, p2c, tied, stats);
                (selection.map(|s| s.chosen), now)
            }
            Policy::P2c | Policy::P2cMemory => {
                let now = clock_reading(endpoints);
                let remembered = remembered(*rule, on_release.as_deref(), &left);
                let loads = Loads {
                    endpoints,
                    service_load: *service_load,
                    now,
                };
                let selection = compare(left, &loads, p2c, stats, remembered);
                if let (Some(observer), Some(selection)) = (observer, &selection) {
                    notify(observer, endpoints, candidates, selection);
                }
                (selection.map(|s| s.chosen), now)
            }
        };
        // Something is left, so every policy chooses.
        let slot = slot.ok_or(NoEligibleEndpoint)?;
        Ok((candidates.position(slot), picked_at))
    }
}

/// Under P2C with memory, on a first pick (a retry keeps the memory for the next first pick): the
/// slots requests last completed on, taken.
#[inline]
fn remembered(
    rule: Policy,
    on_release: Option<&OnRelease>,
    left: &Remaining<'_>,
) -> [Option<usize>; 2] {
    match (rule, on_release.and_then(OnRelease::freed)) {
        (Policy::P2cMemory, Some(freed)) if left.is_all() => {
            freed.take(left.candidates().generation())
        }
        _ => [None, None],
    }
}

/// Rebuilds `hashing`'s table if `endpoints`' members or weights changed.
fn sync<K: Hash + Eq + Clone, S>(hashing: &mut Hashing, endpoints: &EndpointSet<K, S>) {
    hashing.sync(endpoints.views().map(|view| (view.key, view.weight)));
}

/// The pick's clock reading, when the metric uses latency.
fn clock_reading<K, S>(endpoints: &EndpointSet<K, S>) -> Option<u64> {
    endpoints
        .metric()
        .uses_clock()
        .then(|| endpoints.clock().now())
}

/// The keyed pick among `left`, `in_flight` requests being in flight through the balancer (loads are
/// requests in flight, shares the candidates' weight shares), as an endpoint position; counts it in
/// `walked` when it is not the key's home.
fn keyed<K: Hash + Eq + Clone, S>(
    hashing: &mut Hashing,
    key: u64,
    left: &Remaining<'_>,
    in_flight: u64,
    endpoints: &EndpointSet<K, S>,
    stats: &Counters,
) -> Result<usize, NoEligibleEndpoint> {
    let candidates = left.candidates();
    let n = candidates.len() as f64;
    let keyed: Option<Keyed> = hashing.select(
        key,
        left,
        in_flight,
        |position| candidates.slot(position).map(|slot| slot as usize),
        |slot| endpoints.at(candidates.position(slot)).load.in_flight(),
        |slot| match candidates.weights() {
            Some(weights) => weights.thousandths()[slot] as f64 / weights.total() as f64,
            None => 1.0 / n,
        },
    );
    let keyed = keyed.ok_or(NoEligibleEndpoint)?;
    stats.walked.add(u64::from(!keyed.home));
    Ok(candidates.position(keyed.slot))
}

/// What a comparison reads loads from.
struct Loads<'a, K, S> {
    endpoints: &'a EndpointSet<K, S>,
    /// The services' own load, when set.
    service_load: Option<fn(&S) -> f64>,
    /// The pick's clock reading, when the metric uses latency.
    now: Option<u64>,
}

impl<K, S> Loads<'_, K, S>
where
    K: Hash + Eq + Clone,
{
    /// The load compared for `slot` of `candidates`: the service's own when `service_load` is set, else
    /// the metric's, divided by weight when weights differ. One read.
    #[inline]
    fn read(&self, candidates: &Candidates, slot: usize) -> f64 {
        let endpoint = self.endpoints.at(candidates.position(slot));
        let (metric, now) = (self.endpoints.metric(), self.now.unwrap_or(0));
        match (self.service_load, candidates.weights()) {
            (Some(service_load), _) => service_load(&endpoint.service),
            (None, Some(weights)) => metric.weighted_load(&endpoint.load, now, weights.unit(slot)),
            (None, None) => metric.load(&endpoint.load, now),
        }
    }
}

/// P2C among `left` (the `remembered` slots as candidates, see [`policy::p2c_remembering`]),
/// with the loads the balancer compares (the services' own when `service_load` is set, else the
/// metric's, divided by weight when weights differ); counts reads, ties and idle pairs.
#[inline]
fn compare<K, S>(
    left: Remaining<'_>,
    loads: &Loads<'_, K, S>,
    p2c: &mut P2c,
    stats: &Counters,
    remembered: [Option<usize>; 2],
) -> Option<Selection>
where
    K: Hash + Eq + Clone,
{
    let (mut reads, candidates) = (0, left.candidates());
    let selection = policy::p2c_remembering(left, p2c, remembered, |slot| {
        reads += 1;
        loads.read(candidates, slot)
    });
    stats.load_reads.add(reads);
    let selection = selection?;
    stats.ties.add(u64::from(selection.tie));
    stats.both_zero.add(u64::from(selection.both_zero()));
    Some(selection)
}

/// The least loaded of `left` by a full scan ([`policy::least_loaded`]), with the loads [`compare`]
/// reads; counts reads (one per candidate left) and ties.
fn scan<K, S>(
    left: Remaining<'_>,
    loads: &Loads<'_, K, S>,
    p2c: &mut P2c,
    tied: &mut Vec<usize>,
    stats: &Counters,
) -> Option<Selection>
where
    K: Hash + Eq + Clone,
{
    let (mut reads, candidates) = (0, left.candidates());
    let selection = policy::least_loaded(left, p2c, tied, |slot| {
        reads += 1;
        loads.read(candidates, slot)
    });
    stats.load_reads.add(reads);
    let selection = selection?;
    stats.ties.add(u64::from(selection.tie));
    Some(selection)
}

/// Fills `excluded` with the slots of the candidates among `keys`, ascending and distinct: O(keys).
fn exclude_slots<'k, K, S>(
    excluded: &mut Vec<u32>,
    endpoints: &EndpointSet<K, S>,
    keys: impl Iterator<Item = &'k K>,
) where
    K: Hash + Eq + Clone + 'k,
{
    let candidates = endpoints.candidates();
    excluded.extend(
        keys.filter_map(|key| endpoints.position(key))
            .filter_map(|at| candidates.slot(at)),
    );
    excluded.sort_unstable();
    excluded.dedup();
}

fn notify<K, S>(
    observer: &Observer<K>,
    endpoints: &EndpointSet<K, S>,
    candidates: &Candidates,
    selection: &Selection,
) where
    K: Hash + Eq + Clone,
{
    if let Some([a, b]) = selection.candidates {
        let key = |slot: usize| &endpoints.at(candidates.position(slot)).key;
        observer(&PickEvent {
            candidates: [(key(a.index), a.load), (key(b.index), b.load)],
            chosen: key(selection.chosen),
            tie: selection.tie,
            both_zero: selection.both_zero(),
        });
    }
}

impl<K: fmt::Debug, S, C> fmt::Debug for Balancer<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balancer")
            .field("strategy", &self.strategy.name())
            .field("endpoints", &self.endpoints.keys().collect::<Vec<_>>())
            .field("eligible", &self.endpoints.candidates().len())
            .field("policy", &self.policy)
            .field("metric", self.endpoints.metric())
            .field("stats", &self.shared.counters.snapshot())
            .finish()
    }
}
