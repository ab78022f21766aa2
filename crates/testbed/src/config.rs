//! duet configurations for tests, the demo and the benchmarks, written by one typed builder into the
//! YAML a user would write (so every test also exercises the real parser).
//!
//! ```
//! use duet_testbed::config::{Cluster, DuetConfig};
//!
//! let backend: std::net::SocketAddr = "127.0.0.1:9001".parse().unwrap();
//! let yaml = DuetConfig::single("p2c_inflight", &[backend])
//!     .workers(2)
//!     .section("limits", "{ body_read_timeout: 400ms }")
//!     .to_yaml();
//! assert!(yaml.contains("policy: p2c_inflight"));
//!
//! let two = DuetConfig::new()
//!     .route(Some("api.test"), "/v1", "api")
//!     .cluster(Cluster::new("api").backend(backend).set("retries", "{ attempts: 1 }"))
//!     .to_yaml();
//! assert!(two.contains("host: 'api.test'"));
//! ```

use std::{fmt::Write, net::SocketAddr};

/// A whole config: workers, listeners, admin, routes, clusters and any other top-level section.
#[derive(Debug, Clone)]
pub struct DuetConfig {
    workers: usize,
    listen: String,
    tls: Option<(String, String)>,
    trusted_proxies: Vec<String>,
    admin: bool,
    routes: Vec<Route>,
    clusters: Vec<Cluster>,
    sections: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
struct Route {
    host: Option<String>,
    path_prefix: String,
    cluster: String,
    /// More keys of the route, as (key, YAML flow value).
    settings: Vec<(String, String)>,
}

/// One cluster: its policy, backends and settings.
#[derive(Debug, Clone)]
pub struct Cluster {
    name: String,
    policy: Option<String>,
    backends: Vec<(String, Option<u32>)>,
    settings: Vec<(String, String)>,
}

impl Default for DuetConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl DuetConfig {
    /// One worker, one listener on `127.0.0.1:0`, no admin, no routes or clusters yet.
    pub fn new() -> Self {
        Self {
            workers: 1,
            listen: "127.0.0.1:0".to_owned(),
            tls: None,
            trusted_proxies: Vec::new(),
            admin: false,
            routes: Vec::new(),
            clusters: Vec::new(),
            sections: Vec::new(),
        }
    }

    /// One catch-all route to cluster `app` over `backends` with `policy`.
    pub fn single(policy: &str, backends: &[SocketAddr]) -> Self {
        let cluster = backends
            .iter()
            .fold(Cluster::new("app").policy(policy), |c, &b| c.backend(b));
        Self::new().route(None, "/", "app").cluster(cluster)
    }

    /// The number of worker threads.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Listens on `address` instead (the only listener).
    pub fn listen(mut self, address: SocketAddr) -> Self {
        self.listen = address.to_string();
        self
    }

    /// Terminates TLS on the listener with these PEM files.
    pub fn tls(mut self, cert: &str, key: &str) -> Self {
        self.tls = Some((cert.to_owned(), key.to_owned()));
        self
    }

    /// Trusts these peers (IPs or CIDRs) to send forwarding fields.
    pub fn trusted_proxies(mut self, peers: &[&str]) -> Self {
        self.trusted_proxies = peers.iter().map(|p| (*p).to_owned()).collect();
        self
    }

    /// Serves the admin endpoints on a loopback port the OS picks.
    pub fn admin(mut self) -> Self {
        self.admin = true;
        self
    }

    /// Adds a route (after those already added: first match wins).
    pub fn route(mut self, host: Option<&str>, path_prefix: &str, cluster: &str) -> Self {
        self.routes.push(Route {
            host: host.map(str::to_owned),
            path_prefix: path_prefix.to_owned(),
            cluster: cluster.to_owned(),
            settings: Vec::new(),
        });
        self
    }

    /// Sets a key of the route added last to a YAML flow value, such as `hedge`, `{ after: p95 }`.
    pub fn route_set(mut self, field: &str, value: &str) -> Self {
        if let Some(route) = self.routes.last_mut() {
            set(&mut route.settings, field, value);
        }
        self
    }

    /// Adds a cluster.
    pub fn cluster(mut self, cluster: Cluster) -> Self {
        self.clusters.push(cluster);
        self
    }

