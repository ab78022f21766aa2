//! The checked configuration the proxy runs on.

pub use crate::field::Location;
use serde::Deserialize;
use std::{net::SocketAddr, num::NonZeroUsize, time::Duration};

/// A checked configuration: every reference resolves, every value is in range.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// How many worker threads to run.
    pub workers: Workers,
    /// Where to accept client connections.
    pub listeners: Vec<Listener>,
    /// Routes in order; the first that matches a request wins.
    pub routes: Vec<Route>,
    /// Backend groups.
    pub clusters: Vec<Cluster>,
    /// Request limits.
    pub limits: Limits,
    /// Shutdown behaviour.
    pub shutdown: Shutdown,
    /// The admin listener (`/metrics`, `/status`, `/healthz`, `/ready`); off when `None`. Keep it on
    /// loopback or a private network: it shows the whole topology.
    pub admin: Option<SocketAddr>,
    /// How long each bucket of the status page's figures over time is (`admin.status_bucket`); the
    /// page keeps the last 30.
    pub admin_status_bucket: std::time::Duration,
    /// OpenTelemetry traces (`tracing:`); off when `None`.
    pub tracing: Option<Tracing>,
    /// What each access-log line holds.
    pub access_log: crate::access_log::AccessLog,
}

/// `workers: auto | N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workers {
    /// One per available core, counted by the binary when it starts (this crate does no I/O).
    #[default]
    Auto,
    /// Exactly this many.
    Count(NonZeroUsize),
}

/// A client-facing listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// The name routes' `listeners:` may use for it (they may also write its address).
    pub name: Option<String>,
    /// Address to bind; port 0 lets the OS choose.
    pub address: SocketAddr,
    /// Terminate TLS on this listener with these certificates; plain HTTP when `None`.
    pub tls: Option<ListenerTls>,
    /// Peers (other proxies, load balancers) whose `X-Forwarded-For` chain is kept and extended. From
    /// anyone else, every forwarding field a client sent is dropped and rebuilt. Default: nobody.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The PROXY protocol header every connection starts with (from an L4 balancer in front): its
    /// source address becomes the client. Only `trusted_proxies` may send it; `None`: not read.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// What becomes of a request field whose name holds an underscore. Default: dropped.
    pub underscores_in_headers: Underscores,
    /// Caps on each client address's connections, enforced at accept. Default: none.
    pub limits: ClientLimits,
}

/// A listener's `limits:`: caps on each client address's connections, counted per duet process
/// (every worker's connections together) and enforced as a connection is accepted, before any TLS
/// handshake; a connection over a cap is closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// The most connections open at once from one address (`connections_per_client`).
    pub connections: Option<u32>,
    /// The most new connections from one address per period (`new_connections_per_client:
    /// 100/s`): the count and the period; the count may also come at once after a quiet spell.
    pub new_connections: Option<(u32, Duration)>,
    /// The most client addresses tracked at once (`max_clients`); past it, addresses with no
    /// connection open are forgotten first (one forgotten starts again with a full allowance).
    pub max_clients: u32,
}

impl ClientLimits {
    /// What `max_clients` means when left out.
    pub const DEFAULT_MAX_CLIENTS: u32 = 100_000;

    /// Whether any cap is set.
    pub fn any(&self) -> bool {
        self.connections.is_some() || self.new_connections.is_some()
    }
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            connections: None,
            new_connections: None,
            max_clients: Self::DEFAULT_MAX_CLIENTS,
        }
    }
}

/// `proxy_protocol:` of a listener: which versions of HAProxy's PROXY protocol header it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    /// The text header (`PROXY TCP4 ...\r\n`).
    V1,
    /// The binary header.
    V2,
    /// Either, told apart by the first byte.
    Any,
}

impl ProxyProtocol {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
            Self::Any => "any",
        }
    }
}

/// `underscores_in_headers:` of a listener. CGI and WSGI backends (and the frameworks on them) read a
/// field as `HTTP_` and its name upper-cased with `-` as `_`, so `X_Forwarded_For` reaches them as the
/// `X-Forwarded-For` duet rebuilt, and `X_Team` as the `X-Team` a route sets: the forwarding and
/// header-edit protections, which go by name, would not see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underscores {
    /// Dropped before routing, each counted (nginx's default, `underscores_in_headers off`).
    #[default]
    Drop,
    /// Forwarded as sent, for clients and backends that need such names.
    Keep,
}

impl Underscores {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Drop => "drop",
            Self::Keep => "keep",
        }
    }
}

impl Listener {
    /// Whether a connection from `peer` comes from a trusted proxy.
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&peer))
    }
}

/// A listener's `tls:`: the certificates it serves, chosen by the name the client asks for (SNI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Every certificate with its key, in the order written (never empty). A name two of them cover
    /// goes to the first.
    pub certificates: Vec<TlsFiles>,
    /// The index in `certificates` of the one served without SNI or for a name none covers: `default:`,
    /// else the first.
    pub default: usize,
    /// The oldest TLS version accepted.
    pub min_version: TlsVersion,
    /// Client certificates asked for, verified against a CA; `None`: not asked for.
    pub client_auth: Option<ClientAuth>,
    /// Whether sessions resume from tickets duet encrypts under keys it rotates (`true`, the default),
    /// rather than from each acceptor's own session cache only.
    pub session_tickets: bool,
    /// Where the `tls` block is written.
    pub at: Location,
}

