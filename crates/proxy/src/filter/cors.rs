//! `cors:`, which other origins' pages may call a route from a browser (the Fetch standard's CORS
//! protocol). duet answers a preflight (`OPTIONS` with `Origin` and
//! `Access-Control-Request-Method`) from an allowed origin itself, `204` with the route's policy,
//! asking no backend; it adds `Access-Control-Allow-Origin` and the rest to the response of any other
//! request from an allowed origin, and `Vary: Origin` to every backend response of the route, since
//! the answer depends on it. A disallowed origin gets no CORS fields (its browser then hides the
//! answer from the page) and is otherwise served as usual, its preflight included: the backend
//! answers it.
//!
//! Only the request names the origin, and the fields go on the response: the request phase answers
//! the preflight, and the response-fields phase (taken at arrival) carries the rest.

use crate::{
    attempt::body::ProxyBody,
    filter::phase::{Arrival, Build, Decision, Phase, Phases, ResponseHead},
    telemetry::access_log::AccessLog,
};
use bytes::Bytes;
use duet_config::{filter::cors::AllowedOrigin, Route};
use http::{
    header::{self, HeaderName},
    HeaderMap, HeaderValue, Method, Request, Response, StatusCode,
};
use hyper::body::Incoming;

/// A route's CORS policy, its fields written once per config.
#[derive(Debug)]
pub(crate) struct Cors {
    origins: Vec<AllowedOrigin>,
    /// `*` is allowed and credentials are not: the answer is `*`, whatever the origin.
    any: bool,
    credentials: bool,
    methods: HeaderValue,
    headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    max_age: Option<HeaderValue>,
}

/// A list's field value, `None` for an empty list.
fn joined(list: &[String]) -> Option<HeaderValue> {
    (!list.is_empty())
        .then(|| HeaderValue::from_str(&list.join(", ")).ok())
        .flatten()
}

impl Phases for Cors {
    const PHASES: Phase = Phase::REQUEST
        .and(Phase::RESPONSE_FIELDS)
        .and(Phase::RESPONSE_HEAD);

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let cors = route.filters.cors.as_ref()?;
        Some(Self {
            any: !cors.allow_credentials && cors.allow_origins.contains(&AllowedOrigin::Any),
            origins: cors.allow_origins.clone(),
            credentials: cors.allow_credentials,
            methods: joined(&cors.allow_methods)?,
            headers: joined(&cors.allow_headers),
            expose: joined(&cors.expose_headers),
            max_age: cors.max_age.map(|age| HeaderValue::from(age.as_secs())),
        })
    }

    fn on_request(&self, arrival: &Arrival<'_>, log: &mut Option<Box<AccessLog>>) -> Decision {
        let request = arrival.request;
        if request.method() != Method::OPTIONS
            || !request
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return Decision::Continue;
        }
        match self.allowed(request) {
            Some(origin) => Decision::Answer(self.preflight(origin, log.take())),
            None => Decision::Continue,
        }
    }

    fn response_fields(&self, request: &Request<Incoming>) -> Option<HeaderMap> {
        let origin = self.allowed(request)?;
        let mut fields = self.common(origin);
        if let Some(expose) = &self.expose {
            fields.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
        }
        Some(fields)
    }

    fn on_response_head(&self, head: &mut ResponseHead<'_>) {
        add_vary_origin(head.headers);
    }
}

impl Cors {
    /// The value of `Access-Control-Allow-Origin` for the request's `Origin`, if it is allowed.
    fn allowed<B>(&self, request: &Request<B>) -> Option<HeaderValue> {
        let origin = request.headers().get(header::ORIGIN)?;
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let sent = origin.as_bytes();
        // `null` (a sandboxed page, a file) is an origin no list names on purpose.
        let listed = sent != b"null" && self.origins.iter().any(|o| o.covers(sent));
        listed.then(|| origin.clone())
    }

