//! What a reload from one configuration to another would change: `duet check --config NEW --diff OLD`,
//! a plan to read before applying it.

use crate::model::{
    http_method, Cluster, Config, HashAlgorithm, HashKey, HashPolicy, HashWalk, HostPattern,
    Listener, Route, Sticky, StickySecret, UpstreamTls, Workers,
};
use std::fmt::{self, Debug};

/// `~ prefix.field: old -> new` for each named field of `old` and `new` that differs: the model's field
/// names are the file's keys (the two percentages aside, written out below), so each is written once.
macro_rules! changed {
    ($changes:expr, $prefix:expr, $old:expr, $new:expr, [$($field:ident),+ $(,)?]) => {
        $( $changes.field($prefix, stringify!($field), &$old.$field, &$new.$field); )+
    };
}

/// One difference between two configurations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `+ ...` added, `- ...` removed, `~ ...` changed.
    pub line: String,
    /// A reload refuses it: it takes a restart (listeners, workers, the admin address).
    pub needs_restart: bool,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)?;
        if self.needs_restart {
            f.write_str("   (needs a restart: a reload refuses it)")?;
        }
        Ok(())
    }
}

/// Everything that differs from `old` to `new`, in the order of the file's sections.
pub fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let mut changes = Changes::default();
    if old.workers != new.workers {
        changes.restart(format!(
            "~ workers: {} -> {}",
            workers(old.workers),
            workers(new.workers)
        ));
    }
    listeners(&mut changes, &old.listeners, &new.listeners);
    admin(&mut changes, old, new);
    routes(&mut changes, old, new);
    clusters(&mut changes, &old.clusters, &new.clusters);
    changed!(
        changes,
        "limits",
        old.limits,
        new.limits,
        [
            max_request_head,
            max_uri_length,
            header_read_timeout,
            body_read_timeout,
            min_upload_rate,
            upload_rate_grace,
            send_timeout,
            max_connections,
            keepalive_timeout,
            keepalive_requests,
            max_mirrors_in_flight,
            max_buffered_bytes,
        ]
    );
    changed!(
        changes,
        "limits.http2",
        old.limits.http2,
        new.limits.http2,
        [
            max_concurrent_streams,
            max_header_list_size,
            keepalive_interval,
            keepalive_timeout,
        ]
    );
    changed!(
        changes,
        "limits.http2",
        old.limits.http2.windows,
        new.limits.http2.windows,
        [
            initial_stream_window_size,
            initial_connection_window_size,
            adaptive_window,
        ]
    );
    changed!(
        changes,
        "shutdown",
        old.shutdown,
        new.shutdown,
        [drain_timeout, drain_delay]
    );
    tracing(&mut changes, old, new);
    if old.access_log != new.access_log {
        changes.push(format!(
            "~ access_log: {} -> {}",
            access_log(&old.access_log),
            access_log(&new.access_log)
        ));
    }
    changes.list
}

/// The admin listener's address and its status page's bucket: both read at start, so a restart.
fn admin(changes: &mut Changes, old: &Config, new: &Config) {
    if old.admin != new.admin {
        let show = |a: Option<std::net::SocketAddr>| a.map_or("off".to_owned(), |a| a.to_string());
        changes.restart(format!(
            "~ admin: {} -> {}",
            show(old.admin),
            show(new.admin)
        ));
    }
    if old.admin_status_bucket != new.admin_status_bucket {
        changes.restart(format!(
            "~ admin.status_bucket: {:?} -> {:?}",
            old.admin_status_bucket, new.admin_status_bucket
        ));
    }
}

/// `tracing:` as a whole: on, off, or its settings.
fn tracing(changes: &mut Changes, old: &Config, new: &Config) {
    if old.tracing != new.tracing {
        let show = |t: &Option<crate::model::Tracing>| {
            t.as_ref().map_or("off".to_owned(), ToString::to_string)
        };
        changes.push(format!(
            "~ tracing: {} -> {}",
            show(&old.tracing),
            show(&new.tracing)
        ));
    }
}

/// `access_log:` in a line: its format, fields and sample.
fn access_log(log: &crate::access_log::AccessLog) -> String {
    let fields: Vec<&str> = log.fields.iter().map(|f| f.name()).collect();
    format!(
        "format {}, fields [{}], sample_success {}%",
        log.format.map_or("--log-format", |f| f.name()),
        fields.join(", "),
        log.sample_success * 100.0
    )
}

