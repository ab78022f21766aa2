//! Power-of-two-choices load balancing for [tower] services.
//!
//! A [`Balance`] owns a list of endpoints — a key (say, a backend address), a weight, the endpoint's
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
//! # Load metrics
//!
//! * [`LoadMetric::InFlight`]: requests this balancer has in flight to the endpoint.
//! * [`LoadMetric::PeakEwma`] (the default): Finagle's and Linkerd's peak-sensitive moving average of
//!   latency, multiplied by `in_flight + 1`, so a slow endpoint and a busy one both look heavy. A sample
//!   above the estimate replaces it at once; lower samples pull it down with time constant τ (10 s). Reads
//!   project the idle decay without storing it, so how often loads are read changes nothing; see
//!   [`PeakEwma`]. New endpoints start at the pool median. The estimate read is never below the mean age
//!   of the requests still waiting for their sample: an endpoint that stalls looks slower with every
//!   millisecond, before any of its requests completes.
//!
//! # Weights
//!
//! A weight is an endpoint's capacity. When the eligible endpoints' weights differ:
//!
//! 1. **Candidates are drawn in proportion to weight**, independently, each with probability `w/W`
//!    (`W = Σw`, an O(1) [`AliasTable`] draw).
//! 2. **Weight divides concurrency, never latency.** The load compared is `in_flight / w` under
//!    [`LoadMetric::InFlight`] and `estimate × (1 + in_flight / w)` under PeakEWMA: an endpoint of weight
//!    3 is expected to carry three times the requests at the same latency, but it is not expected to be
//!    faster, so a slow endpoint stays slow whatever its weight.
//! 3. **Like loads are equal.** Two distinct candidates whose loads are within [`LIKE_LOADS`] of each
//!    other (a ratio of 0.75 or more) are settled by a fair coin; otherwise the lighter wins. Equally fast
//!    endpoints never report exactly equal latency (jitter, and PeakEWMA keeps the higher estimate for the
//!    endpoint it samples more often), and comparing those differences strictly would tilt every contest.
//! 4. **A candidate drawn twice faces a challenger** drawn uniformly among the others, which wins only if
//!    its load is under [`CLEARLY_LIGHTER`] (half) of the candidate's. Still two load reads.
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
//! # Randomness
//!
//! Each balancer has its own small fast generator, seeded once from the operating system, so two workers
//! restarted together do not break their ties identically (a shared constant seed would make every worker
//! herd onto the same endpoint at each cold start). [`Balance::with_seed`] gives a reproducible sequence
//! for tests and simulations; [`Draws::from_source`] lets a test script every draw.
//!
//! # Observability
//!
//! [`Balance::stats`] counts picks, load reads, ties and picks where both candidates were idle (too
//! little concurrency for the metric to mean anything); [`Balance::with_observer`] sees every comparison;
//! each endpoint's [`EndpointLoad`] exposes its in-flight count, picks and latency estimate, and may be
//! read from another thread.
//!
//! # Example
//!
//! ```
//! use duet_balance::{Balance, LoadMetric};
//! use std::convert::Infallible;
//! use tower::{service_fn, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), duet_balance::BoxError> {
//! let mut balance = Balance::new(LoadMetric::InFlight);
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
//! `Balance::new(metric).with_completion(CompleteOnBodyEnd::default())`. The `examples/` folder has a
//! hyper client balanced over real servers.
//!
//! [tower]: https://docs.rs/tower

#![warn(missing_docs)]

mod alias;
mod completion;
mod draw;
mod error;
mod future;
mod guard;
mod layer;
mod load;
mod p2c;
mod service;

pub use alias::AliasTable;
pub use completion::{CompleteOnBodyEnd, StatusSet, TrackedBody};
pub use draw::{DrawSource, Draws, Lcg31};
pub use error::{BoxError, NoEligibleEndpoint, NotReady};
pub use future::ResponseFuture;
pub use guard::LoadGuard;
pub use layer::{BalanceLayer, Picked, Target};
pub use load::{peak_ewma, DefaultRtt, EndpointLoad, LoadMetric, PeakEwma, SampleAt};
pub use p2c::{Candidate, P2c, Selection, CLEARLY_LIGHTER, LIKE_LOADS};
pub use service::{Balance, EndpointView, PickEvent, PickStats, Policy};
pub use tower::load::{CompleteOnResponse, TrackCompletion};
