//! duet's configuration: the YAML schema, its validation, and errors written for people.
//!
//! ```
//! let yaml = "
//! listeners:
//!   - address: 127.0.0.1:8080
//! routes:
//!   - match: { path_prefix: / }
//!     cluster: web
//! clusters:
//!   - name: web
//!     backends:
//!       - address: 127.0.0.1:9001
//! ";
//! let config = duet_config::parse(yaml, "inline.yaml").expect("valid");
//! assert_eq!(config.clusters[0].backends[0].weight, 1);
//!
//! let typo = yaml.replace("cluster: web", "cluster: wbe");
//! let errors = duet_config::parse(&typo, "inline.yaml").unwrap_err();
//! let message = errors.to_string();
//! assert!(message.contains("inline.yaml:6:14"), "{message}");
//! assert!(message.contains("did you mean `web`?"), "{message}");
//! ```
//!
//! Every problem is reported in one run, each with its location: unknown keys, values out of range,
//! references to clusters that do not exist, clashing addresses. Two kinds stop checking at the first
//! one, because nothing after them can be read reliably: a YAML syntax error, and a value of the
//! wrong kind (a list where one value belongs).
//!
//! Parsing is pure: [`load`] reads the one file it is given and [`parse`] reads nothing. Host names stay
//! names ([`BackendAddress::Name`]) for the binary's discovery to resolve, `workers: auto` stays
//! [`Workers::Auto`] for the binary to count cores, and certificate paths are checked when duet reads
//! them. So `duet check` gives the same answer on a laptop as inside the cluster the names live in.

#![warn(missing_docs)]

mod diff;
mod error;
mod model;
mod raw;
mod units;

pub use diff::{diff, Change};
pub use error::{ConfigError, ConfigErrors};
pub use model::{
    http_method, Backend, BackendAddress, Cluster, Config, HealthCheck, HostPattern, Limits,
    Listener, Location, OutlierDetection, Policy, Retries, Route, Shutdown, Timeouts, TlsFiles,
    Workers,
};

use error::did_you_mean;
use raw::{RawConfig, Scalar};
use serde_saphyr::Spanned;
use std::{collections::HashSet, net::SocketAddr, num::NonZeroUsize, path::Path, time::Duration};

/// Reads and checks the configuration file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        let mut error = ConfigError::new("", format!("cannot read the configuration file: {e}"));
        error.origin = origin.clone();
        ConfigErrors::single(error.hint("pass an existing YAML file with --config FILE"))
    })?;
    parse(&text, &origin)
}

/// Parses and checks configuration text; `origin` names it in errors (usually the file path) and
/// relative certificate paths are taken from its folder. Reads nothing and asks no resolver.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
    let finish = |mut errors: Vec<ConfigError>| {
        let lines: Vec<&str> = text.lines().collect();
        for error in &mut errors {
            error.origin = origin.to_owned();
            if error.line > 0 {
                error.source_line = lines.get(error.line as usize - 1).map(|l| l.to_string());
            }
        }
        errors.sort_by_key(|e| (e.line, e.column));
        ConfigErrors { errors }
    };
    // Syntax errors stop here, at the first one: nothing after it can be read reliably.
    let tree: raw::Node = serde_saphyr::from_str(text).map_err(|e| finish(vec![from_serde(&e)]))?;
    let mut errors: Vec<ConfigError> = raw::unknown_keys(&tree)
        .into_iter()
        .map(|unknown| {
            let word = unknown.key.value.as_str();
            let mut error = ConfigError::new(
                "",
                format!(
                    "unknown field `{word}`, expected one of {}",
                    unknown.expected.join(", ")
                ),
            )
            .at(
                unknown.key.referenced.line(),
                unknown.key.referenced.column(),
            );
            if let Some(hint) = did_you_mean(word, unknown.expected.iter().copied()) {
                error = error.hint(hint);
            }
            error
        })
        .collect();
    // A value of the wrong kind (a list where one value belongs) also stops serde at the first one.
    let raw: RawConfig = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            errors.push(from_serde(&e));
            return Err(finish(errors));
        }
    };
    let mut checker = Checker {
        errors: Vec::new(),
        base: Path::new(origin)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let config = checker.check(raw);
    checker.errors.append(&mut errors);
    if checker.errors.is_empty() {
        Ok(config)
    } else {
        Err(finish(checker.errors))
    }
}

