//! `limits.send_timeout` for each HTTP/2 stream: a stream whose client takes none of its response for
//! that long is reset, as an HTTP/1.1 connection whose client reads nothing is closed.
//!
//! The connection's own write bound (`SendTimeout`) cannot see such a stream: HTTP/2 flow control
//! stops the bytes before they reach the socket. A client that grants a window of 0 keeps its socket
//! writable (it acknowledges SETTINGS and PINGs) while every response waits for window it never gives,
//! each holding a backend connection counted as load. hyper sends a response body by asking it for a
//! frame, then waiting for window to send it, then asking for the next: a body handed a frame and not
//! asked for the next is waiting on the client. Its [`Waiting`] says so, and the stream's task
//! ([`Watched`], spawned by [`StreamExec`]) ends the stream once that wait has lasted the limit.
//! Ending the task drops hyper's handles on the stream, which makes h2 send `RST_STREAM` (CANCEL), and
//! drops the response body, which releases the backend (its `Completion` settles on drop).
//!
//! hyper calls the service for a stream and hands the stream's task to the executor at once, in the
//! same step of the connection: the service leaves the stream's [`Waiting`] with the executor
//! ([`StreamWatch::expect`]), and the executor takes it for the task it is given next.

use crate::{stall::Stall, telemetry::metrics::WorkerCounters};
use pin_project_lite::pin_project;
use std::{
    cell::Cell,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::{atomic::Ordering::Relaxed, Arc},
    task::{Context, Poll},
    time::Duration,
};

/// What a stream's response body tells its task about the client.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    /// The body has handed hyper a frame and has not been asked for the next one since: hyper waits
    /// for the client's window.
    on_client: Cell<bool>,
    /// The body has been asked for a frame since the task last looked: the client took something.
    asked: Cell<bool>,
}

impl Waiting {
    /// hyper asks the body for its next frame.
    pub(crate) fn asked(&self) {
        self.asked.set(true);
        self.on_client.set(false);
    }

    /// The body handed hyper a frame, which waits for the client's window.
    pub(crate) fn handed(&self) {
        self.on_client.set(true);
    }
}

/// What the streams of one connection share: the limit, where cuts are counted, and the [`Waiting`]
/// of the stream whose task is to be spawned next.
pub(crate) struct StreamWatch {
    limit: Duration,
    counters: Arc<WorkerCounters>,
    peer: SocketAddr,
    next: Cell<Option<Rc<Waiting>>>,
}

impl StreamWatch {
    pub(crate) fn new(limit: Duration, counters: Arc<WorkerCounters>, peer: SocketAddr) -> Self {
        Self {
            limit,
            counters,
            peer,
            next: Cell::new(None),
        }
    }

    /// A stream's service has been called: its task, which hyper spawns next, watches `waiting`.
    pub(crate) fn expect(&self, waiting: Rc<Waiting>) {
        self.next.set(Some(waiting));
    }

    fn cut(&self) {
        self.counters.send_timeout.fetch_add(1, Relaxed);
        tracing::info!(target: "duet::conn", peer = %self.peer, reason = %"send_timeout", "reset a stream whose client read nothing for {:?}", self.limit);
    }
}

/// Runs hyper's per-stream tasks on the worker's thread (the proxy's futures hold `Rc`s, so they
/// cannot be sent to another), each watched by [`Watched`].
#[derive(Clone)]
pub(crate) struct StreamExec(pub(crate) Rc<StreamWatch>);

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn execute(&self, future: F) {
        // Nothing expected: a task that is not a stream's response (an upgraded stream's).
        let Some(waiting) = self.0.next.take() else {
            tokio::task::spawn_local(future);
            return;
        };
        tokio::task::spawn_local(Watched {
            stream: future,
            waiting,
            stall: Stall::new(self.0.limit),
            watch: self.0.clone(),
        });
    }
}

pin_project! {
    /// A stream's task, ended (`None`) once its response has waited `limits.send_timeout` on a client
    /// that took nothing.
    pub(crate) struct Watched<F> {
        #[pin]
        stream: F,
        waiting: Rc<Waiting>,
        stall: Stall,
        watch: Rc<StreamWatch>,
    }
}

impl<F: Future> Future for Watched<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.stream.poll(cx) {
            return Poll::Ready(Some(output));
        }
        if this.waiting.asked.take() {
            this.stall.progressed();
        }
        if this.waiting.on_client.get() && this.stall.expired(cx) {
            this.watch.cut();
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn watched(waiting: &Rc<Waiting>) -> Watched<std::future::Pending<()>> {
        let watch = StreamWatch::new(
            Duration::from_secs(10),
            Arc::default(),
            SocketAddr::from(([127, 0, 0, 1], 1)),
        );
        Watched {
            stream: std::future::pending(),
            waiting: waiting.clone(),
            stall: Stall::new(Duration::from_secs(10)),
            watch: Rc::new(watch),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_is_ended_once_its_client_has_taken_nothing_for_the_limit() {
        let mut cx = Context::from_waker(Waker::noop());
        let waiting = Rc::new(Waiting::default());
        let mut task = std::pin::pin!(watched(&waiting));
        waiting.asked();
        waiting.handed();
        assert!(task.as_mut().poll(&mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            task.as_mut().poll(&mut cx).is_pending(),
            "9 s on the client"
        );
        // The client took that frame: the next one gets the whole limit again.
        waiting.asked();
        waiting.handed();
        assert!(task.as_mut().poll(&mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            task.as_mut().poll(&mut cx).is_pending(),
            "9 s on the second"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_on_its_backend_is_not_timed() {
        let mut cx = Context::from_waker(Waker::noop());
        let waiting = Rc::new(Waiting::default());
        let mut task = std::pin::pin!(watched(&waiting));
        // Asked for a frame the backend has not sent yet (`timeouts.read` bounds that wait).
        waiting.asked();
        assert!(task.as_mut().poll(&mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(task.as_mut().poll(&mut cx).is_pending());
    }
}
