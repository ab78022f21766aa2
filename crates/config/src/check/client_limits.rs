//! A listener's `limits:`: caps on each client address's connections.

use crate::{
    checker::Checker, field::Field, filter::rate_limit::parse_rate, model::ClientLimits,
    raw::RawClientLimits,
};
use serde_saphyr::Spanned;

/// The listener's caps; a value refused is recorded and left unset.
pub(super) fn check(
    checker: &mut Checker,
    raw: &Spanned<RawClientLimits>,
    field: &Field,
) -> ClientLimits {
    let written = &raw.value;
    let connections = (written.connections_per_client.as_ref()).map(|value| {
        let key = field.key("connections_per_client");
        checker.count(Some(value), &key, 1, (1, 1_000_000))
    });
    let new_connections = (written.new_connections_per_client.as_ref())
        .and_then(|rate| parse_rate(checker, rate, &field.key("new_connections_per_client")));
    let max_clients = checker.count(
        written.max_clients.as_ref(),
        &field.key("max_clients"),
        ClientLimits::DEFAULT_MAX_CLIENTS,
        (1, 10_000_000),
    );
    let limits = ClientLimits {
        connections,
        new_connections,
        max_clients,
    };
    if !limits.any() && written.max_clients.is_none() {
        let e = checker.error(raw, field, "no cap: `limits` sets none");
        checker.push(e.hint(
            "set `connections_per_client: 200` or `new_connections_per_client: 100/s`, or leave `limits` out",
        ));
    }
    limits
}
