//! A pick and its completion allocate nothing, counted by a counting global allocator.
//!
//! Kept alone in its own test binary: the allocator counts every thread of the process.

use duet_balance::{Balancer, Strategy};
use duet_testbed::alloc::{allocations, CountingAllocator};
use std::{
    convert::Infallible,
    future::Future,
    task::{Context, Poll},
};
use tower::{service_fn, Service};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations_per_request(metric: Strategy, n: usize) -> u64 {
    let mut balance = Balancer::with_seed(metric, 1);
    for k in 0..n {
        balance.insert(
            k,
            1,
            service_fn(|x: u32| std::future::ready(Ok::<_, Infallible>(x))),
        );
    }
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut one_request = |balance: &mut Balancer<usize, _>| {
        assert!(matches!(balance.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        let mut future = std::pin::pin!(balance.call(1));
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(1))));
    };
    // Warm up lazily initialised state (clock, thread locals).
    for _ in 0..10 {
        one_request(&mut balance);
    }
    let before = allocations();
    let requests = 10_000;
    for _ in 0..requests {
        one_request(&mut balance);
    }
    (allocations() - before) / requests
}

#[test]
fn pick_and_complete_allocate_nothing() {
    for n in [1, 2, 16, 4096] {
        assert_eq!(
            allocations_per_request(Strategy::P2cInflight, n),
            0,
            "in-flight, n = {n}"
        );
        assert_eq!(
            allocations_per_request(Strategy::P2cPeakEwma, n),
            0,
            "PeakEWMA, n = {n}"
        );
    }
}
