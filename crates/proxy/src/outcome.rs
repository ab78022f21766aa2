//! How an attempt ended and whose fault it was: the one vocabulary that the access log (`outcome`),
//! the metrics (`duet_backend_failures_total{kind}`) and outlier detection all read.
//!
//! | ending | blame | counted as | access log |
//! |---|---|---|---|
//! | `Complete` | nobody (a 5xx is the backend's answer, see `consecutive_5xx`) | - | `complete` (`upgraded` after a `101`) |
//! | `ClientGone` | nobody | - | `client_gone` |
//! | `BodyReset` | backend | `body_reset` | `backend_error` |
//! | `BodyTimeout` | backend | `body_timeout` | `backend_read_timeout` |
//! | `Refused` | backend | `protocol` | `backend_error` |
//! | `NoResponse(Backend)` | backend | `connect`, `timeout` or `protocol` (counted where known) | `backend_error` |
//! | `NoResponse(Client)` | client | - | the client's error (`bad_request_body`, ...) |
//! | `NoResponse(Local)` | duet | `local` | duet's error (`local_resource`, ...) |

/// Whose fault an ending is: only the backend's own failures are held against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// Nobody's: the exchange ended as exchanges do (or the client simply left).
    Nobody,
    /// The client's request (its body broke, stalled or crawled).
    Client,
    /// The backend's: refused, reset, timed out, or not HTTP.
    Backend,
    /// duet's own (out of descriptors, a request it could not build): never the backend's.
    Local,
}

/// How an attempt that went to a backend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The response body ended cleanly.
    Complete,
    /// The client went away before the response body ended.
    ClientGone,
    /// The backend's body failed mid-stream.
    BodyReset,
    /// The backend sent nothing for `timeouts.read` mid-body.
    BodyTimeout,
    /// The backend answered what the client cannot use (a `101` nobody asked for, ambiguous framing).
    Refused,
    /// No response at all, and whose fault that was.
    NoResponse(Blame),
}

impl Ending {
    /// Whose fault the ending is.
    pub(crate) fn blame(self) -> Blame {
        match self {
            Self::Complete | Self::ClientGone => Blame::Nobody,
            Self::BodyReset | Self::BodyTimeout | Self::Refused => Blame::Backend,
            Self::NoResponse(blame) => blame,
        }
    }

    /// What a backend's failure mid-response is counted as; a failure before any response is counted
    /// where its kind is known (forward).
    pub(crate) fn failure(self) -> Option<Failure> {
        match self {
            Self::BodyReset => Some(Failure::BodyReset),
            Self::BodyTimeout => Some(Failure::BodyTimeout),
            Self::Refused => Some(Failure::Protocol),
            _ => None,
        }
    }

    /// The access log's `outcome` for an attempt that carried the response; `upgraded` when its
    /// status was `101`.
    pub(crate) fn log_outcome(self, upgraded: bool) -> &'static str {
        match self {
            Self::Complete if upgraded => "upgraded",
            Self::Complete => "complete",
            Self::ClientGone => "client_gone",
            Self::BodyTimeout => "backend_read_timeout",
            Self::BodyReset | Self::Refused | Self::NoResponse(_) => "backend_error",
        }
    }
}

/// How an attempt to a backend failed, for `duet_backend_failures_total{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Could not connect.
    Connect,
    /// Connected, but the TLS handshake failed (its certificate refused, or no TLS).
    Tls,
    /// No response head within `timeouts.response_headers`.
    Timeout,
    /// Closed the connection, or answered something that is not HTTP (or not usable).
    Protocol,
    /// The response body failed mid-stream.
    BodyReset,
    /// The response body stalled past `timeouts.read`.
    BodyTimeout,
    /// duet itself ran out of something on the way (never held against the backend).
    Local,
}

impl Failure {
    /// Every kind, in the order of the metric's series.
    pub(crate) const ALL: [Self; 7] = [
        Self::Connect,
        Self::Tls,
        Self::Timeout,
        Self::Protocol,
        Self::BodyReset,
        Self::BodyTimeout,
        Self::Local,
    ];

    /// `ALL`'s labels, in its order (the `kind` label's values).
    pub(crate) const LABELS: [&'static str; 7] = {
        let mut labels = [""; 7];
        let mut i = 0;
        while i < labels.len() {
            labels[i] = Self::ALL[i].label();
            i += 1;
        }
        labels
    };

    /// The `kind` label.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Tls => "tls",
            Self::Timeout => "timeout",
            Self::Protocol => "protocol",
            Self::BodyReset => "body_reset",
            Self::BodyTimeout => "body_timeout",
            Self::Local => "local",
        }
    }
}
