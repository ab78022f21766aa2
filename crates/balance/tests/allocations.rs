//! A pick and its completion allocate nothing, counted by a counting global allocator.
//!
//! Kept alone in its own test binary: the allocator counts every thread of the process.

use duet_balance::{Balance, LoadMetric};
use std::{
    alloc::{GlobalAlloc, Layout, System},
    convert::Infallible,
    future::Future,
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll},
};
use tower::{service_fn, Service};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `Counting` upholds
// exactly the contract `System` does; the counter update has no effect on memory handed out.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded verbatim; see the impl comment.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` via `alloc` above, with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded verbatim; see the impl comment.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_per_request(metric: LoadMetric, n: usize) -> u64 {
    let mut balance = Balance::with_seed(metric, 1);
    for k in 0..n {
        balance.insert(
            k,
            1,
            service_fn(|x: u32| std::future::ready(Ok::<_, Infallible>(x))),
        );
    }
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut one_request = |balance: &mut Balance<usize, _>| {
        assert!(matches!(balance.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        let mut future = std::pin::pin!(balance.call(1));
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(1))));
    };
    // Warm up lazily initialised state (clock, thread locals).
    for _ in 0..10 {
        one_request(&mut balance);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let requests = 10_000;
    for _ in 0..requests {
        one_request(&mut balance);
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) / requests
}

#[test]
fn pick_and_complete_allocate_nothing() {
    for n in [1, 2, 16, 4096] {
        assert_eq!(
            allocations_per_request(LoadMetric::InFlight, n),
            0,
            "in-flight, n = {n}"
        );
        assert_eq!(
            allocations_per_request(LoadMetric::default(), n),
            0,
            "PeakEWMA, n = {n}"
        );
    }
}