/// `client_auth:` of a listener's `tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuth {
    /// The CAs (PEM) client certificates must chain to.
    pub ca: std::path::PathBuf,
    /// Where `ca` is written.
    pub ca_at: Location,
    /// Whether a client without a certificate is refused (`required`) or served (`optional`).
    pub required: bool,
}

/// `min_version:` of a listener's `tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3 (the default).
    #[default]
    V1_2,
    /// TLS 1.3 only.
    V1_3,
}

impl TlsVersion {
    /// The name as written in the config (`"1.2"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::V1_2 => "1.2",
            Self::V1_3 => "1.3",
        }
    }
}

/// PEM files for a TLS listener. Relative paths in the file are taken from the config file's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: std::path::PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
    /// Where `cert` is written in the file, for errors when it cannot be read.
    pub cert_at: Location,
    /// Where `key` is written in the file.
    pub key_at: Location,
    /// A DER OCSP response to staple (`ocsp:`, listener certificates only), refreshed by an outside
    /// tool; with where it is written.
    pub ocsp: Option<(std::path::PathBuf, Location)>,
}

/// A routing rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The route's name in metrics (`route` label): `name:` from the file, or else its match written
    /// as `HOST/PREFIX` (`*/api` with no host). Unique within a config.
    pub name: String,
    /// Host to match (port ignored, case-insensitive); `None` matches any host.
    pub host: Option<HostPattern>,
    /// What the normalised path must be: a prefix (`/`, the default, matches every path), the whole
    /// path, or a regular expression.
    pub path: PathMatch,
    /// Methods the request must have (upper case); empty: any method.
    pub methods: Vec<http_method::Method>,
    /// Header fields the request must all carry, each with a matching value.
    pub headers: Vec<HeaderMatch>,
    /// Query parameters the request must all carry, each with exactly this value (compared as
    /// written in the target, percent-encoding included).
    pub query: Vec<(String, String)>,
    /// Where a matching request goes.
    pub action: Action,
    /// The listeners (indexes into [`Config::listeners`]) whose requests this route may take, so that
    /// a route meant for an internal listener never answers on a public one. `None` (the default):
    /// every listener.
    pub listeners: Option<Vec<usize>>,
    /// Methods that may be retried after the request reached a backend. Default: the idempotent methods
    /// of RFC 9110 §9.2.2 (GET, HEAD, OPTIONS, TRACE, PUT, DELETE).
    pub retry_methods: Vec<http_method::Method>,
    /// Longest time from the request reaching duet to the response head leaving it, all attempts
    /// included (Envoy's route timeout); past it, 504. `None` (the default): each attempt is bounded by
    /// its cluster's timeouts alone.
    pub timeout: Option<std::time::Duration>,
    /// Read the whole request body (at most this many bytes) before a backend is picked, so a slow
    /// upload never holds a backend (nginx's `proxy_request_buffering on`). A larger body gets 413: it is
    /// never streamed, nor spooled to disk. `None` (the default): bodies are streamed as they arrive.
    pub buffer_request: Option<usize>,
    /// `request_headers:`: what is changed in the request on its way to the backend, after duet's own
    /// fields (hop-by-hop out, `X-Forwarded-*` and `X-Request-Id` in) are settled.
    pub request_headers: HeaderEdits,
    /// `response_headers:`: what is changed in a backend's response on its way to the client (duet's
    /// own answers, such as a 502 or a redirect, are left as duet writes them).
    pub response_headers: HeaderEdits,
    /// `rewrite:`: the path and Host the backend gets instead of the request's.
    pub rewrite: Rewrite,
    /// `retries: { attempts }`: attempts per request on this route, the first included, in place of
    /// its cluster's `retries.attempts`. `None`: the cluster's.
    pub retry_attempts: Option<u32>,
    /// Where the route starts in the file, for warnings about it (`duet check`'s shadowed routes).
    pub at: Location,
    /// The settings of the route's filters (`hsts:`, `allow:`, `rate_limit:`...), each in its
    /// module of [`filter`](crate::filter).
    pub filters: crate::filter::Filters,
}

impl Route {
    /// The largest request body the route takes under `limits`, if any.
    pub fn body_limit(&self, limits: &Limits) -> Option<u64> {
        let route = self.filters.max_request_body.map(|max| max.bytes);
        Some(route.unwrap_or(limits.max_request_body)).filter(|&max| max > 0)
    }
}

impl Route {
    /// Whether a request that came on the listener at `listener` (its index in
    /// [`Config::listeners`]) may take this route.
    pub fn serves(&self, listener: usize) -> bool {
        self.listeners
            .as_ref()
            .is_none_or(|listeners| listeners.contains(&listener))
    }

    /// Where the route sends requests, for people to read: the cluster's name, a split as
    /// `api-v1:95 api-v2:5` (each cluster with its weight), or the redirect.
    pub fn target(&self, clusters: &[Cluster]) -> String {
        let name = |index: usize| clusters.get(index).map_or("", |c| c.name.as_str());
        match &self.action {
            Action::Cluster(index) => name(*index).to_owned(),
            Action::Split(split) => split
                .iter()
                .map(|w| format!("{}:{}", name(w.cluster), w.weight))
                .collect::<Vec<_>>()
                .join(" "),
            Action::Redirect(redirect) => redirect.to_string(),
            Action::Respond => "respond".to_owned(),
        }
    }

