//! The phases of one request that a filter may act in, with what each phase is handed, and the
//! [`Phases`] trait a filter implements, one method per phase, each defaulting to doing nothing.

use crate::{
    attempt::body::ProxyBody,
    attempt::completion::Completion,
    backend::cluster::Cluster,
    error::ProxyError,
    exchange::Prepared,
    peer::Client,
    telemetry::access_log::AccessLog,
    telemetry::done::Done,
    telemetry::metrics::{ClusterCells, CounterFamily},
};
use duet_config::{Config, Route};
use http::{request, HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use std::{future::Future, net::SocketAddr, pin::Pin, rc::Rc};

/// The phases a filter may act in, as bits: [`Phases::PHASES`] says which a filter uses, so that a
/// route runs only the hooks its filters have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Phase(u16);

impl Phase {
    /// [`Phases::on_request`].
    pub(crate) const REQUEST: Self = Self(1);
    /// [`Phases::on_upstream_request`].
    pub(crate) const UPSTREAM_REQUEST: Self = Self(1 << 1);
    /// [`Phases::on_prepared`].
    pub(crate) const PREPARED: Self = Self(1 << 2);
    /// [`Phases::first_attempt`].
    pub(crate) const FIRST_ATTEMPT: Self = Self(1 << 3);
    /// [`Phases::on_response_head`].
    pub(crate) const RESPONSE_HEAD: Self = Self(1 << 4);
    /// [`Phases::error_page`].
    pub(crate) const ERROR_PAGE: Self = Self(1 << 5);
    /// [`Phases::plan_body`] and [`Phases::on_response_body`].
    pub(crate) const RESPONSE_BODY: Self = Self(1 << 6);
    /// [`Phases::admit`].
    pub(crate) const ADMIT: Self = Self(1 << 7);
    /// [`Phases::on_done`].
    pub(crate) const DONE: Self = Self(1 << 8);
    /// [`Phases::response_fields`].
    pub(crate) const RESPONSE_FIELDS: Self = Self(1 << 9);
    /// None.
    pub(crate) const NONE: Self = Self(0);

    /// Both sets of phases.
    pub(crate) const fn and(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether `self` includes any phase of `other`.
    pub(crate) const fn any(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether `self` includes every phase of `other`.
    pub(crate) const fn has(self, other: Self) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

/// What the request phase sees: the request as routed, before anything of it is changed.
pub(crate) struct Arrival<'a> {
    pub(crate) request: &'a Request<Incoming>,
    pub(crate) route: &'a Route,
    /// The host the request named (with its port, if any), as routed.
    pub(crate) host: Option<&'a HeaderValue>,
    pub(crate) client: Client,
}

/// What a filter decides in the request phase.
pub(crate) enum Decision {
    /// The request goes on to the next filter, and then to a backend.
    Continue,
    /// duet answers the request itself with this response; no backend is asked, and the filters
    /// after this one do not run.
    Answer(Response<ProxyBody>),
    /// duet refuses the request with its own error response for this error (a gRPC status for a
    /// gRPC call), counted as the error's kind.
    Refuse(ProxyError),
    /// As `Refuse`, with these fields added to duet's response (a 429's `Retry-After`).
    RefuseWith(ProxyError, HeaderMap),
}

/// What a filter decides in the admission phase: at once, or when a future it returns ends.
pub(crate) enum Admit<'a> {
    /// Decided now (any fields the filter sets are already on the request).
    Now(Decision),
    /// Decided by this future (a subrequest to an auth service): `Ok` lets the request through
    /// with these fields set on it, `Err` is the decision.
    Later(Pin<Box<dyn Future<Output = Result<HeaderMap, Decision>> + 'a>>),
}

/// A response head on its way to the client: a backend's, after duet removed its hop-by-hop fields.
pub(crate) struct ResponseHead<'a> {
    pub(crate) headers: &'a mut HeaderMap,
    /// The client the response goes to (`tls`: it came over TLS).
    pub(crate) client: &'a Client,
}

/// A page in place of the body of duet's own error answer, with its `Content-Type`.
#[derive(Debug)]
pub(crate) struct OwnPage {
    pub(crate) content_type: HeaderValue,
    pub(crate) body: bytes::Bytes,
}

/// What a filter chose from the request for its response-body phase, in its own terms (compression:
/// the coding), taken at arrival since the request is gone by the time the response comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyPlan(pub(crate) u8);

/// What the phases after the response need of the request, taken at arrival: each `None` when no
/// filter of the route acts in its phase (or, for error pages, for a gRPC call).
#[derive(Debug, Default)]
pub(crate) struct Shaping {
    /// For the error-page phase: whether the request's `Accept` prefers JSON.
    pub(crate) pages: Option<bool>,
    /// For the response-body phase.
    pub(crate) body: Option<BodyPlan>,
    /// The response-fields phase's fields for this request's response (CORS's
    /// `Access-Control-Allow-Origin` for the origin it came from); boxed, as every request's
    /// handler future holds the `Shaping` and few have fields.
    pub(crate) fields: Option<Box<HeaderMap>>,
}

/// One attempt's result: the backend's response with the attempt's completion, or why it failed.
pub(crate) type Attempt = Result<(Response<Incoming>, Completion), ProxyError>;

/// A first attempt a filter sends in its own way (a hedge races a second attempt beside it).
pub(crate) struct Raced {
    pub(crate) result: Attempt,
    /// An attempt was dropped unfinished because another answered: sent, but neither the answer nor
    /// among the failures in `tried`, so the request's attempts count it apart.
    pub(crate) dropped: bool,
    /// Which of the filter's attempts answered, for the access log (its `hedged` field); `None`:
    /// the filter sent one attempt, or none answered.
    pub(crate) answered: Option<&'static str>,
}

/// A first attempt, as a filter runs it: boxed, since only the routes with such a filter pay for it.
pub(crate) type Race<'a> = Pin<Box<dyn Future<Output = Raced> + 'a>>;

/// What a first attempt run by a filter is given: the cluster picked for the request, the request,
/// and the backends that failed (the race adds those it sees fail).
pub(crate) struct FirstAttempt<'a> {
    pub(crate) cluster: &'a Rc<Cluster>,
    pub(crate) prepared: &'a Prepared,
    pub(crate) tried: &'a mut Vec<SocketAddr>,
}

/// What a filter is built from: the config and the worker's clusters (in `config.clusters` order).
/// What a filter keeps for all the routes of its worker lives in its module, in a thread local: a
/// worker is one thread.
pub(crate) struct Build<'a> {
    pub(crate) config: &'a Config,
    pub(crate) clusters: &'a [Rc<Cluster>],
}

