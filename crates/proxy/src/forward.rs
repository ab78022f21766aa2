//! Stage 4, forward: one attempt to one backend picked by the cluster's balancer, and the one place
//! where what went wrong becomes an [`ErrorKind`].

use crate::{
    attempt::completion::Completion,
    backend::cluster::{Cluster, SpareTimers, Upstream},
    backend::pool::{Key, UpstreamError},
    backend::request_body::{BodySource, ClientFailure, UpstreamBody},
    backend::transport::{Hold, Transport},
    error::{ErrorKind, ProxyError},
    exchange::Prepared,
    outcome::{Blame, Failure},
    telemetry::upload::Upload,
};
use duet_balance::LoadGuard;
use http::{
    header, request::Parts, uri::Authority, HeaderMap, HeaderValue, Request, Response, Uri, Version,
};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::{pin, Pin},
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};
use std::{net::SocketAddr, rc::Rc, sync::atomic::Ordering::Relaxed};
use tokio::time::{Instant, Sleep};

/// How many times one attempt is sent again after meeting pooled connections that the backend closed
/// (each resend takes another pooled connection, or a new one).
const MAX_RESENDS: u32 = 3;

/// A backend the balancer picked for one attempt, counted as its load while the guard lives.
pub(crate) type Picked = (SocketAddr, Upstream, LoadGuard);

/// Sends `prepared` to a backend of `cluster` not in `tried`, counted as that backend's load until the
/// returned [`Completion`] settles. `last` says this is the last attempt, so the headers need not be kept
/// for another.
pub(crate) async fn forward(
    cluster: &Rc<Cluster>,
    prepared: &mut Prepared,
    tried: &[SocketAddr],
    last: bool,
) -> Result<(Response<Incoming>, Completion), ProxyError> {
    let (picked, body, headers) = begin(cluster, prepared, tried, last)?;
    send(cluster, prepared, picked, body, Some(headers)).await
}

/// What [`send`] takes for one attempt: the backend picked, the body, and the headers.
pub(crate) type Begun = (Picked, UpstreamBody, HeaderMap);

/// The part of [`forward`] that does not wait: a backend of `cluster` not in `tried` picked, and the
/// attempt's body and headers. A caller that awaits [`send`] itself keeps one future layer (and its
/// copies) off the request path.
pub(crate) fn begin(
    cluster: &Rc<Cluster>,
    prepared: &mut Prepared,
    tried: &[SocketAddr],
    last: bool,
) -> Result<Begun, ProxyError> {
    let Some(body) = prepared.source.attempt() else {
        return Err(ProxyError::new(ErrorKind::BadGateway));
    };
    let Ok(picked) = cluster.pick(tried, (prepared.affinity, prepared.session)) else {
        return Err(ProxyError::new(ErrorKind::NoEligibleBackend));
    };
    // A request that may meet the keep-alive close race is sent again to the same backend (as one
    // attempt, one unit of load): only when RFC 9110 lets a client resend it unasked (idempotent) and
    // its body can be sent again, so its headers are kept even for the last attempt.
    // An h2 stream the backend refused (GOAWAY) is sent again the same way.
    let keep = resendable(prepared) || matches!(cluster.client(), Transport::H2(_));
    let headers = if last && !keep {
        prepared.take_headers()
    } else {
        prepared.lend_headers()
    };
    Ok((picked, body, headers))
}

/// Whether an attempt that met a pooled connection closing may be sent again.
fn resendable(prepared: &Prepared) -> bool {
    prepared.parts.method.is_idempotent() && prepared.source.replayable()
}

