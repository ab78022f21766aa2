//! A counting global allocator, for tests that pin an allocation budget or a memory bound. A test binary
//! installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: duet_testbed::alloc::CountingAllocator = duet_testbed::alloc::CountingAllocator;
//! ```
//!
//! and reads [`allocations`] and [`live_bytes`] around what it measures. The counts are the process's:
//! a test binary using them holds only tests that measure one at a time, and the threads that are not
//! measured (a backend, a client) call [`uncount_this_thread`]. Without the allocator installed both
//! counts stay at zero.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    sync::atomic::{AtomicIsize, AtomicU64, Ordering},
};

/// Forwards to [`System`], counting allocations (and reallocations) on the threads that count, and
/// the bytes live on all of them.
pub struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Allocations and reallocations so far on the threads that count.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Bytes allocated and not yet freed, by every thread: memory freed on another thread than the one
/// that allocated it is still matched.
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Leaves the calling thread's allocations out of [`allocations`] from now on (a test's own backend
/// or client thread, whose work is not what is measured).
pub fn uncount_this_thread() {
    UNCOUNTED.with(|uncounted| uncounted.set(true));
}

fn note_allocation() {
    // A const-initialised thread local without a destructor: reading it never allocates. A thread
    // being torn down has none and counts.
    let counted = UNCOUNTED
        .try_with(|uncounted| !uncounted.get())
        .unwrap_or(true);
    if counted {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `CountingAllocator` upholds exactly the contract `System` does; the counter updates have no effect
// on the memory handed out.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        LIVE_BYTES.fetch_add(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: forwarded verbatim; see the impl comment.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` via this allocator, with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        LIVE_BYTES.fetch_add(signed(new_size) - signed(layout.size()), Ordering::Relaxed);
        // SAFETY: forwarded verbatim; see the impl comment.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