    /// The route's filters, for people to read: empty when there are none, else each after a space,
    /// as ` request_headers set x-team=api rewrite path_prefix /v2 retries 2`.
    pub fn describe_filters(&self) -> String {
        let mut text = String::new();
        for (name, edits) in [
            ("request_headers", &self.request_headers),
            ("response_headers", &self.response_headers),
        ] {
            if !edits.is_empty() {
                text.push_str(&format!(" {name}{edits}"));
            }
        }
        if !self.rewrite.is_empty() {
            text.push_str(&format!(" rewrite{}", self.rewrite));
        }
        if let Some(attempts) = self.retry_attempts {
            text.push_str(&format!(" retries {attempts}"));
        }
        text.push_str(&self.filters.describe());
        text
    }

    /// The matchers beyond host and path, for people to read (`check`, `check --diff`): empty when
    /// there are none, else each one after a space, as ` method GET,HEAD header x-env=canary`.
    pub fn conditions(&self) -> String {
        let mut text = String::new();
        if !self.methods.is_empty() {
            text.push_str(&format!(" method {}", self.methods.join(",")));
        }
        for header in &self.headers {
            match &header.value {
                ValueMatch::Exact(value) => {
                    text.push_str(&format!(" header {}={value}", header.name))
                }
                ValueMatch::Regex(p) => {
                    text.push_str(&format!(" header {}~{}", header.name, p.regex().as_str()))
                }
            }
        }
        for (name, value) in &self.query {
            text.push_str(&format!(" query {name}={value}"));
        }
        text
    }
}

/// What a route does with the requests it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Proxy to the cluster at this index into [`Config::clusters`].
    Cluster(usize),
    /// Proxy each request to one of two or more clusters, in shares set by their weights (smooth
    /// weighted round robin, per worker): `backends: [{ cluster, weight }, ...]`. Clusters of weight 0
    /// get nothing (a canary staged before it ramps up); at least one weight is above 0.
    Split(Vec<WeightedCluster>),
    /// Answer with a redirect, without touching a backend.
    Redirect(Redirect),
    /// Answer with the route's `respond:` (in its filters), without touching a backend.
    Respond,
}

impl Action {
    /// The cluster's index, for a route that proxies to one cluster.
    pub fn cluster(&self) -> Option<usize> {
        match self {
            Self::Cluster(index) => Some(*index),
            Self::Split(_) | Self::Redirect(_) | Self::Respond => None,
        }
    }

    /// Every cluster the route may send to (indexes into [`Config::clusters`]), in the order written,
    /// weight-0 ones included; none for a redirect.
    pub fn clusters(&self) -> impl Iterator<Item = usize> + '_ {
        self.weighted().map(|(index, _)| index)
    }

    /// Each cluster the action sends to (index into [`Config::clusters`]) with its weight: a single
    /// cluster at 1, each cluster of a split with its own; none for a redirect.
    pub fn weighted(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let split = match self {
            Self::Split(split) => &split[..],
            Self::Cluster(_) | Self::Redirect(_) | Self::Respond => &[],
        };
        (self.cluster().map(|index| (index, 1)).into_iter())
            .chain(split.iter().map(|w| (w.cluster, w.weight)))
    }
}

/// One cluster of a split and its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightedCluster {
    /// Index into [`Config::clusters`].
    pub cluster: usize,
    /// Relative share, 0 to 1,000,000 (Gateway API's range); default 1.
    pub weight: u32,
}

/// `request_headers:` or `response_headers:`. Applied in the order remove, set, add; never to
/// hop-by-hop or framing fields, nor to Host (which only `rewrite.host` changes): the config refuses
/// those.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderEdits {
    /// Fields replaced (every field of that name goes, then this one is added), names lowercased.
    pub set: Vec<(String, String)>,
    /// Fields appended beside any of the same name already there.
    pub add: Vec<(String, String)>,
    /// Fields removed, names lowercased.
    pub remove: Vec<String>,
}

impl HeaderEdits {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

impl std::fmt::Display for HeaderEdits {
    /// ` set x-team=api add x-via=duet remove server`: each edit after a space.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, value) in &self.set {
            write!(f, " set {name}={value}")?;
        }
        for (name, value) in &self.add {
            write!(f, " add {name}={value}")?;
        }
        for name in &self.remove {
            write!(f, " remove {name}")?;
        }
        Ok(())
    }
}

/// `rewrite:`: what the backend gets in place of the request's path and Host. The query is kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rewrite {
    /// The new path; `None`: the request's (normalised) path.
    pub path: Option<PathRewrite>,
    /// The Host the backend gets (`name` or `name:port`, lowercased); `None`: the request's.
    /// `X-Forwarded-Host` still names the request's.
    pub host: Option<String>,
}

impl Rewrite {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.path.is_none() && self.host.is_none()
    }
}

impl std::fmt::Display for Rewrite {
    /// ` path_prefix /v2 host internal.example.com`: each part after a space.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(PathRewrite::Full(path)) => write!(f, " path {path}")?,
            Some(PathRewrite::Prefix(prefix)) => write!(f, " path_prefix {prefix}")?,
            None => {}
        }
        if let Some(host) = &self.host {
            write!(f, " host {host}")?;
        }
        Ok(())
    }
}

/// How a rewrite changes the path (normalised, as every path written in the config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRewrite {
    /// The whole path is replaced.
    Full(String),
    /// The prefix the route matched is replaced (Gateway API's `ReplacePrefixMatch`), only on a route
    /// that matches a prefix.
    Prefix(String),
}

