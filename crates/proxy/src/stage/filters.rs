//! A route's filters, compiled once per config: the header edits of `request_headers:` and
//! `response_headers:`, and the `rewrite:` of path and Host.
//!
//! Request edits run last in prepare: after the hop-by-hop fields are gone and duet's own fields
//! (`X-Forwarded-For`/`-Proto`/`-Host`, `X-Request-Id`) are set, so a route has the last word on what
//! its backend reads (it may, say, remove `X-Forwarded-Host` for a backend that misreads it) and a
//! client can never undo an edit. Response edits apply to a backend's response, after its hop-by-hop
//! fields are gone; duet's own answers (its 4xx/5xx, redirects) are left as duet writes them, so they
//! stay recognisable and no edit meant for the application (a `Cache-Control`, say) makes them
//! cacheable. The config refuses edits of hop-by-hop or framing fields and of Host.

use crate::stage::rewrite;
use duet_config::{HeaderEdits, PathMatch, PathRewrite, Route};
use http::{header, HeaderMap, HeaderName, HeaderValue, Uri};

/// One of a route's header edits, with names and values parsed once.
#[derive(Debug, Default)]
pub(crate) struct HeaderEditor {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl HeaderEditor {
    /// The edits as compiled; the config has checked every name and value, so none is dropped.
    pub(crate) fn new(edits: &HeaderEdits) -> Self {
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
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
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

/// Everything a route changes in what passes through it.
#[derive(Debug, Default)]
pub(crate) struct Filters {
    pub(crate) request: HeaderEditor,
    pub(crate) response: HeaderEditor,
    path: Option<(PathRewrite, PathMatch)>,
    host: Option<HeaderValue>,
}

impl Filters {
    pub(crate) fn new(route: &Route) -> Self {
        Self {
            request: HeaderEditor::new(&route.request_headers),
            response: HeaderEditor::new(&route.response_headers),
            path: (route.rewrite.path.clone()).map(|path| (path, route.path.clone())),
            host: (route.rewrite.host.as_deref()).and_then(|h| HeaderValue::from_str(h).ok()),
        }
    }

    /// The request's headers and target as the backend gets them: the route's request edits made,
    /// then its rewrite. The target becomes origin-form (the Host already names the authority).
    /// An edge case the normaliser refuses (see [`rewrite::path`]) is 400.
    pub(crate) fn apply(
        &self,
        uri: &mut Uri,
        headers: &mut HeaderMap,
    ) -> Result<(), crate::error::ErrorKind> {
        self.request.apply(headers);
        if let Some(host) = &self.host {
            headers.insert(header::HOST, host.clone());
        }
        if let Some((rewrite, matched)) = &self.path {
            *uri = rewrite::path(uri, rewrite, matched)?;
        }
        Ok(())
    }
}
