//! Cost of one pick + complete, duet-balance against tower's p2c balancer, same n, same run.
//!
//! `cargo bench --bench balance` (add `-- --quick` for a short run). Every inner service answers at once,
//! so what is measured is the balancer: selection, load accounting, completion.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use duet_balance::{
    algo::{stable_hash, Maglev, Ring},
    Affinity, Balancer, Strategy, Walk,
};
use std::{
    convert::Infallible,
    future::Future,
    hint::black_box,
    task::{Context, Poll},
    time::Duration,
};
use tower::{
    balance::p2c,
    discover::ServiceList,
    load::{CompleteOnResponse, PeakEwma, PendingRequests},
    service_fn, Service,
};

const SIZES: [usize; 4] = [2, 16, 256, 4096];

fn echo() -> impl Service<
    u32,
    Response = u32,
    Error = Infallible,
    Future = std::future::Ready<Result<u32, Infallible>>,
> + Clone {
    service_fn(|x: u32| std::future::ready(Ok(x)))
}

/// poll_ready, call, and resolve one request, as a server task would, without a runtime in the way.
#[inline]
fn one_request<S: Service<u32>>(svc: &mut S, cx: &mut Context<'_>) {
    match svc.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("benchmark services are always ready"),
    }
    let mut future = std::pin::pin!(svc.call(black_box(1)));
    match future.as_mut().poll(cx) {
        Poll::Ready(Ok(response)) => {
            black_box(response);
        }
        _ => panic!("benchmark services answer at once"),
    }
}

fn duet(c: &mut Criterion) {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut group = c.benchmark_group("pick_complete");
    for n in SIZES {
        for (name, metric) in [
            ("duet_inflight", Strategy::P2cInflight),
            ("duet_peak_ewma", Strategy::P2cPeakEwma),
        ] {
            let mut balance = Balancer::new(metric);
            for k in 0..n {
                balance.insert(k, 1, echo());
            }
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| one_request(&mut balance, &mut cx))
            });
        }

        let services: Vec<_> = (0..n)
            .map(|_| PendingRequests::new(echo(), CompleteOnResponse::default()))
            .collect();
        let mut tower_pending = p2c::Balance::new(ServiceList::new(services));
        group.bench_with_input(BenchmarkId::new("tower_pending_requests", n), &n, |b, _| {
            b.iter(|| one_request(&mut tower_pending, &mut cx))
        });

        let services: Vec<_> = (0..n)
            .map(|_| {
                PeakEwma::new(
                    echo(),
                    Duration::from_millis(30),
                    Duration::from_secs(10).as_nanos() as f64,
                    CompleteOnResponse::default(),
                )
            })
            .collect();
        let mut tower_ewma = p2c::Balance::new(ServiceList::new(services));
        group.bench_with_input(BenchmarkId::new("tower_peak_ewma", n), &n, |b, _| {
            b.iter(|| one_request(&mut tower_ewma, &mut cx))
        });
    }
    group.finish();
}

/// A retry's pick + claim: P2C among the endpoints but the one already tried, with weights 1 and 2
/// alternating (the weighted path) and all equal. A retry pays for its exclusions, not for the pool.
fn retry(c: &mut Criterion) {
    let mut group = c.benchmark_group("retry_pick_claim");
    for n in SIZES {
        for (name, weight) in [("equal", [1, 1]), ("weighted", [1, 2])] {
            let mut balance = Balancer::new(Strategy::P2cPeakEwma);
            for k in 0..n {
                balance.insert(k, weight[k % 2], echo());
            }
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    let (key, _, guard) = balance
                        .pick_and_claim_excluding(black_box(&[0]))
                        .expect("n >= 2");
                    black_box(key);
                    drop(guard);
                })
            });
        }
    }
    group.finish();
}

/// A keyed pick + claim + release (consistent hashing with bounded loads, on a Maglev table of 65,537
/// entries and on a hash ring of 1,024 points per endpoint) over 1,024 keys in turn, each under the
/// bound (the common case: one table read, one load read), and the table's rebuild, which a membership
/// or weight change costs.
fn keyed(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_pick_claim");
    let keys: Vec<u64> = (0..1024u64).map(|k| stable_hash(&k)).collect();
    for n in [10, 100] {
        for (name, affinity) in [
            ("next", Affinity::maglev().with_walk(Walk::Next)),
            ("p2c", Affinity::maglev().with_walk(Walk::P2c)),
            ("ring_p2c", Affinity::ring().with_walk(Walk::P2c)),
        ] {
            let mut balance = Balancer::new(Strategy::P2cInflight).with_affinity(affinity);
            for k in 0..n {
                balance.insert(k, 1, echo());
            }
            let mut at = 0;
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    at = (at + 1) % keys.len();
                    let (key, _, guard) = balance
                        .pick_and_claim_for(black_box(Some(keys[at])), &[])
                        .expect("n >= 1");
                    black_box(key);
                    drop(guard);
                })
            });
        }
        for (name, affinity) in [
            ("table_rebuild", Affinity::maglev()),
            ("ring_rebuild", Affinity::ring()),
        ] {
            let mut balance = Balancer::new(Strategy::P2cInflight).with_affinity(affinity);
            for k in 0..n {
                balance.insert(k, 1, echo());
            }
            let mut weight = 1;
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    weight = 3 - weight;
                    balance.set_weight(&0, weight);
                })
            });
        }
    }
    group.finish();
}

/// A key's home alone, over 1,024 keys in turn: a Maglev table of 65,537 entries against a hash ring
/// of 1,024 points per member (an index of its points, then the points of the key's bucket).
fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("table_lookup");
    let keys: Vec<u64> = (0..1024u64).map(|k| stable_hash(&k)).collect();
    for n in [10u32, 100] {
        let members: Vec<(u64, u32)> = (0..n).map(|m| (stable_hash(&m), 1)).collect();
        let maglev = Maglev::new(&members, 65_537);
        let ring = Ring::new(&members, 1024);
        let mut at = 0;
        group.bench_with_input(BenchmarkId::new("maglev", n), &n, |b, _| {
            b.iter(|| {
                at = (at + 1) % keys.len();
                black_box(maglev.home(black_box(keys[at])))
            })
        });
        group.bench_with_input(BenchmarkId::new("ring", n), &n, |b, _| {
            b.iter(|| {
                at = (at + 1) % keys.len();
                black_box(ring.home(black_box(keys[at])))
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = duet, retry, keyed, lookup
}
criterion_main!(benches);
