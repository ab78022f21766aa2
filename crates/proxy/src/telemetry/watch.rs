//! The seam between the stages and what follows one request through its attempts: its trace, when
//! it is traced (`telemetry/trace/`). The handler hands the request's [`RequestWatch`] to the
//! prepared request; each attempt starts an [`AttemptWatch`] from it, sends the field it is given,
//! and settles it when the attempt settles. The stages know nothing more of either, so what a
//! watch does (spans, their ids, their export) stays in its own module.
//!
//! A request nobody watches costs the stages a test of a `None` at each attempt and at its end.

use crate::outcome::Ending;
use http::{HeaderName, HeaderValue, StatusCode};
use std::{net::SocketAddr, rc::Rc};

/// What follows one request through its attempts.
pub(crate) trait RequestWatch {
    /// An attempt to `backend` starts: what follows it until it settles, and a field its request
    /// carries to the backend (each resend of it too).
    fn attempt(
        self: Rc<Self>,
        backend: SocketAddr,
    ) -> (Box<dyn AttemptWatch>, (HeaderName, HeaderValue));
}

/// What follows one attempt until it settles.
pub(crate) trait AttemptWatch {
    /// The id that names the attempt's observations in the latency histograms' exemplars.
    fn exemplar(&self) -> [u8; 16];

    /// The attempt settled: `status` is its response's (if one came), `ended` how it ended
    /// (`None`: dropped unfinished); `backend_text` is its backend's address already written.
    fn end(self: Box<Self>, status: Option<StatusCode>, ended: Option<Ending>, backend_text: &str);
}