/// `redirect:`: the parts of the request's URL to change; the query is always kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https`; `None`: the request's.
    pub scheme: Option<String>,
    /// A host name (lowercased; an IPv6 address without brackets); `None`: the request's.
    pub host: Option<String>,
    /// `None`: the scheme's default port when `scheme` is given, else the request's port.
    pub port: Option<u16>,
    /// The new path; `None`: the request's (normalised) path.
    pub path: Option<RedirectPath>,
    /// 301, 302 (the default), 303, 307 or 308.
    pub status: u16,
}

impl std::fmt::Display for Redirect {
    /// `redirect 308 scheme https port 443`: the status and each part changed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redirect {}", self.status)?;
        if let Some(scheme) = &self.scheme {
            write!(f, " scheme {scheme}")?;
        }
        if let Some(host) = &self.host {
            write!(f, " host {host}")?;
        }
        if let Some(port) = self.port {
            write!(f, " port {port}")?;
        }
        match &self.path {
            Some(RedirectPath::Full(path)) => write!(f, " path {path}"),
            Some(RedirectPath::Prefix(prefix)) => write!(f, " path_prefix {prefix}"),
            None => Ok(()),
        }
    }
}

/// How a redirect changes the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedirectPath {
    /// The whole path is replaced.
    Full(String),
    /// The prefix the route matched is replaced by this (only on a route matching a prefix).
    Prefix(String),
}

/// How a route matches the path, which duet has normalised first (no dot segments, no `//`, no
/// percent-encoded unreserved characters), so exact paths and prefixes are written normalised too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// A plain string prefix, as in nginx and Envoy: `/public` also matches `/publicity`.
    Prefix(String),
    /// The whole path, without the query.
    Exact(String),
    /// A regular expression searched in the path (anchor it with `^...$` to match all of it).
    Regex(Pattern),
}

impl PathMatch {
    /// Whether `path` (normalised, without the query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Prefix(prefix) => path.starts_with(prefix.as_str()),
            Self::Exact(exact) => path == exact,
            Self::Regex(pattern) => pattern.regex().is_match(path),
        }
    }
}

impl std::fmt::Display for PathMatch {
    /// A prefix as written, `=/healthz` for an exact path, `~^/users/[0-9]+$` for a regex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Prefix(prefix) => f.write_str(prefix),
            Self::Exact(exact) => write!(f, "={exact}"),
            Self::Regex(pattern) => write!(f, "~{}", pattern.regex().as_str()),
        }
    }
}

/// A regular expression compiled once when the config is read (the `regex` crate: linear time in the
/// input, no backtracking). Two are equal when written the same.
///
/// Linear time is not small memory: a counted repetition of a Unicode class compiles to megabytes
/// (`\w{1,50}` is 2.5 MiB, `\pL{1,100}` 4.3 MiB), and every worker holds the config. So one regex may
/// compile to at most [`SIZE_LIMIT`](Self::SIZE_LIMIT), a tenth of the crate's default, and the config
/// check holds all of a config's regexes to [`TOTAL_LIMIT`](Self::TOTAL_LIMIT).
#[derive(Debug, Clone)]
pub struct Pattern {
    regex: regex::Regex,
    /// The heap the compiled expression holds (its search caches apart).
    memory: usize,
}

/// Why a regex is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatternError {
    /// It does not parse: what the parser says.
    Invalid(String),
    /// It compiles to more than [`Pattern::SIZE_LIMIT`].
    TooLarge,
}

impl Pattern {
    /// The most one regex may compile to (the `regex` crate's `size_limit`): 1 MiB. Paths and header
    /// values need far less: `^/users/[0-9]+$` is 2 KiB, `\w+` 57 KiB.
    pub const SIZE_LIMIT: usize = 1 << 20;
    /// The most a config's regexes may hold together: 16 MiB.
    pub const TOTAL_LIMIT: usize = 16 << 20;

    /// Compiles `text`, refused past [`SIZE_LIMIT`](Self::SIZE_LIMIT).
    pub fn new(text: &str) -> Result<Self, PatternError> {
        let regex = regex::RegexBuilder::new(text)
            .size_limit(Self::SIZE_LIMIT)
            .build()
            .map_err(|error| match error {
                regex::Error::CompiledTooBig(_) => PatternError::TooLarge,
                other => PatternError::Invalid(other.to_string()),
            })?;
        // The same expression as the meta regex `regex` wraps, which can say what it holds.
        let memory = regex_automata::meta::Regex::new(text).map_or(0, |m| m.memory_usage());
        Ok(Self { regex, memory })
    }

    /// The compiled expression.
    pub fn regex(&self) -> &regex::Regex {
        &self.regex
    }

    /// The heap the compiled expression holds, in bytes (its search caches apart).
    pub fn memory_usage(&self) -> usize {
        self.memory
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.regex.as_str() == other.regex.as_str()
    }
}

impl Eq for Pattern {}

/// One header a route requires: every field of that name counts, and one matching is enough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatch {
    /// The field name, lowercased (names are case-insensitive).
    pub name: String,
    /// What its value must be.
    pub value: ValueMatch,
}

/// A header value to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// Exactly this value (case-sensitive, as field values are).
    Exact(String),
    /// A regular expression searched in the value.
    Regex(Pattern),
}

impl ValueMatch {
    /// Whether `value` matches.
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            Self::Exact(exact) => value == exact.as_bytes(),
            Self::Regex(pattern) => {
                std::str::from_utf8(value).is_ok_and(|v| pattern.regex().is_match(v))
            }
        }
    }
}

/// HTTP method names, kept as text so this crate needs no HTTP library.
pub mod http_method {
    /// An upper-case HTTP method name.
    pub type Method = String;