fn from_serde(error: &serde_saphyr::Error) -> ConfigError {
    let rendered = error.to_string();
    let first = rendered.lines().next().unwrap_or_default();
    // "error: line 4 column 5: unknown field ..." → "unknown field ..."
    let message = first
        .strip_prefix("error: ")
        .unwrap_or(first)
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("line "))
        .map_or(first, |(_, rest)| rest);
    // Advice meant for the parser's API users, not for someone editing the file.
    let message = message
        .split(", set DuplicateKeyPolicy")
        .next()
        .unwrap_or(message)
        .replace("duplicate mapping key: ", "duplicate key: ")
        .to_owned();
    let mut out = ConfigError::new("", message.clone());
    if let Some(location) = error.location() {
        out = out.at(location.line(), location.column());
    }
    // "unknown field `wieght`, expected one of address, weight"
    if let Some(rest) = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))
    {
        if let Some((word, expected)) = rest.split_once("`, expected one of ") {
            if let Some(hint) = did_you_mean(word, expected.split(", ").map(str::trim)) {
                out = out.hint(hint);
            }
        } else if let Some((word, expected)) = rest.split_once("`, expected ") {
            if let Some(hint) = did_you_mean(word, [expected.trim_matches('`')]) {
                out = out.hint(hint);
            }
        }
    }
    out
}

struct Checker {
    errors: Vec<ConfigError>,
    /// The config file's folder, for relative paths.
    base: std::path::PathBuf,
}

impl Checker {
    fn error<T>(
        &mut self,
        spanned: &Spanned<T>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(field, message).at(spanned.referenced.line(), spanned.referenced.column())
    }

    fn push(&mut self, error: ConfigError) {
        self.errors.push(error);
    }

    fn duration(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: String,
        default: Duration,
    ) -> Duration {
        let Some(value) = value else { return default };
        match units::parse_duration(&value.value.0) {
            Ok(d) => d,
            Err(message) => {
                let e = self.error(value, field, message);
                self.push(e);
                default
            }
        }
    }

    fn size(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &str,
        default: usize,
        min: usize,
    ) -> usize {
        let Some(value) = value else { return default };
        match units::parse_size(&value.value.0).map(|s| usize::try_from(s).unwrap_or(usize::MAX)) {
            Ok(s) if s >= min => s,
            Ok(s) => {
                let e = self.error(
                    value,
                    field,
                    format!("{s} bytes is too small: the minimum is {min}"),
                );
                self.push(e);
                default
            }
            Err(message) => {
                let e = self.error(value, field, message);
                self.push(e);
                default
            }
        }
    }

