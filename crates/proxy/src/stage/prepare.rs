//! Stage 2, prepare: the header rules of a forwarding proxy, and where the request body comes from.

use crate::{
    backend::affinity::key_hash,
    backend::client_body::{BodyError, BufferError, ClientBody},
    backend::cluster::Cluster,
    backend::request_body::{BodySource, Reclaimable},
    error::{ErrorKind, ProxyError},
    exchange::{BufferHold, ConnectionState, Prepared, Upgrade, WorkerBuffered, WorkerBuffers},
    filter::RouteFilters,
    headers::{self, TrailerScrub},
    peer::{original_client_address, Client},
};
use duet_config::Route;
use http::{header, HeaderValue, Request};
use http_body::Body;
use hyper::body::Incoming;
use std::sync::atomic::Ordering::Relaxed;

/// Rewrites the headers (hop-by-hop fields out; Host as routed; forwarding fields by trust; then the
/// route's `filters` in their upstream-request phase) and decides how the body is sent: read in full first when the route buffers
/// requests or when it is small and retries may need it again, streamed otherwise. A body in a transfer
/// coding other than chunked gets 501, one that is malformed 400, one larger than the route's
/// `buffer_request` 413, one that stalls longer than `limits.body_read_timeout` or falls behind
/// `limits.min_upload_rate` 408.
///
/// Nothing here waits but reading a body in full: that is left to [`Unread::read`], so a request with
/// no body to read (most) is prepared without a future of its own, whose moves would cost more than
/// the work.
pub(crate) fn prepare(
    mut request: Request<Incoming>,
    cluster: &Cluster,
    (route, filters, trailers, body_limit): (&Route, &RouteFilters, TrailerScrub, Option<u64>),
    host: Option<HeaderValue>,
    client: Client,
) -> Result<Preparing, ProxyError> {
    let seldom = headers::Seldom::of(request.headers());
    // hyper decodes `chunked` only; a coding under it would reach the backend unlabelled.
    if seldom.transfer_encoding && headers::unknown_transfer_coding(request.headers()) {
        return Err(ProxyError::new(ErrorKind::UnknownTransferCoding));
    }
    let protocol = seldom
        .upgrade
        .then(|| headers::upgrade_protocol(request.headers(), request.version()))
        .flatten();
    let upgrade = protocol.clone().map(|protocol| Upgrade { protocol });
    let absolute_form = request.uri().authority().is_some();
    let http2 = request.version() == http::Version::HTTP_2;
    let request_headers = request.headers_mut();
    headers::remove_request_hop_by_hop(request_headers, protocol);
    if http2 {
        headers::join_cookies(request_headers);
    }
    if let (true, Some(host)) = (absolute_form, &host) {
        // The host routed on is the host the backend sees (RFC 9112 §3.2.2); otherwise Host already is.
        request_headers.insert(header::HOST, host.clone());
    }
    // Read before the forwarding fields change: the client a PROXY header names.
    let named =
        (cluster.sends_proxy_protocol()).then(|| original_client_address(request_headers, client));
    headers::add_forwarding(
        request_headers,
        client.address.ip(),
        host,
        client.tls,
        client.trusted,
    );
    // The client's `Expect: 100-continue` was answered by our server when we began reading its body.
    if seldom.expect {
        request_headers.remove(header::EXPECT);
    }

    let (mut parts, body) = request.into_parts();
    filters
        .on_upstream_request(&mut parts)
        .map_err(ProxyError::new)?;
    let attempts = route.retry_attempts.unwrap_or(cluster.attempts);
    let replay = attempts > 1 || filters.replays_body();
    let limits = BodyLimits {
        buffer: route.buffer_request,
        max: body_limit,
        replay,
    };
    let plan = body_plan(body, cluster, limits, trailers).map_err(ProxyError::new)?;
    let affinity = cluster
        .hash_key()
        .and_then(|key| key_hash(key, &parts, client.address.ip()));
    let session = cluster.session(&parts.headers);
    let source = match plan {
        BodyPlan::Ready(source) => source,
        BodyPlan::ReadFirst(body, limit) => {
            let mut prepared = Prepared::new(parts, BodySource::Empty, upgrade);
            (prepared.affinity, prepared.client, prepared.session) = (affinity, named, session);
            let trailer = seldom.trailer;
            return Ok(Preparing::Unread(Unread {
                prepared,
                body,
                limit,
                trailer,
            }));
        }
    };
    if seldom.trailer && matches!(source, BodySource::Empty) {
        drop_trailer(&mut parts.headers);
    }
    let mut prepared = Prepared::new(parts, source, upgrade);
    (prepared.affinity, prepared.client, prepared.session) = (affinity, named, session);
    Ok(Preparing::Ready(prepared))
}

/// A request prepared, or prepared but for a body to read in full first.
pub(crate) enum Preparing {
    Ready(Prepared),
    Unread(Unread),
}

/// A prepared request whose body is still to be read in full (its source is empty until then).
pub(crate) struct Unread {
    prepared: Prepared,
    body: Incoming,
    /// How much of the body may be read.
    limit: usize,
    /// The request announced trailers.
    trailer: bool,
}

