//! The file's shape, as serde reads it. Values that need checking keep their location (`Spanned`).
//!
//! Unknown keys are not rejected by serde (`deny_unknown_fields` would stop at the first one): the file
//! is first read as a bare tree ([`Node`]) and [`unknown_keys`] walks it against the field lists the
//! derived `Deserialize` impls declare, so every misspelt key is reported in one run.

use serde::{de, Deserialize, Deserializer};
use serde_saphyr::Spanned;
use std::fmt;

#[derive(Debug, Deserialize)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) workers: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) listeners: Vec<RawListener>,
    #[serde(default)]
    pub(crate) routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub(crate) clusters: Vec<RawCluster>,
    #[serde(default)]
    pub(crate) limits: Option<RawLimits>,
    #[serde(default)]
    pub(crate) shutdown: Option<RawShutdown>,
    #[serde(default)]
    pub(crate) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(crate) tracing: Option<Spanned<RawTracing>>,
    pub(crate) access_log: Option<RawAccessLog>,
}

/// `tracing:`: OpenTelemetry traces exported with OTLP.
#[derive(Debug, Deserialize)]
pub(crate) struct RawTracing {
    #[serde(default)]
    pub(crate) otlp: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) sample: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) queue: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) service_name: Option<Spanned<Scalar>>,
}

/// `access_log: { format, fields, sample_success }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawAccessLog {
    #[serde(default)]
    pub(crate) format: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) fields: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    pub(crate) sample_success: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawAdmin {
    pub(crate) address: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) status_bucket: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawListener {
    #[serde(default)]
    pub(crate) name: Option<Spanned<Scalar>>,
    pub(crate) address: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) tls: Option<Spanned<RawTls>>,
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) proxy_protocol: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) underscores_in_headers: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) limits: Option<Spanned<RawClientLimits>>,
}

/// A listener's `limits:`, per client address.
#[derive(Debug, Deserialize)]
pub(crate) struct RawClientLimits {
    #[serde(default)]
    pub(crate) connections_per_client: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) new_connections_per_client: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_clients: Option<Spanned<Scalar>>,
}

/// A listener's `tls:`: one `cert` and `key`, or `certificates:` chosen by SNI with a `default`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawTls {
    #[serde(default)]
    pub(crate) cert: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) key: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) ocsp: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) certificates: Option<Spanned<Vec<RawCertificate>>>,
    #[serde(default)]
    pub(crate) default: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) min_version: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) client_auth: Option<Spanned<RawClientAuth>>,
    #[serde(default)]
    pub(crate) session_tickets: Option<Spanned<Scalar>>,
}

/// `tls.client_auth: { ca, mode }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawClientAuth {
    pub(crate) ca: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) mode: Option<Spanned<Scalar>>,
}

/// One of `tls.certificates`: `{ cert: shop.pem, key: shop.key }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawCertificate {
    pub(crate) cert: Spanned<Scalar>,
    pub(crate) key: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) ocsp: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawRoute {
    #[serde(default)]
    pub(crate) name: Option<Spanned<Scalar>>,
    #[serde(rename = "match", default)]
    pub(crate) matcher: Option<RawMatch>,
    #[serde(default)]
    pub(crate) cluster: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) redirect: Option<Spanned<RawRedirect>>,
    #[serde(default)]
    pub(crate) retry_methods: Option<Vec<Spanned<Scalar>>>,
    #[serde(default)]
    pub(crate) timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) listeners: Option<Spanned<Vec<Spanned<Scalar>>>>,
    pub(crate) buffer_request: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) backends: Option<Spanned<Vec<Spanned<RawWeighted>>>>,
    #[serde(default)]
    pub(crate) request_headers: Option<Spanned<RawHeaderEdits>>,
    #[serde(default)]
    pub(crate) response_headers: Option<Spanned<RawHeaderEdits>>,
    #[serde(default)]
    pub(crate) rewrite: Option<Spanned<RawRewrite>>,
    #[serde(default)]
    pub(crate) retries: Option<RawRouteRetries>,
}

/// One cluster of a route's split: `{ cluster: api-v2, weight: 5 }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawWeighted {
    pub(crate) cluster: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) weight: Option<Spanned<Scalar>>,
}

/// `request_headers:` / `response_headers:`: `{ set: { k: v }, add: { k: v }, remove: [k] }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawHeaderEdits {
    #[serde(default)]
    pub(crate) set: Option<Pairs<Spanned<Scalar>>>,
    #[serde(default)]
    pub(crate) add: Option<Pairs<Spanned<Scalar>>>,
    #[serde(default)]
    pub(crate) remove: Option<Vec<Spanned<Scalar>>>,
}

