//! Stage 4, forward: one attempt to one backend picked by the cluster's balancer, and the one place
//! where what went wrong becomes an [`ErrorKind`].

use crate::{
    access_log::AccessLog,
    cluster::Cluster,
    completion::{Completion, Fault},
    error::{ErrorKind, ProxyError},
    prepare::Prepared,
    request_body::{ClientFailure, UpstreamBody},
};
use http::{
    request::Parts,
    uri::{self, Authority, PathAndQuery, Scheme},
    Request, Response, Uri, Version,
};
use hyper::body::Incoming;
use std::{net::SocketAddr, rc::Rc};

/// An attempt that got no usable response, with the access-log record handed back.
pub(crate) struct Failed {
    pub(crate) error: ProxyError,
    pub(crate) log: Option<AccessLog>,
}

/// Sends `prepared` to a backend of `cluster` not in `tried`, counted as that backend's load until the
/// returned [`Completion`] settles. `last` says this is the last attempt, so the headers can be moved
/// instead of copied.
pub(crate) async fn forward(
    cluster: &Rc<Cluster>,
    prepared: &mut Prepared,
    tried: &[SocketAddr],
    last: bool,
    log: Option<AccessLog>,
) -> Result<(Response<Incoming>, Completion), Failed> {
    let failed = |kind: ErrorKind, log| Failed {
        error: ProxyError::new(kind),
        log,
    };
    let Some(body) = prepared.source.attempt() else {
        return Err(failed(ErrorKind::BadGateway, log));
    };
    let Ok((backend, authority, guard)) = cluster.pick(tried) else {
        return Err(failed(ErrorKind::NoEligibleBackend, log));
    };
    let completion = Completion::new(guard, cluster.clone(), backend, log);
    let request = match upstream_request(&mut prepared.parts, authority, body, last) {
        Ok(request) => request,
        // Cannot happen for an address and a parsed path; if it did, it would be duet's own fault.
        Err(error) => {
            let log = completion.fail(Fault::Local);
            let error = ProxyError::upstream(ErrorKind::BadGateway, backend, error);
            return Err(Failed { error, log });
        }
    };

    let sent = tokio::time::timeout(
        cluster.response_timeout(),
        cluster.client().request(request),
    );
    let error = match sent.await {
        Ok(Ok(response)) => return Ok((response, completion)),
        Ok(Err(error)) if error.is_connect() => {
            ProxyError::upstream(ErrorKind::Connect, backend, error)
        }
        // A response head over duet's own limits is duet's limit, not the backend's failure.
        Ok(Err(error)) if head_too_large(&error) => {
            let log = completion.fail(Fault::Local);
            let error = ProxyError::upstream(ErrorKind::BadGateway, backend, error);
            return Err(Failed { error, log });
        }
        Ok(Err(error)) => ProxyError::upstream(ErrorKind::BadGateway, backend, error),
        Err(elapsed) => ProxyError::upstream(ErrorKind::Timeout, backend, elapsed),
    };
    // A body that broke or stalled on the client's side is the client's failure, not the backend's.
    let (error, fault) = match prepared.source.client_failure() {
        Some(ClientFailure::Broken) => (ProxyError::new(ErrorKind::BadRequestBody), Fault::Client),
        Some(ClientFailure::Stalled) => (ProxyError::new(ErrorKind::BodyTimeout), Fault::Client),
        None => (error, Fault::Backend),
    };
    let log = completion.fail(fault);
    Err(Failed { error, log })
}

/// Whether the client failed because the response head exceeded duet's limits.
fn head_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            return hyper.is_parse_too_large();
        }
        next = error.source();
    }
    false
}

/// The request for one attempt: the client's method and path, aimed at `authority` over HTTP/1.1.
/// The last attempt takes the headers; earlier ones copy them.
fn upstream_request(
    parts: &mut Parts,
    authority: Authority,
    body: UpstreamBody,
    last: bool,
) -> Result<Request<UpstreamBody>, http::uri::InvalidUriParts> {
    let mut target = uri::Parts::default();
    target.scheme = Some(Scheme::HTTP);
    target.authority = Some(authority);
    target.path_and_query = Some(
        parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    let mut request = Request::new(body);
    *request.uri_mut() = Uri::from_parts(target)?;
    *request.method_mut() = parts.method.clone();
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = if last {
        std::mem::take(&mut parts.headers)
    } else {
        parts.headers.clone()
    };
    Ok(request)
}