/// Listeners are matched by address: adding or removing one takes a restart, their settings do not.
fn listeners(changes: &mut Changes, old: &[Listener], new: &[Listener]) {
    for listener in new {
        match old.iter().find(|l| l.address == listener.address) {
            None => changes.restart(format!("+ listener {}", listener.address)),
            Some(before) => {
                let prefix = format!("listener {}", listener.address);
                if before.name != listener.name {
                    let show = |l: &Listener| l.name.clone().unwrap_or_else(|| "none".to_owned());
                    changes.push(format!(
                        "~ {prefix}.name: {} -> {}",
                        show(before),
                        show(listener)
                    ));
                }
                changes.field(
                    &prefix,
                    "tls",
                    &before.tls.is_some(),
                    &listener.tls.is_some(),
                );
                if before.tls != listener.tls && before.tls.is_some() && listener.tls.is_some() {
                    changes.push(format!("~ {prefix}: certificate files"));
                }
                let nets = |l: &Listener| -> Vec<String> {
                    l.trusted_proxies.iter().map(ToString::to_string).collect()
                };
                changes.field(&prefix, "trusted_proxies", &nets(before), &nets(listener));
                let proxy_protocol =
                    |l: &Listener| l.proxy_protocol.map_or("off", |p| p.name()).to_owned();
                changes.field(
                    &prefix,
                    "proxy_protocol",
                    &proxy_protocol(before),
                    &proxy_protocol(listener),
                );
                changes.field(
                    &prefix,
                    "underscores_in_headers",
                    &before.underscores_in_headers.name(),
                    &listener.underscores_in_headers.name(),
                );
            }
        }
    }
    for listener in old {
        if !new.iter().any(|l| l.address == listener.address) {
            changes.restart(format!("- listener {}", listener.address));
        }
    }
}

/// Clusters are matched by name.
fn clusters(changes: &mut Changes, old: &[Cluster], new: &[Cluster]) {
    for cluster in new {
        match old.iter().find(|c| c.name == cluster.name) {
            None => changes.push(format!(
                "+ cluster {} ({}, {} backend{})",
                cluster.name,
                cluster.policy.name(),
                cluster.backends.len(),
                if cluster.backends.len() == 1 { "" } else { "s" }
            )),
            Some(before) => cluster_changes(changes, before, cluster),
        }
    }
    for cluster in old {
        if !new.iter().any(|c| c.name == cluster.name) {
            changes.push(format!("- cluster {}", cluster.name));
        }
    }
}

#[derive(Default)]
struct Changes {
    list: Vec<Change>,
}

impl Changes {
    fn push(&mut self, line: String) {
        self.list.push(Change {
            line,
            needs_restart: false,
        });
    }

    fn restart(&mut self, line: String) {
        self.list.push(Change {
            line,
            needs_restart: true,
        });
    }

    /// `~ prefix.name: old -> new` when they differ (durations read as `250ms`, `2s`).
    fn field<T: PartialEq + Debug>(&mut self, prefix: &str, name: &str, old: &T, new: &T) {
        if old != new {
            self.push(format!("~ {prefix}.{name}: {old:?} -> {new:?}"));
        }
    }
}

/// A cluster's `tls:` as written (where it is written aside): `off`, or its settings.
fn tls(tls: Option<&UpstreamTls>) -> String {
    let Some(tls) = tls else {
        return "off".to_owned();
    };
    let mut parts = vec![match &tls.ca {
        Some((path, _)) => format!("ca {}", path.display()),
        None => "system roots".to_owned(),
    }];
    if let Some(name) = &tls.server_name {
        parts.push(format!("server_name {name}"));
    }
    if let Some(client) = &tls.client {
        parts.push(format!("client cert {}", client.cert.display()));
    }
    if !tls.verify {
        parts.push("verify false".to_owned());
    }
    parts.join(", ")
}

fn workers(workers: Workers) -> String {
    match workers {
        Workers::Auto => "auto".to_owned(),
        Workers::Count(n) => n.to_string(),
    }
}

