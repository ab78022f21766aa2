//! Filters: what a route does beside sending requests to its cluster, one module per feature.
//!
//! # The phases of a request
//!
//! A request meets a route's filters at fixed points of the stages (`stage/`), in this order; each
//! is a method of [`Phases`] with a default that does nothing, and a filter implements only those it
//! names in its `PHASES`:
//!
//! | phase | hook | run by | what a filter may do there |
//! |---|---|---|---|
//! | request | `on_request` | the handler, after routing | answer in duet's name (a redirect), refuse |
//! | admission | `admit` | the handler, after the request phase | refuse, or let through editing the request's fields; may wait (a subrequest) |
//! | upstream request | `on_upstream_request` | prepare, after duet's own header rules | edit the headers and target every attempt sends |
//! | prepared | `on_prepared` | the handler, before the first attempt | start work beside the attempts (a mirror's copy) |
//! | first attempt | `first_attempt` | retry | send the first attempt its own way (a hedge) |
//! | response fields | `response_fields` | the handler at arrival; respond, on the response once the request reached a cluster | add fields only the request can say (CORS's allowed origin) |
//! | response head | `on_response_head` | respond, on a backend's response | edit the response head |
//! | response body | `plan_body`, `on_response_body` | the handler at arrival; respond, on a backend's response | put another body in place of the backend's (`compress:`) |
//! | error page | `error_page`, `backend_page` | the handler, on duet's own error answer after routing; respond, on a backend's response | the page in place of its text, or of a backend's body (`error_pages:`) |
//! | done | `on_done` | the answering attempt's completion at the end of the response, or the handler when no backend answered | observe the finished-request record ([`Done`]) the route's histograms and the access log are handed |
//!
//! A filter's state lives in its value, one per route per worker, built once per config by
//! [`Phases::build`], which is also handed the filter of the route of the same name before a reload:
//! that is the whole of a filter's reload carry-over ([`per_cluster`] keeps a value per cluster of
//! the route across it). What a filter keeps for all the routes of its worker lives in its module, in
//! a thread local (a worker is one thread).
//!
//! A filter's metrics are counters per route: it declares their families in
//! [`Phases::COUNTERS`] (name, help, label and its values: `duet_hedges_total{outcome}`), holds a
//! [`RouteCounters`](crate::telemetry::metrics::RouteCounters) per route (and cluster), and hands
//! them over in [`Phases::publish`]. The exposition and the status page render every registered
//! family where the filters' families stand, in registration order; nothing in `telemetry/` names
//! a filter.
//!
//! What is not a per-request feature stays where it is: connections (`conn/`), the pool and the
//! balancer (`backend/`), a route's choice of cluster (`split.rs`), attempts and retries
//! (`stage/retry.rs`, `forward.rs`), and what settles when an attempt ends (`attempt/`).
//!
//! # Cost
//!
//! Dispatch is static: [`Filter`] is an enum of the built-in filters, and a route keeps only the
//! filters it uses, with the set of phases any of them acts in; a phase no filter of the route uses
//! is one bit test. A route without filters pays for none.
//!
//! # Adding a filter
//!
//! The footprint of a new filter, `hsts:` here (its two modules are the worked example, with their
//! tests):
//!
//! 1. **Its settings**, one module in `duet-config`: `crates/config/src/filter/hsts.rs` holds how the
//!    route key is written (a serde struct whose fields are the route keys it reads), what it means
//!    (the public `Hsts`), and its check, which refuses bad values with their line and column. One
//!    line registers it in the `sections!` list of `crates/config/src/filter/mod.rs`, which gives
//!    every route a `filters.hsts` field, `duet check` its text, and the unknown-key check and the
//!    configuration reference's test its keys.
//! 2. **Its module** here, `filter/hsts.rs`: a type holding what the filter needs per route, with
//!    `impl Phases`: `PHASES`, `build` (from `route.filters.hsts`; `None` when the route does not use
//!    it) and the hooks of its phases. Its metrics, if any, are counter families it declares in
//!    `COUNTERS` and cells it holds and hands over in `publish`.
//! 3. **One line registering it** in the `filters!` list below: its variant and type. The list's
//!    order is the order in which a route's filters run in each phase.
//! 4. **Its rows** in the configuration reference (`docs/src/reference/configuration.md`), which a
//!    test holds to the keys the settings read.
//!
//! Nothing else changes: the stages run every registered filter through its phases.

mod auth;
mod compress;
mod cors;
mod error_pages;
mod headers;
mod hedge;
mod hsts;
mod ip_list;
mod limit_methods;
mod mirror;
mod rate_limit;
mod redirect;
mod respond;
mod rewrite;

pub use auth::AuthCheck;

pub(crate) mod per_cluster;
pub(crate) mod phase;

