//! `duet check`: validate a configuration file offline and print a summary.

use crate::{
    control::discovery::{system_resolver, Resolver},
    server::worker_count,
};

/// Validates the file offline (nothing but the file and the certificates it names is read); with
/// `resolve`, also looks up each backend host name and says which do not resolve from here.
pub(super) fn check(path: &std::path::Path, resolve: bool, old: Option<&std::path::Path>) -> i32 {
    let config = match duet_config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return 1;
        }
    };
    // Certificates are parsed too, as `run` would.
    let mut tls_errors = listener_tls_findings(path, &config);
    tls_errors.extend(upstream_tls_errors(path, &config));
    if !tls_errors.is_empty() {
        eprintln!("{}", tls_errors.join("\n"));
        return 1;
    }
    warn_unverified(path, &config);
    for warning in duet_config::warnings(&config) {
        eprintln!("{}:{warning}", path.display());
    }
    // Dead routes are mistakes to fix, not errors: the file still runs as written.
    for shadowed in duet_config::shadowed_routes(&config) {
        eprintln!("warning: {}: {shadowed}", path.display());
    }
    let resolver = resolve.then(system_resolver);
    // A closed stdout (`duet check ... | head`) is not an error worth a panic.
    use std::io::Write;
    let mut out = summary(path, &config, resolver.as_ref());
    if let Some(old_path) = old {
        let old_config = match duet_config::load(old_path) {
            Ok(config) => config,
            Err(errors) => {
                eprintln!("{errors}");
                return 1;
            }
        };
        let changes = duet_config::diff(&old_config, &config);
        if changes.is_empty() {
            out.push_str(&format!("no changes from {}\n", old_path.display()));
        } else {
            out.push_str(&format!(
                "{} change{} from {} (a reload applies them between requests):\n",
                changes.len(),
                if changes.len() == 1 { "" } else { "s" },
                old_path.display()
            ));
            for change in &changes {
                out.push_str(&format!("  {change}\n"));
            }
        }
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    0
}

/// Each listener's certificate or key that cannot be used, as `run` would refuse them; what may be
/// served but deserves a look (a name two certificates cover, expiry) is printed as a warning.
fn listener_tls_findings(path: &std::path::Path, config: &duet_config::Config) -> Vec<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut errors = Vec::new();
    for (i, listener) in config.listeners.iter().enumerate() {
        let Some(tls) = &listener.tls else { continue };
        let loaded = match crate::tls::load(tls) {
            Ok(loaded) => loaded,
            Err(e) => {
                let (at, field) = (e.at, &e.field);
                errors.push(format!(
                    "{}:{at}: listeners[{i}].tls.{field}: {e}",
                    path.display()
                ));
                continue;
            }
        };
        let listed = tls.certificates.len() > 1;
        for (j, warning) in crate::tls::warnings(&loaded, now) {
            let at = tls.certificates.get(j).map_or(tls.at, |c| c.cert_at);
            let field = if listed {
                format!("certificates[{j}].cert")
            } else {
                "cert".to_owned()
            };
            eprintln!(
                "{}:{at}: warning: listeners[{i}].tls.{field}: {warning}",
                path.display()
            );
        }
    }
    errors
}

/// Each cluster's `tls:` files that cannot be used, as `run` would refuse them.
fn upstream_tls_errors(path: &std::path::Path, config: &duet_config::Config) -> Vec<String> {
    let clusters = config.clusters.iter().enumerate();
    clusters
        .filter_map(|(i, c)| Some((i, duet_proxy::check_upstream_tls(c.tls.as_ref()?).err()?)))
        .map(|(i, e)| {
            format!(
                "{}:{}: clusters[{i}].tls.{}: {e}",
                path.display(),
                e.at,
                e.field
            )
        })
        .collect()
}

/// `verify: false` is valid, but encrypts without authenticating: said on stderr, not an error.
fn warn_unverified(path: &std::path::Path, config: &duet_config::Config) {
    for (i, cluster) in config.clusters.iter().enumerate() {
        let Some(tls) = cluster.tls.as_ref().filter(|tls| !tls.verify) else {
            continue;
        };
        eprintln!(
            "{}:{}: warning: clusters[{i}].tls.verify: false: cluster `{}` accepts any certificate \
             from its backends (encrypted, not authenticated: anyone on the path can pose as them)",
            path.display(),
            tls.at,
            cluster.name
        );
    }
}

