//! The body sent to a backend, kept so that a failed attempt can be retried elsewhere when that is safe.

use crate::{
    backend::client_body::{BodyError, BodyPace, ClientBody},
    headers::TrailerScrub,
    telemetry::{
        metrics::ClusterCounters,
        upload::{Received, Upload},
    },
};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::{
    fmt,
    pin::Pin,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
};

/// Where an attempt's body comes from.
#[derive(Debug, Clone)]
pub(crate) enum BodySource {
    /// No body: every attempt can send the same nothing.
    Empty,
    /// A body read in full first (up to the route's `buffer_request`, or `retries.replay_body_limit`
    /// for a small one): replayable.
    Buffered(Bytes),
    /// A large or unsized body streamed through: it can be given to another backend only if the
    /// failed attempt never read from it (the connection was never established).
    Streaming(Reclaimable),
}

/// How the client's side of a streamed body ended, when it was the client's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientFailure {
    /// Malformed chunking, or the client went away mid-body.
    Broken,
    /// Nothing arrived for `limits.body_read_timeout`.
    Stalled,
    /// The body fell behind `limits.min_upload_rate`.
    TooSlow,
    /// The body went past its route's `max_request_body`.
    TooLarge,
}

const UNTOUCHED: u8 = 0;
const TOUCHED: u8 = 1;
const BROKEN: u8 = 2;
const STALLED: u8 = 3;
const TOO_SLOW: u8 = 4;
const TOO_LARGE: u8 = 5;

impl BodySource {
    /// A body for one attempt, or `None` if this source has been (partly) consumed.
    pub(crate) fn attempt(&self) -> Option<UpstreamBody> {
        match self {
            Self::Empty => Some(UpstreamBody::Empty),
            Self::Buffered(bytes) => Some(UpstreamBody::Buffered(Some(bytes.clone()))),
            Self::Streaming(shared) => self.can_attempt().then(|| UpstreamBody::Streaming {
                shared: shared.clone(),
            }),
        }
    }

    /// Whether another attempt can still be given this body.
    pub(crate) fn can_attempt(&self) -> bool {
        match self {
            Self::Empty | Self::Buffered(_) => true,
            Self::Streaming(shared) => shared.state.load(Ordering::Acquire) == UNTOUCHED,
        }
    }

    /// Whether the client's own body failed: then the failure of the attempt is the client's, not the
    /// backend's.
    pub(crate) fn client_failure(&self) -> Option<ClientFailure> {
        match self {
            Self::Streaming(shared) => match shared.state.load(Ordering::Acquire) {
                BROKEN => Some(ClientFailure::Broken),
                STALLED => Some(ClientFailure::Stalled),
                TOO_SLOW => Some(ClientFailure::TooSlow),
                TOO_LARGE => Some(ClientFailure::TooLarge),
                _ => None,
            },
            _ => None,
        }
    }

    /// How far a streamed upload has got, for the response-headers timer; `None` when the whole body goes
    /// out at once.
    pub(crate) fn upload(&self) -> Option<&Arc<Upload>> {
        match self {
            Self::Streaming(shared) => Some(&shared.upload),
            _ => None,
        }
    }

    /// Whether a retry after the request reached a backend could resend the same bytes.
    pub(crate) fn replayable(&self) -> bool {
        !matches!(self, Self::Streaming(_))
    }

    /// What the access log reports as the request body's bytes received.
    pub(crate) fn received(&self) -> Received {
        match self {
            Self::Empty => Received::Known(0),
            Self::Buffered(bytes) => Received::Known(bytes.len() as u64),
            Self::Streaming(shared) => Received::Streamed(shared.upload.clone()),
        }
    }
}

/// A streaming body shared between attempts: polling it marks it touched.
#[derive(Debug, Clone)]
pub(crate) struct Reclaimable {
    inner: Arc<Streamed>,
    state: Arc<AtomicU8>,
    upload: Arc<Upload>,
    hint: SizeHint,
}

/// The client's body and how it is cut, behind the one pointer of a [`Reclaimable`]: every request
/// toward a backend carries an [`UpstreamBody`], moved several times through hyper's client, so
/// what only a streamed body needs is kept out of it (40 bytes more to copy, body or not).
#[derive(Debug)]
struct Streamed {
    body: Mutex<Option<ClientBody>>,
    /// What the client's trailers lose on their way.
    trailers: TrailerScrub,
    /// The most bytes the body may carry (the route's `max_request_body`): past it, the body sent to
    /// the backend fails instead of going on, so that the backend's request is reset, never ended
    /// as if the body were whole.
    max: Option<u64>,
}

