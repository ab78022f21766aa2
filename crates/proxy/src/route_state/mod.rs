//! What one worker keeps for one route, in one value: the clusters it sends to with their latency
//! histograms, its split, and its filters. A reload carries it over by one function, keyed by route
//! name: [`RouteState::new`] is handed the state of the route of the same name before the reload.

mod split;

use crate::{
    filter::{per_cluster::PerCluster, phase::Build, RouteFilters},
    headers::TrailerScrub,
    telemetry::metrics::{ClusterCells, RouteTimings},
};
use duet_config::{Action, Route};
use split::Splitter;
use std::{rc::Rc, sync::Arc};

/// A route's state in one worker.
pub(crate) struct RouteState {
    /// Its histograms for each cluster it sends to (the `cluster` label of their series), in the
    /// order of the route's action.
    timings: PerCluster<Arc<RouteTimings>>,
    /// The smooth weighted round robin of a split route.
    split: Option<Splitter>,
    /// Shared with the attempts of a route whose filters act in the done phase, which hand them the
    /// finished request at the end of its response, after the request's handler is gone.
    pub(crate) filters: Rc<RouteFilters>,
    /// What a request's trailers lose on this route: every field its request edits set or remove.
    trailers: TrailerScrub,
    /// The largest request body the route takes (its `max_request_body`, or the `limits` default).
    pub(crate) body_limit: Option<u64>,
}

impl RouteState {
    /// The state of `route`, taking over from `previous` (the route of the same name before a reload)
    /// the histograms of each cluster of the same name, so that a reload does not reset their
    /// series, and what its filters keep.
    pub(crate) fn new(route: &Route, build: &Build<'_>, previous: Option<&RouteState>) -> Self {
        let timings = PerCluster::new(route, build, previous.map(|old| &old.timings), || {
            Arc::new(RouteTimings::new(&route.name))
        });
        let split = match &route.action {
            Action::Split(split) => Some(Splitter::new(split)),
            Action::Cluster(_) | Action::Redirect(_) | Action::Respond => None,
        };
        let filters = RouteFilters::new(route, build, previous.map(|old| &*old.filters));
        let edits = &route.request_headers;
        let trailers = TrailerScrub::new(
            edits.set.iter().map(|(name, _)| name.as_str()),
            edits.remove.iter().map(String::as_str),
        );
        Self {
            timings,
            split,
            filters: Rc::new(filters),
            trailers,
            body_limit: route.body_limit(&build.config.limits),
        }
    }

    /// What a request's trailers lose on this route, from a listener that drops names with an
    /// underscore from the head (`underscores_dropped`) or keeps them.
    pub(crate) fn trailers(&self, underscores_dropped: bool) -> TrailerScrub {
        self.trailers.with_underscores_dropped(underscores_dropped)
    }

    /// The cluster (its index) that takes this request, and the route's histograms for it; `None`
    /// for a route that sends to no cluster (a redirect).
    pub(crate) fn pick(&self) -> Option<(usize, &Arc<RouteTimings>)> {
        let position = self.split.as_ref().map_or(0, Splitter::pick);
        self.timings.nth(position)
    }

    /// Adds the route's metric cells to its worker's clusters' `cells` (in `config.clusters` order).
    pub(crate) fn publish(&self, cells: &mut [ClusterCells]) {
        (self.timings).publish(cells, |cells, timings| cells.routes.push(timings.clone()));
        self.filters.publish(cells);
    }
}
