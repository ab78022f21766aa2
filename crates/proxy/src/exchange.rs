//! What passes between the stages of one exchange: the prepared request, how its attempts failed, the
//! upgrade it asks for, and what its connection needs to know about it. Below the stages, so each stage
//! can be read knowing only this.

use crate::{
    attempt::completion::Completion, backend::request_body::BodySource, error::ProxyError,
    header_copy::HeaderCopy, telemetry::access_log::AccessLog, tunnel::PendingTunnel,
};
use http::{request::Parts, HeaderMap, HeaderValue, Response};
use hyper::body::Incoming;
use std::{
    cell::{Cell, RefCell},
    rc::Rc,
};

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
}

impl Prepared {
    pub(crate) fn new(parts: Parts, source: BodySource, upgrade: Option<Upgrade>) -> Self {
        Self {
            parts,
            source,
            upgrade,
            lent: None,
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
}

impl ConnectionState {
    pub(crate) fn expect_tunnel(&self, pending: PendingTunnel) {
        *self.tunnel.borrow_mut() = Some(pending);
    }

    /// How many requests this connection has carried (the current one included).
    pub(crate) fn requests(&self) -> u64 {
        self.requests.get()
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