    /// RFC 9110 §9.2.2's idempotent methods.
    pub fn idempotent() -> Vec<Method> {
        ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]
            .map(String::from)
            .to_vec()
    }
}

/// `api.example.com` (exact) or `*.example.com` (any subdomain, not the apex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// The host, lowercased, without a trailing dot (an IPv6 address without its brackets).
    Exact(String),
    /// The suffix after the `*`, lowercased, starting with a dot.
    Wildcard(String),
}

/// How a cluster picks a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Power of two choices on requests in flight.
    P2cInflight,
    /// Power of two choices on PeakEWMA latency × (in flight + 1).
    #[default]
    P2cPeakEwma,
    /// Power of two choices with memory on requests in flight: the backends this worker's requests
    /// completed on since its last pick (each has just freed a slot) take the place of fresh random
    /// candidates. Still two load reads per pick. Opt-in: for backends with a few request slots each
    /// run near saturation.
    P2cMemoryInflight,
    /// Power of two choices with memory on PeakEWMA latency × (in flight + 1).
    P2cMemoryPeakEwma,
    /// Least requests in flight by a full scan (nginx's `least_conn`, HAProxy's `leastconn`): every
    /// eligible backend's count is read on every pick, in flight ÷ weight. Equal minimums go to the
    /// backend with the lower latency average (this worker's own) when weights are equal, and are drawn
    /// at random by weight when they differ. Opt-in, and the one exception to two load reads per pick: it reads n, and many
    /// balancers scanning one view herd; duet's workers each scan only their own counts. For one or a few
    /// workers over backends with a few request slots each, run near saturation.
    LeastInflight,
    /// Least PeakEWMA latency × (in flight ÷ weight + 1) by a full scan: the same exception.
    LeastPeakEwma,
    /// Each backend in turn (baseline).
    RoundRobin,
    /// Uniformly random (baseline).
    Random,
    /// Consistent hashing with bounded loads on the cluster's `hash:` key (Maglev): a key goes to its
    /// home backend while that backend is under `bound` times its share of the requests in flight,
    /// else to its next candidates. Requests without the key go by `p2c_peak_ewma`.
    Hash,
}

impl Policy {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Self::P2cInflight => "p2c_inflight",
            Self::P2cPeakEwma => "p2c_peak_ewma",
            Self::P2cMemoryInflight => "p2c_memory_inflight",
            Self::P2cMemoryPeakEwma => "p2c_memory_peak_ewma",
            Self::LeastInflight => "least_inflight",
            Self::LeastPeakEwma => "least_peak_ewma",
            Self::RoundRobin => "round_robin",
            Self::Random => "random",
            Self::Hash => "hash",
        }
    }
}

/// The protocol duet speaks to a cluster's backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1, one request per connection at a time (the default).
    #[default]
    Http1,
    /// HTTP/2 by prior knowledge (gRPC backends): many requests share each connection.
    H2,
}

impl UpstreamProtocol {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::H2 => "h2",
        }
    }
}

/// `send_proxy_protocol:` of a cluster: the PROXY protocol header each new connection to its backends
/// starts with, naming the client the connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendProxyProtocol {
    /// The text header (`PROXY TCP4 ...\r\n`).
    V1,
    /// The binary header.
    V2,
}

impl SendProxyProtocol {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }
}

/// A group of interchangeable backends.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Unique name, referenced by routes.
    pub name: String,
    /// Selection policy.
    pub policy: Policy,
    /// The protocol toward the backends: `http1` (default) or `h2`.
    pub protocol: UpstreamProtocol,
    /// The backends.
    pub backends: Vec<Backend>,
    /// Timeouts toward the backends.
    pub timeouts: Timeouts,
    /// Active health checks, run once per process; `None` when not configured (backends start eligible).
    pub health_check: Option<HealthCheck>,
    /// Passive ejection of failing backends, per worker.
    pub outlier_detection: OutlierDetection,
    /// Retries and their budget.
    pub retries: Retries,
    /// Below this fraction of eligible backends, balance over all of them (panic mode). Default 0.5.
    pub panic_threshold: f64,
    /// Window over which a new or re-admitted backend ramps up to its full weight. Default 0 (off).
    pub slow_start: Duration,
    /// How often backends given by host name are resolved again (all their addresses become
    /// endpoints). Default 30 s; 0 resolves only at load.
    pub dns_refresh: Duration,
    /// Response statuses that mean "overloaded": PeakEWMA records a penalty for them instead of their
    /// latency, so P2C sends the backend less. They do not eject it (a 503 counts toward
    /// `outlier_detection.consecutive_5xx` only when that is set, as any 5xx). Default 429, 503.
    pub penalty_statuses: Vec<u16>,
    /// TLS toward the backends; plain HTTP when `None`.
    pub tls: Option<UpstreamTls>,
    /// Flow-control windows of `protocol: h2` connections to the backends (`http2:`). Default
    /// [`Http2Windows::BACKEND`].
    pub http2: Http2Windows,
    /// `hash:`, the affinity of `policy: hash` (`Some` exactly then).
    pub hash: Option<HashPolicy>,
    /// `send_proxy_protocol:`, the PROXY header each new connection to a backend starts with
    /// (HTTP/1.1 clusters only); `None` sends none.
    pub send_proxy_protocol: Option<SendProxyProtocol>,
    /// `sticky:`, sessions bound to a backend by a signed cookie, under any policy; `None`: off.
    pub sticky: Option<Sticky>,
}

