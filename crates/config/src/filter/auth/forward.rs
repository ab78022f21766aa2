//! `auth: { forward: { cluster, path, method, request_headers, response_headers, timeout,
//! on_error } }`: an auth service, reached through a cluster of the config, decides.

use super::field_names;
use crate::{checker::Checker, error::did_you_mean, field::Field, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::time::Duration;

/// `forward:`: each request is first asked about at `path` of `cluster` (no body; the request's
/// method, host and URI in `X-Forwarded-Method`, `-Host`, `-Uri`, with the listed fields). A 2xx
/// lets it through with the listed response fields copied onto it; any other answer goes back to
/// the client as the auth service wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// The auth service's cluster, as an index into `config.clusters`.
    pub cluster: usize,
    /// Its name.
    pub cluster_name: String,
    /// The path (and query) asked.
    pub path: String,
    /// The subrequest's method.
    pub method: ForwardMethod,
    /// The request's fields sent to the auth service (lowercase).
    pub request_headers: Vec<String>,
    /// The auth service's response fields copied onto the request to the backend (lowercase).
    pub response_headers: Vec<String>,
    /// How long the auth service has to answer.
    pub timeout: Duration,
    /// What a timeout or an unreachable auth service means.
    pub on_error: OnError,
    /// The response field (one of `response_headers`) that names the user, for the access log's
    /// `user`.
    pub user_header: Option<String>,
}

/// The subrequest's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardMethod {
    /// `GET`, whatever the request's.
    Get,
    /// The request's own method.
    Original,
}

/// What a failed subrequest (timeout, no backend, connection error) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// 503: nothing passes unchecked.
    Deny,
    /// The request goes on, unauthenticated.
    Allow,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawForward {
    #[serde(default)]
    cluster: Option<Spanned<Scalar>>,
    #[serde(default)]
    path: Option<Spanned<Scalar>>,
    #[serde(default)]
    method: Option<Spanned<Scalar>>,
    #[serde(default)]
    request_headers: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    response_headers: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    on_error: Option<Spanned<Scalar>>,
    #[serde(default)]
    user_header: Option<Spanned<Scalar>>,
}

/// `timeout` when left out.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The route's forward auth, or `None` after recording why it is refused.
pub(super) fn check(
    checker: &mut Checker,
    raw: &Spanned<RawForward>,
    field: &Field,
    clusters: &[String],
) -> Option<Forward> {
    let written = &raw.value;
    let errors = checker.errors.len();
    let cluster = cluster(checker, raw, field, clusters);
    let path = written
        .path
        .as_ref()
        .map_or("/".to_owned(), |p| p.value.0.trim().to_owned());
    if let Some(p) = written
        .path
        .as_ref()
        .filter(|_| !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()))
    {
        let message = format!("`{path}` is not a path: expected one starting with `/`");
        checker.reject(p, field.key("path"), message);
    }
    let method = one_of(
        checker,
        written.method.as_ref(),
        &field.key("method"),
        &[
            ("get", ForwardMethod::Get),
            ("original", ForwardMethod::Original),
        ],
        ForwardMethod::Get,
    );
    let on_error = one_of(
        checker,
        written.on_error.as_ref(),
        &field.key("on_error"),
        &[("deny", OnError::Deny), ("allow", OnError::Allow)],
        OnError::Deny,
    );
    let request_headers = field_names(
        checker,
        written.request_headers.as_ref(),
        &field.key("request_headers"),
    );
    let response_headers = field_names(
        checker,
        written.response_headers.as_ref(),
        &field.key("response_headers"),
    );
    let timeout = checker.timeout(
        written.timeout.as_ref(),
        &field.key("timeout"),
        DEFAULT_TIMEOUT,
        "refuse every request",
        None,
    );
    let user_header = user_header(checker, written, field, response_headers.as_deref());
    let (cluster, cluster_name) = cluster?;
    (checker.errors.len() == errors).then_some(Forward {
        cluster,
        cluster_name,
        path,
        method,
        request_headers: request_headers?,
        response_headers: response_headers?,
        timeout,
        on_error,
        user_header,
    })
}

/// `user_header`: one of the `response_headers` (lowercase).
fn user_header(
    checker: &mut Checker,
    written: &RawForward,
    field: &Field,
    response_headers: Option<&[String]>,
) -> Option<String> {
    let raw = written.user_header.as_ref()?;
    let name = raw.value.0.trim().to_ascii_lowercase();
    let listed = response_headers.unwrap_or_default();
    if !listed.contains(&name) {
        let message = format!(
            "`{name}` is not one of `response_headers` ({}): the user is read from a field the \
             auth service's answer hands on",
            listed.join(", ")
        );
        checker.reject(raw, field.key("user_header"), message);
        return None;
    }
    Some(name)
}

/// The auth cluster, by name.
fn cluster(
    checker: &mut Checker,
    raw: &Spanned<RawForward>,
    field: &Field,
    clusters: &[String],
) -> Option<(usize, String)> {
    let hint = "name the cluster of the auth service: `cluster: authz`";
    named_cluster(
        checker,
        raw,
        raw.value.cluster.as_ref(),
        field,
        clusters,
        hint,
    )
}

/// The cluster `written` names (an index into `config.clusters`, and its name), or `None` after
/// recording that it is missing (at `raw`, with `hint`) or unknown.
pub(super) fn named_cluster<T>(
    checker: &mut Checker,
    raw: &Spanned<T>,
    written: Option<&Spanned<Scalar>>,
    field: &Field,
    clusters: &[String],
    hint: &str,
) -> Option<(usize, String)> {
    let Some(written) = written else {
        let e = checker.error(raw, field, "no `cluster`");
        checker.push(e.hint(hint));
        return None;
    };
    let name = written.value.0.trim();
    if let Some(at) = clusters.iter().position(|c| c == name) {
        return Some((at, name.to_owned()));
    }
    let e = checker.error(
        written,
        field.key("cluster"),
        format!("no cluster named `{name}`"),
    );
    let e = match did_you_mean(name, clusters.iter().map(String::as_str)) {
        Some(hint) => e.hint(hint),
        None => e.hint("name a cluster of `clusters:`"),
    };
    checker.push(e);
    None
}

/// One of a few words, or `default` after recording another.
fn one_of<T: Copy>(
    checker: &mut Checker,
    raw: Option<&Spanned<Scalar>>,
    field: &Field,
    words: &[(&str, T)],
    default: T,
) -> T {
    let Some(raw) = raw else { return default };
    let text = raw.value.0.trim();
    if let Some((_, value)) = words.iter().find(|(w, _)| *w == text) {
        return *value;
    }
    let expected: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
    let message = format!("`{text}`: expected {}", expected.join(" or "));
    checker.reject(raw, field, message);
    default
}