/// `rewrite: { path | path_prefix, host }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawRewrite {
    #[serde(default)]
    pub(crate) path: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) path_prefix: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) host: Option<Spanned<Scalar>>,
}

/// A route's `retries: { attempts }`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawRouteRetries {
    #[serde(default)]
    pub(crate) attempts: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawMatch {
    #[serde(default)]
    pub(crate) host: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) path_prefix: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) path: Option<Spanned<RawPath>>,
    #[serde(default)]
    pub(crate) method: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    pub(crate) headers: Option<Pairs<RawValueMatch>>,
    #[serde(default)]
    pub(crate) query: Option<Pairs<Spanned<Scalar>>>,
}

/// `redirect: { scheme, host, port, path, path_prefix, status }`: each part left out is the request's.
#[derive(Debug, Deserialize)]
pub(crate) struct RawRedirect {
    #[serde(default)]
    pub(crate) scheme: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) host: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) port: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) path: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) path_prefix: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) status: Option<Spanned<Scalar>>,
}

/// `path: { exact: /healthz }`, `{ prefix: /v1 }` or `{ regex: '^/users/[0-9]+$' }`: one of them.
#[derive(Debug, Deserialize)]
pub(crate) struct RawPath {
    #[serde(default)]
    pub(crate) exact: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) prefix: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) regex: Option<Spanned<Scalar>>,
}

/// A header's wanted value: a plain value, or `{ regex: '...' }`.
#[derive(Debug)]
pub(crate) enum RawValueMatch {
    Exact(Scalar),
    Regex(Spanned<Scalar>),
    /// A key other than `regex`, kept to be refused by the check at its place.
    Unknown(Spanned<String>),
}

impl<'de> Deserialize<'de> for RawValueMatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = RawValueMatch;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a header value, or { regex: '...' }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawValueMatch, E> {
                Ok(RawValueMatch::Exact(Scalar(v.to_owned())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawValueMatch, E> {
                Ok(RawValueMatch::Exact(Scalar(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawValueMatch, E> {
                Ok(RawValueMatch::Exact(Scalar(v.to_string())))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawValueMatch, E> {
                Ok(RawValueMatch::Exact(Scalar(v.to_string())))
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawValueMatch, A::Error> {
                let mut found = None;
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    if key.value == "regex" && found.is_none() {
                        found = Some(RawValueMatch::Regex(map.next_value()?));
                    } else {
                        map.next_value::<de::IgnoredAny>()?;
                        found.get_or_insert(RawValueMatch::Unknown(key));
                    }
                }
                found.ok_or_else(|| de::Error::custom("expected { regex: '...' }"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A mapping whose keys are the writer's own (header names, query parameters), in file order.
#[derive(Debug)]
pub(crate) struct Pairs<V>(pub(crate) Vec<(Spanned<String>, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Pairs<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> de::Visitor<'de> for Visitor<V> {
            type Value = Pairs<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of names to values")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Pairs<V>, A::Error> {
                let mut pairs = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    pairs.push((key, map.next_value()?));
                }
                Ok(Pairs(pairs))
            }
        }
        deserializer.deserialize_map(Visitor(std::marker::PhantomData))
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawCluster {
    pub(crate) name: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) policy: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) protocol: Option<Spanned<Scalar>>,
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
    #[serde(default)]
    pub(crate) tls: Option<Spanned<RawUpstreamTls>>,
    #[serde(default)]
    pub(crate) http2: Option<Spanned<RawHttp2Windows>>,
    #[serde(default)]
    pub(crate) hash: Option<Spanned<RawHash>>,
    #[serde(default)]
    pub(crate) sticky: Option<Spanned<RawSticky>>,
    #[serde(default)]
    pub(crate) send_proxy_protocol: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawHash {
    pub(crate) key: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) algorithm: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) bound: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) walk: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawSticky {
    pub(crate) cookie: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) ttl: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) secret: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) secret_file: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawUpstreamTls {
    #[serde(default)]
    pub(crate) ca: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) server_name: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) cert: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) key: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) verify: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
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
pub(crate) struct RawOutlierDetection {
    #[serde(default)]
    pub(crate) consecutive_failures: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) consecutive_5xx: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) base_ejection_time: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_ejection_time: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_ejection_percent: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
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
pub(crate) struct RawBackend {
    pub(crate) address: Spanned<Scalar>,
    #[serde(default)]
    pub(crate) weight: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
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
pub(crate) struct RawHttp2Limits {
    #[serde(default)]
    pub(crate) max_concurrent_streams: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_header_list_size: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) keepalive_interval: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) keepalive_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) initial_stream_window_size: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) initial_connection_window_size: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) adaptive_window: Option<Spanned<Scalar>>,
}