    /// Changes the cluster named `name` (which must have been added).
    pub fn with_cluster(mut self, name: &str, change: impl FnOnce(Cluster) -> Cluster) -> Self {
        if let Some(at) = self.clusters.iter().position(|c| c.name == name) {
            let cluster = self.clusters.remove(at);
            self.clusters.insert(at, change(cluster));
        }
        self
    }

    /// Sets a top-level section (`limits`, `shutdown`) to a YAML flow value such as
    /// `{ drain_timeout: 500ms }`.
    pub fn section(mut self, name: &str, value: &str) -> Self {
        set(&mut self.sections, name, value);
        self
    }

    /// The YAML text.
    pub fn to_yaml(&self) -> String {
        let mut out = format!(
            "workers: {}\nlisteners:\n  - address: {}\n",
            self.workers, self.listen
        );
        if let Some((cert, key)) = &self.tls {
            let _ = writeln!(out, "    tls: {{ cert: {cert}, key: {key} }}");
        }
        if !self.trusted_proxies.is_empty() {
            let _ = writeln!(
                out,
                "    trusted_proxies: [{}]",
                self.trusted_proxies.join(", ")
            );
        }
        if self.admin {
            out.push_str("admin: { address: 127.0.0.1:0 }\n");
        }
        out.push_str("routes:\n");
        for route in &self.routes {
            let host = route
                .host
                .as_ref()
                .map_or_else(String::new, |h| format!("host: '{h}', "));
            let settings: String = (route.settings.iter())
                .map(|(field, value)| format!(", {field}: {value}"))
                .collect();
            let _ = writeln!(
                out,
                "  - {{ match: {{ {host}path_prefix: {} }}, cluster: {}{settings} }}",
                route.path_prefix, route.cluster
            );
        }
        out.push_str("clusters:\n");
        for cluster in &self.clusters {
            cluster.write(&mut out);
        }
        for (name, value) in &self.sections {
            let _ = writeln!(out, "{name}: {value}");
        }
        out
    }
}

impl Cluster {
    /// A cluster with the default policy and no backends yet.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            policy: None,
            backends: Vec::new(),
            settings: Vec::new(),
        }
    }

    /// Its policy: `p2c_peak_ewma`, `p2c_inflight`, `round_robin` or `random`.
    pub fn policy(mut self, policy: &str) -> Self {
        self.policy = Some(policy.to_owned());
        self
    }

    /// Adds a backend of weight 1.
    pub fn backend(mut self, address: SocketAddr) -> Self {
        self.backends.push((address.to_string(), None));
        self
    }

    /// Adds a backend with a weight.
    pub fn weighted(mut self, address: SocketAddr, weight: u32) -> Self {
        self.backends.push((address.to_string(), Some(weight)));
        self
    }

    /// Adds a backend given by host name (`HOST:PORT`), for discovery to resolve.
    pub fn named(mut self, host_port: &str) -> Self {
        self.backends.push((host_port.to_owned(), None));
        self
    }

    /// Sets a cluster field (`retries`, `timeouts`, `outlier_detection`, `health_check`,
    /// `panic_threshold`, ...) to a YAML value such as `{ attempts: 2 }` or `0%`.
    pub fn set(mut self, field: &str, value: &str) -> Self {
        set(&mut self.settings, field, value);
        self
    }

    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "  - name: {}", self.name);
        if let Some(policy) = &self.policy {
            let _ = writeln!(out, "    policy: {policy}");
        }
        for (field, value) in &self.settings {
            let _ = writeln!(out, "    {field}: {value}");
        }
        out.push_str("    backends:\n");
        for (address, weight) in &self.backends {
            match weight {
                Some(weight) => {
                    let _ = writeln!(out, "      - {{ address: {address}, weight: {weight} }}");
                }
                None => {
                    let _ = writeln!(out, "      - {{ address: {address} }}");
                }
            }
        }
    }
}

/// Sets `key` to `value`, replacing an earlier value (YAML refuses a key twice).
fn set(fields: &mut Vec<(String, String)>, key: &str, value: &str) {
    match fields.iter_mut().find(|(k, _)| k == key) {
        Some(field) => field.1 = value.to_owned(),
        None => fields.push((key.to_owned(), value.to_owned())),
    }
}
