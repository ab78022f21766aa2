//! `hash:` of a cluster: the affinity key and bound of `policy: hash`, present exactly with it.

use crate::{
    checker::Checker,
    field::Field,
    model::{HashAlgorithm, HashKey, HashPolicy, HashWalk, Policy},
    raw::{RawCluster, RawHash, Scalar},
};
use serde_saphyr::Spanned;

/// What `key:` takes, for the error messages.
const KEYS: &str = "`header:NAME`, `cookie:NAME`, `query:NAME`, `client_ip` or `path`";

/// The cluster's `hash:` when its policy is `hash`; an error when one is given without the other.
pub(super) fn hash(
    checker: &mut Checker,
    c: &RawCluster,
    cluster: &Field,
    policy: Policy,
) -> Option<HashPolicy> {
    let field = cluster.key("hash");
    match (&c.hash, policy) {
        (Some(raw), Policy::Hash) => Some(settings(checker, &raw.value, &field)),
        (None, Policy::Hash) => {
            let at = c.policy.as_ref()?;
            let message = "`policy: hash` needs a `hash:` mapping naming the key, such as \
                           `hash: { key: \"header:x-user\" }`";
            checker.reject(at, cluster.key("policy"), message);
            None
        }
        (Some(raw), _) => {
            let message = format!(
                "`hash:` is read only with `policy: hash`, and this cluster's policy is `{}`: \
                 set `policy: hash` or remove `hash`",
                policy.name()
            );
            checker.reject(raw, field, message);
            None
        }
        (None, _) => None,
    }
}

fn settings(checker: &mut Checker, raw: &RawHash, field: &Field) -> HashPolicy {
    HashPolicy {
        key: key(checker, &raw.key, &field.key("key")).unwrap_or(HashKey::Path),
        bound: bound(checker, raw.bound.as_ref(), &field.key("bound")),
        walk: walk(checker, raw.walk.as_ref(), &field.key("walk")),
        algorithm: algorithm(checker, raw.algorithm.as_ref(), &field.key("algorithm")),
    }
}

fn key(checker: &mut Checker, value: &Spanned<Scalar>, field: &Field) -> Option<HashKey> {
    let text = value.value.0.trim();
    let named = |name: &str| {
        let name = name.trim();
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b));
        token.then(|| name.to_owned())
    };
    let key = match text.split_once(':') {
        None if text == "client_ip" => Some(HashKey::ClientIp),
        None if text == "path" => Some(HashKey::Path),
        Some(("header", name)) => named(name).map(|n| HashKey::Header(n.to_ascii_lowercase())),
        Some(("cookie", name)) => named(name).map(HashKey::Cookie),
        Some(("query", name)) => named(name).map(HashKey::Query),
        _ => None,
    };
    if key.is_none() {
        let message = format!("`{text}` is not a hash key: expected {KEYS}");
        checker.reject(value, field, message);
    }
    key
}

fn bound(checker: &mut Checker, value: Option<&Spanned<Scalar>>, field: &Field) -> f64 {
    let Some(value) = value else { return 1.25 };
    let text = value.value.0.trim();
    match text.parse::<f64>() {
        Ok(c) if (1.0..=100.0).contains(&c) => c,
        _ => {
            let message = format!(
                "`{text}` is not a load bound: expected a number from 1 to 100, such as 1.25 \
                 (each backend takes at most 1.25 × its share of the requests in flight)"
            );
            checker.reject(value, field, message);
            1.25
        }
    }
}

fn algorithm(
    checker: &mut Checker,
    value: Option<&Spanned<Scalar>>,
    field: &Field,
) -> HashAlgorithm {
    let Some(value) = value else {
        return HashAlgorithm::default();
    };
    match value.value.0.trim() {
        "maglev" => HashAlgorithm::Maglev,
        "ring" => HashAlgorithm::Ring,
        text => {
            let message = format!("`{text}` is not a hash algorithm: expected `maglev` or `ring`");
            checker.reject(value, field, message);
            HashAlgorithm::default()
        }
    }
}

fn walk(checker: &mut Checker, value: Option<&Spanned<Scalar>>, field: &Field) -> HashWalk {
    let Some(value) = value else {
        return HashWalk::default();
    };
    match value.value.0.trim() {
        "p2c" => HashWalk::P2c,
        "next" => HashWalk::Next,
        text => {
            let message = format!("`{text}` is not a walk: expected `p2c` or `next`");
            checker.reject(value, field, message);
            HashWalk::default()
        }
    }
}
