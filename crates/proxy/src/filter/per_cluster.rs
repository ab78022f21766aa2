//! One value per cluster a route sends to: what a route keeps for each of its clusters (its latency
//! histograms, a filter's counters), handed on across a reload for each cluster that keeps its name.

use crate::filter::phase::Build;
use crate::telemetry::metrics::ClusterCells;
use duet_config::Route;
use std::sync::Arc;

/// A value for each cluster of a route's action, in the action's order.
pub(crate) struct PerCluster<T> {
    entries: Vec<Entry<T>>,
}

struct Entry<T> {
    /// The cluster's index in the config's `clusters` (and in a worker's cells).
    index: usize,
    name: Arc<str>,
    value: T,
}

impl<T: Clone> PerCluster<T> {
    /// A value for each cluster `route` sends to: the one `previous` held for the cluster of the same
    /// name before a reload, else a new one from `make`.
    pub(crate) fn new(
        route: &Route,
        build: &Build<'_>,
        previous: Option<&Self>,
        make: impl Fn() -> T,
    ) -> Self {
        let entries = (route.action.clusters())
            .filter_map(|index| {
                let name = build.clusters.get(index)?.name.clone();
                let kept = previous.and_then(|old| old.of(&name)).cloned();
                let value = kept.unwrap_or_else(&make);
                Some(Entry { index, name, value })
            })
            .collect();
        Self { entries }
    }
}

impl<T> PerCluster<T> {
    /// The value of the cluster named `name`.
    pub(crate) fn of(&self, name: &str) -> Option<&T> {
        (self.entries.iter())
            .find(|entry| *entry.name == *name)
            .map(|entry| &entry.value)
    }

    /// The `position`th cluster of the route's action: its index in the config, and its value.
    pub(crate) fn nth(&self, position: usize) -> Option<(usize, &T)> {
        (self.entries.get(position)).map(|entry| (entry.index, &entry.value))
    }

    /// Hands each value to its cluster's cells (`cells` in `config.clusters` order).
    pub(crate) fn publish(
        &self,
        cells: &mut [ClusterCells],
        mut add: impl FnMut(&mut ClusterCells, &T),
    ) {
        for entry in &self.entries {
            if let Some(cells) = cells.get_mut(entry.index) {
                add(cells, &entry.value);
            }
        }
    }
}
