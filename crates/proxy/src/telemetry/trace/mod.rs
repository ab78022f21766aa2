//! OpenTelemetry traces: a server span per request and a client span per attempt, exported with
//! OTLP over HTTP.
//!
//! # Sampling, and what an unsampled request costs
//!
//! Sampling is parent-based (OpenTelemetry's `parentbased_traceidratio`): a request whose
//! `traceparent` is valid and sampled joins its trace, its server span the caller's span's child; one
//! whose `traceparent` says "not sampled" is not traced; one without a (valid) `traceparent` starts
//! a trace for a share `sample` of requests, by a draw of the worker's generator. A request not
//! traced costs the look-up of its `traceparent` and, without one, a draw: no span is built, and its
//! `traceparent` and `tracestate`, if any, go to the backend untouched.
//!
//! # Spans
//!
//! A traced request's [`RequestTrace`] is shared (`Rc`) by the handler, the prepared request and
//! each attempt: its server span ends when the last of them lets go, which is when the response's
//! body ended (or duet's own answer was made). The stages know it only as the request's
//! [`RequestWatch`] (`telemetry/watch.rs`): each attempt, a retry's and a hedge's included,
//! starts an [`AttemptSpan`] from it, a child of the server span, whose `traceparent` the attempt
//! sends the backend in place of the client's (its `tracestate` passes on as it came); the
//! attempt's `Completion` ends it, as an [`AttemptWatch`], when the attempt settles. Its trace id is
//! the latency histograms' exemplar. An attempt started while another of the request
//! is in flight is a hedge (`duet.hedged`); one dropped before its response head, the race's loser,
//! ends `cancelled`.
//!
//! Finished spans go to the exporter through a bounded queue that never makes a worker wait
//! ([`export`]).

mod export;
mod otlp;
mod context;

pub(crate) use context::{push_hex, SpanId, TraceId};
pub(crate) use export::{Export, DROP_REASONS};

use crate::{
    headers::may_hold,
    outcome::{Blame, Ending},
    peer::Client,
    telemetry::watch::{AttemptWatch, RequestWatch},
};
use context::Parent;
use duet_config::Tracing;
use export::SpanQueue;
use http::{HeaderName, HeaderValue, Request, StatusCode, Version};
use otlp::{Kind, Span, Value};
use std::{
    cell::{Cell, RefCell},
    net::SocketAddr,
    rc::Rc,
    time::{SystemTime, UNIX_EPOCH},
};

/// W3C Trace Context's request field.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// A worker's tracer under one configuration: its sampler, and its end of the export queue.
pub(crate) struct Tracer {
    /// A request without a parent starts a trace when a draw is below this (every request when
    /// `always`).
    threshold: u64,
    always: bool,
    queue: SpanQueue,
}

impl Tracer {
    /// The tracer for `settings`, exporting through `export`'s queue for them.
    pub(crate) fn new(settings: &Tracing, export: &Export) -> Self {
        let sample = settings.sample.clamp(0.0, 1.0);
        Self {
            // `as` saturates: 1.0 would be `u64::MAX`, which a draw may equal, hence `always`.
            threshold: (sample * u64::MAX as f64) as u64,
            always: sample >= 1.0,
            queue: export.queue(settings),
        }
    }

    /// The trace of `request` on `route`, if it is traced (see the module docs).
    #[inline]
    pub(crate) fn start<B>(
        &self,
        request: &Request<B>,
        client: &Client,
        route: &str,
    ) -> Option<Rc<RequestTrace>> {
        // Most requests carry no `traceparent`: a pass over their few names says so for less
        // than the hashed look-up.
        let headers = request.headers();
        let parent = match may_hold(headers, &TRACEPARENT) {
            true => (headers.get(&TRACEPARENT)).and_then(|value| context::parse(value.as_bytes())),
            false => None,
        };
        match parent {
            Some(parent) if !parent.sampled => None,
            Some(parent) => Some(self.begin(request, client, route, Some(parent))),
            None if self.always || context::draw() < self.threshold => {
                Some(self.begin(request, client, route, None))
            }
            None => None,
        }
    }

