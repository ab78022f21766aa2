//! `auth: { forward: ... }`: each request asked about first at an auth service, through the auth
//! cluster's own pool and balancer (P2C, health, outlier ejection, its metrics), as nginx's
//! `auth_request` and Traefik's `ForwardAuth` do.
//!
//! The subrequest has no body: its method is `GET` (or the request's), the request's method, host
//! and URI go in `X-Forwarded-Method`, `-Host` and `-Uri`, and the listed request fields are
//! copied. A 2xx lets the request through with the listed response fields set on it; any other
//! answer (401, 403, a redirect to a login page) goes back to the client as the auth service wrote
//! it (its body up to [`MAX_ANSWER_BODY`]). No answer within `timeout` follows `on_error`.

use super::{subrequest, ALLOWED, DENIED, ERROR};
use crate::{
    attempt::body::ProxyBody,
    backend::cluster::Cluster,
    backend::request_body::BodySource,
    error::{ErrorKind, ProxyError},
    exchange::Prepared,
    filter::phase::{Build, Decision},
    headers::remove_hop_by_hop,
    telemetry::access_log::AccessLog,
    telemetry::metrics::RouteCounters,
};
use bytes::Bytes;
use duet_config::filter::auth::{Forward, ForwardMethod, OnError};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use hyper::body::Incoming;
use std::{future::Future, rc::Rc, sync::Arc};
use tokio::time::{timeout_at, Instant};

/// The most of an auth service's refusal body passed on to the client.
const MAX_ANSWER_BODY: usize = 64 << 10;

const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

pub(crate) struct ForwardAuth {
    settings: Forward,
    cluster: Rc<Cluster>,
    uri: Uri,
    request_headers: Vec<HeaderName>,
    response_headers: Vec<HeaderName>,
}

/// What the auth service said.
enum Said {
    Yes(HeaderMap),
    No(Response<Bytes>),
}

impl ForwardAuth {
    pub(super) fn new(settings: &Forward, build: &Build<'_>) -> Option<Self> {
        let names = |list: &[String]| -> Vec<HeaderName> {
            (list.iter())
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect()
        };
        Some(Self {
            cluster: build.clusters.get(settings.cluster)?.clone(),
            uri: settings.path.parse().ok()?,
            request_headers: names(&settings.request_headers),
            response_headers: names(&settings.response_headers),
            settings: settings.clone(),
        })
    }

    /// The decision, when the auth service answers or time runs out.
    pub(super) fn admit<'a>(
        &'a self,
        request: &Request<Incoming>,
        log: &'a mut Option<Box<AccessLog>>,
        counts: &'a Arc<RouteCounters>,
    ) -> impl Future<Output = Result<HeaderMap, Decision>> + 'a {
        let subrequest = self.subrequest(request);
        async move {
            let deadline = Instant::now() + self.settings.timeout;
            let said = match subrequest {
                Some(sub) => timeout_at(deadline, self.ask(sub)).await.ok().flatten(),
                None => None,
            };
            match said {
                Some(Said::Yes(fields)) => {
                    counts.add(ALLOWED);
                    let user = self.settings.user_header.as_deref();
                    if let (Some(log), Some(name)) = (log.as_mut(), user) {
                        if log.wants_user() {
                            log.user = fields.get(name).cloned();
                        }
                    }
                    Ok(fields)
                }
                Some(Said::No(answer)) => {
                    counts.add(DENIED);
                    Err(Decision::Answer(answered(answer, log.take())))
                }
                None => {
                    counts.add(ERROR);
                    match self.settings.on_error {
                        OnError::Allow => Ok(HeaderMap::new()),
                        OnError::Deny => Err(Decision::Refuse(ProxyError::new(
                            ErrorKind::AuthUnavailable,
                        ))),
                    }
                }
            }
        }
    }

    /// The subrequest for `request`: no body, its method, host and URI in `X-Forwarded-*`.
    fn subrequest(&self, request: &Request<Incoming>) -> Option<Prepared> {
        let method = match self.settings.method {
            ForwardMethod::Get => Method::GET,
            ForwardMethod::Original => request.method().clone(),
        };
        let host = (request.headers().get(header::HOST).cloned())
            .or_else(|| HeaderValue::from_str(request.uri().authority()?.as_str()).ok());
        let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let mut sub = Request::builder()
            .method(method)
            .uri(self.uri.clone())
            .body(())
            .ok()?;
        let headers = sub.headers_mut();
        for name in &self.request_headers {
            for value in request.headers().get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let original = HeaderValue::from_str(request.method().as_str()).ok()?;
        headers.insert(X_FORWARDED_METHOD, original);
        headers.insert(X_FORWARDED_URI, HeaderValue::from_str(target).ok()?);
        if let Some(host) = host {
            headers.insert(X_FORWARDED_HOST, host.clone());
            headers.insert(header::HOST, host);
        }
        Some(Prepared::new(sub.into_parts().0, BodySource::Empty, None))
    }

    /// The auth service's answer; `None` when none came.
    async fn ask(&self, mut sub: Prepared) -> Option<Said> {
        let subrequest::Answer { head, body, .. } =
            subrequest::ask(&self.cluster, &mut sub, MAX_ANSWER_BODY)
                .await
                .map_err(|e| tracing::debug!(cluster = %self.cluster.name, "forward auth: {e}"))
                .ok()?;
        if head.status.is_success() {
            let mut fields = HeaderMap::new();
            for name in &self.response_headers {
                for value in head.headers.get_all(name) {
                    fields.append(name.clone(), value.clone());
                }
            }
            return Some(Said::Yes(fields));
        }
        let mut answer = Response::from_parts(head, body);
        remove_hop_by_hop(answer.headers_mut(), None);
        answer.headers_mut().remove(header::CONTENT_LENGTH);
        Some(Said::No(answer))
    }
}

/// The auth service's refusal, as the client's response.
fn answered(answer: Response<Bytes>, mut log: Option<Box<AccessLog>>) -> Response<ProxyBody> {
    let (head, body) = answer.into_parts();
    if let Some(log) = log.as_mut() {
        log.status = head.status;
    }
    Response::from_parts(head, ProxyBody::error(body, log, "auth_denied"))
}
