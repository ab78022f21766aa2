//! Power-of-two-choices load balancing for [tower] services.
//!
//! A [`Balancer`] owns a list of endpoints — a key (say, a backend address), a weight, the endpoint's
//! service and its load state — and sends each request to one of them:
//!
//! 1. **Eligibility first.** Endpoints marked ineligible (unhealthy, ejected, draining) or of weight 0 are
//!    not candidates, whatever their load. The eligible set is a dense array rebuilt when membership,
//!    health or weight changes, never walked per request, so a pick is O(1) in the pool size.
//! 2. **Two choices.** Two distinct candidates are drawn (`i = d₁ mod n`, `j = d₂ mod (n−1)`, `j += 1` if
//!    `j ≥ i`), exactly two loads are read, and the lighter wins; equal loads are settled by a fair coin
//!    from the balancer's own generator. One eligible endpoint is picked without a draw; none is
//!    [`NoEligibleEndpoint`], which a proxy answers with 503.
//! 3. **Accounting.** The winner's in-flight count is incremented before its service is called, and
//!    decremented exactly once when the response completes: for HTTP ([`CompleteOnBodyEnd`]) when the
//!    body ends, fails or is dropped; otherwise when the response arrives. A failed or cancelled call
//!    releases it too. The decrement lives in the [`LoadGuard`]'s `Drop`, so no path can skip or repeat it.
//!
//! # Why two choices
//!
//! Placing n requests on n servers uniformly at random leaves the busiest with about
//! `log n / log log n`; letting each look at two random servers and take the emptier cuts it to
//! `log log n / log 2` (Azar, Broder, Karlin and Upfal, *Balanced allocations*, 1994; Mitzenmacher, *The
//! Power of Two Choices in Randomized Load Balancing*, 2001). A full least-loaded scan costs n reads and,
//! worse, makes every balancer with the same stale view send to the same "best" server: the herd effect.
//! Two random samples keep almost all the benefit, and balancers that each see only their own load
//! (duet's workers) never agree on a global minimum, so they cannot herd.
//!
//! # Strategies
//!
//! A balancer is built with one [`Strategy`], named as in duet's config: which endpoints are compared
//! (two drawn at random, two remembered, or all of them; or none, for the baselines) and on what load.
//! Each pairs a selection rule with the load it is meant for, so the pairs advised against cannot be
//! built (the [`Strategy`] docs say why).
//!
//! | strategy | compares | load |
//! |---|---|---|
//! | `p2c_peak_ewma` (the default) | two drawn | PeakEWMA |
//! | `p2c_inflight` | two drawn | requests in flight |
//! | `p2c_memory_peak_ewma`, `p2c_memory_inflight` | two remembered (see *Memory*) | as above |
//! | `least_peak_ewma` | all (see *Full scan*) | PeakEWMA |
//! | `least_inflight` | all | in flight, equal counts ordered by a latency average |
//! | `round_robin`, `random` | none (baselines) | — |
//!
//! # Load metrics
//!
//! * **In flight**: requests this balancer has in flight to the endpoint.
//! * **In flight, then latency** (`least_inflight`): requests in flight, equal counts ordered by a
//!   plain moving average of latency (the faster is lighter; a count always outweighs an average).
//!   Made for the full scan below, where a worker's own counts tie often.
//! * **PeakEWMA** (the default): Finagle's and Linkerd's peak-sensitive moving average of
//!   latency, multiplied by `in_flight + 1`, so a slow endpoint and a busy one both look heavy. A sample
//!   above the estimate replaces it at once; lower samples pull it down with time constant τ (10 s). Reads
//!   project the idle decay without storing it, so how often loads are read changes nothing; see
//!   [`PeakEwmaConfig`]. New endpoints start at the median of the measured estimates; in a pool where
//!   none has answered yet (a cold start), at the pool's lowest answer so far (30 ms before any), and an
//!   endpoint's own first answer then replaces its start estimate, so a cold cluster ranks by latency
//!   from its first answers instead of after τ. The estimate read is never below the mean age
//!   of the requests still waiting for their sample: an endpoint that stalls looks slower with every
//!   millisecond, before any of its requests completes.
//!
//! # Weights
//!
//! A weight is an endpoint's capacity. When the eligible endpoints' weights differ:
//!
//! 1. **Candidates are drawn in proportion to weight**, independently, each with probability `w/W`
//!    (`W = Σw`, an O(1) [`AliasTable`](algo::AliasTable) draw).
//! 2. **Weight divides concurrency, never latency.** The load compared is `in_flight / w` under
//!    in-flight strategies and `estimate × (1 + in_flight / w)` under PeakEWMA: an endpoint of weight
//!    3 is expected to carry three times the requests at the same latency, but it is not expected to be
//!    faster, so a slow endpoint stays slow whatever its weight.
//! 3. **Like loads are equal.** Two distinct candidates whose loads are within [`LIKE_LOADS`](algo::LIKE_LOADS) of each
//!    other (a ratio of 0.75 or more) are settled by a fair coin; otherwise the lighter wins. Equally fast
//!    endpoints never report exactly equal latency (jitter, and PeakEWMA keeps the higher estimate for the
//!    endpoint it samples more often), and comparing those differences strictly would tilt every contest.
//! 4. **A candidate drawn twice faces a challenger** drawn uniformly among the others, which wins only if
//!    its load is under [`CLEARLY_LIGHTER`](algo::CLEARLY_LIGHTER) (half) of the candidate's. Still two load reads.
//!
//! Among equals every contest is a coin and no challenger wins, so an endpoint of weight `w` is chosen
//! when drawn twice, or drawn once and wins the coin:
//!
//! ```text
//! P(win) = (w/W)² + 2 · (w/W) · (1 − w/W) · ½ = (w/W) · (w/W + 1 − w/W) = w/W
//! ```
//!
//! exactly its weight share, whether requests come one at a time or many at once (then `in_flight / w`
//! keeps the loads alike at a w:W split). A degraded endpoint loses every contest, including the ones it
//! would win by being drawn twice, so a 10× slower endpoint of weight 3 against one of weight 1 gets
//! under 1% of sequential traffic; as clients pile onto the fast one its share grows, since weight counts
//! as capacity (`tests/weights.rs` pins both). Dividing loads by weight with uniformly drawn pairs cannot
//! give `w/W` (an endpoint only wins when drawn, so its share is capped near 2/n; tower issue #696), and
//! dividing the latency by the weight made the heavier of two equal endpoints win nearly every contest
//! (weights 3:1 gave 95:5). When all weights are equal the distinct-pair rule above is used, with strict
//! comparison.
//!
//! Round robin honours weights too, with nginx's smooth weighted round robin: weights 3:1 give
//! `a a b a`, never a burst longer than the weights require.
//!
//! # Memory
//!
//! [`Strategy::P2cMemoryPeakEwma`] and [`Strategy::P2cMemoryInflight`] keep the two reads but not the two fresh draws: the endpoints this balancer's
//! requests completed on since its last pick (the last two; each has just freed a request slot) are the
//! candidates, and one is drawn at random when only one is remembered. Guards record the endpoint as
//! they release it, and a pick takes what they recorded, once (Mitzenmacher, Prabhakar and Shah, *Load
//! balancing with memory*, 2002). Nothing is shared between balancers, so workers cannot herd through
//! it. With differing weights and on retries, picks are plain P2C.
//! [`P2c::select_with_memory`](algo::P2c::select_with_memory) is the rule on its own.
//!
//! # Full scan: the opt-in exception to two reads
//!
//! [`Strategy::LeastInflight`] and [`Strategy::LeastPeakEwma`] read **every** eligible endpoint's load on every pick (n reads, O(n)) and
//! sends to the minimum, loads divided by weight when weights differ; equal minimums are settled by
//! exactly one draw, in proportion to weight, and a pick without a tie draws nothing. It is nginx's
//! `least_conn` and HAProxy's `leastconn` on the balancer's own view. Eligibility and a retry's
//! exclusions are decided first: what is out is never read.
//!
//! It breaks the rule the rest of the crate keeps, for one case: a balancer that carries most of a
//! pool's traffic (one worker, or a few) over backends that each serve a handful of requests at once,
//! near saturation. There it knows strictly more than two samples, and duet-sim's finite-capacity model
//! matches a global scan with it. The cost is the herd the two-read rule avoids: balancers that see the
//! same loads agree on the same minimum. duet's workers each scan only their own counts, so they share no
//! view; but with many of them each knows only its own share of the traffic, a scan of which buys
//! little over two samples of it, and scanning latency estimates sends every worker to the backends that
//! were fastest lately (duet-sim's herd table: 32 workers, 20 backends). Hence opt-in, never the default.
//!
//! Under `least_inflight` the scan orders equal counts by each endpoint's plain latency average, and
//! draws only between exactly equal averages (when weights differ, it draws among equal loads by
//! weight). A worker's own
//! counts tie often when it carries a share of the traffic; the average then tells it what its counts
//! cannot, how busy each endpoint is with everyone else's requests. In duet-sim this took the 32-worker
//! herd's mean time in system from 5% to 31% under P2C's, and with two workers at 85–95% load took p99
//! below the global scan's (which draws among equal counts).
//! With differing weights, weight divides concurrency only, as for P2C: one request at a time, a
//! PeakEWMA scan sends each to the lowest estimate whatever the weights.
//!
//! # Affinity
//!
//! [`Balancer::with_affinity`] adds keyed picks ([`Balancer::pick_and_claim_for`]): consistent hashing
//! on a Maglev table ([`Affinity::maglev`]) or a hash ring ([`Affinity::ring`]) with bounded loads,
//! the key's home while it is under `c` times its share of the requests in flight, else its next
//! candidates (the first under the bound, or the lighter of the first two). A pick without a key is the
//! strategy's. Its hash takes no seed, unlike the draws below, so that every balancer agrees on a key's
//! home, also over a discovered set, whose keys are the endpoint ids it hashes
//! ([`DiscoverBalancer::balance_mut`]); see [`Affinity`] for the rule, the reasons, the choice of table and an example, and
//! [`algo::Maglev`] and [`algo::Ring`] for the tables alone.
//!
//! # Randomness
//!
//! Each balancer has its own small fast generator, seeded once from the operating system, so two workers
//! restarted together do not break their ties identically (a shared constant seed would make every worker
//! herd onto the same endpoint at each cold start). [`Balancer::with_seed`] gives a reproducible sequence
//! for tests and simulations; [`Draws::from_source`] lets a test script every draw.
//!
//! # Observability
//!
//! [`Balancer::stats`] counts picks, load reads, ties and picks where both candidates were idle (too
//! little concurrency for the metric to mean anything); [`Balancer::with_observer`] sees every comparison;
//! each endpoint's [`EndpointLoad`] exposes its in-flight count, picks and latency estimate, and may be
//! read from another thread. [`Balancer::handle`] (and [`DiscoverBalancer::handle`]) gives a cloneable
//! [`BalanceHandle`] that reads all of it, and sets weights and eligibility, from anywhere: also once
//! the balancer has moved into a `tower::buffer::Buffer`.
//!
//! # Example
//!
//! ```
//! use duet_balance::{Balancer, Strategy};
//! use std::convert::Infallible;
//! use tower::{service_fn, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), duet_balance::BoxError> {
//! let mut balance = Balancer::new(Strategy::P2cInflight);
//! for name in ["a", "b", "c"] {
//!     let backend = service_fn(move |request: u32| async move { Ok::<_, Infallible>((name, request * 2)) });
//!     balance.insert(name, 1, backend);
//! }
//!
//! let (served_by, answer) = balance.ready().await?.call(21).await?;
//! assert_eq!(answer, 42);
//! assert!(["a", "b", "c"].contains(&served_by));
//! assert_eq!(balance.stats().load_reads, 2);
//!
//! // A backend taken out of rotation keeps its state and can come back.
//! balance.set_eligible(&"b", false);
//! assert_eq!(balance.eligible_len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! For HTTP, use [`CompleteOnBodyEnd`] so a request counts until its response body is done:
//! `Balancer::new(strategy).with_completion(CompleteOnBodyEnd::default())`. The `examples/` folder has
//! hyper clients balanced over real servers: `hyper_client.rs` over a fixed list ([`BalanceLayer`]),
//! `discovery.rs` over servers a discovery stream announces with their weights, printing stats from a
//! [`BalanceHandle`] while it runs.
//!
//! # Membership, sharing, readiness
//!
//! * **Owned**: whoever owns a [`Balancer`] changes it with [`insert`](Balancer::insert),
//!   [`remove`](Balancer::remove), [`set_eligible`](Balancer::set_eligible) and
//!   [`set_weight`](Balancer::set_weight); duet's workers do, each with its own balancer.
//! * **From discovery**: [`DiscoverBalancer`] follows any [`tower::discover::Discover`] stream, applying
//!   its changes inside `poll_ready`; a stream of [`Weighted`] services carries each endpoint's weight
//!   ([`DiscoverBalancer::with_weights`]), and a [`BalanceHandle`] sets weights and eligibility.
//! * **Shared**: a balancer is one state machine (`&mut self`), not a handle; to share one between
//!   tasks, put it behind [`tower::buffer::Buffer`](https://docs.rs/tower/latest/tower/buffer/struct.Buffer.html) (whose clones all feed one worker task that owns it)
//!   and keep a [`BalanceHandle`] ([`Balancer::handle`]) for stats and changes. Sharing one balancer between threads gives up what
//!   per-thread balancers buy (no contention, no herding): prefer one per thread where you can.
//! * **Readiness**: `poll_ready` picks, then polls the picked endpoint. One that is not ready is passed
//!   over for a new pick (up to three), so a slow endpoint never pins the balancer; one whose
//!   readiness fails is evicted, as tower does, and counted in [`PickStats::evicted`].
//! * **Nesting**: a `Balancer` and a `DiscoverBalancer` implement [`tower::load::Load`] (the mean load of
//!   their eligible endpoints), so balancers can be endpoints of another balancer that compares `Load`,
//!   such as tower's own.
//! * **Retries**: [`Balancer::pick_and_claim_excluding`] and [`Balancer::poll_ready_excluding`] pick
//!   among the endpoints not tried yet by the same rules and weights as a first pick (slow start
//!   included), in O(tried) more, without copying the candidate list.
//! * **Threads**: endpoint loads are atomics; guards may end on any thread, and a metrics reader may read
//!   them from another (`tests/tower.rs` runs them on a multi-thread runtime).
//!
//! # Compared with `tower::balance::p2c`
//!
//! The same: power of two choices over a `Discover`ed set, PeakEWMA as in Finagle and Linkerd, the load
//! counted from call to completion. Different: picks cost O(1) instead of O(n) readiness polling (tower
//! keeps a ready cache of every endpoint; here only the picked one is polled); completion can wait for
//! the response body's end; reads are pure; weights, eligibility, slow start and panic threshold are
//! built in; PeakEWMA sees requests still waiting. `cargo bench --bench balance` in the duet repository
//! measures pick + complete against tower's balancer, every inner service answering at once (criterion
//! medians in nanoseconds on a 2-core AMD EPYC virtual machine, one run; expect ±15% between runs):
//!
//! | endpoints | duet in flight | tower pending requests | | duet PeakEWMA | tower PeakEWMA | |
//! |---:|---:|---:|---:|---:|---:|---:|
//! | 2 | 36 | 214 | 5.9× | 68 | 487 | 7.1× |
//! | 16 | 44 | 230 | 5.3× | 73 | 502 | 6.8× |
//! | 256 | 43 | 244 | 5.6× | 94 | 622 | 6.6× |
//! | 4096 | 70 | 312 | 4.4× | 103 | 897 | 8.7× |
//!
//! What PeakEWMA costs here is mostly the hardware's floor for a load that is correct across threads:
//! seven atomic read-modify-writes per request (the guard's `Arc`, the in-flight and waiting counts and
//! their start times, the estimate) and two reads of the time-stamp counter (see [`Clock`]). How much
//! that is depends on the machine: on an Intel virtual machine where a locked add cost ~9 ns and a
//! counter read ~14 ns, the same bench gave 155–204 ns for PeakEWMA, 3.4–5.1× under tower. At 4096
//! endpoints the pool outgrows the cache: a candidate's load state is laid out to cost one cache line.
//!
//! # Coming from tower
//!
//! A program that balances a discovered set with tower's P2C, where the stream announces each service
//! wrapped in its load (`PeakEwma<S>`, `PendingRequests<S>`):
//!
//! ```text
//! use tower::balance::p2c::{Balance, MakeBalance};
//! let balance = Balance::new(discover);                       // Discover<Service = PeakEwma<S>>
//! let make = MakeBalance::new(make_discover);                 // Service<Target, Response = Balance<..>>
//! ```
//!
//! is, with this crate, where the stream announces the plain services (or [`Weighted`] ones) and the
//! balancer measures their load itself:
//!
//! ```text
//! use duet_balance::{DiscoverBalancer, Strategy};
//! let balance = DiscoverBalancer::new(discover, Strategy::P2cPeakEwma);
//! let make = make_discover.map_response(|d| DiscoverBalancer::new(d, Strategy::P2cPeakEwma));
//! ```
//!
//! No wrapper type stands for tower's `MakeBalance`: a service that makes each target's endpoint set
//! (a `Discover`) becomes one that makes a balancer per target with [`ServiceExt::map_response`], which
//! also configures each balancer as the target needs (weights from the stream, completion, slow start):
//!
//! [`ServiceExt::map_response`]: https://docs.rs/tower/latest/tower/trait.ServiceExt.html#method.map_response
//!
//! ```
//! use duet_balance::{DiscoverBalancer, Strategy, Weighted};
//! use std::convert::Infallible;
//! use tower::{discover::Change, service_fn, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), duet_balance::BoxError> {
//! // Makes the endpoint set of a cluster by name: its replicas, with their weights.
//! let make_discover = service_fn(|cluster: &'static str| async move {
//!     let replica = move |n: u32| service_fn(move |_: ()| async move { Ok::<_, Infallible>((cluster, n)) });
//!     let changes = [(1, 3), (2, 1)].map(|(n, weight)| Ok::<_, Infallible>(Change::Insert(n, Weighted::new(replica(n), weight))));
//!     Ok::<_, Infallible>(futures_util::stream::iter(changes))
//! });
//! // Makes a balancer per cluster, as tower's MakeBalance does, weights taken from the stream.
//! let mut make_balancer = make_discover
//!     .map_response(|discover| DiscoverBalancer::new(discover, Strategy::P2cPeakEwma).with_weights());
//!
//! let mut payments = make_balancer.ready().await?.call("payments").await?;
//! let (cluster, _replica) = payments.ready().await?.call(()).await?;
//! assert_eq!(cluster, "payments");
//! let weights: Vec<_> = payments.balance().endpoints().map(|e| (*e.key, e.weight)).collect();
//! assert_eq!(weights, [(1, 3), (2, 1)]);
//! # Ok(())
//! # }
//! ```
//!
//! Other names: tower's `Balance` is [`Balancer`] here (the two can be imported side by side), and the
//! load comes from a [`Strategy`], named as in duet's config, instead of a wrapper per service.
//!
//! # Layout
//!
//! One concept per module, each using only those below it:
//!
//! * `layer` and `discover`: [`BalanceLayer`] and [`DiscoverBalancer`], ways to build and feed a
//!   [`Balancer`].
//! * `service`: the tower side of a [`Balancer`]: `poll_ready` (pick, poll the picked endpoint's
//!   readiness, pass over a pending one, evict a failed one), `call`, [`tower::load::Load`].
//! * `balancer`: [`Balancer`] itself: configuration, membership calls, and the pick
//!   ([`Balancer::pick_and_claim_excluding`] and friends): which candidates are left, which policy
//!   chooses, what is counted ([`PickStats`]) and observed ([`PickEvent`]), the claim ([`LoadGuard`]).
//! * `strategy` and `policy`: the [`Strategy`] names, and one selection per rule, a function of the
//!   candidates left and a draw source.
//! * `affinity`, `maglev`, `ring` and `stable_hash`: keyed picks ([`Affinity`]), the Maglev table,
//!   the hash ring and the seedless hash they stand on.
//! * `endpoints`: the endpoint set: membership, eligibility, panic mode, weights ramped by slow start;
//!   it decides the candidates.
//! * `candidates`: the candidates as one value, rebuilt on change, read by every pick; and what a retry
//!   leaves of them (excluded endpoints are skipped by rank, never copied out).
//! * `p2c` and `alias` ([`algo`]): the two-choices rule and the weighted draw, free of any service.
//! * `future`, `completion`, `guard`, `memory`, `load`, `clock`, `draw`, `error`: the response future,
//!   when a request completes, the in-flight guard, which endpoint completed last
//!   (P2C with memory), the load metrics, the time source, the random draws.
//!
//! [tower]: https://docs.rs/tower

