//! The body duet sends to clients: a backend's streamed body, or a short local one.

use crate::stall::Stall;
use crate::{attempt::completion::Completion, outcome::Ending, telemetry::access_log::AccessLog};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::{
    fmt,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};

/// The error a client's response body can end with.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// A response body toward the client. A backend's body streams frame by frame (never buffered
    /// whole) and carries its attempt's [`Completion`], settled when the body ends, fails, stalls past
    /// `timeouts.read`, or is dropped.
    pub struct ProxyBody {
        #[pin]
        kind: Kind,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Upstream {
            #[pin]
            body: Incoming,
            completion: Option<Completion>,
            stall: Stall,
        },
        Local {
            data: Option<Bytes>,
            log: Option<Box<AccessLog>>,
            // A backend's body as a filter reshaped it (compressed), in place of `data`: boxed, and
            // here rather than in a variant of its own, so that a backend's body as it came pays
            // nothing for it.
            shaped: Option<Pin<Box<dyn Body<Data = Bytes, Error = BodyError>>>>,
        },
    }
}

/// The backend sent nothing for `timeouts.read` in the middle of its body.
#[derive(Debug)]
struct ReadTimeout(Duration);

impl fmt::Display for ReadTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the backend sent nothing for {:?} mid-body", self.0)
    }
}

impl std::error::Error for ReadTimeout {}

impl ProxyBody {
    pub(crate) fn upstream(body: Incoming, completion: Completion) -> Self {
        let stall = Stall::new(completion.read_timeout());
        // hyper never polls a body that has already ended (empty, HEAD, 204, 304): settle now.
        let completion = if body.is_end_stream() {
            completion.end(Ending::Complete);
            None
        } else {
            Some(completion)
        };
        Self {
            kind: Kind::Upstream {
                body,
                completion,
                stall,
            },
        }
    }

    pub(crate) fn local(data: Bytes, log: Option<Box<AccessLog>>) -> Self {
        Self::error(data, log, "complete")
    }

    /// A response duet made itself, the access log's `outcome` saying why.
    pub(crate) fn error(
        data: Bytes,
        mut log: Option<Box<AccessLog>>,
        outcome: &'static str,
    ) -> Self {
        if let Some(log) = log.as_mut() {
            log.bytes = data.len() as u64;
            log.outcome = outcome;
        }
        Self {
            kind: Kind::Local {
                data: (!data.is_empty()).then_some(data),
                log,
                shaped: None,
            },
        }
    }
}

impl ProxyBody {
    /// `body` in place of this one, which it wraps: a backend's body as a filter reshapes it.
    pub(crate) fn shaped(body: impl Body<Data = Bytes, Error = BodyError> + 'static) -> Self {
        Self {
            kind: Kind::Local {
                data: None,
                log: None,
                shaped: Some(Box::pin(body)),
            },
        }
    }

    /// Puts `data` in place of the body of a response duet made itself (an error page); `false`, and
    /// nothing changed, for a backend's body.
    pub(crate) fn replace_local(&mut self, data: Bytes) -> bool {
        let Kind::Local {
            data: held,
            log,
            shaped: None,
        } = &mut self.kind
        else {
            return false;
        };
        if let Some(log) = log.as_mut() {
            log.bytes = data.len() as u64;
        }
        *held = (!data.is_empty()).then_some(data);
        true
    }
}

impl ProxyBody {
    /// `page` (duet's, an error page) in place of a backend's `body`, which is read to its end and
    /// dropped before the page is sent, so that its connection is pooled again and its attempt
    /// settles as any other; past [`DRAINED`] bytes it is dropped unread instead.
    pub(crate) fn in_place_of(page: Bytes, body: Incoming, mut completion: Completion) -> Self {
        completion.replace_body(page.len());
        Self::shaped(InPlaceOf {
            page: Some(page),
            backend: Some(Self::upstream(body, completion)),
            drained: 0,
        })
    }
}

/// The most of a backend's body read and dropped to keep its connection: past it, the body (and its
/// connection) is dropped rather than read on while the client waits for the page.
const DRAINED: usize = 64 * 1024;

/// duet's page sent in place of a backend's body, once that body is read.
struct InPlaceOf {
    page: Option<Bytes>,
    backend: Option<ProxyBody>,
    drained: usize,
}

impl Body for InPlaceOf {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        while let Some(backend) = self.backend.as_mut() {
            match ready!(Pin::new(backend).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    self.drained += frame.data_ref().map_or(0, Bytes::len);
                    if self.drained > DRAINED {
                        self.backend = None;
                    }
                }
                // Ended, or failed (and settled so by its completion): the client gets the page.
                Some(Err(_)) | None => self.backend = None,
            }
        }
        Poll::Ready(self.page.take().map(|page| Ok(Frame::data(page))))
    }

    fn is_end_stream(&self) -> bool {
        self.page.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.page.as_ref().map_or(0, |page| page.len() as u64))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Upstream {
                mut body,
                completion,
                stall,
            } => {
                let frame = match body.as_mut().poll_frame(cx) {
                    Poll::Ready(frame) => frame,
                    Poll::Pending if completion.is_some() && stall.expired(cx) => {
                        if let Some(completion) = completion.take() {
                            completion.end(Ending::BodyTimeout);
                        }
                        return Poll::Ready(Some(Err(Box::new(ReadTimeout(stall.limit())))));
                    }
                    Poll::Pending => return Poll::Pending,
                };
                stall.progressed();
                let ended = match &frame {
                    Some(Ok(frame)) => {
                        if let Some(completion) = completion.as_mut() {
                            completion.on_data(frame.data_ref().map_or(0, Bytes::len));
                            if let Some(trailers) = frame.trailers_ref() {
                                completion.on_trailers(trailers);
                            }
                        }
                        // hyper stops polling once the body says it has ended.
                        body.is_end_stream().then_some(Ending::Complete)
                    }
                    Some(Err(_)) => Some(Ending::BodyReset),
                    None => Some(Ending::Complete),
                };
                if let Some(how) = ended {
                    if let Some(completion) = completion.take() {
                        completion.end(how);
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            KindProj::Local {
                shaped: Some(body), ..
            } => body.as_mut().poll_frame(cx),
            KindProj::Local { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body, .. } => body.is_end_stream(),
            Kind::Local {
                shaped: Some(body), ..
            } => body.is_end_stream(),
            Kind::Local { data, .. } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream { body, .. } => body.size_hint(),
            Kind::Local {
                shaped: Some(body), ..
            } => body.size_hint(),
            Kind::Local { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
