//! Giving memory back to the system after a crowd of connections has gone idle.
//!
//! A burst of busy connections (hyper's buffers: ~15 KiB each) is freed when they park or close, but
//! glibc's allocator keeps freed pages mapped unless they sit at the very top of its heap:
//! `benches/idle.sh` measured 1.2–12.7 KiB of resident memory per idle connection with ~0.25 KiB of it
//! live. So when a worker serves far fewer connections than it did at its peak, it asks glibc to return
//! its free pages (`malloc_trim`, as HAProxy does when it releases its pools). Not while the load holds:
//! a trim stalls the worker for 0.02–2.6 ms (measured here under `wrk -c200`), and the pages would be
//! faulted back in at once. The worker (`worker.rs`) trims again one tick later, for the upstream
//! connections the crowd left in the pool (closed after `timeouts.idle`). musl's allocator returns
//! pages by itself (the container image is built with musl): nothing to call there.

use std::time::Duration;

/// How often a worker looks whether trimming is worth it.
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Whether a worker that served `high` connections in tasks at once since its last trim, and serves
/// `now`, has freed enough to trim: at least 32 fewer (~0.5 MiB of buffers) and at most half its peak.
pub(crate) fn worth_trimming(high: usize, now: usize) -> bool {
    high >= now.saturating_mul(2) && high - now >= 32
}

/// Returns the allocator's free pages to the system; `false` where there is nothing to call.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn trim() -> bool {
    // SAFETY: `malloc_trim` takes a plain integer (the padding to keep at the top of the heap), reads
    // and writes no caller memory, and is thread-safe: glibc takes each arena's lock while it trims
    // that arena, as `malloc` and `free` do.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
    true
}

/// Returns the allocator's free pages to the system; `false` where there is nothing to call.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_drop_from_the_peak_is_worth_a_trim() {
        use super::worth_trimming;
        assert!(worth_trimming(500, 0));
        assert!(worth_trimming(64, 32));
        assert!(!worth_trimming(200, 190), "a steady load keeps its pages");
        assert!(
            !worth_trimming(40, 20),
            "too little freed to be worth a stall"
        );
        assert!(!worth_trimming(0, 0));
    }
}
