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
    due: Cell<Option<Instant>>,
}

impl HeadClock {
    /// A clock for heads that may take `timeout`, armed: a turn starts by awaiting a head.
    pub(crate) fn new(timeout: Duration) -> Self {
        let clock = Self {
            timeout,
            due: Cell::new(None),
        };
        clock.arm();
        clock
    }

    /// A head is awaited from now on.
    pub(crate) fn arm(&self) {
        self.due.set(Some(Instant::now() + self.timeout));
    }

    /// The head has arrived: nothing is timed until the response is out.
    pub(crate) fn disarm(&self) {
        self.due.set(None);
    }

    /// Whether the head awaited is past its deadline.
    pub(crate) fn expired(&self) -> bool {
        self.due.get().is_some_and(|due| Instant::now() >= due)
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
        drop(ClientBody::new(
            ProxyBody::local(Bytes::new(), None),
            clock.clone(),
        ));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            !clock.expired(),
            "the response is out: the next head's deadline"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(clock.expired());
    }
}
