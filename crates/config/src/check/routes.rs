//! `routes:`: what each route matches, the cluster it sends to, and its name in metrics.

use super::{redirect, route_filters, route_match, split};
use crate::{
    checker::Checker,
    error::{did_you_mean, ConfigError},
    field::Field,
    filter::{RawFilters, RouteContext},
    model::{http_method, Action, HostPattern, Listener, Location, PathMatch, Route},
    raw::{RawListener, RawRoute, Scalar},
};
use serde_saphyr::Spanned;
use std::{net::SocketAddr, time::Duration};

/// The listeners as checked, and as written (a listener refused for its own sake, such as a bad
/// address, is missing from the first: a route naming it is not blamed for that).
pub(super) struct Listeners<'a> {
    pub(super) checked: &'a [Listener],
    pub(super) written: &'a [RawListener],
}

/// The routes whose cluster exists; `clusters` are the cluster names in order.
pub(super) fn routes(
    checker: &mut Checker,
    raw: &[Spanned<RawRoute>],
    written_filters: &RawFilters,
    clusters: &[String],
    listeners: &Listeners<'_>,
) -> Vec<Route> {
    let mut routes = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let list = Field::root("routes");
    for (ri, spanned) in raw.iter().enumerate() {
        let r = &spanned.value;
        let field = list.index(ri);
        let matchers = route_match::matchers(checker, r.matcher.as_ref(), &field);
        let target = (&matchers.path, written_filters.answers(ri));
        let action = action(checker, spanned, &field, clusters, target);
        let filters = route_filters::filters(checker, r, &field, &matchers.path);
        let retry_methods = match &r.retry_methods {
            None => http_method::idempotent(),
            Some(list) => checker.methods(list, &field.key("retry_methods")),
        };
        let only_on =
            (r.listeners.as_ref()).map(|list| route_listeners(checker, list, &field, listeners));
        let timeout = r
            .timeout
            .as_ref()
            .map(|t| checker.duration(Some(t), &field.key("timeout"), Duration::ZERO));
        let buffered = &field.key("buffer_request");
        let buffer_request = size(checker, r.buffer_request.as_ref(), buffered);
        let proxies = !matches!(action, Some(Action::Redirect(_) | Action::Respond));
        let sends_to: Vec<usize> = action.iter().flat_map(Action::clusters).collect();
        let context = RouteContext {
            field: &field,
            redirect_written: r.redirect.is_some(),
            redirects: !proxies,
            clusters,
            sends_to: &sends_to,
            splits: matches!(action, Some(Action::Split(_))),
        };
        let route_filters = written_filters.check(checker, ri, &context);
        let name = route_name(checker, spanned, &field, &matchers, &names, ri);
        names.push(name.clone());
        let at = Location {
            line: spanned.referenced.line(),
            column: spanned.referenced.column(),
        };
        if let Some(action) = action {
            routes.push(Route {
                name,
                host: matchers.host,
                path: matchers.path,
                methods: matchers.methods,
                headers: matchers.headers,
                query: matchers.query,
                action,
                listeners: only_on,
                retry_methods,
                timeout: timeout.filter(|t| !t.is_zero()),
                buffer_request: buffer_request
                    .filter(|&size| size > 0)
                    .map(|size| size as usize),
                request_headers: filters.request_headers,
                response_headers: filters.response_headers,
                rewrite: filters.rewrite,
                retry_attempts: filters.retry_attempts,
                at,
                filters: route_filters,
            });
        }
    }
    if raw.is_empty() {
        checker.push(
            ConfigError::new("routes", "no routes: every request would get 404")
                .hint("add `routes: [{ match: { path_prefix: / }, cluster: NAME }]`"),
        );
    }
    routes
}

fn size(checker: &mut Checker, size: Option<&Spanned<Scalar>>, field: &Field) -> Option<u64> {
    size.map(|size| checker.size(Some(size), field, 0, 0) as u64)
}

/// `name:` as given, or else the route's host and path (`*/api`), made unique by its position.
fn route_name(
    checker: &mut Checker,
    route: &Spanned<RawRoute>,
    field: &Field,
    matchers: &route_match::Matchers,
    names: &[String],
    position: usize,
) -> String {
    if let Some(given) = &route.value.name {
        return given_name(checker, given, field, names);
    }
    let host = match &matchers.host {
        None => "*".to_owned(),
        Some(HostPattern::Exact(h)) => h.clone(),
        Some(HostPattern::Wildcard(suffix)) => format!("*{suffix}"),
    };
    let derived = format!("{host}{}", matchers.path);
    if names.contains(&derived) {
        format!("{derived}#{position}")
    } else {
        derived
    }
}

