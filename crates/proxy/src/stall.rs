//! A wait that may last only so long without progress: the backend's next body frame
//! (`timeouts.read`), the client taking the next bytes (`limits.send_timeout`).

use std::{future::Future, pin::Pin, task::Context, time::Duration};
use tokio::time::{Instant, Sleep};

/// The timer is made the first time something has to wait (many never do) and re-armed, not re-made,
/// for each later wait: one allocation at most, and one clock read per wait rather than per byte.
#[derive(Debug)]
pub(crate) struct Stall {
    limit: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl Stall {
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            limit,
            timer: None,
            armed: false,
        }
    }

    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Called when the wrapped operation is pending: whether this wait has now lasted `limit`. Registers
    /// the task to be woken when it will have.
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if !self.armed {
            timer.as_mut().reset(Instant::now() + limit);
            self.armed = true;
        }
        timer.as_mut().poll(cx).is_ready()
    }

    /// The operation made progress: the next wait starts afresh.
    pub(crate) fn progressed(&mut self) {
        self.armed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[tokio::test(start_paused = true)]
    async fn each_wait_gets_the_whole_limit() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut stall = Stall::new(Duration::from_secs(10));
        assert!(!stall.expired(&mut cx));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!stall.expired(&mut cx), "9 s into the first wait");
        stall.progressed();
        assert!(!stall.expired(&mut cx), "progress restarts the wait");
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!stall.expired(&mut cx), "9 s into the second wait");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(stall.expired(&mut cx), "10 s without progress");
    }
}
