//! `allow:` / `deny:`, a filter of the request phase: the client addresses a route takes (nginx's
//! `allow`/`deny`, Traefik's `IPAllowList`, Envoy's RBAC on the source address). A refused request
//! gets 403 (a gRPC call `PERMISSION_DENIED`) before anything of it is read or sent.
//!
//! The address judged is the one the access log names ([`original_client`]): the peer, or the last
//! `X-Forwarded-For` entry when the peer is one of its listener's `trusted_proxies`. An untrusted
//! peer's `X-Forwarded-For` never changes a decision. An IPv4 client reached over IPv6
//! (`::ffff:a.b.c.d`) is judged as the IPv4 address it is.

use crate::{
    error::{ErrorKind, ProxyError},
    filter::phase::{Arrival, Build, Decision, Phase, Phases},
    peer::original_client,
    telemetry::access_log::AccessLog,
    telemetry::metrics::{ClusterCells, CounterFamily, RouteCounters},
};
use duet_config::{filter::ip_list::Access, Route};
use std::sync::Arc;

/// A route's access list in one worker, with its counts.
pub(crate) struct IpList {
    access: Access,
    /// The route's first cluster (in `config.clusters`), whose series carry the counts.
    cluster: usize,
    cluster_name: Arc<str>,
    counts: Arc<RouteCounters>,
}

/// What a route's `allow:` or `deny:` decided, by `outcome`: `allowed`, the request went on;
/// `denied`, it got 403. Only the routes with a list have these series, under their first cluster.
static DECISIONS: CounterFamily = CounterFamily {
    name: "duet_ip_list_requests_total",
    help: "Requests a route's allow or deny list judged (under the route's first cluster), by outcome: allowed, denied (answered 403).",
    label: "outcome",
    values: &["allowed", "denied"],
    every_route: false,
    status: Some("address list decisions"),
};
const ALLOWED: usize = 0;
const DENIED: usize = 1;

impl Phases for IpList {
    const PHASES: Phase = Phase::REQUEST;
    const COUNTERS: &'static [&'static CounterFamily] = &[&DECISIONS];

    /// The route of the same name keeps its counts across a reload while its first cluster keeps
    /// its name (the series are that cluster's).
    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self> {
        let access = route.filters.access.clone()?;
        let cluster = route.action.clusters().next()?;
        let cluster_name = build.clusters.get(cluster)?.name.clone();
        let counts = match previous {
            Some(old) if old.cluster_name == cluster_name => old.counts.clone(),
            _ => Arc::new(RouteCounters::new(&DECISIONS, &route.name)),
        };
        Some(Self {
            access,
            cluster,
            cluster_name,
            counts,
        })
    }

    fn on_request(&self, arrival: &Arrival<'_>, _: &mut Option<Box<AccessLog>>) -> Decision {
        let client = original_client(arrival.request.headers(), arrival.client);
        if self.access.admits(client) {
            self.counts.add(ALLOWED);
            Decision::Continue
        } else {
            self.counts.add(DENIED);
            Decision::Refuse(ProxyError::new(ErrorKind::ClientDenied))
        }
    }

    fn publish(&self, cells: &mut [ClusterCells]) {
        if let Some(cells) = cells.get_mut(self.cluster) {
            cells.route_counters.push(self.counts.clone());
        }
    }
}