/// A cluster's `http2:`: the windows of its backend connections.
#[derive(Debug, Deserialize)]
pub(crate) struct RawHttp2Windows {
    #[serde(default)]
    pub(crate) initial_stream_window_size: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) initial_connection_window_size: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) adaptive_window: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
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
    pub(crate) min_upload_rate: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) upload_rate_grace: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) send_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_connections: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) keepalive_timeout: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) keepalive_requests: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) http2: Option<RawHttp2Limits>,
    pub(crate) max_mirrors_in_flight: Option<Spanned<Scalar>>,
    #[serde(default)]
    pub(crate) max_request_body: Option<Spanned<Scalar>>,
    pub(crate) max_buffered_bytes: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
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

/// The file as a bare tree: mapping keys keep their location, everything else only its shape.
#[derive(Debug)]
pub(crate) enum Node {
    Map(Vec<(Spanned<String>, Node)>),
    Seq(Vec<Node>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Node::Map(entries))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Where a mapping sits in the file and which struct reads it: the field names come from the struct's
/// own `Deserialize` impl, so this table cannot drift from the structs above; it only says which
/// struct reads which key.
pub(crate) struct Shape {
    fields: fn() -> &'static [&'static str],
    children: &'static [(&'static str, &'static Shape)],
    /// Whether the route's filters' keys belong here too (see [`crate::filter`]).
    filters: bool,
}

impl Shape {
    /// A mapping whose keys are `fields`, with `children` under some of them.
    pub(crate) const fn new(
        fields: fn() -> &'static [&'static str],
        children: &'static [(&'static str, &'static Shape)],
    ) -> Self {
        Self {
            fields,
            children,
            filters: false,
        }
    }
}

/// A mapping read by `T`, with nothing nested under its keys.
pub(crate) const fn leaf<T: for<'de> Deserialize<'de>>() -> Shape {
    Shape::new(fields_of::<T>, &[])
}

static CONFIG: Shape = Shape {
    fields: fields_of::<RawConfig>,
    children: &[
        ("listeners", &LISTENER),
        ("routes", &ROUTE),
        ("clusters", &CLUSTER),
        ("limits", &LIMITS),
        ("shutdown", &leaf::<RawShutdown>()),
        ("admin", &leaf::<RawAdmin>()),
        ("tracing", &leaf::<RawTracing>()),
        ("access_log", &leaf::<RawAccessLog>()),
    ],
    filters: false,
};
static LIMITS: Shape = Shape {
    fields: fields_of::<RawLimits>,
    children: &[("http2", &leaf::<RawHttp2Limits>())],
    filters: false,
};
static LISTENER: Shape = Shape {
    fields: fields_of::<RawListener>,
    children: &[
        ("tls", &LISTENER_TLS),
        ("limits", &leaf::<RawClientLimits>()),
    ],
    filters: false,
};
static LISTENER_TLS: Shape = Shape {
    fields: fields_of::<RawTls>,
    children: &[
        ("certificates", &leaf::<RawCertificate>()),
        ("client_auth", &leaf::<RawClientAuth>()),
    ],
    filters: false,
};
static ROUTE: Shape = Shape {
    fields: fields_of::<RawRoute>,
    children: &[
        ("match", &MATCH),
        ("redirect", &leaf::<RawRedirect>()),
        ("backends", &leaf::<RawWeighted>()),
        ("request_headers", &leaf::<RawHeaderEdits>()),
        ("response_headers", &leaf::<RawHeaderEdits>()),
        ("rewrite", &leaf::<RawRewrite>()),
        ("retries", &leaf::<RawRouteRetries>()),
    ],
    filters: true,
};
static MATCH: Shape = Shape {
    fields: fields_of::<RawMatch>,
    children: &[("path", &leaf::<RawPath>())],
    filters: false,
};
static CLUSTER: Shape = Shape {
    fields: fields_of::<RawCluster>,
    children: &[
        ("backends", &leaf::<RawBackend>()),
        ("timeouts", &leaf::<RawTimeouts>()),
        ("health_check", &leaf::<RawHealthCheck>()),
        ("outlier_detection", &leaf::<RawOutlierDetection>()),
        ("retries", &leaf::<RawRetries>()),
        ("tls", &leaf::<RawUpstreamTls>()),
        ("http2", &leaf::<RawHttp2Windows>()),
        ("hash", &leaf::<RawHash>()),
        ("sticky", &leaf::<RawSticky>()),
    ],
    filters: false,
};

/// Every key the schema reads, as a dotted path from the top (`clusters.health_check.interval`; a
/// list's items add no step), in the order of the structs. The configuration reference is checked
/// against it, so a key added here without an entry there fails a test.
/// `filters` are the shapes of the keys a route's filters read.
pub(crate) fn schema_keys(filters: &[Shape]) -> Vec<String> {
    let mut keys = Vec::new();
    collect_keys(&CONFIG, filters, "", &mut keys);
    keys
}

