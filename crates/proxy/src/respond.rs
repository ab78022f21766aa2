//! Stage 5, respond: the response toward the client. Hop-by-hop headers stop here, a `101 Switching
//! Protocols` becomes a tunnel, and the backend's body streams through with its attempt's completion.

use crate::{
    access_log::AccessLog,
    body::ProxyBody,
    cluster::Cluster,
    completion::Completion,
    error::{ErrorKind, ProxyError},
    forward::Failed,
    headers,
};
use http::{Response, StatusCode};
use hyper::{body::Incoming, upgrade::OnUpgrade};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

/// The client's response for what the attempts came to.
pub(crate) fn respond(
    cluster: &Cluster,
    outcome: Result<(Response<Incoming>, Completion), Failed>,
    client_upgrade: Option<OnUpgrade>,
    client: SocketAddr,
) -> Response<ProxyBody> {
    let response = match outcome {
        Ok((response, completion)) => relay(response, completion, client_upgrade, client),
        Err(Failed { error, log }) => {
            tracing::warn!(cluster = %cluster.name, %client, "{error}");
            local_error(&error, log)
        }
    };
    cluster.counters.response(response.status().as_u16());
    response
}

/// Passes a backend's response on.
fn relay(
    mut response: Response<Incoming>,
    mut completion: Completion,
    client_upgrade: Option<OnUpgrade>,
    client: SocketAddr,
) -> Response<ProxyBody> {
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    if switching {
        let Some(client_side) = client_upgrade else {
            // An upgrade nobody asked for: the client could not use it.
            let backend = completion.backend();
            let log = completion.reject();
            let error = ProxyError::upstream(ErrorKind::BadGateway, backend, "unrequested 101");
            return local_error(&error, log);
        };
        let backend_side = hyper::upgrade::on(&mut response);
        tokio::task::spawn_local(tunnel(client_side, backend_side, client));
    }
    headers::remove_hop_by_hop(response.headers_mut(), switching);
    let (parts, body) = response.into_parts();
    completion.on_head(&parts);
    Response::from_parts(parts, ProxyBody::upstream(body, completion))
}

/// A short text response for a request duet could not proxy.
pub(crate) fn local_error(error: &ProxyError, mut log: Option<AccessLog>) -> Response<ProxyBody> {
    if let Some(log) = log.as_mut() {
        log.status = error.status();
        if log.backend.is_none() {
            log.backend = error.backend();
        }
    }
    let (parts, body) = error.to_response().into_parts();
    Response::from_parts(parts, ProxyBody::local(body, log))
}

/// Relays an upgraded connection (e.g. a WebSocket) both ways until either side closes.
async fn tunnel(client: OnUpgrade, backend: OnUpgrade, peer: SocketAddr) {
    let (client, backend) = match tokio::try_join!(client, backend) {
        Ok(pair) => pair,
        Err(error) => {
            tracing::debug!(%peer, "upgrade failed: {error}");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut backend = TokioIo::new(backend);
    if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
        tracing::debug!(%peer, "tunnel closed: {error}");
    }
}
