//! The body duet sends to clients: a backend's streamed body, or a short local one.

use bytes::Bytes;
use duet_balance::TrackedBody;
use http::{Method, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::{
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};
use tokio::time::Instant;

pin_project! {
    /// A response body toward the client. Backend bodies stream frame by frame (never buffered whole)
    /// and keep their load guard until they end.
    pub struct ProxyBody {
        #[pin]
        kind: Kind,
        log: Option<AccessLog>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Upstream { #[pin] body: TrackedBody<Incoming> },
        Local { data: Option<Bytes> },
    }
}

impl ProxyBody {
    pub(crate) fn upstream(body: TrackedBody<Incoming>, mut log: Option<AccessLog>) -> Self {
        if let Some(log) = log.as_mut().filter(|_| body.is_end_stream()) {
            log.complete = Some(true);
        }
        Self {
            kind: Kind::Upstream { body },
            log,
        }
    }

    pub(crate) fn local(data: Bytes, log: Option<AccessLog>) -> Self {
        let mut body = Self {
            kind: Kind::Local {
                data: (!data.is_empty()).then_some(data),
            },
            log,
        };
        if let (Some(log), Kind::Local { data: Some(data) }) = (&mut body.log, &body.kind) {
            log.bytes = data.len() as u64;
        }
        body
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Upstream { mut body } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                if let Some(log) = this.log.as_mut() {
                    match &frame {
                        Some(Ok(frame)) => {
                            log.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
                            // hyper stops polling once the body says it has ended.
                            if body.is_end_stream() {
                                log.complete = Some(true);
                            }
                        }
                        Some(Err(_)) => log.complete = Some(false),
                        None => log.complete = Some(true),
                    }
                }
                Poll::Ready(frame)
            }
            KindProj::Local { data } => {
                if let Some(log) = this.log.as_mut() {
                    log.complete = Some(true);
                }
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body } => body.is_end_stream(),
            Kind::Local { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream { body } => body.size_hint(),
            Kind::Local { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// One access-log line, written when the response body is finished or dropped: only then are the
/// byte count and the duration known.
pub(crate) struct AccessLog {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) status: StatusCode,
    pub(crate) cluster: Option<Arc<str>>,
    pub(crate) backend: Option<SocketAddr>,
    pub(crate) started: Instant,
    pub(crate) bytes: u64,
    /// `Some(true)` at end of stream, `Some(false)` on a body error, `None` if dropped before either.
    pub(crate) complete: Option<bool>,
}

impl AccessLog {
    pub(crate) fn enabled() -> bool {
        tracing::enabled!(target: "duet::access", tracing::Level::INFO)
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let outcome = match self.complete {
            Some(true) => "complete",
            Some(false) => "backend_error",
            None if self.bytes == 0 && self.status.as_u16() < 200 => "upgraded",
            None => "client_gone",
        };
        tracing::info!(
            target: "duet::access",
            method = %self.method,
            path = %self.path,
            status = self.status.as_u16(),
            cluster = %self.cluster.as_deref().unwrap_or("-"),
            backend = %self.backend.map_or_else(|| "-".to_owned(), |b| b.to_string()),
            duration_ms = format_args!("{duration_ms:.3}"),
            bytes = self.bytes,
            outcome = %outcome,
        );
    }
}
