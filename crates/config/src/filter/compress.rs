//! `compress:`: a route's responses compressed on their way to the client, in gzip, brotli or zstd
//! by the request's `Accept-Encoding`, as nginx's `gzip`, Caddy's `encode` and Envoy's compressor.

use super::{RouteContext, Section};
use crate::{checker::Checker, field::Field, raw::leaf, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::fmt;

/// A content coding duet writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `zstd` (RFC 8878).
    Zstd,
    /// `br` (RFC 7932).
    Brotli,
    /// `gzip` (RFC 1952).
    Gzip,
}

impl Encoding {
    /// Its token in `Accept-Encoding` and `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Brotli => "br",
            Self::Gzip => "gzip",
        }
    }
}

/// `compress: { encodings, types, min_length, gzip_level, brotli_level, zstd_level }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compress {
    /// The codings offered, preferred first where the client ranks them equal.
    pub encodings: Vec<Encoding>,
    /// Media types compressed, lowercased, without parameters: `text/html`, or `text/*`.
    pub types: Vec<String>,
    /// A response whose `Content-Length` is below this goes as it is (one of unknown length is
    /// compressed).
    pub min_length: u64,
    /// gzip's level, 1 to 9.
    pub gzip_level: u32,
    /// brotli's quality, 0 to 11.
    pub brotli_level: u32,
    /// zstd's level, 1 to 19.
    pub zstd_level: u32,
}

/// What `types` means when left out: text formats that shrink, never an event stream (which
/// compression would hold back) nor formats already compressed (images, video, archives).
pub const DEFAULT_TYPES: &[&str] = &[
    "text/html",
    "text/css",
    "text/plain",
    "text/xml",
    "text/javascript",
    "text/markdown",
    "text/csv",
    "application/javascript",
    "application/json",
    "application/xml",
    "application/wasm",
    "image/svg+xml",
];

impl fmt::Display for Compress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let encodings: Vec<&str> = self.encodings.iter().map(|e| e.token()).collect();
        write!(
            f,
            "{} min {} gzip {} br {} zstd {}",
            encodings.join(","),
            self.min_length,
            self.gzip_level,
            self.brotli_level,
            self.zstd_level
        )
    }
}

/// `compress:` as written.
#[derive(Debug, Deserialize)]
struct RawCompress {
    #[serde(default)]
    encodings: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    types: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    min_length: Option<Spanned<Scalar>>,
    #[serde(default)]
    gzip_level: Option<Spanned<Scalar>>,
    #[serde(default)]
    brotli_level: Option<Spanned<Scalar>>,
    #[serde(default)]
    zstd_level: Option<Spanned<Scalar>>,
}

/// The route key `compress:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    compress: Option<Spanned<RawCompress>>,
}

impl Section for Compress {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static crate::raw::Shape)] =
        &[("compress", &leaf::<RawCompress>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, raw.compress.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("compress {self}")
    }
}

fn check(
    checker: &mut Checker,
    raw: &Spanned<RawCompress>,
    route: &RouteContext<'_>,
) -> Option<Compress> {
    let field = route.field.key("compress");
    let errors = checker.errors.len();
    if route.redirects {
        let e = checker.error(
            raw,
            &field,
            "the route answers itself: no backend response to compress",
        );
        checker.push(e.hint("leave `compress` out of redirect and `respond` routes"));
    }
    let written = &raw.value;
    let encodings = match &written.encodings {
        None => vec![Encoding::Zstd, Encoding::Brotli, Encoding::Gzip],
        Some(list) => encodings(checker, list, &field.key("encodings")),
    };
    let types = match &written.types {
        None => DEFAULT_TYPES.iter().map(|t| (*t).to_owned()).collect(),
        Some(list) => types(checker, list, &field.key("types")),
    };
    let min_length = checker.size(
        written.min_length.as_ref(),
        &field.key("min_length"),
        1024,
        0,
    ) as u64;
    let level = |checker: &mut Checker, value: &Option<Spanned<Scalar>>, key, default, range| {
        checker.count(value.as_ref(), &field.key(key), default, range)
    };
    let gzip_level = level(checker, &written.gzip_level, "gzip_level", 5, (1, 9));
    let brotli_level = level(checker, &written.brotli_level, "brotli_level", 4, (0, 11));
    let zstd_level = level(checker, &written.zstd_level, "zstd_level", 3, (1, 19));
    (checker.errors.len() == errors).then_some(Compress {
        encodings,
        types,
        min_length,
        gzip_level,
        brotli_level,
        zstd_level,
    })
}

fn encodings(
    checker: &mut Checker,
    list: &Spanned<Vec<Spanned<Scalar>>>,
    field: &Field,
) -> Vec<Encoding> {
    if list.value.is_empty() {
        let e = checker.error(list, field, "an empty list: nothing would be compressed");
        checker.push(e.hint("list some of `zstd`, `br`, `gzip`, or leave `compress` out"));
    }
    let mut found = Vec::new();
    for (i, value) in list.value.iter().enumerate() {
        let encoding = match value.value.0.trim() {
            "zstd" => Encoding::Zstd,
            "br" => Encoding::Brotli,
            "gzip" => Encoding::Gzip,
            other => {
                let message = format!(
                    "`{other}` is not a coding duet writes: expected `zstd`, `br` or `gzip`"
                );
                checker.reject(value, field.index(i), message);
                continue;
            }
        };
        if found.contains(&encoding) {
            checker.reject(
                value,
                field.index(i),
                format!("`{}` is listed twice", encoding.token()),
            );
        }
        found.push(encoding);
    }
    found
}

fn types(
    checker: &mut Checker,
    list: &Spanned<Vec<Spanned<Scalar>>>,
    field: &Field,
) -> Vec<String> {
    if list.value.is_empty() {
        let e = checker.error(list, field, "an empty list: nothing would be compressed");
        checker.push(e.hint(
            "list media types such as `text/html`, or leave `types` out for the usual text types",
        ));
    }
    let mut found = Vec::new();
    for (i, value) in list.value.iter().enumerate() {
        let text = value.value.0.trim().to_ascii_lowercase();
        let valid = match text.split_once('/') {
            Some((kind, subtype)) => {
                crate::checker::token(kind)
                    && (subtype == "*" || crate::checker::token(subtype))
                    && kind != "*"
            }
            None => false,
        };
        if !valid {
            let message = format!(
                "`{text}` is not a media type such as `text/html` or `text/*` (no parameters)"
            );
            checker.reject(value, field.index(i), message);
        }
        found.push(text);
    }
    found
}