/// A route's `listeners:`: each a listener's `name:` or its address as written.
fn route_listeners(
    checker: &mut Checker,
    raw: &Spanned<Vec<Spanned<Scalar>>>,
    route: &Field,
    listeners: &Listeners<'_>,
) -> Vec<usize> {
    let list = route.key("listeners");
    if raw.value.is_empty() {
        let e = checker.error(raw, &list, "an empty list: the route would match nothing");
        checker.push(e.hint("leave `listeners` out for a route on every listener"));
    }
    let mut found = Vec::new();
    for (i, wanted) in raw.value.iter().enumerate() {
        let text = wanted.value.0.trim();
        let address = text.parse::<SocketAddr>().ok();
        let position = listeners
            .checked
            .iter()
            .position(|l| l.name.as_deref() == Some(text) || Some(l.address) == address);
        match position {
            Some(position) if !found.contains(&position) => found.push(position),
            Some(_) => {}
            None if listeners.written.iter().any(|l| {
                l.address.value.0.trim() == text
                    || l.name.as_ref().is_some_and(|n| n.value.0.trim() == text)
            }) => {}
            None => unknown_listener(checker, wanted, list.index(i), listeners.checked),
        }
    }
    found
}

fn unknown_listener(
    checker: &mut Checker,
    wanted: &Spanned<Scalar>,
    field: Field,
    listeners: &[Listener],
) {
    let text = wanted.value.0.trim();
    let e = checker.error(
        wanted,
        field,
        format!("no listener is named `{text}` or listens on it"),
    );
    let names = listeners.iter().filter_map(|l| l.name.as_deref());
    let e = match did_you_mean(text, names) {
        Some(hint) => e.hint(hint),
        None => {
            let known: Vec<String> = listeners
                .iter()
                .map(|l| match &l.name {
                    Some(name) => format!("{name} ({})", l.address),
                    None => l.address.to_string(),
                })
                .collect();
            e.hint(format!(
                "write a listener's `name:` or its address; listeners: {}",
                known.join(", ")
            ))
        }
    };
    checker.push(e);
}

/// The route's `cluster:`, `backends:` or `redirect:`, exactly one of them; or none for a route that
/// `answers` itself (`respond:`).
fn action(
    checker: &mut Checker,
    route: &Spanned<RawRoute>,
    field: &Field,
    clusters: &[String],
    (path, answers): (&PathMatch, bool),
) -> Option<Action> {
    let r = &route.value;
    if answers {
        return answers_itself(checker, r, field);
    }
    match (&r.cluster, &r.backends, &r.redirect) {
        (Some(wanted), None, None) => checker
            .cluster(wanted, &field.key("cluster"), clusters)
            .map(Action::Cluster),
        (None, Some(backends), None) => split::split(checker, backends, field, clusters),
        (None, None, Some(redirect)) => {
            redirect::redirect(checker, redirect, field, path).map(Action::Redirect)
        }
        (Some(_), Some(backends), _) => {
            let message = "both `cluster` and `backends`: write `cluster: NAME` for one cluster, \
                           `backends:` to split over several";
            checker.reject(backends, field.key("backends"), message);
            None
        }
        (Some(_), None, Some(redirect)) => {
            let message = "both `cluster` and `redirect`: a route either proxies or redirects";
            checker.reject(redirect, field.key("redirect"), message);
            None
        }
        (None, Some(_), Some(redirect)) => {
            let message = "both `backends` and `redirect`: a route either proxies or redirects";
            checker.reject(redirect, field.key("redirect"), message);
            None
        }
        (None, None, None) => {
            let e = checker.error(route, field, "neither `cluster`, `backends` nor `redirect`");
            checker.push(e.hint(
                "add `cluster: NAME` to proxy, `backends: [{ cluster: NAME, weight: N }, ...]` to \
                 split, or `redirect: { ... }` to redirect",
            ));
            None
        }
    }
}

/// A `respond:` route's action, refused beside a `cluster:`, `backends:` or `redirect:`.
fn answers_itself(checker: &mut Checker, r: &RawRoute, field: &Field) -> Option<Action> {
    let beside = [
        ("cluster", r.cluster.as_ref().map(|s| &s.referenced)),
        ("backends", r.backends.as_ref().map(|s| &s.referenced)),
        ("redirect", r.redirect.as_ref().map(|s| &s.referenced)),
    ];
    let Some((key, at)) = beside.into_iter().find_map(|(key, at)| Some((key, at?))) else {
        return Some(Action::Respond);
    };
    let message = format!("both `respond` and `{key}`: a route either answers itself or proxies");
    let e = ConfigError::new(field.key(key), message).at(at.line(), at.column());
    checker.push(e.hint(format!("leave `{key}` out, or `respond`")));
    None
}

/// A `name:` as given: not empty, and unique (it labels metrics).
fn given_name(
    checker: &mut Checker,
    given: &Spanned<Scalar>,
    route: &Field,
    taken: &[String],
) -> String {
    let text = given.value.0.trim().to_owned();
    if text.is_empty() {
        checker.reject(given, route.key("name"), "a route name cannot be empty");
    } else if taken.contains(&text) {
        let e = checker.error(
            given,
            route.key("name"),
            format!("route `{text}` is named twice"),
        );
        checker.push(e.hint("route names label metrics: make them unique"));
    }
    text
}
