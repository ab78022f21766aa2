//! The done phase: one record of a finished request, handed once to everything that observes
//! finished requests — the route's histograms and per-code counts, the filters acting in the done
//! phase, and the access log — in place of each being told on its own by whoever finished it.
//!
//! A request finishes in one of two places: the attempt that answered settles (its `Completion`,
//! at the end of the response body, with the clock reading the settlement took anyway), or no
//! backend answered and the handler finishes it with duet's own error answer. Both build a [`Done`]
//! and call [`finish`]; nothing else reads the clock or the status again.

use crate::telemetry::{access_log::AccessLog, histogram::ExemplarId, metrics::RouteTimings};
use http::StatusCode;
use std::{net::SocketAddr, time::Duration};

/// What is known of a request when it is done.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "for done-phase filters: no built-in filter reads these yet"
    )
)]
pub(crate) struct Done<'a> {
    /// The route's name.
    pub(crate) route: &'a str,
    /// The status the client was sent (duet's own, when no backend answered).
    pub(crate) status: StatusCode,
    /// From the request's arrival to the end of its response: what the client saw.
    pub(crate) duration: Duration,
    /// The backend that answered; `None`: none did.
    pub(crate) backend: Option<SocketAddr>,
    /// The request's trace, when it is traced: the latency histogram's exemplar.
    pub(crate) exemplar: Option<ExemplarId>,
}

/// What observes finished requests besides the route's histograms and the access log: a route's
/// filters acting in the done phase. Behind a pointer that only the routes with such a filter hand
/// to their attempts, so that the others pay one test of a `None`.
pub(crate) trait Observer {
    fn on_done(&self, done: &Done<'_>);
}

/// Hands `done` to its observers, once: the route's histograms and counts, then `observer` (the
/// route's done-phase filters, if any), then the access log (last, so its line is written once
/// every count is in). `backend_text` is the answering backend's address already formatted.
#[inline]
pub(crate) fn finish(
    done: &Done<'_>,
    timings: &RouteTimings,
    observer: Option<&dyn Observer>,
    log: Option<Box<AccessLog>>,
    backend_text: &str,
) {
    (timings.request_duration).observe_with(done.duration, done.exemplar.as_ref());
    timings.response(done.status);
    if let Some(observer) = observer {
        observer.on_done(done);
    }
    if let Some(log) = log {
        log.finish(done.duration, backend_text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::histogram::{Sum, Summed};
    use std::cell::RefCell;

    struct Seen(RefCell<Vec<(String, u16, Option<SocketAddr>)>>);

    impl Observer for Seen {
        fn on_done(&self, done: &Done<'_>) {
            let seen = (done.route.to_owned(), done.status.as_u16(), done.backend);
            self.0.borrow_mut().push(seen);
        }
    }

    #[test]
    fn a_finished_request_is_timed_counted_by_its_code_and_seen_by_the_observer_once() {
        let timings = RouteTimings::new("api");
        let seen = Seen(RefCell::new(Vec::new()));
        let backend: SocketAddr = "127.0.0.1:9001".parse().expect("address");
        for (status, backend) in [(200, Some(backend)), (503, None), (200, Some(backend))] {
            let done = Done {
                route: "api",
                status: StatusCode::from_u16(status).expect("a status"),
                duration: Duration::from_millis(3),
                backend,
                exemplar: None,
            };
            finish(&done, &timings, Some(&seen), None, "127.0.0.1:9001");
        }
        let mut summed = Summed::default();
        summed.add(&timings.request_duration);
        assert_eq!(summed.count(), 3);
        let codes: Vec<(u16, u64)> = timings.codes().collect();
        assert_eq!(codes, [(200, 2), (503, 1)]);
        let seen = seen.0.into_inner();
        assert_eq!(
            seen,
            [
                ("api".to_owned(), 200, Some(backend)),
                ("api".to_owned(), 503, None),
                ("api".to_owned(), 200, Some(backend)),
            ]
        );
    }
}
