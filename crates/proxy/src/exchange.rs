//! What passes between the stages of one exchange: the prepared request, how its attempts failed, the
//! upgrade it asks for, and what its connection needs to know about it. Below the stages, so each stage
//! can be read knowing only this.

use crate::{
    attempt::completion::Completion,
    backend::request_body::BodySource,
    backend::sticky::Session,
    error::ProxyError,
    header_copy::HeaderCopy,
    peer::TlsSession,
    telemetry::{access_log::AccessLog, metrics::WorkerCounters, watch::RequestWatch},
    tunnel::PendingTunnel,
};
use http::{request::Parts, HeaderMap, HeaderName, HeaderValue, Response};
use hyper::body::Incoming;
use std::{
    cell::{Cell, RefCell},
    net::SocketAddr,
    rc::Rc,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};
use tokio::sync::{Semaphore, SemaphorePermit};

/// A request ready to be sent to any backend of its cluster, as often as retries need.
pub(crate) struct Prepared {
    /// Method, target, version and the rewritten headers. The headers are empty once an attempt has
    /// taken them ([`Prepared::lend_headers`], [`Prepared::take_headers`]): read them before, or ask
    /// [`Prepared::attempt_headers`].
    pub(crate) parts: Parts,
    /// The body each attempt gets.
    pub(crate) source: BodySource,
    /// The protocol upgrade the request asks for, if duet tunnels it.
    pub(crate) upgrade: Option<Upgrade>,
    /// The headers' fields, kept when an attempt that may be followed by another took the map.
    lent: Option<HeaderCopy>,
    /// The hash of the request's affinity key under `policy: hash`, if it has one.
    pub(crate) affinity: Option<u64>,
    /// The request's sticky session, under `sticky:`.
    pub(crate) session: Session,
    /// The client a PROXY header names, when the cluster sends one: its connections are pooled per
    /// client.
    pub(crate) client: Option<SocketAddr>,
    /// What follows the request through its attempts (its trace, when it is traced): each
    /// attempt starts its own watch from it.
    pub(crate) watch: Option<Rc<dyn RequestWatch>>,
}

impl Prepared {
    pub(crate) fn new(parts: Parts, source: BodySource, upgrade: Option<Upgrade>) -> Self {
        Self {
            parts,
            source,
            upgrade,
            lent: None,
            affinity: None,
            session: Session::Off,
            client: None,
            watch: None,
        }
    }

    /// The headers for an attempt that another may follow: the map itself the first time (its fields
    /// kept), rebuilt from those fields after.
    pub(crate) fn lend_headers(&mut self) -> HeaderMap {
        match &self.lent {
            Some(copy) => copy.to_map(),
            None => {
                self.lent = Some(HeaderCopy::of(&self.parts.headers));
                std::mem::take(&mut self.parts.headers)
            }
        }
    }

    /// The headers for the last attempt, which nothing follows: nothing kept.
    pub(crate) fn take_headers(&mut self) -> HeaderMap {
        match self.lent.take() {
            Some(copy) => copy.to_map(),
            None => std::mem::take(&mut self.parts.headers),
        }
    }

    /// The attempt settled by `completion` starts: if the request is watched, the attempt's
    /// watch starts, and the field its request then carries (each resend too) is returned.
    #[inline]
    pub(crate) fn attempt_field(
        &self,
        completion: &mut Completion,
    ) -> Option<(HeaderName, HeaderValue)> {
        let watch = self.watch.as_ref()?;
        Some(completion.watch(Rc::clone(watch)))
    }

    /// A copy of the headers, for an attempt that cannot take them (a hedge, a resend).
    pub(crate) fn attempt_headers(&self) -> HeaderMap {
        match &self.lent {
            Some(copy) => copy.to_map(),
            None => self.parts.headers.clone(),
        }
    }
}

/// A protocol upgrade the request asks for. The client's side of the tunnel is the connection itself,
/// taken back from hyper once the `101` is written (see `conn/serve.rs`).
pub(crate) struct Upgrade {
    pub(crate) protocol: HeaderValue,
}

/// An attempt (or a request's attempts) that got no usable response, with the access-log record.
pub(crate) struct Failed {
    pub(crate) error: ProxyError,
    pub(crate) log: Option<Box<AccessLog>>,
}

/// What the attempts came to: the answering backend's response with its attempt's completion, or why
/// none answered.
pub(crate) type Outcome = Result<(Response<Incoming>, Completion), Failed>;

