//! `max_request_body:`: the largest request body a route takes (nginx's `client_max_body_size`).

use super::{RouteContext, Section};
use crate::{checker::Checker, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;

/// `max_request_body: 10MiB` on a route: past it, 413 (a streamed body is cut as it passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxRequestBody {
    /// The most bytes; 0: no limit on this route, whatever `limits.max_request_body` says.
    pub bytes: u64,
}

/// The route key `max_request_body:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    max_request_body: Option<Spanned<Scalar>>,
}

impl Section for MaxRequestBody {
    type Raw = Keys;

    fn check(checker: &mut Checker, keys: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        let written = keys.max_request_body.as_ref()?;
        let field = route.field.key("max_request_body");
        let bytes = checker.size(Some(written), &field, 0, 0) as u64;
        Some(Self { bytes })
    }

    fn describe(&self) -> String {
        format!("max_request_body {}", self.bytes)
    }
}
