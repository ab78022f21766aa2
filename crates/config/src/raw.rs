//! The file's shape, as serde reads it. Values that need checking keep their location (`Spanned`).

use serde::{de, Deserialize, Deserializer};
use serde_saphyr::Spanned;
use std::fmt;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) workers: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) listeners: Vec<RawListener>,
    #[serde(default)]
    pub(crate) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(crate) clusters: Vec<RawCluster>,
    #[serde(default)]
    pub(crate) limits: Option<RawLimits>,
    #[serde(default)]
    pub(crate) shutdown: Option<RawShutdown>,
    #[serde(default)]
    pub(crate) admin: Option<RawAdmin>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub(crate) address: Spanned<Scalar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub(crate) address: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) tls: Option<RawTls>,
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub(crate) cert: Spanned<Scalar>,
    pub(crate) key: Spanned<Scalar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    #[serde(rename = "match", default)]
    pub(crate) matcher: Option<RawMatch>,
    pub(crate) cluster: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) retry_methods: Option<Vec<Spanned<Scalar>>>,
    #[serde(default)]
    pub(crate) timeout: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    #[serde(default)]
    pub(crate) host: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) path_prefix: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub(crate) name: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) policy: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) backends: Vec<RawBackend>,
    #[serde(default)]
    pub(crate) timeouts: Option<RawTimeouts>,
    #[serde(default)]
    pub(crate) health_check: Option<RawHealthCheck>,
    #[serde(default)]
    pub(crate) outlier_detection: Option<RawOutlierDetection>,
    #[serde(default)]
    pub(crate) retries: Option<RawRetries>,
    #[serde(default)]
    pub(crate) panic_threshold: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) slow_start: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) dns_refresh: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) penalty_statuses: Option<Vec<Spanned<Scalar>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealthCheck {
    #[serde(default)]
    pub(crate) path: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) interval: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) healthy_threshold: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) unhealthy_threshold: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) expected_statuses: Option<Vec<Spanned<Scalar>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOutlierDetection {
    #[serde(default)]
    pub(crate) consecutive_failures: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) base_ejection_time: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_ejection_time: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_ejection_percent: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetries {
    #[serde(default)]
    pub(crate) attempts: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) budget_percent: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) min_retries_per_second: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) replay_body_limit: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    pub(crate) address: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) weight: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTimeouts {
    #[serde(default)]
    pub(crate) connect: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) response_headers: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) idle: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) read: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) tunnel_idle: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    #[serde(default)]
    pub(crate) max_request_head: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_uri_length: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) header_read_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) body_read_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) send_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_connections: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) keepalive_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) keepalive_requests: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShutdown {
    #[serde(default)]
    pub(crate) drain_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) drain_delay: Option<Spanned<Scalar>>,
}

/// Any YAML scalar, kept as text: `1s`, `8080`, `auto` are all checked after parsing, so that every
/// problem can be reported at once with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scalar(pub(crate) String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a single value (text or number)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}
