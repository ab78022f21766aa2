//! The one completion hook: everything that must happen when an attempt ends, settled exactly once.
//!
//! A `Completion` is made when the balancer claims a backend for an attempt and owns, for that
//! attempt, the load guard (load −1 and the PeakEWMA latency sample), the outlier verdict and the
//! request's access-log record. It is settled in `Drop`, so whichever way the attempt ends — the
//! response body ends, the body fails, the client goes away and the body is dropped, or the attempt
//! fails before a response — it settles once and only once:
//!
//! | how the attempt ended | outlier verdict | latency sample |
//! |---|---|---|
//! | body ended, status below 500 | success | elapsed time (penalty for 429) |
//! | body ended, status 5xx | 5xx (ejects only with `consecutive_5xx`) | elapsed time (penalty for 503) |
//! | backend failed mid-body | **failure** | elapsed time |
//! | backend sent nothing for `timeouts.read` mid-body | **failure** | elapsed time |
//! | client went away mid-body | none (a 5xx still counts) | elapsed time |
//! | no response: backend's fault | failure | penalty |
//! | no response: client's fault (its body broke or stalled) or duet's | none | none |
//!
//! A status in `penalty_statuses` only records the penalty: it never ejects, `Retry-After` or not, since
//! a `429` (and often a `503`) speaks of one client's quota, and one client could otherwise take
//! backends out of rotation for everyone (Envoy never ejects on a 429 either).

use crate::{
    backend::cluster::Cluster,
    backend::transport::Hold,
    outcome::{Blame, Ending, Failure},
    spare::{self, SpareBoxes},
    telemetry::access_log::AccessLog,
    telemetry::done::{self, Done, Observer},
    telemetry::metrics::{BackendStats, RouteTimings},
    telemetry::watch::{AttemptWatch, RequestWatch},
};
use crate::{grpc, headers::may_hold};
use duet_balance::LoadGuard;
use http::{response::Parts, HeaderMap, HeaderName, StatusCode};
use std::{
    mem::ManuallyDrop,
    net::SocketAddr,
    ops::{Deref, DerefMut},
    rc::Rc,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};
use tokio::time::Instant;

/// One attempt's settlement: see the module docs.
///
/// A pointer to its state: the attempt's result passes through every stage and into the response
/// body, and a pointer moves where the state's two hundred bytes would be copied at each step (700
/// instructions a request). The state's box is one of the worker's spares ([`spare`]): no allocation
/// more per request.
pub(crate) struct Completion(ManuallyDrop<Box<Settlement>>);

/// What a [`Completion`] settles, and settles in its `Drop`.
pub(crate) struct Settlement {
    cluster: Rc<Cluster>,
    backend: SocketAddr,
    /// This worker's cells for the backend.
    stats: Arc<BackendStats>,
    /// When the attempt started.
    attempt_started: Instant,
    /// When its request arrived, and its route's histograms: set once it carries the response.
    request: Option<(Instant, Arc<RouteTimings>)>,
    status: Option<StatusCode>,
    /// The route's filters acting in the done phase, if it has any.
    observer: Option<Rc<dyn Observer>>,
    /// How it ended, once it has; `None` when dropped unfinished (the client went away).
    ended: Option<Ending>,
    log: Option<Box<AccessLog>>,
    /// The connection the response comes on, pooled again if its body ends cleanly (unless upgraded:
    /// then kept, unpooled, until the attempt settles).
    lease: Option<Hold>,
    upgraded: bool,
    /// The response goes to no client (a mirror's copy, read and dropped): its bytes are not counted as
    /// passed to clients.
    dropped_response: bool,
    /// What follows the attempt until it settles (its span, when its request is traced).
    watch: Option<Box<dyn AttemptWatch>>,
    // Dropped last, after the verdict: the load is released once the attempt is fully settled.
    guard: LoadGuard,
}

thread_local! {
    /// Settled attempts' boxes, for the worker's next attempts (more than it has in flight, mostly).
    static SPARE_SETTLEMENTS: SpareBoxes<Settlement> = const { SpareBoxes::new(64) };
}

impl Deref for Completion {
    type Target = Settlement;

    fn deref(&self) -> &Settlement {
        &self.0
    }
}

impl DerefMut for Completion {
    fn deref_mut(&mut self) -> &mut Settlement {
        &mut self.0
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        // SAFETY: the box is taken here alone, and once: `drop` runs once, and nothing reads
        // `self.0` after it.
        #[allow(unsafe_code)]
        let settlement = unsafe { ManuallyDrop::take(&mut self.0) };
        // Settles (the state's `Drop`) and keeps the box.
        spare::recycle(&SPARE_SETTLEMENTS, settlement);
    }
}