/// Sends `prepared` with `body` to the backend `picked` for it: with `headers` when the caller took
/// them ([`begin`]), else (a hedge) with a copy of the prepared ones; a resend gets a copy too.
pub(crate) async fn send(
    cluster: &Rc<Cluster>,
    prepared: &Prepared,
    (backend, Upstream { authority, stats }, guard): Picked,
    mut body: UpstreamBody,
    mut headers: Option<HeaderMap>,
) -> Result<(Response<Incoming>, Completion), ProxyError> {
    let mut completion = Completion::new(guard, cluster.clone(), backend, stats);
    // The field the request's telemetry has the attempt carry, if any (a traced request's
    // `traceparent`, naming the attempt's span).
    let field = prepared.attempt_field(&mut completion);
    let resendable = resendable(prepared);
    let h2 = matches!(cluster.client(), Transport::H2(_));
    let mut resends = 0;
    // When this send starts: the attempt's start, then each resend's. The pool and the head's
    // deadline take this reading rather than one each.
    let mut sent = completion.started();
    let error = loop {
        let mut headers = headers.take().unwrap_or_else(|| prepared.attempt_headers());
        if let Some((name, value)) = &field {
            headers.insert(name, value.clone());
        }
        let request = upstream_request(&prepared.parts, &authority, body, headers);
        let upload = prepared.source.upload().cloned();
        // Each future is pinned where it is built: moved into the deadline by value, it (over a
        // kilobyte) would be copied twice more per attempt. HTTP/1.1 (most clusters) awaits the
        // pool's future without the transport's around it: one layer less per attempt.
        let unanswered = match cluster.client() {
            Transport::Http1(client) => {
                let response = pin!(client.send(Key(backend, prepared.client), request, sent));
                match head_deadline(cluster, response, upload, sent).await {
                    Ok(Ok((response, lease))) => {
                        completion.lend(Hold::Lease(lease));
                        return Ok((response, completion));
                    }
                    Ok(Err(error)) => Ok(error),
                    Err(elapsed) => Err(elapsed),
                }
            }
            transport => {
                let response = pin!(transport.send(Key(backend, prepared.client), request, sent));
                match head_deadline(cluster, response, upload, sent).await {
                    Ok(Ok((response, hold))) => {
                        completion.lend(hold);
                        return Ok((response, completion));
                    }
                    Ok(Err(error)) => Ok(error),
                    Err(elapsed) => Err(elapsed),
                }
            }
        };
        // Unanswered: the exchange failed (Ok), or no head came in time (Err).
        break match unanswered {
            Ok(error) => match local_fault(&error) {
                // duet's own limits and resources are never the backend's failure.
                Some(kind) => {
                    completion.count_failure(Failure::Local);
                    completion.fail(Blame::Local);
                    return Err(ProxyError::upstream(kind, backend, error));
                }
                None if resends < MAX_RESENDS
                    && stale(&error, h2, resendable, &prepared.source) =>
                {
                    resends += 1;
                    cluster.counters.stale_resends.fetch_add(1, Relaxed);
                    tracing::debug!(%backend, "resending a request that met a pooled connection closing: {error}");
                    match prepared.source.attempt() {
                        Some(again) => {
                            body = again;
                            sent = Instant::now();
                            continue;
                        }
                        None => ProxyError::upstream(ErrorKind::BadGateway, backend, error),
                    }
                }
                None if error.is_tls() => {
                    ProxyError::upstream(ErrorKind::TlsHandshake, backend, error)
                }
                None if error.is_connect() => {
                    ProxyError::upstream(ErrorKind::Connect, backend, error)
                }
                None => ProxyError::upstream(ErrorKind::BadGateway, backend, error),
            },
            Err(elapsed) => ProxyError::upstream(ErrorKind::Timeout, backend, elapsed),
        };
    };
    // A body that broke or stalled on the client's side is the client's failure, not the backend's.
    let (error, fault) = match prepared.source.client_failure() {
        Some(ClientFailure::Broken) => (ProxyError::new(ErrorKind::BadRequestBody), Blame::Client),
        Some(ClientFailure::Stalled) => (ProxyError::new(ErrorKind::BodyTimeout), Blame::Client),
        Some(ClientFailure::TooSlow) => (ProxyError::new(ErrorKind::UploadTooSlow), Blame::Client),
        Some(ClientFailure::TooLarge) => (ProxyError::new(ErrorKind::BodyTooLarge), Blame::Client),
        None => (error, Blame::Backend),
    };
    if fault == Blame::Backend {
        completion.count_failure(match error.kind() {
            ErrorKind::Connect => Failure::Connect,
            ErrorKind::TlsHandshake => Failure::Tls,
            ErrorKind::Timeout => Failure::Timeout,
            _ => Failure::Protocol,
        });
    }
    completion.fail(fault);
    Err(error)
}

pin_project! {
    /// Bounds the wait for a response head by `timeouts.response_headers`, counted from when the request
    /// was fully sent: while a streamed upload is still moving, or is waiting on the client (whose pace
    /// `limits.body_read_timeout` bounds), the timer starts over. An upload the backend stops taking
    /// times out like a silent backend. (Checked at each expiry, so the head may take up to twice the
    /// limit after the last progress of an upload.)
    ///
    /// Its timer is one of the cluster's spares ([`SpareTimers`]), taken when the head is first waited
    /// for (set to `limit` after `sent`) and handed back when the wait ends.
    struct HeadDeadline<'a, F> {
        #[pin]
        response: F,
        spare: &'a SpareTimers,
        timer: Option<Pin<Box<Sleep>>>,
        sent: Instant,
        limit: Duration,
        upload: Option<Arc<Upload>>,
        frames: u64,
    }

    impl<F> PinnedDrop for HeadDeadline<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(timer) = this.timer.take() {
                this.spare.give_back(timer);
            }
        }
    }
}

/// The wait for `response`'s head, sent at `sent`, bounded as `cluster`'s `timeouts.response_headers`
/// says.
fn head_deadline<'a, F>(
    cluster: &'a Cluster,
    response: F,
    upload: Option<Arc<Upload>>,
    sent: Instant,
) -> HeadDeadline<'a, F> {
    let limit = cluster.response_timeout();
    HeadDeadline::new(response, &cluster.spare_timers, sent, limit, upload)
}

impl<'a, F> HeadDeadline<'a, F> {
    fn new(
        response: F,
        spare: &'a SpareTimers,
        sent: Instant,
        limit: Duration,
        upload: Option<Arc<Upload>>,
    ) -> Self {
        Self {
            response,
            spare,
            timer: None,
            sent,
            limit,
            upload,
            frames: 0,
        }
    }
}

