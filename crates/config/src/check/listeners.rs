//! `listeners:` and `admin:`: addresses to bind, none of which may take another's port.

use super::listener_tls::listener_tls;
use crate::{
    checker::Checker,
    error::ConfigError,
    field::Field,
    model::{Listener, ProxyProtocol, Underscores},
    networks::network,
    raw::{RawAdmin, RawListener, Scalar},
};
use serde_saphyr::Spanned;
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

/// The listeners, each bindable and none clashing with one before it.
pub(super) fn listeners(checker: &mut Checker, raw: &[RawListener]) -> Vec<Listener> {
    let mut listeners: Vec<Listener> = Vec::new();
    let list = Field::root("listeners");
    for (i, l) in raw.iter().enumerate() {
        let field = list.index(i);
        let Ok(address) = l.address.value.0.parse::<SocketAddr>() else {
            let message = not_a_listen_address(&l.address.value.0, "0.0.0.0:8080");
            checker.reject(&l.address, field.key("address"), message);
            continue;
        };
        let seen = listeners.iter().map(|l| l.address);
        if let Some(other) = seen.into_iter().find(|other| clash(*other, address)) {
            let message = if other == address {
                format!("{address} is listed twice")
            } else {
                format!("{address} overlaps {other}: both would take the same port")
            };
            checker.reject(&l.address, field.key("address"), message);
        }
        let tls = l
            .tls
            .as_ref()
            .and_then(|tls| listener_tls(checker, tls, &field));
        let trusted_proxies = trusted_proxies(checker, &l.trusted_proxies, &field);
        let proxy_protocol = l.proxy_protocol.as_ref().and_then(|value| {
            proxy_protocol(
                checker,
                value,
                &field.key("proxy_protocol"),
                &trusted_proxies,
            )
        });
        let name = l
            .name
            .as_ref()
            .map(|n| name(checker, n, &field, &listeners));
        let underscores_in_headers = underscores(
            checker,
            l.underscores_in_headers.as_ref(),
            &field.key("underscores_in_headers"),
        );
        let limits = (l.limits.as_ref())
            .map(|raw| super::client_limits::check(checker, raw, &field.key("limits")))
            .unwrap_or_default();
        listeners.push(Listener {
            name,
            address,
            tls,
            trusted_proxies,
            proxy_protocol,
            underscores_in_headers,
            limits,
        });
    }
    if raw.is_empty() {
        checker.push(
            ConfigError::new(
                "listeners",
                "no listeners: duet would accept no connections",
            )
            .hint("add `listeners: [{ address: 0.0.0.0:8080 }]`"),
        );
    }
    listeners
}

/// A listener's `name:`: not empty, and unique (routes refer to it).
fn name(
    checker: &mut Checker,
    given: &Spanned<Scalar>,
    listener: &Field,
    earlier: &[Listener],
) -> String {
    let text = given.value.0.trim().to_owned();
    if text.is_empty() {
        checker.reject(
            given,
            listener.key("name"),
            "a listener name cannot be empty",
        );
    } else if earlier.iter().any(|l| l.name.as_deref() == Some(&text)) {
        let e = checker.error(
            given,
            listener.key("name"),
            format!("listener `{text}` is named twice"),
        );
        checker.push(e.hint("routes refer to listeners by name: make them unique"));
    }
    text
}

/// `drop` (the default) or `keep`.
fn underscores(
    checker: &mut Checker,
    value: Option<&Spanned<Scalar>>,
    field: &Field,
) -> Underscores {
    let Some(value) = value else {
        return Underscores::default();
    };
    let text = value.value.0.trim();
    let all = [Underscores::Drop, Underscores::Keep];
    if let Some(choice) = all.into_iter().find(|u| u.name() == text) {
        return choice;
    }
    let message = format!("`{text}` is not what to do with them: expected drop or keep");
    let e = checker.error(value, field, message);
    checker.push(e.hint(
        "`drop` (the default) keeps `X_Forwarded_For` from reaching a CGI backend as X-Forwarded-For",
    ));
    Underscores::default()
}

