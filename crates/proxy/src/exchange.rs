//! What passes between the stages of one exchange: the prepared request, how its attempts failed, the
//! upgrade it asks for, and what its connection needs to know about it. Below the stages, so each stage
//! can be read knowing only this.

use crate::{
    attempt::completion::Completion, backend::request_body::BodySource, error::ProxyError,
    telemetry::access_log::AccessLog, tunnel::PendingTunnel,
};
use http::{request::Parts, HeaderValue, Response};
use hyper::body::Incoming;
use std::{
    cell::{Cell, RefCell},
    rc::Rc,
};

/// A request ready to be sent to any backend of its cluster, as often as retries need.
pub(crate) struct Prepared {
    /// Method, target, version and the rewritten headers.
    pub(crate) parts: Parts,
    /// The body each attempt gets.
    pub(crate) source: BodySource,
    /// The protocol upgrade the request asks for, if duet tunnels it.
    pub(crate) upgrade: Option<Upgrade>,
}

/// A protocol upgrade the request asks for. The client's side of the tunnel is the connection itself,
/// taken back from hyper once the `101` is written (see `server.rs`).
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