/// `sticky:` of a cluster: the cookie that binds a client's session to one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sticky {
    /// The cookie's name.
    pub cookie: String,
    /// The cookie's `Max-Age` (default 1 h; 0 sends none: a session cookie, gone with the browser).
    pub ttl: Duration,
    /// The key the cookie is signed under.
    pub secret: StickySecret,
    /// Where `sticky:` is written, for `duet check`'s warning about a random key.
    pub at: Location,
}

/// The key a sticky cookie is signed with (HMAC-SHA256).
#[derive(Clone, PartialEq, Eq)]
pub enum StickySecret {
    /// None configured: a random key drawn once per process. Cookies then hold only for this
    /// process: not across a restart, nor on another duet instance behind the same L4 balancer.
    Random,
    /// `secret:` or the bytes of `secret_file:` (read with the config, again on each reload): shared
    /// by every instance given the same, so a cookie holds across restarts and instances.
    Shared(Vec<u8>),
}

impl std::fmt::Debug for StickySecret {
    /// Never the secret itself: a config is logged and printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Random => f.write_str("Random"),
            Self::Shared(bytes) => write!(f, "Shared({} bytes)", bytes.len()),
        }
    }
}

/// `hash:` of a `policy: hash` cluster: what keys a request, and how a key's load is bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct HashPolicy {
    /// What is hashed.
    pub key: HashKey,
    /// Each backend takes a key only while under `bound` × its share of the requests in flight
    /// (≥ 1; default 1.25).
    pub bound: f64,
    /// Where a key goes past a full home.
    pub walk: HashWalk,
    /// The table a key's home is read from.
    pub algorithm: HashAlgorithm,
}

/// The request's affinity key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// `header:NAME`: the first value of this header (name lowercased).
    Header(String),
    /// `cookie:NAME`: this cookie's value.
    Cookie(String),
    /// `query:NAME`: this query parameter's value, as written.
    Query(String),
    /// `client_ip`: the client's address (the peer's, or the one a trusted proxy gave).
    ClientIp,
    /// `path`: the request path, without the query.
    Path,
}

/// The table a key's home is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashAlgorithm {
    /// `maglev`: a Maglev table of 65,537 entries; keys spread evenly, a few keys of other backends
    /// move when one leaves or joins.
    #[default]
    Maglev,
    /// `ring`: a hash ring of 1,024 points per backend; only the keys of a backend that leaves or joins
    /// move, its share within a few percent.
    Ring,
}

/// Where a key goes when its home backend is over the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashWalk {
    /// `next`: the first of its next candidates under the bound (HAProxy's `hash-balance-factor`).
    Next,
    /// `p2c`: the one with fewer requests in flight of its first two candidates under the bound.
    #[default]
    P2c,
}

/// `tls:` of a cluster: how duet speaks TLS to its backends. The files are read when duet starts and
/// again on every reload (rotation); nothing here is read by this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// PEM certificates to trust (the backends' CA) and where `ca` is written; `None`: Mozilla's
    /// roots, compiled into duet (webpki-roots); the system's store is not read.
    pub ca: Option<(std::path::PathBuf, Location)>,
    /// The name to send (SNI) and to verify the backend's certificate against; `None`: each
    /// backend's host name.
    pub server_name: Option<String>,
    /// A client certificate and key to present, for backends that require one (mutual TLS).
    pub client: Option<TlsFiles>,
    /// Whether the backend's certificate is verified (default true). `false` still encrypts, but
    /// trusts any certificate: `duet check` warns about it.
    pub verify: bool,
    /// Where the `tls` block is written.
    pub at: Location,
}

/// Active health checking of a cluster's backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Path requested with GET. Default `/healthz`.
    pub path: String,
    /// Time between checks of one backend. Default 2 s.
    pub interval: Duration,
    /// Time a check may take. Default 1 s.
    pub timeout: Duration,
    /// Consecutive passes that make an unhealthy backend healthy. Default 2.
    pub healthy_threshold: u32,
    /// Consecutive failures that make a healthy backend unhealthy. Default 3.
    pub unhealthy_threshold: u32,
    /// Inclusive status ranges that pass. Default 200–399.
    pub expected_statuses: Vec<(u16, u16)>,
}

impl HealthCheck {
    /// Whether `status` passes.
    pub fn passes(&self, status: u16) -> bool {
        self.expected_statuses
            .iter()
            .any(|&(low, high)| (low..=high).contains(&status))
    }
}

impl Default for HealthCheck {
    fn default() -> Self {
        Self {
            path: "/healthz".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            expected_statuses: vec![(200, 399)],
        }
    }
}

/// Passive outlier ejection, decided by each worker from its own traffic.
///
/// Only what a backend does by itself ejects it by default: a client can make a backend answer 5xx (a
/// request that trips a bug) or 429 (its own quota), and ejection takes the backend away from every
/// client. Statuses that mean "overloaded" feed PeakEWMA's penalty instead (`penalty_statuses`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutlierDetection {
    /// Consecutive failures of the backend's own making that eject it: connection refused or reset,
    /// a timeout, a response that is not HTTP, a body cut or stalled. 0 disables. Default 5.
    pub consecutive_failures: u32,
    /// Consecutive 5xx responses that eject a backend (Envoy's `consecutive_5xx`). 0 (the default):
    /// responses never eject, whatever their status.
    pub consecutive_5xx: u32,
    /// First ejection time; doubled for each further ejection in a row. Default 10 s.
    pub base_ejection_time: Duration,
    /// Cap on the ejection time. Default 300 s; below `base_ejection_time` (0 included), every
    /// ejection lasts `base_ejection_time`.
    pub max_ejection_time: Duration,
    /// Never eject more than this fraction of the cluster (rounded down), except that one backend of
    /// two or more may always be ejected, and never the last one. Default 0.1 (Envoy's): one backend
    /// at a time in clusters of 2 to 19, two in clusters of 20 to 29.
    pub max_ejection_fraction: f64,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            consecutive_5xx: 0,
            base_ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_fraction: 0.1,
        }
    }
}

