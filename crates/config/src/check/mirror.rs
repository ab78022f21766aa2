//! A route's `mirror:`: which cluster gets the copies, and what share of the requests.

use crate::{
    checker::Checker,
    error::did_you_mean,
    field::Field,
    model::{Action, Mirror},
    raw::RawMirror,
};
use serde_saphyr::Spanned;

/// The mirror, or `None` after recording why it is refused. `clusters` are the cluster names in order;
/// `action` is what the route does, if it was checked.
pub(super) fn mirror(
    checker: &mut Checker,
    raw: &Spanned<RawMirror>,
    route: &Field,
    clusters: &[String],
    action: Option<&Action>,
) -> Option<Mirror> {
    let field = route.key("mirror");
    let Some(wanted) = &raw.value.cluster else {
        let e = checker.error(raw, &field, "a mirror needs `cluster`");
        checker.push(e.hint("write `mirror: { cluster: NAME, percent: 10 }`"));
        return None;
    };
    let text = wanted.value.0.trim();
    let Some(cluster) = clusters.iter().position(|n| n == text) else {
        let e = checker.error(
            wanted,
            field.key("cluster"),
            format!("no cluster is named `{text}`"),
        );
        let e = match did_you_mean(text, clusters.iter().map(String::as_str)) {
            Some(hint) => e.hint(hint),
            None => e.hint(format!("defined clusters: {}", clusters.join(", "))),
        };
        checker.push(e);
        return None;
    };
    // Every cluster the route may send to, a split's weight-0 ones included: a reload may ramp them up.
    if let Some(action) = action.filter(|a| a.clusters().any(|c| c == cluster)) {
        let message = match action {
            Action::Split(_) => format!(
                "`{text}` is one of the clusters the route splits over: the requests it takes would reach it twice"
            ),
            _ => format!(
                "`{text}` is the cluster the route proxies to: it would get each request twice"
            ),
        };
        let e = checker.error(wanted, field.key("cluster"), message);
        checker.push(e.hint("mirror to another cluster (a shadow deployment)"));
        return None;
    }
    let fraction = checker.percent(raw.value.percent.as_ref(), &field.key("percent"), 1.0);
    Some(Mirror {
        cluster,
        basis_points: (fraction * f64::from(Mirror::ALL)).round() as u32,
    })
}

#[cfg(test)]
mod tests {
    use crate::model::Mirror;

    fn config(mirror: &str) -> Result<Option<Mirror>, String> {
        let yaml = format!("listeners: [ {{ address: 127.0.0.1:0 }} ]\nclusters:\n  - {{ name: web, backends: [ {{ address: 127.0.0.1:9 }} ] }}\n  - {{ name: shadow, backends: [ {{ address: 127.0.0.1:8 }} ] }}\nroutes:\n  - {{ cluster: web, mirror: {mirror} }}\n");
        crate::parse(&yaml, "t.yaml")
            .map(|c| c.routes[0].mirror)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_mirror_names_another_cluster_and_a_share() {
        let all = config("{ cluster: shadow }");
        assert_eq!(
            all,
            Ok(Some(Mirror {
                cluster: 1,
                basis_points: 10_000
            }))
        );
        let some = config("{ cluster: shadow, percent: 12.5 }");
        assert_eq!(
            some,
            Ok(Some(Mirror {
                cluster: 1,
                basis_points: 1_250
            }))
        );
        let unknown = config("{ cluster: shadw }").expect_err("refused");
        assert!(
            unknown.contains("t.yaml:6:40: routes[0].mirror.cluster: no cluster is named `shadw`"),
            "{unknown}"
        );
        assert!(unknown.contains("did you mean `shadow`?"), "{unknown}");
        let itself = config("{ cluster: web }").expect_err("refused");
        assert!(
            itself.contains("routes[0].mirror.cluster: `web` is the cluster the route proxies to"),
            "{itself}"
        );
        let share = config("{ cluster: shadow, percent: 150 }").expect_err("refused");
        assert!(
            share.contains("routes[0].mirror.percent: `150` is not a percentage"),
            "{share}"
        );
        let none = config("{ percent: 5 }").expect_err("refused");
        assert!(
            none.contains("routes[0].mirror: a mirror needs `cluster`"),
            "{none}"
        );
        let typo = config("{ cluster: shadow, percnt: 5 }").expect_err("refused");
        assert!(
            typo.contains("unknown field `percnt`, expected one of cluster, percent"),
            "{typo}"
        );
    }
}
