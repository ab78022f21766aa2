//! `hedge:`, a filter that runs a route's first attempts: when one has no response head after the
//! route's hedge delay, one more attempt goes to another backend and the first head wins. The delay
//! and the budget are the route's in this worker ([`state`]); the race of two attempts is [`race`].

mod race;
mod state;

use crate::filter::phase::{Build, FirstAttempt, Phase, Phases, Race};
use duet_config::Route;
use state::RouteHedging;
use std::rc::Rc;

/// A route's hedging in one worker, and the target it was built for (what it learnt of response
/// times is kept across a reload only for the same target).
pub(crate) struct Hedging {
    state: Rc<RouteHedging>,
    target: String,
}

impl Phases for Hedging {
    const PHASES: Phase = Phase::FIRST_ATTEMPT;

    /// A route that keeps its name, target and `hedge:` across a reload keeps its latency window and
    /// budget (no new warm-up).
    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self> {
        let hedge = route.hedge.clone()?;
        let target = route.target(&build.config.clusters);
        let state = match previous {
            Some(old) if old.target == target && old.state.config == hedge => old.state.clone(),
            _ => Rc::new(RouteHedging::new(hedge)),
        };
        Some(Self { state, target })
    }

    /// A body sent twice must still be ours to send.
    fn replays_body(&self) -> bool {
        true
    }

    fn first_attempt<'a>(&'a self, attempt: FirstAttempt<'a>) -> Option<Race<'a>> {
        Some(Box::pin(race::race(&self.state, attempt)))
    }
}