/// Retries of failed attempts, each re-picked by P2C among backends not tried yet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retries {
    /// Attempts per request, the first included. 1 disables retries. Default 3.
    pub attempts: u32,
    /// Retries allowed as a fraction of recent requests (over 10 s). Default 0.2.
    pub budget_fraction: f64,
    /// Retries allowed per second regardless of traffic. Default 10.
    pub min_retries_per_second: u32,
    /// Request bodies up to this size are kept to be replayed. Default 64 KiB.
    pub replay_body_limit: usize,
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            attempts: 3,
            budget_fraction: 0.2,
            min_retries_per_second: 10,
            replay_body_limit: 64 * 1024,
        }
    }
}

impl Cluster {
    /// Whether any backend is given by host name (and so is resolved by the binary's discovery).
    pub fn has_named_backends(&self) -> bool {
        self.backends
            .iter()
            .any(|b| matches!(b.address, BackendAddress::Name { .. }))
    }
}

/// One backend server, as written in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Where it is: an IP address, or a host name that discovery resolves (every address it has
    /// becomes an endpoint).
    pub address: BackendAddress,
    /// Relative capacity; 0 takes it out of rotation.
    pub weight: u32,
}

/// A backend's address as written: `IP:PORT`, or `HOST:PORT` for discovery to resolve.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BackendAddress {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A host name and port, resolved by the binary (at start and every `dns_refresh`), never here.
    Name {
        /// The host name.
        host: String,
        /// The port.
        port: u16,
    },
}

impl std::fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ip(address) => address.fmt(f),
            Self::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Timeouts toward a cluster's backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect. Default 1 s.
    pub connect: Duration,
    /// From sending the request to receiving the response head. Default 15 s.
    pub response_headers: Duration,
    /// How long an idle pooled connection is kept. Default 4 s: below the 5 s keep-alive of Node.js,
    /// uvicorn and Apache httpd (the shortest common backend defaults), so duet closes an idle
    /// connection before its backend does and a request rarely meets the backend's close; reopening
    /// after 4 s of quiet costs one handshake on the local network. 0: no connection is reused.
    pub idle: Duration,
    /// Longest wait between two reads of a response body; past it the client connection is closed and
    /// the backend gets an outlier failure. Default 60 s (nginx's `proxy_read_timeout`).
    pub read: Duration,
    /// How long an upgraded connection (WebSocket) may carry nothing either way. Default 1 h.
    pub tunnel_idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            response_headers: Duration::from_secs(15),
            idle: Duration::from_secs(4),
            read: Duration::from_secs(60),
            tunnel_idle: Duration::from_secs(3600),
        }
    }
}

/// Limits on what clients may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Request line plus headers; larger gets 431. Default 64 KiB.
    pub max_request_head: usize,
    /// Request target length; longer gets 414. Default 8 KiB.
    pub max_uri_length: usize,
    /// Time a client has to send a complete request head, from its first byte (and to finish a TLS
    /// handshake, from the accept). Default 10 s.
    pub header_read_timeout: Duration,
    /// Longest wait for the next piece of a request body; longer gets 408. Default 60 s.
    pub body_read_timeout: Duration,
    /// The slowest a request body may arrive, in bytes per second (Apache's `mod_reqtimeout`
    /// `MinRate`): after [`upload_rate_grace`](Self::upload_rate_grace), each byte received buys
    /// `1 / min_upload_rate` seconds more; a client behind that gets 408. Only time spent waiting on
    /// the client counts (not a backend slow to take a streamed body). 0 (the default): off.
    pub min_upload_rate: u64,
    /// The time a request body has before `min_upload_rate` starts to count. Default 10 s.
    pub upload_rate_grace: Duration,
    /// Longest a write to a client may make no progress; past it both sides are closed. Over HTTP/2
    /// it also bounds each stream: one whose client takes none of its response for that long is reset.
    /// Default 60 s (nginx's `send_timeout`).
    pub send_timeout: Duration,
    /// Client connections served at once, per process (split evenly over the workers); past it new
    /// connections wait in the kernel's accept queue. Default 10,000.
    pub max_connections: usize,
    /// How long an idle keep-alive connection waits for its next request, and a new connection for
    /// its first byte. Default 75 s (nginx's); announced to clients as `Keep-Alive: timeout=N`.
    pub keepalive_timeout: Duration,
    /// Requests served on one connection before duet asks the client to reconnect (`Connection: close`),
    /// so long-lived connections rotate across workers. Default 1,000 (nginx's).
    pub keepalive_requests: u64,
    /// Mirrored requests (`mirror:` on a route) in flight at once, per worker; past it a request is not
    /// mirrored (counted as `skipped_cap`), so a slow mirror cluster cannot pile up copies. Default 64.
    pub max_mirrors_in_flight: usize,
    /// The largest request body a route takes when it sets no `max_request_body` of its own, in bytes;
    /// larger gets 413. 0 (the default): no limit.
    pub max_request_body: u64,
    /// Bytes of request bodies read in full (a route's `buffer_request`, or small bodies kept for
    /// retries) held at once, per worker; a request whose body would take the total past it gets 503
    /// rather than duet growing. Default 256 MiB.
    pub max_buffered_bytes: usize,
    /// HTTP/2 client connections.
    pub http2: Http2Limits,
}

