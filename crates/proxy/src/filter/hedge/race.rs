//! A hedged first attempt: when it has no response head after the route's hedge delay, one more
//! attempt goes to another backend (P2C, the first one excluded) and the first response head wins.
//! The access log's `hedged` says which answered (`first` or `hedge`) when a hedge was sent.
//!
//! The other attempt is dropped at once: its [`Completion`] settles as an attempt dropped before its
//! response (load released once, its connection closed rather than pooled mid-request), and an
//! attempt that failed is counted as failed (outlier verdict, `duet_backend_failures_total`) even when
//! the other one answers: a hedge never hides a failure. One hedge per request at most, sent only
//! while the route's budget has a token.

use super::{state::RouteHedging, Outcome};
use crate::{
    backend::cluster::Cluster,
    error::{ErrorKind, ProxyError},
    exchange::Prepared,
    filter::phase::{Attempt, FirstAttempt, Raced},
    forward,
    telemetry::metrics::RouteCounters,
};
use std::{future::Future, net::SocketAddr, pin::pin, rc::Rc, time::Duration};
use tokio::time::Instant;

/// Which attempt's response head came first, when a hedge was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    First,
    Hedge,
}

impl Answered {
    /// The access log's `hedged`.
    fn log_value(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Hedge => "hedge",
        }
    }
}

/// The first attempt of a request, hedged after the route's delay if the budget allows (see
/// [`hedge_delay`]). Backends whose attempts failed while the other was still running are pushed onto
/// `tried` (empty on entry: only a first attempt is hedged); the returned error's backend is the
/// caller's to add.
pub(super) async fn race(
    hedging: &RouteHedging,
    outcomes: &RouteCounters,
    attempt: FirstAttempt<'_>,
) -> Raced {
    let FirstAttempt {
        cluster,
        prepared,
        tried,
    } = attempt;
    let delay = hedge_delay(hedging, prepared);
    let unanswered = |result| Raced {
        result,
        dropped: false,
        answered: None,
    };
    let Some(body) = prepared.source.attempt() else {
        return unanswered(Err(ProxyError::new(ErrorKind::BadGateway)));
    };
    let Ok(picked) = cluster.pick(tried, (prepared.affinity, prepared.session)) else {
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
    let mut pending = Pending::new(outcomes);
    let failures = tried.len();
    let (result, answered) = both(first, second, tried).await;
    let dropped = answered.is_some() && tried.len() == failures;
    match answered {
        Some(Answered::Hedge) => {
            // The first attempt waited at least this long: above the delay, which is all the
            // percentile needs to know of it.
            hedging.record(started.elapsed());
            pending.settle(Outcome::Won);
        }
        Some(Answered::First) => {
            hedging.record(started.elapsed());
            pending.settle(Outcome::Lost);
        }
        None => pending.settle(Outcome::Lost),
    }
    Raced {
        result,
        dropped,
        answered: answered.map(Answered::log_value),
    }
}

/// How long `prepared`'s first attempt may wait before it is hedged: `None` if it may not be (a
/// method the route does not hedge, a streamed body that cannot be sent twice, an upgrade, or a
/// percentile still warming up). A hedgeable request earns its share of the budget here.
fn hedge_delay(hedging: &RouteHedging, prepared: &Prepared) -> Option<Duration> {
    let hedgeable = prepared.upgrade.is_none()
        && prepared.source.replayable()
        && hedging.hedges(&prepared.parts.method);
    hedgeable.then(|| hedging.arrived()).flatten()
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
    // A hedge goes to the key's next candidate: the first is excluded.
    let picked = cluster
        .pick(excluded, (prepared.affinity, prepared.session))
        .ok()?;
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
    outcomes: &'a RouteCounters,
    settled: bool,
}

impl<'a> Pending<'a> {
    fn new(outcomes: &'a RouteCounters) -> Self {
        Self {
            outcomes,
            settled: false,
        }
    }

    fn settle(&mut self, outcome: Outcome) {
        self.settled = true;
        self.outcomes.add(outcome as usize);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.outcomes.add(Outcome::Cancelled as usize);
        }
    }
}
