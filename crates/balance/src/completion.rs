//! When a request stops counting as load.

use crate::guard::LoadGuard;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    task::{ready, Context, Poll},
};
use tower::load::TrackCompletion;

/// A set of HTTP status codes (100–599), stored as a bitset so it is `Copy` and free to clone per request.
///
/// ```
/// use duet_balance::StatusSet;
/// use http::StatusCode;
///
/// let shedding: StatusSet = [StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE].into_iter().collect();
/// assert!(shedding.contains(StatusCode::SERVICE_UNAVAILABLE));
/// assert!(!shedding.contains(StatusCode::INTERNAL_SERVER_ERROR));
/// assert_eq!(format!("{shedding:?}"), "StatusSet {429, 503}");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusSet {
    bits: [u64; 8],
}

impl StatusSet {
    /// The empty set.
    pub const fn empty() -> Self {
        Self { bits: [0; 8] }
    }

    /// This set plus `status`. Codes outside 100–599 are ignored.
    pub fn with(mut self, status: StatusCode) -> Self {
        if let Some(i) = Self::slot(status) {
            self.bits[i / 64] |= 1 << (i % 64);
        }
        self
    }

    /// Whether `status` is in the set.
    #[inline]
    pub fn contains(&self, status: StatusCode) -> bool {
        Self::slot(status).is_some_and(|i| self.bits[i / 64] & (1 << (i % 64)) != 0)
    }

    fn slot(status: StatusCode) -> Option<usize> {
        let code = usize::from(status.as_u16());
        (100..600).contains(&code).then(|| code - 100)
    }
}

/// The codes, not the bits.
impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let codes = (100..600u16)
            .filter(|&code| StatusCode::from_u16(code).is_ok_and(|status| self.contains(status)));
        f.write_str("StatusSet ")?;
        f.debug_set().entries(codes).finish()
    }
}

impl FromIterator<StatusCode> for StatusSet {
    fn from_iter<I: IntoIterator<Item = StatusCode>>(iter: I) -> Self {
        iter.into_iter().fold(Self::empty(), Self::with)
    }
}

/// Completion for `http::Response<B>`: the request stays in flight until its body ends.
///
/// The response body is wrapped in a [`TrackedBody`] that releases the load when the body reports end of
/// stream (checked after every frame, since hyper stops polling a body that says it has ended), on a body
/// error, or when the body is dropped, whichever is first. Responses whose status is in
/// [`penalised`](Self::penalised) (by default 429 and 503) record the PeakEWMA penalty instead of their
/// latency, so the balancer steers away from an endpoint that sheds load.
///
/// ```
/// use bytes::Bytes;
/// use duet_balance::{Balancer, CompleteOnBodyEnd, Strategy};
/// use http_body_util::{BodyExt, Full};
/// use std::convert::Infallible;
/// use tower::{service_fn, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), duet_balance::BoxError> {
/// let mut balance = Balancer::new(Strategy::P2cPeakEwma).with_completion(CompleteOnBodyEnd::default());
/// let backend = service_fn(|_: ()| async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("hi")))) });
/// balance.insert("a", 1, backend);
///
/// let response = balance.ready().await?.call(()).await?;
/// // The response is here, its body (a TrackedBody) is not read yet: the request still counts.
/// assert_eq!(balance.endpoint_load(&"a").map(|l| l.in_flight()), Some(1));
/// let body = response.into_body().collect().await?.to_bytes();
/// assert_eq!(body, "hi");
/// assert_eq!(balance.endpoint_load(&"a").map(|l| l.in_flight()), Some(0));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CompleteOnBodyEnd {
    penalised: StatusSet,
}

impl Default for CompleteOnBodyEnd {
    fn default() -> Self {
        Self {
            penalised: [
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ]
            .into_iter()
            .collect(),
        }
    }
}

impl CompleteOnBodyEnd {
    /// Completion that penalises the given statuses.
    pub fn penalising(penalised: StatusSet) -> Self {
        Self { penalised }
    }

    /// The statuses recorded as failures.
    pub fn penalised(&self) -> StatusSet {
        self.penalised
    }
}

impl<B: Body> TrackCompletion<LoadGuard, http::Response<B>> for CompleteOnBodyEnd {
    type Output = http::Response<TrackedBody<B>>;

    fn track_completion(&self, mut guard: LoadGuard, response: http::Response<B>) -> Self::Output {
        guard.on_response_head(self.penalised.contains(response.status()));
        response.map(|body| TrackedBody::new(body, guard))
    }
}

pin_project! {
    /// A response body that holds its request's [`LoadGuard`] until the body ends, fails or is dropped.
    #[derive(Debug)]
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        guard: Option<LoadGuard>,
    }
}

impl<B: Body> TrackedBody<B> {
    /// Wraps `inner`; an already-finished body (empty, HEAD, 204, 304) releases the guard at once.
    pub fn new(inner: B, guard: LoadGuard) -> Self {
        let guard = (!inner.is_end_stream()).then_some(guard);
        Self { inner, guard }
    }
}

impl<B> TrackedBody<B> {
    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let finished = match &frame {
            Some(Ok(_)) => this.inner.is_end_stream(),
            Some(Err(_)) | None => true,
        };
        if finished {
            this.guard.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