impl Completion {
    /// `stats` are this worker's cells for `backend` (held by the balancer beside it).
    pub(crate) fn new(
        guard: LoadGuard,
        cluster: Rc<Cluster>,
        backend: SocketAddr,
        stats: Arc<BackendStats>,
    ) -> Self {
        let settlement = || Settlement {
            stats,
            cluster,
            backend,
            attempt_started: Instant::now(),
            request: None,
            status: None,
            observer: None,
            ended: None,
            log: None,
            lease: None,
            upgraded: false,
            dropped_response: false,
            watch: None,
            guard,
        };
        Self(ManuallyDrop::new(spare::boxed(
            &SPARE_SETTLEMENTS,
            settlement,
        )))
    }

    /// The response goes to no client (a mirror's): it is read and dropped, and its bytes are not
    /// counted as passed to clients (`duet_response_body_bytes_total`).
    pub(crate) fn drop_response(&mut self) {
        self.dropped_response = true;
    }

    /// The attempt of a watched request: it starts the attempt's watch from `request`'s, and
    /// settles it when it settles. Returns the field the attempt's request carries.
    #[inline(never)]
    pub(crate) fn watch(
        &mut self,
        request: Rc<dyn RequestWatch>,
    ) -> (http::HeaderName, http::HeaderValue) {
        let (watch, field) = request.attempt(self.backend);
        self.watch = Some(watch);
        field
    }

    /// The response arrived on `lease`'s connection (or stream).
    pub(crate) fn lend(&mut self, lease: Hold) {
        self.lease = Some(lease);
    }

    /// The connection will not carry another request (it was upgraded): never pool it again.
    pub(crate) fn upgraded(&mut self) {
        self.upgraded = true;
    }

    /// The attempt got its response: it now carries the request (its arrival time, for the latency
    /// histograms, its route's done-phase filters and its access-log record) to the end, where it
    /// hands them the finished request ([`done`]).
    pub(crate) fn attach_request(
        &mut self,
        started: Instant,
        timings: Arc<RouteTimings>,
        observer: Option<Rc<dyn Observer>>,
        mut log: Option<Box<AccessLog>>,
    ) {
        if let Some(log) = log.as_mut() {
            log.backend = Some(self.backend);
        }
        let now = Instant::now();
        let exemplar = self.watch.as_ref().map(|watch| watch.exemplar());
        let exemplar = exemplar.as_ref();
        timings
            .response_head
            .observe_with(now.saturating_duration_since(started), exemplar);
        self.request = Some((started, timings));
        self.observer = observer;
        let head_time = now.saturating_duration_since(self.attempt_started);
        self.stats.header_time.observe_with(head_time, exemplar);
        if let Some(log) = log.as_mut() {
            log.upstream_head_ms = Some(head_time.as_secs_f64() * 1000.0);
            if let Some(Hold::Lease(lease)) = &self.lease {
                log.connect_ms = lease.connected_in().map(|t| t.as_secs_f64() * 1000.0);
            }
        }
        self.log = log;
    }

    /// How long the backend may send nothing mid-body.
    pub(crate) fn read_timeout(&self) -> Duration {
        self.cluster.read_timeout()
    }

    /// The backend this attempt went to.
    pub(crate) fn backend(&self) -> SocketAddr {
        self.backend
    }

    /// When the attempt started: its request is sent from then on.
    pub(crate) fn started(&self) -> Instant {
        self.attempt_started
    }

    /// The response head arrived: a status the cluster penalises (429, 503 by default) records the
    /// PeakEWMA penalty instead of a latency.
    pub(crate) fn on_head(&mut self, head: &Parts) {
        let status = head.status;
        self.status = Some(status);
        self.stats.response(status.as_u16());
        if let Some(log) = self.log.as_mut() {
            log.status = status;
        }
        // A trailers-only gRPC answer (an error, usually) carries its status in the head.
        if let Some(code) = head_grpc_status(&head.headers) {
            self.grpc_status(code);
        }
        let penalised = self.cluster.penalised.contains(status);
        self.guard.on_response_head(penalised);
    }

    /// The response's trailers passed to the client: a gRPC call's status is there.
    pub(crate) fn on_trailers(&mut self, trailers: &HeaderMap) {
        if let Some(code) = grpc::status_of(trailers) {
            self.grpc_status(code);
        }
    }

    fn grpc_status(&mut self, code: u8) {
        self.cluster.counters.grpc_status(code);
        if let Some(log) = self.log.as_mut() {
            log.grpc_status = Some(code);
        }
    }

    /// The client gets `bytes` of duet's (an error page) in place of the response's body, which is
    /// read and dropped: the access log counts the page, the body's bytes count nowhere.
    pub(crate) fn replace_body(&mut self, bytes: usize) {
        self.dropped_response = true;
        if let Some(log) = self.log.as_mut() {
            log.bytes = bytes as u64;
        }
    }

