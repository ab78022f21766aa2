//! `respond:`: a route that answers every request itself, with a fixed status and body (a health
//! endpoint, `robots.txt`, a maintenance page), as nginx's `return 200 "ok"` and Envoy's
//! `direct_response`. Such a route names no cluster.

use super::{RouteContext, Section};
use crate::{checker::Checker, field::Field, raw::leaf, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::path::{Path, PathBuf};

/// `respond: { status, body | file, content_type }`: the route's answer, the same to every request
/// (a `HEAD` gets its head alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Respond {
    /// The status, 200 to 599.
    pub status: u16,
    /// `Content-Type`; left out, from the file's extension, or plain text for `body:`.
    pub content_type: String,
    /// The body: `body:` as written, or the file's bytes as read with the config.
    pub body: Vec<u8>,
    /// The file the body was read from, for `duet check`.
    pub file: Option<PathBuf>,
}

/// The most of a file a route answers with: a page, not a download.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// `respond:` as written.
#[derive(Debug, Deserialize)]
struct RawRespond {
    #[serde(default)]
    status: Option<Spanned<Scalar>>,
    #[serde(default)]
    body: Option<Spanned<Scalar>>,
    #[serde(default)]
    file: Option<Spanned<Scalar>>,
    #[serde(default)]
    content_type: Option<Spanned<Scalar>>,
}

/// The route key `respond:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    respond: Option<Spanned<RawRespond>>,
}

impl Keys {
    /// Whether the route has `respond:` (it then needs no cluster).
    pub(crate) fn written(&self) -> bool {
        self.respond.is_some()
    }
}

impl Section for Respond {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static crate::raw::Shape)] =
        &[("respond", &leaf::<RawRespond>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, raw.respond.as_ref()?, &route.field.key("respond"))
    }

    fn describe(&self) -> String {
        match &self.file {
            Some(file) => format!("respond {} file {}", self.status, file.display()),
            None => format!("respond {} {} bytes", self.status, self.body.len()),
        }
    }
}

fn check(checker: &mut Checker, raw: &Spanned<RawRespond>, field: &Field) -> Option<Respond> {
    let errors = checker.errors.len();
    let written = &raw.value;
    let status = checker.count(
        written.status.as_ref(),
        &field.key("status"),
        200,
        (200, 599),
    ) as u16;
    let (body, file) = match (&written.body, &written.file) {
        (Some(body), None) => (body.value.0.clone().into_bytes(), None),
        (None, Some(file)) => checker
            .file(file, &field.key("file"), MAX_FILE_BYTES)
            .map_or((Vec::new(), None), |(path, bytes)| (bytes, Some(path))),
        (None, None) => (Vec::new(), None),
        (Some(_), Some(file)) => {
            let message = "both `body` and `file`: write the body, or name the file holding it";
            checker.reject(file, field.key("file"), message);
            (Vec::new(), None)
        }
    };
    if matches!(status, 204 | 304) && !body.is_empty() {
        let at = (written.body.as_ref()).or(written.file.as_ref());
        if let Some(at) = at {
            let message = format!("a {status} has no body (RFC 9110 §15.3.5, §15.4.5)");
            checker.reject(at, field.key("body"), message);
        }
    }
    let content_type = match &written.content_type {
        Some(value) => media_type(checker, value, &field.key("content_type")),
        None => guess(file.as_deref()).to_owned(),
    };
    (checker.errors.len() == errors).then_some(Respond {
        status,
        content_type,
        body,
        file,
    })
}

/// A media type as written (`text/html; charset=utf-8`): refused when it could not be a field value.
pub(crate) fn media_type(checker: &mut Checker, value: &Spanned<Scalar>, field: &Field) -> String {
    let text = value.value.0.trim();
    let valid = text.contains('/')
        && (text.bytes()).all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        && !text.is_empty();
    if !valid {
        let message = format!("`{text}` is not a media type such as `text/html; charset=utf-8`");
        checker.reject(value, field, message);
    }
    text.to_owned()
}

/// The media type of a file by its extension; plain text without a file.
pub(crate) fn guess(file: Option<&Path>) -> &'static str {
    let extension = (file.and_then(Path::extension)).and_then(|e| e.to_str());
    match extension.map(str::to_ascii_lowercase).as_deref() {
        None if file.is_none() => "text/plain; charset=utf-8",
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("xml") => "application/xml",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        _ => "application/octet-stream",
    }
}
