//! `respond:`, a route's direct response: duet answers every request the route takes with a fixed
//! status and body, asking no backend (a health endpoint, `robots.txt`, a maintenance page). A `HEAD`
//! gets the same head without the body (RFC 9110 §9.3.2).

use crate::{
    attempt::body::ProxyBody,
    filter::phase::{Arrival, Build, Decision, Phase, Phases},
    telemetry::access_log::AccessLog,
};
use bytes::Bytes;
use duet_config::Route;
use http::{header, HeaderValue, Method, Response, StatusCode};

/// A route's answer, built once per config: the head's parts and the body, shared by every response.
#[derive(Debug)]
pub(crate) struct Respond {
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
}

impl Phases for Respond {
    const PHASES: Phase = Phase::REQUEST;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let respond = route.filters.respond.as_ref()?;
        Some(Self {
            status: StatusCode::from_u16(respond.status).ok()?,
            content_type: HeaderValue::from_str(&respond.content_type).ok()?,
            body: Bytes::from(respond.body.clone()),
        })
    }

    fn on_request(&self, arrival: &Arrival<'_>, log: &mut Option<Box<AccessLog>>) -> Decision {
        let head = arrival.request.method() == Method::HEAD;
        Decision::Answer(self.response(head, log.take()))
    }
}

impl Respond {
    /// The answer; `head`: to a `HEAD`, without the body but with its length.
    fn response(&self, head: bool, mut log: Option<Box<AccessLog>>) -> Response<ProxyBody> {
        if let Some(log) = log.as_mut() {
            log.status = self.status;
        }
        let body = if head {
            Bytes::new()
        } else {
            self.body.clone()
        };
        let mut response = Response::new(ProxyBody::error(body, log, "respond"));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        if !matches!(self.status.as_u16(), 204 | 304) {
            headers.insert(header::CONTENT_TYPE, self.content_type.clone());
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(self.body.len()));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn answer(respond: &Respond, head: bool) -> (Response<()>, Bytes) {
        let (parts, body) = respond.response(head, None).into_parts();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let bytes = runtime
            .block_on(body.collect())
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        (Response::from_parts(parts, ()), bytes)
    }

    #[test]
    fn every_request_gets_the_body_and_a_head_request_its_length_alone() {
        let respond = Respond {
            status: StatusCode::SERVICE_UNAVAILABLE,
            content_type: HeaderValue::from_static("text/html"),
            body: Bytes::from_static(b"<p>back soon</p>"),
        };
        let (got, body) = answer(&respond, false);
        assert_eq!(got.status(), 503);
        assert_eq!(got.headers()["content-type"], "text/html");
        assert_eq!(got.headers()["content-length"], "16");
        assert_eq!(&body[..], b"<p>back soon</p>");
        let (got, body) = answer(&respond, true);
        assert_eq!(got.headers()["content-length"], "16");
        assert!(body.is_empty());
    }
}