use crate::{
    attempt::body::ProxyBody,
    exchange::Prepared,
    peer::Client,
    telemetry::access_log::AccessLog,
    telemetry::done::{Done, Observer},
    telemetry::metrics::{ClusterCells, CounterFamily},
};
use duet_config::Route;
use http::{request, HeaderMap, Request, Response};
use hyper::body::Incoming;
use phase::{
    Admit, Arrival, BodyPlan, Build, Decision, FirstAttempt, OwnPage, Phase, Phases, Race,
    ResponseHead, Shaping,
};

/// Declares the built-in filters, in the order they run: the [`Filter`] enum, its dispatch, and
/// how a route's filters are built.
macro_rules! filters {
    ($($variant:ident($filter:ty),)+) => {
        /// One of a route's filters.
        pub(crate) enum Filter {
            $($variant($filter),)+
        }

        impl Filter {
            /// The filters `route` uses, in the order they run; `previous` are the filters of the
            /// route of the same name before a reload.
            fn build_all(route: &Route, build: &Build<'_>, previous: &[Filter]) -> Vec<Filter> {
                let mut filters = Vec::new();
                $(
                    let old = previous.iter().find_map(|f| match f {
                        Filter::$variant(old) => Some(old),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    });
                    if let Some(filter) = <$filter as Phases>::build(route, build, old) {
                        filters.push(Filter::$variant(filter));
                    }
                )+
                filters
            }

            /// The phases this filter acts in.
            fn phases(&self) -> Phase {
                match self {
                    $(Filter::$variant(_) => <$filter as Phases>::PHASES,)+
                }
            }
        }

        /// The families of every filter's counters, in the order they are exported.
        pub(crate) fn counter_families() -> &'static [&'static CounterFamily] {
            static ALL: std::sync::LazyLock<Vec<&'static CounterFamily>> =
                std::sync::LazyLock::new(|| {
                    let mut all = Vec::new();
                    $(all.extend_from_slice(<$filter as Phases>::COUNTERS);)+
                    all
                });
            &ALL
        }

        /// Runs `$call` on the filter inside `$filter`, whichever it is.
        macro_rules! dispatch {
            ($on:expr, $f:ident => $call:expr) => {
                match $on {
                    $(Filter::$variant($f) => $call,)+
                }
            };
        }
    };
}

// The built-in filters, in the order they run in each phase.
filters! {
    IpList(ip_list::IpList),
    RateLimit(rate_limit::RouteRateLimit),
    Cors(cors::Cors),
    LimitMethods(limit_methods::LimitMethods),
    Auth(auth::Auth),
    Redirect(redirect::RedirectRoute),
    Respond(respond::Respond),
    ErrorPages(error_pages::ErrorPages),
    RequestHeaders(headers::RequestHeaders),
    Rewrite(rewrite::Rewrite),
    Mirror(mirror::RouteMirror),
    Hedge(hedge::Hedging),
    ResponseHeaders(headers::ResponseHeaders),
    Hsts(hsts::Hsts),
    Compress(compress::Compress),
}

/// A route's filters in one worker, in the order they run, with the phases any of them acts in.
#[derive(Default)]
pub(crate) struct RouteFilters {
    filters: Vec<Filter>,
    phases: Phase,
}

impl RouteFilters {
    /// The filters of `route`, handing on what `previous` (the same route's filters before a reload)
    /// keeps.
    pub(crate) fn new(route: &Route, build: &Build<'_>, previous: Option<&RouteFilters>) -> Self {
        let previous = previous.map_or(&[][..], |p| &p.filters[..]);
        let filters = Filter::build_all(route, build, previous);
        let phases = (filters.iter()).fold(Phase::NONE, |all, f| all.and(f.phases()));
        Self { filters, phases }
    }

    /// The filters acting in `phase`, in order.
    fn acting(&self, phase: Phase) -> impl Iterator<Item = &Filter> {
        let any = self.phases.has(phase);
        (self.filters.iter()).filter(move |f| any && f.phases().has(phase))
    }

    /// The request phase: the first filter that answers or refuses the request decides.
    pub(crate) fn on_request(
        &self,
        arrival: &Arrival<'_>,
        log: &mut Option<Box<AccessLog>>,
    ) -> Decision {
        for filter in self.acting(Phase::REQUEST) {
            match dispatch!(filter, f => f.on_request(arrival, log)) {
                Decision::Continue => {}
                decided => return decided,
            }
        }
        Decision::Continue
    }

    /// Whether a filter of the route acts in the request phase: a route without one skips it.
    pub(crate) fn requests(&self) -> bool {
        self.phases.has(Phase::REQUEST)
    }

    /// Whether a filter of the route acts in the admission phase.
    pub(crate) fn admits(&self) -> bool {
        self.phases.has(Phase::ADMIT)
    }

    /// The admission phase: the first filter that refuses the request decides; the fields a
    /// filter's subrequest returns are set on the request before the next filter runs.
    pub(crate) async fn admit(
        &self,
        request: &mut Request<Incoming>,
        client: &Client,
        log: &mut Option<Box<AccessLog>>,
    ) -> Decision {
        for filter in self.acting(Phase::ADMIT) {
            let decided = match dispatch!(filter, f => f.admit(request, client, &mut *log)) {
                Admit::Now(decision) => decision,
                Admit::Later(pending) => match pending.await {
                    Ok(fields) => {
                        request.headers_mut().extend(fields);
                        Decision::Continue
                    }
                    Err(decision) => decision,
                },
            };
            if !matches!(decided, Decision::Continue) {
                return decided;
            }
        }
        Decision::Continue
    }