    /// Response body bytes passed to the client.
    pub(crate) fn on_data(&mut self, bytes: usize) {
        if self.dropped_response {
            return;
        }
        let sent = &self.cluster.counters.bytes_sent;
        sent.fetch_add(bytes as u64, Relaxed);
        if let Some(log) = self.log.as_mut() {
            log.bytes += bytes as u64;
        }
    }

    /// The response body ended. Settles now (its connection pooled again if it ended cleanly).
    /// `how` is `Complete`, `BodyReset` or `BodyTimeout`.
    pub(crate) fn end(mut self, how: Ending) {
        if how == Ending::BodyTimeout {
            self.cluster.counters.read_timeouts.fetch_add(1, Relaxed);
        }
        self.ended = Some(how);
    }

    /// Counts how the attempt failed against its backend (`duet_backend_failures_total`).
    pub(crate) fn count_failure(&self, kind: Failure) {
        self.stats.failure(kind);
    }

    /// The attempt got no response. Settles now.
    pub(crate) fn fail(mut self, blame: Blame) {
        self.ended = Some(Ending::NoResponse(blame));
    }

    /// The response cannot be passed on (say, a `101` to a request that asked for no upgrade): the
    /// backend's fault. Settles now and hands back the access-log record for the error response.
    pub(crate) fn reject(mut self) -> Option<Box<AccessLog>> {
        self.ended = Some(Ending::Refused);
        // What the client is sent instead (for the done phase; a gRPC call's is a 200 with its
        // `grpc-status`, told by the access log).
        self.status = Some(StatusCode::BAD_GATEWAY);
        self.log.take()
    }
}

