//! `mirror:`, a filter of the prepared phase: a copy of a share of a route's requests sent to another cluster, fire and
//! forget (Envoy's `request_mirror_policies`, nginx's `mirror`).
//!
//! - **What is copied**: the prepared request (headers as the primary backend gets them) with a body
//!   that is empty, or already read in full (buffered for retries or by `buffer_request`) and within
//!   the mirror cluster's `replay_body_limit`. A streamed body is never copied: it would have to be
//!   held for the mirror, or slow the client to the mirror's pace. Nor is an upgrade (a tunnel to a
//!   shadow service has no meaning).
//! - **Never in the client's way**: the copy runs in its own task on the worker, after the request is
//!   prepared and before the primary attempt; its response is read and dropped; it is never retried on
//!   another backend; nothing it does reaches the client's response.
//! - **Bounded**: at most `limits.max_mirrors_in_flight` copies per worker at once; past it a request is
//!   not copied. Each copy is bounded in time by the mirror cluster's timeouts (`response_headers`,
//!   then `read` mid-body).
//! - **Balanced**: the mirror cluster's P2C balancer picks the backend and counts the copy as its
//!   load, so the mirror's backends see the same balancing as any other cluster's.
//! - **Sampling**: `percent` is kept exactly in the long run by a per-worker accumulator per route
//!   (10% mirrors every tenth request of the route), not by chance.

use crate::{
    attempt::body::ProxyBody,
    backend::cluster::Cluster,
    backend::request_body::BodySource,
    exchange::Prepared,
    filter::phase::{Build, Phase, Phases},
    forward::forward,
    telemetry::metrics::{ClusterCells, CounterFamily, RouteCounters},
};
use duet_config::{filter::mirror::Mirror, Route};
use http::Request;
use http_body_util::BodyExt;
use std::{cell::Cell, rc::Rc, sync::Arc};

/// A route's mirroring in one worker: where copies go, what is due, and the counts.
pub(crate) struct RouteMirror {
    mirror: Mirror,
    cluster: Rc<Cluster>,
    /// Hundredths of a percent accumulated: a copy is due each time it reaches [`Mirror::ALL`].
    due: Cell<u32>,
    /// What became of its copies ([`OUTCOMES`]).
    counts: Arc<RouteCounters>,
    /// Copies in flight on this worker, for all its routes ([`IN_FLIGHT`]), and how many may be.
    in_flight: Rc<Cell<usize>>,
    cap: usize,
}

thread_local! {
    /// Copies in flight on this worker, for all its routes (a worker is one thread), bounded by
    /// `limits.max_mirrors_in_flight`.
    static IN_FLIGHT: Rc<Cell<usize>> = Rc::default();
}

/// What became of the copies a route sent to its mirror cluster, by `outcome`: `sent`, the mirror
/// cluster answered (any status); `failed`, it did not (no backend eligible, refused, timed out);
/// `skipped_cap`, not sent, `limits.max_mirrors_in_flight` copies were in flight; `skipped_body`, not
/// sent, the body was streamed (not buffered within the mirror cluster's `replay_body_limit`) or the
/// request asked for an upgrade. Only mirroring routes have these series, under the mirror cluster.
static OUTCOMES: CounterFamily = CounterFamily {
    name: "duet_mirrors_total",
    help: "Requests a route copied to its mirror cluster (cluster), by outcome: sent (answered, answer discarded), failed (no answer), skipped_cap (limits.max_mirrors_in_flight copies in flight), skipped_body (a streamed body or an upgrade: not copied).",
    label: "outcome",
    values: &["sent", "failed", "skipped_cap", "skipped_body"],
    every_route: false,
    status: None,
};
const SENT: usize = 0;
const FAILED: usize = 1;
const SKIPPED_CAP: usize = 2;
const SKIPPED_BODY: usize = 3;

impl Phases for RouteMirror {
    const PHASES: Phase = Phase::PREPARED;
    const COUNTERS: &'static [&'static CounterFamily] = &[&OUTCOMES];

    /// A route that mirrors to the cluster of the same name as before a reload keeps its counts.
    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self> {
        let mirror = route.filters.mirror.clone()?;
        let cluster = build.clusters.get(mirror.cluster)?.clone();
        let counts = match previous {
            Some(old) if old.cluster.name == cluster.name => old.counts.clone(),
            _ => Arc::new(RouteCounters::new(&OUTCOMES, &route.name)),
        };
        Some(Self {
            mirror,
            cluster,
            due: Cell::new(0),
            counts,
            in_flight: IN_FLIGHT.with(Rc::clone),
            cap: build.config.limits.max_mirrors_in_flight,
        })
    }

    fn on_prepared(&self, prepared: &Prepared) {
        self.mirror(prepared);
    }

    fn publish(&self, cells: &mut [ClusterCells]) {
        if let Some(cells) = cells.get_mut(self.mirror.cluster) {
            cells.route_counters.push(self.counts.clone());
        }
    }
}