    /// `50%` or `50`: a percentage from 0 to 100, returned as a fraction.
    fn percent(&mut self, value: Option<&Spanned<Scalar>>, field: String, default: f64) -> f64 {
        let Some(value) = value else { return default };
        let text = value.value.0.trim();
        match text.trim_end_matches('%').trim().parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => p / 100.0,
            _ => {
                let e = self.error(value, field, format!("`{text}` is not a percentage: expected a number from 0 to 100, such as `50%`"));
                self.push(e);
                default
            }
        }
    }

    fn count(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: String,
        default: u32,
        min: u32,
        max: u32,
    ) -> u32 {
        let Some(value) = value else { return default };
        let text = value.value.0.trim();
        match text.parse::<u32>() {
            Ok(count) if (min..=max).contains(&count) => count,
            Ok(_) => {
                let e = self.error(
                    value,
                    field,
                    format!("{text} is out of range: expected {min} to {max}"),
                );
                self.push(e);
                default
            }
            Err(_) => {
                let e = self.error(
                    value,
                    field,
                    format!("`{text}` is not a whole number: expected {min} to {max}"),
                );
                self.push(e);
                default
            }
        }
    }

    fn policy(&mut self, value: Option<&Spanned<Scalar>>, cluster: usize) -> Policy {
        let Some(value) = value else {
            return Policy::default();
        };
        let text = value.value.0.trim();
        let all = [
            Policy::P2cInflight,
            Policy::P2cPeakEwma,
            Policy::RoundRobin,
            Policy::Random,
        ];
        if let Some(policy) = all.into_iter().find(|p| p.name() == text) {
            return policy;
        }
        let names = all.map(Policy::name);
        let mut e = self.error(
            value,
            format!("clusters[{cluster}].policy"),
            format!(
                "`{text}` is not a policy: expected one of {}",
                names.join(", ")
            ),
        );
        if let Some(hint) = did_you_mean(text, names) {
            e = e.hint(hint);
        }
        self.push(e);
        Policy::default()
    }

    fn statuses(&mut self, values: &[Spanned<Scalar>], field: &str) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        for (i, value) in values.iter().enumerate() {
            let text = value.value.0.trim();
            let parsed = match text.split_once('-') {
                Some((low, high)) => low
                    .trim()
                    .parse::<u16>()
                    .ok()
                    .zip(high.trim().parse::<u16>().ok()),
                None => text.parse::<u16>().ok().map(|code| (code, code)),
            };
            match parsed {
                Some((low, high))
                    if (100..=599).contains(&low) && (100..=599).contains(&high) && low <= high =>
                {
                    out.push((low, high))
                }
                _ => {
                    let e = self.error(value, format!("{field}[{i}]"), format!("`{text}` is not a status or range: expected a code from 100 to 599, or a range such as `200-399`"));
                    self.push(e);
                }
            }
        }
        out
    }

    /// A path relative to the config file's folder (read when duet starts, not here).
    fn path(&self, value: &Spanned<Scalar>) -> (std::path::PathBuf, Location) {
        let at = Location {
            line: value.referenced.line(),
            column: value.referenced.column(),
        };
        (self.base.join(&value.value.0), at)
    }

    fn check(&mut self, raw: RawConfig) -> Config {
        let workers = match &raw.workers {
            None => Workers::Auto,
            Some(w) if w.value.0 == "auto" => Workers::Auto,
            Some(w) => {
                match w.value.0.parse::<usize>().ok().and_then(NonZeroUsize::new) {
                    Some(n) => Workers::Count(n),
                    None => {
                        let e = self
                        .error(w, "workers", format!("`{}` is not a worker count: expected `auto` or a number of 1 or more", w.value.0));
                        self.push(e);
                        Workers::Auto
                    }
                }
            }
        };

        let mut listeners = Vec::new();
        let mut seen: Vec<SocketAddr> = Vec::new();
        for (i, l) in raw.listeners.iter().enumerate() {
            let field = format!("listeners[{i}].address");
            match l.address.value.0.parse::<SocketAddr>() {
                Ok(address) => {
                    if let Some(other) = seen.iter().find(|other| clash(**other, address)) {
                        let e = if *other == address {
                            self.error(&l.address, field, format!("{address} is listed twice"))
                        } else {
                            self.error(
                                &l.address,
                                field,
                                format!(
                                    "{address} overlaps {other}: both would take the same port"
                                ),
                            )
                        };
                        self.push(e);
                    }
                    seen.push(address);
                    let tls = l.tls.as_ref().map(|tls| {
                        let ((cert, cert_at), (key, key_at)) =
                            (self.path(&tls.cert), self.path(&tls.key));
                        TlsFiles {
                            cert,
                            key,
                            cert_at,
                            key_at,
                        }
                    });
                    let trusted_proxies = l
                        .trusted_proxies
                        .iter()
                        .enumerate()
                        .filter_map(|(ti, net)| {
                            let text = net.value.0.trim();
                            let parsed = text.parse::<ipnet::IpNet>().ok().or_else(|| {
                                text.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from)
                            });
                            if parsed.is_none() {
                                let e = self.error(
                                    net,
                                    format!("listeners[{i}].trusted_proxies[{ti}]"),
                                    format!("`{text}` is not an address or network: expected an IP such as 10.0.0.7 or a CIDR such as 10.0.0.0/8"),
                                );
                                self.push(e);
                            }
                            parsed
                        })
                        .collect();
                    listeners.push(Listener {
                        address,
                        tls,
                        trusted_proxies,
                    });
                }
                Err(_) => {
                    let e = self.error(
                        &l.address,
                        field,
                        format!(
                            "`{}` is not a listen address: expected IP:PORT such as 0.0.0.0:8080",
                            l.address.value.0
                        ),
                    );
                    self.push(e);
                }
            }
        }
        if raw.listeners.is_empty() {
            self.push(
                ConfigError::new(
                    "listeners",
                    "no listeners: duet would accept no connections",
                )
                .hint("add `listeners: [{ address: 0.0.0.0:8080 }]`"),
            );
        }

        let mut clusters = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (ci, c) in raw.clusters.iter().enumerate() {
            let name = c.name.value.0.clone();
            if name.is_empty() {
                let e = self.error(
                    &c.name,
                    format!("clusters[{ci}].name"),
                    "a cluster name cannot be empty",
                );
                self.push(e);
            } else if names.contains(&name) {
                let e = self.error(
                    &c.name,
                    format!("clusters[{ci}].name"),
                    format!("cluster `{name}` is defined twice"),
                );
                self.push(e.hint("cluster names must be unique; rename one of them"));
            }
            names.push(name.clone());
            let mut backends = Vec::new();
            let mut seen = HashSet::new();
            for (bi, b) in c.backends.iter().enumerate() {
                let field = format!("clusters[{ci}].backends[{bi}]");
                let text = b.address.value.0.clone();
                let weight =
                    self.count(b.weight.as_ref(), format!("{field}.weight"), 1, 0, u32::MAX);
                if let Some(w) = &b.weight {
                    if weight > 10_000 {
                        let e = self.error(
                            w,
                            format!("{field}.weight"),
                            format!("weight {weight} is too large: the maximum is 10000"),
                        );
                        self.push(e);
                    }
                }
                match backend_address(&text) {
                    Ok(address) => {
                        if !seen.insert(address.clone()) {
                            let e = self.error(
                                &b.address,
                                format!("{field}.address"),
                                format!("backend {text} is listed twice in cluster `{name}`"),
                            );
                            self.push(
                                e.hint("give it a higher weight instead of listing it twice"),
                            );
                        } else {
                            backends.push(Backend { address, weight });
                        }
                    }
                    Err(message) => {
                        let e = self.error(&b.address, format!("{field}.address"), message);
                        self.push(e);
                    }
                }
            }
            if c.backends.is_empty() {
                let e = self.error(
                    &c.name,
                    format!("clusters[{ci}].backends"),
                    format!("cluster `{name}` has no backends"),
                );
                self.push(e.hint("add `backends: [{ address: IP:PORT }]`"));
            } else if !backends.is_empty() && backends.iter().all(|b| b.weight == 0) {
                let e = self.error(
                    &c.name,
                    format!("clusters[{ci}].backends"),
                    format!(
                        "every backend of cluster `{name}` has weight 0, so it can serve nothing"
                    ),
                );
                self.push(e);
            }
            let t = c.timeouts.as_ref();
            let defaults = Timeouts::default();
            let timeouts = Timeouts {
                connect: self.duration(
                    t.and_then(|t| t.connect.as_ref()),
                    format!("clusters[{ci}].timeouts.connect"),
                    defaults.connect,
                ),
                response_headers: self.duration(
                    t.and_then(|t| t.response_headers.as_ref()),
                    format!("clusters[{ci}].timeouts.response_headers"),
                    defaults.response_headers,
                ),
                idle: self.duration(
                    t.and_then(|t| t.idle.as_ref()),
                    format!("clusters[{ci}].timeouts.idle"),
                    defaults.idle,
                ),
                read: self.duration(
                    t.and_then(|t| t.read.as_ref()),
                    format!("clusters[{ci}].timeouts.read"),
                    defaults.read,
                ),
                tunnel_idle: self.duration(
                    t.and_then(|t| t.tunnel_idle.as_ref()),
                    format!("clusters[{ci}].timeouts.tunnel_idle"),
                    defaults.tunnel_idle,
                ),
            };
            let health_check = c.health_check.as_ref().map(|h| {
                let d = HealthCheck::default();
                let path = match &h.path {
                    None => d.path.clone(),
                    Some(p) if p.value.0.starts_with('/') => p.value.0.clone(),
                    Some(p) => {
                        let e = self.error(
                            p,
                            format!("clusters[{ci}].health_check.path"),
                            format!("`{}` must start with `/`", p.value.0),
                        );
                        self.push(e);
                        d.path.clone()
                    }
                };
                let check = HealthCheck {
                    path,
                    interval: self.duration(
                        h.interval.as_ref(),
                        format!("clusters[{ci}].health_check.interval"),
                        d.interval,
                    ),
                    timeout: self.duration(
                        h.timeout.as_ref(),
                        format!("clusters[{ci}].health_check.timeout"),
                        d.timeout,
                    ),
                    healthy_threshold: self.count(
                        h.healthy_threshold.as_ref(),
                        format!("clusters[{ci}].health_check.healthy_threshold"),
                        d.healthy_threshold,
                        1,
                        100,
                    ),
                    unhealthy_threshold: self.count(
                        h.unhealthy_threshold.as_ref(),
                        format!("clusters[{ci}].health_check.unhealthy_threshold"),
                        d.unhealthy_threshold,
                        1,
                        100,
                    ),
                    expected_statuses: match &h.expected_statuses {
                        Some(list) => self.statuses(
                            list,
                            &format!("clusters[{ci}].health_check.expected_statuses"),
                        ),
                        None => d.expected_statuses.clone(),
                    },
                };
                if check.interval.is_zero() {
                    if let Some(i) = &h.interval {
                        let e = self.error(
                            i,
                            format!("clusters[{ci}].health_check.interval"),
                            "the interval must be more than 0",
                        );
                        self.push(e);
                    }
                }
                check
            });
            let o = c.outlier_detection.as_ref();
            let od = OutlierDetection::default();
            let outlier_detection = OutlierDetection {
                consecutive_failures: self.count(
                    o.and_then(|o| o.consecutive_failures.as_ref()),
                    format!("clusters[{ci}].outlier_detection.consecutive_failures"),
                    od.consecutive_failures,
                    0,
                    1000,
                ),
                base_ejection_time: self.duration(
                    o.and_then(|o| o.base_ejection_time.as_ref()),
                    format!("clusters[{ci}].outlier_detection.base_ejection_time"),
                    od.base_ejection_time,
                ),
                max_ejection_time: self.duration(
                    o.and_then(|o| o.max_ejection_time.as_ref()),
                    format!("clusters[{ci}].outlier_detection.max_ejection_time"),
                    od.max_ejection_time,
                ),
                max_ejection_fraction: self.percent(
                    o.and_then(|o| o.max_ejection_percent.as_ref()),
                    format!("clusters[{ci}].outlier_detection.max_ejection_percent"),
                    od.max_ejection_fraction,
                ),
            };
            let r = c.retries.as_ref();
            let rd = Retries::default();
            let retries = Retries {
                attempts: self.count(
                    r.and_then(|r| r.attempts.as_ref()),
                    format!("clusters[{ci}].retries.attempts"),
                    rd.attempts,
                    1,
                    10,
                ),
                budget_fraction: self.percent(
                    r.and_then(|r| r.budget_percent.as_ref()),
                    format!("clusters[{ci}].retries.budget_percent"),
                    rd.budget_fraction,
                ),
                min_retries_per_second: self.count(
                    r.and_then(|r| r.min_retries_per_second.as_ref()),
                    format!("clusters[{ci}].retries.min_retries_per_second"),
                    rd.min_retries_per_second,
                    0,
                    100_000,
                ),
                replay_body_limit: self.size(
                    r.and_then(|r| r.replay_body_limit.as_ref()),
                    "retries.replay_body_limit",
                    rd.replay_body_limit,
                    0,
                ),
            };
            let penalty_statuses = match &c.penalty_statuses {
                Some(list) => self
                    .statuses(list, &format!("clusters[{ci}].penalty_statuses"))
                    .into_iter()
                    .flat_map(|(low, high)| low..=high)
                    .collect(),
                None => vec![429, 503],
            };
            clusters.push(Cluster {
                name,
                policy: self.policy(c.policy.as_ref(), ci),
                backends,
                timeouts,
                health_check,
                outlier_detection,
                retries,
                panic_threshold: self.percent(
                    c.panic_threshold.as_ref(),
                    format!("clusters[{ci}].panic_threshold"),
                    0.5,
                ),
                dns_refresh: self.duration(
                    c.dns_refresh.as_ref(),
                    format!("clusters[{ci}].dns_refresh"),
                    Duration::from_secs(30),
                ),
                slow_start: self.duration(
                    c.slow_start.as_ref(),
                    format!("clusters[{ci}].slow_start"),
                    Duration::ZERO,
                ),
                penalty_statuses,
            });
        }

        let mut routes = Vec::new();
        let mut route_names: Vec<String> = Vec::new();
        for (ri, r) in raw.routes.iter().enumerate() {
            let wanted = &r.cluster.value.0;
            let cluster = names.iter().position(|n| n == wanted);
            if cluster.is_none() {
                let mut e = self.error(
                    &r.cluster,
                    format!("routes[{ri}].cluster"),
                    format!("no cluster is named `{wanted}`"),
                );
                e = match did_you_mean(wanted, names.iter().map(String::as_str)) {
                    Some(hint) => e.hint(hint),
                    None if names.is_empty() => e.hint("define it under `clusters:`"),
                    None => e.hint(format!("defined clusters: {}", names.join(", "))),
                };
                self.push(e);
            }
            let matcher = r.matcher.as_ref();
            let host = matcher.and_then(|m| m.host.as_ref()).and_then(|h| {
                let text = h.value.0.trim().to_ascii_lowercase();
                let pattern = match text.strip_prefix('*') {
                    Some(suffix) if suffix.starts_with('.') && suffix.len() > 1 && !suffix.contains('*') => {
                        Some(HostPattern::Wildcard(suffix.to_owned()))
                    }
                    None if !text.is_empty() && !text.contains('*') && !text.contains('/') => Some(HostPattern::Exact(text.clone())),
                    _ => None,
                };
                if pattern.is_none() {
                    let e = self.error(h, format!("routes[{ri}].match.host"), format!("`{}` is not a host pattern: expected a name such as api.example.com, or *.example.com for its subdomains", h.value.0));
                    self.push(e);
                }
                pattern
            });
            let path_prefix = match matcher.and_then(|m| m.path_prefix.as_ref()) {
                None => "/".to_owned(),
                Some(p) if p.value.0.starts_with('/') => p.value.0.clone(),
                Some(p) => {
                    let e = self.error(
                        p,
                        format!("routes[{ri}].match.path_prefix"),
                        format!("`{}` must start with `/`", p.value.0),
                    );
                    self.push(e.hint(format!("did you mean `/{}`?", p.value.0)));
                    "/".to_owned()
                }
            };
            let retry_methods = match &r.retry_methods {
                None => http_method::idempotent(),
                Some(list) => list
                    .iter()
                    .enumerate()
                    .filter_map(|(mi, m)| {
                        let method = m.value.0.trim().to_ascii_uppercase();
                        if !method.is_empty()
                            && method.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-')
                        {
                            Some(method)
                        } else {
                            let e = self.error(
                                m,
                                format!("routes[{ri}].retry_methods[{mi}]"),
                                format!("`{}` is not an HTTP method", m.value.0),
                            );
                            self.push(e);
                            None
                        }
                    })
                    .collect(),
            };
            let timeout = r
                .timeout
                .as_ref()
                .map(|t| self.duration(Some(t), format!("routes[{ri}].timeout"), Duration::ZERO));
            let name = match &r.name {
                Some(given) => {
                    let text = given.value.0.trim().to_owned();
                    if text.is_empty() {
                        let e = self.error(
                            given,
                            format!("routes[{ri}].name"),
                            "a route name cannot be empty",
                        );
                        self.push(e);
                    } else if route_names.contains(&text) {
                        let e = self.error(
                            given,
                            format!("routes[{ri}].name"),
                            format!("route `{text}` is named twice"),
                        );
                        self.push(e.hint("route names label metrics: make them unique"));
                    }
                    text
                }
                None => {
                    let host = match &host {
                        None => "*".to_owned(),
                        Some(HostPattern::Exact(h)) => h.clone(),
                        Some(HostPattern::Wildcard(suffix)) => format!("*{suffix}"),
                    };
                    let mut derived = format!("{host}{path_prefix}");
                    if route_names.contains(&derived) {
                        derived = format!("{derived}#{ri}");
                    }
                    derived
                }
            };
            route_names.push(name.clone());
            if let Some(cluster) = cluster {
                routes.push(Route {
                    name,
                    host,
                    path_prefix,
                    cluster,
                    retry_methods,
                    timeout: timeout.filter(|t| !t.is_zero()),
                });
            }
        }
        if raw.routes.is_empty() {
            self.push(
                ConfigError::new("routes", "no routes: every request would get 404")
                    .hint("add `routes: [{ match: { path_prefix: / }, cluster: NAME }]`"),
            );
        }

        let l = raw.limits.as_ref();
        let defaults = Limits::default();
        let limits = Limits {
            max_request_head: self.size(
                l.and_then(|l| l.max_request_head.as_ref()),
                "limits.max_request_head",
                defaults.max_request_head,
                8192,
            ),
            max_uri_length: self.size(
                l.and_then(|l| l.max_uri_length.as_ref()),
                "limits.max_uri_length",
                defaults.max_uri_length,
                64,
            ),
            header_read_timeout: self.duration(
                l.and_then(|l| l.header_read_timeout.as_ref()),
                "limits.header_read_timeout".to_owned(),
                defaults.header_read_timeout,
            ),
            body_read_timeout: self.duration(
                l.and_then(|l| l.body_read_timeout.as_ref()),
                "limits.body_read_timeout".to_owned(),
                defaults.body_read_timeout,
            ),
            send_timeout: self.duration(
                l.and_then(|l| l.send_timeout.as_ref()),
                "limits.send_timeout".to_owned(),
                defaults.send_timeout,
            ),
            max_connections: self.count(
                l.and_then(|l| l.max_connections.as_ref()),
                "limits.max_connections".to_owned(),
                defaults.max_connections as u32,
                1,
                10_000_000,
            ) as usize,
            keepalive_timeout: self.duration(
                l.and_then(|l| l.keepalive_timeout.as_ref()),
                "limits.keepalive_timeout".to_owned(),
                defaults.keepalive_timeout,
            ),
            keepalive_requests: u64::from(self.count(
                l.and_then(|l| l.keepalive_requests.as_ref()),
                "limits.keepalive_requests".to_owned(),
                defaults.keepalive_requests as u32,
                1,
                u32::MAX,
            )),
        };
        let shutdown = Shutdown {
            drain_timeout: self.duration(
                raw.shutdown.as_ref().and_then(|s| s.drain_timeout.as_ref()),
                "shutdown.drain_timeout".to_owned(),
                Shutdown::default().drain_timeout,
            ),
            drain_delay: self.duration(
                raw.shutdown.as_ref().and_then(|s| s.drain_delay.as_ref()),
                "shutdown.drain_delay".to_owned(),
                Shutdown::default().drain_delay,
            ),
        };
        let admin =
            raw.admin
                .as_ref()
                .and_then(|a| match a.address.value.0.parse::<SocketAddr>() {
                    Ok(address) => {
                        if let Some(listener) = listeners.iter().find(|l| clash(l.address, address)) {
                            let e = self.error(
                                &a.address,
                                "admin.address",
                                format!(
                                    "{address} is also a traffic listener's ({}): the admin listener needs a port of its own",
                                    listener.address
                                ),
                            )
                            .hint("the usual admin port is 9901");
                            self.push(e);
                        }
                        Some(address)
                    }
                    Err(_) => {
                        let e = self.error(
                            &a.address,
                            "admin.address",
                            format!(
                            "`{}` is not a listen address: expected IP:PORT such as 127.0.0.1:9901",
                            a.address.value.0
                        ),
                        );
                        self.push(e);
                        None
                    }
                });
        Config {
            workers,
            listeners,
            routes,
            clusters,
            limits,
            shutdown,
            admin,
        }
    }
}

/// Whether two listen addresses would take the same port: the same port (not 0, which the system
/// picks) on the same IP, or on any IP when either is a wildcard (`0.0.0.0`, `[::]`).
fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `IP:PORT` or `HOST:PORT`, checked for form only: names are resolved by the binary's discovery.
fn backend_address(text: &str) -> Result<BackendAddress, String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(BackendAddress::Ip(address));
    }
    let expected = "expected IP:PORT or HOST:PORT such as 127.0.0.1:9001 or api.internal:80";
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("`{text}` is not a backend address: {expected}"));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(format!(
            "`{text}` has no valid port: expected IP:PORT or HOST:PORT with a port from 1 to 65535"
        ));
    };
    // RFC 1123 host names: letters, digits, hyphens and dots (and `_`, which DNS-SD names use).
    let valid_host = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|label| !label.is_empty() && label.len() <= 63)
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !valid_host {
        return Err(format!("`{text}` is not a backend address: {expected}"));
    }
    Ok(BackendAddress::Name {
        host: host.to_ascii_lowercase(),
        port,
    })
}