/// What a connection's requests tell the loop that serves it.
#[derive(Default)]
pub(crate) struct ConnectionState {
    /// Requests started on this connection.
    pub(crate) requests: Cell<u64>,
    /// Requests whose response head is not yet out.
    pub(crate) in_service: Cell<u32>,
    /// A `101` went out: the connection becomes a tunnel to this backend once hyper hands it back.
    pub(crate) tunnel: RefCell<Option<PendingTunnel>>,
    /// What the connection's bodies read in full (`buffer_request`, or small enough to replay) may
    /// hold at once.
    pub(crate) buffering: BufferBudget,
    /// What its TLS handshake negotiated (for the access log); `None` over plain TCP.
    pub(crate) tls: Option<TlsSession>,
    /// The `X-Forwarded-Client-Cert` its requests carry, when its client presented a certificate.
    pub(crate) certificate: Option<HeaderValue>,
}

/// The bytes a connection's bodies read in full may hold at once: as much as the largest one its
/// requests may hold (their `buffer_request`, or `retries.replay_body_limit`), and at least
/// [`BUFFER_FLOOR`]. An HTTP/1.1 connection carries one request at a time anyway; an HTTP/2
/// connection's streams share the budget, so what buffered bodies hold stays what
/// `limits.max_connections` bounds rather than growing with the streams. A stream waiting for its
/// share reads nothing of its body, so flow control holds the client's bytes back: window is granted
/// only within the budget.
pub(crate) struct BufferBudget {
    bytes: Semaphore,
    capacity: Cell<usize>,
}

impl Default for BufferBudget {
    fn default() -> Self {
        Self {
            bytes: Semaphore::const_new(0),
            capacity: Cell::new(0),
        }
    }
}

/// What a body read in full holds until its request is done: its share of its connection's budget
/// and of its worker's (`limits.max_buffered_bytes`).
pub(crate) struct BufferHold<'c> {
    _connection: SemaphorePermit<'c>,
    _worker: WorkerBuffered,
}

impl<'c> BufferHold<'c> {
    pub(crate) fn new(connection: SemaphorePermit<'c>, worker: WorkerBuffered) -> Self {
        Self {
            _connection: connection,
            _worker: worker,
        }
    }
}

/// A worker's budget for bodies read in full: what they hold now is counted in its
/// `WorkerCounters::buffered`, up to `limit` (`limits.max_buffered_bytes`).
#[derive(Clone, Copy)]
pub(crate) struct WorkerBuffers<'w> {
    pub(crate) counters: &'w Arc<WorkerCounters>,
    pub(crate) limit: usize,
}

impl WorkerBuffers<'_> {
    /// `bytes` of the worker's budget, given back when what is returned is dropped; `None`, counted,
    /// if the worker holds too much already: duet answers 503 rather than grow.
    pub(crate) fn reserve(self, bytes: usize) -> Option<WorkerBuffered> {
        let mut held = WorkerBuffered {
            counters: self.counters.clone(),
            limit: self.limit as u64,
            bytes: 0,
        };
        held.grow_to(bytes).then_some(held)
    }
}

/// Bytes of a worker's buffering budget, held until dropped.
pub(crate) struct WorkerBuffered {
    counters: Arc<WorkerCounters>,
    limit: u64,
    bytes: u64,
}

impl WorkerBuffered {
    /// Holds `bytes` in all, if it holds fewer; `false`, counted, if the worker's budget does not
    /// have them: duet answers 503 rather than grow.
    pub(crate) fn grow_to(&mut self, bytes: usize) -> bool {
        let more = (bytes as u64).saturating_sub(self.bytes);
        if more == 0 {
            return true;
        }
        let held = self.counters.buffered.fetch_add(more, Relaxed);
        if held.saturating_add(more) > self.limit {
            self.counters.buffered.fetch_sub(more, Relaxed);
            self.counters.buffer_refused.fetch_add(1, Relaxed);
            return false;
        }
        self.bytes += more;
        true
    }
}

impl Drop for WorkerBuffered {
    fn drop(&mut self) {
        self.counters.buffered.fetch_sub(self.bytes, Relaxed);
    }
}

/// A connection's buffering budget is at least this (duet's default HTTP/2 connection window): small
/// bodies kept for retries do not take turns below it.
const BUFFER_FLOOR: usize = 1024 * 1024;

impl ConnectionState {
    pub(crate) fn expect_tunnel(&self, pending: PendingTunnel) {
        *self.tunnel.borrow_mut() = Some(pending);
    }

    /// How many requests this connection has carried (the current one included).
    pub(crate) fn requests(&self) -> u64 {
        self.requests.get()
    }

