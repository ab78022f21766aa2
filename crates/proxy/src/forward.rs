//! Stage 4, forward: one attempt to one backend picked by the cluster's balancer, and the one place
//! where what went wrong becomes an [`ErrorKind`].

use crate::{
    access_log::AccessLog,
    cluster::Cluster,
    completion::{Completion, Fault},
    error::{ErrorKind, ProxyError},
    prepare::Prepared,
    request_body::ClientFailure,
};
use http::{
    uri::{self, PathAndQuery, Scheme},
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

    let parts = &mut prepared.parts;
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
    let target = Uri::from_parts(target);
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = if last {
        std::mem::take(&mut parts.headers)
    } else {
        parts.headers.clone()
    };
    match target {
        Ok(target) => *request.uri_mut() = target,
        Err(error) => {
            let log = completion.fail(Fault::Backend);
            let error = ProxyError::upstream(ErrorKind::BadGateway, backend, error);
            return Err(Failed { error, log });
        }
    }

    let sent = tokio::time::timeout(
        cluster.response_timeout(),
        cluster.client().request(request),
    );
    let error = match sent.await {
        Ok(Ok(response)) => return Ok((response, completion)),
        Ok(Err(error)) if error.is_connect() => {
            ProxyError::upstream(ErrorKind::Connect, backend, error)
        }
        Ok(Err(error)) => ProxyError::upstream(ErrorKind::BadGateway, backend, error),
        Err(elapsed) => ProxyError::upstream(ErrorKind::Timeout, backend, elapsed),
    };
    // A body that broke or stalled on the client's side is the client's failure, not the backend's.
    match prepared.source.client_failure() {
        Some(ClientFailure::Broken) => {
            let log = completion.fail(Fault::Client);
            Err(failed(ErrorKind::BadRequestBody, log))
        }
        Some(ClientFailure::Stalled) => {
            let log = completion.fail(Fault::Client);
            Err(failed(ErrorKind::BodyTimeout, log))
        }
        None => {
            let log = completion.fail(Fault::Backend);
            Err(Failed { error, log })
        }
    }
}
