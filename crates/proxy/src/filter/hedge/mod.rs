//! `hedge:`, a filter that runs a route's first attempts: when one has no response head after the
//! route's hedge delay, one more attempt goes to another backend and the first head wins. The delay
//! and the budget are the route's in this worker ([`state`]); the race of two attempts is [`race`].

mod race;
mod state;
#[cfg(test)]
mod tests;

use crate::{
    filter::per_cluster::PerCluster,
    filter::phase::{Build, FirstAttempt, Phase, Phases, Race},
    telemetry::metrics::{ClusterCells, CounterFamily, RouteCounters},
};
use duet_config::Route;
use state::RouteHedging;
use std::{rc::Rc, sync::Arc};

/// A route's hedging in one worker, and the target it was built for (what it learnt of response
/// times is kept across a reload only for the same target).
pub(crate) struct Hedging {
    state: Rc<RouteHedging>,
    target: String,
    /// How its hedges ended, by cluster ([`OUTCOMES`]).
    outcomes: PerCluster<Arc<RouteCounters>>,
}

/// How hedges ended, by `outcome` (counted in this order). Every route has these series, at 0 when
/// it does not hedge.
static OUTCOMES: CounterFamily = CounterFamily {
    name: "duet_hedges_total",
    help: "Hedges (a second attempt sent to another backend when the first had no response head after the route's hedge delay), by outcome: won (answered first), lost (the first answered first, or both failed), cancelled (the request ended before either answered).",
    label: "outcome",
    values: &["won", "lost", "cancelled"],
    every_route: true,
    status: Some("hedges"),
};

/// How a hedge ended: the index of its [`OUTCOMES`] value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Its response head came first: the client got its answer.
    Won = 0,
    /// The first attempt answered first, or both failed: it was dropped or came to nothing.
    Lost = 1,
    /// The request ended before either answered (the route's timeout, the client went away).
    Cancelled = 2,
}

impl Phases for Hedging {
    const PHASES: Phase = Phase::FIRST_ATTEMPT;
    const COUNTERS: &'static [&'static CounterFamily] = &[&OUTCOMES];

    /// A route that keeps its name, target and `hedge:` across a reload keeps its latency window and
    /// budget (no new warm-up).
    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self> {
        let hedge = route.filters.hedge.clone()?;
        let target = route.target(&build.config.clusters);
        let state = match previous {
            Some(old) if old.target == target && old.state.config == hedge => old.state.clone(),
            _ => Rc::new(RouteHedging::new(hedge)),
        };
        let outcomes = PerCluster::new(route, build, previous.map(|old| &old.outcomes), || {
            Arc::new(RouteCounters::new(&OUTCOMES, &route.name))
        });
        Some(Self {
            state,
            target,
            outcomes,
        })
    }

    /// A body sent twice must still be ours to send.
    fn replays_body(&self) -> bool {
        true
    }

    fn first_attempt<'a>(&'a self, attempt: FirstAttempt<'a>) -> Option<Race<'a>> {
        let outcomes = self.outcomes.of(&attempt.cluster.name)?;
        Some(Box::pin(race::race(&self.state, outcomes, attempt)))
    }

    fn publish(&self, cells: &mut [ClusterCells]) {
        (self.outcomes).publish(cells, |cells, counters| {
            cells.route_counters.push(counters.clone());
        });
    }
}