impl Reclaimable {
    /// The client's `body`, its trailers scrubbed by `trailers`, cut past `max` bytes.
    pub(crate) fn new(
        body: Incoming,
        pace: BodyPace,
        counters: Option<Arc<ClusterCounters>>,
        (trailers, max): (TrailerScrub, Option<u64>),
    ) -> Self {
        let hint = body.size_hint();
        Self {
            inner: Arc::new(Streamed {
                body: Mutex::new(Some(ClientBody::new(body, pace))),
                trailers,
                max,
            }),
            state: Arc::new(AtomicU8::new(UNTOUCHED)),
            upload: Arc::new(Upload {
                counters,
                ..Upload::default()
            }),
            hint,
        }
    }
}

/// The body type of requests toward backends.
pub enum UpstreamBody {
    /// No body.
    Empty,
    /// A buffered body, sent in one frame.
    Buffered(Option<Bytes>),
    /// A streamed client body, cut off if the client pauses longer than the body read timeout or
    /// falls behind the upload floor.
    #[allow(private_interfaces)]
    Streaming {
        /// The client's body, shared with the request's other attempts.
        shared: Reclaimable,
    },
}

impl fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("UpstreamBody::Empty"),
            Self::Buffered(data) => write!(
                f,
                "UpstreamBody::Buffered({:?})",
                data.as_ref().map(Bytes::len)
            ),
            Self::Streaming { .. } => f.write_str("UpstreamBody::Streaming"),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::Buffered(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Streaming { shared } => poll_streaming(shared, cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Buffered(data) => data.is_none(),
            Self::Streaming { shared, .. } => match shared.inner.body.lock() {
                Ok(guard) => guard.as_ref().is_none_or(ClientBody::is_end_stream),
                Err(_) => true,
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::Buffered(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Self::Streaming { shared, .. } => shared.hint,
        }
    }
}

/// A streamed body went past its route's `max_request_body`.
#[derive(Debug)]
struct TooLarge;

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body went past the route's max_request_body")
    }
}

impl std::error::Error for TooLarge {}

/// The next frame of a streamed body, counted, with the client's failure recorded for the attempt
/// to read.
fn poll_streaming(
    shared: &Reclaimable,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, <UpstreamBody as Body>::Error>>> {
    let _ = shared
        .state
        .compare_exchange(UNTOUCHED, TOUCHED, Ordering::AcqRel, Ordering::Acquire);
    // Only one attempt ever polls (a retry happens only if the body was never touched), so the lock is
    // never contended.
    let frame = match shared.inner.body.lock() {
        Ok(mut guard) => match guard.as_mut() {
            Some(body) => body.poll_frame(cx),
            None => Poll::Ready(None),
        },
        Err(_) => Poll::Ready(None),
    };
    let upload = &shared.upload;
    upload
        .waiting_for_client
        .store(frame.is_pending(), Ordering::Relaxed);
    match frame {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Some(Err(error))) => {
            let (state, error): (u8, <UpstreamBody as Body>::Error) = match error {
                BodyError::Broken(error) => (BROKEN, Box::new(error)),
                BodyError::Stalled => (STALLED, Box::new(error)),
                BodyError::TooSlow => (TOO_SLOW, Box::new(error)),
            };
            shared.state.store(state, Ordering::Release);
            Poll::Ready(Some(Err(error)))
        }
        Poll::Ready(Some(Ok(mut frame))) => {
            upload.frames.fetch_add(1, Ordering::Relaxed);
            if let Some(trailers) = frame.trailers_mut() {
                // Fields scrubbed from the head, or edited there, must not come back as trailers.
                shared.inner.trailers.apply(trailers);
            }
            if let Some(data) = frame.data_ref() {
                let length = data.len() as u64;
                let total = upload.bytes.load(Ordering::Relaxed) + length;
                if shared.inner.max.is_some_and(|max| total > max) {
                    shared.state.store(TOO_LARGE, Ordering::Release);
                    return Poll::Ready(Some(Err(Box::new(TooLarge))));
                }
                upload.bytes.fetch_add(length, Ordering::Relaxed);
                if let Some(counters) = &upload.counters {
                    counters.bytes_received.fetch_add(length, Ordering::Relaxed);
                }
            }
            Poll::Ready(Some(Ok(frame)))
        }
        Poll::Ready(None) => {
            upload.frames.fetch_add(1, Ordering::Relaxed);
            Poll::Ready(None)
        }
    }
}