    /// A traced request's server span, started.
    #[inline(never)]
    fn begin<B>(
        &self,
        request: &Request<B>,
        client: &Client,
        route: &str,
        parent: Option<Parent>,
    ) -> Rc<RequestTrace> {
        let headers = request.headers();
        let host = (request.uri().authority().map(|a| a.as_str().to_owned()))
            .or_else(|| text(headers.get(http::header::HOST)));
        let mut attributes = vec![
            (
                "http.request.method",
                Value::Text(request.method().to_string()),
            ),
            ("url.path", Value::Text(request.uri().path().to_owned())),
            (
                "url.scheme",
                Value::Text(if client.tls { "https" } else { "http" }.to_owned()),
            ),
            (
                "network.protocol.version",
                Value::Text(protocol(request.version()).to_owned()),
            ),
            (
                "client.address",
                Value::Text(client.address.ip().to_string()),
            ),
            ("duet.route", Value::Text(route.to_string())),
        ];
        if let Some(host) = host {
            attributes.push(("server.address", Value::Text(host)));
        }
        if let Some(agent) = text(headers.get(http::header::USER_AGENT)) {
            attributes.push(("user_agent.original", Value::Text(agent)));
        }
        Rc::new(RequestTrace {
            trace_id: parent.map_or_else(context::trace_id, |p| p.trace_id),
            span_id: context::span_id(),
            parent: parent.map(|p| p.span_id),
            trace_state: text(headers.get(TRACESTATE)),
            name: format!("{} {route}", request.method()),
            method: request.method().to_string(),
            start: now_nanos(),
            attributes: RefCell::new(attributes),
            status: Cell::new(None),
            attempts: Cell::new(0),
            in_flight: Cell::new(0),
            queue: self.queue.clone(),
        })
    }
}

/// A traced request: its server span, open until the last holder lets go (see the module docs).
pub(crate) struct RequestTrace {
    trace_id: TraceId,
    span_id: SpanId,
    parent: Option<SpanId>,
    trace_state: Option<String>,
    name: String,
    method: String,
    start: u64,
    attributes: RefCell<Vec<(&'static str, Value)>>,
    /// The status the client was sent, once known.
    status: Cell<Option<StatusCode>>,
    /// Attempts started, and those in flight now.
    attempts: Cell<u32>,
    in_flight: Cell<u32>,
    queue: SpanQueue,
}

impl RequestTrace {
    /// The trace's and the server span's ids (the access log's `trace_id` and `span_id`).
    pub(crate) fn ids(&self) -> (TraceId, SpanId) {
        (self.trace_id, self.span_id)
    }

    /// The request's route picked `cluster`.
    pub(crate) fn routed(&self, cluster: &str) {
        let value = Value::Text(cluster.to_owned());
        self.attributes.borrow_mut().push(("duet.cluster", value));
    }

    /// The client is sent `status`.
    pub(crate) fn respond(&self, status: StatusCode) {
        self.status.set(Some(status));
    }
}

impl RequestWatch for RequestTrace {
    /// An attempt to `backend` starts: its span, and the `traceparent` it sends.
    fn attempt(
        self: Rc<Self>,
        backend: SocketAddr,
    ) -> (Box<dyn AttemptWatch>, (HeaderName, HeaderValue)) {
        let attempt = self.attempts.get() + 1;
        self.attempts.set(attempt);
        let hedged = self.in_flight.get() > 0;
        self.in_flight.set(self.in_flight.get() + 1);
        let span_id = context::span_id();
        let traceparent = context::traceparent(&self.trace_id, &span_id);
        let span = AttemptSpan {
            trace: self,
            span_id,
            start: now_nanos(),
            attempt,
            hedged,
            backend,
        };
        (Box::new(span), (TRACEPARENT, traceparent))
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        let mut attributes = std::mem::take(self.attributes.get_mut());
        let status = self.status.get();
        if let Some(status) = status {
            let code = i64::from(status.as_u16());
            attributes.push(("http.response.status_code", Value::Int(code)));
        }
        let error = status.is_some_and(|s| s.is_server_error());
        if let Some(status) = status.filter(|_| error) {
            attributes.push(("error.type", Value::Text(status.as_u16().to_string())));
        }
        self.queue.push(Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            trace_state: self.trace_state.take(),
            name: std::mem::take(&mut self.name),
            kind: Kind::Server,
            start: self.start,
            end: now_nanos(),
            attributes,
            error,
        });
    }
}

