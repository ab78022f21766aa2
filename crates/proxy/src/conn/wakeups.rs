//! What wakes a client connection's task beside hyper: its timer (the idle or closing check) and the
//! drain signal, polled so that the many wakes hyper makes cost them next to nothing.
//!
//! A connection's task wakes a few times per request (an HTTP/2 connection several times per
//! stream), nearly always for hyper. The timer and the signal keep the task's waker from their first
//! poll, so later wakes look at them only once they may have fired (an atomic load each), not poll
//! them again: a timer-state update and a lock each, some hundreds of instructions a request (#50).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::{
    sync::watch::{error::RecvError, Receiver},
    time::Sleep,
};

/// Which of the two fired.
pub(crate) enum Woke {
    /// The timer is due.
    Timer,
    /// The drain signal changed (`false`: its sender is gone, which drains too).
    Signal(bool),
}

/// Whether the timer and the signal have been polled once (and hold the task's waker since).
#[derive(Default)]
pub(crate) struct Armed {
    timer: bool,
    signal: bool,
}

impl Armed {
    /// Polls `timer`, then `changed` (a `changed()` of the connection's own drain receiver) while
    /// `watch`, the worker's receiver, is given: each the first time, and after that only once it
    /// may have fired. The worker's receiver has seen no value since the worker started, so any send
    /// (the drain) shows there, and the connection's own receiver then says what it is.
    #[inline]
    pub(crate) fn poll<F: Future<Output = Result<(), RecvError>>>(
        &mut self,
        cx: &mut Context<'_>,
        mut timer: Pin<&mut Sleep>,
        mut changed: Pin<&mut F>,
        watch: Option<&Receiver<bool>>,
    ) -> Poll<Woke> {
        if !self.timer || timer.is_elapsed() {
            self.timer = true;
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woke::Timer);
            }
        }
        if let Some(hint) = watch {
            if !self.signal || !matches!(hint.has_changed(), Ok(false)) {
                self.signal = true;
                if let Poll::Ready(changed) = changed.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Signal(changed.is_ok()));
                }
            }
        }
        Poll::Pending
    }
}
