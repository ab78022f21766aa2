//! What one worker keeps for one route, in one value: the clusters it sends to with their latency
//! histograms, its split, and its filters. A reload carries it over by one function, keyed by route
//! name: [`RouteState::new`] is handed the state of the route of the same name before the reload.

use crate::{
    backend::cluster::Cluster,
    filter::{phase::Build, RouteFilters},
    headers::TrailerScrub,
    split::Splitter,
    telemetry::metrics::{ClusterCells, RouteTimings},
};
use duet_config::{Action, Route};
use std::{rc::Rc, sync::Arc};

/// A route's state in one worker.
pub(crate) struct RouteState {
    /// The index of each cluster the route sends to, and its histograms for the route (the `cluster`
    /// label of its series), in the order of the route's action.
    timings: Vec<(usize, Arc<RouteTimings>)>,
    /// The smooth weighted round robin of a split route.
    split: Option<Splitter>,
    pub(crate) filters: RouteFilters,
    /// What a request's trailers lose on this route: every field its request edits set or remove.
    trailers: TrailerScrub,
}

impl RouteState {
    /// The state of `route`, taking over from `previous` (the route of the same name before a reload,
    /// and the clusters it named) the histograms of each cluster of the same name, so that a reload
    /// does not reset their series, and what its filters keep.
    pub(crate) fn new(
        route: &Route,
        build: &Build<'_>,
        previous: Option<(&RouteState, &[Rc<Cluster>])>,
    ) -> Self {
        let kept = |index: usize| {
            let (old, clusters) = previous?;
            let wanted = &build.clusters.get(index)?.name;
            (old.timings.iter())
                .find(|(to, _)| clusters.get(*to).is_some_and(|c| c.name == *wanted))
                .map(|(_, timings)| timings.clone())
        };
        let timings = (route.action.clusters())
            .map(|index| {
                let timings =
                    kept(index).unwrap_or_else(|| Arc::new(RouteTimings::new(&route.name)));
                (index, timings)
            })
            .collect();
        let split = match &route.action {
            Action::Split(split) => Some(Splitter::new(split)),
            Action::Cluster(_) | Action::Redirect(_) => None,
        };
        let filters = RouteFilters::new(route, build, previous.map(|(old, _)| &old.filters));
        let edits = &route.request_headers;
        let trailers = TrailerScrub::new(
            edits.set.iter().map(|(name, _)| name.as_str()),
            edits.remove.iter().map(String::as_str),
        );
        Self {
            timings,
            split,
            filters,
            trailers,
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
        self.timings
            .get(position)
            .map(|(index, timings)| (*index, timings))
    }

    /// Adds the route's metric cells to its worker's clusters' `cells` (in `config.clusters` order).
    pub(crate) fn publish(&self, cells: &mut [ClusterCells]) {
        for (index, timings) in &self.timings {
            if let Some(cells) = cells.get_mut(*index) {
                cells.routes.push(timings.clone());
            }
        }
        self.filters.publish(cells);
    }
}