impl RouteMirror {
    /// Whether this request is one of the route's `basis_points` share.
    fn sample(&self, basis_points: u32) -> bool {
        let due = self.due.get() + basis_points.min(Mirror::ALL);
        let take = due >= Mirror::ALL;
        self.due.set(if take { due - Mirror::ALL } else { due });
        take
    }

    /// Starts a copy of `prepared` if this request is in the route's share, its body can be copied
    /// and fewer than `cap` copies are in flight on the worker; counts what it did. Returns at once.
    fn mirror(&self, prepared: &Prepared) {
        if !self.sample(self.mirror.basis_points) {
            return;
        }
        let state = &self.counts;
        let source = match &prepared.source {
            _ if prepared.upgrade.is_some() => None,
            BodySource::Empty => Some(BodySource::Empty),
            BodySource::Buffered(bytes) if bytes.len() <= self.cluster.replay_body_limit => {
                Some(BodySource::Buffered(bytes.clone()))
            }
            BodySource::Buffered(_) | BodySource::Streaming(_) => None,
        };
        let Some(source) = source else {
            return state.add(SKIPPED_BODY);
        };
        if self.in_flight.get() >= self.cap {
            return state.add(SKIPPED_CAP);
        }
        let Some(copy) = copy(prepared, source) else {
            return state.add(SKIPPED_BODY);
        };
        self.in_flight.set(self.in_flight.get() + 1);
        let held = InFlight(self.in_flight.clone());
        let (cluster, counts) = (self.cluster.clone(), state.clone());
        tokio::task::spawn_local(async move {
            let outcome = send(&cluster, copy).await;
            counts.add(outcome);
            drop(held);
        });
    }
}

/// One copy in flight, counted until dropped.
struct InFlight(Rc<Cell<usize>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// The request again, with its own copy of the headers (`Parts` cannot be cloned: its extensions).
fn copy(prepared: &Prepared, source: BodySource) -> Option<Prepared> {
    let parts = &prepared.parts;
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version)
        .body(())
        .ok()?;
    *request.headers_mut() = prepared.attempt_headers();
    Some(Prepared::new(request.into_parts().0, source, None))
}

/// One attempt, its response read to the end and dropped: `sent` if the mirror answered.
async fn send(cluster: &Rc<Cluster>, mut copy: Prepared) -> usize {
    match forward(cluster, &mut copy, &[], true).await {
        Ok((response, mut completion)) => {
            let (head, body) = response.into_parts();
            completion.drop_response();
            completion.on_head(&head);
            // The body settles the attempt (load, latency, connection back to the pool) as it ends.
            let mut body = ProxyBody::upstream(body, completion);
            while let Some(Ok(_)) = body.frame().await {}
            SENT
        }
        Err(error) => {
            tracing::debug!(cluster = %cluster.name, "mirror: {error}");
            FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_kept_exactly_by_accumulating_it() {
        let cluster = crate::backend::cluster::for_tests(&["127.0.0.1:9"], "");
        let state = RouteMirror {
            mirror: Mirror {
                cluster: 0,
                cluster_name: "shadow".to_owned(),
                basis_points: 0,
            },
            cluster,
            due: Cell::new(0),
            counts: Arc::new(RouteCounters::new(&OUTCOMES, "r")),
            in_flight: Rc::default(),
            cap: 1,
        };
        let taken: Vec<bool> = (0..20).map(|_| state.sample(1_000)).collect();
        let tenth: Vec<bool> = (1..=20).map(|i| i % 10 == 0).collect();
        assert_eq!(taken, tenth, "10%: every tenth request");
        assert!((0..5).all(|_| state.sample(Mirror::ALL)), "100%: every one");
        assert!((0..100).all(|_| !state.sample(0)), "0%: none");
        let thirds = (0..300).filter(|_| state.sample(3_333)).count();
        assert_eq!(
            thirds, 99,
            "33.33% of 300, rounded down by the share left over"
        );
    }
}