/// `grpc-status` in a response head, looked up only where a pass over the head's names may find it
/// ([`may_hold`]): per response, gRPC or not.
fn head_grpc_status(headers: &HeaderMap) -> Option<u8> {
    if !may_hold(headers, &GRPC_STATUS) {
        return None;
    }
    grpc::status_of(headers)
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

impl Drop for Settlement {
    fn drop(&mut self) {
        let now = Instant::now();
        // Pooled again with this reading of the clock (it starts the connection's idle time).
        if self.ended == Some(Ending::Complete) && !self.upgraded {
            if let Some(Hold::Lease(lease)) = self.lease.take() {
                lease.release(now);
            }
        }
        self.settle(now);
        let exemplar = self.watch.take().map(|watch| self.end_watch(watch));
        // The request is done once every verdict is in; timed with the clock reading the pool took,
        // rather than a reading of its own.
        if let Some((started, timings)) = &self.request {
            let done = Done {
                route: &timings.route,
                status: self.status.unwrap_or(StatusCode::OK),
                duration: now.saturating_duration_since(*started),
                backend: Some(self.backend),
                exemplar,
            };
            let (observer, log) = (self.observer.as_deref(), self.log.take());
            done::finish(&done, timings, observer, log, &self.stats.address_text);
        }
    }
}

impl Settlement {
    /// Ends the attempt's watch (its span), out of the way of the unwatched attempts' path; returns
    /// the id of the request's latency exemplar.
    #[inline(never)]
    fn end_watch(&self, watch: Box<dyn AttemptWatch>) -> [u8; 16] {
        let exemplar = watch.exemplar();
        watch.end(self.status, self.ended, &self.stats.address_text);
        exemplar
    }

    /// The outlier verdict, the load's latency sample and the failure counted, by how it ended.
    fn settle(&mut self, now: Instant) {
        let ending = self.ended.unwrap_or(Ending::ClientGone);
        match ending.blame() {
            Blame::Client | Blame::Local => {
                self.guard.discard_sample();
                return;
            }
            Blame::Backend => {
                if matches!(ending, Ending::NoResponse(_)) {
                    self.guard.on_failure();
                }
                self.cluster.record_failure(self.backend, now);
            }
            Blame::Nobody if self.status.is_some_and(|s| s.is_server_error()) => {
                self.cluster.record_server_error(self.backend, now);
            }
            Blame::Nobody if ending == Ending::Complete => {
                self.cluster.record_success(self.backend, now);
            }
            Blame::Nobody => {}
        }
        if let Some(kind) = ending.failure() {
            self.stats.failure(kind);
        }
        if let Some(log) = self.log.as_mut() {
            let upgraded = self.status == Some(StatusCode::SWITCHING_PROTOCOLS);
            log.outcome = ending.log_outcome(upgraded);
        }
    }
}

/// The settlement table of the module docs, row by row: each way an attempt can end, with the outlier
/// verdict (one failure ejects here), the failure kind counted, and the load released exactly once.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster::Upstream;

    /// How a test attempt goes: the response status (if one came) and how it settles.
    #[derive(Debug, Clone, Copy)]
    enum Settle {
        Body(u16, Ending),
        /// The client went away: the body is dropped unfinished.
        Dropped(u16),
        Rejected(u16),
        NoResponse(Blame),
    }

    #[test]
    fn a_head_s_grpc_status_is_found_among_few_fields_and_among_many() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            "application/grpc".parse().expect("value"),
        );
        assert_eq!(head_grpc_status(&headers), None);
        headers.insert("x-custom", "1".parse().expect("value"));
        assert_eq!(head_grpc_status(&headers), None);
        headers.insert("grpc-status", "14".parse().expect("value"));
        assert_eq!(head_grpc_status(&headers), Some(14));
        // Past the scanned few, the hashed look-up finds it.
        for i in 0..20 {
            let name = http::HeaderName::try_from(format!("x-field-{i}")).expect("name");
            headers.insert(name, "v".parse().expect("value"));
        }
        assert_eq!(head_grpc_status(&headers), Some(14));
        headers.remove("grpc-status");
        assert_eq!(head_grpc_status(&headers), None);
    }

    /// A cluster of two backends (never connected to) that one failure, or one 5xx, ejects.
    fn cluster() -> Rc<Cluster> {
        crate::backend::cluster::for_tests(
            &["127.0.0.1:9", "127.0.0.1:10"],
            ", outlier_detection: { consecutive_failures: 1, consecutive_5xx: 1, max_ejection_percent: 100% }",
        )
    }

    fn head(status: u16) -> Parts {
        let response = http::Response::builder()
            .status(status)
            .body(())
            .expect("response");
        response.into_parts().0
    }

    /// Runs one attempt to the end; returns (ejected, failure kinds counted, in flight after).
    fn settle(how: Settle) -> (bool, Vec<&'static str>, u64) {
        let cluster = cluster();
        let (backend, Upstream { stats, .. }, guard) = cluster
            .pick(&[], (None, crate::backend::sticky::Session::Off))
            .expect("a backend");
        let in_flight = |c: &Cluster| {
            c.with_balance(|b| b.endpoint_load(&backend).map(|l| l.in_flight()))
                .expect("the backend")
        };
        assert_eq!(in_flight(&cluster), 1, "counted as load while it runs");
        let mut completion = Completion::new(guard, cluster.clone(), backend, stats.clone());
        match how {
            Settle::Body(status, end) => {
                completion.on_head(&head(status));
                completion.end(end);
            }
            Settle::Dropped(status) => {
                completion.on_head(&head(status));
                drop(completion);
            }
            Settle::Rejected(status) => {
                completion.on_head(&head(status));
                let _log = completion.reject();
            }
            Settle::NoResponse(fault) => completion.fail(fault),
        }
        let ejected = stats.ejections.load(Relaxed) > 0;
        let kinds = Failure::ALL
            .iter()
            .zip(&stats.failures)
            .filter(|(_, count)| count.load(Relaxed) > 0)
            .map(|(kind, _)| kind.label())
            .collect();
        (ejected, kinds, in_flight(&cluster))
    }

    // A local set: an ejection schedules its end on the worker's runtime.
    #[tokio::test(start_paused = true)]
    async fn every_way_an_attempt_ends_settles_once_with_its_verdict() {
        tokio::task::LocalSet::new()
            .run_until(async { table() })
            .await;
    }

    fn table() {
        use Ending::{BodyReset, BodyTimeout, Complete};
        let rows: [(Settle, bool, &[&str]); 11] = [
            (Settle::Body(200, Complete), false, &[]),
            (Settle::Body(404, Complete), false, &[]),
            (Settle::Body(500, Complete), true, &[]),
            (Settle::Body(200, BodyReset), true, &["body_reset"]),
            (Settle::Body(200, BodyTimeout), true, &["body_timeout"]),
            (Settle::Dropped(200), false, &[]),
            (Settle::Dropped(502), true, &[]),
            (Settle::Rejected(101), true, &["protocol"]),
            // The connect/timeout/protocol kind of a failed attempt is counted by forward, which
            // knows it; the completion only gives the verdict.
            (Settle::NoResponse(Blame::Backend), true, &[]),
            (Settle::NoResponse(Blame::Client), false, &[]),
            (Settle::NoResponse(Blame::Local), false, &[]),
        ];
        for (how, ejected, kinds) in rows {
            let (was_ejected, counted, in_flight) = settle(how);
            assert_eq!(was_ejected, ejected, "{how:?}: outlier verdict");
            assert_eq!(counted, kinds, "{how:?}: failure kinds");
            assert_eq!(in_flight, 0, "{how:?}: load released once");
        }
    }
}
