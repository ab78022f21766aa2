//! The per-worker client toward backends, and the per-backend tower service the balancer calls.

use crate::error::{ErrorKind, ProxyError};
use crate::request_body::UpstreamBody;
use duet_config::Timeouts;
use http::{uri::Authority, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client, ResponseFuture},
    rt::{TokioExecutor, TokioTimer},
};
use pin_project_lite::pin_project;
use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};
use tokio::time::Timeout;

/// A pooled HTTP/1.1 client. Each worker builds its own (one per cluster, for the cluster's timeouts):
/// no pool, lock or connection is shared between workers.
pub type UpstreamClient = Client<HttpConnector, UpstreamBody>;

/// Builds a worker's client for a cluster's timeouts.
pub fn upstream_client(timeouts: &Timeouts) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeouts.connect));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(timeouts.idle)
        // Without a pool timer, idle connections are only evicted when a request checks one out.
        .pool_timer(TokioTimer::new())
        // Head and small body in one write: measurably cheaper per request (../shared/design.md).
        .http1_writev(false)
        .build(connector)
}

/// The backend a response came from, in its extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PickedBackend(pub SocketAddr);

/// One backend as a tower service: points the request at the backend and bounds the wait for its
/// response head.
#[derive(Debug, Clone)]
pub struct BackendService {
    client: UpstreamClient,
    address: SocketAddr,
    authority: Authority,
    response_timeout: Duration,
}

impl BackendService {
    /// A service sending to `address` through `client`.
    pub fn new(client: UpstreamClient, address: SocketAddr, response_timeout: Duration) -> Self {
        let authority = Authority::try_from(address.to_string().as_str())
            .unwrap_or_else(|_| Authority::from_static("invalid"));
        Self {
            client,
            address,
            authority,
            response_timeout,
        }
    }
}

impl tower::Service<Request<UpstreamBody>> for BackendService {
    type Response = Response<Incoming>;
    type Error = ProxyError;
    type Future = BackendFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The pooled client queues nothing: a connection is checked out or opened per request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<UpstreamBody>) -> Self::Future {
        let mut parts = std::mem::take(request.uri_mut()).into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        match Uri::from_parts(parts) {
            Ok(uri) => *request.uri_mut() = uri,
            Err(error) => {
                return BackendFuture {
                    state: State::Invalid {
                        error: Some(ProxyError::upstream(
                            ErrorKind::BadGateway,
                            self.address,
                            error,
                        )),
                    },
                }
            }
        }
        *request.version_mut() = Version::HTTP_11;
        BackendFuture {
            state: State::Sent {
                response: tokio::time::timeout(self.response_timeout, self.client.request(request)),
                address: self.address,
            },
        }
    }
}

pin_project! {
    /// The response of one backend, or why there is none.
    pub struct BackendFuture {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Sent { #[pin] response: Timeout<ResponseFuture>, address: SocketAddr },
        Invalid { error: Option<ProxyError> },
    }
}

impl Future for BackendFuture {
    type Output = Result<Response<Incoming>, ProxyError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Sent { response, address } => {
                let address = *address;
                Poll::Ready(match ready!(response.poll(cx)) {
                    Ok(Ok(mut response)) => {
                        response.extensions_mut().insert(PickedBackend(address));
                        Ok(response)
                    }
                    Ok(Err(error)) if error.is_connect() => {
                        Err(ProxyError::upstream(ErrorKind::Connect, address, error))
                    }
                    Ok(Err(error)) => {
                        Err(ProxyError::upstream(ErrorKind::BadGateway, address, error))
                    }
                    Err(elapsed) => Err(ProxyError::upstream(ErrorKind::Timeout, address, elapsed)),
                })
            }
            StateProj::Invalid { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| ProxyError::new(ErrorKind::BadGateway)))),
        }
    }
}
