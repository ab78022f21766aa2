//! The body sent to a backend, kept so that a failed attempt can be retried elsewhere when that is safe.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
};

/// Where an attempt's body comes from.
#[derive(Debug, Clone)]
pub(crate) enum BodySource {
    /// No body: every attempt can send the same nothing.
    Empty,
    /// A small body read in full first (up to `retries.replay_body_limit`): replayable.
    Buffered(Bytes),
    /// A large or unsized body streamed through: it can be given to another backend only if the
    /// failed attempt never read from it (the connection was never established).
    Streaming(Reclaimable),
}

impl BodySource {
    /// A body for one attempt, or `None` if this source has been (partly) consumed.
    pub(crate) fn attempt(&self) -> Option<UpstreamBody> {
        match self {
            Self::Empty => Some(UpstreamBody::Empty),
            Self::Buffered(bytes) => Some(UpstreamBody::Buffered(Some(bytes.clone()))),
            Self::Streaming(shared) => {
                (!shared.touched()).then(|| UpstreamBody::Streaming(shared.clone()))
            }
        }
    }

    /// Whether another attempt can still be given this body.
    pub(crate) fn can_attempt(&self) -> bool {
        match self {
            Self::Empty | Self::Buffered(_) => true,
            Self::Streaming(shared) => !shared.touched(),
        }
    }

    /// Whether the client's own body failed (malformed chunking, client gone): then the failure of the
    /// attempt is the client's, not the backend's.
    pub(crate) fn client_failed(&self) -> bool {
        matches!(self, Self::Streaming(shared) if shared.failed.load(Ordering::Acquire))
    }

    /// Whether a retry after the request reached a backend could resend the same bytes.
    pub(crate) fn replayable(&self) -> bool {
        !matches!(self, Self::Streaming(_))
    }
}

/// A streaming body shared between attempts: polling it marks it touched.
#[derive(Debug, Clone)]
pub(crate) struct Reclaimable {
    inner: Arc<Mutex<Option<Incoming>>>,
    touched: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    hint: SizeHint,
}

impl Reclaimable {
    pub(crate) fn new(body: Incoming) -> Self {
        let hint = body.size_hint();
        Self {
            inner: Arc::new(Mutex::new(Some(body))),
            touched: Arc::new(AtomicBool::new(false)),
            failed: Arc::new(AtomicBool::new(false)),
            hint,
        }
    }

    fn touched(&self) -> bool {
        self.touched.load(Ordering::Acquire)
    }
}

/// The body type of requests toward backends.
#[derive(Debug)]
pub enum UpstreamBody {
    /// No body.
    Empty,
    /// A buffered body, sent in one frame.
    Buffered(Option<Bytes>),
    /// A streamed client body.
    #[allow(private_interfaces)]
    Streaming(Reclaimable),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::Buffered(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Streaming(shared) => {
                shared.touched.store(true, Ordering::Release);
                // Only one attempt ever polls (a retry happens only if the body was never touched), so
                // the lock is never contended.
                let Ok(mut guard) = shared.inner.lock() else {
                    return Poll::Ready(None);
                };
                let frame = match guard.as_mut() {
                    Some(body) => Pin::new(body).poll_frame(cx),
                    None => Poll::Ready(None),
                };
                if let Poll::Ready(Some(Err(_))) = &frame {
                    shared.failed.store(true, Ordering::Release);
                }
                frame
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Buffered(data) => data.is_none(),
            Self::Streaming(shared) => match shared.inner.lock() {
                Ok(guard) => guard.as_ref().is_none_or(Body::is_end_stream),
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
            Self::Streaming(shared) => shared.hint,
        }
    }
}
