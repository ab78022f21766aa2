//! A hedged first attempt: when it has no response head after the route's hedge delay, one more
//! attempt goes to another backend (P2C, the first one excluded) and the first response head wins.
//!
//! The other attempt is dropped at once: its [`Completion`] settles as an attempt dropped before its
//! response (load released once, its connection closed rather than pooled mid-request), and an
//! attempt that failed is counted as failed (outlier verdict, `duet_backend_failures_total`) even when
//! the other one answers: a hedge never hides a failure. One hedge per request at most, sent only
//! while the route's budget has a token.

use crate::{
    attempt::completion::Completion,
    backend::cluster::Cluster,
    error::{ErrorKind, ProxyError},
    exchange::Prepared,
    stage::{forward, hedge_state::RouteHedging},
    telemetry::metrics::{HedgeOutcome, RouteTimings},
};
use http::Response;
use hyper::body::Incoming;
use std::{future::Future, net::SocketAddr, pin::pin, rc::Rc, time::Duration};
use tokio::time::Instant;

type Attempt = Result<(Response<Incoming>, Completion), ProxyError>;

/// Which attempt's response head came first, when a hedge was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    First,
    Hedge,
}

impl Answered {
    /// The access log's `hedged`.
    pub(crate) fn log_value(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Hedge => "hedge",
        }
    }
}

/// What a hedged first attempt came to: the answer (or the last failure), whether a hedge was sent
/// and which attempt answered. Backends whose attempts failed while the other was still running are
/// pushed onto `tried` by [`race`]; the returned error's backend is the caller's to add.
pub(crate) struct Raced {
    pub(crate) result: Attempt,
    /// An attempt was dropped unfinished because the other answered: sent, but neither the answer
    /// nor among the failures in `tried`, so the request's attempts count it apart.
    pub(crate) dropped: bool,
    /// Which attempt answered, when a hedge was sent.
    pub(crate) answered: Option<Answered>,
}

/// The first attempt of a request to `cluster`, hedged after `delay` if the route's budget allows.
/// `tried` is empty on entry (only a first attempt is hedged).
pub(crate) async fn race(
    cluster: &Rc<Cluster>,
    prepared: &Prepared,
    tried: &mut Vec<SocketAddr>,
    hedging: &RouteHedging,
    timings: &RouteTimings,
    delay: Option<Duration>,
) -> Raced {
    let unanswered = |result| Raced {
        result,
        dropped: false,
        answered: None,
    };
    let Some(body) = prepared.source.attempt() else {
        return unanswered(Err(ProxyError::new(ErrorKind::BadGateway)));
    };
    let Ok(picked) = cluster.pick(tried) else {
        return unanswered(Err(ProxyError::new(ErrorKind::NoEligibleBackend)));
    };
    let first_backend = picked.0;
    let started = Instant::now();
    let mut first = pin!(forward::send(cluster, prepared, picked, body, None));
    let answered_alone = |result: Attempt| {
        if result.is_ok() {
            hedging.record(started.elapsed());
        }
        unanswered(result)
    };
    let Some(delay) = delay else {
        return answered_alone(first.await);
    };
    tokio::select! {
        biased;
        result = &mut first => return answered_alone(result),
        () = tokio::time::sleep(delay) => {}
    }
    let excluded = [tried.as_slice(), &[first_backend]].concat();
    let Some(second) = start_hedge(cluster, prepared, &excluded, hedging) else {
        return answered_alone(first.await);
    };
    let mut pending = Pending::new(timings);
    let failures = tried.len();
    let (result, answered) = both(first, second, tried).await;
    let dropped = answered.is_some() && tried.len() == failures;
    match answered {
        Some(Answered::Hedge) => {
            // The first attempt waited at least this long: above the delay, which is all the
            // percentile needs to know of it.
            hedging.record(started.elapsed());
            pending.settle(HedgeOutcome::Won);
        }
        Some(Answered::First) => {
            hedging.record(started.elapsed());
            pending.settle(HedgeOutcome::Lost);
        }
        None => pending.settle(HedgeOutcome::Lost),
    }
    Raced {
        result,
        dropped,
        answered,
    }
}

/// The hedge's attempt, to a backend not in `excluded`, if the budget has a token and such a backend
/// is eligible. Boxed: sent for a few requests in a hundred, it costs the others nothing.
fn start_hedge<'a>(
    cluster: &'a Rc<Cluster>,
    prepared: &'a Prepared,
    excluded: &[SocketAddr],
    hedging: &RouteHedging,
) -> Option<std::pin::Pin<Box<impl Future<Output = Attempt> + 'a>>> {
    if !hedging.can_withdraw() {
        return None;
    }
    let body = prepared.source.attempt()?;
    let picked = cluster.pick(excluded).ok()?;
    hedging.withdraw();
    Some(Box::pin(forward::send(
        cluster, prepared, picked, body, None,
    )))
}

/// Runs both attempts until one has a response head, or both have failed. The one still running when
/// the other answers is dropped with this future; one that failed first is added to `tried`.
async fn both(
    mut first: std::pin::Pin<&mut impl Future<Output = Attempt>>,
    mut second: std::pin::Pin<Box<impl Future<Output = Attempt>>>,
    tried: &mut Vec<SocketAddr>,
) -> (Attempt, Option<Answered>) {
    let (failure, other) = tokio::select! {
        biased;
        result = &mut first => match result {
            Ok(answer) => return (Ok(answer), Some(Answered::First)),
            Err(error) => (error, Answered::Hedge),
        },
        result = &mut second => match result {
            Ok(answer) => return (Ok(answer), Some(Answered::Hedge)),
            Err(error) => (error, Answered::First),
        },
    };
    // Replayable bodies never fail on the client's side: a failure names its backend.
    tried.extend(failure.backend());
    let result = match other {
        Answered::Hedge => second.await,
        Answered::First => first.await,
    };
    let answered = result.is_ok().then_some(other);
    (result, answered)
}

/// Counts a hedge once: by how it settled, or as cancelled if the request is dropped first (the
/// route's timeout, the client gone).
struct Pending<'a> {
    timings: &'a RouteTimings,
    settled: bool,
}

impl<'a> Pending<'a> {
    fn new(timings: &'a RouteTimings) -> Self {
        Self {
            timings,
            settled: false,
        }
    }

    fn settle(&mut self, outcome: HedgeOutcome) {
        self.settled = true;
        self.timings.hedge(outcome);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.timings.hedge(HedgeOutcome::Cancelled);
        }
    }
}
