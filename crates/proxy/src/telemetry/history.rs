//! The status page over time: a fixed ring of buckets (10 s each by default, the last 30 kept: five
//! minutes), each what every backend and route did in it. The admin side closes a bucket by reading
//! the counters and histograms the workers already keep for `/metrics` and taking the difference from
//! the last reading: the request path does no work for it.

use serde::Serialize;
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
};

/// Buckets kept: with 10 s buckets, the last five minutes.
pub(crate) const BUCKETS: usize = 30;

/// One backend in one bucket, as all workers saw it together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BackendPoint {
    /// Times picked in the bucket.
    pub picks: u64,
    /// Its share of its cluster's picks in the bucket; `null` when the cluster had none (no share
    /// to tell).
    pub share: Option<f64>,
    /// Requests in flight to it when the bucket closed.
    pub in_flight: u64,
    /// Upper bound of the histogram bucket holding the median of its response-head time, in ms;
    /// `null` without a response (or above every bound).
    pub p50_ms: Option<f64>,
    /// The same for the 99th percentile.
    pub p99_ms: Option<f64>,
}

/// One route in one bucket, all its clusters and workers together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RoutePoint {
    /// Responses sent to clients in the bucket.
    pub responses: u64,
    /// Of them, 5xx.
    pub errors_5xx: u64,
    /// Responses per second over the bucket.
    pub requests_per_second: f64,
    /// 5xx over responses (0 without any).
    pub error_ratio: f64,
}

/// What one bucket holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bucket {
    /// When it closed, seconds since the Unix epoch.
    pub(crate) end_unix: f64,
    /// Backends by (cluster, address).
    pub(crate) backends: HashMap<(String, SocketAddr), BackendPoint>,
    /// Routes by name.
    pub(crate) routes: HashMap<String, RoutePoint>,
}

/// The last [`BUCKETS`] buckets, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    buckets: VecDeque<Bucket>,
}

impl Ring {
    /// Adds the newest bucket, dropping the oldest past [`BUCKETS`].
    pub(crate) fn push(&mut self, bucket: Bucket) {
        if self.buckets.len() == BUCKETS {
            self.buckets.pop_front();
        }
        self.buckets.push_back(bucket);
    }

    pub(crate) fn buckets(&self) -> impl ExactSizeIterator<Item = &Bucket> {
        self.buckets.iter()
    }

    /// `backend` of `cluster` in every bucket, oldest first (`None` where it was not in the config).
    pub(crate) fn backend(&self, cluster: &str, backend: SocketAddr) -> Vec<Option<BackendPoint>> {
        let key = (cluster.to_owned(), backend);
        (self.buckets.iter())
            .map(|bucket| bucket.backends.get(&key).copied())
            .collect()
    }

    /// `route` in every bucket, oldest first.
    pub(crate) fn route(&self, route: &str) -> Vec<Option<RoutePoint>> {
        (self.buckets.iter())
            .map(|bucket| bucket.routes.get(route).copied())
            .collect()
    }
}

impl RoutePoint {
    /// A route's point from its responses and 5xx in a bucket of `seconds`.
    pub(crate) fn of(responses: u64, errors_5xx: u64, seconds: f64) -> Self {
        Self {
            responses,
            errors_5xx,
            requests_per_second: if seconds > 0.0 {
                responses as f64 / seconds
            } else {
                0.0
            },
            error_ratio: if responses == 0 {
                0.0
            } else {
                errors_5xx as f64 / responses as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_buckets_and_a_missing_member_is_none() {
        let mut ring = Ring::default();
        let address: SocketAddr = "127.0.0.1:8001".parse().expect("address");
        for i in 0..(BUCKETS as u64 + 5) {
            let mut bucket = Bucket {
                end_unix: i as f64,
                ..Bucket::default()
            };
            if i % 2 == 0 {
                let point = BackendPoint {
                    picks: i,
                    share: Some(1.0),
                    in_flight: 0,
                    p50_ms: None,
                    p99_ms: None,
                };
                bucket.backends.insert(("app".to_owned(), address), point);
            }
            bucket
                .routes
                .insert("r".to_owned(), RoutePoint::of(i, 1, 10.0));
            ring.push(bucket);
        }
        assert_eq!(ring.buckets().len(), BUCKETS);
        assert_eq!(ring.buckets().next().map(|b| b.end_unix), Some(5.0));
        let series = ring.backend("app", address);
        assert_eq!(series.len(), BUCKETS);
        assert_eq!(series[0], None, "bucket 5 had no point");
        assert_eq!(series[1].map(|p| p.picks), Some(6));
        assert_eq!(ring.backend("other", address), vec![None; BUCKETS]);
        let route = ring.route("r");
        assert_eq!(route[0].map(|p| p.requests_per_second), Some(0.5));
        assert_eq!(route[0].map(|p| p.error_ratio), Some(0.2));
        assert_eq!(RoutePoint::of(0, 0, 10.0).error_ratio, 0.0);
    }
}