/// A filter: one feature's per-route state and the phases it acts in. Every hook has a default that
/// does nothing; a filter implements the ones it names in [`PHASES`](Phases::PHASES), and only those
/// run.
pub(crate) trait Phases: Sized {
    /// The phases whose hooks this filter implements.
    const PHASES: Phase;

    /// The families of the counters the filter keeps per route, exported in this order; its cells
    /// ([`RouteCounters`](crate::telemetry::metrics::RouteCounters)) are handed over in
    /// [`publish`](Phases::publish).
    const COUNTERS: &'static [&'static CounterFamily] = &[];

    /// The filter for `route`, or `None` when the route does not use it. `previous` is the same
    /// filter of the route of the same name in the config before a reload: what it keeps (counts, a
    /// latency window, a budget) it hands on here, when the route still means the same by it.
    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self>;

    /// After routing, before anything of the request is changed or read: the filter may answer or
    /// refuse the request in duet's name. `log` is the request's access-log record, for an answer.
    fn on_request(&self, _arrival: &Arrival<'_>, _log: &mut Option<Box<AccessLog>>) -> Decision {
        Decision::Continue
    }

    /// After the request phase, before anything of the request is read or sent: the filter may
    /// refuse the request or let it through, editing its fields (an auth filter removes the
    /// client's credentials and sets the identity it verified). The only phase that may wait
    /// ([`Admit::Later`]); a route without such a filter pays one bit test for it.
    /// `log` is the request's access-log record, for an answer the filter writes.
    fn admit<'a>(
        &'a self,
        _request: &mut Request<Incoming>,
        _client: &Client,
        _log: &'a mut Option<Box<AccessLog>>,
    ) -> Admit<'a> {
        Admit::Now(Decision::Continue)
    }

    /// The request as every attempt sends it: after duet's own header rules (hop-by-hop fields out,
    /// `X-Forwarded-*` and `X-Request-Id` in), before its body is read. An error refuses the request
    /// (400 for [`ErrorKind::InvalidPath`](crate::error::ErrorKind::InvalidPath)).
    fn on_upstream_request(
        &self,
        _parts: &mut request::Parts,
    ) -> Result<(), crate::error::ErrorKind> {
        Ok(())
    }

    /// The request is ready to send (its body read, if it is read first): the filter may start work
    /// beside the attempts, never waited for.
    fn on_prepared(&self, _prepared: &Prepared) {}

    /// Whether the request's body must stay ours to send again (read in full when small) for this
    /// filter's sake.
    fn replays_body(&self) -> bool {
        false
    }

    /// The first attempt, sent in the filter's way; `None`: the usual single attempt. At most one
    /// filter of a route runs it.
    fn first_attempt<'a>(&'a self, _attempt: FirstAttempt<'a>) -> Option<Race<'a>> {
        None
    }

    /// At arrival, the fields to add to the request's response, whether a backend's or duet's own
    /// answer once the request reached a cluster (CORS: the allowed origin, which only the request
    /// names): each replaces the response's field of the same name, except `Vary`, whose values
    /// are added. `None`: nothing for this request.
    fn response_fields(&self, _request: &Request<Incoming>) -> Option<HeaderMap> {
        None
    }

    /// A backend's response head on its way to the client (duet's own answers are left as duet
    /// writes them).
    fn on_response_head(&self, _head: &mut ResponseHead<'_>) {}

    /// duet's own error answer of `status` to the request (never a backend's, never a gRPC call's):
    /// the page to send in place of its short text; `json`: the request's `Accept` prefers JSON.
    fn error_page(&self, _status: u16, _json: bool) -> Option<&OwnPage> {
        None
    }

    /// A backend's response of `status` (never a gRPC call's): the page to send in place of its
    /// body, if the filter replaces backends' answers of that status too.
    fn backend_page(&self, _status: u16, _json: bool) -> Option<&OwnPage> {
        None
    }

    /// At arrival, what the response-body phase will need of the request; `None`: the filter leaves
    /// this request's response alone. At most one filter of a route acts in the phase.
    fn plan_body(&self, _request: &Request<Incoming>) -> Option<BodyPlan> {
        None
    }

    /// A backend's response (after the response-head phase) with what [`plan_body`](Phases::plan_body)
    /// chose: the filter may change its head and put another body in place of its own.
    fn on_response_body(&self, _plan: BodyPlan, _response: &mut Response<ProxyBody>) {}

    /// The request is done (its response ended, or was dropped unfinished): what it came to, the
    /// same record the route's histograms and the access log are handed, once per request that
    /// reached a cluster. Runs after the response is out: it observes, it changes nothing.
    fn on_done(&self, _done: &Done<'_>) {}

    /// The filter's metric cells, added to its worker's clusters' (`cells`, in `config.clusters`
    /// order) when the worker publishes them.
    fn publish(&self, _cells: &mut [ClusterCells]) {}
}