/// Routes are matched by name (a route without `name:` is named by its host and path): each is
/// described by what it matches and where it sends, a route whose description changed is shown before
/// and after, and an order that changed is said so (the first match wins).
fn routes(changes: &mut Changes, old: &Config, new: &Config) {
    let before: Vec<(&str, String)> = (old.routes.iter())
        .map(|r| (r.name.as_str(), describe_route(old, r)))
        .collect();
    let after: Vec<(&str, String)> = (new.routes.iter())
        .map(|r| (r.name.as_str(), describe_route(new, r)))
        .collect();
    for (name, now) in &after {
        match before.iter().find(|(n, _)| n == name) {
            None => changes.push(format!("+ route {name}: {now}")),
            Some((_, was)) if was != now => {
                changes.push(format!("~ route {name}: was {was}; now {now}"))
            }
            Some(_) => {}
        }
    }
    for (name, was) in &before {
        if !after.iter().any(|(n, _)| n == name) {
            changes.push(format!("- route {name}: {was}"));
        }
    }
    let kept = |list: &[(&str, String)], other: &[(&str, String)]| -> Vec<String> {
        (list.iter())
            .filter(|(name, _)| other.iter().any(|(n, _)| n == name))
            .map(|(name, _)| (*name).to_owned())
            .collect()
    };
    if kept(&before, &after) != kept(&after, &before) {
        changes
            .push("~ routes: the same routes in another order (the first match wins)".to_owned());
    }
}

/// What a route matches and does, for people to read: `host * path /api method GET -> api (timeout 2s)`.
fn describe_route(config: &Config, route: &Route) -> String {
    let host = match &route.host {
        None => "*".to_owned(),
        Some(HostPattern::Exact(host)) => host.clone(),
        Some(HostPattern::Wildcard(suffix)) => format!("*{suffix}"),
    };
    let mut line = format!(
        "host {host} path {}{} -> {}",
        route.path,
        route.conditions(),
        route.target(&config.clusters)
    );
    if let Some(timeout) = route.timeout {
        line.push_str(&format!(" (timeout {timeout:?})"));
    }
    if let Some(only) = &route.listeners {
        let named: Vec<String> = only
            .iter()
            .filter_map(|&i| config.listeners.get(i))
            .map(|l| l.name.clone().unwrap_or_else(|| l.address.to_string()))
            .collect();
        line.push_str(&format!(" (listeners {})", named.join(",")));
    }
    if let Some(size) = route.buffer_request {
        line.push_str(&format!(" (buffer_request {size} bytes)"));
    }
    if route.retry_methods != http_method::idempotent() {
        line.push_str(&format!(" (retry {})", route.retry_methods.join(",")));
    }
    line.push_str(&route.describe_filters());
    line
}

/// `sticky:` as written, where it is written aside, and never its secret: whether the key changed
/// says enough (cookies signed under the old one stop binding).
fn sticky(changes: &mut Changes, prefix: &str, old: Option<&Sticky>, new: Option<&Sticky>) {
    let shown = |sticky: Option<&Sticky>| match sticky {
        None => "off".to_owned(),
        Some(s) => {
            let key = match s.secret {
                StickySecret::Random => "random key",
                StickySecret::Shared(_) => "shared key",
            };
            format!("cookie {} ttl {:?} {key}", s.cookie, s.ttl)
        }
    };
    let (before, after) = (shown(old), shown(new));
    if before != after {
        changes.push(format!("~ {prefix}: sticky {before} -> {after}"));
    } else if old.map(|s| &s.secret) != new.map(|s| &s.secret) {
        changes.push(format!(
            "~ {prefix}: sticky key changed (cookies signed under the old one are re-picked)"
        ));
    }
}

/// `hash:` of a `policy: hash` cluster, in the words it is written with.
fn hash(changes: &mut Changes, prefix: &str, old: Option<&HashPolicy>, new: Option<&HashPolicy>) {
    let shown = |hash: Option<&HashPolicy>| match hash {
        None => "off".to_owned(),
        Some(h) => {
            let key = match &h.key {
                HashKey::Header(name) => format!("header:{name}"),
                HashKey::Cookie(name) => format!("cookie:{name}"),
                HashKey::Query(name) => format!("query:{name}"),
                HashKey::ClientIp => "client_ip".to_owned(),
                HashKey::Path => "path".to_owned(),
            };
            let walk = match h.walk {
                HashWalk::Next => "next",
                HashWalk::P2c => "p2c",
            };
            let algorithm = match h.algorithm {
                HashAlgorithm::Maglev => "maglev",
                HashAlgorithm::Ring => "ring",
            };
            format!(
                "key {key} bound {} walk {walk} algorithm {algorithm}",
                h.bound
            )
        }
    };
    let (before, after) = (shown(old), shown(new));
    if before != after {
        changes.push(format!("~ {prefix}: hash {before} -> {after}"));
    }
}