/// Limits of HTTP/2 client connections (`limits.http2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    /// Streams a client may have open at once on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    /// Default 100 (nginx's `http2_max_concurrent_streams`, RFC 9113's recommended minimum).
    pub max_concurrent_streams: u32,
    /// The decoded header list of one request, counted as RFC 9113 §6.5.2 says (name, value and 32
    /// bytes per field); larger is 431. `None` (the default): `max_request_head`.
    pub max_header_list_size: Option<usize>,
    /// How often an idle connection is sent a PING to check the client is still there. Default 0
    /// (off: `keepalive_timeout` closes idle connections anyway).
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed. Default 20 s.
    pub keepalive_timeout: Duration,
    /// How much a client may send before duet reads it. Default [`Http2Windows::CLIENT`].
    pub windows: Http2Windows,
}

/// HTTP/2 flow-control windows duet gives a peer (`limits.http2` for clients, a cluster's `http2` for
/// its backends): the bytes of request (or response) body it may send ahead of duet reading them, so
/// they bound what one connection can make duet buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Windows {
    /// `SETTINGS_INITIAL_WINDOW_SIZE`: unread bytes per stream.
    pub initial_stream_window_size: u32,
    /// Unread bytes over all streams of one connection (a WINDOW_UPDATE on stream 0 past RFC 9113's
    /// initial 65,535).
    pub initial_connection_window_size: u32,
    /// hyper's adaptive flow control: windows start at 65,535 and grow with the measured
    /// bandwidth-delay product; the two sizes above are then not used.
    pub adaptive_window: bool,
}

impl Http2Windows {
    /// Toward clients: 256 KiB per stream (a 5 MB/s upload over a 50 ms path), 1 MiB per connection
    /// (hyper's server default), so 10,000 connections cannot make duet hold more than 10 GiB.
    pub const CLIENT: Self = Self {
        initial_stream_window_size: 256 * 1024,
        initial_connection_window_size: 1024 * 1024,
        adaptive_window: false,
    };
    /// Toward backends: hyper's client defaults (2 MiB per stream, 5 MiB per connection): backends
    /// are trusted, and their responses should not wait on duet's window.
    pub const BACKEND: Self = Self {
        initial_stream_window_size: 2 * 1024 * 1024,
        initial_connection_window_size: 5 * 1024 * 1024,
        adaptive_window: false,
    };
    /// The largest window RFC 9113 §6.9.1 allows: 2^31 - 1.
    pub const MAX: u32 = (1 << 31) - 1;
}

impl Default for Http2Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            max_header_list_size: None,
            keepalive_interval: Duration::ZERO,
            keepalive_timeout: Duration::from_secs(20),
            windows: Http2Windows::CLIENT,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_head: 64 * 1024,
            max_uri_length: 8 * 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            min_upload_rate: 0,
            upload_rate_grace: Duration::from_secs(10),
            send_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            keepalive_timeout: Duration::from_secs(75),
            keepalive_requests: 1000,
            http2: Http2Limits::default(),
            max_mirrors_in_flight: 64,
            max_request_body: 0,
            max_buffered_bytes: 256 * 1024 * 1024,
        }
    }
}

/// Shutdown behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    /// How long in-flight requests may run after SIGTERM before connections are closed. Default 30 s.
    pub drain_timeout: Duration,
    /// How long duet keeps accepting after SIGTERM (with `/ready` answering 503), so load balancers in
    /// front stop sending first. Default 0; the Kubernetes manifest sets it.
    pub drain_delay: Duration,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(30),
            drain_delay: Duration::ZERO,
        }
    }
}

/// `tracing:`: OpenTelemetry traces of the requests, exported with OTLP over HTTP (protobuf).
///
/// Sampling is parent-based: a request whose `traceparent` says its trace is sampled joins it, one
/// whose parent is not sampled is not traced, and one without a parent starts a trace for a share
/// `sample` of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    /// Where spans are sent (`otlp: http://127.0.0.1:4318`).
    pub otlp: OtlpEndpoint,
    /// The share of requests without a parent that start a trace, from 0.0 to 1.0 (`sample: 1%`).
    pub sample: f64,
    /// The most finished spans waiting to be sent; past it spans are dropped and counted.
    pub queue: usize,
    /// The `service.name` the spans are exported under.
    pub service_name: String,
}

impl Tracing {
    /// The default share of requests without a parent that start a trace: 1%.
    pub const DEFAULT_SAMPLE: f64 = 0.01;
    /// The default queue of finished spans.
    pub const DEFAULT_QUEUE: usize = 2048;
}

impl std::fmt::Display for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "otlp {}, sample {}%, queue {}, service_name {}",
            self.otlp,
            self.sample * 100.0,
            self.queue,
            self.service_name
        )
    }
}

/// An OTLP/HTTP collector's address: `http://HOST:PORT/PATH`, the path `/v1/traces` when the URL
/// names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// The host name or IP address, as written (IPv6 without brackets).
    pub host: String,
    /// The port (4318, OTLP/HTTP's, when the URL names none).
    pub port: u16,
    /// The request target spans are posted to.
    pub path: String,
}

impl std::fmt::Display for OtlpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "http://[{}]:{}{}", self.host, self.port, self.path)
        } else {
            write!(f, "http://{}:{}{}", self.host, self.port, self.path)
        }
    }
}