    /// Waits, up to `wait`, for `bytes` of the connection's buffering budget for a body that may hold
    /// up to `limit` (the budget grows to that if it is smaller); they are held as long as what is
    /// returned. `None` if the wait ran out.
    pub(crate) async fn reserve_buffer(
        &self,
        bytes: usize,
        limit: usize,
        wait: Duration,
    ) -> Option<SemaphorePermit<'_>> {
        let budget = &self.buffering;
        // A semaphore counts in `u32`s at a time: no budget is larger.
        let limit = limit.max(BUFFER_FLOOR).min(u32::MAX as usize);
        let capacity = budget.capacity.get();
        if limit > capacity {
            budget.bytes.add_permits(limit - capacity);
            budget.capacity.set(limit);
        }
        let bytes = u32::try_from(bytes.min(budget.capacity.get())).unwrap_or(u32::MAX);
        let reserved = tokio::time::timeout(wait, budget.bytes.acquire_many(bytes)).await;
        reserved.ok()?.ok()
    }
}

/// Counts a request as in service until its response head is out (or it is cancelled).
pub(crate) struct InService(Rc<ConnectionState>);

impl InService {
    pub(crate) fn new(state: Rc<ConnectionState>) -> Self {
        state.requests.set(state.requests.get() + 1);
        state.in_service.set(state.in_service.get() + 1);
        Self(state)
    }

    /// The connection the request came on.
    pub(crate) fn connection(&self) -> &ConnectionState {
        &self.0
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        self.0.in_service.set(self.0.in_service.get() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header_copy::tests::wire as fields;

    #[tokio::test(start_paused = true)]
    async fn bodies_share_their_connections_budget_and_wait_beyond_it() {
        let connection = ConnectionState::default();
        let wait = Duration::from_secs(1);
        let mib = 1024 * 1024;
        // Small bodies kept for retries share the floor.
        let small: Vec<_> = small_bodies(&connection, 100, wait).await;
        assert_eq!(small.len(), 100, "a hundred 10 KB bodies at once");
        drop(small);
        // A body that may hold 4 MiB grows the budget to that, and a second waits for it.
        let first = connection.reserve_buffer(4 * mib, 4 * mib, wait).await;
        assert!(first.is_some());
        let second = connection.reserve_buffer(4 * mib, 4 * mib, wait).await;
        assert!(second.is_none(), "its wait ran out");
        drop(first);
        let third = connection.reserve_buffer(4 * mib, 4 * mib, wait).await;
        assert!(third.is_some(), "the budget came back");
    }

    #[test]
    fn a_worker_holds_no_more_than_its_budget_and_gets_it_back() {
        let counters = Arc::new(WorkerCounters::default());
        let worker = WorkerBuffers {
            counters: &counters,
            limit: 1000,
        };
        let held = |c: &WorkerCounters| c.buffered.load(Relaxed);
        let mut first = worker.reserve(600).expect("within the budget");
        assert!(worker.reserve(600).is_none(), "past it");
        let mut second = worker.reserve(0).expect("nothing yet");
        assert!(second.grow_to(300));
        assert!(!second.grow_to(500), "it may not grow past the budget");
        assert!(first.grow_to(600), "what it holds already");
        assert_eq!(held(&counters), 900);
        assert_eq!(counters.buffer_refused.load(Relaxed), 2);
        drop((first, second));
        assert_eq!(held(&counters), 0, "given back");
    }

    async fn small_bodies(
        connection: &ConnectionState,
        count: usize,
        wait: Duration,
    ) -> Vec<SemaphorePermit<'_>> {
        let mut held = Vec::new();
        for _ in 0..count {
            match connection.reserve_buffer(10_000, 64 * 1024, wait).await {
                Some(permit) => held.push(permit),
                None => break,
            }
        }
        held
    }

    fn prepared() -> Prepared {
        let (parts, ()) = http::Request::get("/")
            .header("host", "example.com")
            .header("cookie", "a=1")
            .header("x-request-id", "abc")
            .header("cookie", "b=2")
            .body(())
            .expect("request")
            .into_parts();
        Prepared::new(parts, BodySource::Empty, None)
    }

    #[test]
    fn every_attempt_gets_the_same_headers_whether_lent_taken_or_copied() {
        let mut request = prepared();
        let original = fields(&request.parts.headers);
        assert_eq!(original.len(), 4);

        // The first attempt takes the map itself; the fields stay for the next ones.
        let first = request.lend_headers();
        assert_eq!(fields(&first), original);
        assert!(request.parts.headers.is_empty(), "moved, not copied");
        // A resend or a hedge while it is out, a retry after it, and the last attempt.
        assert_eq!(fields(&request.attempt_headers()), original);
        assert_eq!(fields(&request.lend_headers()), original);
        assert_eq!(fields(&request.take_headers()), original);

        // A single attempt that nothing follows moves the map and keeps nothing.
        let mut single = prepared();
        assert_eq!(fields(&single.take_headers()), original);
        assert!(single.lent.is_none());
    }
}
