//! `clusters:`: unique names, backends that can be reached and serve, and each cluster's settings.

use super::{cluster_settings, hash, settings, sticky, upstream_tls};
use crate::{
    checker::Checker,
    error::did_you_mean,
    field::Field,
    model::{
        Backend, BackendAddress, Cluster, Http2Windows, Policy, SendProxyProtocol, UpstreamProtocol,
    },
    raw::{RawBackend, RawCluster, Scalar},
};
use serde_saphyr::Spanned;
use std::{collections::HashSet, time::Duration};

/// The clusters, and every name as written (an empty or repeated one included), in order: routes
/// refer to a cluster by its position in that list.
pub(super) fn clusters(checker: &mut Checker, raw: &[RawCluster]) -> (Vec<Cluster>, Vec<String>) {
    let mut clusters = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let list = Field::root("clusters");
    for (ci, c) in raw.iter().enumerate() {
        let field = list.index(ci);
        let name = c.name.value.0.clone();
        if name.is_empty() {
            checker.reject(&c.name, field.key("name"), "a cluster name cannot be empty");
        } else if names.contains(&name) {
            let e = checker.error(
                &c.name,
                field.key("name"),
                format!("cluster `{name}` is defined twice"),
            );
            checker.push(e.hint("cluster names must be unique; rename one of them"));
        }
        names.push(name.clone());
        clusters.push(cluster(checker, c, &field, name));
    }
    (clusters, names)
}

fn cluster(checker: &mut Checker, c: &RawCluster, field: &Field, name: String) -> Cluster {
    let backends = backends(checker, c, field, &name);
    let timeouts = cluster_settings::timeouts(checker, c.timeouts.as_ref(), field);
    let health_check = c
        .health_check
        .as_ref()
        .map(|h| cluster_settings::health_check(checker, h, field));
    let outlier_detection =
        cluster_settings::outlier_detection(checker, c.outlier_detection.as_ref(), field);
    let retries = cluster_settings::retries(checker, c.retries.as_ref(), field);
    let penalty_statuses = match &c.penalty_statuses {
        Some(list) => checker
            .statuses(list, &field.key("penalty_statuses"))
            .into_iter()
            .flat_map(|(low, high)| low..=high)
            .collect(),
        None => vec![429, 503],
    };
    let tls = c
        .tls
        .as_ref()
        .map(|tls| upstream_tls::upstream_tls(checker, tls, field, &backends));
    let protocol = upstream_protocol(checker, c.protocol.as_ref(), &field.key("protocol"));
    let http2 = http2(checker, c, field, protocol);
    let policy = policy(checker, c.policy.as_ref(), &field.key("policy"));
    let send_proxy_protocol = c
        .send_proxy_protocol
        .as_ref()
        .and_then(|value| send_proxy_protocol(checker, value, field, protocol));
    Cluster {
        name,
        hash: hash::hash(checker, c, field, policy),
        policy,
        protocol,
        backends,
        timeouts,
        health_check,
        outlier_detection,
        retries,
        panic_threshold: checker.percent(
            c.panic_threshold.as_ref(),
            &field.key("panic_threshold"),
            0.5,
        ),
        dns_refresh: checker.duration(
            c.dns_refresh.as_ref(),
            &field.key("dns_refresh"),
            Duration::from_secs(30),
        ),
        slow_start: checker.duration(
            c.slow_start.as_ref(),
            &field.key("slow_start"),
            Duration::ZERO,
        ),
        penalty_statuses,
        tls,
        http2,
        send_proxy_protocol,
        sticky: c
            .sticky
            .as_ref()
            .map(|raw| sticky::sticky(checker, raw, &field.key("sticky"))),
    }
}

/// `v1` or `v2`, on an HTTP/1.1 cluster: an HTTP/2 connection carries many clients' streams, and a
/// PROXY header names one.
fn send_proxy_protocol(
    checker: &mut Checker,
    value: &Spanned<Scalar>,
    cluster: &Field,
    protocol: UpstreamProtocol,
) -> Option<SendProxyProtocol> {
    let field = cluster.key("send_proxy_protocol");
    let text = value.value.0.trim();
    let all = [SendProxyProtocol::V1, SendProxyProtocol::V2];
    let Some(version) = all.into_iter().find(|v| v.name() == text) else {
        let message =
            format!("`{text}` is not a PROXY protocol version to send: expected v1 or v2");
        checker.reject(value, &field, message);
        return None;
    };
    if protocol == UpstreamProtocol::H2 {
        let message = "a PROXY header names one client, but an HTTP/2 connection carries many \
                       clients' requests";
        let e = checker.error(value, &field, message);
        checker.push(e.hint("use `protocol: http1` for backends that read the PROXY protocol"));
    }
    Some(version)
}

