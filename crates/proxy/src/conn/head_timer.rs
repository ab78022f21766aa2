//! How long a client may take over a request head (`limits.header_read_timeout`), timed by duet
//! rather than by hyper.
//!
//! hyper's own header timer (`http1::Builder::header_read_timeout`) costs about 800 instructions a
//! request even when it never fires: it arms a timer for every head, and once a response is out it
//! polls the connection a second time to start the next head's timer at once. Here the connection's
//! [`HeadClock`] is armed when a head is awaited (the turn's start, and the end of each response: hyper
//! goes back to reading a head when it drops the response's body) and disarmed when hyper hands a
//! head to the service. What compares the deadline with the clock is the connection's own idle tick
//! ([`serve`](super::serve)'s `drive` checks [`HeadClock::expired`] every `park_after / 2`, at most a
//! quarter of `header_read_timeout`), so a stalled head is cut at most that tick after its deadline.
//!
//! A response's body ends before hyper has written all of it: up to a write buffer's worth is still to
//! go to a client that may read slowly. So after a response the deadline is not read off the clock at
//! once: the first tick that finds the connection's writes quiet since the tick before starts it
//! (`SendTimeout` reports each write that made progress), and a client still taking the response in is
//! never cut as a slow head (`limits.send_timeout` cuts one that takes nothing). No clock is read per
//! request either way.

use crate::attempt::body::ProxyBody;
use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use std::{
    cell::Cell,
    convert::Infallible,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{ready, Context, Poll},
    time::Duration,
};
use tokio::time::Instant;

/// When the head a connection awaits is due, if it awaits one.
#[derive(Debug)]
pub(crate) struct HeadClock {
    timeout: Duration,
    state: Cell<Awaited>,
    /// The last write to the client found no room: bytes of a response are still waiting for the
    /// client to read (`limits.send_timeout` times that, not this clock).
    blocked: Cell<bool>,
}

/// Whether a head is awaited, and since when it is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    /// The head has arrived: nothing is timed until its response is out.
    No,
    /// A response is out (or still being written): the next tick starts the deadline.
    AfterWrites,
    /// The head is due by then.
    By(Instant),
}

impl HeadClock {
    /// A clock for heads that may take `timeout`, armed from now: a turn starts by awaiting a head
    /// (its first byte has arrived, or the connection was just accepted).
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            state: Cell::new(Awaited::By(Instant::now() + timeout)),
            blocked: Cell::new(false),
        }
    }

    /// A response is done with: a head is awaited once its last bytes are written.
    pub(crate) fn arm(&self) {
        self.state.set(Awaited::AfterWrites);
    }

    /// The head has arrived: nothing is timed until the response is out.
    pub(crate) fn disarm(&self) {
        self.state.set(Awaited::No);
    }

    /// A write to the client made progress: while a head is awaited, its deadline starts again at the
    /// next tick.
    pub(crate) fn wrote(&self) {
        self.written(false);
    }

    /// A write to the client found no room (the client is not reading): no head is timed until a
    /// write makes progress again, however long the client pauses.
    pub(crate) fn write_blocked(&self) {
        self.written(true);
    }

    fn written(&self, blocked: bool) {
        self.blocked.set(blocked);
        if self.state.get() != Awaited::No {
            self.state.set(Awaited::AfterWrites);
        }
    }

    /// Whether the head awaited is past its deadline; called at each idle tick, which starts the
    /// deadline of a head awaited after writes that have gone quiet.
    pub(crate) fn expired(&self) -> bool {
        match self.state.get() {
            Awaited::No => false,
            Awaited::AfterWrites if self.blocked.get() => false,
            Awaited::AfterWrites => {
                self.state.set(Awaited::By(Instant::now() + self.timeout));
                false
            }
            Awaited::By(due) => Instant::now() >= due,
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body as hyper gets it from [`serve`](super::serve)'s service: hyper drops it when it
    /// is done with the response and goes back to reading a head, which arms the connection's clock.
    pub(crate) struct ClientBody {
        #[pin]
        body: ProxyBody,
        rearm: Rearm,
    }
}

impl ClientBody {
    pub(crate) fn new(body: ProxyBody, clock: Rc<HeadClock>) -> Self {
        Self {
            body,
            rearm: Rearm(clock),
        }
    }
}

/// Arms its clock when dropped.
struct Rearm(Rc<HeadClock>);

impl Drop for Rearm {
    fn drop(&mut self) {
        self.0.arm();
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = <ProxyBody as Body>::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// The service's future, its response's body made a [`ClientBody`].
    pub(crate) struct WithClientBody<F> {
        #[pin]
        future: F,
        clock: Rc<HeadClock>,
    }
}

impl<F> WithClientBody<F> {
    pub(crate) fn new(future: F, clock: Rc<HeadClock>) -> Self {
        Self { future, clock }
    }
}

impl<F: Future<Output = Result<Response<ProxyBody>, Infallible>>> Future for WithClientBody<F> {
    type Output = Result<Response<ClientBody>, Infallible>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(response) = ready!(this.future.poll(cx));
        let clock = this.clock.clone();
        Poll::Ready(Ok(response.map(|body| ClientBody::new(body, clock))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_head_is_timed_from_arming_to_disarming() {
        let clock = Rc::new(HeadClock::new(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!clock.expired(), "before the deadline");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(clock.expired(), "at the deadline");
        clock.disarm();
        assert!(!clock.expired(), "the head has arrived");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!clock.expired(), "a request in service is not timed");
        clock.wrote();
        assert!(!clock.expired(), "a response being written is not timed");
        drop(ClientBody::new(
            ProxyBody::local(Bytes::new(), None),
            clock.clone(),
        ));
        assert!(
            !clock.expired(),
            "the first tick after the response starts the deadline"
        );
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            !clock.expired(),
            "the response is out: the next head's deadline"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(clock.expired());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_pausing_before_the_last_of_a_response_is_not_timed_as_a_slow_head() {
        let clock = HeadClock::new(Duration::from_secs(10));
        clock.disarm();
        clock.arm();
        // The body has ended; its last bytes wait for room the client does not make for 50 s (under
        // the send timeout): every tick meanwhile finds the writes quiet, and still times nothing.
        clock.write_blocked();
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(2500)).await;
            assert!(!clock.expired(), "waiting for the client's window");
        }
        // The client reads; the rest goes out and the writes go quiet: the deadline starts then.
        clock.wrote();
        assert!(!clock.expired(), "the tick that starts the deadline");
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!clock.expired());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(clock.expired(), "a head awaited 10 s after the last write");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_still_taking_a_response_in_is_not_timed_as_a_slow_head() {
        let clock = HeadClock::new(Duration::from_secs(10));
        clock.disarm();
        clock.arm();
        // The body has ended but its last bytes go out slowly: a write every 4 s for 60 s, and a tick
        // after each, which starts the deadline afresh.
        for _ in 0..15 {
            clock.wrote();
            assert!(!clock.expired());
            tokio::time::advance(Duration::from_secs(4)).await;
            assert!(!clock.expired(), "a write less than 10 s ago");
        }
        // Quiet since: due 10 s after the last tick that started it.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(clock.expired());
    }
}
