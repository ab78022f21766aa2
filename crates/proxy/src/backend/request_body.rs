//! The body sent to a backend, kept so that a failed attempt can be retried elsewhere when that is safe.

use crate::{
    headers,
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
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Sleep;

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

/// How the client's side of a streamed body ended, when it was the client's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientFailure {
    /// Malformed chunking, or the client went away mid-body.
    Broken,
    /// Nothing arrived for `limits.body_read_timeout`.
    Stalled,
}

const UNTOUCHED: u8 = 0;
const TOUCHED: u8 = 1;
const BROKEN: u8 = 2;
const STALLED: u8 = 3;

impl BodySource {
    /// A body for one attempt, or `None` if this source has been (partly) consumed.
    pub(crate) fn attempt(&self) -> Option<UpstreamBody> {
        match self {
            Self::Empty => Some(UpstreamBody::Empty),
            Self::Buffered(bytes) => Some(UpstreamBody::Buffered(Some(bytes.clone()))),
            Self::Streaming(shared) => self.can_attempt().then(|| UpstreamBody::Streaming {
                shared: shared.clone(),
                deadline: None,
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
    inner: Arc<Mutex<Option<Incoming>>>,
    state: Arc<AtomicU8>,
    upload: Arc<Upload>,
    hint: SizeHint,
    idle_timeout: Duration,
}

impl Reclaimable {
    pub(crate) fn new(
        body: Incoming,
        idle_timeout: Duration,
        counters: Option<Arc<ClusterCounters>>,
    ) -> Self {
        let hint = body.size_hint();
        Self {
            inner: Arc::new(Mutex::new(Some(body))),
            state: Arc::new(AtomicU8::new(UNTOUCHED)),
            upload: Arc::new(Upload {
                counters,
                ..Upload::default()
            }),
            hint,
            idle_timeout,
        }
    }
}

/// The client stopped sending its body.
#[derive(Debug)]
struct BodyStalled;

impl fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the client stopped sending its request body")
    }
}

impl std::error::Error for BodyStalled {}

/// The body type of requests toward backends.
pub enum UpstreamBody {
    /// No body.
    Empty,
    /// A buffered body, sent in one frame.
    Buffered(Option<Bytes>),
    /// A streamed client body, cut off if the client pauses longer than the body read timeout.
    #[allow(private_interfaces)]
    Streaming {
        /// The client's body, shared with the request's other attempts.
        shared: Reclaimable,
        /// When the current wait for the next frame gives up.
        deadline: Option<Pin<Box<Sleep>>>,
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
            Self::Streaming { shared, deadline } => {
                let _ = shared.state.compare_exchange(
                    UNTOUCHED,
                    TOUCHED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                // Only one attempt ever polls (a retry happens only if the body was never touched), so
                // the lock is never contended.
                let frame = match shared.inner.lock() {
                    Ok(mut guard) => match guard.as_mut() {
                        Some(body) => Pin::new(body).poll_frame(cx),
                        None => Poll::Ready(None),
                    },
                    Err(_) => Poll::Ready(None),
                };
                shared
                    .upload
                    .waiting_for_client
                    .store(frame.is_pending(), Ordering::Relaxed);
                match frame {
                    Poll::Pending => {
                        let timeout = shared.idle_timeout;
                        let sleep =
                            deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                        if sleep.as_mut().poll(cx).is_ready() {
                            shared.state.store(STALLED, Ordering::Release);
                            return Poll::Ready(Some(Err(Box::new(BodyStalled))));
                        }
                        Poll::Pending
                    }
                    Poll::Ready(Some(Err(error))) => {
                        shared.state.store(BROKEN, Ordering::Release);
                        Poll::Ready(Some(Err(Box::new(error))))
                    }
                    Poll::Ready(mut other) => {
                        // A frame (or the end) arrived: the next wait starts afresh.
                        *deadline = None;
                        if let Some(trailers) = other
                            .as_mut()
                            .and_then(|f| f.as_mut().ok())
                            .and_then(Frame::trailers_mut)
                        {
                            // Fields scrubbed from the head must not come back as trailers.
                            headers::remove_forbidden_trailers(trailers);
                        }
                        let upload = &shared.upload;
                        upload.frames.fetch_add(1, Ordering::Relaxed);
                        if let Some(Ok(data)) =
                            other.as_ref().map(|f| f.as_ref().map(Frame::data_ref))
                        {
                            let length = data.map_or(0, |d| d.len() as u64);
                            upload.bytes.fetch_add(length, Ordering::Relaxed);
                            if let Some(counters) = &upload.counters {
                                counters.bytes_received.fetch_add(length, Ordering::Relaxed);
                            }
                        }
                        Poll::Ready(
                            other.map(|frame| frame.map_err(|e| Box::new(e) as Self::Error)),
                        )
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Buffered(data) => data.is_none(),
            Self::Streaming { shared, .. } => match shared.inner.lock() {
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
            Self::Streaming { shared, .. } => shared.hint,
        }
    }
}