/// The windows of a `protocol: h2` cluster's connections; `http2:` on any other cluster would set
/// nothing, so it is refused rather than ignored.
fn http2(
    checker: &mut Checker,
    c: &RawCluster,
    field: &Field,
    protocol: UpstreamProtocol,
) -> Http2Windows {
    let Some(raw) = &c.http2 else {
        return Http2Windows::BACKEND;
    };
    let field = field.key("http2");
    if protocol != UpstreamProtocol::H2 {
        let message = "sets HTTP/2 windows, but this cluster speaks HTTP/1.1 to its backends: \
                       add `protocol: h2` or remove `http2`"
            .to_owned();
        checker.reject(raw, &field, message);
    }
    let h = &raw.value;
    let written = [
        h.initial_stream_window_size.as_ref(),
        h.initial_connection_window_size.as_ref(),
        h.adaptive_window.as_ref(),
    ];
    settings::windows(checker, Some(written), &field, Http2Windows::BACKEND)
}

/// The backends, each listed once, at least one of them with a weight above 0.
fn backends(checker: &mut Checker, c: &RawCluster, cluster: &Field, name: &str) -> Vec<Backend> {
    let mut backends = Vec::new();
    let mut seen = HashSet::new();
    let list = cluster.key("backends");
    for (bi, b) in c.backends.iter().enumerate() {
        let field = list.index(bi);
        if let Some(backend) = backend(checker, b, &field) {
            if seen.insert(backend.address.clone()) {
                backends.push(backend);
            } else {
                let text = &b.address.value.0;
                let message = format!("backend {text} is listed twice in cluster `{name}`");
                let e = checker.error(&b.address, field.key("address"), message);
                checker.push(e.hint("give it a higher weight instead of listing it twice"));
            }
        }
    }
    if c.backends.is_empty() {
        let e = checker.error(&c.name, &list, format!("cluster `{name}` has no backends"));
        checker.push(e.hint("add `backends: [{ address: IP:PORT }]`"));
    } else if !backends.is_empty() && backends.iter().all(|b| b.weight == 0) {
        let message =
            format!("every backend of cluster `{name}` has weight 0, so it can serve nothing");
        checker.reject(&c.name, &list, message);
    }
    backends
}

fn backend(checker: &mut Checker, b: &RawBackend, field: &Field) -> Option<Backend> {
    let weight_field = field.key("weight");
    let weight = checker.count(b.weight.as_ref(), &weight_field, 1, (0, u32::MAX));
    if let Some(w) = &b.weight {
        if weight > 10_000 {
            let message = format!("weight {weight} is too large: the maximum is 10000");
            checker.reject(w, weight_field, message);
        }
    }
    match backend_address(&b.address.value.0) {
        Ok(address) => Some(Backend { address, weight }),
        Err(message) => {
            checker.reject(&b.address, field.key("address"), message);
            None
        }
    }
}

/// `IP:PORT` or `HOST:PORT`, checked for form only: names are resolved by the binary's discovery.
fn backend_address(text: &str) -> Result<BackendAddress, String> {
    let no_valid_port = || {
        format!(
            "`{text}` has no valid port: expected IP:PORT or HOST:PORT with a port from 1 to 65535"
        )
    };
    if let Ok(address) = text.parse::<std::net::SocketAddr>() {
        // Port 0 means "any" only to bind: no backend can be reached on it.
        return match address.port() {
            0 => Err(no_valid_port()),
            _ => Ok(BackendAddress::Ip(address)),
        };
    }
    let expected = "expected IP:PORT or HOST:PORT such as 127.0.0.1:9001 or api.internal:80";
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("`{text}` is not a backend address: {expected}"));
    };
    let Some(port) = port.parse::<u16>().ok().filter(|&port| port != 0) else {
        return Err(no_valid_port());
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

fn policy(checker: &mut Checker, value: Option<&Spanned<Scalar>>, field: &Field) -> Policy {
    let Some(value) = value else {
        return Policy::default();
    };
    let text = value.value.0.trim();
    let all = [
        Policy::P2cInflight,
        Policy::P2cPeakEwma,
        Policy::P2cMemoryInflight,
        Policy::P2cMemoryPeakEwma,
        Policy::LeastInflight,
        Policy::LeastPeakEwma,
        Policy::RoundRobin,
        Policy::Random,
        Policy::Hash,
    ];
    if let Some(policy) = all.into_iter().find(|p| p.name() == text) {
        return policy;
    }
    let names = all.map(Policy::name);
    let message = format!(
        "`{text}` is not a policy: expected one of {}",
        names.join(", ")
    );
    let mut e = checker.error(value, field, message);
    if let Some(hint) = did_you_mean(text, names) {
        e = e.hint(hint);
    }
    checker.push(e);
    Policy::default()
}

fn upstream_protocol(
    checker: &mut Checker,
    value: Option<&Spanned<Scalar>>,
    field: &Field,
) -> UpstreamProtocol {
    let Some(value) = value else {
        return UpstreamProtocol::default();
    };
    let text = value.value.0.trim();
    let all = [UpstreamProtocol::Http1, UpstreamProtocol::H2];
    if let Some(protocol) = all.into_iter().find(|p| p.name() == text) {
        return protocol;
    }
    let names = all.map(UpstreamProtocol::name);
    let message = format!(
        "`{text}` is not a backend protocol: expected one of {}",
        names.join(", ")
    );
    let mut e = checker.error(value, field, message);
    if let Some(hint) = did_you_mean(text, names) {
        e = e.hint(hint);
    }
    checker.push(e);
    UpstreamProtocol::default()
}