/// `v1`, `v2` or `any`, from peers the listener trusts (there must be some).
fn proxy_protocol(
    checker: &mut Checker,
    value: &Spanned<Scalar>,
    field: &Field,
    trusted: &[ipnet::IpNet],
) -> Option<ProxyProtocol> {
    let text = value.value.0.trim();
    let all = [ProxyProtocol::V1, ProxyProtocol::V2, ProxyProtocol::Any];
    let Some(version) = all.into_iter().find(|v| v.name() == text) else {
        let message = format!("`{text}` is not a PROXY protocol version: expected v1, v2 or any");
        checker.reject(value, field, message);
        return None;
    };
    if trusted.is_empty() {
        let message = "the PROXY protocol is read only from `trusted_proxies`, and there are none";
        let e = checker.error(value, field, message);
        checker.push(e.hint(
            "list the balancers in front, e.g. `trusted_proxies: [10.0.0.0/8]`: anyone else could \
             claim any address",
        ));
    }
    Some(version)
}

/// IPs and CIDR networks; a bare IP is a network of one.
fn trusted_proxies(
    checker: &mut Checker,
    raw: &[Spanned<Scalar>],
    listener: &Field,
) -> Vec<ipnet::IpNet> {
    let list = listener.key("trusted_proxies");
    let mut nets = Vec::new();
    for (i, net) in raw.iter().enumerate() {
        match network(&net.value.0) {
            Ok(parsed) => nets.push(parsed),
            Err(message) => checker.reject(net, list.index(i), message),
        }
    }
    nets
}

/// The admin address, which must not take a traffic listener's port.
pub(super) fn admin(
    checker: &mut Checker,
    raw: Option<&RawAdmin>,
    listeners: &[Listener],
) -> Option<SocketAddr> {
    let a = raw?;
    let field = Field::root("admin").key("address");
    let Ok(address) = a.address.value.0.parse::<SocketAddr>() else {
        let message = not_a_listen_address(&a.address.value.0, "127.0.0.1:9901");
        checker.reject(&a.address, field, message);
        return None;
    };
    if let Some(listener) = listeners.iter().find(|l| clash(l.address, address)) {
        let message = format!(
            "{address} is also a traffic listener's ({}): \
             the admin listener needs a port of its own",
            listener.address
        );
        let e = checker.error(&a.address, field, message);
        checker.push(e.hint("the usual admin port is 9901"));
    }
    Some(address)
}

/// `admin.status_bucket`: from 1 s (a test's, or a close look) to 10 min (30 of them: five hours).
pub(super) fn status_bucket(checker: &mut Checker, raw: Option<&RawAdmin>) -> Duration {
    const DEFAULT: Duration = Duration::from_secs(10);
    let Some(value) = raw.and_then(|a| a.status_bucket.as_ref()) else {
        return DEFAULT;
    };
    let field = Field::root("admin").key("status_bucket");
    let bucket = checker.duration(Some(value), &field, DEFAULT);
    if (Duration::from_secs(1)..=Duration::from_secs(600)).contains(&bucket) {
        return bucket;
    }
    let text = value.value.0.trim();
    let message = format!("`{text}` is out of range: expected a duration from 1s to 10m");
    let error = checker.error(value, field, message);
    checker.push(error.hint("the default, `10s`, keeps the last five minutes"));
    DEFAULT
}

/// Why `text` is not a listen address: a port past 65535 is named as such.
fn not_a_listen_address(text: &str, example: &str) -> String {
    let port_too_large = text.rsplit_once(':').is_some_and(|(ip, port)| {
        let ip = ip
            .strip_prefix('[')
            .and_then(|ip| ip.strip_suffix(']'))
            .unwrap_or(ip);
        ip.parse::<IpAddr>().is_ok()
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_err()
    });
    if port_too_large {
        format!(
            "`{text}` has no valid port: expected a port from 0 to 65535 (0 lets the system \
             pick), such as {example}"
        )
    } else {
        format!("`{text}` is not a listen address: expected IP:PORT such as {example}")
    }
}

/// Whether two listen addresses would take the same port: the same port (not 0, which the system
/// picks) on the same IP, or on any IP when either is a wildcard (`0.0.0.0`, `[::]`).
fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}
