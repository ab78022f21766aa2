//! `request_headers:` and `response_headers:`: a route's header edits, names and values parsed once per
//! config.
//!
//! Request edits run in the upstream-request phase: after the hop-by-hop fields are gone and duet's own fields
//! (`X-Forwarded-For`/`-Proto`/`-Host`, `X-Request-Id`) are set, so a route has the last word on what
//! its backend reads (it may, say, remove `X-Forwarded-Host` for a backend that misreads it) and a
//! client can never undo an edit. Response edits apply to a backend's response, after its hop-by-hop
//! fields are gone; duet's own answers (its 4xx/5xx, redirects) are left as duet writes them, so they
//! stay recognisable and no edit meant for the application (a `Cache-Control`, say) makes them
//! cacheable. The config refuses edits of hop-by-hop or framing fields and of Host.

use crate::filter::phase::{Build, Phase, Phases, ResponseHead};
use duet_config::{HeaderEdits, Route};
use http::{request, HeaderMap, HeaderName, HeaderValue};

/// One of a route's header edits, with names and values parsed once.
#[derive(Debug, Default)]
struct HeaderEditor {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl HeaderEditor {
    /// The edits as compiled; the config has checked every name and value, so none is dropped.
    fn new(edits: &HeaderEdits) -> Self {
        let field = |(name, value): &(String, String)| {
            Some((
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            ))
        };
        Self {
            set: edits.set.iter().filter_map(field).collect(),
            add: edits.add.iter().filter_map(field).collect(),
            remove: (edits.remove.iter())
                .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
                .collect(),
        }
    }

    /// Removes, then sets (every field of the name replaced by one), then adds.
    fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }
}

/// `request_headers:`: edits of the request every attempt sends.
#[derive(Debug)]
pub(crate) struct RequestHeaders(HeaderEditor);

impl Phases for RequestHeaders {
    const PHASES: Phase = Phase::UPSTREAM_REQUEST;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let edits = &route.request_headers;
        (!edits.is_empty()).then(|| Self(HeaderEditor::new(edits)))
    }

    fn on_upstream_request(
        &self,
        parts: &mut request::Parts,
    ) -> Result<(), crate::error::ErrorKind> {
        self.0.apply(&mut parts.headers);
        Ok(())
    }
}

/// `response_headers:`: edits of a backend's response head.
#[derive(Debug)]
pub(crate) struct ResponseHeaders(HeaderEditor);

impl Phases for ResponseHeaders {
    const PHASES: Phase = Phase::RESPONSE_HEAD;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let edits = &route.response_headers;
        (!edits.is_empty()).then(|| Self(HeaderEditor::new(edits)))
    }

    fn on_response_head(&self, head: &mut ResponseHead<'_>) {
        self.0.apply(head.headers);
    }
}