impl Unread {
    /// The request with its body read, as `limits` allow, within `connection`'s buffering budget (what
    /// it takes of it is put in `hold`, to be held as long as the request): 413 past `limit`, 400 for
    /// a malformed body, 408 for one that stalls or falls behind `limits.min_upload_rate`, 503 if its
    /// share of the budget does not come within `limits.body_read_timeout`, or if `worker` holds
    /// `limits.max_buffered_bytes` already. The hold goes apart from the request: returned in a pair
    /// with it, the request was copied once more.
    pub(crate) async fn read<'c>(
        self,
        cluster: &Cluster,
        (connection, worker): (&'c ConnectionState, WorkerBuffers<'_>),
        hold: &mut Option<BufferHold<'c>>,
    ) -> Result<Prepared, ProxyError> {
        let Unread {
            mut prepared,
            body,
            limit,
            trailer,
        } = self;
        // What the body announces, or all it may hold.
        let needs = body.size_hint().exact().map_or(limit, |n| n as usize);
        let wait = cluster.body_pace.idle_timeout;
        let Some(turn) = connection.reserve_buffer(needs, limit, wait).await else {
            return Err(ProxyError::new(ErrorKind::LocalResource));
        };
        // Reserved once the connection's share has come (a stream waiting its turn holds none): what
        // the body announces at once, so one too large for what is left is refused before a byte is
        // read; then as it grows, so one of unknown length holds only what it has.
        let announced = body.size_hint().exact().map_or(0, |n| n as usize);
        let Some(mut held) = worker.reserve(announced) else {
            return Err(ProxyError::new(ErrorKind::LocalResource));
        };
        let source = buffer(body, cluster, limit, &mut held)
            .await
            .map_err(ProxyError::new)?;
        prepared.source = source;
        if trailer {
            drop_trailer(&mut prepared.parts.headers);
        }
        *hold = Some(BufferHold::new(turn, held));
        Ok(prepared)
    }
}

/// A Trailer field announces trailers of a body; with no body it announces nothing, and a buffered
/// one goes on with a Content-Length, without them. (No header edit can add one: the config refuses
/// edits of Trailer.)
fn drop_trailer(headers: &mut http::HeaderMap) {
    headers.remove(header::TRAILER);
}

/// Where each attempt's body comes from, or that it must be read in full first (with how much may
/// be read).
enum BodyPlan {
    Ready(BodySource),
    ReadFirst(Incoming, usize),
}

/// What decides how a body is read: the route's `buffer_request`, its `max_request_body` (or the
/// `limits` default), and whether retries or a filter may send the body again.
struct BodyLimits {
    buffer: Option<usize>,
    max: Option<u64>,
    replay: bool,
}

/// Where each attempt's body comes from: read in full first when the route buffers requests (up to its
/// `buffer_request`: no backend is picked, none waits, while a slow client sends), or when it is small
/// and retries or a filter (`replay`: a hedge) may need it again; streamed otherwise. A body declared
/// larger than `max_request_body` is refused before a byte of it is read (a client waiting on
/// `Expect: 100-continue` sends none); one read in full is read up to it at most, and one streamed is
/// cut where it passes it.
fn body_plan(
    body: Incoming,
    cluster: &Cluster,
    limits: BodyLimits,
    trailers: TrailerScrub,
) -> Result<BodyPlan, ErrorKind> {
    if body.is_end_stream() {
        return Ok(BodyPlan::Ready(BodySource::Empty));
    }
    let exact = body.size_hint().exact();
    let max = (limits.max).map_or(usize::MAX, |max| usize::try_from(max).unwrap_or(usize::MAX));
    if exact.is_some_and(|n| n > max as u64) {
        return Err(ErrorKind::BodyTooLarge);
    }
    let limit = match limits.buffer {
        // Refused before a byte is read: a client waiting on `Expect: 100-continue` sends none.
        Some(limit) if exact.is_some_and(|n| n > limit as u64) => {
            return Err(ErrorKind::BodyTooLarge)
        }
        Some(limit) => limit.min(max),
        None if limits.replay && exact.is_some_and(|n| n <= cluster.replay_body_limit as u64) => {
            cluster.replay_body_limit
        }
        None => {
            let counters = Some(cluster.counters.clone());
            let cut = (trailers, limits.max);
            let body = Reclaimable::new(body, cluster.body_pace, counters, cut);
            return Ok(BodyPlan::Ready(BodySource::Streaming(body)));
        }
    };
    Ok(BodyPlan::ReadFirst(body, limit))
}

/// `body` read in full, up to `limit` bytes, each byte held within `held`.
async fn buffer(
    body: Incoming,
    cluster: &Cluster,
    limit: usize,
    held: &mut WorkerBuffered,
) -> Result<BodySource, ErrorKind> {
    let bytes = ClientBody::new(body, cluster.body_pace)
        .read_all(limit, |length| held.grow_to(length))
        .await
        .map_err(|error| match error {
            BufferError::TooLarge => ErrorKind::BodyTooLarge,
            BufferError::NotAdmitted => ErrorKind::LocalResource,
            BufferError::Client(BodyError::Broken(_)) => ErrorKind::BadRequestBody,
            BufferError::Client(BodyError::Stalled) => ErrorKind::BodyTimeout,
            BufferError::Client(BodyError::TooSlow) => ErrorKind::UploadTooSlow,
        })?;
    let length = bytes.len() as u64;
    cluster.counters.bytes_received.fetch_add(length, Relaxed);
    Ok(BodySource::Buffered(bytes))
}
