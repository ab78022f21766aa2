//! `error_pages:`: a route's pages in place of duet's own short text errors (a 403, a 413, a 429, a
//! 502 or 504 when no backend answered), in HTML or JSON by the request's `Accept`. A backend's own
//! error responses pass as the backend wrote them, unless a page of their status says `intercept`;
//! a gRPC call keeps its gRPC status.

use crate::filter::phase::{Build, OwnPage, Phase, Phases};
use bytes::Bytes;
use duet_config::Route;
use http::{header, HeaderMap, HeaderValue};

/// A route's pages, their bodies shared by every response, for each the statuses it covers.
#[derive(Debug)]
pub(crate) struct ErrorPages(Vec<Entry>);

#[derive(Debug)]
struct Entry {
    statuses: (u16, u16),
    html: Option<OwnPage>,
    json: Option<OwnPage>,
    intercept: bool,
}

impl Phases for ErrorPages {
    const PHASES: Phase = Phase::ERROR_PAGE;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let pages = route.filters.error_pages.as_ref()?;
        let own = |page: &Option<duet_config::filter::error_pages::Page>| {
            page.as_ref().map(|page| OwnPage {
                content_type: HeaderValue::from_static(page.content_type),
                body: Bytes::from(page.body.clone()),
            })
        };
        let entries = (pages.pages.iter()).map(|page| Entry {
            statuses: page.statuses,
            html: own(&page.html),
            json: own(&page.json),
            intercept: page.intercept,
        });
        Some(Self(entries.collect()))
    }

    fn error_page(&self, status: u16, json: bool) -> Option<&OwnPage> {
        let entry = (self.0.iter()).find(|e| (e.statuses.0..=e.statuses.1).contains(&status))?;
        entry.page(json)
    }

    fn backend_page(&self, status: u16, json: bool) -> Option<&OwnPage> {
        let entry = (self.0.iter()).find(|e| (e.statuses.0..=e.statuses.1).contains(&status))?;
        entry.intercept.then(|| entry.page(json)).flatten()
    }
}

impl Entry {
    /// The page in the format the client prefers, else the one there is.
    fn page(&self, json: bool) -> Option<&OwnPage> {
        let (preferred, other) = match json {
            true => (&self.json, &self.html),
            false => (&self.html, &self.json),
        };
        preferred.as_ref().or(other.as_ref())
    }
}

/// Whether the request's `Accept` ranks JSON (`application/json`, a `+json` type, or their
/// wildcards) above HTML (RFC 9110 §12.5.1): a tie, or no `Accept`, is HTML, what a browser reads.
pub(crate) fn prefers_json(headers: &HeaderMap) -> bool {
    let (mut json, mut html) = (Quality::NONE, Quality::NONE);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let q = quality(parts);
            let (kind, subtype) = media.split_once('/').unwrap_or((&media, ""));
            let json_match = match (kind, subtype) {
                ("application", "json") => 3,
                ("application", s) if s.ends_with("+json") => 3,
                ("application", "*") => 2,
                ("*", "*") => 1,
                _ => 0,
            };
            let html_match = match (kind, subtype) {
                ("text", "html") => 3,
                ("text", "*") => 2,
                ("*", "*") => 1,
                _ => 0,
            };
            json.offer(json_match, q);
            html.offer(html_match, q);
        }
    }
    json.q > html.q
}

/// The quality of a media type: the `q` of the most specific range that matches it.
#[derive(Clone, Copy)]
struct Quality {
    specificity: u8,
    q: u16,
}

impl Quality {
    const NONE: Self = Self {
        specificity: 0,
        q: 0,
    };

    fn offer(&mut self, specificity: u8, q: u16) {
        if specificity > self.specificity {
            *self = Self { specificity, q };
        }
    }
}

/// A range's `q` in thousandths; 1 when not given or not a number.
fn quality<'a>(parameters: impl Iterator<Item = &'a str>) -> u16 {
    for parameter in parameters {
        if let Some((name, value)) = parameter.split_once('=') {
            if name.trim().eq_ignore_ascii_case("q") {
                let q = value.trim().parse::<f32>().unwrap_or(1.0).clamp(0.0, 1.0);
                return (q * 1000.0).round() as u16;
            }
        }
    }
    1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_str(value).expect("value"));
        headers
    }

    #[test]
    fn json_only_where_accept_ranks_it_above_html() {
        let rows = [
            ("application/json", true),
            ("application/problem+json", true),
            (
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
                false,
            ),
            ("application/json;q=0.5, text/html", false),
            ("text/html;q=0.4, application/json;q=0.6", true),
            ("*/*", false),
            ("text/*;q=0.1, application/*", true),
            ("text/plain", false),
        ];
        for (value, json) in rows {
            assert_eq!(prefers_json(&accept(value)), json, "{value}");
        }
        assert!(!prefers_json(&HeaderMap::new()));
    }

    #[test]
    fn the_first_page_listing_the_status_in_the_preferred_format_or_else_the_other() {
        let page = |text: &'static str| {
            Some(OwnPage {
                content_type: HeaderValue::from_static("text/html"),
                body: Bytes::from_static(text.as_bytes()),
            })
        };
        let pages = ErrorPages(vec![
            Entry {
                statuses: (404, 404),
                html: page("404"),
                json: None,
                intercept: false,
            },
            Entry {
                statuses: (400, 599),
                html: page("html"),
                json: page("json"),
                intercept: true,
            },
        ]);
        let body = |status, json| pages.error_page(status, json).map(|p| p.body.clone());
        assert_eq!(body(404, true), Some(Bytes::from_static(b"404")));
        assert_eq!(body(502, true), Some(Bytes::from_static(b"json")));
        assert_eq!(body(502, false), Some(Bytes::from_static(b"html")));
        assert_eq!(body(302, false), None);
        let backend = |status| pages.backend_page(status, false).map(|p| p.body.clone());
        assert_eq!(
            backend(404),
            None,
            "the first page for 404 does not intercept"
        );
        assert_eq!(backend(503), Some(Bytes::from_static(b"html")));
    }
}
