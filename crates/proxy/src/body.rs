//! The body duet sends to clients: a backend's streamed body, or a short local one.

use crate::{access_log::AccessLog, completion::Completion};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::{
    pin::Pin,
    task::{ready, Context, Poll},
};

pin_project! {
    /// A response body toward the client. A backend's body streams frame by frame (never buffered
    /// whole) and carries its attempt's [`Completion`], settled when the body ends, fails or is dropped.
    pub struct ProxyBody {
        #[pin]
        kind: Kind,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Upstream { #[pin] body: Incoming, completion: Option<Completion> },
        Local { data: Option<Bytes>, log: Option<AccessLog> },
    }
}

impl ProxyBody {
    pub(crate) fn upstream(body: Incoming, completion: Completion) -> Self {
        // hyper never polls a body that has already ended (empty, HEAD, 204, 304): settle now.
        let completion = if body.is_end_stream() {
            completion.end(true);
            None
        } else {
            Some(completion)
        };
        Self {
            kind: Kind::Upstream { body, completion },
        }
    }

    pub(crate) fn local(data: Bytes, mut log: Option<AccessLog>) -> Self {
        if let Some(log) = log.as_mut() {
            log.bytes = data.len() as u64;
            log.outcome = "complete";
        }
        Self {
            kind: Kind::Local {
                data: (!data.is_empty()).then_some(data),
                log,
            },
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Upstream {
                mut body,
                completion,
            } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let ended = match &frame {
                    Some(Ok(frame)) => {
                        if let Some(completion) = completion.as_mut() {
                            completion.on_data(frame.data_ref().map_or(0, Bytes::len));
                        }
                        // hyper stops polling once the body says it has ended.
                        body.is_end_stream().then_some(true)
                    }
                    Some(Err(_)) => Some(false),
                    None => Some(true),
                };
                if let Some(clean) = ended {
                    if let Some(completion) = completion.take() {
                        completion.end(clean);
                    }
                }
                Poll::Ready(frame)
            }
            KindProj::Local { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body, .. } => body.is_end_stream(),
            Kind::Local { data, .. } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream { body, .. } => body.size_hint(),
            Kind::Local { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
