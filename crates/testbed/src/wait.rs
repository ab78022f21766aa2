//! Waiting for an event instead of sleeping for a guess: a test polls the condition it needs (a log
//! line, a counter, an answer) until it holds or a deadline passes. It goes on as soon as the event
//! happens, and a slow machine makes it wait longer instead of failing.

use std::{
    future::Future,
    time::{Duration, Instant},
};

/// The pause between two checks: short next to any deadline a test sets, long enough that a check
/// making a request does not load the machine it measures.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// Checks `condition` every [`POLL_EVERY`] until it holds or `limit` passes, and once more at the
/// deadline; whether it held. Assert on the result with a message saying what was awaited.
pub fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    poll_until(limit, || condition().then_some(())).is_some()
}

/// Calls `check` every [`POLL_EVERY`] until it gives a value or `limit` passes, and once more at the
/// deadline; the value, if one came.
pub fn poll_until<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        let found = check();
        if found.is_some() {
            return found;
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL_EVERY.min(deadline - now));
    }
}

/// Like [`eventually`], and panics when the deadline passes, naming what did not happen and how long
/// it was awaited.
#[track_caller]
pub fn wait_for(what: &str, limit: Duration, condition: impl FnMut() -> bool) {
    let started = Instant::now();
    if !eventually(limit, condition) {
        panic!("{what}: not after {:?}", started.elapsed());
    }
}

/// [`eventually`] for a check that is itself asynchronous, on a tokio runtime: the pauses are tokio
/// sleeps, so other tasks (the servers a check talks to) run meanwhile, and under paused time the
/// deadline is on the test's clock.
pub async fn eventually_async<F: Future<Output = bool>>(
    limit: Duration,
    mut condition: impl FnMut() -> F,
) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_EVERY.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn returns_as_soon_as_the_condition_holds() {
        let calls = Cell::new(0);
        let started = Instant::now();
        assert!(eventually(Duration::from_secs(5), || {
            calls.set(calls.get() + 1);
            calls.get() == 3
        }));
        assert_eq!(calls.get(), 3);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn gives_up_at_the_deadline_after_a_last_check() {
        let calls = Cell::new(0);
        let started = Instant::now();
        let found = poll_until(Duration::from_millis(50), || {
            calls.set(calls.get() + 1);
            None::<()>
        });
        assert_eq!(found, None);
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(calls.get() >= 2, "checked at the start and at the deadline");
    }

    #[test]
    #[should_panic(expected = "the answer: not after")]
    fn wait_for_names_what_never_happened() {
        wait_for("the answer", Duration::from_millis(20), || false);
    }

    #[tokio::test(start_paused = true)]
    async fn the_async_deadline_is_on_the_runtime_clock() {
        let started = tokio::time::Instant::now();
        assert!(!eventually_async(Duration::from_secs(60), || async { false }).await);
        assert!(started.elapsed() >= Duration::from_secs(60));
        let calls = Cell::new(0);
        assert!(
            eventually_async(Duration::from_secs(1), || {
                calls.set(calls.get() + 1);
                let ready = calls.get() == 2;
                async move { ready }
            })
            .await
        );
    }
}