/// Logs each route that can never match, when duet loads or reloads `config` from `path`.
pub(super) fn log_shadowed(path: &std::path::Path, config: &duet_config::Config) {
    for shadowed in duet_config::shadowed_routes(config) {
        tracing::warn!("{}: {shadowed}", path.display());
    }
}

fn summary(
    path: &std::path::Path,
    config: &duet_config::Config,
    resolver: Option<&Resolver>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{}: ok", path.display());
    let workers = worker_count(config.workers);
    let _ = match config.workers {
        duet_config::Workers::Auto => writeln!(out, "  workers: {workers} (auto: one per CPU)"),
        duet_config::Workers::Count(_) => writeln!(out, "  workers: {workers}"),
    };
    for listener in &config.listeners {
        let _ = match &listener.name {
            Some(name) => writeln!(out, "  listener {} ({name})", listener.address),
            None => writeln!(out, "  listener {}", listener.address),
        };
    }
    for route in &config.routes {
        let _ = writeln!(out, "{}", route_line(config, route));
    }
    let mut unresolved = Vec::new();
    for cluster in &config.clusters {
        let checks = match &cluster.health_check {
            Some(check) => format!("health checks {} every {:?}", check.path, check.interval),
            None => "no health checks".to_owned(),
        };
        let _ = writeln!(
            out,
            "  cluster {} policy {} backends {}, {checks}, {} attempts",
            cluster.name,
            cluster.policy.name(),
            cluster.backends.len(),
            cluster.retries.attempts
        );
        for backend in &cluster.backends {
            let (resolved, found) = lookup(&backend.address, resolver);
            if !found {
                unresolved.push(backend.address.to_string());
            }
            let _ = writeln!(
                out,
                "    {} weight {}{resolved}",
                backend.address, backend.weight
            );
        }
    }
    if !unresolved.is_empty() {
        let _ = writeln!(
            out,
            "  not resolved from here: {} (duet runs anyway: those endpoints stay empty, 503, until they resolve)",
            unresolved.join(", ")
        );
    }
    out
}

/// `  route NAME host H path P [conditions] -> TARGET [(only on ...)] [filters]`.
fn route_line(config: &duet_config::Config, route: &duet_config::Route) -> String {
    let host = match &route.host {
        None => "*".to_owned(),
        Some(duet_config::HostPattern::Exact(h)) => h.clone(),
        Some(duet_config::HostPattern::Wildcard(s)) => format!("*{s}"),
    };
    let only_on = route.listeners.as_ref().map_or_else(String::new, |only| {
        let named: Vec<String> = only
            .iter()
            .filter_map(|&i| config.listeners.get(i))
            .map(|l| l.name.clone().unwrap_or_else(|| l.address.to_string()))
            .collect();
        format!(" (only on {})", named.join(", "))
    });
    format!(
        "  route {} host {host} path {}{} -> {}{only_on}{}",
        route.name,
        route.path,
        route.conditions(),
        route.target(&config.clusters),
        route.describe_filters()
    )
}

/// What `check` says about a backend's address, and whether it resolved (IP addresses and names not
/// looked up count as found).
fn lookup(address: &duet_config::BackendAddress, resolver: Option<&Resolver>) -> (String, bool) {
    use duet_config::BackendAddress;
    match (address, resolver) {
        (BackendAddress::Ip(_), _) => (String::new(), true),
        (BackendAddress::Name { .. }, None) => (
            " (host name: resolved when duet runs; --resolve looks it up now)".to_owned(),
            true,
        ),
        (BackendAddress::Name { .. }, Some(resolver)) => match resolver(&address.to_string()) {
            Ok(addresses) if !addresses.is_empty() => {
                let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
                (format!(" -> {}", list.join(", ")), true)
            }
            Ok(_) => (" -> does not resolve: no address".to_owned(), false),
            Err(error) => (format!(" -> does not resolve: {error}"), false),
        },
    }
}