fn collect_keys(shape: &Shape, filters: &[Shape], prefix: &str, keys: &mut Vec<String>) {
    for (field, child) in shape.keys(filters) {
        let path = format!("{prefix}{field}");
        keys.push(path.clone());
        if let Some(child) = child {
            collect_keys(child, filters, &format!("{path}."), keys);
        }
    }
}

impl Shape {
    /// Every key of the mapping, each with the shape under it if it has one; a route's own keys
    /// come first, then its filters', in their order.
    fn keys<'a>(
        &'a self,
        filters: &'a [Shape],
    ) -> impl Iterator<Item = (&'static str, Option<&'static Shape>)> + 'a {
        let extra = if self.filters { filters } else { &[] };
        std::iter::once(self).chain(extra).flat_map(|shape| {
            (shape.fields)().iter().map(|&field| {
                let child = shape.children.iter().find(|(name, _)| *name == field);
                (field, child.map(|&(_, child)| child))
            })
        })
    }
}

/// A key the schema does not have: its name, location and the keys allowed where it stands.
pub(crate) struct UnknownKey<'a> {
    pub(crate) key: &'a Spanned<String>,
    pub(crate) expected: Vec<&'static str>,
}

/// Every key of `root` that no struct reads. Values of the wrong kind are left to serde, which
/// reports them with their own message.
/// `filters` are the shapes of the keys a route's filters read.
pub(crate) fn unknown_keys<'a>(root: &'a Node, filters: &[Shape]) -> Vec<UnknownKey<'a>> {
    let mut found = Vec::new();
    walk(root, &CONFIG, filters, &mut found);
    found
}

fn walk<'a>(node: &'a Node, shape: &Shape, filters: &[Shape], found: &mut Vec<UnknownKey<'a>>) {
    match node {
        Node::Seq(items) => (items.iter()).for_each(|item| walk(item, shape, filters, found)),
        Node::Map(entries) => {
            let keys: Vec<_> = shape.keys(filters).collect();
            for (key, value) in entries {
                match keys.iter().find(|(name, _)| *name == key.value) {
                    None => found.push(UnknownKey {
                        key,
                        expected: keys.iter().map(|(name, _)| *name).collect(),
                    }),
                    Some((_, Some(child))) => walk(value, child, filters, found),
                    Some((_, None)) => {}
                }
            }
        }
        Node::Leaf => {}
    }
}

/// The field names a derived `Deserialize` impl passes to `deserialize_struct` (their YAML spelling,
/// after `rename`), read by offering it a deserializer that records them and reads nothing.
pub(crate) fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Recorder<'r>(&'r mut &'static [&'static str]);
    #[derive(Debug)]
    struct Recorded;
    impl fmt::Display for Recorded {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("fields recorded")
        }
    }
    impl std::error::Error for Recorded {}
    impl de::Error for Recorded {
        fn custom<M: fmt::Display>(_: M) -> Self {
            Recorded
        }
    }
    impl<'de> Deserializer<'de> for Recorder<'_> {
        type Error = Recorded;
        fn deserialize_any<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
            Err(Recorded)
        }
        fn deserialize_struct<V: de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Recorded> {
            *self.0 = fields;
            Err(Recorded)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Recorder(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_lists_come_from_the_structs() {
        assert_eq!(fields_of::<RawBackend>(), ["address", "weight"]);
        assert!(
            fields_of::<RawRoute>().contains(&"match"),
            "renamed fields use the YAML name"
        );
    }

    #[test]
    fn schema_keys_are_dotted_paths_through_every_section() {
        let keys = schema_keys(&[]);
        for key in [
            "workers",
            "listeners.tls.cert",
            "routes.match.path.exact",
            "limits.http2.adaptive_window",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
        }
    }

    #[test]
    fn every_unknown_key_is_found_at_every_depth() {
        let text = "\
listeners:
  - address: 127.0.0.1:1
    tls: { cert: a, key: b, chain: c }
routes:
  - match: { pth_prefix: / }
    cluster: web
clusters:
  - name: web
    backends: [ { address: 127.0.0.1:2, wieght: 2 } ]
    timeouts: { conect: 1s }
limitz: {}
";
        let node: Node = serde_saphyr::from_str(text).expect("parses");
        let found: Vec<_> = unknown_keys(&node, &[])
            .iter()
            .map(|u| (u.key.value.clone(), u.key.referenced.line()))
            .collect();
        let expected = [
            ("chain", 3),
            ("pth_prefix", 5),
            ("wieght", 9),
            ("conect", 10),
            ("limitz", 11),
        ];
        assert_eq!(found, expected.map(|(k, l)| (k.to_owned(), l)),);
    }
}