    /// The upstream-request phase; the first error refuses the request.
    pub(crate) fn on_upstream_request(
        &self,
        parts: &mut request::Parts,
    ) -> Result<(), crate::error::ErrorKind> {
        for filter in self.acting(Phase::UPSTREAM_REQUEST) {
            dispatch!(filter, f => f.on_upstream_request(parts))?;
        }
        Ok(())
    }

    /// The prepared phase.
    pub(crate) fn on_prepared(&self, prepared: &Prepared) {
        for filter in self.acting(Phase::PREPARED) {
            dispatch!(filter, f => f.on_prepared(prepared));
        }
    }

    /// Whether a filter needs the request's body to stay ours to send again.
    pub(crate) fn replays_body(&self) -> bool {
        (self.filters.iter()).any(|filter| dispatch!(filter, f => f.replays_body()))
    }

    /// The first attempt as the route's first filter that runs it does; `None`: the usual one.
    pub(crate) fn first_attempt<'a>(&'a self, attempt: FirstAttempt<'a>) -> Option<Race<'a>> {
        let filter = self.acting(Phase::FIRST_ATTEMPT).next()?;
        dispatch!(filter, f => f.first_attempt(attempt))
    }

    /// The response-head phase.
    pub(crate) fn on_response_head(&self, head: &mut ResponseHead<'_>) {
        for filter in self.acting(Phase::RESPONSE_HEAD) {
            dispatch!(filter, f => f.on_response_head(head));
        }
    }

    /// What the error-page and response-body phases need of `request`, taken at arrival (a
    /// route whose filters act in neither pays one bit test); `grpc`: a gRPC call, which keeps
    /// duet's gRPC errors.
    #[inline]
    pub(crate) fn shaping(&self, request: &http::Request<Incoming>, grpc: bool) -> Shaping {
        let after = Phase::ERROR_PAGE.and(Phase::RESPONSE_BODY);
        if !self.phases.any(after.and(Phase::RESPONSE_FIELDS)) {
            return Shaping::default();
        }
        self.shaping_for(request, grpc)
    }

    #[inline(never)]
    fn shaping_for(&self, request: &http::Request<Incoming>, grpc: bool) -> Shaping {
        let pages = (self.phases.has(Phase::ERROR_PAGE) && !grpc)
            .then(|| error_pages::prefers_json(request.headers()));
        let body = (self.acting(Phase::RESPONSE_BODY).next())
            .and_then(|filter| dispatch!(filter, f => f.plan_body(request)));
        let mut fields: Option<Box<HeaderMap>> = None;
        for filter in self.acting(Phase::RESPONSE_FIELDS) {
            if let Some(more) = dispatch!(filter, f => f.response_fields(request)) {
                fields.get_or_insert_default().extend(more);
            }
        }
        Shaping {
            pages,
            body,
            fields,
        }
    }

    /// The response-body phase, on a backend's response.
    pub(crate) fn on_response_body(&self, plan: BodyPlan, response: &mut Response<ProxyBody>) {
        if let Some(filter) = self.acting(Phase::RESPONSE_BODY).next() {
            dispatch!(filter, f => f.on_response_body(plan, response));
        }
    }

    /// The error-page phase: the first page a filter has for duet's own error answer of `status`.
    pub(crate) fn error_page(&self, status: u16, json: bool) -> Option<&OwnPage> {
        (self.acting(Phase::ERROR_PAGE))
            .find_map(|filter| dispatch!(filter, f => f.error_page(status, json)))
    }

    /// The error-page phase on a backend's response of `status`: the first page a filter puts in
    /// place of it.
    pub(crate) fn backend_page(&self, status: u16, json: bool) -> Option<&OwnPage> {
        (self.acting(Phase::ERROR_PAGE))
            .find_map(|filter| dispatch!(filter, f => f.backend_page(status, json)))
    }

    /// Whether a filter of the route acts in the done phase: only then do its attempts carry the
    /// filters to the end of the response.
    pub(crate) fn observes(&self) -> bool {
        self.phases.has(Phase::DONE)
    }

    /// Adds the filters' metric cells to their worker's clusters' `cells`.
    pub(crate) fn publish(&self, cells: &mut [ClusterCells]) {
        for filter in &self.filters {
            dispatch!(filter, f => f.publish(cells));
        }
    }
}

/// The done phase.
impl Observer for RouteFilters {
    fn on_done(&self, done: &Done<'_>) {
        for filter in self.acting(Phase::DONE) {
            dispatch!(filter, f => f.on_done(done));
        }
    }
}

impl std::fmt::Debug for RouteFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteFilters")
            .field("filters", &self.filters.len())
            .field("phases", &self.phases)
            .finish()
    }
}
