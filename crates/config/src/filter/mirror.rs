//! `mirror:`: a share of a route's requests copied to another cluster, whose answers are
//! discarded (a shadow deployment).

use super::{RouteContext, Section};
use crate::{
    checker::Checker,
    raw::{leaf, Scalar, Shape},
};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::fmt;

/// `mirror:`: a share of a route's requests copied to another cluster, whose answers are discarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The cluster the copies go to (an index into [`Config::clusters`](crate::Config::clusters)).
    pub cluster: usize,
    /// That cluster's name, for people to read.
    pub cluster_name: String,
    /// The share of requests copied, in hundredths of a percent (`10%` is 1,000; all is 10,000).
    pub basis_points: u32,
}

impl Mirror {
    /// Every request: `percent` left out.
    pub const ALL: u32 = 10_000;
}

impl fmt::Display for Mirror {
    /// `shadow 10%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = f64::from(self.basis_points) / 100.0;
        write!(f, "{} {percent}%", self.cluster_name)
    }
}

/// `mirror: { cluster: shadow, percent: 10 }`: a copy of some requests to another cluster.
#[derive(Debug, Deserialize)]
struct RawMirror {
    #[serde(default)]
    cluster: Option<Spanned<Scalar>>,
    #[serde(default)]
    percent: Option<Spanned<Scalar>>,
}

/// The route key `mirror:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    mirror: Option<Spanned<RawMirror>>,
}

impl Section for Mirror {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static Shape)] = &[("mirror", &leaf::<RawMirror>())];

    fn check(checker: &mut Checker, raw: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, raw.mirror.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("mirror {self}")
    }
}

/// The mirror, or `None` after recording why it is refused.
fn check(
    checker: &mut Checker,
    raw: &Spanned<RawMirror>,
    route: &RouteContext<'_>,
) -> Option<Mirror> {
    let field = route.field.key("mirror");
    let Some(wanted) = &raw.value.cluster else {
        let e = checker.error(raw, &field, "a mirror needs `cluster`");
        checker.push(e.hint("write `mirror: { cluster: NAME, percent: 10 }`"));
        return None;
    };
    let cluster = checker.cluster(wanted, &field.key("cluster"), route.clusters)?;
    let text = wanted.value.0.as_str();
    // Every cluster the route may send to, a split's weight-0 ones included: a reload may ramp them up.
    if route.sends_to.contains(&cluster) {
        let message = if route.splits {
            format!(
                "`{text}` is one of the clusters the route splits over: the requests it takes would reach it twice"
            )
        } else {
            format!("`{text}` is the cluster the route proxies to: it would get each request twice")
        };
        let e = checker.error(wanted, field.key("cluster"), message);
        checker.push(e.hint("mirror to another cluster (a shadow deployment)"));
        return None;
    }
    let fraction = checker.percent(raw.value.percent.as_ref(), &field.key("percent"), 1.0);
    Some(Mirror {
        cluster,
        cluster_name: text.to_owned(),
        basis_points: (fraction * f64::from(Mirror::ALL)).round() as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::Mirror;

    fn config(mirror: &str) -> Result<Option<Mirror>, String> {
        let yaml = format!("listeners: [ {{ address: 127.0.0.1:0 }} ]\nclusters:\n  - {{ name: web, backends: [ {{ address: 127.0.0.1:9 }} ] }}\n  - {{ name: shadow, backends: [ {{ address: 127.0.0.1:8 }} ] }}\nroutes:\n  - {{ cluster: web, mirror: {mirror} }}\n");
        crate::parse(&yaml, "t.yaml")
            .map(|c| c.routes[0].filters.mirror.clone())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_mirror_names_another_cluster_and_a_share() {
        let all = config("{ cluster: shadow }");
        assert_eq!(
            all,
            Ok(Some(Mirror {
                cluster: 1,
                cluster_name: "shadow".to_owned(),
                basis_points: 10_000
            }))
        );
        let some = config("{ cluster: shadow, percent: 12.5 }");
        assert_eq!(
            some,
            Ok(Some(Mirror {
                cluster: 1,
                cluster_name: "shadow".to_owned(),
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