    /// The fields every answer to an allowed origin has.
    fn common(&self, origin: HeaderValue) -> HeaderMap {
        let mut fields = HeaderMap::with_capacity(4);
        fields.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        if self.credentials {
            fields.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        fields.insert(header::VARY, HeaderValue::from_static("Origin"));
        fields
    }

    /// duet's `204` to a preflight from an allowed origin.
    fn preflight(
        &self,
        origin: HeaderValue,
        mut log: Option<Box<AccessLog>>,
    ) -> Response<ProxyBody> {
        if let Some(log) = log.as_mut() {
            log.status = StatusCode::NO_CONTENT;
        }
        let mut response = Response::new(ProxyBody::error(Bytes::new(), log, "cors_preflight"));
        *response.status_mut() = StatusCode::NO_CONTENT;
        let mut fields = self.common(origin);
        fields.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        let optional: [(HeaderName, &Option<HeaderValue>); 2] = [
            (header::ACCESS_CONTROL_ALLOW_HEADERS, &self.headers),
            (header::ACCESS_CONTROL_MAX_AGE, &self.max_age),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                fields.insert(name, value.clone());
            }
        }
        *response.headers_mut() = fields;
        response
    }
}

/// `Vary: Origin` on a response, unless its `Vary` already names it (or `*`).
fn add_vary_origin(headers: &mut HeaderMap) {
    let origin = HeaderValue::from_static("Origin");
    if !crate::headers::varies_by(headers, &origin) {
        headers.append(header::VARY, origin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[AllowedOrigin], credentials: bool) -> Cors {
        Cors {
            any: !credentials && origins.contains(&AllowedOrigin::Any),
            origins: origins.to_vec(),
            credentials,
            methods: HeaderValue::from_static("GET, PUT"),
            headers: Some(HeaderValue::from_static("x-token")),
            expose: None,
            max_age: Some(HeaderValue::from_static("600")),
        }
    }

    fn from(origin: &str) -> Request<()> {
        Request::builder()
            .header(header::ORIGIN, origin)
            .body(())
            .expect("request")
    }

    #[test]
    fn a_listed_origin_is_echoed_a_wildcard_list_answers_star_and_null_is_never_allowed() {
        let exact = AllowedOrigin::Exact("https://a.example".into());
        let listed = cors(std::slice::from_ref(&exact), true);
        assert_eq!(
            listed.allowed(&from("https://a.example")),
            Some(HeaderValue::from_static("https://a.example"))
        );
        assert_eq!(listed.allowed(&from("https://b.example")), None);
        assert_eq!(listed.allowed(&from("null")), None);
        assert_eq!(listed.allowed(&Request::new(())), None);
        let any = cors(&[AllowedOrigin::Any], false);
        assert_eq!(
            any.allowed(&from("https://b.example")),
            Some(HeaderValue::from_static("*"))
        );
    }

    #[test]
    fn the_preflight_answer_holds_the_policy_and_vary_is_added_once() {
        let exact = AllowedOrigin::Exact("https://a.example".into());
        let response =
            cors(&[exact], true).preflight(HeaderValue::from_static("https://a.example"), None);
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        let fields: Vec<(String, &str)> = (response.headers().iter())
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("")))
            .collect();
        let expected = [
            ("access-control-allow-origin", "https://a.example"),
            ("access-control-allow-credentials", "true"),
            ("vary", "Origin"),
            ("access-control-allow-methods", "GET, PUT"),
            ("access-control-allow-headers", "x-token"),
            ("access-control-max-age", "600"),
        ];
        let expected: Vec<(String, &str)> = expected
            .iter()
            .map(|(n, v)| ((*n).to_owned(), *v))
            .collect();
        assert_eq!(fields, expected);

        let mut headers = HeaderMap::new();
        headers.insert(
            header::VARY,
            HeaderValue::from_static("accept-encoding, origin"),
        );
        add_vary_origin(&mut headers);
        assert_eq!(headers.get_all(header::VARY).iter().count(), 1);
        let mut headers = HeaderMap::new();
        add_vary_origin(&mut headers);
        assert_eq!(headers[header::VARY], "Origin");
    }
}