impl<F: Future> Future for HeadDeadline<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.response.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        let limit = *this.limit;
        let (spare, sent) = (*this.spare, *this.sent);
        let timer = (this.timer).get_or_insert_with(|| spare.take(sent + limit));
        loop {
            ready!(timer.as_mut().poll(cx));
            let moving = this.upload.as_ref().is_some_and(|upload| {
                let frames = upload.frames();
                let moved = frames != *this.frames;
                *this.frames = frames;
                moved || upload.waiting_for_client()
            });
            if !moving {
                return Poll::Ready(Err(Elapsed(limit)));
            }
            timer.as_mut().reset(Instant::now() + limit);
        }
    }
}

/// No response head within `timeouts.response_headers` of the request being sent.
#[derive(Debug)]
struct Elapsed(Duration);

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no response head within {:?}", self.0)
    }
}

impl std::error::Error for Elapsed {}

/// Whether the request met a connection closing without being processed, and can go again: the
/// HTTP/1.1 keep-alive close race, only when RFC 9110 lets a client resend unasked (`resendable`:
/// idempotent, body replayable); or an HTTP/2 stream the backend refused (GOAWAY, REFUSED_STREAM: RFC
/// 9113 §8.7 says unprocessed, so any method) whose body is still whole (replayable, or streamed and
/// not read yet, as a gRPC call's, which has no length). A GOAWAY is a restart, not a failure.
fn stale(error: &UpstreamError, h2: bool, resendable: bool, source: &BodySource) -> bool {
    if h2 {
        error.refused_by_h2() && source.can_attempt()
    } else {
        resendable && error.closed_when_reused()
    }
}

/// Whether the attempt failed on duet's side: a response head over duet's limits (502), or duet out of
/// file descriptors or memory for a new connection (503).
fn local_fault(error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            if hyper.is_parse_too_large() {
                return Some(ErrorKind::BadGateway);
            }
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            // EMFILE, ENFILE, ENOBUFS, ENOMEM: this process or host ran out, not the backend.
            if matches!(
                io.raw_os_error(),
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
            ) {
                return Some(ErrorKind::LocalResource);
            }
        }
        next = error.source();
    }
    None
}

/// The request for one attempt: the client's method and origin-form target over HTTP/1.1, with `Host`
/// (an HTTP/1.0 client may have sent none: then the backend's address), and `headers`.
fn upstream_request(
    parts: &Parts,
    authority: &Authority,
    body: UpstreamBody,
    headers: HeaderMap,
) -> Request<UpstreamBody> {
    let mut request = Request::new(body);
    *request.uri_mut() = parts
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |target| Uri::from(target.clone()));
    *request.method_mut() = parts.method.clone();
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    if !crate::headers::has(request.headers(), &header::HOST) {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose source is the io error, as hyper's is.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn running_out_of_descriptors_or_memory_is_duets_fault_not_the_backends() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            let error = std::io::Error::from_raw_os_error(errno);
            assert_eq!(
                local_fault(&error),
                Some(ErrorKind::LocalResource),
                "{error}"
            );
        }
        // Found under a wrapper too, as hyper hands it on (its error's source).
        let wrapped = Wrapped(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(local_fault(&wrapped), Some(ErrorKind::LocalResource));
        for errno in [libc::ECONNREFUSED, libc::ECONNRESET, libc::ETIMEDOUT] {
            let error = std::io::Error::from_raw_os_error(errno);
            assert_eq!(local_fault(&error), None, "{error}: the backend's");
        }
    }

    fn parts(target: &str, host: Option<&str>) -> Parts {
        let mut request = Request::get(target).body(()).expect("request");
        if let Some(host) = host {
            let host = HeaderValue::from_str(host).expect("host");
            request.headers_mut().insert(header::HOST, host);
        }
        request
            .headers_mut()
            .insert("x-kept", HeaderValue::from_static("1"));
        request.into_parts().0
    }

    #[test]
    fn an_attempt_goes_out_in_origin_form_over_http_1_1_with_a_host() {
        let authority = Authority::from_static("10.0.0.1:8080");
        let mut absolute = parts("http://example.com/a/b?c=d", Some("example.com"));
        absolute.version = Version::HTTP_10;
        let headers = absolute.headers.clone();
        let request = upstream_request(&absolute, &authority, UpstreamBody::Empty, headers);
        assert_eq!(request.uri(), "/a/b?c=d");
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()[header::HOST], "example.com");
        assert_eq!(request.headers()["x-kept"], "1");

        // An HTTP/1.0 request without Host gets the backend's address.
        let mut bare = parts("/x", None);
        let moved = std::mem::take(&mut bare.headers);
        let request = upstream_request(&bare, &authority, UpstreamBody::Empty, moved);
        assert_eq!(request.headers()[header::HOST], "10.0.0.1:8080");
        assert_eq!(request.headers()["x-kept"], "1");
    }
}
