//! A request auth sends on its own behalf (forward auth's question, a JWKS fetch) through a
//! cluster's pool and balancer, like any backend's: health checks, outlier ejection and metrics
//! apply to the service asked.

use crate::{
    attempt::body::ProxyBody, backend::cluster::Cluster, exchange::Prepared, forward::forward,
};
use bytes::{Bytes, BytesMut};
use http::response::Parts;
use http_body_util::BodyExt;
use std::rc::Rc;

/// A subrequest's answer: its head, and the first `max` bytes of its body.
pub(super) struct Answer {
    pub(super) head: Parts,
    pub(super) body: Bytes,
    /// Whether the body was longer than `max` (what is kept is cut).
    pub(super) cut: bool,
}

/// Sends `prepared` through `cluster` and reads the answer to its end, keeping at most `max` bytes:
/// reading it all settles the attempt (load, latency, the pooled connection). The error says why
/// no whole answer came.
pub(super) async fn ask(
    cluster: &Rc<Cluster>,
    prepared: &mut Prepared,
    max: usize,
) -> Result<Answer, String> {
    let (response, mut completion) = forward(cluster, prepared, &[], true)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response.into_parts();
    completion.drop_response();
    completion.on_head(&head);
    let mut body = ProxyBody::upstream(body, completion);
    let (mut kept, mut cut) = (BytesMut::new(), false);
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.map_err(|e| e.to_string())?.data_ref() {
            let room = max.saturating_sub(kept.len());
            cut |= data.len() > room;
            kept.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(Answer {
        head,
        body: kept.freeze(),
        cut,
    })
}