fn cluster_changes(changes: &mut Changes, old: &Cluster, new: &Cluster) {
    let prefix = format!("cluster {}", new.name);
    if old.policy != new.policy {
        changes.push(format!(
            "~ {prefix}: policy {} -> {}",
            old.policy.name(),
            new.policy.name()
        ));
    }
    if old.protocol != new.protocol {
        changes.push(format!(
            "~ {prefix}: protocol {} -> {}",
            old.protocol.name(),
            new.protocol.name()
        ));
    }
    if old.send_proxy_protocol != new.send_proxy_protocol {
        let name = |c: &Cluster| c.send_proxy_protocol.map_or("off", |v| v.name());
        changes.push(format!(
            "~ {prefix}: send_proxy_protocol {} -> {}",
            name(old),
            name(new)
        ));
    }
    sticky(changes, &prefix, old.sticky.as_ref(), new.sticky.as_ref());
    hash(changes, &prefix, old.hash.as_ref(), new.hash.as_ref());
    backends(changes, &prefix, old, new);
    let timeouts = format!("{prefix}.timeouts");
    changed!(
        changes,
        &timeouts,
        old.timeouts,
        new.timeouts,
        [connect, response_headers, idle, read, tunnel_idle,]
    );
    health_check(changes, &prefix, old, new);
    failure_handling(changes, &prefix, old, new);
    changed!(
        changes,
        &prefix,
        old,
        new,
        [slow_start, dns_refresh, penalty_statuses,]
    );
    changed!(
        changes,
        &format!("{prefix}.http2"),
        old.http2,
        new.http2,
        [
            initial_stream_window_size,
            initial_connection_window_size,
            adaptive_window,
        ]
    );
    let (old_tls, new_tls) = (tls(old.tls.as_ref()), tls(new.tls.as_ref()));
    if old_tls != new_tls {
        changes.push(format!("~ {prefix}.tls: {old_tls} -> {new_tls}"));
    }
    changes.field(
        &prefix,
        "panic_threshold",
        &Percent(old.panic_threshold),
        &Percent(new.panic_threshold),
    );
}

/// Backends are matched by address.
fn backends(changes: &mut Changes, prefix: &str, old: &Cluster, new: &Cluster) {
    for backend in &new.backends {
        match old.backends.iter().find(|b| b.address == backend.address) {
            None => changes.push(format!(
                "+ {prefix}: backend {} weight {}",
                backend.address, backend.weight
            )),
            Some(before) if before.weight != backend.weight => changes.push(format!(
                "~ {prefix}: backend {} weight {} -> {}",
                backend.address, before.weight, backend.weight
            )),
            Some(_) => {}
        }
    }
    for backend in &old.backends {
        if !new.backends.iter().any(|b| b.address == backend.address) {
            changes.push(format!("- {prefix}: backend {}", backend.address));
        }
    }
}

fn health_check(changes: &mut Changes, prefix: &str, old: &Cluster, new: &Cluster) {
    match (&old.health_check, &new.health_check) {
        (None, Some(check)) => changes.push(format!(
            "+ {prefix}: health checks {} every {:?}",
            check.path, check.interval
        )),
        (Some(_), None) => changes.push(format!("- {prefix}: health checks")),
        (Some(o), Some(n)) => {
            let check = format!("{prefix}.health_check");
            changed!(
                changes,
                &check,
                o,
                n,
                [
                    path,
                    interval,
                    timeout,
                    healthy_threshold,
                    unhealthy_threshold,
                    expected_statuses,
                ]
            );
        }
        (None, None) => {}
    }
}

/// `outlier_detection` and `retries`: what a cluster does about failed attempts.
fn failure_handling(changes: &mut Changes, prefix: &str, old: &Cluster, new: &Cluster) {
    let outliers = format!("{prefix}.outlier_detection");
    changed!(
        changes,
        &outliers,
        old.outlier_detection,
        new.outlier_detection,
        [
            consecutive_failures,
            consecutive_5xx,
            base_ejection_time,
            max_ejection_time,
        ]
    );
    changes.field(
        &outliers,
        "max_ejection_percent",
        &Percent(old.outlier_detection.max_ejection_fraction),
        &Percent(new.outlier_detection.max_ejection_fraction),
    );
    let retries = format!("{prefix}.retries");
    changed!(
        changes,
        &retries,
        old.retries,
        new.retries,
        [attempts, min_retries_per_second, replay_body_limit,]
    );
    changes.field(
        &retries,
        "budget_percent",
        &Percent(old.retries.budget_fraction),
        &Percent(new.retries.budget_fraction),
    );
}

/// A fraction as the file writes it: `0.5` is `50%`.
#[derive(PartialEq)]
struct Percent(f64);

impl Debug for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0 * 100.0)
    }
}
