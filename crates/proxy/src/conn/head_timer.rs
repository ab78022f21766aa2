//! The timer hyper's HTTP/1.1 server times a request head with (`limits.header_read_timeout`): a
//! deadline checked when hyper polls it, with no entry in tokio's timer wheel.
//!
//! hyper arms its header timer for every request (it also runs while a kept-alive connection waits for
//! its next one) and drops it when the head is in: with tokio's timer, a boxed `Sleep`, an insert into
//! the wheel and a removal per request, for a deadline that almost never passes. Here the deadline is
//! only compared with the clock when hyper polls the head again; what guarantees that poll is the
//! connection's own idle tick ([`serve`](super::serve)'s `drive` wakes the connection every
//! `park_after / 2`, at most a quarter of `header_read_timeout`), so a stalled head is cut at most
//! that tick after its deadline.

use hyper::rt::{Sleep, Timer};
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

/// The header timer of [`serve`](super::serve)'s connections. Only for a connection driven by a loop
/// that polls it periodically, as `drive` does.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeadTimer;

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadDeadline {
            deadline,
            armed: false,
        })
    }

    /// tokio's clock, so that tests with paused time see the deadline pass.
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, new_deadline: Instant) {
        *sleep = self.sleep_until(new_deadline);
    }
}

/// A head's deadline.
struct HeadDeadline {
    deadline: Instant,
    /// Polled before: hyper polls a new timer at once, just after reading the clock for its deadline,
    /// so the first poll cannot find it past and skips the clock.
    armed: bool,
}

impl Future for HeadDeadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if !self.armed {
            self.armed = true;
            return Poll::Pending;
        }
        if HeadTimer.now() >= self.deadline {
            Poll::Ready(())
        } else {
            // No waker kept: the connection's idle tick polls again.
            Poll::Pending
        }
    }
}

impl Sleep for HeadDeadline {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_passes_only_at_a_poll_after_it() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut sleep = HeadTimer.sleep(Duration::from_secs(10));
        assert!(sleep.as_mut().poll(&mut cx).is_pending(), "the first poll");
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            sleep.as_mut().poll(&mut cx).is_pending(),
            "before the deadline"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(sleep.as_mut().poll(&mut cx).is_ready(), "at the deadline");
        // A reset starts over.
        HeadTimer.reset(&mut sleep, HeadTimer.now() + Duration::from_secs(5));
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
    }
}
