//! A route's `backends:`: the clusters a weighted split sends to, each with its share.

use crate::{
    checker::Checker,
    field::Field,
    model::{Action, WeightedCluster},
    raw::RawWeighted,
};
use serde_saphyr::Spanned;

/// Gateway API's bound on a backend weight: shares finer than one in a million mean nothing, and
/// sums of many stay far from overflowing.
const MAX_WEIGHT: u32 = 1_000_000;

/// The split, or `None` after recording why it is refused. One cluster (whatever its weight above 0)
/// is the same as `cluster: NAME`, and is read as it.
pub(super) fn split(
    checker: &mut Checker,
    raw: &Spanned<Vec<Spanned<RawWeighted>>>,
    route: &Field,
    names: &[String],
) -> Option<Action> {
    let field = route.key("backends");
    if raw.value.is_empty() {
        let e = checker.error(raw, &field, "an empty list: the route would send nowhere");
        checker
            .push(e.hint("list `{ cluster: NAME, weight: N }` entries, or write `cluster: NAME`"));
        return None;
    }
    let errors = checker.errors.len();
    let mut split: Vec<WeightedCluster> = Vec::new();
    for (i, entry) in raw.value.iter().enumerate() {
        let at = field.index(i);
        let weight = entry.value.weight.as_ref();
        let weight = checker.count(weight, &at.key("weight"), 1, (0, MAX_WEIGHT));
        let Some(cluster) = checker.cluster(&entry.value.cluster, &at.key("cluster"), names) else {
            continue;
        };
        if split.iter().any(|w| w.cluster == cluster) {
            let wanted = &entry.value.cluster;
            let message = format!("`{}` is listed twice in one split", wanted.value.0);
            let e = checker.error(wanted, at.key("cluster"), message);
            checker.push(e.hint("give it one entry, with the weight of both"));
            continue;
        }
        split.push(WeightedCluster { cluster, weight });
    }
    if checker.errors.len() != errors {
        return None;
    }
    if split.iter().all(|w| w.weight == 0) {
        let e = checker.error(
            raw,
            &field,
            "every weight is 0: the route would send nowhere",
        );
        checker.push(e.hint("give at least one cluster a weight above 0"));
        return None;
    }
    match split[..] {
        [only] => Some(Action::Cluster(only.cluster)),
        _ => Some(Action::Split(split)),
    }
}
