//! `error_pages:`: the pages a route's clients get in place of duet's own short text errors (a 403 of
//! an `allow:` list, a 429, a 502 when no backend answers), in HTML or JSON by the request's
//! `Accept`, as nginx's `error_page` and Traefik's `Errors` middleware; with `intercept: true`, also
//! in place of a backend's own response of that status (nginx's `proxy_intercept_errors`).

use super::{respond, RouteContext, Section};
use crate::{checker::Checker, field::Field, raw::leaf, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::path::PathBuf;

/// `error_pages: [ { status, html, json }, ... ]`: for each status the first page that lists it, in
/// the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPages {
    /// The pages, in the order written.
    pub pages: Vec<ErrorPage>,
}

/// One page of `error_pages:`: the statuses it is for, in one or both formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPage {
    /// The statuses, inclusive: `404` is `(404, 404)`, `5xx` is `(500, 599)`.
    pub statuses: (u16, u16),
    /// The page for a client that prefers HTML (or states no preference).
    pub html: Option<Page>,
    /// The page for a client whose `Accept` prefers JSON.
    pub json: Option<Page>,
    /// `intercept: true`: the page also replaces a backend's response of these statuses (its body
    /// read and dropped). Default: only duet's own answers.
    pub intercept: bool,
}

/// A page's file, read with the config, and its media type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Where it was read from.
    pub file: PathBuf,
    /// Its bytes.
    pub body: Vec<u8>,
    /// `text/html; charset=utf-8` or `application/json`.
    pub content_type: &'static str,
}

impl ErrorPage {
    /// Whether the page is for `status`.
    pub fn covers(&self, status: u16) -> bool {
        (self.statuses.0..=self.statuses.1).contains(&status)
    }
}

/// One page as written.
#[derive(Debug, Deserialize)]
struct RawPage {
    #[serde(default)]
    status: Option<Spanned<Scalar>>,
    #[serde(default)]
    html: Option<Spanned<Scalar>>,
    #[serde(default)]
    json: Option<Spanned<Scalar>>,
    #[serde(default)]
    intercept: Option<Spanned<Scalar>>,
}

/// The route key `error_pages:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    error_pages: Option<Spanned<Vec<Spanned<RawPage>>>>,
}

impl Section for ErrorPages {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static crate::raw::Shape)] =
        &[("error_pages", &leaf::<RawPage>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        let written = raw.error_pages.as_ref()?;
        let field = route.field.key("error_pages");
        if written.value.is_empty() {
            let e = checker.error(written, &field, "an empty list: no page would be used");
            checker.push(e.hint(
                "list pages as `[ { status: 5xx, html: FILE } ]`, or leave `error_pages` out",
            ));
            return None;
        }
        let errors = checker.errors.len();
        let pages: Vec<ErrorPage> = (written.value.iter().enumerate())
            .filter_map(|(i, page)| self::page(checker, page, &field.index(i)))
            .collect();
        (checker.errors.len() == errors).then_some(Self { pages })
    }

    fn describe(&self) -> String {
        let pages: Vec<String> = (self.pages.iter())
            .map(|p| {
                let statuses = match p.statuses {
                    (low, high) if low == high => low.to_string(),
                    (low, high) if low % 100 == 0 && high == low + 99 => {
                        format!("{}xx", low / 100)
                    }
                    (low, high) => format!("{low}-{high}"),
                };
                match p.intercept {
                    true => format!("{statuses}+backend"),
                    false => statuses,
                }
            })
            .collect();
        format!("error_pages {}", pages.join(","))
    }
}

fn page(checker: &mut Checker, raw: &Spanned<RawPage>, field: &Field) -> Option<ErrorPage> {
    let written = &raw.value;
    let Some(status) = &written.status else {
        let e = checker.error(raw, field, "a page needs `status`");
        checker.push(e.hint("write `status: 404`, a class such as `5xx`, or a range `502-504`"));
        return None;
    };
    let statuses = statuses(checker, status, &field.key("status"))?;
    let read = |checker: &mut Checker, file: Option<&Spanned<Scalar>>, key, content_type| {
        let (file, body) = checker.file(file?, &field.key(key), respond::MAX_FILE_BYTES)?;
        Some(Page {
            file,
            body,
            content_type,
        })
    };
    let html = read(
        checker,
        written.html.as_ref(),
        "html",
        "text/html; charset=utf-8",
    );
    let json = read(checker, written.json.as_ref(), "json", "application/json");
    if written.html.is_none() && written.json.is_none() {
        let e = checker.error(raw, field, "a page needs `html`, `json` or both");
        checker.push(e.hint("name the file: `html: pages/5xx.html`"));
    }
    let intercept = checker.boolean(written.intercept.as_ref(), &field.key("intercept"), false);
    Some(ErrorPage {
        statuses,
        html,
        json,
        intercept,
    })
}

/// `404`, `5xx` or `502-504`, within the errors duet answers itself (400 to 599).
fn statuses(checker: &mut Checker, value: &Spanned<Scalar>, field: &Field) -> Option<(u16, u16)> {
    let text = value.value.0.trim();
    let number = |s: &str| s.trim().parse::<u16>().ok();
    let found = match text.as_bytes() {
        [class @ (b'4' | b'5'), b'x' | b'X', b'x' | b'X'] => {
            let low = u16::from(class - b'0') * 100;
            Some((low, low + 99))
        }
        _ => match text.split_once('-') {
            Some((low, high)) => number(low).zip(number(high)),
            None => number(text).map(|s| (s, s)),
        },
    };
    match found {
        Some((low, high)) if 400 <= low && low <= high && high <= 599 => Some((low, high)),
        _ => {
            let message = format!(
                "`{text}` is not an error status: expected 400 to 599, a class (`4xx`, `5xx`) or \
                 a range such as `502-504`"
            );
            checker.reject(value, field, message);
            None
        }
    }
}