/// One attempt's client span, ended by the attempt's `Completion` when it settles.
pub(crate) struct AttemptSpan {
    trace: Rc<RequestTrace>,
    span_id: SpanId,
    start: u64,
    /// 1 for the first attempt.
    attempt: u32,
    /// Started while another attempt of the request was in flight: a hedge.
    hedged: bool,
    backend: SocketAddr,
}

impl AttemptWatch for AttemptSpan {
    /// The id of the trace the attempt is a span of.
    fn exemplar(&self) -> TraceId {
        self.trace.trace_id
    }

    /// The attempt's span ends: its attributes say how it ended.
    fn end(self: Box<Self>, status: Option<StatusCode>, ended: Option<Ending>, backend_text: &str) {
        let trace = &self.trace;
        trace.in_flight.set(trace.in_flight.get().saturating_sub(1));
        let (outcome, failed) = outcome(status, ended);
        let mut attributes = vec![
            ("http.request.method", Value::Text(trace.method.clone())),
            (
                "server.address",
                Value::Text(host_of(backend_text).to_owned()),
            ),
            ("server.port", Value::Int(i64::from(self.backend.port()))),
            ("duet.backend", Value::Text(backend_text.to_owned())),
            ("duet.attempt", Value::Int(i64::from(self.attempt))),
            ("duet.hedged", Value::Bool(self.hedged)),
            ("duet.outcome", Value::Text(outcome.to_owned())),
        ];
        if let Some(status) = status {
            let code = i64::from(status.as_u16());
            attributes.push(("http.response.status_code", Value::Int(code)));
        }
        let error = failed || status.is_some_and(|s| s.is_server_error());
        if error {
            let kind = match status {
                Some(status) if !failed => status.as_u16().to_string(),
                _ => outcome.to_owned(),
            };
            attributes.push(("error.type", Value::Text(kind)));
        }
        trace.queue.push(Span {
            trace_id: trace.trace_id,
            span_id: self.span_id,
            parent: Some(trace.span_id),
            trace_state: trace.trace_state.clone(),
            name: trace.method.clone(),
            kind: Kind::Client,
            start: self.start,
            end: now_nanos(),
            attributes,
            error,
        });
    }
}

/// An attempt span's `duet.outcome`, and whether the attempt failed.
fn outcome(status: Option<StatusCode>, ended: Option<Ending>) -> (&'static str, bool) {
    let Some(ended) = ended else {
        // Dropped unfinished: after its head the client went away; before it, the attempt was
        // cancelled (a hedge race's loser, the route's timeout).
        return if status.is_some() {
            ("client_gone", false)
        } else {
            ("cancelled", false)
        };
    };
    match ended {
        Ending::NoResponse(Blame::Client) => ("client_error", true),
        Ending::NoResponse(Blame::Local) => ("local_error", true),
        Ending::Refused => ("refused", true),
        ended => {
            let upgraded = status == Some(StatusCode::SWITCHING_PROTOCOLS);
            (ended.log_outcome(upgraded), ended.blame() == Blame::Backend)
        }
    }
}

/// The address of `IP:PORT` (`[IP]:PORT` for IPv6) without its port and brackets.
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn text(value: Option<&HeaderValue>) -> Option<String> {
    value.and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        _ => "1.1",
    }
}

fn now_nanos() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_s_server_address_is_its_backend_s_without_the_port() {
        assert_eq!(host_of("127.0.0.1:9001"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9001"), "::1");
    }

    #[test]
    fn an_attempt_dropped_before_its_head_was_cancelled_and_after_it_the_client_went_away() {
        let ok = Some(StatusCode::OK);
        assert_eq!(outcome(None, None), ("cancelled", false));
        assert_eq!(outcome(ok, None), ("client_gone", false));
        assert_eq!(outcome(ok, Some(Ending::Complete)), ("complete", false));
        let failed = Some(Ending::NoResponse(Blame::Backend));
        assert_eq!(outcome(None, failed), ("backend_error", true));
        let local = Some(Ending::NoResponse(Blame::Local));
        assert_eq!(outcome(None, local), ("local_error", true));
        assert_eq!(
            outcome(ok, Some(Ending::BodyTimeout)),
            ("backend_read_timeout", true)
        );
    }
}
