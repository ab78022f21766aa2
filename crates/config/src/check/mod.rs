//! The checks after parsing, one function per section of the file. Each returns its part of the
//! model and records every problem it finds without stopping, so one run reports them all.

// The sections: none uses another (clusters use their settings blocks and `tls`; routes their
// matchers, redirects, splits and filters, which use the matching rules).
mod clusters;
mod listeners;
mod client_limits;
mod routes;
mod settings;
mod tracing;
mod access_log;

mod cluster_settings;
mod listener_tls;
mod upstream_tls;
mod hash;
mod sticky;
mod redirect;
pub(crate) mod shadowing;
mod split;
mod route_filters;
mod route_match;
mod matching;

use crate::{
    checker::Checker, error::ConfigError, filter::RawFilters, model::Config, raw::RawConfig,
};
use std::path::PathBuf;

/// Something a valid file says that is likely not what its author meant, found by [`warnings`]: the
/// file runs as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Where the setting warned of is written.
    pub at: crate::Location,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: warning: {}", self.at, self.message)
    }
}

/// What `duet check` warns of in a valid `config` (each section's checks add their own), in file
/// order of the sections.
pub fn warnings(config: &Config) -> Vec<Warning> {
    sticky::random_key_warnings(config).collect()
}

/// The checked model, and every problem found (the model is meant to be used only when there are
/// none). `base` is the config file's folder, which relative paths start from.
pub(crate) fn check(
    raw: &RawConfig,
    filters: &RawFilters,
    base: PathBuf,
) -> (Config, Vec<ConfigError>) {
    let mut checker = Checker::new(base);
    let workers = settings::workers(&mut checker, raw.workers.as_ref());
    let listeners = listeners::listeners(&mut checker, &raw.listeners);
    let (clusters, names) = clusters::clusters(&mut checker, &raw.clusters);
    let written = routes::Listeners {
        checked: &listeners,
        written: &raw.listeners,
    };
    let routes = routes::routes(&mut checker, &raw.routes, filters, &names, &written);
    let limits = settings::limits(&mut checker, raw.limits.as_ref());
    let shutdown = settings::shutdown(&mut checker, raw.shutdown.as_ref());
    let admin = listeners::admin(&mut checker, raw.admin.as_ref(), &listeners);
    let admin_status_bucket = listeners::status_bucket(&mut checker, raw.admin.as_ref());
    let tracing = tracing::tracing(&mut checker, raw.tracing.as_ref());
    let access_log = access_log::access_log(&mut checker, raw.access_log.as_ref());
    let config = Config {
        workers,
        listeners,
        routes,
        clusters,
        limits,
        shutdown,
        admin,
        admin_status_bucket,
        tracing,
        access_log,
    };
    (config, checker.errors)
}
