//! A route as the status page shows it: what it matches, where it sends (each of its clusters with
//! its weight) and its filters, as text for people. Each worker publishes its table's routes beside
//! its cluster cells; they change only with the config.

use duet_config::{Action, Config, HostPattern, Route};

/// One route, described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteCells {
    pub(crate) name: String,
    /// `host api.example.com path /v1 method GET`: its matchers.
    pub(crate) matches: String,
    /// Each cluster it sends to and its weight (a single `cluster:` at weight 1); empty for a redirect.
    pub(crate) clusters: Vec<(String, u32)>,
    /// `redirect 308 scheme https`, for a redirect route; empty otherwise.
    pub(crate) redirect: String,
    /// ` request_headers set x-team=api rewrite path_prefix /v2`: its filters, empty without any.
    pub(crate) filters: String,
}

impl RouteCells {
    /// Every route of `config`, in order.
    pub(crate) fn of(config: &Config) -> Vec<Self> {
        (config.routes.iter())
            .map(|route| Self::route(route, config))
            .collect()
    }

    fn route(route: &Route, config: &Config) -> Self {
        let host = match &route.host {
            None => "*".to_owned(),
            Some(HostPattern::Exact(host)) => host.clone(),
            Some(HostPattern::Wildcard(suffix)) => format!("*{suffix}"),
        };
        let name = |index: usize| {
            (config.clusters.get(index)).map_or_else(String::new, |c| c.name.clone())
        };
        let clusters = (route.action.weighted())
            .map(|(index, weight)| (name(index), weight))
            .collect();
        let redirect = match &route.action {
            Action::Redirect(redirect) => redirect.to_string(),
            _ => String::new(),
        };
        Self {
            name: route.name.clone(),
            matches: format!("host {host} path {}{}", route.path, route.conditions()),
            clusters,
            redirect,
            filters: route.describe_filters(),
        }
    }
}