#![warn(missing_docs)]

// Top layer first: each module uses only modules declared after it (see "Layout" above). Each
// declaration stands alone so that rustfmt keeps this order.
mod layer;

mod discover;

mod service;

mod balancer;

mod handle;

mod strategy;

mod policy;

mod affinity;

mod maglev;

mod ring;

mod member_walk;

mod stable_hash;

mod endpoints;

mod candidates;

mod p2c;

mod alias;

mod future;

mod completion;

mod guard;

mod memory;

mod load;

mod clock;

mod draw;

mod weighted;

mod error;

/// The selection algorithm on its own, free of any service: what a simulator or another balancer
/// reuses. [`Balancer`] is built on these.
pub mod algo {
    pub use crate::alias::AliasTable;
    pub use crate::load::peak_ewma;
    pub use crate::maglev::Maglev;
    pub use crate::p2c::{Candidate, P2c, Selection, CLEARLY_LIGHTER, LIKE_LOADS};
    pub use crate::ring::Ring;
    pub use crate::stable_hash::stable_hash;
}

pub use affinity::{Affinity, Walk};
pub use balancer::{Balancer, PickEvent};
pub use clock::{Clock, MockTime};
pub use completion::{CompleteOnBodyEnd, StatusSet, TrackedBody};
pub use discover::DiscoverBalancer;
pub use draw::{DrawSource, Draws};
pub use error::{BoxError, NoEligibleEndpoint};
pub use future::ResponseFuture;
pub use guard::LoadGuard;
pub use handle::{BalanceHandle, EndpointStats, PickStats};
pub use layer::{BalanceLayer, Picked, SharedEndpoint, Stamp};
pub use load::{DefaultRtt, EndpointLoad, PeakEwmaConfig, SampleAt};
pub use strategy::{Strategy, UnknownStrategy};
pub use weighted::Weighted;
